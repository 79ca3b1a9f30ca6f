"""Device-generic softmax and log_softmax over the last axis.

Both share the row steps: R5 max, ``d = x - m``, ``p = exp_c(d)``, and the exact integer sum
``L`` of ``p`` on the absolute grid ``2**-40``. Rows are processed in chunks of about
:data:`CHUNK_ELEMENTS` elements; rows are independent, so chunking cannot change a bit.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernel.backends.generic._exact.fixed import F_SUM, exact_sum
from rlkernel.backends.generic._exact.fp32 import cast_out, nan_max
from rlkernel.backends.generic._exact.transcendental import exp_c, log_c

CHUNK_ELEMENTS = 1 << 22
MAX_N = 1 << 22


def _row_terms(xf: torch.Tensor, op: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(d, p, L)`` for fp32 rows ``xf`` [R, N]; L is [R, 1]."""
    m = nan_max(xf, dim=-1, keepdim=True)
    d = xf - m
    p = exp_c(d)
    grid = torch.zeros((xf.shape[0], 1), dtype=torch.int64, device=xf.device)  # absolute grid E = 0
    big_l = exact_sum(p, dim=-1, e=grid, frac_bits=F_SUM, op=op, keepdim=True)
    return d, p, big_l


def _rows(x: torch.Tensor, dtype: torch.dtype | None, op: str,
          finish: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    out_dtype = x.dtype if dtype is None else dtype
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n = x.shape[-1] if x.dim() else 1
    if n > MAX_N:
        raise ValueError(f"{op}: N = {n} exceeds the exact-sum bound {MAX_N}")
    if x.numel() == 0:
        return out
    x2 = x.reshape(-1, n)
    y2 = out.view(-1, n)
    step = max(1, CHUNK_ELEMENTS // n)
    for start in range(0, x2.shape[0], step):
        d, p, big_l = _row_terms(x2[start:start + step].to(torch.float32), op)
        y2[start:start + step] = cast_out(finish(d, p, big_l), out_dtype)
    return out


def softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``RN_out(exp_c(x - max x) ÷ L)`` over the last axis, L the exact 2**-40-grid sum.

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, [*, N]
    dtype : torch.dtype, optional
        Output dtype (x's dtype when None).

    Returns
    -------
    Tensor, ``dtype`` or x's dtype, [*, N]
    """
    return _rows(x, dtype, "softmax", lambda d, p, big_l: p / big_l)


def log_softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``RN_out((x - max x) - log_c(L))`` over the last axis, L the exact 2**-40-grid sum.

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, [*, N]
    dtype : torch.dtype, optional
        Output dtype (x's dtype when None).

    Returns
    -------
    Tensor, ``dtype`` or x's dtype, [*, N]
    """
    return _rows(x, dtype, "log_softmax", lambda d, p, big_l: d - log_c(big_l))
