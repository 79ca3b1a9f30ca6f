"""Mutants of silu_mul's parameters: exp_c and its range rules, the division, the two roundings."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap
from mutations.softmax import cast_mutants, cast_truncating, exp_representative, select_result, swapped

OP = "silu_mul"


def _silu_reciprocal(g: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """``g * RN(1 / (1 + exp_c(-g)))``: silu as g times a rounded sigmoid."""
    return g * (one / (one + original("silu_mul", "exp_c")(torch.neg(g))))


def _round_s_truncating(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return s if dtype == torch.float32 else cast_truncating(s, dtype).to(torch.float32)


def _batched_path(fn: Any) -> Any:
    """Inputs of more than one row take a 'batched' path whose silu is g times a rounded sigmoid."""

    def mutant(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.dim() < 2 or gate.shape[0] < 2:
            return fn(gate, up)
        with swapped("silu_mul", "_silu", _silu_reciprocal):
            return fn(gate, up)

    return mutant


MUTATIONS: list[Mutation] = [
    *exp_representative(OP),
    mutation(OP, "exp_overflow_rule", "x > 89 -> +inf dropped (stand-in result 1)",
             wrap("silu_mul", "exp_c", select_result(lambda x: x > 89.0, 1.0))),
    mutation(OP, "exp_underflow_rule", "x < -104 -> +0 dropped (stand-in result 1)",
             wrap("silu_mul", "exp_c", select_result(lambda x: x < -104.0, 1.0))),
    mutation(OP, "silu_division", "g / (1 + e) -> g * RN(1 / (1 + e))", patch("silu_mul", "_silu", _silu_reciprocal)),
    mutation(OP, "s_rounding", "silu rounded to gate's dtype before the product -> kept in fp32",
             patch("silu_mul", "_round_s", lambda s, dtype: s)),
    mutation(OP, "s_rounding", "silu to gate's dtype: RNE -> toward zero",
             patch("silu_mul", "_round_s", _round_s_truncating)),
    *cast_mutants(OP, "silu_mul"),
    mutation(OP, ORDER_BATCH, "rows > 1: silu as g * RN(sigmoid)", wrap("silu_mul", "silu_mul", _batched_path)),
]
