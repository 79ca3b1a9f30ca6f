"""SwiGLU gate on Triton: ``RN(fp32(RN(g ÷ (1 + exp_c(-g)))) * fp32(up))`` (contract ``silu_mul`` v1),
and its backward (contract ``silu_mul_backward`` v1).

Elementwise over the flattened tensors; each element depends only on its own inputs. The backward
was the generic torch code (~40 torch operations a chunk for the contract exp_c and the casts,
host-bound: ~3 ms of host time a call in the H100 trainer profile at ``0da9e3b`` against 0.3 ms of
kernels); here it is one kernel.
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
    s = _silu_value(g, 1.0 + E.exp_c(-g), OUT)
    tl.store(y_ptr + offs, E.cast_out(s * u, OUT), mask=mask)


@triton.jit
def _silu_value(g, den, OUT: tl.constexpr):
    """The forward's silu ``RN_dtype(RN32(g ÷ den))``, as fp32."""
    s = tl.math.div_rn(g, den)
    if OUT == 1:
        s = E.bf16_round(s)
    elif OUT == 2:
        s = s.to(tl.float16).to(tl.float32)
    return s


@triton.jit
def _silu_mul_bwd_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr):
    """``dgate = RN(RN32(RN32(dy * up) * ds))``, ``ds = RN32(sig * RN32(1 + RN32(g * RN32(1 - sig))))``,
    ``sig = RN32(1 ÷ den)``, ``den = RN32(1 + exp_c(-g))``; ``dup = RN(RN32(dy * silu))`` with the
    forward's rounded silu. Every step one IEEE fp32 operation (no contraction), as the generic code."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = E.upcast(tl.load(dy_ptr + offs, mask=mask, other=0.0))
    g = E.upcast(tl.load(g_ptr + offs, mask=mask, other=0.0))
    u = E.upcast(tl.load(u_ptr + offs, mask=mask, other=0.0))
    den = 1.0 + E.exp_c(-g)
    sig = tl.math.div_rn(1.0, den)
    ds = sig * (1.0 + g * (1.0 - sig))
    tl.store(dg_ptr + offs, E.cast_out((dy * u) * ds, OUT), mask=mask)
    tl.store(du_ptr + offs, E.cast_out(dy * _silu_value(g, den, OUT), OUT), mask=mask)


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


def silu_mul_backward(grad: torch.Tensor, gate: torch.Tensor,
                      up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dgate, dup)`` of :func:`silu_mul` for ``grad = dL/dy`` (contract ``silu_mul_backward`` v1).

    Parameters
    ----------
    grad, gate, up : Tensor, one dtype of bfloat16/float16/float32, [*, I], CUDA

    Returns
    -------
    dgate, dup : Tensor, gate's dtype, [*, I]
    """
    dgate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    dup = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    n = gate.numel()
    if n == 0:
        return dgate, dup
    dy, g, u = grad.contiguous(), gate.contiguous(), up.contiguous()
    _silu_mul_bwd_kernel[(cdiv(n, BLOCK),)](dy, g, u, dgate, dup, n, OUT=OUT_CODE[gate.dtype], BLOCK=BLOCK,
                                            num_warps=4, **LAUNCH)
    return dgate, dup


def static_specs(target):
    forward = [("silu_mul", dt, _silu_mul_fwd_kernel,
                {"g_ptr": f"*{dt}", "u_ptr": f"*{dt}", "y_ptr": f"*{dt}", "n": "i64", "OUT": "constexpr",
                 "BLOCK": "constexpr"}, {"OUT": code, "BLOCK": BLOCK})
               for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0))]
    backward = [("silu_mul_backward", dt, _silu_mul_bwd_kernel,
                 {"dy_ptr": f"*{dt}", "g_ptr": f"*{dt}", "u_ptr": f"*{dt}", "dg_ptr": f"*{dt}", "du_ptr": f"*{dt}",
                  "n": "i64", "OUT": "constexpr", "BLOCK": "constexpr"}, {"OUT": code, "BLOCK": BLOCK})
                for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0))]
    return forward + backward
