"""Mutants of the generic ``all_reduce`` (exact int64 sum/max over the world axis)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mutations import ORDER_FLOAT_SUM, mutation, original, patch

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_overflow_mask = original("all_reduce", "overflow_mask")


def _narrowed(end: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``overflow_mask`` that also rejects an exact total equal to ``end`` (the range one smaller)."""

    def mask(partials: torch.Tensor) -> torch.Tensor:
        over = _overflow_mask(partials)
        return over | (~over & (partials.sum(dim=0) == end))

    return mask


def _sum_kernel(total: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The kernel with its "sum" replaced by ``total(partials)`` (max unchanged)."""
    kernel = original("all_reduce", "all_reduce")

    def mutant(partials: torch.Tensor, reduction: str = "sum") -> Any:
        return total(partials) if reduction == "sum" else kernel(partials, reduction)

    return mutant


def _saturating(partials: torch.Tensor) -> torch.Tensor:
    """Rank-order sum whose running sums saturate at the int64 ends instead of wrapping."""
    acc = partials[0].clone()
    for r in range(1, partials.shape[0]):
        p = partials[r]
        s = acc + p  # wraps
        up = (acc > 0) & (p > 0) & (s < 0)
        down = (acc < 0) & (p < 0) & (s >= 0)
        acc = torch.where(up, INT64_MAX, torch.where(down, INT64_MIN, s))
    return acc


def _float64_reversed(partials: torch.Tensor) -> torch.Tensor:
    """float64 sum in reversed rank order (rounds above 2**53), converted back to int64."""
    acc = torch.zeros(partials.shape[1:], dtype=torch.float64)
    for r in range(partials.shape[0] - 1, -1, -1):
        acc = acc + partials[r].to(torch.float64)
    return acc.clamp(min=-(2.0**63), max=2.0**63 - 1024).to(torch.int64)


def _unsigned_max(kernel: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def mutant(partials: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        if reduction != "max":
            return kernel(partials, reduction)
        flip = torch.tensor(INT64_MIN, dtype=torch.int64)
        return (partials ^ flip).amax(dim=0) ^ flip  # the sign bit flipped: unsigned order

    return mutant


MUTATIONS = [
    mutation("all_reduce", "int64_range", "total INT64_MAX rejected", patch("all_reduce", "overflow_mask",
                                                                           _narrowed(INT64_MAX))),
    mutation("all_reduce", "int64_range", "total INT64_MIN rejected", patch("all_reduce", "overflow_mask",
                                                                           _narrowed(INT64_MIN))),
    mutation("all_reduce", "intermediate_wrap", "running sums saturate",
             patch("all_reduce", "all_reduce", _sum_kernel(_saturating))),
    mutation("all_reduce", "max_order", "unsigned max",
             patch("all_reduce", "all_reduce", _unsigned_max(original("all_reduce", "all_reduce")))),
    mutation("all_reduce", ORDER_FLOAT_SUM, "float64 sum in reversed rank order",
             patch("all_reduce", "all_reduce", _sum_kernel(_float64_reversed))),
]
