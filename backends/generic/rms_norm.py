"""Device-generic RMSNorm: exact integer sum of squares, IEEE fp32 elementwise steps.

Rows are processed in chunks of about :data:`CHUNK_ELEMENTS` elements so the int64 grid
terms stay small in memory; chunks are independent rows, so chunking cannot change a bit.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fixed import F_SUM, exact_sum
from rlkernel.backends.generic._exact.fp32 import cast_out, sqrt_rn

#: Elements per row chunk (the int64 grid terms of one chunk are 8x this in bytes).
CHUNK_ELEMENTS = 1 << 22
MAX_HIDDEN = 1 << 22


def _round_h(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The normalised row rounded to x's dtype before the gain (Hugging Face's order), as fp32."""
    return h if dtype == torch.float32 else h.to(dtype).to(torch.float32)


def _rows(xf: torch.Tensor, w: torch.Tensor, n: torch.Tensor, eps: torch.Tensor, one: torch.Tensor,
          out_dtype: torch.dtype) -> torch.Tensor:
    sq = xf * xf
    s = exact_sum(sq, dim=-1, frac_bits=F_SUM, op="rms_norm", keepdim=True)
    r = one / sqrt_rn(s / n + eps)
    h = _round_h(xf * r, out_dtype)
    return cast_out(w * h, out_dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``RN(fp32(w) * RN(fp32(x) * (1 ÷ sqrt(exact_sum(x*x) ÷ H + eps))))`` over the last axis.

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [*, H]
    weight : Tensor, x's dtype or float32, [H]
    eps : float

    Returns
    -------
    Tensor, x's dtype, [*, H]
    """
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(f"rms_norm: hidden size {hidden} exceeds the exact-sum bound {MAX_HIDDEN}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    dev = x.device
    n = torch.full((), float(hidden), dtype=torch.float32, device=dev)
    eps32 = torch.full((), eps, dtype=torch.float32, device=dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    w = weight.to(torch.float32)
    x2 = x.reshape(-1, hidden)
    y2 = out.view(-1, hidden)
    step = max(1, CHUNK_ELEMENTS // hidden)
    for start in range(0, x2.shape[0], step):
        xf = x2[start:start + step].to(torch.float32)
        y2[start:start + step] = _rows(xf, w, n, eps32, one, x.dtype)
    return out
