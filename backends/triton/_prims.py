"""Elementwise kernels exposing the Triton primitives one by one, for tests and static checks.

Not an op: ``tests/test_cuda_interpreter.py`` runs these under the Triton interpreter against
the reference primitives, and ``static_checks.py`` compiles them for sm_90 and scans the PTX.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import cdiv

#: primitive name -> code of ``_prim_f32_kernel``
F32_PRIMS = {"exp_c": 0, "log_c": 1, "expo": 2, "bf16": 3, "fp16": 4, "canonical": 5}


@triton.jit
def _prim_f32_kernel(x_ptr, y_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if OP == 0:
        tl.store(y_ptr + offs, E.exp_c(x), mask=mask)
    elif OP == 1:
        tl.store(y_ptr + offs, E.log_c(x), mask=mask)
    elif OP == 2:
        tl.store(y_ptr + offs, E.expo_f32(x), mask=mask)
    elif OP == 3:
        tl.store(y_ptr + offs, E.cast_out(x, 1), mask=mask)
    elif OP == 4:
        tl.store(y_ptr + offs, E.cast_out(x, 2), mask=mask)
    else:
        tl.store(y_ptr + offs, E.cast_out(x, 0), mask=mask)


@triton.jit
def _prim_int_kernel(s_ptr, k_ptr, y_ptr, q_ptr, n, FRAC: tl.constexpr, BLOCK: tl.constexpr):
    """y = ldexp_c(int64_to_f32(s), k) and q = to_fixed(y, expo(y), FRAC)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(s_ptr + offs, mask=mask, other=0)
    k = tl.load(k_ptr + offs, mask=mask, other=0)
    y = E.ldexp_c(E.int64_to_f32(s), k)
    tl.store(y_ptr + offs, y, mask=mask)
    tl.store(q_ptr + offs, E.to_fixed(y, E.expo_f32(y), FRAC), mask=mask)


@triton.jit
def _prim_fixed_abs_kernel(x_ptr, q_ptr, n, FRAC: tl.constexpr, BLOCK: tl.constexpr):
    """q = to_fixed_abs(x, FRAC): RNE(x * 2**FRAC) as int64 in fp32 arithmetic (absolute grid)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(q_ptr + offs, E.to_fixed_abs(x, FRAC), mask=mask)


@triton.jit
def _prim_out_kernel(s_ptr, k_ptr, y_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr):
    """y = int64_to_out(s, k, OUT): ``s * 2**k`` rounded once to format OUT (0 fp32, 1 bf16, 2 fp16), as fp32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    s = tl.load(s_ptr + offs, mask=mask, other=0)
    k = tl.load(k_ptr + offs, mask=mask, other=0)
    tl.store(y_ptr + offs, E.int64_to_out(s, k, OUT), mask=mask)


@triton.jit
def _prim_grid_kernel(x_ptr, e_ptr, d_ptr, n, BLOCK: tl.constexpr):
    """Digits of ``RNE(x * 2**(20 - e))``: d[0..2] planes of int8."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = E.upcast(tl.load(x_ptr + offs, mask=mask, other=0.0))
    e = tl.load(e_ptr + offs, mask=mask, other=0)
    d0, d1, d2 = E.split3(E.grid_int(x, e))
    tl.store(d_ptr + offs, d0, mask=mask)
    tl.store(d_ptr + n + offs, d1, mask=mask)
    tl.store(d_ptr + 2 * n + offs, d2, mask=mask)


@triton.jit
def _prim_grid28_kernel(x_ptr, e_ptr, d_ptr, n, BLOCK: tl.constexpr):
    """Digits of ``RNE(x * 2**(27 - e))`` for fp32 x: d[0..3] planes of int8."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    e = tl.load(e_ptr + offs, mask=mask, other=0)
    d0, d1, d2, d3 = E.split4(E.grid_int_f32(x, e, 27))
    tl.store(d_ptr + offs, d0, mask=mask)
    tl.store(d_ptr + n + offs, d1, mask=mask)
    tl.store(d_ptr + 2 * n + offs, d2, mask=mask)
    tl.store(d_ptr + 3 * n + offs, d3, mask=mask)


