"""``exact_sum_partial`` / ``_merge`` / ``_finish`` / ``_accumulate`` on Triton (contract ``exact_sum`` v1, P10).

The trainer's weight gradients live in these states (int64 ``[*E, 20]`` per parameter element,
160 bytes each: 25 GB for a 152k x 1024 LM head), so their speed is the speed of every exact
accumulation. Each kernel is elementwise over the output elements: a program holds ``R``
elements, and each of the 20 slots of their states (limbs 0..15, the carry limb 16, the NaN /
+inf / -inf counts 17..19) is an int64 ``[R]`` vector of its own, so a carry ripple is 16
shift-and-mask steps per element. The states move between memory and those vectors as one
coalesced ``[R, 32]`` tile (slots 20..31 masked), taken apart by ``tl.split`` and put together by
``tl.join`` trees (register moves). Each state is read and written once. (On the H200: 20 strided
8-byte accesses per element, one per slot, ran at ~1.0 TB/s, 4.1x the bytes floor of
``exact_sum_accumulate``; the tile at the floor, 4.2 TB/s, ``tools/exp_accumulate.py``; a first
version that read slots by reductions over a ``[R, 32]`` tile was at 58x.)

- ``_partial_kernel``: the terms ``[S, n]`` of ``R`` elements, one term row at a time, decomposed
  (``_tl_superacc.term_limbs``) into raw int64 limb sums (exact for ``CHUNK`` = 2**22 terms,
  contributions < 2**39), made canonical once per chunk; the specials counted. With few elements
  and many terms (a norm's gain: 128 elements, 8192 terms a step) the terms split over grid axis 1
  (:func:`_splits`) and ``_merge_kernel`` adds the splits' states: one serial chain per element was
  ~1 ms a call on the H100.
- ``_merge_kernel``: the ``K`` states of each element, each made canonical, added slot by slot,
  made canonical (the canonical form is unique per value, so this is the generic code's state).
- ``_accumulate_kernel``: the trainer's step per sequence unit, in place: each element's state
  loaded and made canonical, the terms added as in ``_partial_kernel``, the result stored over the
  state (4 bytes a term and 320 an element, against ``_partial_kernel`` then ``_merge_kernel`` of a
  stacked copy: 4 + 160 + 3 x 160 + the stack's 2 x 320).
- ``_total_kernel``: ``_partial_kernel``'s state kept in registers and rounded as ``_finish_kernel``
  rounds (``exact_sum_total``: 4 bytes a term and an element, where partial + finish move 320).
- ``_finish_kernel``: ``RN32`` of each state (the steps of ``_tl_superacc.round_state``: top three
  16-bit limbs and a sticky bit, ties to even, the P10 special rules).

Every sum is an integer sum and every element is independent, so the tiling cannot change a
bit. The scatter form of ``exact_sum_partial`` (``index``: embedding gradients) sorts the terms by
row on the device and runs ``_scatter_kernel``: one program per (row, element block) sums its row's
terms as ``_partial_kernel`` does (the device-generic code it replaced synchronised with the host at
every carry pass: ~8 ms of host time a trainer step on the H100).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from . import _tl_superacc as S
from ._common import LAUNCH, cdiv

#: state slots in memory (contract ``exact_sum``: 16 limbs, the carry limb, three special counts)
SLOTS = 20
#: terms folded into the state per normalisation (raw limb sums stay below 2**61)
CHUNK = 1 << 22
#: elements per program, warps (H200, tools/exp_accumulate.py: 32 / 1 at the bytes floor, 128 / 4 at 1.15x)
ROWS, WARPS = 32, 1
#: ``exact_sum_total`` of at most this many terms tries the fp64 sum first (``_total_kernel``'s FAST):
#: the trainer's weights hold one term per sequence unit (the LM head: 4 x 155 M in the 4 x 256-token
#: step), and the state path costs ~16 int64 operations a term and a canonical rounding an element
FAST_TERMS = 8
#: largest ``s * n`` / ``k * n * 20`` a launch forms (int32 when Triton specialises n as int32)
MAX_FLAT = (1 << 31) - 1
#: below this many programs (``n / R``) a partial sum splits its terms over grid axis 1 and merges the
#: splits' states (the norms' gains: 128-1024 elements, thousands of terms a step; one program per
#: 32 elements ran each element's terms in one serial chain: ~15 ms of a 4-layer trainer step on the H100)
SPLIT_PROGRAMS = 1024
#: fewest terms a split sums
SPLIT_MIN_TERMS = 16
#: test hook: 4 elements per program and a normalisation every 4 terms, so the chunk loop, the
#: masks and several programs run at small sizes
SMALL_TILES = False


@triton.jit
def _c(c, x):
    """One step of the carry ripple: ``(carry out, limb in [0, 2**16))`` of limb ``x`` plus carry ``c``
    (floor carries: an arithmetic shift)."""
    t = x + c
    return t >> 16, t & 0xFFFF


@triton.jit
def _normalize(l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16):
    """Canonical form of limbs 0..15 and the carry limb 16 (each an int64 ``[R]``, |limb| < 2**62):
    one exact floor-carry ripple from limb 0 up."""
    c, l0 = _c(0, l0)
    c, l1 = _c(c, l1)
    c, l2 = _c(c, l2)
    c, l3 = _c(c, l3)
    c, l4 = _c(c, l4)
    c, l5 = _c(c, l5)
    c, l6 = _c(c, l6)
    c, l7 = _c(c, l7)
    c, l8 = _c(c, l8)
    c, l9 = _c(c, l9)
    c, l10 = _c(c, l10)
    c, l11 = _c(c, l11)
    c, l12 = _c(c, l12)
    c, l13 = _c(c, l13)
    c, l14 = _c(c, l14)
    c, l15 = _c(c, l15)
    return l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16 + c


@triton.jit
def _eo(x, R: tl.constexpr, M: tl.constexpr):
    """``x [R, 2M]`` -> (columns 0, 2, 4, .., columns 1, 3, 5, ..), each ``[R, M]``."""
    return tl.split(tl.reshape(x, [R, M, 2]))


@triton.jit
def _pair(a, b, R: tl.constexpr, M: tl.constexpr):
    """The inverse of ``_eo``: ``[R, 2M]`` with a ``[R, M]`` in the even columns, b in the odd ones."""
    return tl.reshape(tl.join(a, b), [R, 2 * M])


@triton.jit
def _four(x, R: tl.constexpr):
    """``x [R, 4]`` holding slots r, r+8, r+16, r+24 -> those slots as ``[R]`` vectors."""
    a, b = _eo(x, R, 2)  # a: slots r, r+16 (columns 0, 2); b: r+8, r+24
    a0, a1 = _eo(a, R, 1)
    b0, b1 = _eo(b, R, 1)
    return tl.reshape(a0, [R]), tl.reshape(b0, [R]), tl.reshape(a1, [R]), tl.reshape(b1, [R])


@triton.jit
def _col(v, R: tl.constexpr):
    return tl.reshape(v, [R, 1])


@triton.jit
def _group(a, b, c, d, R: tl.constexpr):
    """Slots r, r+8, r+16, r+24 ``[R]`` -> ``[R, 4]`` in that column order (the inverse of ``_four``)."""
    return _pair(_pair(_col(a, R), _col(c, R), R, 1), _pair(_col(b, R), _col(d, R), R, 1), R, 2)


@triton.jit
def _tile(p, e, ok):
    """Pointers and mask of the states of elements ``e [R]`` as one ``[R, 32]`` tile (slots 20..31 masked)."""
    c = tl.arange(0, 32)
    return p + e[:, None] * 20 + c[None, :], ok[:, None] & (c < 20)[None, :]


@triton.jit
def _load_state(p, e, ok, R: tl.constexpr):
    """The 20 slots of the states of elements ``e [R]`` (int64 ``[n, 20]`` at ``p``), each ``[R]``.

    One coalesced ``[R, 32]`` tile load, its columns taken apart by even/odd splits (five levels).
    """
    ptrs, mask = _tile(p, e, ok)
    x = tl.load(ptrs, mask=mask, other=0)
    ev, od = _eo(x, R, 16)  # slots 2i, 2i+1
    ee, eo = _eo(ev, R, 8)  # 4i, 4i+2
    oe, oo = _eo(od, R, 8)  # 4i+1, 4i+3
    g0, g4 = _eo(ee, R, 4)  # 8i, 8i+4: [R, 4] each, holding slots r, r+8, r+16, r+24
    g2, g6 = _eo(eo, R, 4)
    g1, g5 = _eo(oe, R, 4)
    g3, g7 = _eo(oo, R, 4)
    s0, s8, s16, _u0 = _four(g0, R)
    s1, s9, s17, _u1 = _four(g1, R)
    s2, s10, s18, _u2 = _four(g2, R)
    s3, s11, s19, _u3 = _four(g3, R)
    s4, s12, _u4, _v4 = _four(g4, R)
    s5, s13, _u5, _v5 = _four(g5, R)
    s6, s14, _u6, _v6 = _four(g6, R)
    s7, s15, _u7, _v7 = _four(g7, R)
    return s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16, s17, s18, s19


@triton.jit
def _store_state(p, e, ok, R: tl.constexpr, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15,
                 l16, nan, pinf, ninf):
    """The 20 slots ``[R]`` of elements ``e`` stored as one coalesced ``[R, 32]`` tile (the inverse of
    ``_load_state``'s splits: joins)."""
    z = tl.zeros_like(l0)
    g0 = _group(l0, l8, l16, z, R)
    g1 = _group(l1, l9, nan, z, R)
    g2 = _group(l2, l10, pinf, z, R)
    g3 = _group(l3, l11, ninf, z, R)
    g4 = _group(l4, l12, z, z, R)
    g5 = _group(l5, l13, z, z, R)
    g6 = _group(l6, l14, z, z, R)
    g7 = _group(l7, l15, z, z, R)
    ev = _pair(_pair(g0, g4, R, 4), _pair(g2, g6, R, 4), R, 8)
    od = _pair(_pair(g1, g5, R, 4), _pair(g3, g7, R, 4), R, 8)
    ptrs, mask = _tile(p, e, ok)
    tl.store(ptrs, _pair(ev, od, R, 16), mask=mask)


@triton.jit
def _hit(limb, v, i):
    """``v`` where the term's limb index is ``i``, else 0."""
    return tl.where(limb == i, v, 0)


@triton.jit
def _add_terms(t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS: tl.constexpr, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11,
               l12, l13, l14, l15, l16, nan, pinf, ninf, rows_ptr=None, GATHER: tl.constexpr = False):
    """The limbs and counts plus the terms ``[S_TERMS, n]`` of elements ``e``: each term's signed limb
    contribution added to its limb (int64 sums, exact for ``CHUNK_TERMS`` terms, contributions
    < 2**39), the limbs made canonical once per chunk, the specials counted. ``GATHER``: term ``s``
    is row ``rows_ptr[s]`` of ``t_ptr`` (the scatter form's terms of one output row)."""
    for c0 in range(0, S_TERMS, CHUNK_TERMS):
        for s in range(c0, tl.minimum(c0 + CHUNK_TERMS, S_TERMS)):
            if GATHER:
                t = tl.load(t_ptr + tl.load(rows_ptr + s) * n + e, mask=ok, other=0.0)
            else:
                t = tl.load(t_ptr + s * n + e, mask=ok, other=0.0)
            limb, v = S.term_limbs(t)
            l0 += _hit(limb, v, 0)
            l1 += _hit(limb, v, 1)
            l2 += _hit(limb, v, 2)
            l3 += _hit(limb, v, 3)
            l4 += _hit(limb, v, 4)
            l5 += _hit(limb, v, 5)
            l6 += _hit(limb, v, 6)
            l7 += _hit(limb, v, 7)
            l8 += _hit(limb, v, 8)
            l9 += _hit(limb, v, 9)
            l10 += _hit(limb, v, 10)
            l11 += _hit(limb, v, 11)
            l12 += _hit(limb, v, 12)
            l13 += _hit(limb, v, 13)
            l14 += _hit(limb, v, 14)
            l15 += _hit(limb, v, 15)
            b = E.f32_bits(t)
            nan += ((b & 0x7FFFFFFF) > 0x7F800000).to(tl.int64)
            pinf += (b == 0x7F800000).to(tl.int64)
            ninf += (b == -8388608).to(tl.int64)  # 0xFF800000 as int32
        l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16 = _normalize(
            l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16)
    return l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf


@triton.jit
def _terms_state(t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS: tl.constexpr, R: tl.constexpr):
    """The canonical limbs and special counts of the terms ``[S_TERMS, n]`` of elements ``e``, from the
    empty state (:func:`_add_terms`)."""
    z = tl.zeros([R], tl.int64)
    l0, l1, l2, l3, l4, l5, l6, l7 = z, z, z, z, z, z, z, z
    l8, l9, l10, l11, l12, l13, l14, l15, l16 = z, z, z, z, z, z, z, z, z
    nan, pinf, ninf = z, z, z
    return _add_terms(t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11,
                      l12, l13, l14, l15, l16, nan, pinf, ninf)


@triton.jit
def _scatter_kernel(t_ptr, order_ptr, starts_ptr, counts_ptr, out_ptr, n, e0, CHUNK_TERMS: tl.constexpr,
                    R: tl.constexpr):
    """States of output row ``pid 0`` for ``R`` elements from ``e0``: the terms ``[S, n]`` (fp32) whose
    index is that row (``order[starts[row] : starts[row] + counts[row]]``, the terms sorted by row),
    summed as in ``_partial_kernel``, stored to ``out [rows, n, 20]`` (a row without terms: the empty
    state)."""
    row = tl.program_id(0).to(tl.int64)
    e = e0 + tl.program_id(1).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    count = tl.load(counts_ptr + row).to(tl.int32)
    z = tl.zeros([R], tl.int64)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _add_terms(
        t_ptr, count, n, e, ok, CHUNK_TERMS, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z,
        order_ptr + tl.load(starts_ptr + row), True)
    _store_state(out_ptr + row * n * 20, e, ok, R, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14,
                 l15, l16, nan, pinf, ninf)


@triton.jit
def _load_canonical(p, e, ok, R: tl.constexpr):
    """The states of elements ``e`` (int64 ``[n, 20]`` at ``p``): limbs 0..16 made canonical, then the
    three special counts."""
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _load_state(
        p, e, ok, R)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16 = _normalize(
        l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16)
    return l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf


@triton.jit
def _partial_kernel(t_ptr, out_ptr, S_TERMS, n, SPLIT_TERMS, CHUNK_TERMS: tl.constexpr, R: tl.constexpr):
    """States of ``R`` elements of the terms ``[S_TERMS, n]`` (fp32) summed over axis 0: each term's
    signed limb contribution added to its limb (int64 sums, exact for ``CHUNK_TERMS`` terms), the
    limbs made canonical once per chunk, the specials counted.

    Grid axis 1 splits the terms: program ``(i, j)`` sums terms ``[j * SPLIT_TERMS, (j + 1) *
    SPLIT_TERMS)`` into the states ``out[j]`` (``[n, 20]`` each; one split: ``SPLIT_TERMS = S_TERMS``)."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    j = tl.program_id(1)
    t_ptr += j.to(tl.int64) * SPLIT_TERMS * n
    out_ptr += j.to(tl.int64) * n * 20
    S_TERMS = tl.minimum(S_TERMS - j * SPLIT_TERMS, SPLIT_TERMS)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _terms_state(
        t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, R)
    _store_state(out_ptr, e, ok, R, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16,
                 nan, pinf, ninf)


@triton.jit
def _merge_kernel(s_ptr, out_ptr, K, n, R: tl.constexpr):
    """The canonical state of the ``K`` states ``[K, n, 20]`` of each of ``R`` elements: each state
    made canonical (as the generic code does), added slot by slot, made canonical."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    z = tl.zeros([R], tl.int64)
    l0, l1, l2, l3, l4, l5, l6, l7 = z, z, z, z, z, z, z, z
    l8, l9, l10, l11, l12, l13, l14, l15, l16 = z, z, z, z, z, z, z, z, z
    nan, pinf, ninf = z, z, z
    for k in range(0, K):
        p = s_ptr + k * (n * 20)
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, an, ap, am = _load_canonical(
            p, e, ok, R)
        l0 += a0
        l1 += a1
        l2 += a2
        l3 += a3
        l4 += a4
        l5 += a5
        l6 += a6
        l7 += a7
        l8 += a8
        l9 += a9
        l10 += a10
        l11 += a11
        l12 += a12
        l13 += a13
        l14 += a14
        l15 += a15
        l16 += a16
        nan += an
        pinf += ap
        ninf += am
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16 = _normalize(
        l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16)
    _store_state(out_ptr, e, ok, R, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16,
                 nan, pinf, ninf)


@triton.jit
def _accumulate_kernel(s_ptr, t_ptr, S_TERMS, n, CHUNK_TERMS: tl.constexpr, R: tl.constexpr):
    """The states ``[n, 20]`` of ``R`` elements plus the terms ``[S_TERMS, n]`` (fp32), in place: the
    state made canonical (as ``_merge_kernel`` does each of its states), each term's limb contribution
    added (exact for ``CHUNK_TERMS`` terms a chunk), made canonical per chunk, stored over the state."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    p = s_ptr
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _load_canonical(
        p, e, ok, R)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _add_terms(
        t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14,
        l15, l16, nan, pinf, ninf)
    _store_state(p, e, ok, R, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16,
                 nan, pinf, ninf)


@triton.jit
def _top(k, i, v):
    """``i`` where limb ``v`` is nonzero, else ``k`` (scanned from limb 0 up: the top nonzero limb)."""
    return tl.where(v != 0, i, k)


@triton.jit
def _at(k, i, v, acc):
    """``v`` where ``k == i``, else ``acc`` (limb ``k`` by a select chain)."""
    return tl.where(k == i, v, acc)


@triton.jit
def _below(lim, i, v, acc):
    """``acc`` or a nonzero limb ``v`` below limb ``lim`` (the sticky bit)."""
    return acc | ((v != 0) & (i < lim))


@triton.jit
def _finish_kernel(s_ptr, out_ptr, n, R: tl.constexpr):
    """``RN32`` of the states ``[n, 20]`` of ``R`` elements (fp32), made canonical, by :func:`_round`."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _load_canonical(
        s_ptr, e, ok, R)
    y = _round(l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf, R)
    tl.store(out_ptr + e, y, mask=ok)


