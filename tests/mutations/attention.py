"""Mutants of the generic ``attention`` and ``attention_paged`` (contract ``attention``, docs/numerics.md R4a).

Scores are P5 digit dot products of q and k rows scaled once; p = exp_c(s - ref), ref the max over
keys with a non-zero V row (at most 64 nats below the row max); the denominator L and the numerator
weights R sit on 2**-40 grids; V rows on their own 21-bit grids; O in two int64 limbs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mutations import ORDER_BATCH, mutation, original, patch
from mutations._roundings import (
    cast_rounding,
    int64_to_f32_rounding,
    int64_to_float_ftz,
    int64_to_float_rounding,
    ties_away,
    to_fixed_rounding,
    toward_zero,
)
from rlkernel.backends.generic import attention as A
from rlkernel.backends.generic._exact import transcendental

OP = "attention"
M = "attention"
_row_exponents = original(M, "row_exponents")
_v_block = original(M, "_v_block")
_attend = original(M, "_attend")


def _grid_rows_rounding(round_up: Any) -> Any:
    quantize = to_fixed_rounding(round_up)

    def grid_rows(x: torch.Tensor, e: torch.Tensor, bits: int | None = None) -> torch.Tensor:
        finite = torch.where(torch.isfinite(x), x, 0.0).to(torch.float32)
        return quantize(finite, e.unsqueeze(-1), 20 if bits is None else bits)

    return grid_rows


def _exponent_plus_one(x: torch.Tensor) -> torch.Tensor:
    e = _row_exponents(x)
    return torch.where(e != 0, e + 1, e)


def _batch_exponents(x: torch.Tensor) -> torch.Tensor:
    """Row exponents taken over every row of the tile batch (axes: tiles, heads, rows, D)."""
    e = _row_exponents(x)
    return e.amax(dim=(0, 2), keepdim=True).expand_as(e) if e.dim() == 3 else e


def _attend_scale_one_ulp_up(q: torch.Tensor, fetch: Any, q_starts: list[int], q_lens: list[int],
                             k_lens: list[int], hkv: int, scale_value: float, causal: bool,
                             out_dtype: torch.dtype) -> torch.Tensor:
    """The kernel with the fp32 score scale it was given one ulp larger."""
    up = float(np.nextafter(np.float32(scale_value), np.float32(np.inf)))
    return _attend(q, fetch, q_starts, q_lens, k_lens, hkv, up, causal, out_dtype)


def _scores(*, nan_rule: bool = True, fold_scale: bool = False) -> Any:
    """The generic score step without the non-finite rule, or with the scale folded into one rounding."""

    def scores(qs: Any, k: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ek = A.row_exponents(k)
        kd = A.split_digits(A.grid_rows(k, ek, A.GRID)).transpose(-1, -2)
        c = A._level_matmul(qs.digits, kd)
        shift = (qs.e.unsqueeze(-1) + ek.unsqueeze(-2) - 2 * A.GRID).clamp(min=-252)
        if fold_scale:
            s = (torch.ldexp(c.to(torch.float64), shift.to(torch.float64)) * scale.to(torch.float64)).to(torch.float32)
        else:
            s = A.scale_pow2(A.int64_to_f32(c), shift) * scale
        if not nan_rule:
            return s
        bad = qs.bad.unsqueeze(-1) | (~torch.isfinite(k)).any(dim=-1).unsqueeze(-2)
        return torch.where(bad, float("nan"), s)

    return scores


def _limit(delta: int = 0, top_left: bool = False) -> Any:
    def limit(lk: torch.Tensor, lq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return pos + 1 if top_left else lk - lq + pos + 1 + delta

    return limit


def _v_block_zero_rows_count(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """All-zero V rows take part in E_i (with their exponent 0)."""
    ev, zero, bad, vint = _v_block(v)
    return ev, torch.zeros_like(zero), bad, vint


def _v_block_finite(v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Non-finite V rows no longer make the output NaN (their finite entries are used)."""
    ev, zero, bad, vint = _v_block(v)
    return ev, zero, torch.zeros_like(bad), vint


