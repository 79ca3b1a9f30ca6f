"""``attention_paged``'s two key-range passes for blocks of a few query rows (decode), on the CUDA cores.

A decode step has one query token a sequence, so a block of packed rows (query token x query head
of one KV head) holds ``group`` rows: two for Qwen3-0.6B, four for Qwen3-8B. The matrix-unit
kernels (attention_paged.py) pad such a block to the 16 rows of an MMA and hold the padded q
operand in fp64 fragments in every warp; these kernels do the same exact arithmetic on the fp64
CUDA cores at the block's own row count instead.

The tiles are three-dimensional, [rows, keys, head dim], loaded as such so that each thread holds
8 consecutive head-dim elements of one key row (``BLOCK_N`` keys a step over the threads):

- scores: ``C = sum_d qint * kint`` as fp64 products and an fp64 sum over the head dim. Every
  product is an integer below 2**40 and D <= 2**12 (``check_head_dim``), so every partial sum is
  an integer below 2**53 and the sum is exact in any order: the integer attention.py's MMAs make;
- pass 1 keeps its maxima per (row, key slot) and reduces them over the slots once at the end;
- pass 2 adds ``R_hi * Vint`` and ``R_lo * Vint`` (``_p_grids_f64``'s limbs) into fp64 accumulators
  per (row, key slot, head dim), each slot summing at most ``F64_KEYS`` terms below 2**40 (a split
  covers at most ``F64_KEYS`` keys): exact; they are summed over the slots once, into int64.

The maxima and sums are those of attention_paged.py's kernels (the same integers), written to the
same accumulator slots (attention_split.py) and finished by the same ``_finish_kernel``, so which
kernel ran cannot change a bit.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import _tl_exact as E
from .attention import _key_rows, _p_terms_f64, _row_ref, _scores_from
from .attention_split import _add_sums, _merged_stats, _split_range, _store_stats


@triton.jit
def _grid3(v):
    """Rows of ``v`` [A, B, D] along the last axis on their 21-bit grids: exponent, non-finite flag and
    zero flag [A, B], grid integers as fp64 [A, B, D] (attention.py's ``_row_grid``)."""
    a = E.abs_bits(v)
    fin = a < 0x7F800000
    top = tl.max(tl.where(fin, a, 0), axis=2)
    bad = tl.max(a, axis=2) >= 0x7F800000
    e = E.expo_from_abs_bits(top)
    s1, s2 = E.grid_scales(e)
    g = E.grid_int_scaled(tl.where(fin, v, 0.0), s1[:, :, None], s2[:, :, None])
    return e, bad, top == 0, g.to(tl.float64)


@triton.jit
def _q3(q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """The packed q rows of block ``mb``: (qi, hh, q_ok, rd, d_ok [D], q grid [M, 1, D] fp64, eq_safe, q_bad)."""
    row = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    qi = row // group
    hh = g * group + row % group
    q_ok = qi < lq
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    base = (q0 + qi) * sq_t + hh * sq_h
    qv = E.upcast(tl.load(q_ptr + base[:, None, None] + rd[None, None, :],
                          mask=q_ok[:, None, None] & d_ok[None, None, :], other=0.0))  # [M, 1, D]
    eq, q_bad, q_zero, qf = _grid3(qv)
    eq = tl.max(eq, axis=1)
    q_bad = tl.max(q_bad.to(tl.int32), axis=1) != 0
    return qi, hh, q_ok, rd, d_ok, qf, tl.where(q_bad, 0, eq), q_bad


@triton.jit
def _kv3(ptr, rows, pos_ok, g, s_t, s_h, rd, d_ok):
    """K or V rows ``rows`` as a [1, N, D] tile, as stored (bf16/fp16)."""
    base = rows * s_t + g * s_h
    return tl.load(ptr + base[None, :, None] + rd[None, None, :], mask=pos_ok[None, :, None] & d_ok[None, None, :],
                   other=0.0)


@triton.jit
def _prefetch(b, j0, rn, lk, rows_next, k_ptr, v_ptr, g, sk_t, sk_h, sv_t, sv_h, rd, d_ok, table_ptr, table_stride,
              block_size, BLOCK_N: tl.constexpr, LOAD_K: tl.constexpr):
    """The loads ahead of key tile ``j0``: the K (``LOAD_K``; zeros else) and V tiles of the next one
    (``rows_next``, its cache rows) and the cache rows of the one after. Issued before tile ``j0``'s
    arithmetic, they wait under it instead of in front of it (each key step is a block-table load,
    then K and V loads that need it)."""
    ok1 = j0 + BLOCK_N + rn < lk
    v1 = _kv3(v_ptr, rows_next, ok1, g, sv_t, sv_h, rd, d_ok)
    if LOAD_K:
        k1 = _kv3(k_ptr, rows_next, ok1, g, sk_t, sk_h, rd, d_ok)
    else:
        k1 = tl.zeros_like(v1)
    pos2 = j0 + 2 * BLOCK_N + rn
    rows2 = _key_rows(b, pos2, pos2 < lk, 0, table_ptr, table_stride, block_size, True)
    return k1, v1, rows2


@triton.jit
def _scores3(kt, qf, eq_safe, q_bad, scale):
    """Scores [M, N] of the q rows against the key tile ``kt`` [1, N, D]: the exact integers ``qint . kint``
    as fp64 products summed over the head dim in fp64 (module docstring), rounded once to fp32."""
    ek, k_bad, k_zero, kf = _grid3(E.upcast(kt))
    c = tl.sum(qf * kf, axis=2)  # [M, N]
    return _scores_from(c.to(tl.float32), eq_safe, q_bad, tl.max(ek, axis=0), tl.max(k_bad.to(tl.int32), axis=0) != 0,
                        scale)


@triton.jit
def _rows_stats_kernel(q_ptr, k_ptr, v_ptr, s_ptr, acc_ptr, cu_q_ptr, lens_k_ptr, table_ptr,
                       sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, table_stride, block_size, D, group, hq, scale_bits,
                       n_split, keys_per_split, s_stride, acc_stride,
                       STORE_S: tl.constexpr, CAUSAL: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pass 1 of attention_paged.py's ``_stats_kernel`` for a block of ``BLOCK_M`` rows (module docstring)."""
    mb = tl.program_id(0)
    b = tl.program_id(1)
    g = tl.program_id(2) // n_split
    split = tl.program_id(2) % n_split
    q0, lq, lk, j_lo, j_hi = _split_range(b, mb, split, cu_q_ptr, lens_k_ptr, keys_per_split, group,
                                          CAUSAL, BLOCK_M)
    if j_lo < j_hi:
        scale = scale_bits.to(tl.float32, bitcast=True)
        qi, hh, q_ok, rd, d_ok, qf, eq_safe, q_bad = _q3(q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M,
                                                         BLOCK_D)
        if CAUSAL:
            limit = lk - lq + qi
        else:
            limit = qi * 0 + lk - 1
        grow = (q0 + qi) * hq + hh
        rn = tl.arange(0, BLOCK_N)
        # the maxima per (row, key slot), reduced over the slots after the loop
        best = tl.full([BLOCK_M, BLOCK_N], -2147483647, tl.int32)
        best_c = tl.full([BLOCK_M, BLOCK_N], -2147483647, tl.int32)
        nanf = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
        e_big = tl.full([BLOCK_M, BLOCK_N], -1073741824, tl.int32)
        vbad_any = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
        # the first tile's K and V and the second tile's rows; each step then loads ahead (_prefetch)
        rows0 = _key_rows(b, j_lo + rn, j_lo + rn < lk, 0, table_ptr, table_stride, block_size, True)
        kt, vt, rows_next = _prefetch(b, j_lo - BLOCK_N, rn, lk, rows0, k_ptr, v_ptr, g, sk_t, sk_h, sv_t, sv_h, rd,
                                      d_ok, table_ptr, table_stride, block_size, BLOCK_N, True)
        for j0 in range(j_lo, j_hi, BLOCK_N):
            pos = j0 + rn
            pos_ok = pos < lk
            k_cur, v_cur = kt, vt
            kt, vt, rows_next = _prefetch(b, j0, rn, lk, rows_next, k_ptr, v_ptr, g, sk_t, sk_h, sv_t, sv_h, rd, d_ok,
                                          table_ptr, table_stride, block_size, BLOCK_N, True)
            s = _scores3(k_cur, qf, eq_safe, q_bad, scale)
            if STORE_S:
                tl.store(s_ptr + grow[:, None] * s_stride + pos[None, :], s, mask=q_ok[:, None] & pos_ok[None, :])
            allowed = q_ok[:, None] & pos_ok[None, :] & (pos[None, :] <= limit[:, None])
            nan = E.is_nan(s)
            key = E.max_key(s)
            best = tl.maximum(best, tl.where(allowed & ~nan, key, -2147483647))
            nanf = tl.maximum(nanf, (allowed & nan).to(tl.int32))
            a = E.abs_bits(E.upcast(v_cur))
            vtop = tl.max(tl.max(tl.where(a < 0x7F800000, a, 0), axis=2), axis=0)
            vbad = tl.max(tl.max(a, axis=2), axis=0) >= 0x7F800000
            contrib = allowed & (vtop != 0)[None, :]
            best_c = tl.maximum(best_c, tl.where(contrib & ~nan, key, -2147483647))
            e_big = tl.maximum(e_big, tl.where(contrib, E.expo_from_abs_bits(vtop)[None, :], -1073741824))
            vbad_any = tl.maximum(vbad_any, (allowed & vbad[None, :]).to(tl.int32))
        _store_stats(acc_ptr, grow, q_ok, acc_stride, split, tl.max(best, axis=1), tl.max(best_c, axis=1),
                     tl.max(nanf, axis=1), tl.max(e_big, axis=1), tl.max(vbad_any, axis=1), BLOCK_D)


@triton.jit
def _rows_sums_kernel(q_ptr, k_ptr, v_ptr, s_ptr, acc_ptr, cu_q_ptr, lens_k_ptr, table_ptr,
                      sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, table_stride, block_size, D, group, hq, scale_bits,
                      n_split, keys_per_split, s_stride, acc_stride,
                      STORE_S: tl.constexpr, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pass 2 of attention_paged.py's ``_sums_kernel`` for a block of ``BLOCK_M`` rows (module docstring)."""
    mb = tl.program_id(0)
    b = tl.program_id(1)
    g = tl.program_id(2) // n_split
    split = tl.program_id(2) % n_split
    q0, lq, lk, j_lo, j_hi = _split_range(b, mb, split, cu_q_ptr, lens_k_ptr, keys_per_split, group,
                                          CAUSAL, BLOCK_M)
    if j_lo < j_hi:
        scale = scale_bits.to(tl.float32, bitcast=True)
        qi, hh, q_ok, rd, d_ok, qf, eq_safe, q_bad = _q3(q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M,
                                                         BLOCK_D)
        if CAUSAL:
            limit = lk - lq + qi
        else:
            limit = qi * 0 + lk - 1
        grow = (q0 + qi) * hq + hh
        best, best_c, nanf, e_big, vbad_any = _merged_stats(acc_ptr, grow, q_ok, acc_stride, n_split, BLOCK_D)
        ref, e_l, e_row = _row_ref(best, best_c, nanf, e_big)
        rn = tl.arange(0, BLOCK_N)
        # exact fp64 sums per (row, key slot[, head dim]), reduced over the slots after the loop
        l_sum = tl.zeros([BLOCK_M, BLOCK_N], tl.float64)
        pbad = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
        o_hi = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_D], tl.float64)
        o_lo = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_D], tl.float64)
        rows0 = _key_rows(b, j_lo + rn, j_lo + rn < lk, 0, table_ptr, table_stride, block_size, True)
        kt, vt, rows_next = _prefetch(b, j_lo - BLOCK_N, rn, lk, rows0, k_ptr, v_ptr, g, sk_t, sk_h, sv_t, sv_h, rd,
                                      d_ok, table_ptr, table_stride, block_size, BLOCK_N, not STORE_S)
        for j0 in range(j_lo, j_hi, BLOCK_N):
            pos = j0 + rn
            pos_ok = pos < lk
            k_cur, v_cur = kt, vt
            if STORE_S:  # the stored scores (the prefetch reads no K tile then)
                s = tl.load(s_ptr + grow[:, None] * s_stride + pos[None, :], mask=q_ok[:, None] & pos_ok[None, :],
                            other=0.0)
            kt, vt, rows_next = _prefetch(b, j0, rn, lk, rows_next, k_ptr, v_ptr, g, sk_t, sk_h, sv_t, sv_h, rd, d_ok,
                                          table_ptr, table_stride, block_size, BLOCK_N, not STORE_S)
            if not STORE_S:
                s = _scores3(k_cur, qf, eq_safe, q_bad, scale)
            allowed = q_ok[:, None] & pos_ok[None, :] & (pos[None, :] <= limit[:, None])
            p = tl.where(allowed, E.exp_c(s - ref[:, None]), 0.0)
            pnan = E.is_nan(p)
            pbad = tl.maximum(pbad, (pnan & allowed).to(tl.int32))
            p = tl.where(pnan, 0.0, p)
            ev, v_bad, v_zero, vf = _grid3(E.upcast(v_cur))
            l_terms, r_hi, r_lo = _p_terms_f64(p, allowed, e_l, e_row, tl.max(ev, axis=0),
                                               tl.max(v_zero.to(tl.int32), axis=0) != 0)
            l_sum += l_terms
            o_hi += r_hi[:, :, None] * vf
            o_lo += r_lo[:, :, None] * vf
        _add_sums(acc_ptr, grow, q_ok, rd, d_ok, acc_stride, tl.sum(o_hi, axis=1).to(tl.int64),
                  tl.sum(o_lo, axis=1).to(tl.int64), tl.sum(l_sum, axis=1).to(tl.int64), tl.max(pbad, axis=1),
                  BLOCK_D)
