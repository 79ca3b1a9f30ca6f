"""Mutants of the generic ``group_advantages`` (exact P10 sums, IEEE steps per group).

The kernel is a few lines of rounded fp32 steps; the step mutants replace it by
:func:`_variant`, the same steps with one of them changed, reading every helper from the generic
modules at call time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, mutation, original, patch
from mutations._float_order import blocked_reversed_sum
from rlkernel.backends.generic import rl as G
from rlkernel.backends.generic._exact import superacc

OP = "group_advantages"
SA = "_exact.superacc"
Sum = Callable[[torch.Tensor], torch.Tensor]


def _exact(t: torch.Tensor) -> torch.Tensor:
    return superacc.exact_sum(t, dim=1)


def _sqrt_toward_zero(x: torch.Tensor) -> torch.Tensor:
    """sqrt rounded toward zero: the correctly rounded root, one ulp down where it rounded up."""
    y = G.sqrt_rn(x)
    up = torch.isfinite(y) & (y > 0) & (y.to(torch.float64) ** 2 > x.to(torch.float64))
    return torch.where(up, torch.nextafter(y, torch.zeros_like(y)), y)


def _variant(*, reciprocal: bool = False, exact_squares: bool = False, ddof: int = 1,
             sqrt: Callable[[torch.Tensor], torch.Tensor] | None = None, eps_ulps: int = 0,
             singleton_nan: bool = False, sums: Callable[[torch.Tensor], Sum] | None = None) -> Any:
    """The generic kernel's steps, one of them changed by the keyword given."""

    def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
        g, n = rewards.shape
        dev = rewards.device
        if rewards.numel() == 0:
            return torch.empty((g, n), dtype=torch.float32, device=dev)
        total = sums(rewards) if sums is not None else _exact
        s = total(rewards)
        n32 = G._f32(float(n), dev)
        mean = s * (torch.ones_like(n32) / n32) if reciprocal else s / n32
        d = rewards - mean.unsqueeze(1)
        if not scale:
            return G.canonical_nan(d)
        if n > 1:
            if exact_squares:
                sq = (d.to(torch.float64) ** 2).sum(dim=1).to(torch.float32)
            else:
                sq = total(d * d)
            std = (sqrt or G.sqrt_rn)(sq / G._f32(float(n - ddof), dev))
        else:
            std = torch.full((g,), float("nan") if singleton_nan else 0.0, dtype=torch.float32, device=dev)
        e = G._f32(eps, dev)
        for _ in range(eps_ulps):
            e = torch.nextafter(e, torch.zeros_like(e))
        return G.canonical_nan(d / (std + e).unsqueeze(1))

    return group_advantages


def _float_sums(rewards: torch.Tensor) -> Sum:
    return lambda t: blocked_reversed_sum(t, dim=1)


def _float_sums_for_big_batches(rewards: torch.Tensor) -> Sum:
    """A "fast path" for batches of more than 8 groups: fp32 sums (torch's own order)."""
    return (lambda t: t.sum(dim=1)) if rewards.shape[0] > 8 else _exact


def _ties_away(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    return rem >= half


def _truncate(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(rem, dtype=torch.bool)


def _kernel(**kw: Any) -> Any:
    return patch("rl", "group_advantages", _variant(**kw))


assert original("rl", "group_advantages") is G.group_advantages

MUTATIONS = [
    mutation(OP, "sum_rounding", "ties to even -> ties away", patch(SA, "_round_up", _ties_away)),
    mutation(OP, "sum_rounding", "to nearest -> toward zero", patch(SA, "_round_up", _truncate)),
    mutation(OP, "mean_division", "sum * (1 / n)", _kernel(reciprocal=True)),
    mutation(OP, "var_squares", "squares exact (float64), rounded once with the sum", _kernel(exact_squares=True)),
    mutation(OP, "var_divisor", "n - 1 -> n", _kernel(ddof=0)),
    mutation(OP, "sqrt", "to nearest -> toward zero", _kernel(sqrt=_sqrt_toward_zero)),
    mutation(OP, "eps", "fp32(eps) one ulp smaller", _kernel(eps_ulps=1)),
    mutation(OP, "singleton", "n = 1: std NaN (0 / 0) instead of +0", _kernel(singleton_nan=True)),
    mutation(OP, ORDER_FLOAT_SUM, "fp32 sums, reversed, 32 lanes", _kernel(sums=_float_sums)),
    mutation(OP, ORDER_BATCH, "fp32 sums for more than 8 groups", _kernel(sums=_float_sums_for_big_batches)),
]
