"""RMSNorm on Triton: exact integer sum of squares (P4), IEEE fp32 steps (contract ``rms_norm`` v1).

One program per row. A row of up to ``BLOCK`` elements is read once and kept in registers;
longer rows loop over tiles in three passes (max of the squares, integer sum, output). Tiles
cannot change a bit: the max is exact and the sum is an int64 sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, f32_bits, pow2_block, warps_for

MAX_HIDDEN = 1 << 22
#: longest row kept in registers
MAX_BLOCK = 8192


# hidden is never specialised: Triton turns an int argument equal to 1 into a constexpr, which
# has no ``.to`` (found on the H200: hidden = 1 failed to compile)
@triton.jit(do_not_specialize=["hidden"])
def _rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, hidden, eps_bits, x_row_stride, y_row_stride,
                         OUT: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK)
    eps = eps_bits.to(tl.float32, bitcast=True)
    if SINGLE:
        mask = cols < hidden
        xf = E.upcast(tl.load(x_row + cols, mask=mask, other=0.0))
        sq = xf * xf
        fin = E.is_finite(sq) & mask
        e = E.expo_from_abs_bits(tl.max(tl.where(fin, E.abs_bits(sq), 0), axis=0))
        flags = E.special_sum_code(sq, mask)
        total = tl.sum(tl.where(fin, E.to_fixed(sq, e, 40), 0), axis=0)
        r = _inv_rms(total, e, flags, hidden, eps)
        w = E.upcast(tl.load(w_ptr + cols, mask=mask, other=0.0))
        tl.store(y_row + cols, _scale_row(xf, r, w, OUT), mask=mask)
    else:
        top = tl.zeros([BLOCK], tl.int32)
        flags = tl.zeros([BLOCK], tl.int32)
        for start in range(0, hidden, BLOCK):
            mask = start + cols < hidden
            xf = E.upcast(tl.load(x_row + start + cols, mask=mask, other=0.0))
            sq = xf * xf
            fin = E.is_finite(sq) & mask
            top = tl.maximum(top, tl.where(fin, E.abs_bits(sq), 0))
            flags = flags | E.special_sum_code(sq, mask)
        e = E.expo_from_abs_bits(tl.max(top, axis=0))
        acc = tl.zeros([BLOCK], tl.int64)
        for start in range(0, hidden, BLOCK):
            mask = start + cols < hidden
            xf = E.upcast(tl.load(x_row + start + cols, mask=mask, other=0.0))
            sq = xf * xf
            fin = E.is_finite(sq) & mask
            acc += tl.where(fin, E.to_fixed(sq, e, 40), 0)
        r = _inv_rms(tl.sum(acc, axis=0), e, flags, hidden, eps)
        for start in range(0, hidden, BLOCK):
            mask = start + cols < hidden
            xf = E.upcast(tl.load(x_row + start + cols, mask=mask, other=0.0))
            w = E.upcast(tl.load(w_ptr + start + cols, mask=mask, other=0.0))
            tl.store(y_row + start + cols, _scale_row(xf, r, w, OUT), mask=mask)


@triton.jit
def _inv_rms(total, e, flags, hidden, eps):
    """``1 ÷ sqrt(S ÷ H + eps)`` with S the exact sum (total on grid e, non-finite flags OR-ed per lane)."""
    code = E.or_reduce_flags(flags)
    s = E.apply_special(E.from_fixed(total, e, 40), code)
    mean = tl.math.div_rn(s, hidden.to(tl.float32))
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(mean + eps))


@triton.jit
def _scale_row(xf, r, w, OUT: tl.constexpr):
    h = xf * r
    if OUT == 1:
        h = E.bf16_round(h)
    elif OUT == 2:
        h = h.to(tl.float16).to(tl.float32)
    return E.cast_out(w * h, OUT)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``RN(fp32(w) * RN(fp32(x) * (1 ÷ sqrt(fixed_sum(x*x) ÷ H + eps))))`` over the last axis.

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [*, H], on a CUDA device
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
    x2 = x.contiguous().reshape(-1, hidden)
    y2 = out.view(-1, hidden)
    w = weight.contiguous()
    block = pow2_block(hidden, 16, MAX_BLOCK)
    _rms_norm_fwd_kernel[(x2.shape[0],)](
        x2, w, y2, hidden, f32_bits(eps), x2.stride(0), y2.stride(0),
        OUT=OUT_CODE[x.dtype], BLOCK=block, SINGLE=hidden <= block, num_warps=warps_for(block), **LAUNCH)
    return out


def static_specs(target):
    specs = []
    for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0)):
        for single, block in ((True, 4096), (False, 8192)):
            specs.append(("rms_norm", f"{dt}_{'single' if single else 'looped'}", _rms_norm_fwd_kernel,
                          {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "hidden": "i32",
                           "eps_bits": "i32", "x_row_stride": "i64", "y_row_stride": "i64",
                           "OUT": "constexpr", "BLOCK": "constexpr", "SINGLE": "constexpr"},
                          {"OUT": code, "BLOCK": block, "SINGLE": single}, {"num_warps": warps_for(block)}))
    return specs
