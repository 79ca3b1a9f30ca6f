"""``embedding`` on Triton (contract ``embedding`` v1): a row gather with canonical NaNs.

The public op has checked every id against [0, V); the kernel copies bits (NaN payloads are
replaced by the canonical NaN of the dtype, P8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE


@triton.jit
def _embedding_fwd_kernel(ids_ptr, w_ptr, y_ptr, hidden, w_row_stride, w_col_stride,
                          OUT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(ids_ptr + i).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    for h0 in range(0, hidden, BLOCK):
        h = h0 + cols
        mask = h < hidden
        v = tl.load(w_ptr + row * w_row_stride + h * w_col_stride, mask=mask, other=0.0)
        nan = E.is_nan(E.upcast(v))
        if OUT == 1:
            canon = tl.full([BLOCK], 0x7FC0, tl.int16).to(tl.bfloat16, bitcast=True)
        elif OUT == 2:
            canon = tl.full([BLOCK], 0x7E00, tl.int16).to(tl.float16, bitcast=True)
        else:
            canon = tl.full([BLOCK], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)
        tl.store(y_ptr + i * hidden + h, tl.where(nan, canon, v), mask=mask)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Kernel ``embedding``: ids int64/int32 [L] in [0, V) (checked by the caller), weight [V, H] -> [L, H]."""
    length, hidden = ids.shape[0], weight.shape[1]
    out = torch.empty((length, hidden), dtype=weight.dtype, device=weight.device)
    if length == 0 or hidden == 0:
        return out
    block = max(16, min(4096, triton.next_power_of_2(hidden)))
    _embedding_fwd_kernel[(length,)](ids.contiguous(), weight, out, hidden, weight.stride(0), weight.stride(1),
                                     OUT=OUT_CODE[weight.dtype], BLOCK=block, num_warps=4, **LAUNCH)
    return out


def static_specs(target):
    return [("embedding", dt, _embedding_fwd_kernel,
             {"ids_ptr": "*i64", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "hidden": "i32", "w_row_stride": "i64",
              "w_col_stride": "i64", "OUT": "constexpr", "BLOCK": "constexpr"}, {"OUT": code, "BLOCK": 4096})
            for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0))]
