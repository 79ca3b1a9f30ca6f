"""Mutants of rope's parameters: the rotate-half layout, the rotation, its roundings, the tables' precision."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, patch, wrap
from mutations.softmax import cast_mutants, swapped

OP = "rope"


def _interleaved(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-J pairs (2i, 2i + 1) instead of rotate-half (i, i + D/2)."""
    return t[..., 0::2], t[..., 1::2]


def _fused(x1: torch.Tensor, x2: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each output rounded once from the exact x1*c - x2*s (an FMA-like evaluation)."""
    a, b, cc, ss = (t.to(torch.float64) for t in (x1, x2, c, s))
    return (a * cc - b * ss).to(torch.float32), (b * cc + a * ss).to(torch.float32)


def _inverse_rotation(x1: torch.Tensor, x2: torch.Tensor, c: torch.Tensor,
                      s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x1 * c + x2 * s, x2 * c - x1 * s


def _tables_in_x_dtype(fn: Any) -> Any:
    """cos/sin rounded to x's dtype before the products (Hugging Face's cast)."""

    def mutant(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return fn(x, positions, cos.to(x.dtype).to(torch.float32), sin.to(x.dtype).to(torch.float32))

    return mutant


def _batched_path(fn: Any) -> Any:
    """More than 8 tokens take a path whose rotation is fused (one rounding per output)."""

    def mutant(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= 8:
            return fn(x, positions, cos, sin)
        with swapped("rope", "_rotate", _fused):
            return fn(x, positions, cos, sin)

    return mutant


MUTATIONS: list[Mutation] = [
    mutation(OP, "layout", "rotate-half (i, i + D/2) -> interleaved (2i, 2i + 1)",
             patch("rope", "_split", _interleaved)),
    mutation(OP, "rotation", "y1 = x1 c - x2 s -> x1 c + x2 s (inverse rotation)",
             patch("rope", "_rotate", _inverse_rotation)),
    mutation(OP, "product_rounding", "products rounded separately -> one rounding per output (fused)",
             patch("rope", "_rotate", _fused)),
    mutation(OP, "table_precision", "fp32 cos/sin -> rounded to x's dtype", wrap("rope", "rope", _tables_in_x_dtype)),
    *cast_mutants(OP, "rope"),
    mutation(OP, ORDER_BATCH, "more than 8 tokens: fused rotation", wrap("rope", "rope", _batched_path)),
]
