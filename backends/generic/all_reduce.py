"""Device-generic ``all_reduce`` (contract ``all_reduce`` v1): exact int64 sum/max over axis 0.

The sum is checked for overflow without leaving int64: each value splits into a signed high
half and an unsigned low half (``v = hi * 2**32 + lo``); the halves are summed separately
(exact for world < 2**31) and the carry of the low sum folded into the high sum. The total fits
int64 iff that high sum lies in [-2**31, 2**31). If it fits, the wrapped int64 sum (any order)
equals the exact total.
"""

from __future__ import annotations

import torch

_LOW = (1 << 32) - 1


def overflow_mask(partials: torch.Tensor) -> torch.Tensor:
    """Bool [L]: does the exact sum over axis 0 of int64 ``partials`` [world, L] leave int64?"""
    lo = (partials & _LOW).sum(dim=0)
    hi = (partials >> 32).sum(dim=0) + (lo >> 32)
    return (hi < -(1 << 31)) | (hi >= (1 << 31))


def all_reduce(partials: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Kernel ``all_reduce``: partials int64 [world, L] (world >= 1) -> int64 [L].

    ``reduction`` is the public op's ``op`` ("sum" or "max"), renamed because
    ``rlkernel.dispatch.call`` takes the op name as its own ``op`` argument.
    """
    if reduction == "max":
        return partials.amax(dim=0)
    if reduction != "sum":
        raise ValueError(f"all_reduce: op={reduction!r}; expected 'sum' or 'max'")
    over = overflow_mask(partials)
    if over.numel() and bool(over.any()):
        i = int(over.nonzero()[0, 0])
        exact = sum(int(p) for p in partials[:, i].tolist())
        raise ValueError(f"all_reduce: the exact sum at flat index {i} is {exact}, outside int64 "
                         f"[-2**63, 2**63); the partials' bound is broken (use fewer terms per sum)")
    return partials.sum(dim=0)
