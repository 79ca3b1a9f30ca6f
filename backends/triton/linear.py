"""``linear`` on Triton: the exact digit GEMM on int8 tensor cores (contract ``linear`` v2, P5).

``y = x @ weight.T (+ bias)`` with x [M, K], weight [N, K] (bf16/fp16):

1. ``_linear_digits_kernel`` (one program per row, strided reads): the row exponent
   ``expo(max |row|)`` (or the sentinel 2**20 for a row holding NaN/inf), then the row's grid
   (28-bit ``RNE(row * 2**(27 - e))`` for x, 21-bit ``RNE(row * 2**(20 - e))`` for the weight)
   split into balanced base-128 digits (four for x, three for the weight), written as int8
   planes ``[digits, rows, K]``. Used for x (every path) and for the weight on the prefill path.
2. ``_linear_gemm_kernel``: a BLOCK_M x BLOCK_N tile of ``C = X @ Wt.T``. Per K step it loads the
   four x digit tiles and three weight digit tiles and runs the twelve ``tl.dot(int8, int8,
   out_dtype=int32)`` products into six int32 level accumulators (level a+b; |level sum| <=
   3 * 64 * 64 per k, so int32 is exact for every K up to ``MAX_K``), which are folded into the
   int64 ``C = sum_l level_l << 7l`` once, after the K loop. The epilogue rounds ``C * 2**(ex + ew -
   47)`` once to the output dtype (P3'; with a bias, to fp32, + bias, cast) or, for
   ``linear_partial``, stores the int64 ``C`` itself.
   Decode path (M <= 64, and M <= ``MID_MAX_M`` at the target's ``linear_mid`` or, with few output
   tiles, ``linear_mid_few`` tile;
   ``W_DIGITS=False``): the weight's row exponents come from
   ``_linear_digits_kernel`` without planes (one read of the weight, one program per row); the
   GEMM reads the bf16/fp16 weight again and makes its digits in registers, so the weight never
   exists as int8 planes in memory. Few output tiles (small M and N) split K over programs
   (``ATOMIC``): each adds its int64 partial C into a zeroed int64 buffer with integer atomics,
   and ``_linear_finish_kernel`` applies the epilogue. The prefill path splits K the same way when
   its output tiles leave half the SMs idle (``PREFILL_SPLIT_MIN_STEPS``).

Every product is an exact integer, so any tiling, K order or split gives the same ``C``. A target
may name a vendor digit GEMM for the prefill path (``TritonTarget.digit_gemm``: on CUDA the sm_90
wgmma kernel of ``backends/cuda/digit_gemm.py``, on unless ``RLKERNEL_WGMMA=0``): it computes that
``C`` from the same digit planes and stores it, or rounds it in its own epilogue (the same P3'
arithmetic in CUDA C, ``backends/cuda/linear_epilogue.cuh``).
"""

from __future__ import annotations

import functools
import importlib

import torch
import triton
import triton.language as tl

from rlkernel import dispatch

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, cdiv, next_pow2, sm_count
from .targets import TritonTarget

#: grid magnitude bits of x rows (28-bit grid, 4 digits) and weight rows (21-bit grid, 3 digits)
X_BITS, W_BITS = 27, 20
X_DIGITS, W_DIGITS = 4, 3
SENTINEL = 1 << 20
#: exponent of an all-zero row or an empty K-slice: below every real exponent (a MAX over shards ignores it)
ZERO_EXP = -149
_ZERO_EXP = tl.constexpr(ZERO_EXP)  # the same value inside the kernels
#: |C| <= K * 2**47 < 2**63; and each int32 level accumulator, at most three digit products of
#: |d| <= 64 per k, stays exact over the whole K: 3 * 2**12 * MAX_K < 2**31
MAX_K = (1 << 16) - 1
#: rows of x at or below which the decode path (weights read as bf16, digits in registers) runs
DECODE_MAX_M = 64
#: rows of x at or below which (and above DECODE_MAX_M) the same kernel runs at the target's
#: ``linear_mid`` tile (where the target has one; else the prefill path)
MID_MAX_M = 256
#: a mid-path launch whose ``linear_mid`` output tiles are at most this many per SM takes the
#: target's ``linear_mid_few`` tile (o_proj / down_proj of a decode step: N = 1024)
MID_FEW_WAVES = 2
#: the prefill path splits K over programs when its output tiles fill less than half the GPU's
#: SMs (M = 256 rows of a decode step at N = 1024: 32 tiles on 132 SMs), each split at least this
#: many BLOCK_K steps; the int64 partials are added with atomics into a zeroed buffer (exact)
PREFILL_SPLIT_MIN_STEPS = 4
#: (BLOCK_M, BLOCK_N) of the standalone finish kernel (4 warps)
FINISH_TILE = (32, 64)
#: ``logits`` (token_logprobs' and token_entropy's chunks) above DECODE_MAX_M rows: None takes the
#: target's prefill tile; a (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) tile replaces it, for a device
#: run to compare ((128, 32, 64, 8, 3) was slower on an H100: token_logprobs T 256 7.70 against 5.52 ms
#: of kernels, docs/bench/issue12-session28.md section 2). Integer sums: no tile changes a bit
LOGITS_TILE: tuple[int, int, int, int, int] | None = None
#: ``logits_weight``: from this many ``logits`` calls of one op (token chunks of more than
#: DECODE_MAX_M rows), the weight's digit planes are made once for all of them where the vendor GEMM
#: takes the chunks (sm_90 wgmma): one pass writing 3 bytes a weight element (1.40 ms at Qwen3-8B's
#: LM head), then every chunk on the wgmma kernel. H100 at c349312 (docs/bench/issue12-session29.md
#: section 5): token_logprobs T 256 5.76 -> 5.42 ms, T 2048 41.0 -> 32.2 ms; token_entropy T 2048
#: 40.7 -> 31.8 ms; the token_logprobs family's cuda conformance with it passed (87 of 87) and its GPU
#: test too. None turns it off (the same integers and rounding either way, so no bit can change)
LOGITS_PLANES_MIN_CALLS: int | None = 2

