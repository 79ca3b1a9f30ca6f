"""Mutants of rms_norm_backward's parameters: the forward's r, h, the gain product, the exact row sum,
the coefficient, the dx terms, the casts and the weight terms."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, Mutation, mutation, original, patch, wrap
from mutations._float_order import blocked_reversed_sum
from mutations.softmax import cast_mutants, swapped

OP = "rms_norm_backward"
MOD = "rms_norm_backward"


def _scale_one_rounding(xf: torch.Tensor, n: torch.Tensor, eps: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """r = RN32(1 / sqrt(mean + eps)) in one rounding (float64) instead of sqrt_rn then a division."""
    s = original("_exact.fixed", "exact_sum")(xf * xf, dim=-1, frac_bits=40, op="rms_norm_backward", keepdim=True)
    v = (s / n + eps).to(torch.float64)
    return (1.0 / torch.sqrt(v)).to(torch.float32)


def _gain_in_dtype(w: torch.Tensor, dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    g = w * dy
    return g if dtype == torch.float32 else g.to(dtype).to(torch.float32)


def _row_sum_exact_products(g: torch.Tensor, xf: torch.Tensor) -> torch.Tensor:
    """The products not rounded to fp32 (float64 products and sum, rounded once)."""
    return (g.to(torch.float64) * xf.to(torch.float64)).sum(-1, keepdim=True).to(torch.float32)


def _row_sum_float(g: torch.Tensor, xf: torch.Tensor) -> torch.Tensor:
    return blocked_reversed_sum(g * xf, dim=-1).unsqueeze(-1)


def _coefficient_r_squared(c: torch.Tensor, n: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """u = RN32(RN32(c ÷ H) * RN32(r * r)): r squared first."""
    return (c / n) * (r * r)


def _dx_fused(r: torch.Tensor, g: torch.Tensor, h32: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """dx32 in one rounding of the exact r*g - h32*u (an FMA-like evaluation)."""
    a, b, c, d = (t.to(torch.float64) for t in (r, g, h32, u))
    return (a * b - c * d).to(torch.float32)


def _terms_in_bf16(t: torch.Tensor) -> torch.Tensor:
    """Weight terms rounded to bf16 (canonical_nan is applied to the terms only in this module)."""
    return original("_exact.fp32", "canonical_nan")(t.to(torch.bfloat16).to(torch.float32))


def _batched_path(fn: Any) -> Any:
    """More than one row: the row sums in floating point."""

    def mutant(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> Any:
        if x.dim() < 2 or x.numel() <= x.shape[-1]:
            return fn(grad, x, weight, eps)
        with swapped(MOD, "_row_sum", _row_sum_float):
            return fn(grad, x, weight, eps)

    return mutant


MUTATIONS: list[Mutation] = [
    mutation(OP, "forward_r", "r = 1 ÷ sqrt_rn(v) -> one rounding of 1/sqrt(v)",
             patch(MOD, "_scale", _scale_one_rounding)),
    mutation(OP, "forward_r", "sum of squares F 40 -> 39", patch(MOD, "F_SUM", 39)),
    mutation(OP, "h_values", "weight terms with h32 (not rounded to x's dtype)",
             patch(MOD, "_round_h", lambda h32, dtype: h32)),
    mutation(OP, "gain_product", "g = RN32(w * dy) -> rounded to x's dtype", patch(MOD, "_gain", _gain_in_dtype)),
    mutation(OP, "row_sum", "products g*x not rounded to fp32", patch(MOD, "_row_sum", _row_sum_exact_products)),
    mutation(OP, ORDER_FLOAT_SUM, "row sum in fp32, reversed blocked order", patch(MOD, "_row_sum", _row_sum_float)),
    mutation(OP, "coefficient", "RN(RN(c/H)*r)*r -> RN(c/H) * RN(r*r)",
             patch(MOD, "_coefficient", _coefficient_r_squared)),
    mutation(OP, "dx_terms", "two rounded products and a subtraction -> one rounding", patch(MOD, "_dx", _dx_fused)),
    *cast_mutants(OP, MOD),
    mutation(OP, "weight_terms", "terms RN32(dy*h) -> rounded to bf16", patch(MOD, "canonical_nan", _terms_in_bf16)),
    mutation(OP, ORDER_BATCH, "more than one row: float row sums", wrap(MOD, "rms_norm_backward", _batched_path)),
]