_BLOCK = 1024


@triton.jit
def _prim_exp_nonpos_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = exp_c_nonpos(x) for x <= 0 or -inf (never NaN)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, E.exp_c_nonpos(tl.load(x_ptr + offs, mask=mask, other=0.0)), mask=mask)


@triton.jit
def _prim_grid_unit_kernel(x_ptr, c_ptr, q_ptr, n, FRAC: tl.constexpr, BLOCK: tl.constexpr):
    """q = f64_count_to_i64(c + fp64(to_grid_unit(x, FRAC))): x in [0, 1], c an integer-valued fp64 >= 0
    (the sum below 2**52)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    c = tl.load(c_ptr + offs, mask=mask, other=0.0)
    tl.store(q_ptr + offs, E.f64_count_to_i64(c + E.to_grid_unit(x, FRAC).to(tl.float64)), mask=mask)


def prim_f32(name: str, x: torch.Tensor) -> torch.Tensor:
    """Apply primitive ``name`` elementwise to fp32 ``x`` (1-D contiguous)."""
    op = F32_PRIMS[name]
    out_dtype = {2: torch.int32, 3: torch.bfloat16, 4: torch.float16}.get(op, torch.float32)
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n = x.numel()
    _prim_f32_kernel[(cdiv(n, _BLOCK),)](x, y, n, OP=op, BLOCK=_BLOCK, enable_fp_fusion=False)
    return y


def prim_int(s: torch.Tensor, k: torch.Tensor, frac: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    q = torch.empty(s.shape, dtype=torch.int64, device=s.device)
    n = s.numel()
    _prim_int_kernel[(cdiv(n, _BLOCK),)](s, k, y, q, n, FRAC=frac, BLOCK=_BLOCK, enable_fp_fusion=False)
    return y, q


def prim_fixed_abs(x: torch.Tensor, frac: int = 40) -> torch.Tensor:
    """int64 [n]: ``to_fixed_abs`` of fp32 ``x`` [n] (``|x| * 2**frac < 2**62``; 0 for non-finite x)."""
    q = torch.empty(x.shape, dtype=torch.int64, device=x.device)
    n = x.numel()
    _prim_fixed_abs_kernel[(cdiv(n, _BLOCK),)](x, q, n, FRAC=frac, BLOCK=_BLOCK, enable_fp_fusion=False)
    return q


def prim_exp_nonpos(x: torch.Tensor) -> torch.Tensor:
    """fp32 [n]: ``exp_c_nonpos`` of fp32 ``x`` [n] (x <= 0 or -inf, not NaN)."""
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    n = x.numel()
    _prim_exp_nonpos_kernel[(cdiv(n, _BLOCK),)](x, y, n, BLOCK=_BLOCK, enable_fp_fusion=False)
    return y


def prim_grid_unit(x: torch.Tensor, c: torch.Tensor, frac: int = 40) -> torch.Tensor:
    """int64 [n]: ``c + RNE(x * 2**frac)`` through ``to_grid_unit`` and ``f64_count_to_i64`` (x fp32 in [0, 1],
    c fp64 integer-valued, the sum below 2**52)."""
    q = torch.empty(x.shape, dtype=torch.int64, device=x.device)
    n = x.numel()
    _prim_grid_unit_kernel[(cdiv(n, _BLOCK),)](x, c, q, n, FRAC=frac, BLOCK=_BLOCK, enable_fp_fusion=False)
    return q


def prim_out(s: torch.Tensor, k: torch.Tensor, out: int) -> torch.Tensor:
    """fp32 [n]: int64 ``s`` [n] times ``2**k`` (int32 [n]) rounded once to format code ``out``."""
    y = torch.empty(s.shape, dtype=torch.float32, device=s.device)
    n = s.numel()
    _prim_out_kernel[(cdiv(n, _BLOCK),)](s, k, y, n, OUT=out, BLOCK=_BLOCK, enable_fp_fusion=False)
    return y


def prim_grid(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    d = torch.empty((3,) + tuple(x.shape), dtype=torch.int8, device=x.device)
    n = x.numel()
    _prim_grid_kernel[(cdiv(n, _BLOCK),)](x, e, d, n, BLOCK=_BLOCK, enable_fp_fusion=False)
    return d


def prim_grid28(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """int8 [4, n]: the balanced digits of fp32 ``x`` [n] on the 28-bit grids ``e`` int32 [n]."""
    d = torch.empty((4,) + tuple(x.shape), dtype=torch.int8, device=x.device)
    n = x.numel()
    _prim_grid28_kernel[(cdiv(n, _BLOCK),)](x, e, d, n, BLOCK=_BLOCK, enable_fp_fusion=False)
    return d


#: static-check specs: (op, case, kernel, signature, constexprs)
def static_specs(target) -> list[tuple[str, str, object, dict[str, str], dict[str, object]]]:
    specs = []
    for name, code in F32_PRIMS.items():
        out = {2: "*i32", 3: "*bf16", 4: "*fp16"}.get(code, "*fp32")
        specs.append(("primitives", name, _prim_f32_kernel,
                      {"x_ptr": "*fp32", "y_ptr": out, "n": "i32", "OP": "constexpr", "BLOCK": "constexpr"},
                      {"OP": code, "BLOCK": _BLOCK}))
    specs.append(("primitives", "int64_to_f32+ldexp_c+to_fixed", _prim_int_kernel,
                  {"s_ptr": "*i64", "k_ptr": "*i32", "y_ptr": "*fp32", "q_ptr": "*i64", "n": "i32",
                   "FRAC": "constexpr", "BLOCK": "constexpr"}, {"FRAC": 40, "BLOCK": _BLOCK}))
    specs.append(("primitives", "to_fixed_abs", _prim_fixed_abs_kernel,
                  {"x_ptr": "*fp32", "q_ptr": "*i64", "n": "i32", "FRAC": "constexpr", "BLOCK": "constexpr"},
                  {"FRAC": 40, "BLOCK": _BLOCK}))
    specs.append(("primitives", "exp_c_nonpos", _prim_exp_nonpos_kernel,
                  {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": _BLOCK}))
    specs.append(("primitives", "to_grid_unit+f64_count_to_i64", _prim_grid_unit_kernel,
                  {"x_ptr": "*fp32", "c_ptr": "*fp64", "q_ptr": "*i64", "n": "i32", "FRAC": "constexpr",
                   "BLOCK": "constexpr"}, {"FRAC": 40, "BLOCK": _BLOCK}))
    for out, name in enumerate(("fp32", "bf16", "fp16")):
        specs.append(("primitives", f"int64_to_out_{name}", _prim_out_kernel,
                      {"s_ptr": "*i64", "k_ptr": "*i32", "y_ptr": "*fp32", "n": "i32", "OUT": "constexpr",
                       "BLOCK": "constexpr"}, {"OUT": out, "BLOCK": _BLOCK}))
    specs.append(("primitives", "grid_digits", _prim_grid_kernel,
                  {"x_ptr": "*bf16", "e_ptr": "*i32", "d_ptr": "*i8", "n": "i32", "BLOCK": "constexpr"},
                  {"BLOCK": _BLOCK}))
    specs.append(("primitives", "grid28_f32_digits", _prim_grid28_kernel,
                  {"x_ptr": "*fp32", "e_ptr": "*i32", "d_ptr": "*i8", "n": "i32", "BLOCK": "constexpr"},
                  {"BLOCK": _BLOCK}))
    return specs
