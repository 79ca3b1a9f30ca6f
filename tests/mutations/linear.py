"""Mutants of the generic ``linear`` and its tensor-parallel sub-ops (P5 digit matmul).

On the CPU the generic kernel forms ``C`` with float64 GEMMs (path ``f64``); the ``digit_product``
mutants force the ``digits`` path (four and three base-128 digits, fp32 digit GEMMs), which serves
every other device, or change the f64 path's split of X.
"""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, mutation, original, patch, wrap
from mutations._float_order import blocked_reversed_sum
from mutations._roundings import (
    cast_rounding,
    int64_to_float_ftz,
    int64_to_float_rounding,
    int64_to_float_via_fp32,
    ties_away,
    toward_zero,
)
from rlkernel.backends.generic import linear as L

OP = "linear"
_exponent = original("linear", "exponent")
_exponents = original("linear", "_exponents")
_finish = original("linear", "finish")
_digits_f32 = original("linear", "_digits_f32")


def _half_away(v: torch.Tensor) -> torch.Tensor:
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def _exponent_plus_one(x: torch.Tensor) -> torch.Tensor:
    e = _exponent(x)
    return torch.where(x != 0, e + 1, e)


def _exponent_subnormal_as_min_normal(x: torch.Tensor) -> torch.Tensor:
    """P1 with every subnormal given the exponent of the smallest normal (-125)."""
    e = _exponent(x)
    sub = (x != 0) & (x.abs() < 2.0**-126)
    return torch.where(sub, torch.full_like(e, -125), e)


def _exponents_without_sentinel(t: torch.Tensor) -> torch.Tensor:
    """Row exponents of the finite entries only: non-finite rows no longer poison their outputs."""
    return _exponents(torch.where(torch.isfinite(t), t, torch.zeros_like(t)))


def _finish_bias_after_cast(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None,
                            out_dtype: torch.dtype) -> torch.Tensor:
    """The bias added in the output dtype after the cast (two roundings) instead of in fp32 before it."""
    y = _finish(acc, ex, ew, None, out_dtype)
    if bias is None:
        return y
    return L.cast_out(y.to(torch.float32) + bias.to(out_dtype).to(torch.float32), out_dtype)


def _float_product(xg: torch.Tensor, wg: torch.Tensor) -> torch.Tensor:
    """C as an fp32 sum of the grid products over K, reversed and in 32 lanes (order-dependent)."""
    prod = xg.to(torch.float32).unsqueeze(1) * wg.to(torch.float32).unsqueeze(0)  # [M, N, K]
    return torch.round(blocked_reversed_sum(prod, dim=-1)).to(torch.int64)


def _batch_exponent(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The grid exponent of x taken over the whole batch (its largest finite row), not per row."""
    ex, ew = L._exponents(x), L._exponents(weight)
    live = ex != L.SENTINEL
    if bool(live.any()):
        ex = torch.where(live, ex[live].max(), ex)
    return L.finish(L.partial_sum(x, weight, ex, ew, "f64"), ex, ew, bias, out_dtype or x.dtype)


def _top_digit_dropped(t: torch.Tensor, e: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Digit planes with the top base-128 digit dropped."""
    d = _digits_f32(t, e, bits, count)
    return torch.cat((d[:-1], torch.zeros_like(d[-1:])))


def _unsplit_f64(xg: torch.Tensor, wg: torch.Tensor) -> torch.Tensor:
    """X against Wt in one float64 GEMM: products up to 2**47, partial sums past 2**53 round."""
    return (xg @ wg.T).to(torch.int64)


def _scale_offset(delta: int) -> Any:
    return wrap("linear", "int64_to_float", lambda f: lambda s, k, dtype: f(s, k + delta, dtype))


DIGITS = patch("linear", "_path", lambda device: "digits")

MUTATIONS = [
    mutation(OP, "x_grid_bits", "X_BITS 27 -> 26", patch("linear", "X_BITS", 26)),
    mutation(OP, "x_grid_bits", "X_BITS 27 -> 28", patch("linear", "X_BITS", 28)),
    mutation(OP, "w_grid_bits", "W_BITS 20 -> 19", patch("linear", "W_BITS", 19)),
    mutation(OP, "w_grid_bits", "W_BITS 20 -> 21", patch("linear", "W_BITS", 21)),
    mutation(OP, "grid_rounding", "ties to even -> ties away", patch("linear", "_round_grid", _half_away)),
    mutation(OP, "grid_rounding", "to nearest -> toward zero", patch("linear", "_round_grid", torch.trunc)),
    mutation(OP, "row_exponent", "expo + 1", patch("linear", "exponent", _exponent_plus_one)),
    mutation(OP, "row_exponent", "subnormal rows: expo of the least normal",
             patch("linear", "exponent", _exponent_subnormal_as_min_normal)),
    mutation(OP, "zero_row_exponent", "-149 -> -148", patch("linear", "ZERO_EXP", -148)),
    mutation(OP, "zero_row_exponent", "-149 -> -150", patch("linear", "ZERO_EXP", -150)),
    mutation(OP, "sentinel", "2**20 -> 2**20 + 1", patch("linear", "SENTINEL", (1 << 20) + 1)),
    mutation(OP, "sentinel", "2**20 -> 2**20 - 1", patch("linear", "SENTINEL", (1 << 20) - 1)),
    mutation(OP, "weight_digits", "digits in [-63, 64] instead of [-64, 63]", patch("linear", "DIGIT_OFFSET", 63)),
    mutation(OP, "nonfinite_rows", "non-finite rows not NaN (their finite entries used)",
             patch("linear", "_exponents", _exponents_without_sentinel)),
    mutation(OP, "output_rounding", "through fp32 first (double rounding)",
             patch("linear", "int64_to_float", int64_to_float_via_fp32)),
    mutation(OP, "output_rounding", "ties to even -> ties away",
             patch("linear", "int64_to_float", int64_to_float_rounding(ties_away))),
    mutation(OP, "output_rounding", "to nearest -> toward zero",
             patch("linear", "int64_to_float", int64_to_float_rounding(toward_zero))),
    mutation(OP, "scale_exponent", "ex + ew - 47 -> - 46", _scale_offset(1)),
    mutation(OP, "scale_exponent", "ex + ew - 47 -> - 48", _scale_offset(-1)),
    mutation(OP, "subnormal_results", "flushed to zero", patch("linear", "int64_to_float", int64_to_float_ftz)),
    mutation(OP, "bias_add", "bias added after the output cast", patch("linear", "finish", _finish_bias_after_cast)),
    mutation(OP, "output_cast", "ties to even -> ties away", patch("linear", "cast_out", cast_rounding("away"))),
    mutation(OP, "output_cast", "to nearest -> toward zero", patch("linear", "cast_out", cast_rounding("zero"))),
    mutation(OP, "digit_product", "f64 path: X not split in halves", patch("linear", "_product_f64", _unsplit_f64)),
    mutation(OP, "digit_product", "digits path: top digit dropped", DIGITS, patch("linear", "_digits_f32",
                                                                                   _top_digit_dropped)),
    mutation(OP, "digit_product", "digits path: K-chunks of 4096 -> 8192", DIGITS,
             patch("_exact.digits", "K_CHUNK", 1 << 13)),
    mutation(OP, ORDER_FLOAT_SUM, "fp32 sum over K, reversed, 32 lanes", patch("linear", "_product_f64",
                                                                               _float_product)),
    mutation(OP, ORDER_BATCH, "grid exponent of x over the whole batch", patch("linear", "linear", _batch_exponent)),
]
