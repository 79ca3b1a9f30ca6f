"""Mutants of exact_sum: the terms, the axis, the scatter rows, the state form, the merge, the
accumulation into a state, the total, the rounding, the specials and the zero sign, and an fp32
(order-dependent) sum."""

from __future__ import annotations

import torch

from mutations import ORDER_FLOAT_SUM, mutation, original, patch
from mutations._float_order import blocked_reversed_sum
from mutations.masked_mean import _balanced_limbs, _finish_then, _nan_terms_ignored, _negative_zero, _truncate

OP = "exact_sum"
M = "exact_sum"
SA = "_exact.superacc"
_partial = original(M, "exact_sum_partial")
_merge = original(M, "exact_sum_merge")
_accumulate = original(SA, "accumulate")
_normalize_limbs = original(SA, "normalize_limbs")


def _terms_bf16(terms, index=None, num_rows=None):  # type: ignore[no-untyped-def]
    """Terms rounded to bfloat16 before they are summed."""
    return _partial(terms.to(torch.bfloat16).to(torch.float32), index, num_rows)


def _first_term_dropped(terms, index=None, num_rows=None):  # type: ignore[no-untyped-def]
    """The sum runs over terms[1:] (axis 0 off by one)."""
    if index is not None:
        return _partial(terms[1:], index[1:], num_rows)
    return _partial(terms[1:], None, None)


def _rows_shifted(terms, index=None, num_rows=None):  # type: ignore[no-untyped-def]
    """Term s lands in row index[s] + 1 (mod num_rows)."""
    if index is None:
        return _partial(terms, index, num_rows)
    return _partial(terms, (index + 1) % max(num_rows, 1), num_rows)


def _balanced_partial(terms, index=None, num_rows=None):  # type: ignore[no-untyped-def]
    """Partials returned with balanced limbs in [-2**15, 2**15) (not the canonical form)."""
    out = _partial(terms, index, num_rows).clone()
    out[..., :17] = _balanced_limbs(out[..., :17])
    return out


def _merge_raw(states):  # type: ignore[no-untyped-def]
    """Merge by slot-wise sum only (no carry normalisation)."""
    if states.shape[0] == 0:
        return _merge(states)
    return states.sum(dim=0)


def _state_restarted(state, terms):  # type: ignore[no-untyped-def]
    """The accumulator's old contents dropped: the state becomes the terms' partial alone."""
    return _partial(terms)


def _total_in_fp32(terms):  # type: ignore[no-untyped-def]
    """The total as torch's fp32 sum over axis 0 (rounded at every add) instead of one rounding."""
    return terms.sum(dim=0)


def _specials_dropped(terms, index=None, num_rows=None):  # type: ignore[no-untyped-def]
    out = _partial(terms, index, num_rows).clone()
    out[..., 17:] = 0
    return out


def _float_accumulate(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """fp32 sum (blocked, reversed) first, then its exact state: order-dependent."""
    if t.shape[dim] <= 1:
        return _accumulate(t, dim)
    return _accumulate(blocked_reversed_sum(t, dim).unsqueeze(dim), dim=dim)


MUTATIONS = [
    mutation(OP, "terms", "terms rounded to bfloat16", patch(M, "exact_sum_partial", _terms_bf16)),
    mutation(OP, "sum_axis", "axis 0 summed from the second term", patch(M, "exact_sum_partial", _first_term_dropped)),
    mutation(OP, "scatter", "row index + 1", patch(M, "exact_sum_partial", _rows_shifted)),
    mutation(OP, "state", "balanced limbs in partials", patch(M, "exact_sum_partial", _balanced_partial)),
    mutation(OP, "merge", "slot sums without carries", patch(M, "exact_sum_merge", _merge_raw)),
    mutation(OP, "accumulate", "the state restarted from the terms",
             patch(M, "exact_sum_accumulate", _state_restarted)),
    mutation(OP, "total", "fp32 sum over axis 0", patch(M, "exact_sum_total", _total_in_fp32)),
    mutation(OP, "rounding", "to nearest -> toward zero", patch(SA, "_round_up", _truncate)),
    mutation(OP, "specials", "special counts dropped", patch(M, "exact_sum_partial", _specials_dropped)),
    mutation(OP, "specials", "NaN terms ignored at finish", patch(SA, "finish", _nan_terms_ignored)),
    mutation(OP, "zero_sign", "a zero total is -0", patch(SA, "finish", _finish_then(_negative_zero))),
    mutation(OP, ORDER_FLOAT_SUM, "fp32 sum, reversed, 32 lanes", patch(SA, "accumulate", _float_accumulate)),
]
