"""``rlkernel.ops.rms_norm``: bitwise-reproducible RMSNorm (contract ``rms_norm`` v1)."""

from __future__ import annotations

import math

import torch

from rlkernel import _validate as v
from rlkernel import dispatch, grads

__all__ = ["MAX_HIDDEN", "RMSNormFunction", "rms_norm", "rms_norm_backward"]

#: Largest hidden size the exact sum of squares allows (P4, F = 40).
MAX_HIDDEN = 1 << 22


class RMSNormFunction(torch.autograd.Function):
    """Autograd for :func:`rms_norm`: ``rms_norm_backward`` for dx, exact sums for the gain.

    - ``dx``: the contract's backward (the forward's r recomputed, the row sum exact).
    - ``dweight``: the per-token terms ``RN32(dy * h)`` (``[S, H]``: every row of x, e.g. the
      T * heads rows of a q/k norm) summed exactly by :func:`rlkernel.grads.weight_grad`, so the
      gradient does not depend on the order, batching or micro-batching of the tokens.
    """

    @staticmethod
    def forward(ctx, x, weight, eps):  # type: ignore[no-untyped-def,override]
        ctx.save_for_backward(x, weight)
        ctx.weight = weight  # the parameter itself (weight_grad reads its exact accumulator)
        ctx.eps = eps
        return dispatch.call("rms_norm", x.device, x=x, weight=weight, eps=eps)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        x, weight = ctx.saved_tensors
        dx, terms = dispatch.call("rms_norm_backward", x.device, grad=v.contiguous(grad.to(x.dtype)), x=x,
                                  weight=weight, eps=ctx.eps)
        gw = grads.weight_grad(ctx.weight, terms.reshape(-1, x.shape[-1])) if ctx.needs_input_grad[1] else None
        return (dx if ctx.needs_input_grad[0] else None), gw, None


