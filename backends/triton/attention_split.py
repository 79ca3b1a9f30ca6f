"""The exact merge of ``attention_paged``'s key splits: where each split writes, and how readers merge.

Every program of ``attention_paged``'s pass 1 covers one key range (a split) of one block of packed
query rows and writes its integer maxima to its own slots of an int64 accumulator row per query
row (one writer per slot: no atomics; an integer atomic max is a compare-and-swap loop on gfx90a);
pass 2 reads the merged maxima (integer maxima over the slots, order-free) and adds its exact int64
sums with integer atomics (order-free). The kernels that follow the protocol are
``attention_paged.py``'s (matrix units) and ``attention_rows.py``'s (decode rows on the CUDA cores).
"""

from __future__ import annotations

import triton
import triton.language as tl

# accumulator columns after the two O limbs (2 * BLOCK_D columns): L, then the maxima and flags
_C_L = tl.constexpr(0)
_C_PBAD = tl.constexpr(6)
_EXTRA_N, _STATS_N = 8, 5  # host copies of _EXTRA and _STATS
_EXTRA = tl.constexpr(_EXTRA_N)
#: per split, after the extras: its pass-1 maxima (one writer each, merged by the readers)
_C_BEST = tl.constexpr(0)
_C_BESTC = tl.constexpr(1)
_C_NAN = tl.constexpr(2)
_C_EBIG = tl.constexpr(3)
_C_VBAD = tl.constexpr(4)
_STATS = tl.constexpr(_STATS_N)
#: int32 order keys >= -2**31 + 1 stored as key + 2**31 >= 1; 0 = no key
_KEY_OFF = tl.constexpr(2147483648)
#: V exponents > -2**30 stored as e + 2**30 > 0; 0 = no row
_E_OFF = tl.constexpr(1073741824)


@triton.jit
def _merged_stats(acc_ptr, grow, ok, acc_stride, n_split, BLOCK_D: tl.constexpr):
    """The merged pass-1 maxima of rows ``grow``: (best, best_c, nanf, e_big, vbad) as attention.py's
    sentinels, the integer maxima over the splits' written slots (0, the zero-fill, is neutral)."""
    base = acc_ptr + grow * acc_stride + 2 * BLOCK_D + _EXTRA
    best = (grow * 0).to(tl.int64)
    best_c, nanf, e_big, vbad = best, best, best, best
    for sp in range(0, n_split):
        slot = base + sp * _STATS
        best = tl.maximum(best, tl.load(slot + _C_BEST, mask=ok, other=0))
        best_c = tl.maximum(best_c, tl.load(slot + _C_BESTC, mask=ok, other=0))
        nanf = tl.maximum(nanf, tl.load(slot + _C_NAN, mask=ok, other=0))
        e_big = tl.maximum(e_big, tl.load(slot + _C_EBIG, mask=ok, other=0))
        vbad = tl.maximum(vbad, tl.load(slot + _C_VBAD, mask=ok, other=0))
    best = (tl.maximum(best, 1) - _KEY_OFF).to(tl.int32)
    best_c = (tl.maximum(best_c, 1) - _KEY_OFF).to(tl.int32)
    return best, best_c, nanf.to(tl.int32), (e_big - _E_OFF).to(tl.int32), vbad.to(tl.int32)


@triton.jit
def _split_range(b, mb, split, cu_q_ptr, lens_k_ptr, keys_per_split, group,
                 CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """(q0, lq, lk, first key, end key) of this program's key range (empty when first >= end)."""
    q0 = tl.load(cu_q_ptr + b).to(tl.int64)
    lq = tl.load(cu_q_ptr + b + 1).to(tl.int64) - q0
    lk = tl.load(lens_k_ptr + b).to(tl.int64)
    if CAUSAL:
        kv_end = tl.minimum(lk, lk - lq + tl.minimum((mb * BLOCK_M + BLOCK_M - 1) // group + 1, lq))
    else:
        kv_end = lk
    j_lo = split * keys_per_split
    j_hi = tl.minimum(kv_end, j_lo + keys_per_split)
    j_hi = tl.where(mb * BLOCK_M < lq * group, j_hi, j_lo)  # no live rows in this block
    return q0, lq, lk, j_lo, j_hi


@triton.jit
def _store_stats(acc_ptr, grow, q_ok, acc_stride, split, best, best_c, nanf, e_big, vbad_any,
                 BLOCK_D: tl.constexpr):
    """This split's pass-1 maxima of rows ``grow`` in its own slots (one writer per row and split)."""
    base = acc_ptr + grow * acc_stride + 2 * BLOCK_D + _EXTRA + split * _STATS
    tl.store(base + _C_BEST, best.to(tl.int64) + _KEY_OFF, mask=q_ok)
    tl.store(base + _C_BESTC, best_c.to(tl.int64) + _KEY_OFF, mask=q_ok)
    tl.store(base + _C_NAN, nanf.to(tl.int64), mask=q_ok)
    tl.store(base + _C_EBIG, e_big.to(tl.int64) + _E_OFF, mask=q_ok)
    tl.store(base + _C_VBAD, vbad_any.to(tl.int64), mask=q_ok)


@triton.jit
def _add_sums(acc_ptr, grow, q_ok, rd, d_ok, acc_stride, o_hi, o_lo, big_l, pbad, BLOCK_D: tl.constexpr):
    """This split's exact int64 pass-2 sums of rows ``grow`` (O_hi, O_lo [M, D], L [M]) and its NaN-p
    flags (as a count: non-zero = a NaN p), added by integer atomics."""
    base = acc_ptr + grow * acc_stride
    od = q_ok[:, None] & d_ok[None, :]
    tl.atomic_add(base[:, None] + rd[None, :], o_hi, mask=od)
    tl.atomic_add(base[:, None] + BLOCK_D + rd[None, :], o_lo, mask=od)
    tl.atomic_add(base + 2 * BLOCK_D + _C_L, big_l, mask=q_ok)
    tl.atomic_add(base + 2 * BLOCK_D + _C_PBAD, pbad.to(tl.int64), mask=q_ok)
