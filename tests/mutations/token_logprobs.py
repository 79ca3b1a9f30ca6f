"""Mutants of the generic ``token_logprobs`` and its vocabulary-sharded sub-ops.

The logits are linear v2's product (computed by the kernel's own fp32 digit code), the
normaliser an absolute-grid sum (E = 0, F = 40) of ``exp_c``, the result ``(z_y - m) - log_c(L)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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
from rlkernel.backends.generic import token_logprobs as T
from rlkernel.backends.generic._exact import transcendental

OP = "token_logprobs"
M = "token_logprobs"
_digits = original(M, "_digits")
_row_exponents = original(M, "row_exponents")
_nan_max = original(M, "nan_max")
_partial = original(M, "token_logprobs_partial")


def _half_away(t: torch.Tensor) -> torch.Tensor:
    return torch.sign(t) * torch.floor(t.abs() + 0.5)


def _exponent_plus_one(x: torch.Tensor) -> torch.Tensor:
    e = _row_exponents(x)
    return torch.where(e != 0, e + 1, e)


def _digits_all_finite(x: torch.Tensor, bits: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    e, d, bad = _digits(x, bits, count)
    return e, d, torch.zeros_like(bad)


def _top_digit_dropped(x: torch.Tensor, bits: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    e, d, bad = _digits(x, bits, count)
    return e, torch.cat((d[:-1], torch.zeros_like(d[-1:]))), bad


def _tau_toward_zero(temperature: float, device: torch.device) -> torch.Tensor | None:
    """fp32(tau) rounded toward zero instead of to nearest."""
    if float(temperature) == 1.0:
        return None
    t = np.float32(temperature)
    if abs(float(t)) > abs(float(temperature)):
        t = np.nextafter(t, np.float32(0))
    return torch.tensor(float(t), dtype=torch.float32, device=device)


def _reciprocal(z: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    return z * (torch.ones_like(tau) / tau)


def _max_ignoring_nan(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return torch.where(torch.isnan(x), float("-inf"), x).amax(dim=dim, keepdim=keepdim) + 0.0


def _max_keeping_negative_zero(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    m = torch.amax(x, dim=dim, keepdim=keepdim)
    return torch.where(torch.isnan(x).any(dim=dim, keepdim=keepdim), float("nan"), m)


def _batch_max(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """The row max taken over every row of the token chunk (a batch-wide shift)."""
    m = _nan_max(x, dim=dim, keepdim=keepdim)
    return _nan_max(m.reshape(1, -1), dim=-1).expand_as(m) if m.numel() > 1 else m


def _log_prob_one_subtraction(z_target: torch.Tensor, m: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return z_target - (m + T.log_c(total))


def _float_grid_sum(z: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The probabilities summed in fp32 (reversed, 32 lanes), then the sum put on the grid."""
    p = T.exp_c(z - m.unsqueeze(1))
    s = blocked_reversed_sum(p, dim=-1)
    zero = torch.zeros((), dtype=torch.int64, device=z.device)
    return T.to_fixed(s, zero, T.F_SUM), torch.isnan(p).any(dim=-1)


def _owner(targets: torch.Tensor, vocab_start: int, rows: int) -> torch.Tensor:
    local = targets - vocab_start
    return (local >= 0) & (local < rows)


def _nonowner_negative_zero(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                            vocab_start: int, temperature: float = 1.0, row_max: torch.Tensor | None = None) -> Any:
    out = _partial(hidden, weight_shard, targets, vocab_start, temperature, row_max)
    if row_max is None:
        return out
    s, d = out
    owner = _owner(targets, vocab_start, weight_shard.shape[0])
    return s, torch.where(owner, d, torch.full_like(d, -0.0))


def _owner_inf_difference(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                          vocab_start: int, temperature: float = 1.0, row_max: torch.Tensor | None = None) -> Any:
    """Where the row max is +-inf the owner returns z_y - m (-+inf) instead of NaN."""
    out = _partial(hidden, weight_shard, targets, vocab_start, temperature, row_max)
    if row_max is None:
        return out
    s, d = out
    owner = _owner(targets, vocab_start, weight_shard.shape[0])
    d = torch.where(owner & (row_max == float("inf")), float("-inf"), d)
    return s, torch.where(owner & (row_max == float("-inf")), float("inf"), d)


def _sum_against_local_max(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                           vocab_start: int, temperature: float = 1.0, row_max: torch.Tensor | None = None) -> Any:
    """Where the row max is not finite, sum_int is taken against the shard's own max instead of 0."""
    if row_max is None:
        return _partial(hidden, weight_shard, targets, vocab_start, temperature)
    local = _partial(hidden, weight_shard, targets, vocab_start, temperature)
    s, d = _partial(hidden, weight_shard, targets, vocab_start, temperature, row_max)
    s_local, _ = _partial(hidden, weight_shard, targets, vocab_start, temperature,
                          torch.where(torch.isfinite(row_max), row_max, local))
    return torch.where(torch.isfinite(row_max), s, s_local), d


