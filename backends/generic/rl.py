"""Device-generic RL ops: group advantages, PPO loss (forward and backward), k3 KL, masked means.

Every reduction is the exact superaccumulator (P10, ``_exact.superacc``): terms become int64
limb contributions summed with ``scatter_add`` (exact in any order), so micro-batch partials
merge by integer addition and a finished partial is the full batch's bits. Elementwise steps
are IEEE fp32 ``+ - * ÷ sqrt`` of tensors (constants are 0-d fp32 tensors, never Python
scalars in a division), the ratio and the KL use the contract ``exp_c``; nothing is fused.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlkernel.backends.generic._exact import superacc
from rlkernel.backends.generic._exact.fp32 import canonical_nan, int64_to_f32, int_sum, sqrt_rn
from rlkernel.backends.generic._exact.transcendental import exp_c

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
PARTIAL_SLOTS = superacc.STATE_SLOTS + 1
COUNT = superacc.STATE_SLOTS


def _f32(value: float, device: torch.device) -> torch.Tensor:
    """0-d fp32 tensor of a value the caller already rounded to fp32 (so this is exact)."""
    return torch.full((), value, dtype=torch.float32, device=device)


# --------------------------------------------------------------------------- masked means


def _seq_means(x: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``RN32(exact sum of kept x_bt) ÷ fp32(c_b)`` per sequence, fp32 [B] (NaN where c_b = 0)."""
    kept = torch.where(mask, x, torch.zeros_like(x))
    if x.shape[1] == 0:
        sums = torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    else:
        sums = superacc.exact_sum(kept, dim=1)
    return sums / int64_to_f32(counts)


