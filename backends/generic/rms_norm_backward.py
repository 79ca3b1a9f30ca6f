"""Device-generic RMSNorm backward: the forward's scale recomputed, one exact row sum, IEEE fp32 steps.

``r`` comes from the same exact sum of squares as the forward (max grid, 40 fraction bits);
the row sum ``c = sum_j RN32(g_j * x_j)`` is the exact superaccumulator (int64 limbs), so the
hidden axis may be tiled or reordered freely. Rows are processed in chunks of about
:data:`CHUNK_ELEMENTS` elements; rows are independent, so chunking cannot change a bit.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact import superacc
from rlkernel.backends.generic._exact.fixed import F_SUM, exact_sum
from rlkernel.backends.generic._exact.fp32 import canonical_nan, cast_out, sqrt_rn

CHUNK_ELEMENTS = 1 << 20
MAX_HIDDEN = 1 << 22


def _scale(xf: torch.Tensor, n: torch.Tensor, eps: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """The forward's ``r = 1 ÷ sqrt_rn(exact_sum(x*x) ÷ H + eps)`` per row, [R, 1]."""
    s = exact_sum(xf * xf, dim=-1, frac_bits=F_SUM, op="rms_norm_backward", keepdim=True)
    return one / sqrt_rn(s / n + eps)


def _round_h(h32: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The forward's h: h32 rounded to x's dtype (the value the gain multiplied), as fp32."""
    return h32 if dtype == torch.float32 else h32.to(dtype).to(torch.float32)


def _gain(w: torch.Tensor, dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``g = RN32(w * dy)``, kept in fp32."""
    return w * dy


def _row_sum(g: torch.Tensor, xf: torch.Tensor) -> torch.Tensor:
    """``c = RN32(exact sum_j RN32(g_j * x_j))`` per row, [R, 1]."""
    return superacc.exact_sum(g * xf, dim=-1).unsqueeze(-1)


def _coefficient(c: torch.Tensor, n: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``u = RN32(RN32(RN32(c ÷ H) * r) * r)``."""
    return ((c / n) * r) * r


def _dx(r: torch.Tensor, g: torch.Tensor, h32: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``RN32(RN32(r * g) - RN32(h32 * u))``: each product rounded, no FMA."""
    return r * g - h32 * u


def _rows(dy: torch.Tensor, xf: torch.Tensor, w: torch.Tensor, n: torch.Tensor, eps: torch.Tensor,
          one: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    r = _scale(xf, n, eps, one)
    h32 = xf * r
    g = _gain(w, dy, dtype)
    u = _coefficient(_row_sum(g, xf), n, r)
    return cast_out(_dx(r, g, h32, u), dtype), canonical_nan(dy * _round_h(h32, dtype))


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx`` (x's dtype) and the per-token weight terms ``RN32(dy * h)`` (fp32) of rms_norm v1.

    Parameters
    ----------
    grad : Tensor, x's dtype, [*, H]
    x : Tensor, bfloat16/float16/float32, [*, H]
    weight : Tensor, x's dtype or float32, [H]
    eps : float

    Returns
    -------
    dx : Tensor, x's dtype, [*, H]
    dweight_terms : Tensor, float32, [*, H]
    """
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(f"rms_norm_backward: hidden size {hidden} exceeds the exact-sum bound {MAX_HIDDEN}")
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    terms = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    if x.numel() == 0:
        return dx, terms
    dev = x.device
    n = torch.full((), float(hidden), dtype=torch.float32, device=dev)
    eps32 = torch.full((), eps, dtype=torch.float32, device=dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    w = weight.to(torch.float32)
    x2, g2 = x.reshape(-1, hidden), grad.reshape(-1, hidden)
    dx2, t2 = dx.view(-1, hidden), terms.view(-1, hidden)
    step = max(1, CHUNK_ELEMENTS // hidden)
    for start in range(0, x2.shape[0], step):
        rows = slice(start, start + step)
        dx2[rows], t2[rows] = _rows(g2[rows].to(torch.float32), x2[rows].to(torch.float32), w, n, eps32, one,
                                    x.dtype)
    return dx, terms