@triton.jit
def _total_kernel(t_ptr, out_ptr, S_TERMS, n, CHUNK_TERMS: tl.constexpr, R: tl.constexpr, FAST: tl.constexpr):
    """``RN32`` of the exact sums of the terms ``[S_TERMS, n]`` (fp32) of ``R`` elements: the state
    built in registers as in ``_partial_kernel`` and rounded by :func:`_round`, never stored.

    ``FAST`` (few terms): first the terms are added in fp64 with the error of every addition
    (TwoSum: six fp64 additions, each one IEEE rounding); where every error of the block's elements
    is zero, each fp64 sum is the exact sum, and one fp64 -> fp32 rounding to nearest even is its
    ``RN32`` (a zero sum is +0, as the integer state gives: the sum starts at +0, and IEEE addition
    gives +0 for x + (-x) and for +0 + (-0)). A NaN or inf term makes an error NaN;
    a sum that is subnormal in fp32 or at least 2**127 is left to the state too. Any element of the
    block outside those cases sends the whole block through the state (the bits cannot differ: both
    ways are the exact sum rounded once)."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    if FAST:
        acc = tl.zeros([R], tl.float64)
        exact = tl.full([R], 1, tl.int1)
        for s in range(0, S_TERMS):
            x = tl.load(t_ptr + s * n + e, mask=ok, other=0.0).to(tl.float64)
            u = acc + x
            bp = u - acc
            err = (acc - (u - bp)) + (x - bp)
            exact = exact & (err == 0.0)
            acc = u
        mag = tl.abs(acc)
        fits = (acc == 0.0) | ((mag >= 1.1754943508222875e-38) & (mag < 1.7014118346046923e38))  # 2**-126, 2**127
        if tl.min((exact & fits).to(tl.int32), axis=0) == 1:
            tl.store(out_ptr + e, acc.to(tl.float32), mask=ok)
        else:
            _total_state(t_ptr, out_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, R)
    else:
        _total_state(t_ptr, out_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, R)


@triton.jit
def _total_state(t_ptr, out_ptr, S_TERMS, n, e, ok, CHUNK_TERMS: tl.constexpr, R: tl.constexpr):
    """``_total_kernel``'s state path: the canonical state of elements ``e`` in registers, rounded by :func:`_round`."""
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _terms_state(
        t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, R)
    y = _round(l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf, R)
    tl.store(out_ptr + e, y, mask=ok)


