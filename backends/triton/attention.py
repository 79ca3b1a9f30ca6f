"""``attention`` and ``attention_paged`` on Triton (contract ``attention`` v2, docs/numerics.md R4a).

One program per (block of BLOCK_M packed rows, sequence, KV head): the rows are (query token,
query head) pairs of the query heads that share the KV head (GQA packing), so each key/value
tile is loaded and put into digits once for all of them; a decode step of a 32/8-head model is
one 16-row block (4 live rows) per KV head. Every row's arithmetic is its own, so the packing
cannot change a bit. Everything is made in registers from the bf16/fp16 tensors; D (the head
dim) is one tile, so every row exponent (of a q, k or v row) is exact:

- scores: q and k rows on their own 21-bit grids (integers of at most 2**20), the exact integer
  ``C = qint . kint`` rounded once to fp32, ``ldexp_c(., eq + ek - 40)`` (NaN for non-finite rows),
  ``RN32(y * scale)``;
- pass 1 over the allowed keys: the R5 row max ``m_i`` (integer order keys + NaN flag), the max
  ``c_i`` over the allowed keys with a non-zero V row, and ``E_i`` = max exponent of those V rows
  (and whether an allowed V row is non-finite); the reference max ``ref = max(c, m - 64)`` and
  ``e_l = expo(exp_c(m - ref))``;
- pass 2: scores again, ``p = exp_c(s - ref)``; ``L += RNE(p * 2**(40 - e_l))`` (int64) and
  ``R = RNE(p * 2**(40 + e_j - E_i))``, split ``R = R_hi * 2**20 + R_lo``; ``O_hi += R_hi @ Vint``
  and ``O_lo += R_lo @ Vint`` (every factor <= 2**20 in magnitude), exact integer sums;
- ``out = RN32((O_hi * 2**20 + O_lo) * 2**(E - 60)) ÷ RN32(L * 2**(e_l - 40))`` (each rounded once,
  IEEE division), cast.

The integer products ``qint . kint`` and ``R_limb @ Vint`` run on one of two kinds of matrix unit
(the target's ``attention_f64``), with the same result:

- int8 (``F64=False``; ROCm): three balanced base-128 int8 digits per operand, nine
  ``tl.dot(int8, int8, out_dtype=int32)`` per product into five level accumulators, folded into
  int64 (per key tile here; ``attention_paged``'s pass 2 keeps the int32 levels over a split);
- fp64 (``F64=True``; CUDA, ``mma.sync ... .f64``): the grid integers as fp64, one ``tl.dot`` per
  product. Each elementwise product is below 2**40, so every partial sum over a head dim of at
  most ``F64_MAX_D`` = 4096, or over ``F64_KEYS`` = 4096 keys, is an integer below 2**53: fp64
  holds all of them exactly, so neither the order nor the unit's internal grouping of the sum can
  round. The score integer goes to fp32 by one round-to-nearest-even conversion (P3); the PV sums
  go into int64 every 4096 keys. This drops the digit split, the int64 folds and the integer
  int64 -> fp32 routine per score, which is where decode spent its time.

Every sum is an integer sum, so the key tiling (BLOCK_N), the paging (block size) and the
position of a sequence in the batch cannot change a bit. ``attention_paged`` (attention_paged.py)
runs the same tile pieces (``_q_rows``, ``_score_tile``, ``_v_row_stats``, ``_row_ref``,
``_p_tile``, ``_p_grids``) with the keys split over programs; the kernel here keeps its ``PAGED``
branch (keys read through a block table), which no launcher uses now.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, cdiv, f32_bits, next_pow2, on_device
from .linear import _ldexp_clamped
from .targets import TritonTarget

MAX_KEYS = 1 << 22
#: keys an fp64 PV accumulator covers before it goes into int64: |R_limb * Vint| <= 2**40, so the
#: partial sums of 2**12 keys stay below 2**52 < 2**53, exact
F64_KEYS = 1 << 12
#: head dims whose fp64 q.k products stay exact: |qint * kint| <= 2**40, so D <= 2**12 keeps |C| <= 2**52
F64_MAX_D = 1 << 12
_F64_KEYS = tl.constexpr(F64_KEYS)
#: an opaque copy ends what Triton 3.6 traces back from an fp64 dot operand to its bf16/fp16 load
#: (computeOrigBitWidth): from a 16-bit load it picks a K width that its fp64 MMA lowering refuses
#: ("fp64 don't support largeK MMA"); the Triton interpreter runs no PTX, and needs no such boundary
_OPAQUE_F64 = tl.constexpr(not E.interpreting())
#: interpreter tests shrink the tiles
SMALL_TILES = False
#: rows of a prefill block whose sequences run past F64_KEYS keys (the chunked fp64 path, which keeps
#: int64 sums beside the fp64 accumulators; None: ``_tiles``' 32). 16 halves every accumulator: on sm_90
#: at launch 2 295 instructions and 23 spill operations per 192 DMMA in the key loop, against 3 491 and
#: 259 per 384 DMMA at 32 rows (tools/sass_loops.py --case chunks), and on an H100 (c349312,
#: tools/exp_attention_chunks.py) 8 192-token causal prefill 319.5 -> 118.6 ms, 6 144 181.3 -> 67.7 ms
#: (the same bytes). The one-chunk path stays at 32 rows (16 was slower there: 2 048 tokens 6.34 -> 7.94
#: ms). Each row's arithmetic is its own, so the block rows cannot change a bit
CHUNKS_BLOCK_M: int | None = 16


@triton.jit
def _row_grid(v, AXIS: tl.constexpr):
    """Exponent (sentinel 2**20 if non-finite), non-finite flag, zero flag and the 21-bit grid
    integers ``RNE(v * 2**(20 - e))`` (int32, |g| <= 2**20) of rows of ``v`` along AXIS."""
    a = E.abs_bits(v)
    fin = a < 0x7F800000
    top = tl.max(tl.where(fin, a, 0), axis=AXIS)
    bad = tl.max(a, axis=AXIS) >= 0x7F800000  # a non-finite element's magnitude bits are the largest
    e = E.expo_from_abs_bits(top)
    s1, s2 = E.grid_scales(e)  # per row, then broadcast (E.grid_int would make them per element)
    vf = tl.where(fin, v, 0.0)
    if AXIS == 1:
        g = E.grid_int_scaled(vf, s1[:, None], s2[:, None])
    else:
        g = E.grid_int_scaled(vf, s1[None, :], s2[None, :])
    return e, bad, top == 0, g


@triton.jit
def _row_digits(v, AXIS: tl.constexpr):
    """``_row_grid`` with the grid integers as three balanced base-128 int8 digits."""
    e, bad, zero, g = _row_grid(v, AXIS)
    d0, d1, d2 = E.split3(g)
    return e, bad, zero, d0, d1, d2


@triton.jit
def _f64_operand(g):
    """The int32 grid integers ``g`` as an fp64 ``tl.dot`` operand (exact), behind ``_OPAQUE_F64``'s copy."""
    return _f64_opaque(g.to(tl.float64))


