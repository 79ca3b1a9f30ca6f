"""Device-generic ``all_reduce`` (contract ``all_reduce`` v1): exact int64 sum/max over axis 0.

The sum is checked for overflow without leaving int64: each value splits into a signed high
half and an unsigned low half (``v = hi * 2**32 + lo``); the halves are summed separately
(exact for world < 2**31) and the carry of the low sum folded into the high sum. The total fits
int64 iff that high sum lies in [-2**31, 2**31). If it fits, the wrapped int64 sum (any order)
equals the exact total.

Where :mod:`_exact.intpath` selects int32 limbs, the same sum is taken on five 16-bit limbs (the
fifth says whether the total left int64) and the max compares the signed high words, then the
low words as unsigned: no int64 arithmetic.
"""

from __future__ import annotations

import torch

from ._exact import intpath, limbs32

_LOW = (1 << 32) - 1


def _sum_int32(partials: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The wrapped int64 sum [L] and the overflow mask [L] of ``partials`` [world, L], on int32 limbs."""
    limbs = limbs32.from_int64(partials)  # [world, L, 4], the top limb signed
    top = limbs[..., 3]
    wide = torch.cat([limbs[..., :3], (top & limbs32.MASK).unsqueeze(-1), (top >> limbs32.BITS).unsqueeze(-1)], -1)
    total = limbs32.total(wide, dim=0)  # [L, 5]
    fits = total[..., 4] == torch.where(total[..., 3] >= 1 << 15, -1, 0).to(torch.int32)
    return limbs32.to_int64(total[..., :4]), ~fits


def _max_int32(partials: torch.Tensor) -> torch.Tensor:
    """``partials.amax(dim=0)`` from the int32 words: the signed high words, then the low words unsigned."""
    lo, hi = limbs32.words(partials)
    flip = -(1 << 31)  # lo ^ flip orders the low words as unsigned in a signed comparison
    hi_max = hi.amax(dim=0)
    cand = torch.where(hi == hi_max, lo ^ flip, flip)
    lo_max = cand.amax(dim=0) ^ flip
    return limbs32.from_words(lo_max, hi_max)


def overflow_mask(partials: torch.Tensor) -> torch.Tensor:
    """Bool [L]: does the exact sum over axis 0 of int64 ``partials`` [world, L] leave int64?"""
    if intpath.int32(partials.device):
        return _sum_int32(partials)[1]
    lo = (partials & _LOW).sum(dim=0)
    hi = (partials >> 32).sum(dim=0) + (lo >> 32)
    return (hi < -(1 << 31)) | (hi >= (1 << 31))


def all_reduce(partials: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Kernel ``all_reduce``: partials int64 [world, L] (world >= 1) -> int64 [L].

    ``reduction`` is the public op's ``op`` ("sum" or "max"), renamed because
    ``rlkernel.dispatch.call`` takes the op name as its own ``op`` argument.
    """
    int32 = intpath.int32(partials.device)
    if reduction == "max":
        return _max_int32(partials) if int32 else partials.amax(dim=0)
    if reduction != "sum":
        raise ValueError(f"all_reduce: op={reduction!r}; expected 'sum' or 'max'")
    total, over = _sum_int32(partials) if int32 else (None, overflow_mask(partials))
    if over.numel() and bool(over.any()):
        i = int(over.nonzero()[0, 0])
        exact = sum(int(p) for p in partials[:, i].tolist())
        raise ValueError(f"all_reduce: the exact sum at flat index {i} is {exact}, outside int64 "
                         f"[-2**63, 2**63); the partials' bound is broken (use fewer terms per sum)")
    return total if total is not None else partials.sum(dim=0)