@triton.jit
def _round(l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf,
           R: tl.constexpr):
    """``RN32`` of canonical limbs and special counts (fp32 ``[R]``): the magnitude made canonical
    (its sign from the carry limb), the top three nonzero 16-bit limbs of limbs 0..19 (16..19 are the
    carry limb's four 16-bit pieces) and a sticky bit for every nonzero limb below, one RNE rounding
    to 24 bits, the P10 special rules from the counts (as ``_tl_superacc.round_state``)."""
    neg = l16 < 0
    m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, m16 = _normalize(
        -l0, -l1, -l2, -l3, -l4, -l5, -l6, -l7, -l8, -l9, -l10, -l11, -l12, -l13, -l14, -l15, -l16)
    l0 = tl.where(neg, m0, l0)
    l1 = tl.where(neg, m1, l1)
    l2 = tl.where(neg, m2, l2)
    l3 = tl.where(neg, m3, l3)
    l4 = tl.where(neg, m4, l4)
    l5 = tl.where(neg, m5, l5)
    l6 = tl.where(neg, m6, l6)
    l7 = tl.where(neg, m7, l7)
    l8 = tl.where(neg, m8, l8)
    l9 = tl.where(neg, m9, l9)
    l10 = tl.where(neg, m10, l10)
    l11 = tl.where(neg, m11, l11)
    l12 = tl.where(neg, m12, l12)
    l13 = tl.where(neg, m13, l13)
    l14 = tl.where(neg, m14, l14)
    l15 = tl.where(neg, m15, l15)
    top = tl.where(neg, m16, l16)  # the magnitude's carry limb, in [0, 2**62): limbs 16..19
    l16 = top & 0xFFFF
    l17 = (top >> 16) & 0xFFFF
    l18 = (top >> 32) & 0xFFFF
    l19 = (top >> 48) & 0xFFFF
    k = tl.full([R], -1, tl.int32)
    k = _top(k, 0, l0)
    k = _top(k, 1, l1)
    k = _top(k, 2, l2)
    k = _top(k, 3, l3)
    k = _top(k, 4, l4)
    k = _top(k, 5, l5)
    k = _top(k, 6, l6)
    k = _top(k, 7, l7)
    k = _top(k, 8, l8)
    k = _top(k, 9, l9)
    k = _top(k, 10, l10)
    k = _top(k, 11, l11)
    k = _top(k, 12, l12)
    k = _top(k, 13, l13)
    k = _top(k, 14, l14)
    k = _top(k, 15, l15)
    k = _top(k, 16, l16)
    k = _top(k, 17, l17)
    k = _top(k, 18, l18)
    k = _top(k, 19, l19)
    zero = k < 0
    kk = tl.maximum(k, 0)
    h2 = _limb_at(kk, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18, l19)
    h1 = _limb_at(kk - 1, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18, l19)
    h0 = _limb_at(kk - 2, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18, l19)
    lim = kk - 2
    st = tl.zeros([R], tl.int1)
    st = _below(lim, 0, l0, st)
    st = _below(lim, 1, l1, st)
    st = _below(lim, 2, l2, st)
    st = _below(lim, 3, l3, st)
    st = _below(lim, 4, l4, st)
    st = _below(lim, 5, l5, st)
    st = _below(lim, 6, l6, st)
    st = _below(lim, 7, l7, st)
    st = _below(lim, 8, l8, st)
    st = _below(lim, 9, l9, st)
    st = _below(lim, 10, l10, st)
    st = _below(lim, 11, l11, st)
    st = _below(lim, 12, l12, st)
    st = _below(lim, 13, l13, st)
    st = _below(lim, 14, l14, st)
    st = _below(lim, 15, l15, st)
    st = _below(lim, 16, l16, st)
    st = _below(lim, 17, l17, st)
    head = (h2 << 32) | (h1 << 16) | h0
    head = tl.where(zero, 4294967296, head)  # harmless stand-in (2**32) for a zero sum
    drop = E.bit_length_i64(head) - 24  # >= 9
    q = head >> drop
    rem = head - (q << drop)
    half = tl.full(drop.shape, 1, tl.int64) << (drop - 1)
    up = (rem > half) | ((rem == half) & (st | ((q & 1) == 1)))
    q = q + up.to(tl.int64)  # <= 2**24: exact in fp32
    scale = drop + 16 * (kk.to(tl.int64) - 2) - 149
    overflow = E.bit_length_i64(q) + scale > 128
    scale = tl.where(overflow, 0, scale).to(tl.int32)
    a = scale >> 1  # both halves in [-86, 52]: normal powers of two
    mag = (q.to(tl.int32).to(tl.float32) * E.pow2_f32(a)) * E.pow2_f32(scale - a)
    mag = tl.where(overflow, float("inf"), mag)
    mag = tl.where(zero, 0.0, mag)
    y = tl.where(neg, -mag, mag)
    y = tl.where(pinf > 0, float("inf"), y)
    y = tl.where(ninf > 0, float("-inf"), y)
    return tl.where((nan > 0) | ((pinf > 0) & (ninf > 0)), E.canonical_nan_f32(y), y)


