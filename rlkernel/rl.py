"""``rlkernel.rl``: PPO/GRPO building blocks whose bits do not depend on hardware or batching.

Drop-in replacements for the loss-side functions of RL trainers (names from verl):

======================================  ===================================================
verl                                    rlkernel.rl
======================================  ===================================================
``compute_grpo_outcome_advantage``      :func:`group_advantages` (``rewards.view(G, n)``)
``compute_policy_loss`` + ``agg_loss``  :func:`ppo_loss` (``clip_ratio_low/high``,
                                        ``clip_ratio_c`` -> ``dual_clip``, ``loss_agg_mode``
                                        -> ``mode``)
``kl_penalty(..., "low_var_kl")``       :func:`kl_k3` (without verl's clamp to [-10, 10])
``agg_loss`` / ``masked_mean``          :func:`masked_mean`
======================================  ===================================================

Every reduction is exact (docs/numerics.md P10), so the bits are the same on every backend,
for any order of the sequences and for any split into micro-batches or data-parallel ranks.
Two ways to use that:

**Gradient accumulation with a global denominator.** Pass the global token count (or
sequence count for the ``seq-mean-*`` modes) as ``denominator`` and call ``backward`` per
micro-batch: every token's gradient is then exactly the one the full batch would give it
(gradients are elementwise, see :func:`ppo_loss`)::

    n_tokens = rl.count(mask_global, "token-mean")          # or all-reduce the local counts
    for mb in micro_batches:
        rl.ppo_loss(mb.logp, mb.old_logp, mb.adv, mb.mask, denominator=n_tokens).backward()

**Exact loss values across micro-batches and ranks.** ``partial=True`` returns an int64 [21]
*partial* (the exact sum and the count). Partials add exactly — in any order, or through
``torch.distributed.all_reduce(SUM)`` — and :func:`finish_partials` turns them into the bits
of the full batch's loss::

    acc = rl.ExactMean()
    for mb in micro_batches:
        acc.add(rl.ppo_loss(mb.logp, mb.old_logp, mb.adv, mb.mask, partial=True))
    acc.all_reduce()                 # across data-parallel ranks (optional)
    logged_loss = acc.value()        # == ppo_loss(whole global batch), bit for bit

An fp32 ``loss_total += loss_mb`` instead depends on the number and order of micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlkernel.ops import group_advantages, kl_k3, masked_mean, ppo_loss
from rlkernel.ops._rl import MODES, PARTIAL_SLOTS

__all__ = [
    "MODES",
    "PARTIAL_SLOTS",
    "ExactMean",
    "all_reduce_partial",
    "count",
    "finish_partials",
    "group_advantages",
    "kl_k3",
    "masked_mean",
    "masked_mean_partial",
    "merge_partials",
    "partial_count",
    "ppo_loss",
    "ppo_loss_partial",
]


def masked_mean_partial(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean") -> torch.Tensor:
    """The exact partial (int64 [21]) of :func:`masked_mean` over one micro-batch.

    Parameters
    ----------
    x : Tensor, float32, [B, T]
    mask : Tensor, bool, [B, T]
    mode : str
        As :func:`masked_mean`; partials of different modes must not be merged.

    Returns
    -------
    Tensor, int64, [21]: the canonical P10 state of the micro-batch's sum (slots 0..19) and its
    count (slot 20: kept tokens, or sequences with >= 1 kept token).
    """
    return masked_mean(x, mask, mode=mode, partial=True)


def ppo_loss_partial(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                     **kwargs: Any) -> torch.Tensor:
    """The exact partial (int64 [21]) of :func:`ppo_loss` over one micro-batch (same keywords)."""
    return ppo_loss(logp, old_logp, advantages, mask, partial=True, **kwargs)


def merge_partials(partials: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Merge partials of disjoint micro-batches into one canonical partial (exact, any order).

    Parameters
    ----------
    partials : int64 Tensor [K, 21], or a list of int64 [21] tensors on one device

    Returns
    -------
    Tensor, int64, [21]: equal, bit for bit, to the partial of the union of the micro-batches.
    """
    return masked_mean(partials=partials, partial=True)


