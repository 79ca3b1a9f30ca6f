"""``rlkernel.ops.masked_mean``: exact masked means and their mergeable partials (contract ``masked_mean`` v1).

Reductions are exact superaccumulator sums (docs/numerics.md P10), so results do not depend on
batch layout or micro-batching; :mod:`rlkernel.rl` has the micro-batch and all-reduce helpers
built on the ``partial=`` API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _rl
from rlkernel.ops._rl import PARTIAL_SLOTS

__all__ = ["MaskedMeanFunction", "masked_mean", "masked_mean_backward"]


class MaskedMeanFunction(torch.autograd.Function):
    """Autograd for :func:`masked_mean` (x only): the contract ``masked_mean_backward``.

    ``dx = RN32(g ÷ D)`` on kept tokens (``RN32(RN32(g ÷ fp32(c_b)) ÷ D)`` for
    ``seq-mean-token-mean``), +0 elsewhere: the roundings of :class:`rlkernel.ops.ppo_loss.PPOLossFunction`
    with its factor pg1 = 1. With a global ``denominator`` every token's gradient is the full
    batch's whatever the micro-batch split.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.kwargs = kwargs
        return dispatch.call("masked_mean", x.device, x=x, mask=mask, partial=False, **kwargs)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (mask,) = ctx.saved_tensors
        dx = dispatch.call("masked_mean_backward", mask.device, grad=grad_output.detach().to(torch.float32).reshape(()),
                           mask=mask, **ctx.kwargs)
        return dx, None, None


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
        Return the exact partial, int64 [21], instead of the mean (see :mod:`rlkernel.rl`): an
        integer output, not differentiable, computed without grad even when x requires grad.
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
    permutation, reduction_order, micro_batch, repeat. Differentiable in x
    (:func:`masked_mean_backward`; for micro-batch invariant gradients pass the global
    ``denominator``). Contract ``masked_mean`` v1.
    """
    op = "masked_mean"
    mode = _rl.mode_of(op, mode)
    den = _rl.denominator_of(op, denominator)
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
    x = _rl.fp32_tensor(op, "x", x)
    v.ndim(op, "x", x, 2, "[B, T] (one row per sequence); for a flat vector use x[None] and mask[None]")
    m = _rl.mask_of(op, mask, x.shape)
    device = v.same_device(op, [("x", x), ("mask", m)])
    _rl.check_terms(op, x.numel())
    if partial:  # an int64 partial for exact logging: not differentiable, so computed without grad
        with torch.no_grad():
            return dispatch.call(op, device, x=v.contiguous(x), mask=v.contiguous(m), mode=mode, denominator=den,
                                 partial=True)
    if torch.is_grad_enabled() and x.requires_grad:
        out: torch.Tensor = MaskedMeanFunction.apply(v.contiguous(x), v.contiguous(m),
                                                     {"mode": mode, "denominator": den})
        return out
    return dispatch.call(op, device, x=v.contiguous(x), mask=v.contiguous(m), mode=mode, denominator=den,
                         partial=False)


def masked_mean_backward(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                         denominator: float | int | None = None) -> torch.Tensor:
    """Gradient of :func:`masked_mean` in x: a per-token constant on kept tokens, +0 elsewhere.

    ``token-mean``: ``dx_bt = grad / D`` where ``mask_bt``

    Parameters
    ----------
    grad : Tensor, float32, [] (one element)
        The gradient of the scalar mean.
    mask : Tensor, bool, [B, T]
        The forward's mask.
    mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}
        The forward's mode.
    denominator : float or int, optional
        The forward's denominator. What to pass for gradient accumulation: the *global* count
        (``rlkernel.rl.count(mask, mode)`` summed over every micro-batch and data-parallel rank,
        integers add exactly) to every micro-batch's forward. Then each micro-batch's loss is its
        share of the global mean, a token's gradient depends only on grad, that count and its own
        sequence, and every split of the global batch into micro-batches of whole sequences gives
        every token the bits of the full batch. Without it each call divides by its own count.

    Returns
    -------
    Tensor, float32, [B, T]

    Raises
    ------
    TypeError, ValueError
        grad not a float32 scalar, mask not bool [B, T], an unknown mode, a bad denominator.
    rlkernel.dispatch.BackwardNotDefined
        grad requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    ``D = fp32(denominator)`` or the correctly rounded fp32 of this call's count (kept tokens;
    sequences with >= 1 kept token). Kept tokens: ``RN32(grad ÷ D)`` (``token-mean``,
    ``seq-mean-token-sum``), ``RN32(RN32(grad ÷ fp32(c_b)) ÷ D)`` (``seq-mean-token-mean``); +0
    elsewhere. NaN canonical. Invariances: batch, permutation, micro_batch (with a denominator),
    repeat. Contract ``masked_mean_backward`` v1.
    """
    op = "masked_mean_backward"
    mode = _rl.mode_of(op, mode)
    den = _rl.denominator_of(op, denominator)
    g = _rl.fp32_tensor(op, "grad", grad)
    if g.numel() != 1:
        raise ValueError(f"{op}: grad has shape {tuple(g.shape)}; expected a scalar [] (the mean is a scalar)")
    m = v.tensor(op, "mask", mask)
    if m.dtype != torch.bool:
        raise TypeError(f"{op}: mask has dtype {str(m.dtype).replace('torch.', '')}; expected bool "
                        f"(the forward's mask)")
    v.ndim(op, "mask", m, 2, "[B, T] (one row per sequence)")
    device = v.same_device(op, [("grad", g), ("mask", m)])
    return dispatch.call(op, device, grad=g.reshape(()), mask=v.contiguous(m), mode=mode, denominator=den)
