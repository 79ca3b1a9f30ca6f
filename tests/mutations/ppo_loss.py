"""Mutants of the generic ``ppo_loss`` (per-token clipped objective, exact aggregation, backward).

The per-token and gradient steps are small functions of rounded fp32 operations; their mutants
are :func:`_tokens` and :func:`_grad`, copies of the generic steps with one thing changed (each
reads the generic helpers at call time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from mutations import ORDER_BATCH, mutation, original, patch
from rlkernel.backends.generic import rl as G
from rlkernel.backends.generic._exact import transcendental

OP = "ppo_loss"
TR = "_exact.transcendental"
_ppo_tokens = original("rl", "_ppo_tokens")


def _next32(value: float, toward: float) -> float:
    """The fp32 neighbour of the fp32 ``value`` toward ``toward``."""
    return float(np.nextafter(np.float32(value), np.float32(toward)))


def _shifted_bounds(lo_step: float | None = None, hi_step: float | None = None,
                    dual_step: float | None = None) -> Callable[..., Any]:
    """``_ppo_tokens`` with a clip bound (or the dual-clip constant) one fp32 ulp toward the step."""

    def tokens(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_lo: float,
               clip_hi: float, dual_clip: float | None) -> Any:
        lo = clip_lo if lo_step is None else _next32(clip_lo, lo_step)
        hi = clip_hi if hi_step is None else _next32(clip_hi, hi_step)
        c = dual_clip if dual_step is None or dual_clip is None else _next32(dual_clip, dual_step)
        return _ppo_tokens(logp, old_logp, advantages, lo, hi, c)

    return tokens


def _tokens(*, ties_clipped: bool = False, dual_ties_clip: bool = False,
            ratio_exp: Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] | None = None) -> Any:
    """The generic per-token step with one rule changed."""

    def tokens(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_lo: float,
               clip_hi: float, dual_clip: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dev = logp.device
        lo, hi = G._f32(clip_lo, dev), G._f32(clip_hi, dev)
        adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        neg_adv = torch.neg(adv)
        exp = ratio_exp(logp) if ratio_exp is not None else G.exp_c
        ratio = exp(logp - old_logp)
        clamped = torch.where(ratio < lo, lo, ratio)
        clamped = torch.where(clamped > hi, hi, clamped)
        pg1 = neg_adv * ratio
        pg2 = neg_adv * clamped
        clipped = pg1 <= pg2 if ties_clipped else pg1 < pg2
        tok = torch.where(clipped, pg2, pg1)
        nan = torch.isnan(pg1) | torch.isnan(pg2)
        tok = torch.where(nan, torch.full_like(tok, float("nan")), tok)
        tok = torch.where(tok == 0, torch.zeros_like(tok), tok)
        active = ~clipped
        if dual_clip is not None:
            pg3 = (neg_adv * G._f32(dual_clip, dev)).expand_as(tok)
            dual = (adv < 0) & ((pg3 <= tok) if dual_ties_clip else (pg3 < tok))
            tok = torch.where(dual, pg3, tok)
            active = active & ~dual
        return tok, pg1, active

    return tokens


def _torch_exp_for_big_batches(logp: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A "fast path" for 8 or more sequences: the library exp instead of the contract's."""
    return torch.exp if logp.shape[0] >= 8 else G.exp_c


def _grad(*, reciprocal_scale: bool = False, denominator_first: bool = False, count_all: bool = False) -> Any:
    """The generic backward with one rounding point or count changed."""

    def grad(pg1: torch.Tensor, active: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None,
             grad_output: torch.Tensor) -> torch.Tensor:
        counts = mask.sum(dim=1, keepdim=True)
        g = grad_output.to(torch.float32).reshape(())
        if denominator is not None:
            d = G._f32(denominator, pg1.device)
        elif mode == "token-mean":
            d = G.int64_to_f32(counts.sum())
        else:
            seqs = torch.tensor(mask.shape[0], device=mask.device) if count_all else (counts > 0).sum()
            d = G.int64_to_f32(seqs)
        if reciprocal_scale:
            scaled = pg1 * (g / d)
            if mode == "seq-mean-token-mean":
                scaled = scaled / G.int64_to_f32(counts)
            out = scaled
        elif denominator_first and mode == "seq-mean-token-mean":
            out = ((pg1 * g) / d) / G.int64_to_f32(counts)
        else:
            scaled = pg1 * g
            if mode == "seq-mean-token-mean":
                scaled = scaled / G.int64_to_f32(counts)
            out = scaled / d
        return G.canonical_nan(torch.where(active & mask, out, torch.zeros_like(out)))

    return grad


def _ties_away(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    return rem >= half


MUTATIONS = [
    mutation(OP, "exp_c", "exp_c coefficient E1 + 1 ulp", patch(TR, "_E1", transcendental._E1 + 1)),
    mutation(OP, "clip_bounds", "lo one ulp up", patch("rl", "_ppo_tokens", _shifted_bounds(lo_step=2.0))),
    mutation(OP, "clip_bounds", "hi one ulp down", patch("rl", "_ppo_tokens", _shifted_bounds(hi_step=0.0))),
    mutation(OP, "tie_rule", "ties go to the clipped branch (pg1 <= pg2)",
             patch("rl", "_ppo_tokens", _tokens(ties_clipped=True))),
    mutation(OP, "dual_clip", "c one ulp down", patch("rl", "_ppo_tokens", _shifted_bounds(dual_step=0.0))),
    mutation(OP, "dual_clip", "ties take the dual clip (pg3 <= tok)",
             patch("rl", "_ppo_tokens", _tokens(dual_ties_clip=True))),
    mutation(OP, "aggregation", "P10 sum rounded ties away", patch("_exact.superacc", "_round_up", _ties_away)),
    mutation(OP, "grad_rounding", "pg1 * (g / D)", patch("rl", "_ppo_grad", _grad(reciprocal_scale=True))),
    mutation(OP, "grad_rounding", "seq-mean-token-mean: / D before / c_b",
             patch("rl", "_ppo_grad", _grad(denominator_first=True))),
    mutation(OP, "grad_denominator", "sequence modes count every sequence", patch("rl", "_ppo_grad",
                                                                                 _grad(count_all=True))),
    mutation(OP, ORDER_BATCH, "torch.exp ratio for 8 or more sequences",
             patch("rl", "_ppo_tokens", _tokens(ratio_exp=_torch_exp_for_big_batches))),
]