def _check(op: str, x: object, weight: object, eps: object) -> tuple[torch.Tensor, torch.Tensor, float, torch.device]:
    """rms_norm's input checks (shared by the forward and the backward)."""
    x = v.tensor(op, "x", x)
    weight = v.tensor(op, "weight", weight)
    v.dtype(op, "x", x, v.FLOATS)
    if weight.dtype not in (x.dtype, torch.float32):
        raise TypeError(f"{op}: weight has dtype {str(weight.dtype).replace('torch.', '')} but x is "
                        f"{str(x.dtype).replace('torch.', '')}; expected weight in x's dtype or float32. "
                        f"Cast it with weight.to(x.dtype)")
    if x.dim() < 1:
        raise ValueError(f"{op}: x is a 0-d tensor; expected shape [*, H] with at least one axis")
    v.ndim(op, "weight", weight, 1, "[H], one gain per channel of x's last axis")
    hidden = x.shape[-1]
    if weight.shape[0] != hidden:
        raise ValueError(f"{op}: weight has shape {tuple(weight.shape)} but x has shape {tuple(x.shape)}; "
                         f"expected weight [H] with H = x.shape[-1] = {hidden}")
    device = v.same_device(op, [("x", x), ("weight", weight)])
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{op}: eps must be a Python float, got {type(eps).__name__}; pass e.g. eps=1e-6")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{op}: eps = {eps!r}; expected a finite value >= 0 (Qwen3 uses 1e-6)")
    if hidden > MAX_HIDDEN:
        raise ValueError(f"{op}: hidden size H = {hidden} exceeds the exact-sum bound {MAX_HIDDEN} (2**22) for "
                         f"int64 accumulation with 40 fraction bits; normalise smaller groups of channels")
    return x, weight, float(eps), device


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS normalisation over the last axis, the same bits on every backend.

    ``y = RN_dtype(fp32(weight) * RN_dtype(fp32(x) * (1 / sqrt(sum(x*x) / H + eps))))``

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [*, H]
        Rows to normalise; any leading shape, including zero rows. For Qwen3's QK-norm pass
        ``[T, heads, head_dim]`` with a ``[head_dim]`` weight. Non-contiguous inputs are
        accepted (read through a contiguous copy where needed).
    weight : Tensor, x's dtype or float32, [H]
        Per-channel gain, on x's device.
    eps : float
        Added to the mean square, rounded once to fp32. Finite and >= 0 (default 1e-6).

    Returns
    -------
    Tensor, x's dtype, [*, H]

    Raises
    ------
    TypeError
        x or weight is not a tensor or has an unsupported dtype; eps is not a real number.
    ValueError
        Shapes disagree, devices differ, eps is negative or not finite, or H > 2**22.

    Bitwise semantics
    -----------------
    Hugging Face Qwen3 order, every fp32 step one IEEE round-to-nearest-even rounding:
    ``sq = RN32(xf * xf)``; ``S = fixed_sum(sq)`` (max grid, F = 40: exact integer sum, so
    the hidden axis may be split, tiled or reordered freely); ``mean = S ÷ fp32(H)``;
    ``r = 1 ÷ sqrt(mean + fp32(eps))``; ``h = RN_dtype(RN32(xf * r))`` (one rounding for fp32
    x); ``y = RN_dtype(fp32(weight) * fp32(h))``. Outputs NaN-canonical. A NaN in a row makes
    the row NaN; an inf gives NaN at the inf and ±0 elsewhere (r = 0), as in PyTorch.
    Invariances: batch, permutation, reduction_order, repeat. Contract ``rms_norm`` v1
    (``rlkernel.contracts.rms_norm``).
    """
    op = "rms_norm"
    x, weight, eps32, device = _check(op, x, weight, eps)
    x, weight = v.contiguous(x), v.contiguous(weight)
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        out: torch.Tensor = RMSNormFunction.apply(x, weight, eps32)
        return out
    return dispatch.call(op, device, x=x, weight=weight, eps=eps32)


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`rms_norm`: dx and the per-token terms of dweight.

    ``dx = r * (w * dy) - x * r**3 / H * sum(w * dy * x)``, ``dweight = sum over tokens of dy * h``

    Parameters
    ----------
    grad : Tensor, x's dtype, [*, H] (x's shape)
        ``dy``, the gradient of rms_norm's output.
    x : Tensor, bfloat16/float16/float32, [*, H]
        The forward's input.
    weight : Tensor, x's dtype or float32, [H]
        The forward's gain.
    eps : float
        The forward's eps.

    Returns
    -------
    dx : Tensor, x's dtype, [*, H]
    dweight_terms : Tensor, float32, [*, H]
        One term per token (row) and channel, not summed: pass ``terms.reshape(-1, H)`` to
        :func:`rlkernel.grads.weight_grad` (what autograd does), which sums them exactly.

    Raises
    ------
    TypeError, ValueError
        As :func:`rms_norm`; grad not in x's dtype or not of x's shape.
    rlkernel.dispatch.BackwardNotDefined
        An input requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    ``r`` and ``h32 = RN32(xf * r)`` exactly as the forward; ``g = RN32(w * dy)``;
    ``c = RN32(exact sum_j RN32(g_j * xf_j))`` (P10 superaccumulator: order-free);
    ``u = RN32(RN32(RN32(c ÷ H) * r) * r)``; ``dx = RN_dtype(RN32(RN32(r * g) - RN32(h32 * u)))``;
    ``dweight_terms = RN32(dy * fp32(RN_dtype(h32)))``. NaN canonical. Invariances: batch,
    permutation, reduction_order, repeat. Contract ``rms_norm_backward`` v1.
    """
    op = "rms_norm_backward"
    x, weight, eps32, device = _check(op, x, weight, eps)
    grad = v.tensor(op, "grad", grad)
    v.same_dtype(op, "x", x, "grad", grad)
    if grad.shape != x.shape:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)} but x has shape {tuple(x.shape)}; expected "
                         f"the gradient of rms_norm's output, which has x's shape")
    v.same_device(op, [("x", x), ("grad", grad)])
    return dispatch.call(op, device, grad=v.contiguous(grad), x=v.contiguous(x), weight=v.contiguous(weight),
                         eps=eps32)
