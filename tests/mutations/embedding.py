"""Mutants of embedding's parameters: a bit copy keeps -0 and subnormals."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, wrap

OP = "embedding"


def _plus_zero(fn: Any) -> Any:
    """Rows pass through an fp32 ``+ 0.0`` (which turns -0 into +0)."""
    return lambda ids, weight: fn(ids, (weight.to(torch.float32) + 0.0).to(weight.dtype))


def _flush_subnormals(fn: Any) -> Any:
    """Subnormal weights flushed to (signed) zero."""

    def mutant(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        tiny = (weight.abs() < torch.finfo(weight.dtype).tiny) & (weight != 0)
        return fn(ids, torch.where(tiny, weight * 0, weight))

    return mutant


def _batched_path(fn: Any) -> Any:
    """More than 32 ids take a 'batched' path that gathers through an fp32 ``+ 0.0``."""
    plus_zero = _plus_zero(fn)
    return lambda ids, weight: plus_zero(ids, weight) if ids.numel() > 32 else fn(ids, weight)


MUTATIONS: list[Mutation] = [
    mutation(OP, "signed_zero", "-0 copied as +0 (an fp32 + 0.0)", wrap("embedding", "embedding", _plus_zero)),
    mutation(OP, "subnormals", "subnormals flushed to zero", wrap("embedding", "embedding", _flush_subnormals)),
    mutation(OP, ORDER_BATCH, "more than 32 ids: gathered through + 0.0",
             wrap("embedding", "embedding", _batched_path)),
]
