"""Mutants of rope_backward's parameters: the layout, the transposed rotation, its roundings, the tables."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, patch, wrap
from mutations.softmax import cast_mutants, swapped

OP = "rope_backward"
MOD = "rope_backward"


def _interleaved(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t[..., 0::2], t[..., 1::2]


def _forward_rotation(dy1: torch.Tensor, dy2: torch.Tensor, c: torch.Tensor,
                      s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's rotation (by +theta) instead of its transpose."""
    return dy1 * c - dy2 * s, dy2 * c + dy1 * s


def _fused(dy1: torch.Tensor, dy2: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a, b, cc, ss = (t.to(torch.float64) for t in (dy1, dy2, c, s))
    return (a * cc + b * ss).to(torch.float32), (b * cc - a * ss).to(torch.float32)


def _tables_in_grad_dtype(fn: Any) -> Any:
    def mutant(grad: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return fn(grad, positions, cos.to(grad.dtype).to(torch.float32), sin.to(grad.dtype).to(torch.float32))

    return mutant


def _batched_path(fn: Any) -> Any:
    def mutant(grad: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if grad.shape[0] <= 8:
            return fn(grad, positions, cos, sin)
        with swapped(MOD, "_rotate_back", _fused):
            return fn(grad, positions, cos, sin)

    return mutant


MUTATIONS: list[Mutation] = [
    mutation(OP, "layout", "rotate-half (i, i + D/2) -> interleaved (2i, 2i + 1)", patch(MOD, "_split", _interleaved)),
    mutation(OP, "rotation", "transpose -> the forward rotation", patch(MOD, "_rotate_back", _forward_rotation)),
    mutation(OP, "product_rounding", "products rounded separately -> one rounding per output (fused)",
             patch(MOD, "_rotate_back", _fused)),
    mutation(OP, "table_precision", "fp32 cos/sin -> rounded to grad's dtype",
             wrap(MOD, "rope_backward", _tables_in_grad_dtype)),
    *cast_mutants(OP, MOD),
    mutation(OP, ORDER_BATCH, "more than 8 tokens: fused rotation", wrap(MOD, "rope_backward", _batched_path)),
]
