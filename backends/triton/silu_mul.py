"""SwiGLU gate on Triton: ``RN(fp32(RN(g ÷ (1 + exp_c(-g)))) * fp32(up))`` (contract ``silu_mul`` v1).

Elementwise over the flattened tensors; each element depends only on its own inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, cdiv

#: elements per program: 16 per thread on 4 warps (two 16-byte loads of each bf16 input in flight)
BLOCK = 1024


@triton.jit
def _silu_mul_fwd_kernel(g_ptr, u_ptr, y_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = E.upcast(tl.load(g_ptr + offs, mask=mask, other=0.0))
    u = E.upcast(tl.load(u_ptr + offs, mask=mask, other=0.0))
    s = tl.math.div_rn(g, 1.0 + E.exp_c(-g))
    if OUT == 1:
        s = E.bf16_round(s)
    elif OUT == 2:
        s = s.to(tl.float16).to(tl.float32)
    tl.store(y_ptr + offs, E.cast_out(s * u, OUT), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise with the contract exp_c.

    Parameters
    ----------
    gate : Tensor, bfloat16/float16/float32, [*, I], CUDA
    up : Tensor, gate's dtype, [*, I]

    Returns
    -------
    Tensor, gate's dtype, [*, I]
    """
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = gate.numel()
    if n == 0:
        return out
    g, u = gate.contiguous(), up.contiguous()
    _silu_mul_fwd_kernel[(cdiv(n, BLOCK),)](g, u, out, n, OUT=OUT_CODE[gate.dtype], BLOCK=BLOCK,
                                                   num_warps=4, **LAUNCH)
    return out


def static_specs(target):
    return [("silu_mul", dt, _silu_mul_fwd_kernel,
             {"g_ptr": f"*{dt}", "u_ptr": f"*{dt}", "y_ptr": f"*{dt}", "n": "i64", "OUT": "constexpr",
              "BLOCK": "constexpr"}, {"OUT": code, "BLOCK": BLOCK})
            for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0))]
