"""Mutants of silu_mul_backward's parameters: exp_c and its range rules, the sigmoid, the derivative's
order, the two products and the casts."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, patch, wrap
from mutations.softmax import cast_mutants, exp_representative, select_result, swapped

OP = "silu_mul_backward"
MOD = "silu_mul_backward"


def _sigmoid_complement(den: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """sig = RN32(1 - RN32(RN32(den - 1) ÷ den)) instead of RN32(1 ÷ den)."""
    return one - (den - one) / den


def _derivative_distributed(g: torch.Tensor, sig: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """sig + sig * (g * (1 - sig)): the product distributed over the sum."""
    return sig + sig * (g * (one - sig))


def _silu_fp32(g: torch.Tensor, den: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return g / den


def _batched_path(fn: Any) -> Any:
    """More than one row: the derivative distributed."""

    def mutant(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> Any:
        if gate.dim() < 2 or gate.shape[0] < 2:
            return fn(grad, gate, up)
        with swapped(MOD, "_derivative", _derivative_distributed):
            return fn(grad, gate, up)

    return mutant


MUTATIONS: list[Mutation] = [
    *exp_representative(OP),
    mutation(OP, "exp_overflow_rule", "x > 89 -> +inf dropped (stand-in result 1)",
             wrap(MOD, "exp_c", select_result(lambda x: x > 89.0, 1.0))),
    mutation(OP, "exp_underflow_rule", "x < -104 -> +0 dropped (stand-in result 1)",
             wrap(MOD, "exp_c", select_result(lambda x: x < -104.0, 1.0))),
    mutation(OP, "sigmoid", "1 ÷ den -> 1 - (den - 1) ÷ den", patch(MOD, "_sigmoid", _sigmoid_complement)),
    mutation(OP, "derivative", "sig * (1 + t) -> sig + sig * t", patch(MOD, "_derivative", _derivative_distributed)),
    mutation(OP, "gate_product", "(dy * up) * ds -> dy * (up * ds)",
             patch(MOD, "_gate_product", lambda dy, up, ds: dy * (up * ds))),
    mutation(OP, "up_product", "dup with silu in fp32 (not rounded to gate's dtype)",
             patch(MOD, "_silu_value", _silu_fp32)),
    *cast_mutants(OP, MOD),
    mutation(OP, ORDER_BATCH, "rows > 1: derivative distributed", wrap(MOD, "silu_mul_backward", _batched_path)),
]
