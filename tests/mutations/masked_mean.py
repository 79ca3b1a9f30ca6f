"""Mutants of the generic ``masked_mean`` and of the P10 superaccumulator it sums with.

The superaccumulator mutants patch ``rlkernel.backends.generic._exact.superacc`` itself: every
user reads it through the module (``superacc.finish``, ``superacc.NUM_LIMBS``), except the
partial layout that ``rl`` copies at import (``PARTIAL_SLOTS``, ``COUNT``), patched alongside.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from mutations import ORDER_FLOAT_SUM, mutation, original, patch
from mutations._float_order import blocked_reversed_sum
from rlkernel.backends.generic import rl as generic_rl
from rlkernel.backends.generic._exact import superacc

SA = "_exact.superacc"
OP = "masked_mean"
_finish = original(SA, "finish")
_accumulate = original(SA, "accumulate")
_specials = original(SA, "_specials")


def _limb_split_div(e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    limb = torch.div(e, superacc.LIMB_BITS, rounding_mode="floor")
    return limb, e - limb * superacc.LIMB_BITS


def _limb_bits(bits: int) -> tuple:
    return patch(SA, "LIMB_BITS", bits), patch(SA, "_limb_split", _limb_split_div)


def _num_limbs(n: int) -> tuple:
    slots = n + 4
    return (patch(SA, "NUM_LIMBS", n), patch(SA, "STATE_SLOTS", slots), patch(SA, "CARRY", n),
            patch(SA, "NAN", n + 1), patch(SA, "POS_INF", n + 2), patch(SA, "NEG_INF", n + 3),
            patch("rl", "PARTIAL_SLOTS", slots + 1), patch("rl", "COUNT", slots))


def _balanced_limbs(x: torch.Tensor) -> torch.Tensor:
    """Carry propagation to balanced limbs in [-2**15, 2**15) instead of [0, 2**16)."""
    x = x.clone()
    for i in range(superacc.NUM_LIMBS):
        c = (x[..., i] + (1 << 15)) >> 16
        x[..., i] = x[..., i] - (c << 16)
        x[..., i + 1] += c
    return x


def _specials_swapped(rows: torch.Tensor) -> torch.Tensor:
    """[R, 3] counts of NaN, -inf, +inf (the +inf and -inf slots swapped)."""
    return _specials(rows)[:, [0, 2, 1]]


def _ties_away(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    return rem >= half


def _truncate(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(rem, dtype=torch.bool)


def _no_sticky(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    return (rem > half) | ((rem == half) & ((q & 1) == 1))


def _finish_then(fix: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """``superacc.finish`` followed by ``fix(out, states)``."""

    def finish(states: torch.Tensor) -> torch.Tensor:
        return fix(_finish(states), states)

    return finish


def _saturate(out: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Overflow saturates to +-max finite (only infinities from infinite terms stay)."""
    inf_terms = (states[..., superacc.POS_INF] > 0) | (states[..., superacc.NEG_INF] > 0)
    big = torch.finfo(torch.float32).max
    return torch.where(torch.isinf(out) & ~inf_terms, torch.where(out > 0, big, -big), out)


def _both_inf_positive(out: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """+inf and -inf terms (no NaN term) give +inf instead of NaN."""
    both = (states[..., superacc.POS_INF] > 0) & (states[..., superacc.NEG_INF] > 0) & (states[..., superacc.NAN] == 0)
    return torch.where(both, float("inf"), out)


def _nan_terms_ignored(states: torch.Tensor) -> torch.Tensor:
    s = states.clone()
    s[..., superacc.NAN] = 0
    return _finish(s)


def _negative_zero(out: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    return torch.where(out == 0, -0.0, out)


def _seq_means_one_rounding(x: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-sequence means rounded once: float64 sum ÷ count, then fp32 (not RN32(sum) ÷ fp32(count))."""
    kept = torch.where(mask, x, torch.zeros_like(x)).to(torch.float64)
    return (kept.sum(dim=1) / counts.to(torch.float64)).to(torch.float32)


def _finish_reciprocal(partial: torch.Tensor, denominator: float | None) -> torch.Tensor:
    """``S * (1 ÷ d)`` instead of ``S ÷ d``."""
    s = superacc.finish(partial[:generic_rl.COUNT])
    if denominator is not None:
        d = torch.tensor(denominator, dtype=torch.float32, device=partial.device)
    else:
        d = generic_rl.int64_to_f32(partial[generic_rl.COUNT])
    return generic_rl.canonical_nan(s * (torch.ones_like(d) / d))


def _float_accumulate(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The state of one fp32 value: the terms summed in floating point, reversed and blocked."""
    if t.shape[dim] == 0:
        return _accumulate(t, dim)
    return _accumulate(blocked_reversed_sum(t, dim).unsqueeze(-1), dim=-1)


MUTATIONS = [
    mutation(OP, "limb_bits", "16 -> 15", *_limb_bits(15)),
    mutation(OP, "limb_bits", "16 -> 17", *_limb_bits(17)),
    mutation(OP, "num_limbs", "16 -> 15 term limbs", *_num_limbs(15)),
    mutation(OP, "num_limbs", "16 -> 17 term limbs", *_num_limbs(17)),
    mutation(OP, "lsb_exponent", "-149 -> -150", patch(SA, "LSB_EXP", -150)),
    mutation(OP, "slot_layout", "+inf and -inf counts swapped", patch(SA, "POS_INF", 19), patch(SA, "NEG_INF", 18),
             patch(SA, "_specials", _specials_swapped)),
    mutation(OP, "canonical_form", "balanced limbs [-2**15, 2**15)", patch(SA, "normalize_limbs", _balanced_limbs)),
    mutation(OP, "rounding", "ties to even -> ties away", patch(SA, "_round_up", _ties_away)),
    mutation(OP, "rounding", "to nearest -> toward zero", patch(SA, "_round_up", _truncate)),
    mutation(OP, "rounding", "sticky bit dropped", patch(SA, "_round_up", _no_sticky)),
    mutation(OP, "overflow", "overflow saturates to max finite", patch(SA, "finish", _finish_then(_saturate))),
    mutation(OP, "specials", "+inf and -inf give +inf", patch(SA, "finish", _finish_then(_both_inf_positive))),
    mutation(OP, "specials", "NaN terms ignored", patch(SA, "finish", _nan_terms_ignored)),
    mutation(OP, "zero_sign", "a zero total is -0", patch(SA, "finish", _finish_then(_negative_zero))),
    mutation(OP, "seq_mean_rounding", "per-sequence mean rounded once", patch("rl", "_seq_means",
                                                                              _seq_means_one_rounding)),
    mutation(OP, "division", "S * (1 / d)", patch("rl", "_finish", _finish_reciprocal)),
    mutation(OP, ORDER_FLOAT_SUM, "fp32 sum, reversed, 32 lanes", patch(SA, "accumulate", _float_accumulate)),
]