@triton.jit
def _f64_opaque(f):
    """fp64 ``f`` behind ``_OPAQUE_F64``'s copy, ready to be an fp64 ``tl.dot`` operand."""
    if _OPAQUE_F64:
        f = tl.inline_asm_elementwise("mov.b64 $0, $1;", "=d,d", [f], dtype=tl.float64, is_pure=False, pack=1)
    return f


@triton.jit
def _row_operands(v, AXIS: tl.constexpr, F64: tl.constexpr):
    """``_row_digits`` (int8 digit products), or with ``F64`` the grid integers as fp64 in the first
    operand slot (the other two repeat it; fp64 products of them are exact, module docstring)."""
    if F64:
        e, bad, zero, g = _row_grid(v, AXIS)
        f = _f64_operand(g)
        return e, bad, zero, f, f, f
    else:
        return _row_digits(v, AXIS)


@triton.jit
def _fold5(l0, l1, l2, l3, l4):
    """The exact int64 ``sum_k l_k * 128**k`` of five int32 digit-product levels."""
    return l0.to(tl.int64) + (l1.to(tl.int64) << 7) + (l2.to(tl.int64) << 14) \
        + (l3.to(tl.int64) << 21) + (l4.to(tl.int64) << 28)


@triton.jit
def _dot9(a0, a1, a2, b0, b1, b2, BM: tl.constexpr, BN: tl.constexpr):
    """Exact int64 ``A @ B`` from three int8 digits of each operand (levels in int32)."""
    l0 = tl.dot(a0, b0, out_dtype=tl.int32)
    l1 = tl.dot(a0, b1, out_dtype=tl.int32)
    l1 = tl.dot(a1, b0, l1, out_dtype=tl.int32)
    l2 = tl.dot(a0, b2, out_dtype=tl.int32)
    l2 = tl.dot(a1, b1, l2, out_dtype=tl.int32)
    l2 = tl.dot(a2, b0, l2, out_dtype=tl.int32)
    l3 = tl.dot(a1, b2, out_dtype=tl.int32)
    l3 = tl.dot(a2, b1, l3, out_dtype=tl.int32)
    l4 = tl.dot(a2, b2, out_dtype=tl.int32)
    return _fold5(l0, l1, l2, l3, l4)


