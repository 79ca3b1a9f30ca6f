"""``rlkernel.ops.rms_norm``: bitwise-reproducible RMSNorm (contract ``rms_norm`` v1)."""

from __future__ import annotations

import math

import torch

from rlkernel import _validate as v
from rlkernel import dispatch

#: Largest hidden size the exact sum of squares allows (P4, F = 40).
MAX_HIDDEN = 1 << 22


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
    v.tensor(op, "x", x)
    v.tensor(op, "weight", weight)
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
    return dispatch.call(op, device, x=v.contiguous(x), weight=v.contiguous(weight), eps=float(eps))
