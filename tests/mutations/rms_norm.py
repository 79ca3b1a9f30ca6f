"""Mutants of rms_norm's parameters: the sum of squares, the normalisation's roundings, the casts."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, Mutation, mutation, original, patch, wrap
from mutations.softmax import (
    cast_mutants,
    float_sum,
    sum_specials_mutant,
    term_rounding_mutants,
    total_rounding_mutants,
)

OP = "rms_norm"


def _grid(make_e: Any) -> Any:
    """An ``exact_sum`` whose grid exponent is ``make_e(t)`` instead of each row's own max."""
    exact_sum = original("rms_norm", "exact_sum")

    def mutant(t: torch.Tensor, dim: int = -1, e: Any = None, frac_bits: int = 40, op: str = "sum",
               keepdim: bool = False) -> torch.Tensor:
        return exact_sum(t, dim=dim, e=make_e(t), frac_bits=frac_bits, op=op, keepdim=keepdim)

    return mutant


def _batch_exponent(t: torch.Tensor) -> torch.Tensor:
    """The max grid over every row of the chunk (rms_norm calls exact_sum with keepdim=True)."""
    e = original("_exact.fixed", "max_exponent")(t, -1, keepdim=True)
    return e.amax(dim=0, keepdim=True).expand_as(e)


def _absolute_exponent(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros((*t.shape[:-1], 1), dtype=torch.int64)


def _rows_with(mean: Any, rsqrt: Any) -> Any:
    """``_rows`` with the mean ``mean(s, n)`` and the scale ``rsqrt(v, one)`` replaced."""
    exact_sum, round_h, cast_out = (original("rms_norm", n) for n in ("exact_sum", "_round_h", "cast_out"))
    sqrt_rn = original("rms_norm", "sqrt_rn")

    def rows(xf: torch.Tensor, w: torch.Tensor, n: torch.Tensor, eps: torch.Tensor, one: torch.Tensor,
             out_dtype: torch.dtype) -> torch.Tensor:
        s = exact_sum(xf * xf, dim=-1, frac_bits=40, op="rms_norm", keepdim=True)
        r = rsqrt(mean(s, n) + eps, one, sqrt_rn)
        return cast_out(w * round_h(xf * r, out_dtype), out_dtype)

    return rows


def _divide(s: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return s / n


def _times_reciprocal(s: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    return s * (torch.ones_like(n) / n)


def _one_over_sqrt(v: torch.Tensor, one: torch.Tensor, sqrt_rn: Any) -> torch.Tensor:
    return one / sqrt_rn(v)


def _sqrt_of_reciprocal(v: torch.Tensor, one: torch.Tensor, sqrt_rn: Any) -> torch.Tensor:
    return sqrt_rn(one / v)


def _eps_toward_zero(fn: Any) -> Any:
    """eps rounded to fp32 toward zero instead of to nearest even."""

    def mutant(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        e32 = torch.tensor(eps, dtype=torch.float32)
        if abs(float(e32)) > abs(eps):
            e32 = torch.nextafter(e32, torch.zeros_like(e32))
        return fn(x, weight, float(e32))

    return mutant


def _round_h_truncating(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return h
    r = h.to(dtype)
    over = r.to(torch.float32).abs() > h.abs()
    return torch.where(over & torch.isfinite(h), torch.nextafter(r, torch.zeros_like(r)), r).to(torch.float32)


MUTATIONS: list[Mutation] = [
    mutation(OP, "sum_frac_bits", "F 40 -> 39", patch("rms_norm", "F_SUM", 39)),
    mutation(OP, "sum_frac_bits", "F 40 -> 41", patch("rms_norm", "F_SUM", 41)),
    mutation(OP, "sum_grid_exponent", "max grid -> absolute grid E = 0",
             patch("rms_norm", "exact_sum", _grid(_absolute_exponent))),
    *term_rounding_mutants(OP),
    *total_rounding_mutants(OP),
    sum_specials_mutant(OP),
    mutation(OP, "mean_division", "S / H -> S * RN(1 / H)",
             patch("rms_norm", "_rows", _rows_with(_times_reciprocal, _one_over_sqrt))),
    mutation(OP, "rsqrt", "1 / sqrt(v) -> sqrt(1 / v)",
             patch("rms_norm", "_rows", _rows_with(_divide, _sqrt_of_reciprocal))),
    mutation(OP, "eps_rounding", "eps to fp32: RNE -> toward zero", wrap("rms_norm", "rms_norm", _eps_toward_zero)),
    mutation(OP, "h_rounding", "h rounded to x's dtype before the gain -> kept in fp32",
             patch("rms_norm", "_round_h", lambda h, dtype: h)),
    mutation(OP, "h_rounding", "h to x's dtype: RNE -> toward zero",
             patch("rms_norm", "_round_h", _round_h_truncating)),
    *cast_mutants(OP, "rms_norm"),
    mutation(OP, ORDER_FLOAT_SUM, "sum of squares in fp32, reversed order", patch("rms_norm", "exact_sum", float_sum)),
    mutation(OP, ORDER_BATCH, "grid exponent over the whole batch",
             patch("rms_norm", "exact_sum", _grid(_batch_exponent))),
]