@triton.jit
def _dot9_levels(a0, a1, a2, b0, b1, b2, l0, l1, l2, l3, l4):
    """``A @ B`` from three int8 digits of each operand added to five int32 level accumulators.

    A level of one product of K-wide digit tiles is at most ``3 * K * 64**2`` in magnitude, so
    int32 levels stay exact over ``2**31 / (3 * K * 4096)`` such products (5461 for K = 32).
    """
    l0 = tl.dot(a0, b0, l0, out_dtype=tl.int32)
    l1 = tl.dot(a0, b1, l1, out_dtype=tl.int32)
    l1 = tl.dot(a1, b0, l1, out_dtype=tl.int32)
    l2 = tl.dot(a0, b2, l2, out_dtype=tl.int32)
    l2 = tl.dot(a1, b1, l2, out_dtype=tl.int32)
    l2 = tl.dot(a2, b0, l2, out_dtype=tl.int32)
    l3 = tl.dot(a1, b2, l3, out_dtype=tl.int32)
    l3 = tl.dot(a2, b1, l3, out_dtype=tl.int32)
    l4 = tl.dot(a2, b2, l4, out_dtype=tl.int32)
    return l0, l1, l2, l3, l4


@triton.jit
def _key_rows(b, pos, pos_ok, k0, table_ptr, table_stride, block_size, PAGED: tl.constexpr):
    """Row index (in units of the t/slot axis) of key positions ``pos`` of sequence ``b``."""
    if PAGED:
        # key positions (< MAX_KEYS) and cache rows (< 2**31: a cache of 2**31 token slots would
        # hold terabytes a layer) in 32-bit unsigned arithmetic; only the row index is widened
        p32 = pos.to(tl.uint32)
        bs = tl.cast(block_size, tl.uint32)  # (block_size 1 arrives as a constant)
        blk = tl.load(table_ptr + b * table_stride + p32 // bs, mask=pos_ok, other=0).to(tl.uint32)
        return (blk * bs + p32 % bs).to(tl.int64)
    else:
        return (k0 + pos).to(tl.int64)


@triton.jit
def _q_rows(q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
            F64: tl.constexpr = False):
    """The packed query rows of block ``mb`` of KV head ``g``: indices, masks and q operands
    (``_row_operands``)."""
    row = mb * BLOCK_M + tl.arange(0, BLOCK_M)  # packed row = query index * group + head in group
    qi = row // group  # segment-local query index
    hh = g * group + row % group  # query head
    q_ok = qi < lq
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    qv = E.upcast(tl.load(q_ptr + (q0 + qi)[:, None] * sq_t + hh[:, None] * sq_h + rd[None, :],
                          mask=q_ok[:, None] & d_ok[None, :], other=0.0))
    eq, q_bad, q_zero, qd0, qd1, qd2 = _row_operands(qv, 1, F64)
    eq_safe = tl.where(q_bad, 0, eq)
    return qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad


@triton.jit
def _q_block(q_ptr, q0, lq, lk, mb, g, group, sq_t, sq_h, D, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_D: tl.constexpr, F64: tl.constexpr = False):
    """``_q_rows`` of block ``mb`` plus each row's last allowed key and the end of the keys the block
    needs (bottom-right causal, or every key)."""
    qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad = _q_rows(
        q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M, BLOCK_D, F64)
    if CAUSAL:
        limit = lk - lq + qi  # last allowed key per row
        kv_end = tl.minimum(lk, lk - lq + tl.minimum((mb * BLOCK_M + BLOCK_M - 1) // group + 1, lq))
    else:
        limit = qi * 0 + lk - 1
        kv_end = lk
    return qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, limit, kv_end


@triton.jit
def _score_tile(k_ptr, rows, pos_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F64: tl.constexpr = False):
    """Scores [BLOCK_M, BLOCK_N] of the q rows against key rows ``rows`` (NaN for non-finite rows).

    The exact integer ``C = qint . kint`` (|C| <= D * 2**40) is rounded once to fp32 (P3): from nine
    int8 digit products folded in int64, or (``F64``) from one fp64 product, exact while D <= 2**12.
    """
    if F64:
        # K rows as [N, D], the layout of the V tiles (one set of row indices for both)
        kt = E.upcast(tl.load(k_ptr + rows[:, None] * sk_t + g * sk_h + rd[None, :],
                              mask=pos_ok[:, None] & d_ok[None, :], other=0.0))  # [N, D]
        ek, k_bad, k_zero, kg = _row_grid(kt, 1)
        y = tl.dot(qd0, tl.trans(_f64_operand(kg)), out_dtype=tl.float64).to(tl.float32)  # exact, rounded once (RN)
    else:
        kt = E.upcast(tl.load(k_ptr + rows[None, :] * sk_t + g * sk_h + rd[:, None],
                              mask=pos_ok[None, :] & d_ok[:, None], other=0.0))  # [D, N]
        ek, k_bad, k_zero, kd0, kd1, kd2 = _row_digits(kt, 0)
        y = E.int64_to_f32(_dot9(qd0, qd1, qd2, kd0, kd1, kd2, BLOCK_M, BLOCK_N))
    return _scores_from(y, eq_safe, q_bad, ek, k_bad, scale)


@triton.jit
def _scores_from(y, eq_safe, q_bad, ek, k_bad, scale):
    """Scores [M, N] from ``y``, the integers ``C = qint . kint`` rounded once to fp32: ``ldexp_c(y, eq + ek
    - 40)``, NaN for a non-finite q or k row, ``RN32(. * scale)``."""
    y = _ldexp_clamped(y, eq_safe[:, None] + tl.where(k_bad, 0, ek)[None, :] - 40)
    y = tl.where(q_bad[:, None] | k_bad[None, :], E.canonical_nan_f32(y), y)
    return y * scale


@triton.jit
def _v_row_stats(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok):
    """Per V row: max finite magnitude bits (0: zero row), non-finite flag, exponent."""
    vt = E.upcast(tl.load(v_ptr + rows[:, None] * sv_t + g * sv_h + rd[None, :],
                          mask=pos_ok[:, None] & d_ok[None, :], other=0.0))  # [N, D]
    fin = E.is_finite(vt)
    vtop = tl.max(tl.where(fin, E.abs_bits(vt), 0), axis=1)
    vbad = tl.max((~fin).to(tl.int32), axis=1) != 0
    ev = E.expo_from_abs_bits(vtop)
    return vtop, vbad, ev


@triton.jit
def _row_ref(best, best_c, nanf, e_big):
    """(ref, e_l, E) of rows from the pass-1 maxima (order keys, NaN flag, max V exponent)."""
    m = E.key_to_f32(best)
    m = tl.where(nanf != 0, E.canonical_nan_f32(m), m)
    # the reference max: the largest key with a non-zero V row, at most 64 nats below m
    c_max = tl.where(best_c == -2147483647, float("-inf"), E.key_to_f32(best_c))
    ref = tl.maximum(c_max, m - 64.0)
    ref = tl.where(m != m, m, ref)  # NaN propagates
    top = E.exp_c(m - ref)
    e_l = tl.where(E.is_finite(top), E.expo_f32(tl.where(E.is_finite(top), top, 1.0)), 1)
    e_row = tl.where(e_big == -1073741824, 0, e_big)
    return ref, e_l, e_row


@triton.jit
def _p_tile(s, allowed, ref):
    """p = exp_c(s - ref) of one key tile (0 where not allowed or NaN) and the NaN-p flag [M]."""
    p = E.exp_c(s - ref[:, None])
    p = tl.where(allowed, p, 0.0)
    pnan = E.is_nan(p)
    pbad = tl.max((pnan & allowed).to(tl.int32), axis=1)
    p = tl.where(pnan, 0.0, p)
    return p, pbad


@triton.jit
def _p_grids(p, allowed, e_l, e_row, ev, v_zero):
    """p on its grids: (L terms [M] int64, R [M, N] int64; 0 for zero V rows)."""
    contrib = allowed & ~v_zero[None, :]
    r = tl.where(contrib, E.to_fixed(p, tl.where(contrib, e_row[:, None] - ev[None, :], 0), 40), 0)
    dl = tl.sum(tl.where(allowed, E.to_fixed(p, e_l[:, None], 40), 0), axis=1)
    return dl, r


@triton.jit
def _p_terms_f64(p, allowed, e_l, e_row, ev, v_zero):
    """``_p_grids`` in fp64 arithmetic, per (row, key): (L terms [M, N], R_hi [M, N], R_lo [M, N]), all fp64
    integers, with ``R = R_hi * 2**20 + R_lo``, ``0 <= R_lo < 2**20``: ``_p_grids``' integers.

    ``p * 2**(40 + e_j - E)`` and ``p * 2**(40 - e_l)`` are fp32 values times powers of two, exact in
    fp64 (no exponent leaves its range), at most 2**40 (a contributing key's p is at most 1 and
    ``e_j <= E``; an allowed key's p is below ``2**e_l``); one 1.5 * 2**52 magic add rounds each
    half-to-even to an integer, as ``E.to_fixed`` does in int64. The limbs come from an exact floor
    and an exact subtraction.
    """
    contrib = allowed & ~v_zero[None, :]
    pf = tl.where(contrib, p, 0.0).to(tl.float64)
    r = E.rne_f64((pf * E.pow2_f64(40 - e_row)[:, None]) * E.pow2_f64(tl.where(v_zero, 0, ev))[None, :])
    r_hi = tl.math.floor(r * (1.0 / 1048576.0))
    r_lo = r - r_hi * 1048576.0
    lf = tl.where(allowed, p, 0.0).to(tl.float64) * E.pow2_f64(40 - e_l)[:, None]
    return E.rne_f64(lf), r_hi, r_lo


@triton.jit
def _p_grids_f64(p, allowed, e_l, e_row, ev, v_zero):
    """``_p_terms_f64`` with the tile's L terms summed (exactly: fewer than 2**13 terms below 2**40) into
    int64 [M]: (L terms, R_hi, R_lo)."""
    l_terms, r_hi, r_lo = _p_terms_f64(p, allowed, e_l, e_row, ev, v_zero)
    return tl.sum(l_terms, axis=1).to(tl.int64), r_hi, r_lo


@triton.jit
def _v_tile_digits(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok, F64: tl.constexpr = False):
    """V rows ``rows`` [N, D] on their grids: (exponent, non-finite, zero, three int8 digits), or
    (``F64``) the grid integers as fp64 in the digit slots (``_row_operands``)."""
    vt = E.upcast(tl.load(v_ptr + rows[:, None] * sv_t + g * sv_h + rd[None, :],
                          mask=pos_ok[:, None] & d_ok[None, :], other=0.0))
    return _row_operands(vt, 1, F64)


@triton.jit
def _pv_f64(r_hi, r_lo, vf, acc_hi, acc_lo):
    """``acc_hi += R_hi @ Vint`` and ``acc_lo += R_lo @ Vint`` as fp64 products (``_p_grids_f64``'s
    limbs and Vint at most 2**20 in magnitude): exact while the accumulators cover at most
    ``F64_KEYS`` keys (|sum| <= 2**12 * 2**40)."""
    acc_hi = tl.dot(_f64_opaque(r_hi), vf, acc_hi, out_dtype=tl.float64)
    acc_lo = tl.dot(_f64_opaque(r_lo), vf, acc_lo, out_dtype=tl.float64)
    return acc_hi, acc_lo


@triton.jit
def _pv_tile(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok, s, allowed, ref, e_l, e_row, acc_hi, acc_lo,
             BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, F64: tl.constexpr = False):
    """One key tile of pass 2 added into ``acc_hi``/``acc_lo`` (O_hi, O_lo): (L terms [M], acc_hi, acc_lo,
    NaN-p flag [M]). int64 accumulators take nine int8 digit products each; fp64 ones (``F64``) one
    fp64 product each (``_pv_f64``)."""
    p, pbad = _p_tile(s, allowed, ref)
    ev, v_bad, v_zero, vd0, vd1, vd2 = _v_tile_digits(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok, F64)
    if F64:
        dl, r_hi, r_lo = _p_grids_f64(p, allowed, e_l, e_row, ev, v_zero)
        acc_hi, acc_lo = _pv_f64(r_hi, r_lo, vd0, acc_hi, acc_lo)
    else:
        dl, r = _p_grids(p, allowed, e_l, e_row, ev, v_zero)
        hd0, hd1, hd2 = E.split3((r >> 20).to(tl.int32))
        acc_hi += _dot9(hd0, hd1, hd2, vd0, vd1, vd2, BLOCK_M, BLOCK_D)
        ld0, ld1, ld2 = E.split3((r & 1048575).to(tl.int32))
        acc_lo += _dot9(ld0, ld1, ld2, vd0, vd1, vd2, BLOCK_M, BLOCK_D)
    return dl, acc_hi, acc_lo, pbad


@triton.jit
def _key_scores(k_ptr, b, j0, rn, k0, lk, limit, q_ok, table_ptr, table_stride, block_size, g, sk_t, sk_h, rd, d_ok,
                qd0, qd1, qd2, eq_safe, q_bad, scale, PAGED: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, F64: tl.constexpr):
    """The key tile at ``j0``: (in-sequence mask, key rows, scores, allowed (row, key) pairs)."""
    pos = j0 + rn
    pos_ok = pos < lk
    rows = _key_rows(b, pos, pos_ok, k0, table_ptr, table_stride, block_size, PAGED)
    s = _score_tile(k_ptr, rows, pos_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale,
                    BLOCK_M, BLOCK_N, F64)
    allowed = q_ok[:, None] & pos_ok[None, :] & (pos[None, :] <= limit[:, None])
    return pos_ok, rows, s, allowed


@triton.jit
def _pass_maxima(k_ptr, v_ptr, b, k0, lk, kv_end, limit, q_ok, rn, table_ptr, table_stride, block_size, g, sk_t,
                 sk_h, sv_t, sv_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, PAGED: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F64: tl.constexpr = False):
    """Pass 1 over the allowed keys ``< kv_end`` of the q rows: the R5 row max, the max over keys with
    a non-zero V row, E = their max V exponent, the non-finite-V flag; (ref, e_l, E, vbad flag [M])."""
    best = tl.full([BLOCK_M], -2147483647, tl.int32)
    best_c = tl.full([BLOCK_M], -2147483647, tl.int32)
    nanf = tl.zeros([BLOCK_M], tl.int32)
    e_big = tl.full([BLOCK_M], -1073741824, tl.int32)
    vbad_any = tl.zeros([BLOCK_M], tl.int32)
    for j0 in range(0, kv_end, BLOCK_N):
        pos_ok, rows, s, allowed = _key_scores(
            k_ptr, b, j0, rn, k0, lk, limit, q_ok, table_ptr, table_stride, block_size, g, sk_t, sk_h, rd, d_ok,
            qd0, qd1, qd2, eq_safe, q_bad, scale, PAGED, BLOCK_M, BLOCK_N, F64)
        nan = E.is_nan(s)
        best = tl.maximum(best, tl.max(tl.where(allowed & ~nan, E.max_key(s), -2147483647), axis=1))
        nanf = tl.maximum(nanf, tl.max((allowed & nan).to(tl.int32), axis=1))
        vtop, vbad, ev = _v_row_stats(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok)
        contrib = allowed & (vtop != 0)[None, :]
        best_c = tl.maximum(best_c, tl.max(tl.where(contrib & ~nan, E.max_key(s), -2147483647), axis=1))
        e_big = tl.maximum(e_big, tl.max(tl.where(contrib, ev[None, :], -1073741824), axis=1))
        vbad_any = tl.maximum(vbad_any, tl.max((allowed & vbad[None, :]).to(tl.int32), axis=1))
    ref, e_l, e_row = _row_ref(best, best_c, nanf, e_big)
    return ref, e_l, e_row, vbad_any


@triton.jit
def _pv_range(j_lo, j_hi, k_ptr, v_ptr, b, rn, k0, lk, limit, q_ok, table_ptr, table_stride, block_size, g, sk_t, sk_h,
              sv_t, sv_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, ref, e_l, e_row, big_l, pbad,
              PAGED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
              F64: tl.constexpr):
    """Pass 2 over the key tiles in [j_lo, j_hi): (O_hi, O_lo sums of this range in fresh accumulators
    (fp64 with ``F64``, else int64), L sums and NaN-p flags added to ``big_l`` / ``pbad``)."""
    if F64:
        acc_t = tl.float64
    else:
        acc_t = tl.int64
    acc_hi = tl.zeros([BLOCK_M, BLOCK_D], acc_t)
    acc_lo = tl.zeros([BLOCK_M, BLOCK_D], acc_t)
    for j0 in range(j_lo, j_hi, BLOCK_N):
        pos_ok, rows, s, allowed = _key_scores(
            k_ptr, b, j0, rn, k0, lk, limit, q_ok, table_ptr, table_stride, block_size, g, sk_t, sk_h, rd,
            d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, PAGED, BLOCK_M, BLOCK_N, F64)
        dl, acc_hi, acc_lo, dbad = _pv_tile(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok, s, allowed, ref,
                                            e_l, e_row, acc_hi, acc_lo, BLOCK_M, BLOCK_D, F64)
        big_l += dl
        pbad = tl.maximum(pbad, dbad)
    return acc_hi, acc_lo, big_l, pbad


@triton.jit
def _attention_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, cu_q_ptr, cu_k_ptr, lens_k_ptr, table_ptr,
                          sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, so_t, so_h, table_stride, block_size,
                          D, group, scale_bits,
                          PAGED: tl.constexpr, CAUSAL: tl.constexpr, OUT: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          F64: tl.constexpr, ONE_CHUNK: tl.constexpr):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    g = tl.program_id(2)  # KV head; its `group` query heads share the program (GQA packing)
    q0 = tl.load(cu_q_ptr + b).to(tl.int64)
    lq = tl.load(cu_q_ptr + b + 1).to(tl.int64) - q0
    if PAGED:
        k0 = 0
        lk = tl.load(lens_k_ptr + b).to(tl.int64)
    else:
        k0 = tl.load(cu_k_ptr + b).to(tl.int64)
        lk = tl.load(cu_k_ptr + b + 1).to(tl.int64) - k0
    if mb * BLOCK_M < lq * group:
        scale = scale_bits.to(tl.float32, bitcast=True)
        qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, limit, kv_end = _q_block(
            q_ptr, q0, lq, lk, mb, g, group, sq_t, sq_h, D, CAUSAL, BLOCK_M, BLOCK_D, F64)
        rn = tl.arange(0, BLOCK_N)

        # ---- pass 1: R5 max of the scores, E = max V exponent, non-finite V rows -------------
        ref, e_l, e_row, vbad_any = _pass_maxima(
            k_ptr, v_ptr, b, k0, lk, kv_end, limit, q_ok, rn, table_ptr, table_stride, block_size, g, sk_t, sk_h,
            sv_t, sv_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, PAGED, BLOCK_M, BLOCK_N, F64)

        # ---- pass 2: p = exp_c(s - ref); L and O as exact integer sums -------------------------
        big_l = tl.zeros([BLOCK_M], tl.int64)
        pbad = tl.zeros([BLOCK_M], tl.int32)
        if ONE_CHUNK:
            # every sequence's keys fit one accumulator (int64, or fp64 over <= F64_KEYS keys): no
            # int64 sums beside it (at 32 rows they would push the kernel into spilling registers)
            acc_hi, acc_lo, big_l, pbad = _pv_range(
                0, kv_end, k_ptr, v_ptr, b, rn, k0, lk, limit, q_ok, table_ptr, table_stride, block_size, g, sk_t,
                sk_h, sv_t, sv_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, ref, e_l, e_row, big_l, pbad,
                PAGED, BLOCK_M, BLOCK_N, BLOCK_D, F64)
            o_hi = acc_hi.to(tl.int64)
            o_lo = acc_lo.to(tl.int64)
        else:
            # fp64 accumulators cover F64_KEYS keys at a time, then go into the int64 sums
            o_hi = tl.zeros([BLOCK_M, BLOCK_D], tl.int64)
            o_lo = tl.zeros([BLOCK_M, BLOCK_D], tl.int64)
            for c0 in range(0, kv_end, _F64_KEYS):
                acc_hi, acc_lo, big_l, pbad = _pv_range(
                    c0, tl.minimum(c0 + _F64_KEYS, kv_end), k_ptr, v_ptr, b, rn, k0, lk, limit, q_ok, table_ptr,
                    table_stride, block_size, g, sk_t, sk_h, sv_t, sv_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale,
                    ref, e_l, e_row, big_l, pbad, PAGED, BLOCK_M, BLOCK_N, BLOCK_D, F64)
                o_hi += acc_hi.to(tl.int64)
                o_lo += acc_lo.to(tl.int64)

        num = E.int2_to_out(o_hi, o_lo, 20, (e_row - 60)[:, None], 0)
        den = E.int64_to_out(big_l, e_l - 40, 0)
        out = tl.math.div_rn(num, den[:, None])
        bad = (pbad != 0) | (vbad_any != 0)
        out = tl.where(bad[:, None], E.canonical_nan_f32(out), out)
        tl.store(o_ptr + (q0 + qi)[:, None] * so_t + hh[:, None] * so_h + rd[None, :], E.cast_out(out, OUT),
                 mask=q_ok[:, None] & d_ok[None, :])


def _tiles(d: int, rows: int, target: TritonTarget) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D, warps) for ``rows`` packed query rows (query tokens x heads per
    KV head) of the longest sequence. BLOCK_D and BLOCK_N are the K of the two int8 ``tl.dot``
    (Q @ K^T and R @ V): at least 32, the K of the int8 MMA instructions (BLOCK_D = 16 for head
    dims <= 16 failed to compile on the H200). Decode (rows <= 16) takes 16-row blocks, the
    smallest M of the MMA."""
    bd = max(32, next_pow2(d))
    if SMALL_TILES or rows <= 16:
        return 16, 32, bd, 1 if SMALL_TILES else target.attention_warps
    return 32, 32, bd, target.attention_warps


def check_head_dim(op: str, d: int, target: TritonTarget) -> None:
    """Refuse a head dim the fp64 score products cannot hold exactly (``F64_MAX_D``)."""
    if target.attention_f64 and d > F64_MAX_D:
        raise ValueError(f"{op}: head_dim D={d} exceeds {F64_MAX_D}, the most for which the {target.name} "
                         f"kernels' fp64 score products stay exact (D * 2**40 < 2**53); split the heads")


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor | None,
            lens_k: torch.Tensor | None, table: torch.Tensor | None, block_size: int, hkv: int,
            scale: float | None, causal: bool, paged: bool, target: TritonTarget) -> torch.Tensor:
    tq, hq, d = q.shape
    check_head_dim("attention", d, target)
    out = torch.empty((tq, hq, d), dtype=q.dtype, device=q.device)
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # (the device test first: a CPU-only torch, as under the Triton interpreter, raises here)
        # a CUDA-graph capture cannot read cu_q on the host; the caller promises non-empty
        # segments (rlkernel.ops.attention_paged's docstring), so the longest is <= Tq - B + 1
        n_seq = cu_q.shape[0] - 1
        max_lq = tq - n_seq + 1
        max_lk = k.shape[0]
    else:
        # one host read for both offset vectors
        both = [int(x) for x in (torch.cat((cu_q, cu_k)) if cu_k is not None else cu_q).tolist()]
        cq, ck = both[:cu_q.shape[0]], both[cu_q.shape[0]:]
        n_seq = len(cq) - 1
        max_lq = max((cq[i + 1] - cq[i] for i in range(n_seq)), default=0)
        max_lk = max((ck[i + 1] - ck[i] for i in range(len(ck) - 1)), default=0)
    if paged:
        max_lk = table.shape[1] * block_size
    if tq == 0 or n_seq == 0 or max_lq == 0:
        return out
    if scale is None:
        from rlkernel.backends.generic.attention import default_scale

        scale = default_scale(d)
    group = hq // hkv
    bm, bn, bd, warps = _tiles(d, max_lq * group, target)
    one_chunk = not target.attention_f64 or max_lk <= F64_KEYS
    if not one_chunk and CHUNKS_BLOCK_M is not None and bm > 16:
        bm = CHUNKS_BLOCK_M
    dummy = cu_q
    grid = (cdiv(max_lq * group, bm), n_seq, hkv)
    _attention_fwd_kernel[grid](
        q, k, v, out, cu_q, cu_k if cu_k is not None else dummy, lens_k if lens_k is not None else dummy,
        table if table is not None else dummy,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        table.stride(0) if table is not None else 0, block_size, d, group, f32_bits(scale),
        PAGED=paged, CAUSAL=causal, OUT=OUT_CODE[q.dtype], BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
        F64=target.attention_f64, ONE_CHUNK=one_chunk,
        num_warps=warps, num_stages=target.attention_stages, **LAUNCH)
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, scale: float | None = None, causal: bool = True, *,
              target: TritonTarget) -> torch.Tensor:
    """Kernel ``attention``: q [Tq, Hq, D], k/v [Tk, Hkv, D] (bf16/fp16, last axis contiguous), packed."""
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    dispatch.note_kernel("triton-varlen")
    return _launch(q, k, v, on_device(cu_seqlens_q, q.device), on_device(cu_seqlens_k, q.device), None, None, 1,
                   k.shape[1], scale, causal, paged=False, target=target)


def static_specs(target: TritonTarget):
    options = {"num_warps": target.attention_warps, "num_stages": target.attention_stages}
    # prefill blocks: the launch's 32 rows; the CUDA checks keep the 64 rows of the sm_90 report
    # (the same instructions on twice the rows)
    block_m = 64 if target.name == "cuda" else _tiles(128, 64, target)[0]
    specs = []
    for dt in ("bf16", "fp16"):
        for paged in (False,):  # attention_paged runs attention_paged.py's split-KV kernels
            specs.append(("attention", f"{dt}_d128", _attention_fwd_kernel,
                          {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "o_ptr": f"*{dt}",
                           "cu_q_ptr": "*i32", "cu_k_ptr": "*i32", "lens_k_ptr": "*i32", "table_ptr": "*i32",
                           "sq_t": "i64", "sq_h": "i64", "sk_t": "i64", "sk_h": "i64", "sv_t": "i64", "sv_h": "i64",
                           "so_t": "i64", "so_h": "i64", "table_stride": "i64", "block_size": "i32", "D": "i32",
                           "group": "i32", "scale_bits": "i32", "PAGED": "constexpr", "CAUSAL": "constexpr",
                           "OUT": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr",
                           "BLOCK_D": "constexpr", "F64": "constexpr", "ONE_CHUNK": "constexpr"},
                          {"PAGED": paged, "CAUSAL": True, "OUT": 1 if dt == "bf16" else 2, "BLOCK_M": block_m,
                           "BLOCK_N": 32, "BLOCK_D": 128, "F64": target.attention_f64, "ONE_CHUNK": True}, options))
    # the smallest tiles the launcher uses (head_dim <= 32): the int8 dots' K is then 32
    name, _, fn, sig, consts, _ = specs[0]
    specs.append((name, "bf16_d8", fn, sig, dict(consts, BLOCK_M=32, BLOCK_D=_tiles(8, 64, target)[2]), options))
    # decode through packed sequences: 16 packed rows (one token x the query heads of a KV head)
    name, _, fn, sig, consts, _ = specs[0]
    specs.append((name, "bf16_d128_decode", fn, sig, dict(consts, BLOCK_M=16), options))
    if target.attention_f64:  # sequences of more than F64_KEYS keys: fp64 sums folded into int64 ones per chunk
        specs.append((name, "bf16_d128_chunks", fn, sig, dict(consts, BLOCK_M=CHUNKS_BLOCK_M or 32, ONE_CHUNK=False),
                      options))
    return specs
