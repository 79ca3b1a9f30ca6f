"""Mutants of kl_k3_backward's parameters: exp_c and its range rules, the rounding order of g * (1 - e)."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap
from mutations.softmax import exp_representative, select_result

OP = "kl_k3_backward"
MOD = "rl_backward"


def _kernel(combine: Any) -> Any:
    def kernel(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        e = original(MOD, "exp_c")(ref_logp - logp)
        return original("_exact.fp32", "canonical_nan")(combine(grad, e))

    return kernel


def _torch_order(g: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """PyTorch autograd's order: -(RN(g * e) - g)."""
    return -((g * e) - g)


def _one_rounding(g: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return (g.to(torch.float64) * (1.0 - e.to(torch.float64))).to(torch.float32)


def _batched_path(fn: Any) -> Any:
    def mutant(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        if logp.dim() > 1 and logp.shape[0] > 1:
            return _kernel(_torch_order)(grad, logp, ref_logp)
        return fn(grad, logp, ref_logp)

    return mutant


MUTATIONS: list[Mutation] = [
    *exp_representative(OP),
    mutation(OP, "exp_overflow_rule", "x > 89 -> +inf dropped (stand-in result 1)",
             wrap(MOD, "exp_c", select_result(lambda x: x > 89.0, 1.0))),
    mutation(OP, "exp_underflow_rule", "x < -104 -> +0 dropped (stand-in result 1)",
             wrap(MOD, "exp_c", select_result(lambda x: x < -104.0, 1.0))),
    mutation(OP, "grad_rounding", "RN(g * RN(1 - e)) -> -(RN(g * e) - g)",
             patch(MOD, "kl_k3_backward", _kernel(_torch_order))),
    mutation(OP, "grad_rounding", "RN(g * RN(1 - e)) -> one rounding of g * (1 - e)",
             patch(MOD, "kl_k3_backward", _kernel(_one_rounding))),
    mutation(OP, ORDER_BATCH, "rows > 1: PyTorch's order", wrap(MOD, "kl_k3_backward", _batched_path)),
]
