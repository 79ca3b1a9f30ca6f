"""Mutants of masked_mean_backward's parameters: the denominator, the divisions, the masked-out zeros."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap
from mutations.softmax import swapped

OP = "masked_mean_backward"
MOD = "rl_backward"
_int64_to_f32 = original("_exact.fp32", "int64_to_f32")
_denominator = original(MOD, "_denominator")


def _all_sequences(mask: torch.Tensor, counts: torch.Tensor, mode: str, denominator: float | None) -> torch.Tensor:
    """seq-mean modes without a denominator count every sequence, empty ones included."""
    if denominator is None and mode != "token-mean":
        return _int64_to_f32(torch.tensor(mask.shape[0], device=mask.device))
    return _denominator(mask, counts, mode, denominator)


def _one_division(g: torch.Tensor, counts: torch.Tensor, d: torch.Tensor, mode: str) -> torch.Tensor:
    """seq-mean-token-mean: g ÷ RN32(c_b * D), one division."""
    if mode == "seq-mean-token-mean":
        return g / (_int64_to_f32(counts) * d)
    return g / d


def _swapped_order(g: torch.Tensor, counts: torch.Tensor, d: torch.Tensor, mode: str) -> torch.Tensor:
    """seq-mean-token-mean: RN32(RN32(g ÷ D) ÷ c_b)."""
    if mode == "seq-mean-token-mean":
        return (g / d) / _int64_to_f32(counts)
    return g / d


def _negative_zeros(fn: Any) -> Any:
    def mutant(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
               denominator: float | None = None) -> torch.Tensor:
        out = fn(grad, mask, mode, denominator)
        return torch.where(mask, out, torch.full_like(out, -0.0))

    return mutant


def _batched_path(fn: Any) -> Any:
    def mutant(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
               denominator: float | None = None) -> torch.Tensor:
        if mask.shape[0] <= 1:
            return fn(grad, mask, mode, denominator)
        with swapped(MOD, "_per_token", _swapped_order):
            return fn(grad, mask, mode, denominator)

    return mutant


MUTATIONS: list[Mutation] = [
    mutation(OP, "grad_denominator", "seq-mean count: sequences with kept tokens -> all sequences",
             patch(MOD, "_denominator", _all_sequences)),
    mutation(OP, "grad_rounding", "RN(RN(g ÷ c_b) ÷ D) -> g ÷ RN(c_b * D)", patch(MOD, "_per_token", _one_division)),
    mutation(OP, "grad_rounding", "RN(RN(g ÷ c_b) ÷ D) -> RN(RN(g ÷ D) ÷ c_b)",
             patch(MOD, "_per_token", _swapped_order)),
    mutation(OP, "masked_out", "+0 at masked-out positions -> -0", wrap(MOD, "masked_mean_backward", _negative_zeros)),
    mutation(OP, ORDER_BATCH, "B > 1: the divisions swapped", wrap(MOD, "masked_mean_backward", _batched_path)),
]