@triton.jit
def _limb_at(k, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18, l19):
    """Limb ``k`` of the twenty (0 for k < 0)."""
    v = tl.zeros(l0.shape, tl.int64)
    v = _at(k, 0, l0, v)
    v = _at(k, 1, l1, v)
    v = _at(k, 2, l2, v)
    v = _at(k, 3, l3, v)
    v = _at(k, 4, l4, v)
    v = _at(k, 5, l5, v)
    v = _at(k, 6, l6, v)
    v = _at(k, 7, l7, v)
    v = _at(k, 8, l8, v)
    v = _at(k, 9, l9, v)
    v = _at(k, 10, l10, v)
    v = _at(k, 11, l11, v)
    v = _at(k, 12, l12, v)
    v = _at(k, 13, l13, v)
    v = _at(k, 14, l14, v)
    v = _at(k, 15, l15, v)
    v = _at(k, 16, l16, v)
    v = _at(k, 17, l17, v)
    v = _at(k, 18, l18, v)
    return _at(k, 19, l19, v)


# ----------------------------------------------------------------------------- host side


def _tiles() -> tuple[int, int]:
    """(elements per program, terms per normalisation)."""
    return (4, 4) if SMALL_TILES else (ROWS, CHUNK)


def _blocks(op: str, n: int, per_element: int) -> list[tuple[int, int]]:
    """Element ranges ``[e0, e1)`` of one launch each: the kernels form ``s * n`` (partial) and
    ``k * n * 20`` (merge) in 32-bit arithmetic when Triton specialises ``n`` as int32, so a launch
    keeps ``(e1 - e0) * per_element`` within ``MAX_FLAT`` (one range when all of ``n`` fits; the
    interpreter's small tiles use a limit of 512 so that the blocked path runs there too)."""
    limit = 512 if SMALL_TILES else MAX_FLAT
    if per_element > limit:
        raise ValueError(f"{op}: {per_element} int32-indexed entries per element exceed {limit}; "
                         f"split the call (fewer terms or states at a time)")
    if n * per_element <= limit:
        return [(0, n)]
    step = limit // per_element
    return [(e0, min(n, e0 + step)) for e0 in range(0, n, step)]