#: tile configurations, warps, stages and split-K waves come from the backend's target
#: (``targets.py``: ``linear_prefill``, ``linear_decode``, ``split_k_waves``)
#: the interpreter runs the same kernels with small tiles (tests set this)
SMALL_TILES = False


@triton.jit
def _linear_digits_kernel(t_ptr, e_ptr, d_ptr, K, stride_r, stride_k, plane_stride,
                          HAS_E: tl.constexpr, WRITE: tl.constexpr, BITS: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row exponent (unless given) and the int8 digit planes of one row (four for a 28-bit grid,
    BITS = 27; three for a 21-bit grid, BITS = 20)."""
    row = tl.program_id(0).to(tl.int64)
    base = t_ptr + row * stride_r
    cols = tl.arange(0, BLOCK_K)
    if HAS_E:
        e = tl.load(e_ptr + row).to(tl.int32)
    else:
        top = tl.zeros([BLOCK_K], tl.int32)
        bad = tl.zeros([BLOCK_K], tl.int32)
        for k0 in range(0, K, BLOCK_K):
            mask = k0 + cols < K
            v = E.upcast(tl.load(base + (k0 + cols) * stride_k, mask=mask, other=0.0))
            fin = E.is_finite(v)
            top = tl.maximum(top, tl.where(fin & mask, E.abs_bits(v), 0))
            bad = tl.maximum(bad, (~fin & mask).to(tl.int32))
        top1 = tl.max(top, axis=0)
        e = tl.where(top1 == 0, _ZERO_EXP, E.expo_from_abs_bits(top1))
        e = tl.where(tl.max(bad, axis=0) != 0, 1048576, e)
        tl.store(e_ptr + row, e.to(tl.int64))
    live = e != 1048576
    e_safe = tl.where(live, e, 0)
    out = d_ptr + row * K
    for k0 in range(0, K if WRITE else 0, BLOCK_K):
        mask = k0 + cols < K
        v = E.upcast(tl.load(base + (k0 + cols) * stride_k, mask=mask, other=0.0))
        g = tl.where(live, E.grid_int_bits(v, e_safe, BITS), 0)
        if BITS == 27:
            d0, d1, d2, d3 = E.split4(g)
            tl.store(out + 3 * plane_stride + k0 + cols, d3, mask=mask)
        else:
            d0, d1, d2 = E.split3(g)
        tl.store(out + k0 + cols, d0, mask=mask)
        tl.store(out + plane_stride + k0 + cols, d1, mask=mask)
        tl.store(out + 2 * plane_stride + k0 + cols, d2, mask=mask)


@triton.jit
def _ldexp_clamped(y, k):
    """P2 for integer-valued fp32 |y| < 2**63 and any k: k clamped to [-252, 254] keeps the bits
    (below, every such y scales to +-0; above, every nonzero y overflows to +-inf)."""
    return E.ldexp_c(y, tl.minimum(tl.maximum(k, -252), 254))


@triton.jit
def _digit_tile(xd_ptr, x_plane, rm, m_ok, w_ptr, w_plane, rn, n_ok, ew_safe, w_live, K, stride_wn, stride_wk,
                W_DIGITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                k_lo, k_hi):
    """The exact int64 tile ``C[rm, rn] = sum_k X[rm, k] Wt[rn, k]`` by twelve int8 digit products,
    over ``k`` in ``[k_lo, k_hi)`` (``[0, K)``, or a split-K program's slice).

    x digits come from planes ``[4, M, K]``; the weight either from digit planes ``[3, N, K]``
    (``W_DIGITS``) or from the bf16/fp16 weight itself (any strides), put on the 21-bit grids
    ``ew_safe`` and split into digits in registers (rows with ``w_live`` False give 0).
    """
    rk = tl.arange(0, BLOCK_K)
    x_rows = xd_ptr + rm[:, None].to(tl.int64) * K
    # the weight rows' grid factors 2**(20 - ew) in two steps, once per column of the tile
    ws1, ws2 = E.grid_scales(ew_safe)
    l0 = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    l1 = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    l2 = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    l3 = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    l4 = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    l5 = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + rk
        k_ok = kk < K
        xmask = m_ok[:, None] & k_ok[None, :]
        xp = x_rows + kk[None, :]
        a0 = tl.load(xp, mask=xmask, other=0)
        a1 = tl.load(xp + x_plane, mask=xmask, other=0)
        a2 = tl.load(xp + 2 * x_plane, mask=xmask, other=0)
        a3 = tl.load(xp + 3 * x_plane, mask=xmask, other=0)
        wmask = k_ok[:, None] & n_ok[None, :]
        if W_DIGITS:
            wp = w_ptr + rn[None, :].to(tl.int64) * K + kk[:, None]
            b0 = tl.load(wp, mask=wmask, other=0)
            b1 = tl.load(wp + w_plane, mask=wmask, other=0)
            b2 = tl.load(wp + 2 * w_plane, mask=wmask, other=0)
        else:
            wt = E.upcast(tl.load(w_ptr + rn[None, :].to(tl.int64) * stride_wn + kk[:, None] * stride_wk,
                                  mask=wmask, other=0.0))
            # a live row is finite with |w| < 2**ew, so its grid values are below 2**20: the magic
            # add alone rounds them; a non-finite row (sentinel) gives 0 whatever the arithmetic made
            g = tl.where(w_live[None, :], E.grid_int_scaled(wt, ws1[None, :], ws2[None, :]), 0)
            b0, b1, b2 = E.split3(g)
        l0, l1, l2, l3, l4, l5 = E.levels12(a0, a1, a2, a3, b0, b1, b2, l0, l1, l2, l3, l4, l5)
    # one int64 fold after the K loop: |level| <= 3 * 64 * 64 * K < 2**31 for every K <= MAX_K, so the
    # int32 levels are exact over the whole slice; the int64 tile is not live inside the loop
    acc = E.fold6(l0, l1, l2, l3, l4, l5)
    return acc


@triton.jit
def _out_tile(acc, ex, ew, x_live, w_live, OUT: tl.constexpr):
    """P3' epilogue of a tile: ``C * 2**(ex + ew - 47)`` rounded once to output format ``OUT`` (as fp32),
    NaN on non-finite rows."""
    # 2**(ex + ew - 47) as a row and a column factor (fp64, normal: exponents lie in [-149, 128]);
    # |C| rounded to odd at 53 bits times both is exact, then rounded once to the format
    row = E.pow2_f64(tl.where(x_live, ex, 0))
    col = E.pow2_f64(tl.where(w_live, ew, 0) - 47)
    y = E.int64_scaled_to_out(acc, row[:, None], col[None, :], OUT)
    return tl.where(x_live[:, None] & w_live[None, :], y, E.canonical_nan_f32(y))


@triton.jit
def _linear_gemm_kernel(xd_ptr, w_ptr, ex_ptr, ew_ptr, bias_ptr, y_ptr,
                        M, N, K, K_SPLIT, x_plane, w_plane, stride_wn, stride_wk, stride_ym, stride_yn,
                        W_DIGITS: tl.constexpr, FINISH: tl.constexpr, ATOMIC: tl.constexpr, HAS_BIAS: tl.constexpr,
                        OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A BLOCK_M x BLOCK_N tile of C over the K slice ``[pid_k * K_SPLIT, (pid_k + 1) * K_SPLIT)``:
    stored (FINISH: through the epilogue; else the int64 C) or, split-K (ATOMIC), added into the
    int64 output with integer atomics (exact in any order)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    ex = tl.load(ex_ptr + rm, mask=m_ok, other=0).to(tl.int32)
    ew = tl.load(ew_ptr + rn, mask=n_ok, other=0).to(tl.int32)
    w_live = ew != 1048576
    ew_safe = tl.where(w_live, ew, 0)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)

    acc = _digit_tile(xd_ptr, x_plane, rm, m_ok, w_ptr, w_plane, rn, n_ok, ew_safe, w_live, K,
                      stride_wn, stride_wk, W_DIGITS, BLOCK_M, BLOCK_N, BLOCK_K, k_lo, k_hi)

    y_ptrs = y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :] * stride_yn
    out_mask = m_ok[:, None] & n_ok[None, :]
    if ATOMIC:
        tl.atomic_add(y_ptrs, acc, mask=out_mask, sem="relaxed")
    elif FINISH:
        if HAS_BIAS:  # one rounding to fp32, one fp32 addition, the cast
            y = _out_tile(acc, ex, ew, ex != 1048576, w_live, 0)
            y = y + E.upcast(tl.load(bias_ptr + rn, mask=n_ok, other=0.0))[None, :]
        else:  # one rounding, straight to the output format
            y = _out_tile(acc, ex, ew, ex != 1048576, w_live, OUT)
        tl.store(y_ptrs, E.cast_out(y, OUT), mask=out_mask)
    else:
        tl.store(y_ptrs, acc, mask=out_mask)


@triton.jit
def _linear_finish_kernel(acc_ptr, ex_ptr, ew_ptr, bias_ptr, y_ptr, M, N,
                          HAS_BIAS: tl.constexpr, OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    mask = m_ok[:, None] & n_ok[None, :]
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.load(acc_ptr + offs, mask=mask, other=0)
    ex = tl.load(ex_ptr + rm, mask=m_ok, other=0)
    ew = tl.load(ew_ptr + rn, mask=n_ok, other=0)
    x_live, w_live = ex != 1048576, ew != 1048576
    if HAS_BIAS:
        y = _out_tile(acc, ex, ew, x_live, w_live, 0)
        y = y + E.upcast(tl.load(bias_ptr + rn, mask=n_ok, other=0.0))[None, :]
    else:
        y = _out_tile(acc, ex, ew, x_live, w_live, OUT)
    tl.store(y_ptr + offs, E.cast_out(y, OUT), mask=mask)


# ----------------------------------------------------------------------------- host side


def _check_k(op: str, k: int) -> None:
    if k > MAX_K:
        raise ValueError(f"{op}: K={k} exceeds the exact-sum bound 2**16 - 1 = {MAX_K} of the digit matmul "
                         f"(|C| <= K * 2**47 < 2**63)")


def _digits(t: torch.Tensor, e: torch.Tensor | None = None, write: bool = True,
            activation: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 digit planes of the rows of t [R, K] (any strides) and their exponents (int64 [R]):
    ``[4, R, K]`` on the 28-bit grid for activations (x), ``[3, R, K]`` on the 21-bit grid for
    weights (``activation=False``).

    ``write=False``: the exponents only (the planes are not made).
    """
    rows, k = t.shape
    bits, count = (X_BITS, X_DIGITS) if activation else (W_BITS, W_DIGITS)
    d = torch.empty((count, rows, k) if write else (1,), dtype=torch.int8, device=t.device)
    has_e = e is not None
    if e is None:
        e = torch.empty(rows, dtype=torch.int64, device=t.device)
    if rows and k:
        block = 64 if SMALL_TILES else 1024
        _linear_digits_kernel[(rows,)](t, e, d, k, t.stride(0), t.stride(1), rows * k, HAS_E=has_e,
                                       WRITE=write, BITS=bits, BLOCK_K=block, num_warps=4, **LAUNCH)
    elif not has_e:
        e.fill_(ZERO_EXP)
    return d, e


def _tiles(m: int, decode: bool, target: TritonTarget, mid: bool = False, n: int = 0,
           device: torch.device | None = None) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) of the GEMM for ``m`` rows on ``target``
    (the mid path also looks at ``n`` output columns and the SMs of ``device``)."""
    if SMALL_TILES:
        return 16, 16, 32, 1, 1
    if mid and target.linear_mid is not None:
        bm, bn = target.linear_mid[:2]
        if target.linear_mid_few is not None and device is not None and device.type == "cuda":
            sms = sm_count(device)
            if cdiv(m, bm) * cdiv(n, bn) <= MID_FEW_WAVES * sms:
                return target.linear_mid_few
        return target.linear_mid
    if decode:
        bm = max(16, next_pow2(m))
        bn, bk, warps, stages = target.linear_decode
        return bm, bn, bk, warps, stages
    return target.linear_prefill


def _prefill_k_split(tiles: int, k: int, bk: int, device: torch.device) -> int:
    """K per program of the prefill path: ``k`` (no split) unless its ``tiles`` output tiles leave
    half of the SMs idle; then as many splits as whole waves allow, each of at least
    ``PREFILL_SPLIT_MIN_STEPS`` BLOCK_K steps. The interpreter (``SMALL_TILES``) pretends 64 SMs
    and one step, so small cases split too."""
    if SMALL_TILES:
        sms, min_steps = 64, 1
    elif device.type == "cuda":
        sms, min_steps = sm_count(device), PREFILL_SPLIT_MIN_STEPS
    else:
        return k
    splits = min(sms // max(tiles, 1), cdiv(k, bk) // min_steps)
    if splits <= 1:
        return k
    return cdiv(cdiv(k, bk), splits) * bk


def _k_split(tiles: int, k: int, bk: int, device: torch.device, target: TritonTarget) -> int:
    """K per program of a split-K launch: enough programs for every SM/CU (the target's
    ``split_k_waves`` each), whole BLOCK_K steps per slice; ``k`` (no split) when the output tiles
    alone fill the GPU."""
    if device.type != "cuda" and not SMALL_TILES:
        return k
    # ROCm builds of torch present AMD GPUs as "cuda" devices; multi_processor_count is then the CU count
    sms = sm_count(device) if device.type == "cuda" else 2
    splits = min(cdiv(k, bk), cdiv(target.split_k_waves * sms, tiles))
    if splits <= 1:
        return k
    return cdiv(cdiv(k, bk), splits) * bk


def _launch_gemm(xd: torch.Tensor, ex: torch.Tensor, weight: torch.Tensor, wd: torch.Tensor, ew: torch.Tensor,
                 bias: torch.Tensor | None, out: torch.Tensor, k_split: int, tiles: tuple[int, int, int, int, int],
                 *, w_digits: bool, finish: bool, atomic: bool, out_code: int) -> None:
    """One ``_linear_gemm_kernel`` launch into ``out`` [M, N] (x digit planes ``xd`` [4, M, K];
    ``wd`` the weight's digit planes, or the weight itself when not ``w_digits``)."""
    m, k = xd.shape[1], xd.shape[2]
    n = weight.shape[0]
    bm, bn, bk, warps, stages = tiles
    grid = (cdiv(m, bm), cdiv(n, bn), cdiv(k, k_split))
    _linear_gemm_kernel[grid](
        xd, wd, ex, ew, bias if bias is not None else out, out,
        m, n, k, k_split, m * k, n * k, weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        W_DIGITS=w_digits, FINISH=finish, ATOMIC=atomic, HAS_BIAS=bias is not None, OUT=out_code,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages, **LAUNCH)


def _gemm(x: torch.Tensor, weight: torch.Tensor, ex_given: torch.Tensor | None, ew_given: torch.Tensor | None,
          bias: torch.Tensor | None, out_dtype: torch.dtype | None, target: TritonTarget,
          x_planes: torch.Tensor | None = None,
          w_planes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shared GEMM launch: FINISH (out_dtype given) or the int64 partial C (out_dtype None).
    ``x_planes`` (with ``ex_given``): x's int8 digit planes [4, M, K], made by the caller.
    ``w_planes`` (with ``ew_given``): the weight's digit planes [3, N, K] (``linear_weight_digits``),
    read instead of making them on the prefill path and by the vendor GEMM; the decode and mid
    kernels read the weight itself (fewer bytes)."""
    m, k = x.shape
    n = weight.shape[0]
    finish = out_dtype is not None
    half = weight.dtype in (torch.bfloat16, torch.float16)
    decode = m <= DECODE_MAX_M and half
    # between the decode and prefill sizes, the decode kernel at the target's mid tile (no weight
    # planes), unless the target's vendor GEMM takes these sizes too (weight planes made per call)
    mid = not decode and half and m <= MID_MAX_M and target.linear_mid is not None
    vendor = None if decode or m == 0 or n == 0 else _vendor_gemm(target, x.device, k, n, mid, w_planes is not None)
    mid = mid and vendor is None
    if x_planes is not None and ex_given is not None:
        xd, ex = x_planes, ex_given
    else:
        xd, ex = _digits(x, ex_given)
    if decode or mid:  # the weight's exponents only (or the given ones); its digits are made in the GEMM
        ew = ew_given if ew_given is not None else _digits(weight, write=False, activation=False)[1]
        wd = weight
        dispatch.note_kernel("triton-int8-decode")
    elif w_planes is not None and ew_given is not None:
        wd, ew = w_planes, ew_given
    else:
        wd, ew = _digits(weight, ew_given, activation=False)
    if not (decode or mid):
        dispatch.note_kernel("triton-int8" if vendor is None else "cuda-wgmma-int8")
    y = torch.empty((m, n), dtype=out_dtype if finish else torch.int64, device=x.device)
    if m == 0 or n == 0:
        return y, ex, ew
    if vendor is not None:  # y through the kernel's own P3' epilogue, or the int64 C
        if finish:
            vendor.digit_gemm_finish(xd, wd, ex.contiguous(), ew.contiguous(), bias, y)
        else:
            vendor.digit_gemm(xd, wd, y)
        return y, ex, ew
    if k == 0:
        if finish:
            return _finish(torch.zeros((m, n), dtype=torch.int64, device=x.device),
                           ex, torch.full((n,), ZERO_EXP, dtype=torch.int64, device=x.device), bias, out_dtype), ex, ew
        return y.zero_(), ex, ew
    bm, bn, bk, warps, stages = _tiles(m, decode, target, mid, n, x.device)
    tiles = cdiv(m, bm) * cdiv(n, bn)
    k_split = _k_split(tiles, k, bk, x.device, target) if decode else _prefill_k_split(tiles, k, bk, x.device)
    atomic = k_split < k
    acc = torch.zeros((m, n), dtype=torch.int64, device=x.device) if atomic and finish else y.zero_() if atomic else y
    _launch_gemm(xd, ex, weight, wd, ew, bias if not atomic else None, acc, k_split, (bm, bn, bk, warps, stages),
                 w_digits=not (decode or mid), finish=finish and not atomic, atomic=atomic,
                 out_code=OUT_CODE[out_dtype] if finish else 0)
    if atomic and finish:
        assert out_dtype is not None
        return _finish(acc, ex, ew, bias, out_dtype), ex, ew
    return y, ex, ew


@functools.cache
def _vendor_module(name: str):
    return importlib.import_module(name)


def _vendor_gemm(target: TritonTarget, device: torch.device, k: int, n: int, mid: bool = False,
                 planes: bool = False):
    """``target``'s vendor digit GEMM module where it runs on ``device`` at this K (and, for the
    rows between the decode and prefill sizes, where it takes those at N output columns, the
    weight's planes given or not), else None."""
    if target.digit_gemm is None:
        return None
    module = _vendor_module(target.digit_gemm)
    return module if module.usable(device, k) and (not mid or module.usable_mid(n, planes)) else None


def _finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None,
            out_dtype: torch.dtype) -> torch.Tensor:
    m, n = acc.shape
    y = torch.empty((m, n), dtype=out_dtype, device=acc.device)
    if m == 0 or n == 0:
        return y
    acc = acc.contiguous()
    bm, bn = FINISH_TILE
    _linear_finish_kernel[(cdiv(m, bm), cdiv(n, bn))](
        acc, ex.contiguous(), ew.contiguous(), bias if bias is not None else y, y, m, n,
        HAS_BIAS=bias is not None, OUT=OUT_CODE[out_dtype], BLOCK_M=bm, BLOCK_N=bn, num_warps=4, **LAUNCH)
    return y


def logits(x: torch.Tensor, weight: torch.Tensor, ew: torch.Tensor, *, target: TritonTarget,
           out: torch.Tensor | None = None, planes: bool = False, wd: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [M, N] ``linear`` outputs (no bias) of x [M, K] and weight [N, K] (bf16/fp16) on the
    weight-row exponents ``ew`` int64 [N] (``linear_exponents``): the weight's digits are made in
    registers, so no weight planes are allocated (``token_logprobs`` calls this per token chunk).
    ``out``: an fp32 [M, N] tensor (any row stride, unit column stride) to write them into.
    ``planes``: where the target's vendor digit GEMM takes these rows (and ``out`` is contiguous),
    the weight's digit planes are made for this call (3 bytes a weight element) and the vendor GEMM
    with its fp32 epilogue runs instead (the same integers and rounding: ``linear``'s).
    ``wd``: the weight's digit planes int8 [3, N, K] made once by the caller with ``ew``
    (:func:`logits_weight`), read by the vendor GEMM where it takes these rows; elsewhere unused."""
    m, k = x.shape
    n = weight.shape[0]
    xd, ex = _digits(x)
    if out is not None and (out.shape != (m, n) or out.dtype != torch.float32 or (n > 1 and out.stride(1) != 1)):
        raise ValueError(f"linear logits: out must be fp32 [{m}, {n}] with unit column stride; got {out.dtype} "
                         f"{tuple(out.shape)} strides {out.stride()}")
    y = out if out is not None else torch.empty((m, n), dtype=torch.float32, device=x.device)
    if m == 0 or n == 0:
        return y
    if (planes or wd is not None) and m > DECODE_MAX_M and y.is_contiguous():
        vendor = _vendor_gemm(target, x.device, k, n, m <= MID_MAX_M, wd is not None)
        if vendor is not None:
            if wd is None:
                wd, _ = _digits(weight, ew, activation=False)
            vendor.digit_gemm_finish(xd, wd, ex, ew.contiguous(), None, y)
            return y
    decode = m <= DECODE_MAX_M
    tile = LOGITS_TILE if LOGITS_TILE is not None and not decode else _tiles(m, decode, target)
    _launch_gemm(xd, ex, weight, weight, ew, None, y, k, tile, w_digits=False, finish=True, atomic=False,
                 out_code=OUT_CODE[torch.float32])
    return y


def logits_weight(weight: torch.Tensor, rows: int, calls: int, *,
                  target: TritonTarget) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The weight operands of ``calls`` calls of :func:`logits` at up to ``rows`` rows each (a token
    chunk): ``(wd, ew)``, the weight rows' exponents ``ew`` int64 [N] and, where the target's vendor
    digit GEMM takes such rows and there are at least ``LOGITS_PLANES_MIN_CALLS`` calls (2; None: never), its digit
    planes ``wd`` int8 [3, N, K] made once in the same pass (3 bytes a weight element: 1.87 GB for
    Qwen3-8B's LM head), else None (every call's GEMM makes the weight's digits in registers)."""
    n, k = weight.shape
    if logits_planes(weight.device, n, k, rows, calls, target=target):
        return _digits(weight, activation=False)
    return None, _digits(weight, write=False, activation=False)[1]


def logits_planes(device: torch.device, n: int, k: int, rows: int, calls: int, *, target: TritonTarget) -> bool:
    """Whether :func:`logits_weight` makes the digit planes of an [n, k] weight on ``device`` for
    ``calls`` calls of up to ``rows`` rows."""
    return (LOGITS_PLANES_MIN_CALLS is not None and calls >= LOGITS_PLANES_MIN_CALLS and rows > DECODE_MAX_M
            and n > 0 and k > 0
            and _vendor_gemm(target, device, k, n, rows <= MID_MAX_M, True) is not None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, ew: torch.Tensor | None = None, wd: torch.Tensor | None = None, *,
           target: TritonTarget) -> torch.Tensor:
    """Kernel ``linear``: x [M, K], weight [N, K] (bf16/fp16, any strides), bias [N] or None -> [M, N].

    ``ew``: the weight's row exponents int64 [N], made beforehand (the public op has checked them,
    or a CUDA-graph capture vouches for them), or None to compute them here (one read of the weight).
    ``wd``: with ``ew``, the weight's digit planes int8 [3, N, K] (``linear_weight_digits``, checked or
    vouched for the same way): the prefill path and the vendor GEMM read them instead of making
    them, and the vendor GEMM then also takes the mid rows from ``CACHED_MID_MIN_N`` columns.
    Reports the path through ``dispatch.note_kernel``: ``triton-int8`` (digit planes for both
    operands) or ``triton-int8-decode`` (M <= 64, or M <= ``MID_MAX_M`` on a target with a
    ``linear_mid`` tile: weight digits made in registers).
    """
    _check_k("linear", x.shape[1])
    bias = bias.contiguous() if bias is not None else None
    y, _, _ = _gemm(x, weight, None, ew, bias, out_dtype or x.dtype, target,
                    w_planes=wd.contiguous() if wd is not None and ew is not None else None)
    return y


def linear_weight_digits(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``linear_weight_digits``: (ew int64 [N], digits int8 [3, N, K]) of weight [N, K]
    (``_linear_digits_kernel``: the planes the prefill path makes for every call)."""
    _check_k("linear_weight_digits", weight.shape[1])
    wd, ew = _digits(weight, activation=False)
    return ew, wd


def weight_exponents(weight: torch.Tensor) -> torch.Tensor:
    """The row exponents ew int64 [N] of weight [N, K] (sentinel 2**20 for non-finite rows), one read."""
    return _digits(weight, write=False, activation=False)[1]


def linear_exponents(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``linear_exponents``: (ex int64 [M], ew int64 [N]), sentinel 2**20 for non-finite rows."""
    _, ex = _digits(x, write=False)
    return ex, weight_exponents(weight)


def linear_partial(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, *,
                   target: TritonTarget) -> torch.Tensor:
    """Kernel ``linear_partial``: exact int64 [M, N] ``C`` on the grids ``ex`` [M], ``ew`` [N]."""
    _check_k("linear_partial", x.shape[1])
    y, _, _ = _gemm(x, weight, ex.contiguous(), ew.contiguous(), None, None, target)
    return y


def partial_from_planes(x_planes: torch.Tensor, ex: torch.Tensor, weight: torch.Tensor, ew: torch.Tensor, *,
                        target: TritonTarget) -> torch.Tensor:
    """Exact int64 [M, N] ``C = X @ Wt.T`` from x's balanced base-128 digit planes ``x_planes``
    int8 [4, M, K] (contiguous; any exact four-digit split with every digit in [-64, 64], zero
    on sentinel rows) and the bf16/fp16 weight [N, K] (any strides) on its row grids ``ew`` [N].

    For an x that is not bf16/fp16 (``token_logprobs_backward``'s fp32 coefficients on their
    28-bit grids): ``_linear_digits_kernel`` rounds a bf16/fp16 value's grid only. ``ex`` is
    passed through to the launch (the partial does not read it)."""
    _check_k("linear partial_from_planes", x_planes.shape[2])
    y, _, _ = _gemm(x_planes[0], weight, ex.contiguous(), ew.contiguous(), None, None, target,
                    x_planes=x_planes.contiguous())
    return y


def output_from_planes(x_planes: torch.Tensor, ex: torch.Tensor, weight: torch.Tensor, ew: torch.Tensor,
                       out_dtype: torch.dtype, *, target: TritonTarget) -> torch.Tensor:
    """``linear_finish(partial_from_planes(...), ex, ew, None, out_dtype)`` in one GEMM: the same
    operands and grids (x's planes on 28-bit row grids ``ex``, the weight on ``ew``), the contract's
    rounding in the GEMM's epilogue, so the int64 ``C`` is never stored."""
    _check_k("linear output_from_planes", x_planes.shape[2])
    y, _, _ = _gemm(x_planes[0], weight, ex.contiguous(), ew.contiguous(), None, out_dtype, target,
                    x_planes=x_planes.contiguous())
    return y


def linear_finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Kernel ``linear_finish``: acc int64 [M, N], ex [M], ew [N] -> [M, N] out_dtype."""
    return _finish(acc, ex, ew, bias.contiguous() if bias is not None else None, out_dtype)


_GEMM_SIGNATURE = {"xd_ptr": "*i8", "ex_ptr": "*i64", "ew_ptr": "*i64", "M": "i32", "N": "i32", "K": "i32",
                   "K_SPLIT": "i32", "x_plane": "i64", "w_plane": "i64", "stride_wn": "i64", "stride_wk": "i64",
                   "stride_ym": "i64", "stride_yn": "i64", "W_DIGITS": "constexpr", "FINISH": "constexpr",
                   "ATOMIC": "constexpr", "HAS_BIAS": "constexpr", "OUT": "constexpr", "BLOCK_M": "constexpr",
                   "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}


def digits_spec(op: str, case: str, dt: str, *, has_e: bool, write: bool, bits: int):
    """A static-check spec of ``_linear_digits_kernel`` (for this module's and its callers' ``static_specs``)."""
    return (op, case, _linear_digits_kernel,
            {"t_ptr": f"*{dt}", "e_ptr": "*i64", "d_ptr": "*i8", "K": "i32", "stride_r": "i64",
             "stride_k": "i64", "plane_stride": "i64", "HAS_E": "constexpr", "WRITE": "constexpr",
             "BITS": "constexpr", "BLOCK_K": "constexpr"},
            {"HAS_E": has_e, "WRITE": write, "BITS": bits, "BLOCK_K": 1024})


def gemm_spec(op: str, case: str, w: str, y: str, tile: tuple[int, int, int, int, int], *, w_digits: bool,
              finish: bool, atomic: bool = False, bias: bool = False, out: int = 0):
    """A static-check spec of ``_linear_gemm_kernel``: weight pointer type ``w`` (``*i8`` planes or the
    bf16/fp16 weight), output type ``y``, tile (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    return (op, case, _linear_gemm_kernel, {**_GEMM_SIGNATURE, "w_ptr": w, "bias_ptr": y, "y_ptr": y},
            {"W_DIGITS": w_digits, "FINISH": finish, "ATOMIC": atomic, "HAS_BIAS": bias, "OUT": out,
             "BLOCK_M": tile[0], "BLOCK_N": tile[1], "BLOCK_K": tile[2]},
            {"num_warps": tile[3], "num_stages": tile[4]})


def finish_spec(op: str, case: str, y: str, *, bias: bool, out: int):
    """A static-check spec of ``_linear_finish_kernel`` with output (and bias) type ``y`` and format code ``out``."""
    return (op, case, _linear_finish_kernel,
            {"acc_ptr": "*i64", "ex_ptr": "*i64", "ew_ptr": "*i64", "bias_ptr": y, "y_ptr": y, "M": "i32",
             "N": "i32", "HAS_BIAS": "constexpr", "OUT": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
            {"HAS_BIAS": bias, "OUT": out, "BLOCK_M": FINISH_TILE[0], "BLOCK_N": FINISH_TILE[1]})


def gemm_tiles(target: TritonTarget) -> tuple[tuple[int, int, int, int, int], tuple[int, int, int, int, int]]:
    """(prefill, decode) GEMM tiles of ``target`` as (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)."""
    d_bn, d_bk, d_warps, d_stages = target.linear_decode
    return target.linear_prefill, (16, d_bn, d_bk, d_warps, d_stages)


def static_specs(target: TritonTarget):
    specs = [digits_spec("linear", f"{dt}_digits", dt, has_e=False, write=True, bits=27) for dt in ("bf16", "fp16")]
    # the weight's planes (the prefill path's, and linear_weight_digits')
    specs += [digits_spec("linear_weight_digits", f"{dt}_weight_planes", dt, has_e=False, write=True, bits=20)
              for dt in ("bf16", "fp16")]
    prefill, decode = gemm_tiles(target)

    def gemm(case: str, w: str, y: str, tile: tuple[int, int, int, int, int], *, w_digits: bool, finish: bool,
             atomic: bool = False, bias: bool = False, out: int = 0) -> None:
        specs.append(gemm_spec("linear", case, w, y, tile, w_digits=w_digits, finish=finish, atomic=atomic,
                               bias=bias, out=out))

    gemm("prefill_gemm_bf16_out_bias", "*i8", "*bf16", prefill, w_digits=True, finish=True, bias=True, out=1)
    gemm("prefill_gemm_bf16_out", "*i8", "*bf16", prefill, w_digits=True, finish=True, out=1)
    gemm("decode_gemm_bf16_weight_fp32_out", "*bf16", "*fp32", decode, w_digits=False, finish=True)
    gemm("logits_bf16_weight_prefill_tiles_fp32_out", "*bf16", "*fp32", prefill, w_digits=False, finish=True)
    gemm("decode_split_k_bf16_weight_int64_atomic", "*bf16", "*i64", decode, w_digits=False, finish=False,
         atomic=True)
    gemm("partial_gemm_int64_out", "*i8", "*i64", prefill, w_digits=True, finish=False)
    gemm("prefill_split_k_int64_atomic", "*i8", "*i64", prefill, w_digits=True, finish=False, atomic=True)
    if target.linear_mid is not None:  # 64 < M <= 256: the decode kernel at the mid tile
        gemm("mid_gemm_bf16_weight_bf16_out", "*bf16", "*bf16", target.linear_mid, w_digits=False, finish=True,
             out=1)
        # few output tiles (N = 1024 at M = 256) take linear_mid_few; fewer than half the SMs' worth
        # (M <= 96 at N = 1024) also split K, so the split launch is at that tile
        few = target.linear_mid_few or target.linear_mid
        if target.linear_mid_few is not None:
            gemm("mid_few_gemm_bf16_weight_bf16_out", "*bf16", "*bf16", few, w_digits=False, finish=True, out=1)
        gemm("mid_split_k_bf16_weight_int64_atomic", "*bf16", "*i64", few, w_digits=False, finish=False,
             atomic=True)
    specs.append(finish_spec("linear", "finish_fp16_out_bias", "*fp16", bias=True, out=2))
    return specs
