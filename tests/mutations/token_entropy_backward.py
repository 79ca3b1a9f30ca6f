"""Mutants of the generic ``token_entropy_backward``.

The coefficients come from the forward's exact p, L and mean (``q = p / L``, ``e = d + mean``,
``a = q e``, ``s = grad / tau``, ``c = -s a`` in fp32); ``d_hidden`` and ``d_weight`` are linear v2
digit products (28-bit coefficient grids, 21-bit operand grids), the vocabulary sum carried in two
int64 words.
"""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, mutation, original, patch
from mutations._roundings import int64_to_float_ftz, int64_to_float_rounding, ties_away, toward_zero
from mutations.token_entropy import _toward_zero_f32

OP = "token_entropy_backward"
# the digit products, grids and finishes are shared with token_logprobs_backward: their mutants patch it there
TLB = "token_logprobs_backward"
M = "token_entropy"
_coefficients = original(M, "_coefficients")
_exponents = original(TLB, "_exponents")
_nan_max = original(M, "nan_max")
_pair = original(TLB, "int64_pair_to_float")
_grid_f64 = original(TLB, "_grid_f64")


def _reciprocal_divide(p: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return p * (torch.ones_like(total) / total)


def _center_toward_zero(d: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    return _toward_zero_f32(d.to(torch.float64) + mean.to(torch.float64))


def _a_toward_zero(q: torch.Tensor, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return torch.where(p == 0, 0.0, _toward_zero_f32(q.to(torch.float64) * e.to(torch.float64)))


def _a_without_zero_rule(q: torch.Tensor, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return q * e


def _grad_reciprocal(grad: torch.Tensor, tau: torch.Tensor | None) -> torch.Tensor:
    return grad if tau is None else grad * (torch.ones_like(tau) / tau)


def _product_toward_zero(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    return _toward_zero_f32((-s).to(torch.float64) * a.to(torch.float64))


def _product_to_bf16(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """c cast to bf16, as the grad_logits of a bf16 autograd."""
    return ((-s) * a).to(torch.bfloat16).to(torch.float32)


def _all_rows_finite(z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor, total: torch.Tensor,
                     mean: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return _coefficients(z, m0, torch.ones_like(finite), total, mean, s)


def _half_away(t: torch.Tensor) -> torch.Tensor:
    return torch.sign(t) * torch.floor(t.abs() + 0.5)


def _exponent_plus_one(t: torch.Tensor) -> torch.Tensor:
    e = _exponents(t)
    return torch.where((e != original(TLB, "SENTINEL")) & (e != original(TLB, "ZERO_EXP")), e + 1, e)


def _no_nan_mask(ex: torch.Tensor, ew: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ex0 = torch.where(ex == original(TLB, "SENTINEL"), torch.zeros_like(ex), ex)
    ew0 = torch.where(ew == original(TLB, "SENTINEL"), torch.zeros_like(ew), ew)
    k = ex0.unsqueeze(1) + ew0.unsqueeze(0) - original(TLB, "C_BITS") - original(TLB, "O_BITS")
    return k, torch.zeros(k.shape, dtype=torch.bool, device=k.device)


def _one_word(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk partials added in one int64 word (wraps past 2**63)."""
    return torch.zeros_like(part), part


def _pair_via_fp32(hi: torch.Tensor, lo: torch.Tensor, shift: int, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _pair(hi, lo, shift, k, torch.float32).to(dtype)


def _pair_ftz(hi: torch.Tensor, lo: torch.Tensor, shift: int, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = _pair(hi, lo, shift, k, dtype)
    return torch.where(out.abs() < torch.finfo(dtype).tiny, out * 0.0, out)


def _float_product(x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """The grids multiplied and summed in fp32 (rounded partial sums), then back to integers."""
    if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
    xg = _grid_f64(x, ex, original(TLB, "C_BITS")).to(torch.float32)
    wg = _grid_f64(w, ew, original(TLB, "O_BITS")).to(torch.float32)
    return torch.round((xg.flip(-1) @ wg.flip(-1).T).to(torch.float64)).to(torch.int64)


def _batch_max(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """The row max taken over every row of the token chunk (a batch-wide shift)."""
    m = _nan_max(x, dim=dim, keepdim=keepdim)
    return _nan_max(m.reshape(1, -1), dim=-1).expand_as(m) if m.numel() > 1 else m


MUTATIONS = [
    mutation(OP, "forward_rules", "logits: hidden grid H_BITS 27 -> 26", patch("token_logprobs", "H_BITS", 26)),
    mutation(OP, "forward_rules", "grid F 40 -> 39", patch(M, "F_SUM", 39)),
    mutation(OP, "softmax_division", "p * (1 / L)", patch(M, "_softmax_divide", _reciprocal_divide)),
    mutation(OP, "centering", "d + mean rounded toward zero", patch(M, "_center", _center_toward_zero)),
    mutation(OP, "coef_a", "q * e rounded toward zero", patch(M, "_coef_a", _a_toward_zero)),
    mutation(OP, "zero_term", "no rule for p = 0 (0 * inf is NaN)", patch(M, "_coef_a", _a_without_zero_rule)),
    mutation(OP, "grad_scale", "grad * (1 / tau)", patch(M, "_grad_scale", _grad_reciprocal)),
    mutation(OP, "coef_product", "-s * a rounded toward zero", patch(M, "_coef_product", _product_toward_zero)),
    mutation(OP, "coef_product", "c cast to bf16 (torch's grad_logits)", patch(M, "_coef_product", _product_to_bf16)),
    mutation(OP, "nonfinite_max", "rows with a non-finite max kept finite",
             patch(M, "_coefficients", _all_rows_finite)),
    mutation(OP, "c_grid_bits", "C_BITS 27 -> 26", patch(TLB, "C_BITS", 26)),
    mutation(OP, "operand_grid_bits", "O_BITS 20 -> 19", patch(TLB, "O_BITS", 19)),
    mutation(OP, "grid_rounding", "ties to even -> ties away", patch("linear", "_round_grid", _half_away)),
    mutation(OP, "row_exponent", "expo + 1", patch(TLB, "_exponents", _exponent_plus_one)),
    mutation(OP, "nonfinite_rows", "sentinel rows not NaN", patch(TLB, "_scale", _no_nan_mask)),
    mutation(OP, "vocab_sum", "chunk partials added in one int64 word", patch(M, "_split", _one_word)),
    mutation(OP, "hidden_rounding", "through fp32 first (double rounding)",
             patch(TLB, "int64_pair_to_float", _pair_via_fp32)),
    mutation(OP, "weight_rounding", "to nearest -> toward zero",
             patch(TLB, "int64_to_float", int64_to_float_rounding(toward_zero))),
    mutation(OP, "weight_rounding", "ties to even -> ties away",
             patch(TLB, "int64_to_float", int64_to_float_rounding(ties_away))),
    mutation(OP, "subnormal_results", "d_weight flushed to zero", patch(TLB, "int64_to_float", int64_to_float_ftz)),
    mutation(OP, "subnormal_results", "d_hidden flushed to zero", patch(TLB, "int64_pair_to_float", _pair_ftz)),
    mutation(OP, ORDER_FLOAT_SUM, "products summed in fp32", patch(TLB, "_product", _float_product)),
    mutation(OP, ORDER_BATCH, "row max over the whole token chunk", patch(M, "nan_max", _batch_max)),
]
