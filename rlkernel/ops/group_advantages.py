"""``rlkernel.ops.group_advantages``: GRPO group-normalised advantages (contract ``group_advantages`` v1)."""

from __future__ import annotations

import math

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _rl

__all__ = ["group_advantages"]


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """GRPO advantages: each group's rewards minus their mean, divided by their std + eps.

    ``adv = (r - mean(r)) / (std(r) + eps)`` per row (unbiased std, n - 1)

    Parameters
    ----------
    rewards : Tensor, float32, [G, n]
        One row per prompt group, one column per sampled response.
    eps : float
        Added to the std, rounded once to fp32; finite, >= 0 (default 1e-6).
    scale : bool
        False: mean-centred only (Dr. GRPO).

    Returns
    -------
    Tensor, float32, [G, n]

    Raises
    ------
    TypeError, ValueError
        rewards not a float32 [G, n] tensor; eps negative or not finite.
    rlkernel.dispatch.BackwardNotDefined
        rewards requires grad with grad mode on (no backward yet; never detached silently).

    Bitwise semantics
    -----------------
    ``mean = RN32(sum r) ÷ fp32(n)`` (exact P10 sum), ``d = RN32(r - mean)``,
    ``std = sqrt(RN32(sum RN32(d*d)) ÷ fp32(n - 1))`` (+0 when n = 1),
    ``adv = d ÷ RN32(std + fp32(eps))`` (or ``d`` when not scaling). A NaN or inf reward makes
    its group NaN. Invariances: permutation, reduction_order, batch, repeat.
    Contract ``group_advantages`` v1.
    """
    op = "group_advantages"
    r = _rl.fp32_tensor(op, "rewards", rewards)
    v.ndim(op, "rewards", r, 2, "[G, n] (one row per prompt group); reshape flat rewards with "
           "rewards.view(-1, n_samples_per_prompt)")
    e = _rl.number(op, "eps", eps, "eps=1e-6")
    if not math.isfinite(e) or e < 0:
        raise ValueError(f"{op}: eps = {eps!r}; expected a finite value >= 0 (e.g. 1e-6)")
    if not isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a bool, got {type(scale).__name__}")
    _rl.check_terms(op, r.shape[1])
    return dispatch.call(op, r.device, rewards=v.contiguous(r), eps=_rl.fp32_of(e), scale=scale)
