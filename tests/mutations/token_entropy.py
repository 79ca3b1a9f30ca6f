"""Mutants of the generic ``token_entropy``.

The logits are token_logprobs' (its kernel's own digit helpers, patched there); the normaliser and
the entropy terms ``g = p (m - z)`` are absolute-grid sums (E = 0, F = 40); ``H = log_c(L) + U / L``.
"""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, mutation, original, patch
from mutations._float_order import blocked_reversed_sum
from mutations._roundings import (
    int64_to_f32_rounding,
    int64_to_f32_via_float64,
    int64_to_float_ftz,
    int64_to_float_rounding,
    int64_to_float_via_fp32,
    ties_away,
    to_fixed_rounding,
    toward_zero,
)
from mutations.token_logprobs import (
    _digits_all_finite,
    _exponent_plus_one,
    _half_away,
    _max_ignoring_nan,
    _reciprocal,
    _tau_toward_zero,
    _top_digit_dropped,
)
from rlkernel.backends.generic._exact import transcendental

OP = "token_entropy"
M = "token_entropy"
TL = "token_logprobs"
TR = "_exact.transcendental"
_nan_max = original(M, "nan_max")
_stats = original(M, "_stats")
_exp_c = original(M, "exp_c")
_to_fixed = original(M, "to_fixed")


def _toward_zero_f32(exact: torch.Tensor) -> torch.Tensor:
    """A float64 value rounded to fp32 toward zero."""
    r = exact.to(torch.float32)
    return torch.where(r.to(torch.float64).abs() > exact.abs(), torch.nextafter(r, torch.zeros_like(r)), r)


def _term_toward_zero(p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    g = _toward_zero_f32(p.to(torch.float64) * (-d).to(torch.float64))
    return torch.where(p == 0, 0.0, g)


def _stats_nan_terms(z: torch.Tensor, vs: int) -> Any:
    """No zero rule: the term of a -inf logit is 0 * inf = NaN and, as IEEE arithmetic would, makes the
    row's sum NaN (the generic grid maps a NaN term to 0, so the rule is applied at the row)."""
    m0, finite, total, mean = _stats(z, vs)
    d = torch.where(finite.unsqueeze(1), z - m0.unsqueeze(1), 0.0)
    bad = torch.isnan(_exp_c(d) * (-d)).any(dim=-1)
    return m0, finite, total, torch.where(bad, float("nan"), mean)


def _mean_reciprocal(ubar: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return ubar * (torch.ones_like(total) / total)


def _output_toward_zero(total: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    return _toward_zero_f32(transcendental.log_c(total).to(torch.float64) + mean.to(torch.float64))


def _stats_all_finite(z: torch.Tensor, vs: int) -> Any:
    m0, finite, total, mean = _stats(z, vs)
    return m0, torch.ones_like(finite), total, mean


def _float_sums(z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p and g summed in fp32 (reversed, 32 lanes), then the sums put on the grid."""
    d = torch.where(finite.unsqueeze(1), z - m0.unsqueeze(1), 0.0)
    p = _exp_c(d)
    g = torch.where(p == 0, 0.0, p * (-d))
    zero = torch.zeros((), dtype=torch.int64, device=z.device)
    return (_to_fixed(blocked_reversed_sum(p, dim=-1), zero, 40),
            _to_fixed(blocked_reversed_sum(g, dim=-1), zero, 40))


def _batch_max(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """The row max taken over every row of the token chunk (a batch-wide shift)."""
    m = _nan_max(x, dim=dim, keepdim=keepdim)
    return _nan_max(m.reshape(1, -1), dim=-1).expand_as(m) if m.numel() > 1 else m


MUTATIONS = [
    mutation(OP, "hidden_grid_bits", "H_BITS 27 -> 26", patch(TL, "H_BITS", 26)),
    mutation(OP, "head_grid_bits", "W_BITS 20 -> 19", patch(TL, "W_BITS", 19)),
    mutation(OP, "logits_grid_rounding", "ties to even -> ties away",
             patch("_exact.digits", "_round_grid", _half_away)),
    mutation(OP, "logits_row_exponent", "expo + 1", patch(TL, "row_exponents", _exponent_plus_one)),
    mutation(OP, "logits_nonfinite", "non-finite rows not NaN", patch(TL, "_digits", _digits_all_finite)),
    mutation(OP, "logits_product", "top digit dropped", patch(TL, "_digits", _top_digit_dropped)),
    mutation(OP, "logits_rounding", "through fp32 first (double rounding in the subnormal range)",
             patch(TL, "int64_to_float", int64_to_float_via_fp32)),
    mutation(OP, "logits_rounding", "ties to even -> ties away",
             patch(TL, "int64_to_float", int64_to_float_rounding(ties_away))),
    mutation(OP, "subnormal_logits", "flushed to zero", patch(TL, "int64_to_float", int64_to_float_ftz)),
    mutation(OP, "temperature", "fp32(tau) rounded toward zero", patch(TL, "_tau", _tau_toward_zero)),
    mutation(OP, "temperature", "z * (1 / tau)", patch(TL, "_divide", _reciprocal)),
    mutation(OP, "row_max", "NaN logits ignored", patch(M, "nan_max", _max_ignoring_nan)),
    # (a zero max keeping its sign is invisible here: d = +-0 gives p = 1 and g = +-0, which the grid
    # maps to 0 -- unlike token_logprobs, whose output is z_y - m itself)
    mutation(OP, "exp_c", "coefficient E1 + 1 ulp", patch(TR, "_E1", transcendental._E1 + 1)),
    mutation(OP, "sum_grid", "F 40 -> 39", patch(M, "F_SUM", 39)),
    mutation(OP, "sum_grid", "F 40 -> 41", patch(M, "F_SUM", 41)),
    mutation(OP, "sum_rounding", "ties to even -> ties away", patch(M, "to_fixed", to_fixed_rounding(ties_away))),
    mutation(OP, "sum_rounding", "to nearest -> toward zero", patch(M, "to_fixed", to_fixed_rounding(toward_zero))),
    mutation(OP, "int_to_fp32", "through float64 (double rounding)",
             patch(M, "int64_to_f32", int64_to_f32_via_float64)),
    mutation(OP, "int_to_fp32", "ties to even -> ties away",
             patch(M, "int64_to_f32", int64_to_f32_rounding(ties_away))),
    mutation(OP, "entropy_term", "p * (-d) rounded toward zero", patch(M, "_entropy_term", _term_toward_zero)),
    mutation(OP, "zero_term", "no rule for p = 0 (p * inf is NaN)",
             patch(M, "_stats", _stats_nan_terms)),
    mutation(OP, "mean_division", "Ubar * (1 / L)", patch(M, "_mean_divide", _mean_reciprocal)),
    mutation(OP, "log_c", "coefficient L0 + 1 ulp", patch(TR, "_L0", transcendental._L0 + 1)),
    mutation(OP, "output_rounding", "log_c(L) + mean rounded toward zero", patch(M, "_entropy", _output_toward_zero)),
    mutation(OP, "nonfinite_max", "rows with a non-finite max kept finite", patch(M, "_stats", _stats_all_finite)),
    mutation(OP, ORDER_FLOAT_SUM, "p and g summed in fp32, reversed, 32 lanes", patch(M, "_sums", _float_sums)),
    mutation(OP, ORDER_BATCH, "row max over the whole token chunk", patch(M, "nan_max", _batch_max)),
]
