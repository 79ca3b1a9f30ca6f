"""RMSNorm on Triton: exact integer sum of squares (P4), IEEE fp32 steps (contracts ``rms_norm`` v1
and ``rms_norm_backward`` v1).

One program per row. A row of up to ``BLOCK`` elements is read once and kept in registers;
longer rows loop over tiles in three passes (max of the squares, integer sum, output). Tiles
cannot change a bit: the max is exact and the sum is an int64 sum.

The backward (one program per row, tiles of ``BWD_BLOCK``) recomputes the forward's
``r = 1 / sqrt_rn(S / H + eps)`` with the same two passes, takes the exact P10 sum
``c = RN32(sum_j RN32(RN32(w_j * dy_j) * x_j))`` on the superaccumulator (``_tl_superacc``: int64
limb sums, one rounding), ``u = RN32(RN32(RN32(c / H) * r) * r)``, then writes
``dx = RN(RN32(r * g) - RN32(h * u))`` (h = RN32(x * r)) and the weight terms ``RN32(dy * RN_x(h))``.
It replaces the device-generic torch code (~1 k torch operations a call; H200 trainer profile at
025332e: 51 ms of host time a call).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from . import _tl_superacc as S
from ._common import LAUNCH, OUT_CODE, f32_bits, pow2_block, warps_for

MAX_HIDDEN = 1 << 22
#: longest row kept in registers
MAX_BLOCK = 8192
#: the backward's tile (its superaccumulator step holds a [1, BWD_BLOCK, 16] int64 tensor)
BWD_BLOCK = 256


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


@triton.jit(do_not_specialize=["hidden"])
def _rms_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, t_ptr, hidden, eps_bits, OUT: tl.constexpr,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * hidden
    cols = tl.arange(0, BLOCK)
    eps = eps_bits.to(tl.float32, bitcast=True)
    # the forward's r: grid exponent and special flags of the squares, then their exact sum
    top = tl.zeros([BLOCK], tl.int32)
    flags = tl.zeros([BLOCK], tl.int32)
    for start in range(0, hidden, BLOCK):
        mask = start + cols < hidden
        xf = E.upcast(tl.load(x_ptr + base + start + cols, mask=mask, other=0.0))
        sq = xf * xf
        fin = E.is_finite(sq) & mask
        top = tl.maximum(top, tl.where(fin, E.abs_bits(sq), 0))
        flags = flags | E.special_sum_code(sq, mask)
    e = E.expo_from_abs_bits(tl.max(top, axis=0))
    acc = tl.zeros([BLOCK], tl.int64)
    for start in range(0, hidden, BLOCK):
        mask = start + cols < hidden
        xf = E.upcast(tl.load(x_ptr + base + start + cols, mask=mask, other=0.0))
        sq = xf * xf
        acc += tl.where(E.is_finite(sq) & mask, E.to_fixed(sq, e, 40), 0)
    r = _inv_rms(tl.sum(acc, axis=0), e, flags, hidden, eps)
    # c = RN32(exact sum of RN32(g * x)), g = RN32(w * dy): the P10 superaccumulator
    limbs = tl.zeros([1, 16], tl.int64)
    nan = tl.zeros([1], tl.int64)
    pinf = tl.zeros([1], tl.int64)
    ninf = tl.zeros([1], tl.int64)
    for start in range(0, hidden, BLOCK):
        mask = start + cols < hidden
        xf = E.upcast(tl.load(x_ptr + base + start + cols, mask=mask, other=0.0))
        dy = E.upcast(tl.load(dy_ptr + base + start + cols, mask=mask, other=0.0))
        w = E.upcast(tl.load(w_ptr + start + cols, mask=mask, other=0.0))
        gx = ((w * dy) * xf)[None, :]
        valid = mask[None, :]
        limbs += S.raw_limbs(gx, valid)
        n0, n1, n2 = S.special_counts(gx, valid)
        nan += n0
        pinf += n1
        ninf += n2
    c = tl.sum(S.round_state(S.widen(limbs), nan, pinf, ninf), axis=0)
    u = (tl.math.div_rn(c, hidden.to(tl.float32)) * r) * r
    for start in range(0, hidden, BLOCK):
        mask = start + cols < hidden
        xf = E.upcast(tl.load(x_ptr + base + start + cols, mask=mask, other=0.0))
        dy = E.upcast(tl.load(dy_ptr + base + start + cols, mask=mask, other=0.0))
        w = E.upcast(tl.load(w_ptr + start + cols, mask=mask, other=0.0))
        h = xf * r
        g = w * dy
        tl.store(dx_ptr + base + start + cols, E.cast_out(r * g - h * u, OUT), mask=mask)
        if OUT == 1:
            h = E.bf16_round(h)
        elif OUT == 2:
            h = h.to(tl.float16).to(tl.float32)
        tl.store(t_ptr + base + start + cols, E.nan_to_canonical(dy * h), mask=mask)


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


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``dx`` (x's dtype) and the per-token weight terms ``RN32(dy * h)`` (fp32) of rms_norm v1.

    Parameters
    ----------
    grad : Tensor, x's dtype, [*, H]
    x : Tensor, bfloat16/float16/float32, [*, H], on the GPU
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
    x2 = x.contiguous().reshape(-1, hidden)
    g2 = grad.contiguous().reshape(-1, hidden)
    block = pow2_block(hidden, 16, BWD_BLOCK)
    _rms_norm_bwd_kernel[(x2.shape[0],)](g2, x2, weight.contiguous(), dx.view(-1, hidden), terms.view(-1, hidden),
                                         hidden, f32_bits(eps), OUT=OUT_CODE[x.dtype], BLOCK=block,
                                         num_warps=warps_for(block), **LAUNCH)
    return dx, terms


def static_specs(target):
    specs = []
    for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0)):
        for single, block in ((True, 4096), (False, 8192)):
            specs.append(("rms_norm", f"{dt}_{'single' if single else 'looped'}", _rms_norm_fwd_kernel,
                          {"x_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "hidden": "i32",
                           "eps_bits": "i32", "x_row_stride": "i64", "y_row_stride": "i64",
                           "OUT": "constexpr", "BLOCK": "constexpr", "SINGLE": "constexpr"},
                          {"OUT": code, "BLOCK": block, "SINGLE": single}, {"num_warps": warps_for(block)}))
        for wdt in sorted({dt, "fp32"}):
            specs.append(("rms_norm_backward", f"{dt}_weight_{wdt}", _rms_norm_bwd_kernel,
                          {"dy_ptr": f"*{dt}", "x_ptr": f"*{dt}", "w_ptr": f"*{wdt}", "dx_ptr": f"*{dt}",
                           "t_ptr": "*fp32", "hidden": "i32", "eps_bits": "i32", "OUT": "constexpr",
                           "BLOCK": "constexpr"},
                          {"OUT": code, "BLOCK": BWD_BLOCK}, {"num_warps": warps_for(BWD_BLOCK)}))
    return specs
