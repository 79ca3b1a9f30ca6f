"""Mutants of kl_k3's parameters: exp_c and its range rules, the order of the two subtractions."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap
from mutations.softmax import exp_representative, select_result

OP = "kl_k3"


def _k3(combine: Any) -> Any:
    """A kl_k3 kernel whose last two steps are ``combine(e, d, one)``."""

    def kernel(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        d = ref_logp - logp
        one = torch.ones((), dtype=torch.float32)
        return original("_exact.fp32", "canonical_nan")(combine(original("rl", "exp_c")(d), d, one))

    return kernel


def _minus_one_first(e: torch.Tensor, d: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    return (e - one) - d


def _one_rounding(e: torch.Tensor, d: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    return (e.to(torch.float64) - d.to(torch.float64) - 1.0).to(torch.float32)


def _batched_path(fn: Any) -> Any:
    """Inputs of more than one row take a path that subtracts the 1 first."""

    def mutant(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        if logp.dim() > 1 and logp.shape[0] > 1:
            return _k3(_minus_one_first)(logp, ref_logp)
        return fn(logp, ref_logp)

    return mutant


MUTATIONS: list[Mutation] = [
    *exp_representative(OP),
    mutation(OP, "exp_overflow_rule", "x > 89 -> +inf dropped (stand-in result 1)",
             wrap("rl", "exp_c", select_result(lambda x: x > 89.0, 1.0))),
    mutation(OP, "exp_underflow_rule", "x < -104 -> +0 dropped (stand-in result 1)",
             wrap("rl", "exp_c", select_result(lambda x: x < -104.0, 1.0))),
    mutation(OP, "k3_rounding", "RN(RN(e - d) - 1) -> RN(RN(e - 1) - d)",
             patch("rl", "kl_k3", _k3(_minus_one_first))),
    mutation(OP, "k3_rounding", "RN(RN(e - d) - 1) -> one rounding of e - d - 1",
             patch("rl", "kl_k3", _k3(_one_rounding))),
    mutation(OP, ORDER_BATCH, "rows > 1: (e - 1) - d", wrap("rl", "kl_k3", _batched_path)),
]
