"""``rlkernel.ops`` RL ops: ``group_advantages``, ``ppo_loss``, ``kl_k3``, ``masked_mean``.

Bitwise-reproducible on every backend (contracts ``group_advantages``, ``ppo_loss``,
``kl_k3``, ``masked_mean``, version 1). Reductions are exact superaccumulator sums
(docs/numerics.md P10), so results do not depend on batch layout or micro-batching; see
:mod:`rlkernel.rl` for the micro-batch and all-reduce helpers built on the ``partial=`` API.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from rlkernel import _validate as v
from rlkernel import dispatch

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: int64 slots of a masked-mean partial: 20 superaccumulator slots (P10) + the count.
PARTIAL_SLOTS = 21
#: Partials merge exactly while the total number of terms stays below this (P10 carry limb).
MAX_TERMS = 1 << 41


def _fp32_of(value: float) -> float:
    """RN32 of a Python number, via float64 (host constant, R8): the float64 holding the fp32 value."""
    return float(torch.tensor(float(value), dtype=torch.float64).to(torch.float32))


def _number(op: str, name: str, value: object, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a Python float, got {type(value).__name__}; pass e.g. {example}")
    if isinstance(value, int) and abs(value) >= 1 << 53:
        raise ValueError(f"{op}: {name} = {value} is too large to be rounded exactly once to fp32 "
                         f"(|value| < 2**53 expected); pass it as a float")
    return float(value)


def _denominator(op: str, denominator: object) -> float | None:
    """The denominator rounded once to fp32 (as a Python float), validated: finite and > 0."""
    if denominator is None:
        return None
    d = _number(op, "denominator", denominator, "denominator=global_token_count")
    d32 = _fp32_of(d) if math.isfinite(d) else d  # beyond fp32's range: inf, refused below
    if not math.isfinite(d32) or d32 <= 0:
        raise ValueError(f"{op}: denominator = {denominator!r} rounds to {d32!r} in fp32; expected a finite value "
                         f"> 0 (the global token or sequence count), or None to divide by this batch's count")
    return d32


def _mode(op: str, mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"{op}: mode = {mode!r}; expected one of {', '.join(MODES)} "
                         f"(verl's loss_agg_mode names)")
    return str(mode)


def _fp32_tensor(op: str, name: str, t: object) -> torch.Tensor:
    t = v.tensor(op, name, t)
    v.dtype(op, name, t, (torch.float32,))
    return t


def _mask(op: str, mask: object, shape: torch.Size) -> torch.Tensor:
    m = v.tensor(op, "mask", mask)
    if m.dtype != torch.bool:
        raise TypeError(f"{op}: mask has dtype {str(m.dtype).replace('torch.', '')}; expected bool "
                        f"(True for the tokens that count). Convert it with mask.bool() or mask > 0")
    if m.shape != shape:
        raise ValueError(f"{op}: mask has shape {tuple(m.shape)}; expected the shape of the values "
                         f"{tuple(shape)} ([B, T])")
    return m


def _check_terms(op: str, count: int) -> None:
    if count >= MAX_TERMS:
        raise ValueError(f"{op}: {count} terms exceed the superaccumulator bound 2**41 of one reduction; "
                         f"split the batch and merge partials (rlkernel.rl.merge_partials)")


# --------------------------------------------------------------------------- masked_mean


def _partials(op: str, partials: object) -> tuple[torch.Tensor, torch.device]:
    if isinstance(partials, torch.Tensor):
        items: Sequence[Any] = [partials]
    elif isinstance(partials, (list, tuple)):
        items = partials
    else:
        raise TypeError(f"{op}: partials must be an int64 tensor [K, 21] or a list of int64 [21] tensors, "
                        f"got {type(partials).__name__}")
    if len(items) == 0:
        raise ValueError(f"{op}: partials is empty; give at least one partial (masked_mean(..., partial=True))")
    flat = []
    for i, p in enumerate(items):
        p = v.tensor(op, f"partials[{i}]", p)
        if p.dtype != torch.int64 or p.dim() < 1 or p.shape[-1] != PARTIAL_SLOTS:
            raise ValueError(f"{op}: partials[{i}] is {str(p.dtype).replace('torch.', '')} {tuple(p.shape)}; "
                             f"expected int64 [..., {PARTIAL_SLOTS}] as returned by partial=True")
        flat.append(p.reshape(-1, PARTIAL_SLOTS))
    device = v.same_device(op, [(f"partials[{i}]", p) for i, p in enumerate(flat)])
    stacked = torch.cat(flat) if len(flat) > 1 else flat[0]
    if stacked.shape[0] >= 1 << 46:
        raise ValueError(f"{op}: {stacked.shape[0]} partials exceed the merge bound 2**46; merge in groups")
    return v.contiguous(stacked), device


def masked_mean(x: torch.Tensor | None = None, mask: torch.Tensor | None = None, mode: str = "token-mean",
                denominator: float | int | None = None, partial: bool = False,
                partials: torch.Tensor | Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """Mean of the values a mask keeps, by token or by sequence; exact in any micro-batch split.

    ``token-mean``: ``RN32(sum_{mask} x) ÷ fp32(denominator or #kept tokens)``

    Parameters
    ----------
    x : Tensor, float32, [B, T]
        Per-token values (losses, KL terms). Values where ``mask`` is False are ignored, even
        NaN or inf. Non-contiguous inputs are accepted.
    mask : Tensor, bool, [B, T]
        True for the tokens that count (the response mask).
    mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}
        verl's ``loss_agg_mode``: mean over all kept tokens; mean over sequences (with >= 1
        kept token) of their token means; mean over those sequences of their token sums.
    denominator : float or int, optional
        Divide by this instead of this batch's count (tokens for ``token-mean``, sequences
        otherwise): the global count, so every micro-batch and rank normalises alike. Rounded
        once to fp32 on the host; must be finite and > 0.
    partial : bool
        Return the exact partial, int64 [21], instead of the mean (see :mod:`rlkernel.rl`).
    partials : int64 Tensor [K, 21] or [21], or a list of them, optional
        Instead of ``x``/``mask``: merge these partials of disjoint micro-batches (exact, any
        order) and finish them (or return the merged partial when ``partial=True``).

    Returns
    -------
    Tensor, float32, [] (mean), or int64, [21] (partial)

    Raises
    ------
    TypeError
        Wrong types or dtypes (x must be float32, mask bool, partials int64).
    ValueError
        Shapes disagree, devices differ, an unknown mode, a denominator that is not a finite
        value > 0 in fp32, both or neither of (x, mask) and partials.

    Bitwise semantics
    -----------------
    Sums are exact superaccumulator sums (P10) rounded once to fp32; ``÷`` is IEEE fp32
    division; ``fp32(count)`` is correctly rounded. ``token-mean`` and ``seq-mean-token-sum``:
    ``S = RN32(sum of kept x)``; ``seq-mean-token-mean``: ``m_b = RN32(sum of kept x_b) ÷
    fp32(c_b)`` per sequence with c_b >= 1, ``S = RN32(sum_b m_b)``. Result ``S ÷ fp32(D)``
    with D the denominator or the mode's count (kept tokens; sequences with >= 1 kept token).
    No kept token and no denominator: NaN (0 ÷ 0, as PyTorch). A kept NaN (or kept +inf and
    -inf) gives NaN; a kept inf gives ±inf. The partial holds the canonical P10 state of the
    terms of S and the count; merged partials finish to the full batch's bits. Invariances:
    permutation, reduction_order, micro_batch, repeat. Contract ``masked_mean`` v1.
    """
    op = "masked_mean"
    mode = _mode(op, mode)
    den = _denominator(op, denominator)
    if not isinstance(partial, bool):
        raise TypeError(f"{op}: partial must be a bool, got {type(partial).__name__}")
    if partials is not None:
        if x is not None or mask is not None:
            raise ValueError(f"{op}: give either x and mask, or partials, not both")
        stacked, device = _partials(op, partials)
        return dispatch.call(op, device, partials=stacked, mode=mode, denominator=den, partial=partial)
    if x is None or mask is None:
        raise ValueError(f"{op}: x and mask are required (or partials=...); got x={type(x).__name__}, "
                         f"mask={type(mask).__name__}")
    x = _fp32_tensor(op, "x", x)
    v.ndim(op, "x", x, 2, "[B, T] (one row per sequence); for a flat vector use x[None] and mask[None]")
    m = _mask(op, mask, x.shape)
    device = v.same_device(op, [("x", x), ("mask", m)])
    _check_terms(op, x.numel())
    return dispatch.call(op, device, x=v.contiguous(x), mask=v.contiguous(m), mode=mode, denominator=den,
                         partial=partial)


# --------------------------------------------------------------------------- ppo_loss


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
        micro-batch accumulation (:func:`rlkernel.rl.finish_partials`). Not differentiable.
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
    logp = _fp32_tensor(op, "logp", logp)
    old_logp = _fp32_tensor(op, "old_logp", old_logp)
    advantages = _fp32_tensor(op, "advantages", advantages)
    v.ndim(op, "logp", logp, 2, "[B, T] (one row per sequence)")
    if old_logp.shape != logp.shape:
        raise ValueError(f"{op}: old_logp has shape {tuple(old_logp.shape)}; expected logp's shape "
                         f"{tuple(logp.shape)} ([B, T])")
    if advantages.shape not in (logp.shape, logp.shape[:1]):
        raise ValueError(f"{op}: advantages has shape {tuple(advantages.shape)}; expected [B, T] = "
                         f"{tuple(logp.shape)} or [B] = {tuple(logp.shape[:1])} (one per sequence)")
    m = _mask(op, mask, logp.shape)
    device = v.same_device(op, [("logp", logp), ("old_logp", old_logp), ("advantages", advantages), ("mask", m)])
    mode = _mode(op, mode)
    den = _denominator(op, denominator)
    cl = _number(op, "clip_low", clip_low, "clip_low=0.2")
    ch = _number(op, "clip_high", clip_high, "clip_high=0.28")
    if not (0.0 <= cl < 1.0):
        raise ValueError(f"{op}: clip_low = {clip_low!r}; expected 0 <= clip_low < 1 (the lower bound is 1 - clip_low)")
    if not (math.isfinite(ch) and ch >= 0.0):
        raise ValueError(f"{op}: clip_high = {clip_high!r}; expected a finite value >= 0")
    dual = None
    if dual_clip is not None:
        dual = _number(op, "dual_clip", dual_clip, "dual_clip=3.0")
        if not (math.isfinite(dual) and dual > 1.0):
            raise ValueError(f"{op}: dual_clip = {dual_clip!r}; expected a finite value > 1 (e.g. 3.0), "
                             f"or None to disable the dual clip")
        dual = _fp32_of(dual)
    if not isinstance(partial, bool):
        raise TypeError(f"{op}: partial must be a bool, got {type(partial).__name__}")
    _check_terms(op, logp.numel())
    kwargs: dict[str, Any] = {"clip_lo": _fp32_of(1.0 - cl), "clip_hi": _fp32_of(1.0 + ch), "dual_clip": dual,
                              "mode": mode, "denominator": den}
    inputs = {"logp": v.contiguous(logp), "old_logp": v.contiguous(old_logp),
              "advantages": v.contiguous(advantages), "mask": v.contiguous(m)}
    if grad_output is not None:
        if partial:
            raise ValueError(f"{op}: partial=True and grad_output are exclusive; the gradient is elementwise")
        g = _fp32_tensor(op, "grad_output", grad_output)
        if g.numel() != 1:
            raise ValueError(f"{op}: grad_output has shape {tuple(g.shape)}; expected a scalar [] "
                             f"(the loss is a scalar)")
        v.same_device(op, [("logp", logp), ("grad_output", g)])
        return dispatch.call(op, device, **inputs, grad_output=g.detach().reshape(()), **kwargs)
    if partial or not (torch.is_grad_enabled() and logp.requires_grad):
        with torch.no_grad():
            return dispatch.call(op, device, **inputs, partial=partial, **kwargs)
    out: torch.Tensor = PPOLossFunction.apply(inputs["logp"], inputs["old_logp"].detach(),
                                              inputs["advantages"].detach(), inputs["mask"], kwargs)
    return out


# --------------------------------------------------------------------------- kl_k3, group_advantages


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(ref_logp - logp) - (ref_logp - logp) - 1``.

    Parameters
    ----------
    logp : Tensor, float32, [*]
        Current-policy log-probs of the sampled tokens.
    ref_logp : Tensor, float32, [*] (same shape)
        Reference-policy log-probs.

    Returns
    -------
    Tensor, float32, [*]

    Raises
    ------
    TypeError, ValueError
        Not float32 tensors, shapes or devices differ.

    Bitwise semantics
    -----------------
    ``d = RN32(ref_logp - logp)``, ``k3 = RN32(RN32(exp_c(d) - d) - 1)`` elementwise (contract
    exp, P6): exactly +0 where the log-probs are equal. d > 89 or d = -inf give +inf; NaN
    inputs (or d = inf - inf) give the canonical NaN. No clamp. Not differentiable (compute the
    KL loss gradient with your own autograd if needed). Invariances: batch, permutation,
    repeat. Contract ``kl_k3`` v1.
    """
    op = "kl_k3"
    logp = _fp32_tensor(op, "logp", logp)
    ref_logp = _fp32_tensor(op, "ref_logp", ref_logp)
    if ref_logp.shape != logp.shape:
        raise ValueError(f"{op}: ref_logp has shape {tuple(ref_logp.shape)}; expected logp's shape "
                         f"{tuple(logp.shape)} (no broadcasting)")
    device = v.same_device(op, [("logp", logp), ("ref_logp", ref_logp)])
    with torch.no_grad():
        return dispatch.call(op, device, logp=v.contiguous(logp).detach(), ref_logp=v.contiguous(ref_logp).detach())


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

    Bitwise semantics
    -----------------
    ``mean = RN32(sum r) ÷ fp32(n)`` (exact P10 sum), ``d = RN32(r - mean)``,
    ``std = sqrt(RN32(sum RN32(d*d)) ÷ fp32(n - 1))`` (+0 when n = 1),
    ``adv = d ÷ RN32(std + fp32(eps))`` (or ``d`` when not scaling). A NaN or inf reward makes
    its group NaN. Invariances: permutation, reduction_order, batch, repeat.
    Contract ``group_advantages`` v1.
    """
    op = "group_advantages"
    r = _fp32_tensor(op, "rewards", rewards)
    v.ndim(op, "rewards", r, 2, "[G, n] (one row per prompt group); reshape flat rewards with "
           "rewards.view(-1, n_samples_per_prompt)")
    e = _number(op, "eps", eps, "eps=1e-6")
    if not math.isfinite(e) or e < 0:
        raise ValueError(f"{op}: eps = {eps!r}; expected a finite value >= 0 (e.g. 1e-6)")
    if not isinstance(scale, bool):
        raise TypeError(f"{op}: scale must be a bool, got {type(scale).__name__}")
    _check_terms(op, r.shape[1])
    with torch.no_grad():
        return dispatch.call(op, r.device, rewards=v.contiguous(r).detach(), eps=_fp32_of(e), scale=scale)