def _partial(x: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The canonical partial, int64 [21]: P10 state of the summed terms and the count."""
    if mode not in MODES:
        raise ValueError(f"masked_mean: mode {mode!r}; expected one of {MODES}")
    counts = int_sum(mask, dim=1)
    nonempty = mask.any(dim=1)  # counts > 0, without an int64 comparison
    if mode == "seq-mean-token-mean":
        terms = torch.where(nonempty, _seq_means(x, mask, counts), torch.zeros(counts.shape, device=x.device))
        count = int_sum(nonempty)
    else:
        terms = torch.where(mask, x, torch.zeros_like(x)).reshape(-1)
        count = int_sum(counts) if mode == "token-mean" else int_sum(nonempty)
    if terms.numel() == 0:
        state = torch.zeros(superacc.STATE_SLOTS, dtype=torch.int64, device=x.device)
    else:
        state = superacc.accumulate(terms, dim=0)
    return torch.cat([state, count.reshape(1).to(torch.int64)])


def _merge(partials: torch.Tensor) -> torch.Tensor:
    """Merge partials [K, 21] (slot-wise integer sums, normalised): canonical int64 [21]."""
    if partials.shape[0] == 0:
        return torch.zeros(PARTIAL_SLOTS, dtype=torch.int64, device=partials.device)
    state = superacc.merge(partials[:, :COUNT], dim=0)
    return torch.cat([state, int_sum(partials[:, COUNT]).reshape(1)])


def _finish(partial: torch.Tensor, denominator: float | None) -> torch.Tensor:
    """``RN32(exact sum) ÷ fp32(denominator or count)``, fp32 [], NaN canonical."""
    s = superacc.finish(partial[:COUNT])
    if denominator is not None:
        d = _f32(denominator, partial.device)
    else:
        d = int64_to_f32(partial[COUNT])
    return canonical_nan(s / d)


def _as_partials(partials: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    if isinstance(partials, torch.Tensor):
        return partials.reshape(-1, PARTIAL_SLOTS)
    return torch.cat([p.reshape(-1, PARTIAL_SLOTS) for p in partials])


def masked_mean(x: torch.Tensor | None = None, mask: torch.Tensor | None = None, mode: str = "token-mean",
                denominator: float | None = None, partial: bool = False,
                partials: torch.Tensor | Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """Masked mean of fp32 ``x`` [B, T] under bool ``mask`` [B, T] (contract ``masked_mean`` v1).

    Parameters
    ----------
    x : Tensor, float32, [B, T]; mask : Tensor, bool, [B, T]
    mode : str
        "token-mean", "seq-mean-token-mean" or "seq-mean-token-sum".
    denominator : float, optional
        Already rounded to fp32 by the caller.
    partial : bool
        Return the canonical int64 [21] partial.
    partials : Tensor int64 [K, 21] or sequence of [21], optional
        Merge (and finish unless ``partial``) instead of reading x and mask.

    Returns
    -------
    Tensor, float32 [] or int64 [21]
    """
    if partials is not None:
        merged = _merge(_as_partials(partials))
        return merged if partial else _finish(merged, denominator)
    if x is None or mask is None:
        raise ValueError("masked_mean: give x and mask, or partials")
    p = _partial(x.to(torch.float32), mask, mode)
    return p if partial else _finish(p, denominator)


# --------------------------------------------------------------------------- ppo loss


def _ppo_tokens(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_lo: float,
                clip_hi: float, dual_clip: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss, ``pg1 = d tok / d logp``, and the active (unclipped) flag."""
    dev = logp.device
    lo, hi = _f32(clip_lo, dev), _f32(clip_hi, dev)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    neg_adv = torch.neg(adv)
    ratio = exp_c(logp - old_logp)
    clamped = torch.where(ratio < lo, lo, ratio)
    clamped = torch.where(clamped > hi, hi, clamped)  # NaN stays NaN: both comparisons are false
    pg1 = neg_adv * ratio
    pg2 = neg_adv * clamped
    clipped = pg1 < pg2
    tok = torch.where(clipped, pg2, pg1)
    nan = torch.isnan(pg1) | torch.isnan(pg2)
    tok = torch.where(nan, torch.full_like(tok, float("nan")), tok)
    tok = torch.where(tok == 0, torch.zeros_like(tok), tok)  # R5: a zero max is +0
    active = ~clipped
    if dual_clip is not None:
        pg3 = (neg_adv * _f32(dual_clip, dev)).expand_as(tok)
        dual = (adv < 0) & (pg3 < tok)
        tok = torch.where(dual, pg3, tok)
        active = active & ~dual
    return tok, pg1, active


def _ppo_grad(pg1: torch.Tensor, active: torch.Tensor, mask: torch.Tensor, mode: str,
              denominator: float | None, grad_output: torch.Tensor) -> torch.Tensor:
    counts = int_sum(mask, dim=1, keepdim=True)
    scaled = pg1 * grad_output.to(torch.float32).reshape(())
    if denominator is not None:
        d = _f32(denominator, pg1.device)
    elif mode == "token-mean":
        d = int64_to_f32(int_sum(counts))
    else:
        d = int64_to_f32(int_sum(mask.any(dim=1)))
    if mode == "seq-mean-token-mean":
        scaled = scaled / int64_to_f32(counts)
    grad = scaled / d
    return canonical_nan(torch.where(active & mask, grad, torch.zeros_like(grad)))


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             clip_lo: float, clip_hi: float, dual_clip: float | None = None, mode: str = "token-mean",
             denominator: float | None = None, partial: bool = False,
             grad_output: torch.Tensor | None = None) -> torch.Tensor:
    """Clipped PPO loss (contract ``ppo_loss`` v1); the backward when ``grad_output`` is given.

    Parameters
    ----------
    logp, old_logp : Tensor, float32, [B, T]
    advantages : Tensor, float32, [B, T] or [B]
    mask : Tensor, bool, [B, T]
    clip_lo, clip_hi : float
        The ratio bounds ``fp32(1 - clip_low)``, ``fp32(1 + clip_high)`` (host-rounded, R8).
    dual_clip : float, optional
        ``fp32(c)``, host-rounded.
    mode, denominator, partial
        As in :func:`masked_mean` (denominator host-rounded).
    grad_output : Tensor, float32, [], optional

    Returns
    -------
    Tensor: float32 [] loss, int64 [21] partial, or float32 [B, T] gradient w.r.t. logp
    """
    tok, pg1, active = _ppo_tokens(logp, old_logp, advantages, clip_lo, clip_hi, dual_clip)
    if grad_output is not None:
        return _ppo_grad(pg1, active, mask, mode, denominator, grad_output)
    p = _partial(tok, mask, mode)
    return p if partial else _finish(p, denominator)


# --------------------------------------------------------------------------- kl, advantages


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``k3 = (exp_c(d) - d) - 1``, ``d = ref_logp - logp``; fp32, elementwise (contract ``kl_k3`` v1)."""
    d = ref_logp - logp
    one = torch.ones((), dtype=torch.float32, device=d.device)
    return canonical_nan((exp_c(d) - d) - one)


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """``d ÷ (sqrt(RN32(sum d*d) ÷ (n - 1)) + eps)`` with ``d = r - RN32(sum r) ÷ n`` per row.

    Parameters
    ----------
    rewards : Tensor, float32, [G, n]
    eps : float
        Already rounded to fp32 by the caller.
    scale : bool

    Returns
    -------
    Tensor, float32, [G, n] (contract ``group_advantages`` v1)
    """
    g, n = rewards.shape
    dev = rewards.device
    if rewards.numel() == 0:
        return torch.empty((g, n), dtype=torch.float32, device=dev)
    mean = superacc.exact_sum(rewards, dim=1) / _f32(float(n), dev)
    d = rewards - mean.unsqueeze(1)
    if not scale:
        return canonical_nan(d)
    if n > 1:
        std = sqrt_rn(superacc.exact_sum(d * d, dim=1) / _f32(float(n - 1), dev))
    else:
        std = torch.zeros(g, dtype=torch.float32, device=dev)
    return canonical_nan(d / (std + _f32(eps, dev)).unsqueeze(1))