def _splits(n: int, s: int) -> int:
    """Term splits of a partial sum over ``s`` terms of ``n`` elements: 1 when the element programs fill
    the device, else up to ~sqrt(s) (each program sums s / splits terms, then one merge program per
    element tile adds the splits' states: its chain is ~splits long), within ``SPLIT_PROGRAMS``."""
    programs = cdiv(n, _tiles()[0])
    if programs >= SPLIT_PROGRAMS or s < 2 * SPLIT_MIN_TERMS:
        return 1
    return max(1, min(cdiv(s, SPLIT_MIN_TERMS), math.isqrt(s), SPLIT_PROGRAMS // programs))


def _partial_launch(t: torch.Tensor, out: torch.Tensor, n: int, splits: int) -> None:
    """``out[j]`` (int64 ``[splits, n, 20]``, or ``[n, 20]`` for one split) = the states of the terms
    ``t [S, n]`` (contiguous fp32) of split ``j``, in element blocks within the int32 limits."""
    r, chunk = _tiles()
    per = cdiv(t.shape[0], splits)
    blocks = _blocks("exact_sum_partial", n, t.shape[0])
    o = out.view(splits, n, SLOTS)
    for e0, e1 in blocks:
        tb = t if len(blocks) == 1 else t[:, e0:e1].contiguous()
        ob = o if len(blocks) == 1 else torch.empty((splits, e1 - e0, SLOTS), dtype=torch.int64, device=t.device)
        _partial_kernel[(cdiv(e1 - e0, r), splits)](tb, ob, t.shape[0], e1 - e0, per, CHUNK_TERMS=chunk, R=r,
                                                    num_warps=WARPS, **LAUNCH)
        if ob is not o:
            o[:, e0:e1] = ob


#: element blocks of one scatter launch (grid axis 1 holds at most 65535 programs)
SCATTER_MAX_BLOCKS = 65535


def _scatter(terms: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The scatter form: the terms sorted by their row on the device (no host sync), then one program
    per (row, element block) sums its row's terms (``_scatter_kernel``)."""
    rest = tuple(terms.shape[1:])
    out = torch.empty((num_rows, *rest, SLOTS), dtype=torch.int64, device=terms.device)
    n = out[0].numel() // SLOTS if num_rows else 0
    if num_rows == 0 or n == 0:
        return out.zero_()
    t = terms.to(torch.float32).contiguous().reshape(terms.shape[0], n)
    idx = index.to(torch.int64)
    order = torch.argsort(idx)  # any order of a row's terms: integer sums
    # terms per row (torch.bincount would read the largest index back to the host)
    counts = torch.zeros(num_rows, dtype=torch.int64, device=idx.device).scatter_add_(0, idx, torch.ones_like(idx))
    starts = torch.cumsum(counts, 0) - counts
    r, chunk = _tiles()
    step = SCATTER_MAX_BLOCKS * r
    for e0 in range(0, n, step):
        _scatter_kernel[(num_rows, cdiv(min(n - e0, step), r))](t, order, starts, counts, out, n, e0,
                                                              CHUNK_TERMS=chunk, R=r, num_warps=WARPS, **LAUNCH)
    return out


def exact_sum_partial(terms: torch.Tensor, index: torch.Tensor | None = None,
                      num_rows: int | None = None) -> torch.Tensor:
    """Kernel ``exact_sum_partial``: canonical int64 states ``[*E, 20]`` of the fp32 terms ``[S, *E]``
    summed over axis 0 (with ``index``: the scatter form, ``[num_rows, *E, 20]``)."""
    if index is not None:
        assert num_rows is not None
        return _scatter(terms, index, num_rows)
    rest = tuple(terms.shape[1:])
    out = torch.empty((*rest, SLOTS), dtype=torch.int64, device=terms.device)
    n = out.numel() // SLOTS
    if n == 0:
        return out
    t = terms.to(torch.float32).contiguous().reshape(terms.shape[0], n)
    splits = _splits(n, t.shape[0])
    if splits == 1:
        _partial_launch(t, out, n, 1)
        return out
    parts = torch.empty((splits, n, SLOTS), dtype=torch.int64, device=t.device)
    _partial_launch(t, parts, n, splits)
    _merge_launch(parts, out.view(n, SLOTS), n)
    return out


def exact_sum_merge(states: torch.Tensor) -> torch.Tensor:
    """Kernel ``exact_sum_merge``: the canonical state ``[*E, 20]`` of the union of ``states [K, *E, 20]``."""
    out = torch.empty(states.shape[1:], dtype=torch.int64, device=states.device)
    n = out.numel() // SLOTS
    if n == 0:
        return out
    if states.shape[0] == 0:
        return out.zero_()
    _merge_launch(states.contiguous().reshape(states.shape[0], n, SLOTS), out.view(n, SLOTS), n)
    return out


def _merge_launch(s: torch.Tensor, o: torch.Tensor, n: int) -> None:
    """``o`` (int64 ``[n, 20]``) = the canonical state of the ``K`` states ``s [K, n, 20]`` (contiguous)."""
    r = _tiles()[0]
    blocks = _blocks("exact_sum_merge", n, s.shape[0] * SLOTS)
    for e0, e1 in blocks:
        sb = s if len(blocks) == 1 else s[:, e0:e1].contiguous()
        _merge_kernel[(cdiv(e1 - e0, r),)](sb, o[e0:e1], s.shape[0], e1 - e0, R=r, num_warps=WARPS, **LAUNCH)


def exact_sum_finish(states: torch.Tensor) -> torch.Tensor:
    """Kernel ``exact_sum_finish``: fp32 ``states.shape[:-1]``, ``RN32`` of each state's exact sum."""
    out = torch.empty(states.shape[:-1], dtype=torch.float32, device=states.device)
    n = out.numel()
    if n == 0:
        return out
    s = states.contiguous()
    r = _tiles()[0]
    _finish_kernel[(cdiv(n, r),)](s, out, n, R=r, num_warps=WARPS, **LAUNCH)
    return out


def exact_sum_total(terms: torch.Tensor) -> torch.Tensor:
    """Kernel ``exact_sum_total``: fp32 ``terms.shape[1:]``, ``RN32`` of the exact sums of the terms
    ``[S, *E]`` over axis 0 (one kernel: no state in memory; few elements and many terms: the split
    partial states, merged and finished, all ``[n, 20]``)."""
    rest = tuple(terms.shape[1:])
    out = torch.empty(rest, dtype=torch.float32, device=terms.device)
    n = out.numel()
    if n == 0:
        return out
    t = terms.to(torch.float32).contiguous().reshape(terms.shape[0], n)
    if _splits(n, t.shape[0]) > 1:
        return exact_sum_finish(exact_sum_partial(t)).view(rest)
    o = out.view(n)
    r, chunk = _tiles()
    blocks = _blocks("exact_sum_total", n, t.shape[0])
    for e0, e1 in blocks:
        tb = t if len(blocks) == 1 else t[:, e0:e1].contiguous()
        _total_kernel[(cdiv(e1 - e0, r),)](tb, o[e0:e1], t.shape[0], e1 - e0, CHUNK_TERMS=chunk, R=r,
                                           FAST=t.shape[0] <= FAST_TERMS, num_warps=WARPS, **LAUNCH)
    return out


def exact_sum_accumulate(state: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """Kernel ``exact_sum_accumulate``: ``state [*E, 20]`` plus the fp32 terms ``[S, *E]``, canonical,
    in place (a strided state is worked on in a contiguous copy, which is returned)."""
    n = state.numel() // SLOTS
    if n == 0:
        return state
    in_place = state.is_contiguous()
    st = state if in_place else state.contiguous()
    o = st.view(n, SLOTS)
    t = terms.to(torch.float32).contiguous().reshape(terms.shape[0], n)
    splits = _splits(n, t.shape[0])
    if splits > 1:  # few elements, many terms: the splits' states and the state merged (all [n, 20]: small)
        parts = torch.empty((splits + 1, n, SLOTS), dtype=torch.int64, device=t.device)
        parts[0] = o
        _partial_launch(t, parts[1:], n, splits)
        _merge_launch(parts, o, n)
        return st
    r, chunk = _tiles()
    blocks = _blocks("exact_sum_accumulate", n, max(t.shape[0], 1))
    for e0, e1 in blocks:
        tb = t if len(blocks) == 1 else t[:, e0:e1].contiguous()
        _accumulate_kernel[(cdiv(e1 - e0, r),)](o[e0:e1], tb, t.shape[0], e1 - e0, CHUNK_TERMS=chunk, R=r,
                                                num_warps=WARPS, **LAUNCH)
    return st


def static_specs(target):
    return [
        ("exact_sum_partial", "fp32_terms", _partial_kernel,
         {"t_ptr": "*fp32", "out_ptr": "*i64", "S_TERMS": "i32", "n": "i64", "SPLIT_TERMS": "i32",
          "CHUNK_TERMS": "constexpr", "R": "constexpr"},
         {"CHUNK_TERMS": CHUNK, "R": ROWS}, {"num_warps": WARPS}),
        ("exact_sum_partial", "fp32_terms_scatter", _scatter_kernel,
         {"t_ptr": "*fp32", "order_ptr": "*i64", "starts_ptr": "*i64", "counts_ptr": "*i64", "out_ptr": "*i64",
          "n": "i64", "e0": "i64", "CHUNK_TERMS": "constexpr", "R": "constexpr"},
         {"CHUNK_TERMS": CHUNK, "R": ROWS}, {"num_warps": WARPS}),
        ("exact_sum_merge", "states", _merge_kernel,
         {"s_ptr": "*i64", "out_ptr": "*i64", "K": "i32", "n": "i64", "R": "constexpr"},
         {"R": ROWS}, {"num_warps": WARPS}),
        ("exact_sum_accumulate", "state_fp32_terms", _accumulate_kernel,
         {"s_ptr": "*i64", "t_ptr": "*fp32", "S_TERMS": "i32", "n": "i64", "CHUNK_TERMS": "constexpr",
          "R": "constexpr"},
         {"CHUNK_TERMS": CHUNK, "R": ROWS}, {"num_warps": WARPS}),
        ("exact_sum_finish", "states", _finish_kernel,
         {"s_ptr": "*i64", "out_ptr": "*fp32", "n": "i64", "R": "constexpr"},
         {"R": ROWS}, {"num_warps": WARPS}),
    ] + [
        ("exact_sum_total", f"fp32_terms{'_fp64_first' if fast else ''}", _total_kernel,
         {"t_ptr": "*fp32", "out_ptr": "*fp32", "S_TERMS": "i32", "n": "i64", "CHUNK_TERMS": "constexpr",
          "R": "constexpr", "FAST": "constexpr"},
         {"CHUNK_TERMS": CHUNK, "R": ROWS, "FAST": fast}, {"num_warps": WARPS}) for fast in (False, True)
    ]
