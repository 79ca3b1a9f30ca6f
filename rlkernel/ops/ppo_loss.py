"""``rlkernel.ops.ppo_loss``: the clipped PPO/GRPO policy loss with exact aggregation and an exact
backward (contract ``ppo_loss`` v1)."""

from __future__ import annotations

import math
from typing import Any

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _rl

__all__ = ["PPOLossFunction", "ppo_loss"]


class PPOLossFunction(torch.autograd.Function):
    """Autograd for :func:`ppo_loss`: the backward is the contract's elementwise gradient.

    ``grad_logp = RN32(RN32(pg1 * g) ÷ D)`` on kept tokens whose unclipped branch is active
    (per-sequence ``÷ fp32(c_b)`` first in ``seq-mean-token-mean``), +0 elsewhere: computed by
    the backend kernel, deterministic and batch-invariant. No gradient for the other inputs.
    """

    @staticmethod
    def forward(ctx: Any, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        ctx.save_for_backward(logp, old_logp, advantages, mask)
        ctx.kwargs = kwargs
        return dispatch.call("ppo_loss", logp.device, logp=logp, old_logp=old_logp, advantages=advantages,
                             mask=mask, **kwargs)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logp, old_logp, advantages, mask = ctx.saved_tensors
        grad = dispatch.call("ppo_loss", logp.device, logp=logp, old_logp=old_logp, advantages=advantages,
                             mask=mask, grad_output=grad_output.detach().to(torch.float32).reshape(()),
                             **ctx.kwargs)
        return grad, None, None, None, None


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
             mode: str = "token-mean", denominator: float | int | None = None, partial: bool = False,
             grad_output: torch.Tensor | None = None) -> torch.Tensor:
    """Clipped PPO/GRPO policy loss with optional dual clip; exact aggregation and backward.

    ``loss = masked_mean(max(-A * r, -A * clamp(r, 1 - clip_low, 1 + clip_high)), mask, mode)``,
    ``r = exp_c(logp - old_logp)``

    Parameters
    ----------
    logp : Tensor, float32, [B, T]
        Current-policy token log-probs; the differentiable input (autograd supported).
    old_logp : Tensor, float32, [B, T]
        Behaviour-policy (rollout) log-probs.
    advantages : Tensor, float32, [B, T] or [B]
        Per-token advantages, or one per sequence (GRPO), broadcast over T.
    mask : Tensor, bool, [B, T]
        Response tokens; other positions are ignored whatever they hold.
    clip_low, clip_high : float
        Ratio clip range ``[1 - clip_low, 1 + clip_high]`` (each bound rounded once to fp32
        from float64); 0 <= clip_low < 1, clip_high >= 0. Defaults 0.2 / 0.2.
    dual_clip : float, optional
        Dual-clip constant c > 1 (verl ``clip_ratio_c``, e.g. 3.0): where A < 0 the token
        loss is capped at ``-A * c``. None (default) disables it.
    mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}
        Aggregation, as :func:`masked_mean`.
    denominator : float or int, optional
        Global normalisation count, as :func:`masked_mean`.
    partial : bool
        Return the exact masked-mean partial (int64 [21]) of the token losses, for exact
        micro-batch accumulation (:func:`rlkernel.rl.finish_partials`). Not differentiable: an
        integer output, computed without grad even when logp requires grad (for logging).
    grad_output : Tensor, float32, [], optional
        Return the backward ``grad_output * d loss / d logp`` (float32 [B, T]) instead of the
        loss: what autograd calls, exposed for frameworks with their own backward pass.

    Returns
    -------
    Tensor, float32, [] (loss), int64 [21] (``partial``) or float32 [B, T] (``grad_output``)

    Raises
    ------
    TypeError, ValueError
        Wrong dtypes (all float32, mask bool), shapes, devices, clip values or modes.
    rlkernel.dispatch.BackwardNotDefined
        Grad mode is on and old_logp or advantages requires grad (the backward is for logp
        only), or ``grad_output`` is given with inputs that require grad (no double backward).

    Bitwise semantics
    -----------------
    Host constants ``lo = RN32(1 - clip_low)``, ``hi = RN32(1 + clip_high)``,
    ``c = RN32(dual_clip)``. Per token, one IEEE rounding per operation:
    ``r = exp_c(RN32(logp - old_logp))``, ``pg1 = RN32(-A * r)``,
    ``pg2 = RN32(-A * clamp(r, lo, hi))``, ``tok = max(pg1, pg2)`` (NaN propagates, +0 for
    zero); dual clip: where A < 0 and ``RN32(-A * c) < tok``, ``tok = RN32(-A * c)``.
    ``loss = masked_mean(tok, mask, mode, denominator)`` (exact sums). The unclipped branch is
    active when ``not (pg1 < pg2)`` and the dual clip did not replace tok (ties keep the
    gradient). Backward: ``RN32(RN32(pg1 * g) ÷ D)`` on kept active tokens (``÷ fp32(c_b)``
    first for ``seq-mean-token-mean``), +0 elsewhere; D = fp32(denominator or the mode's
    count). ``logp == old_logp`` gives a ratio of exactly 1. Invariances: permutation, batch,
    micro_batch, repeat, autograd. Contract ``ppo_loss`` v1.
    """
    op = "ppo_loss"
    logp = _rl.fp32_tensor(op, "logp", logp)
    old_logp = _rl.fp32_tensor(op, "old_logp", old_logp)
    advantages = _rl.fp32_tensor(op, "advantages", advantages)
    v.ndim(op, "logp", logp, 2, "[B, T] (one row per sequence)")
    if old_logp.shape != logp.shape:
        raise ValueError(f"{op}: old_logp has shape {tuple(old_logp.shape)}; expected logp's shape "
                         f"{tuple(logp.shape)} ([B, T])")
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(f"{op}: advantages has shape {tuple(advantages.shape)}; expected [B, T] = "
                         f"{tuple(logp.shape)} or [B] = {tuple(logp.shape[:1])} (one per sequence)")
    m = _rl.mask_of(op, mask, logp.shape)
    device = v.same_device(op, [("logp", logp), ("old_logp", old_logp), ("advantages", advantages), ("mask", m)])
    mode = _rl.mode_of(op, mode)
    den = _rl.denominator_of(op, denominator)
    cl = _rl.number(op, "clip_low", clip_low, "clip_low=0.2")
    ch = _rl.number(op, "clip_high", clip_high, "clip_high=0.28")
    if not (0.0 <= cl < 1.0):
        raise ValueError(f"{op}: clip_low = {clip_low!r}; expected 0 <= clip_low < 1 (the lower bound is 1 - clip_low)")
    if not (math.isfinite(ch) and ch >= 0.0):
        raise ValueError(f"{op}: clip_high = {clip_high!r}; expected a finite value >= 0")
    dual = None
    if dual_clip is not None:
        dual = _rl.number(op, "dual_clip", dual_clip, "dual_clip=3.0")
        if not (math.isfinite(dual) and dual > 1.0):
            raise ValueError(f"{op}: dual_clip = {dual_clip!r}; expected a finite value > 1 (e.g. 3.0), "
                             f"or None to disable the dual clip")
        dual = _rl.fp32_of(dual)
    if not isinstance(partial, bool):
        raise TypeError(f"{op}: partial must be a bool, got {type(partial).__name__}")
    _rl.check_terms(op, logp.numel())
    kwargs: dict[str, Any] = {"clip_lo": _rl.fp32_of(1.0 - cl), "clip_hi": _rl.fp32_of(1.0 + ch), "dual_clip": dual,
                              "mode": mode, "denominator": den}
    inputs = {"logp": v.contiguous(logp), "old_logp": v.contiguous(old_logp),
              "advantages": v.contiguous(advantages), "mask": v.contiguous(m)}
    if grad_output is not None:
        if partial:
            raise ValueError(f"{op}: partial=True and grad_output are exclusive; the gradient is elementwise")
        g = _rl.fp32_tensor(op, "grad_output", grad_output)
        if g.numel() != 1:
            raise ValueError(f"{op}: grad_output has shape {tuple(g.shape)}; expected a scalar [] "
                             f"(the loss is a scalar)")
        v.same_device(op, [("logp", logp), ("grad_output", g)])
        return dispatch.call(op, device, **inputs, grad_output=g.detach().reshape(()), **kwargs)
    if partial:  # an int64 partial for exact logging: not differentiable, so computed without grad
        with torch.no_grad():
            return dispatch.call(op, device, **inputs, partial=True, **kwargs)
    constants = [n for n in ("old_logp", "advantages") if inputs[n].requires_grad]
    if torch.is_grad_enabled() and constants:  # never detached silently: the backward is for logp only
        raise dispatch.BackwardNotDefined(
            f"rlkernel.ops.ppo_loss: the backward is defined for logp only, and {', '.join(constants)} "
            f"{'requires' if len(constants) == 1 else 'require'} grad (grad mode is on). They are constants of "
            f"the PPO objective: pass {constants[0]}.detach(), or compute the forward only under torch.no_grad() "
            f"or torch.inference_mode()"
        )
    if torch.is_grad_enabled() and logp.requires_grad:
        out: torch.Tensor = PPOLossFunction.apply(inputs["logp"], inputs["old_logp"], inputs["advantages"],
                                                  inputs["mask"], kwargs)
        return out
    return dispatch.call(op, device, **inputs, partial=False, **kwargs)