def _reciprocal(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return num * (torch.ones_like(den) / den)


def _o_and_l(replacement: Any) -> tuple[Any, Any]:
    """Patches replacing the one-rounding conversion of the numerator (through the two-limb helper,
    which reads ``_exact.fp32.int64_to_float``) and of the denominator (the kernel's own binding)."""
    return patch("_exact.fp32", "int64_to_float", replacement), patch(M, "int64_to_float", replacement)


TR = "_exact.transcendental"

MUTATIONS = [
    mutation(OP, "qk_grid_bits", "GRID 20 -> 19", patch(M, "GRID", 19)),
    mutation(OP, "qk_grid_bits", "GRID 20 -> 21", patch(M, "GRID", 21)),
    mutation(OP, "grid_rounding", "ties to even -> ties away", patch(M, "grid_rows", _grid_rows_rounding(ties_away))),
    mutation(OP, "grid_rounding", "to nearest -> toward zero",
             patch(M, "grid_rows", _grid_rows_rounding(toward_zero))),
    mutation(OP, "row_exponent", "expo + 1", patch(M, "row_exponents", _exponent_plus_one)),
    mutation(OP, "qk_nonfinite", "non-finite q/k rows not NaN", patch(M, "_scores", _scores(nan_rule=False))),
    mutation(OP, "score_scale", "scale one ulp up", patch(M, "_attend", _attend_scale_one_ulp_up)),
    mutation(OP, "score_rounding", "scale folded into one rounding", patch(M, "_scores", _scores(fold_scale=True))),
    mutation(OP, "causal_mask", "diagonal excluded", patch(M, "_causal_limit", _limit(-1))),
    mutation(OP, "causal_mask", "one key past the diagonal", patch(M, "_causal_limit", _limit(1))),
    mutation(OP, "causal_mask", "top-left aligned", patch(M, "_causal_limit", _limit(top_left=True))),
    mutation(OP, "exp_c", "coefficient E0 + 1 ulp", patch(TR, "_E0", transcendental._E0 + 1)),
    mutation(OP, "reference_max", "MAX_GAP 64 -> 63", patch(M, "MAX_GAP", 63.0)),
    mutation(OP, "reference_max", "p from the row max (zero-value keys count)", patch(M, "MAX_GAP", 0.0)),
    mutation(OP, "p_bits", "P_BITS 40 -> 39", patch(M, "P_BITS", 39)),
    mutation(OP, "p_bits", "P_BITS 40 -> 41", patch(M, "P_BITS", 41)),
    mutation(OP, "p_rounding", "ties to even -> ties away", patch(M, "to_fixed", to_fixed_rounding(ties_away))),
    mutation(OP, "p_rounding", "to nearest -> toward zero", patch(M, "to_fixed", to_fixed_rounding(toward_zero))),
    mutation(OP, "v_bits", "V_BITS 20 -> 19", patch(M, "V_BITS", 19)),
    mutation(OP, "v_bits", "V_BITS 20 -> 21", patch(M, "V_BITS", 21)),
    mutation(OP, "v_exponent_rule", "zero V rows take part in E_i", patch(M, "_v_block", _v_block_zero_rows_count)),
    mutation(OP, "v_nonfinite", "non-finite V rows not NaN", patch(M, "_v_block", _v_block_finite)),
    mutation(OP, "qk_int_to_fp32", "ties to even -> ties away",
             patch(M, "int64_to_f32", int64_to_f32_rounding(ties_away))),
    mutation(OP, "qk_int_to_fp32", "to nearest -> toward zero",
             patch(M, "int64_to_f32", int64_to_f32_rounding(toward_zero))),
    mutation(OP, "int_to_fp32", "ties to even -> ties away", *_o_and_l(int64_to_float_rounding(ties_away))),
    mutation(OP, "int_to_fp32", "to nearest -> toward zero", *_o_and_l(int64_to_float_rounding(toward_zero))),
    mutation(OP, "subnormal_results", "flushed to zero", *_o_and_l(int64_to_float_ftz)),
    mutation(OP, "output_division", "num * (1 / den)", patch(M, "_divide", _reciprocal)),
    mutation(OP, "output_cast", "ties to even -> ties away", patch(M, "cast_out", cast_rounding("away"))),
    mutation(OP, "output_cast", "to nearest -> toward zero", patch(M, "cast_out", cast_rounding("zero"))),
    mutation(OP, ORDER_BATCH, "row exponents over the whole tile batch", patch(M, "row_exponents", _batch_exponents)),
]
