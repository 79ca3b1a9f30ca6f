"""Rotate-half RoPE on Triton (contract ``rope`` v1) with the host cos/sin tables (R8).

One program per token: the token's table row ``cos[p], sin[p]`` [D/2] is loaded once and
applied to every head: ``y1 = RN(RN(x1 c) - RN(x2 s))``, ``y2 = RN(RN(x2 c) + RN(x1 s))``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, next_pow2


@triton.jit
def _rope_fwd_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, y_ptr, heads, half, table_stride,
                     OUT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < half
    c = tl.load(cos_ptr + p * table_stride + d, mask=d_ok, other=0.0)[None, :]
    s = tl.load(sin_ptr + p * table_stride + d, mask=d_ok, other=0.0)[None, :]
    hh = tl.arange(0, BLOCK_H)
    for h0 in range(0, heads, BLOCK_H):
        h = h0 + hh
        mask = (h < heads)[:, None] & d_ok[None, :]
        offs = t * heads * 2 * half + h[:, None].to(tl.int64) * (2 * half) + d[None, :]
        x1 = E.upcast(tl.load(x_ptr + offs, mask=mask, other=0.0))
        x2 = E.upcast(tl.load(x_ptr + offs + half, mask=mask, other=0.0))
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
        tl.store(y_ptr + offs, E.cast_out(y1, OUT), mask=mask)
        tl.store(y_ptr + offs + half, E.cast_out(y2, OUT), mask=mask)


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Kernel ``rope``: x [T, n_heads, D] or [T, D]; positions int64 [T]; cos/sin fp32 [P, D/2] (host tables)."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    xc = x.contiguous()
    tokens = x.shape[0]
    heads = x.shape[1] if x.dim() == 3 else 1
    half = x.shape[-1] // 2
    cos, sin = cos.contiguous(), sin.contiguous()
    block_d = max(16, next_pow2(half))
    block_h = max(1, min(next_pow2(heads), 4096 // block_d))
    _rope_fwd_kernel[(tokens,)](xc, positions.contiguous(), cos, sin, out, heads, half, cos.stride(0),
                                OUT=OUT_CODE[x.dtype], BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4, **LAUNCH)
    return out


def static_specs(target):
    return [("rope", dt, _rope_fwd_kernel,
             {"x_ptr": f"*{dt}", "pos_ptr": "*i64", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "y_ptr": f"*{dt}",
              "heads": "i32", "half": "i32", "table_stride": "i64", "OUT": "constexpr", "BLOCK_H": "constexpr",
              "BLOCK_D": "constexpr"}, {"OUT": code, "BLOCK_H": 32, "BLOCK_D": 64})
            for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0))]