TR = "_exact.transcendental"

MUTATIONS = [
    mutation(OP, "hidden_grid_bits", "H_BITS 27 -> 26", patch(M, "H_BITS", 26)),
    mutation(OP, "hidden_grid_bits", "H_BITS 27 -> 28", patch(M, "H_BITS", 28)),
    mutation(OP, "head_grid_bits", "W_BITS 20 -> 19", patch(M, "W_BITS", 19)),
    mutation(OP, "head_grid_bits", "W_BITS 20 -> 21", patch(M, "W_BITS", 21)),
    mutation(OP, "logits_grid_rounding", "ties to even -> ties away",
             patch("_exact.digits", "_round_grid", _half_away)),
    mutation(OP, "logits_grid_rounding", "to nearest -> toward zero",
             patch("_exact.digits", "_round_grid", torch.trunc)),
    mutation(OP, "logits_row_exponent", "expo + 1", patch(M, "row_exponents", _exponent_plus_one)),
    mutation(OP, "logits_nonfinite", "non-finite rows not NaN", patch(M, "_digits", _digits_all_finite)),
    mutation(OP, "logits_product", "top digit dropped", patch(M, "_digits", _top_digit_dropped)),
    mutation(OP, "logits_rounding", "through fp32 first (double rounding in the subnormal range)",
             patch(M, "int64_to_float", int64_to_float_via_fp32)),
    mutation(OP, "logits_rounding", "ties to even -> ties away",
             patch(M, "int64_to_float", int64_to_float_rounding(ties_away))),
    mutation(OP, "logits_rounding", "to nearest -> toward zero",
             patch(M, "int64_to_float", int64_to_float_rounding(toward_zero))),
    mutation(OP, "logits_product", "digit GEMM K-chunks of 4096 -> 8192", patch("_exact.digits", "K_CHUNK", 1 << 13)),
    mutation(OP, "int_to_fp32", "through float64 (double rounding)",
             patch(M, "int64_to_f32", int64_to_f32_via_float64)),
    mutation(OP, "int_to_fp32", "ties to even -> ties away",
             patch(M, "int64_to_f32", int64_to_f32_rounding(ties_away))),
    mutation(OP, "int_to_fp32", "to nearest -> toward zero",
             patch(M, "int64_to_f32", int64_to_f32_rounding(toward_zero))),
    mutation(OP, "subnormal_logits", "flushed to zero", patch(M, "int64_to_float", int64_to_float_ftz)),
    mutation(OP, "temperature", "fp32(tau) rounded toward zero", patch(M, "_tau", _tau_toward_zero)),
    mutation(OP, "temperature", "z * (1 / tau)", patch(M, "_divide", _reciprocal)),
    mutation(OP, "row_max", "NaN logits ignored", patch(M, "nan_max", _max_ignoring_nan)),
    mutation(OP, "row_max", "a zero max keeps its sign", patch(M, "nan_max", _max_keeping_negative_zero)),
    mutation(OP, "exp_c", "coefficient E1 + 1 ulp", patch(TR, "_E1", transcendental._E1 + 1)),
    mutation(OP, "sum_grid", "F 40 -> 39", patch(M, "F_SUM", 39)),
    mutation(OP, "sum_grid", "F 40 -> 41", patch(M, "F_SUM", 41)),
    mutation(OP, "sum_rounding", "ties to even -> ties away", patch(M, "to_fixed", to_fixed_rounding(ties_away))),
    mutation(OP, "sum_rounding", "to nearest -> toward zero", patch(M, "to_fixed", to_fixed_rounding(toward_zero))),
    mutation(OP, "log_c", "coefficient L0 + 1 ulp", patch(TR, "_L0", transcendental._L0 + 1)),
    mutation(OP, "output_rounding", "z_y - (m + log_c(L))", patch(M, "_log_prob", _log_prob_one_subtraction)),
    mutation(OP, "shard_rules", "non-owners return -0", patch(M, "token_logprobs_partial", _nonowner_negative_zero)),
    mutation(OP, "shard_rules", "owner returns z_y - m for an infinite max",
             patch(M, "token_logprobs_partial", _owner_inf_difference)),
    mutation(OP, "shard_rules", "sum_int of a non-finite max taken against the local max",
             patch(M, "token_logprobs_partial", _sum_against_local_max)),
    mutation(OP, ORDER_FLOAT_SUM, "probabilities summed in fp32, reversed, 32 lanes",
             patch(M, "_grid_sum", _float_grid_sum)),
    mutation(OP, ORDER_BATCH, "row max over the whole token chunk", patch(M, "nan_max", _batch_max)),
]
