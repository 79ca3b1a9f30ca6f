"""Mutants of the generic ``attention_backward`` (contract ``attention_backward`` v1).

The forward's probabilities are recomputed (scores, reference max, exp_c, the integer P on the
2**-40 grid, pn = P / L); D and dP are exact 28 x 21-bit products rounded once; dS = pn (dP - D)
in two roundings, cast to the dtype with pn; dQ, dK, dV are exact 28 x 21-bit digit products
rounded once to the dtype (the scale inside that rounding), dK/dV one sum over the KV group.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mutations import ORDER_BATCH, mutation, original, patch
from mutations._roundings import (
    cast_rounding,
    int64_to_float_rounding,
    ties_away,
    to_fixed_rounding,
    toward_zero,
)
from rlkernel.backends.generic import attention_backward as A
from rlkernel.backends.generic._exact import fp32, transcendental

OP = "attention_backward"
M = "attention_backward"
_row_exponents = original(M, "row_exponents")
_scores = original(M, "_scores")
_grad_product = original(M, "_grad_product")
_causal_allowed = original(M, "_causal_allowed")
_round_once = original(M, "_round_once")


def _exponent_plus_one(x: torch.Tensor) -> torch.Tensor:
    e = _row_exponents(x)
    return torch.where(e != 0, e + 1, e)


def _pack_exponents(x: torch.Tensor) -> torch.Tensor:
    """Row exponents of [T, H, D] inputs taken over every token of the pack (batch-dependent)."""
    e = _row_exponents(x)
    return e.amax(dim=0, keepdim=True).expand_as(e) if x.dim() == 3 and x.shape[0] else e


def _scores_scale_up(q: torch.Tensor, k: torch.Tensor, eq: torch.Tensor, ek: torch.Tensor,
                     scale: torch.Tensor) -> torch.Tensor:
    up = torch.tensor(float(np.nextafter(np.float32(scale.item()), np.float32(np.inf))), dtype=torch.float32)
    return _scores(q, k, eq, ek, up)


def _allowed(delta: int = 0, top_left: bool = False) -> Any:
    def allowed(lq: int, lk: int, causal: bool, device: torch.device) -> torch.Tensor:
        if not causal:
            return _causal_allowed(lq, lk, causal, device)
        i = torch.arange(lq, device=device).unsqueeze(1)
        j = torch.arange(lk, device=device).unsqueeze(0)
        return j <= i if top_left else j <= lk - lq + i + delta

    return allowed


def _reciprocal(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return num * (torch.ones_like(den) / den)


def _ds_one_rounding(pn: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    return (pn.double() * (dp.double() - delta.double())).float()


def _ds_distributed(pn: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    return pn * dp - pn * delta


def _kv_head_by_head(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype,
                     scale: tuple[int, int] | None = None) -> torch.Tensor:
    """dK/dV as a sum over heads of per-head products (each rounded to fp32), not one exact sum."""
    total = None
    for h in range(x.shape[0]):
        part = _grad_product(x[h].T, w[h].T, torch.float32, scale)
        total = part if total is None else total + part
    assert total is not None
    return total.to(dtype)


def _round_twice(c: torch.Tensor, k: torch.Tensor, dtype: torch.dtype,
                 scale: tuple[int, int] | None) -> torch.Tensor:
    """The scale applied after rounding C to fp32: RN_dtype(RN32(RN32(C 2**k) * scale))."""
    if scale is None:
        return _round_once(c, k, dtype, None)
    m, ks = scale
    y = fp32.int64_to_float(c, k, torch.float32)
    return (y * float(m * 2.0**ks)).to(dtype)


def _round_once_with(convert: Any) -> Any:
    """``_round_once`` with the final int64 -> dtype conversion replaced (both the plain and the two-limb path)."""

    def round_once(c: torch.Tensor, k: torch.Tensor, dtype: torch.dtype, scale: tuple[int, int] | None) -> torch.Tensor:
        if scale is None:
            return convert(c, k, dtype)
        m, ks = scale
        # the exact M * C fits int64 for these cases' magnitudes only when C is small: use the limbs, then
        # the mutated conversion on the sticky-folded magnitude (as int64_pair_to_float does)
        hi = (c >> A.SCALE_SPLIT) * m
        lo = (c & ((1 << A.SCALE_SPLIT) - 1)) * m
        saved = fp32.int64_to_float
        fp32.int64_to_float = convert
        try:
            return fp32.int64_pair_to_float(hi, lo, A.SCALE_SPLIT, k + ks, dtype)
        finally:
            fp32.int64_to_float = saved

    return round_once


def _no_dout_rule(do: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    return torch.zeros(do.shape[:-1], dtype=torch.bool, device=do.device)


TR = "_exact.transcendental"

MUTATIONS = [
    mutation(OP, "forward_scores", "QK_GRID 20 -> 19", patch(M, "QK_GRID", 19)),
    mutation(OP, "forward_scores", "score scale one ulp up", patch(M, "_scores", _scores_scale_up)),
    mutation(OP, "causal_mask", "diagonal excluded", patch(M, "_causal_allowed", _allowed(-1))),
    mutation(OP, "causal_mask", "top-left aligned", patch(M, "_causal_allowed", _allowed(top_left=True))),
    mutation(OP, "reference_max", "MAX_GAP 64 -> 63", patch(M, "MAX_GAP", 63.0)),
    mutation(OP, "reference_max", "p from the row max (zero-value keys count)", patch(M, "MAX_GAP", 0.0)),
    mutation(OP, "exp_c", "coefficient E0 + 1 ulp", patch(TR, "_E0", transcendental._E0 + 1)),
    mutation(OP, "p_bits", "P_BITS 40 -> 39", patch(M, "P_BITS", 39)),
    mutation(OP, "p_bits", "P_BITS 40 -> 41", patch(M, "P_BITS", 41)),
    mutation(OP, "p_rounding", "ties to even -> ties away", patch(M, "to_fixed", to_fixed_rounding(ties_away))),
    mutation(OP, "p_rounding", "to nearest -> toward zero", patch(M, "to_fixed", to_fixed_rounding(toward_zero))),
    mutation(OP, "normalisation", "P * (1 / L)", patch(M, "_normalise", _reciprocal)),
    mutation(OP, "do_grid_bits", "DO_BITS 27 -> 26", patch(M, "DO_BITS", 26)),
    mutation(OP, "ov_grid_bits", "OV_BITS 20 -> 19", patch(M, "OV_BITS", 19)),
    mutation(OP, "row_products", "to nearest -> toward zero",
             patch(M, "_to_fp32", lambda c, k: int64_to_float_rounding(toward_zero)(c, k, torch.float32))),
    mutation(OP, "row_products", "ties to even -> ties away",
             patch(M, "_to_fp32", lambda c, k: int64_to_float_rounding(ties_away)(c, k, torch.float32))),
    mutation(OP, "ds_formula", "pn * (dP - D) in one rounding", patch(M, "_ds", _ds_one_rounding)),
    mutation(OP, "ds_formula", "pn * dP - pn * D", patch(M, "_ds", _ds_distributed)),
    mutation(OP, "ds_cast", "to nearest -> toward zero", patch(M, "_cast_ds", cast_rounding("zero"))),
    mutation(OP, "ds_cast", "ties to even -> ties away", patch(M, "_cast_ds", cast_rounding("away"))),
    mutation(OP, "p_cast", "to nearest -> toward zero", patch(M, "_cast_p", cast_rounding("zero"))),
    mutation(OP, "grad_x_bits", "GX_BITS 27 -> 26", patch(M, "GX_BITS", 26)),
    mutation(OP, "grad_w_bits", "GW_BITS 20 -> 19", patch(M, "GW_BITS", 19)),
    mutation(OP, "grid_rounding", "ties to even -> ties away",
             patch("_exact.digits", "_round_grid", lambda v: torch.where(v >= 0, torch.floor(v + 0.5),
                                                                           torch.ceil(v - 0.5)))),
    mutation(OP, "grid_rounding", "to nearest -> toward zero", patch("_exact.digits", "_round_grid", torch.trunc)),
    mutation(OP, "row_exponent", "expo + 1", patch(M, "row_exponents", _exponent_plus_one)),
    mutation(OP, "gqa_sum", "dK/dV head by head, added in fp32", patch(M, "_kv_product", _kv_head_by_head)),
    mutation(OP, "scale_rounding", "scale applied after rounding C to fp32", patch(M, "_round_once", _round_twice)),
    mutation(OP, "output_rounding", "to nearest -> toward zero",
             patch(M, "_round_once", _round_once_with(int64_to_float_rounding(toward_zero)))),
    mutation(OP, "output_rounding", "ties to even -> ties away",
             patch(M, "_round_once", _round_once_with(int64_to_float_rounding(ties_away)))),
    mutation(OP, "nonfinite_rule", "NaN/inf in dO or out rows ignored", patch(M, "_bad_inputs", _no_dout_rule)),
    mutation(OP, ORDER_BATCH, "row exponents over the whole pack", patch(M, "row_exponents", _pack_exponents)),
]
