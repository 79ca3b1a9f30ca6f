"""softmax / log_softmax on Triton (contracts ``softmax`` v1, ``log_softmax`` v1).

Per row: R5 max (integer keys, NaN flag), ``d = x - m``, ``p = exp_c(d)``, ``L`` the exact
int64 sum of ``RNE(p * 2**40)`` (absolute grid: p <= 1), then ``p ÷ L`` or ``d - log_c(L)``.
One program per row; rows up to ``MAX_BLOCK`` stay in registers, longer rows (vocabularies)
loop over tiles in three passes (max, sum, output), recomputing exp_c instead of storing p.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, pow2_block, warps_for

MAX_N = 1 << 22
MAX_BLOCK = 4096


@triton.jit
def _row_max(x_row, n, cols, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    """R5 max of a row (NaN if any NaN; a zero max is +0) from integer order keys."""
    if SINGLE:
        mask = cols < n
        x = E.upcast(tl.load(x_row + cols, mask=mask, other=0.0))
        keys = tl.where(mask, E.max_key(x), -2147483647)
        nan = (E.is_nan(x) & mask).to(tl.int32)
    else:
        keys = tl.full([BLOCK], -2147483647, tl.int32)
        nan = tl.zeros([BLOCK], tl.int32)
        for start in range(0, n, BLOCK):
            mask = start + cols < n
            x = E.upcast(tl.load(x_row + start + cols, mask=mask, other=0.0))
            keys = tl.maximum(keys, tl.where(mask & ~E.is_nan(x), E.max_key(x), -2147483647))
            nan = nan | (E.is_nan(x) & mask).to(tl.int32)
    keys = tl.where(nan != 0, -2147483647, keys)
    m = E.key_to_f32(tl.max(keys, axis=0))
    any_nan = tl.max(nan, axis=0)
    return tl.where(any_nan != 0, E.canonical_nan_f32(m), m)


@triton.jit
def _softmax_fwd_kernel(x_ptr, y_ptr, n, x_row_stride, y_row_stride,
                        LOG: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK)
    m = _row_max(x_row, n, cols, BLOCK, SINGLE)
    if SINGLE:
        mask = cols < n
        x = E.upcast(tl.load(x_row + cols, mask=mask, other=0.0))
        d = x - m
        p = E.exp_c(d)
        flags = E.special_sum_code(p, mask)
        total = tl.sum(tl.where(mask, E.to_fixed(p, 0, 40), 0), axis=0)
        big_l = E.apply_special(E.from_fixed(total, 0, 40), E.or_reduce_flags(flags))
        if LOG:
            y = d - E.log_c(big_l)
        else:
            y = tl.math.div_rn(p, big_l)
        tl.store(y_row + cols, E.cast_out(y, OUT), mask=mask)
    else:
        acc = tl.zeros([BLOCK], tl.int64)
        flags = tl.zeros([BLOCK], tl.int32)
        for start in range(0, n, BLOCK):
            mask = start + cols < n
            x = E.upcast(tl.load(x_row + start + cols, mask=mask, other=0.0))
            p = E.exp_c(x - m)
            flags = flags | E.special_sum_code(p, mask)
            acc += tl.where(mask, E.to_fixed(p, 0, 40), 0)
        big_l = E.apply_special(E.from_fixed(tl.sum(acc, axis=0), 0, 40), E.or_reduce_flags(flags))
        log_l = E.log_c(big_l)
        for start in range(0, n, BLOCK):
            mask = start + cols < n
            x = E.upcast(tl.load(x_row + start + cols, mask=mask, other=0.0))
            d = x - m
            if LOG:
                y = d - log_l
            else:
                y = tl.math.div_rn(E.exp_c(d), big_l)
            tl.store(y_row + start + cols, E.cast_out(y, OUT), mask=mask)


def _launch(x: torch.Tensor, dtype: torch.dtype | None, log: bool) -> torch.Tensor:
    op = "log_softmax" if log else "softmax"
    out_dtype = x.dtype if dtype is None else dtype
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n = x.shape[-1] if x.dim() else 1
    if n > MAX_N:
        raise ValueError(f"{op}: N = {n} exceeds the exact-sum bound {MAX_N}")
    if x.numel() == 0:
        return out
    x2 = x.contiguous().reshape(-1, n)
    y2 = out.view(-1, n)
    block = pow2_block(n, 16, MAX_BLOCK)
    _softmax_fwd_kernel[(x2.shape[0],)](x2, y2, n, x2.stride(0), y2.stride(0), LOG=log,
                                        OUT=OUT_CODE[out_dtype], BLOCK=block, SINGLE=n <= block,
                                        num_warps=warps_for(block), **LAUNCH)
    return out


def softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``RN_out(exp_c(x - max x) ÷ L)`` over the last axis; x [*, N] fp32/bf16/fp16 on CUDA."""
    return _launch(x, dtype, log=False)


def log_softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``RN_out((x - max x) - log_c(L))`` over the last axis; x [*, N] fp32/bf16/fp16 on CUDA."""
    return _launch(x, dtype, log=True)


def static_specs(target):
    specs = []
    for log in (False, True):
        for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0)):
            for single in (True, False):
                specs.append(("log_softmax" if log else "softmax", f"{dt}_{'single' if single else 'looped'}",
                              _softmax_fwd_kernel,
                              {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "n": "i32", "x_row_stride": "i64",
                               "y_row_stride": "i64", "LOG": "constexpr", "OUT": "constexpr", "BLOCK": "constexpr",
                               "SINGLE": "constexpr"},
                              {"LOG": log, "OUT": code, "BLOCK": MAX_BLOCK, "SINGLE": single},
                              {"num_warps": warps_for(MAX_BLOCK)}))
    return specs