def finish_partials(partials: torch.Tensor | Sequence[torch.Tensor],
                    denominator: float | int | None = None) -> torch.Tensor:
    """The mean of the union of the micro-batches behind ``partials``: fp32 [].

    ``RN32(exact merged sum) ÷ fp32(denominator or merged count)`` — the bits of
    :func:`masked_mean` (or :func:`ppo_loss`) over the whole batch.
    """
    return masked_mean(partials=partials, denominator=denominator)


def partial_count(partial: torch.Tensor) -> int:
    """The count held by a partial (kept tokens, or sequences with >= 1 kept token)."""
    return int(partial.reshape(-1, PARTIAL_SLOTS)[:, PARTIAL_SLOTS - 1].sum())


def count(mask: torch.Tensor, mode: str = "token-mean") -> int:
    """The denominator ``mode`` would use for ``mask`` [B, T]: kept tokens, or non-empty sequences.

    Sum it over micro-batches and ranks to get a global ``denominator`` (integers add exactly).
    """
    if mode not in MODES:
        raise ValueError(f"count: mode = {mode!r}; expected one of {', '.join(MODES)}")
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise ValueError(f"count: mask is {mask.dtype} {tuple(mask.shape)}; expected bool [B, T]")
    if mode == "token-mean":
        return int(mask.sum())
    return int((mask.sum(dim=1) > 0).sum())


def all_reduce_partial(partial: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum a partial over the ranks of ``group`` in place (``torch.distributed`` SUM on int64).

    Integer sums are exact in any order, so every rank ends with the partial of the global
    batch whatever the reduction tree; the result is not canonical until merged or finished
    (:func:`merge_partials` / :func:`finish_partials` normalise). Needs an initialised
    process group (gloo, NCCL, ...).
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("all_reduce_partial: torch.distributed is not initialised; call "
                           "torch.distributed.init_process_group(...) first")
    if partial.dtype != torch.int64 or partial.shape[-1] != PARTIAL_SLOTS:
        raise ValueError(f"all_reduce_partial: partial is {partial.dtype} {tuple(partial.shape)}; "
                         f"expected int64 [{PARTIAL_SLOTS}]")
    dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=group)
    return partial


class ExactMean:
    """Exact accumulator of masked-mean / PPO-loss partials across micro-batches and ranks.

    Examples
    --------
    >>> acc = ExactMean()
    >>> for x, m in micro_batches:                       # doctest: +SKIP
    ...     acc.add(masked_mean_partial(x, m))
    >>> acc.value()                                      # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._partial: torch.Tensor | None = None

    def add(self, partial: torch.Tensor) -> ExactMean:
        """Add the partial of another disjoint micro-batch (exact)."""
        if self._partial is None:
            self._partial = merge_partials([partial])
        else:
            self._partial = merge_partials([self._partial, partial.to(self._partial.device)])
        return self

    @property
    def partial(self) -> torch.Tensor:
        """The canonical merged partial so far (int64 [21]); raises if nothing was added."""
        if self._partial is None:
            raise RuntimeError("ExactMean: no partial added yet; call add(partial) first")
        return self._partial

    def all_reduce(self, group: Any = None) -> ExactMean:
        """Sum the accumulated partial over the ranks of ``group`` (exact), then re-normalise."""
        self._partial = merge_partials([all_reduce_partial(self.partial.clone(), group)])
        return self

    def value(self, denominator: float | int | None = None) -> torch.Tensor:
        """The mean over everything added: fp32 [], the full batch's bits."""
        return finish_partials([self.partial], denominator)

    def count(self) -> int:
        """The merged count (tokens or sequences)."""
        return partial_count(self.partial)
