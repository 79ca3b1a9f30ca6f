"""Mutants of log_softmax's parameters: the probability sum, exp_c and log_c, the R5 zero max."""

from __future__ import annotations

import torch

from mutations import Mutation, mutation, patch
from mutations.softmax import batch_max_mutant, cast_mutants, exp_mutants, log_mutants, sum_mutants


def _max_keeping_negative_zero(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """R5's max without its ``+ 0.0``: a row max of -0 stays -0."""
    m = torch.amax(x, dim=dim, keepdim=keepdim)
    return torch.where(torch.isnan(x).any(dim=dim, keepdim=keepdim), torch.full_like(m, float("nan")), m)


MUTATIONS: list[Mutation] = [
    *sum_mutants("log_softmax"),
    # k rounded half away from zero changes exp_c only where RN(x * log2e) is a half-integer;
    # none of those arguments in [-27.7, 0] changes the grid integer of p, so log_softmax cannot
    # see it (softmax pins it through p itself)
    *exp_mutants("log_softmax", "softmax", separate_ln2=True, k_half_away=False),
    # SQRT_HALF one ulp up moves only arguments below 1 (L >= 1 here)
    *log_mutants("log_softmax", "softmax", separate_ln2=True, sqrt_half_up=False),
    mutation("log_softmax", "max_zero_sign", "zero max keeps its sign",
             patch("softmax", "nan_max", _max_keeping_negative_zero)),
    *cast_mutants("log_softmax", "softmax"),
    batch_max_mutant("log_softmax"),
]

