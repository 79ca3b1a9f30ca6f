"""Triton device functions of the exact superaccumulator (docs/numerics.md P10), R1 operations only.

A finite fp32 ``t = ±m * 2**(b - 150)`` (m the 24-bit significand, b = max(biased exponent, 1))
adds ``±(m << ((b - 1) & 15))`` to limb ``(b - 1) >> 4`` (limb i weighs ``2**(16 i - 149)``).
A state lives in registers as an int64 ``[R, 32]`` tensor, one row per sum, in the slot layout
of the generic implementation (``rlkernel.backends.generic._exact.superacc``): slots 0..15 the
limbs, 16 the carry limb (weight ``2**107``), 17/18/19 the counts of NaN, +inf and -inf terms,
20 a count where the op has one, 21..31 unused (zero). Every sum is an integer sum, so the order
``tl.sum`` picks, the tiling and the int64 ``atomic_add`` merge across programs cannot change a
bit; a state is made canonical (limbs 0..15 in [0, 2**16), floor carries) by one exact carry
ripple, and rounded once to fp32 (top three 16-bit limbs + sticky, ties to even) as the generic
``finish`` does.

Bounds: raw limb sums are exact for up to 2**23 terms (contributions < 2**39); the launchers
keep each program's raw sums below that, normalise them before the atomic merge, so the
merged limbs stay below 2**16 times the number of programs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import _tl_exact as E

#: width of a state row in registers (power of two >= 21 slots)
WIDTH = 32
#: slots of the layout (same as the generic superacc + the masked-mean count)
CARRY, NAN, POS_INF, NEG_INF, COUNT = 16, 17, 18, 19, 20
#: raw int64 limb sums stay exact for this many terms per program
BLOCK_TERMS = 1 << 23


@triton.jit
def term_limbs(t):
    """P10 decomposition of fp32 ``t`` (any shape): (limb index int32, signed int64 contribution);
    both 0 for NaN and infinities."""
    b = E.f32_bits(t)
    biased = (b >> 23) & 0xFF
    finite = biased != 0xFF
    m = ((b & 0x7FFFFF) | tl.where(biased > 0, 0x800000, 0)).to(tl.int64)
    e = tl.maximum(biased, 1) - 1
    v = m << (e & 15).to(tl.int64)
    v = tl.where(b < 0, -v, v)
    return tl.where(finite, e >> 4, 0), tl.where(finite, v, 0)


@triton.jit
def raw_limbs(t, valid):
    """Raw int64 limb sums ``[R, 16]`` of the fp32 terms ``t [R, C]`` where ``valid`` (exact: at most
    2**23 terms per row)."""
    limb, v = term_limbs(t)
    v = tl.where(valid, v, 0)
    i16 = tl.arange(0, 16)
    hit = limb[:, :, None] == i16[None, None, :]
    return tl.sum(tl.where(hit, v[:, :, None], 0), axis=1)


@triton.jit
def special_counts(t, valid):
    """int64 ``[R]`` counts of NaN, +inf and -inf among the valid terms of ``t [R, C]``."""
    b = E.f32_bits(t)
    nan = valid & ((b & 0x7FFFFFFF) > 0x7F800000)
    pinf = valid & (b == 0x7F800000)
    ninf = valid & (b == -8388608)  # 0xFF800000 as int32
    return (tl.sum(nan.to(tl.int64), axis=1), tl.sum(pinf.to(tl.int64), axis=1),
            tl.sum(ninf.to(tl.int64), axis=1))


@triton.jit
def widen(r16):
    """Limb sums ``[R, 16]`` as a state ``[R, 32]`` (slots 16..31 zero)."""
    i16 = tl.arange(0, 16)
    i32 = tl.arange(0, 32)
    return tl.sum(tl.where(i32[None, :, None] == i16[None, None, :], r16[:, None, :], 0), axis=2)


@triton.jit
def col(x, i):
    """Slot ``i`` (a Python int or int32 ``[R]``) of each row of ``x [R, 32]``: ``[R]``."""
    idx = tl.arange(0, 32)[None, :]
    return tl.sum(tl.where(idx == i, x, 0), axis=1)


@triton.jit
def put(x, i, value):
    """``x`` with slot ``i`` (Python int) of every row set to ``value [R]``."""
    idx = tl.arange(0, 32)[None, :]
    return tl.where(idx == i, value[:, None], x)


@triton.jit
def normalize(x):
    """Canonical form of slots 0..16 of ``x [R, 32]`` (one exact floor-carry ripple from limb 0 up;
    |slot| < 2**62); the other slots unchanged."""
    idx = tl.arange(0, 32)[None, :]
    c = col(x, 0) * 0
    out = x
    for i in tl.static_range(16):
        t = col(x, i) + c
        out = tl.where(idx == i, (t & 0xFFFF)[:, None], out)
        c = t >> 16
    return tl.where(idx == 16, (col(x, 16) + c)[:, None], out)


@triton.jit
def round_state(x, nan, pinf, ninf):
    """fp32 ``[R]``: ``RN32(V * 2**-149)`` of slots 0..16 of ``x [R, 32]`` (canonical or not), with
    the P10 special rules from the counts ``nan, pinf, ninf [R]``: NaN if any NaN or both
    infinities, else the infinity; overflow to ±inf; a zero sum is +0."""
    idx = tl.arange(0, 32)[None, :]
    x = normalize(tl.where(idx < 17, x, 0))
    neg = col(x, 16) < 0
    x = tl.where(neg[:, None], normalize(-x), x)  # the magnitude, canonical
    top = col(x, 16)  # in [0, 2**62): four more 16-bit limbs 16..19
    sh = (tl.minimum(tl.maximum(idx - 16, 0), 3) * 16).to(tl.int64)
    ext = (top[:, None] >> sh) & 0xFFFF
    limbs = tl.where(idx < 16, x, tl.where(idx < 20, ext, 0))
    nz = limbs != 0
    k = tl.max(tl.where(nz, idx, -1), axis=1)  # top nonzero limb, -1 for V = 0
    zero = k < 0
    kk = tl.maximum(k, 0)
    h2 = col(limbs, kk[:, None])
    h1 = col(limbs, kk[:, None] - 1)
    h0 = col(limbs, kk[:, None] - 2)
    sticky = tl.max(tl.where(nz & (idx < kk[:, None] - 2), 1, 0), axis=1) > 0
    head = (h2 << 32) | (h1 << 16) | h0
    head = tl.where(zero, 4294967296, head)  # harmless stand-in (2**32) for V = 0
    drop = E.bit_length_i64(head) - 24  # >= 9
    q = head >> drop
    rem = head - (q << drop)
    half = tl.full(drop.shape, 1, tl.int64) << (drop - 1)
    up = (rem > half) | ((rem == half) & (sticky | ((q & 1) == 1)))
    q = q + up.to(tl.int64)  # <= 2**24: exact in fp32
    scale = drop + 16 * (kk.to(tl.int64) - 2) - 149
    overflow = E.bit_length_i64(q) + scale > 128
    scale = tl.where(overflow, 0, scale).to(tl.int32)
    a = scale >> 1  # both halves in [-86, 52]: normal powers of two
    mag = (q.to(tl.int32).to(tl.float32) * E.pow2_f32(a)) * E.pow2_f32(scale - a)
    mag = tl.where(overflow, float("inf"), mag)
    mag = tl.where(zero, 0.0, mag)
    out = tl.where(neg, -mag, mag)
    out = tl.where(pinf > 0, float("inf"), out)
    out = tl.where(ninf > 0, float("-inf"), out)
    return tl.where((nan > 0) | ((pinf > 0) & (ninf > 0)), E.canonical_nan_f32(out), out)


@triton.jit
def state_row(r16, nan, pinf, ninf, count):
    """One program's merged state ``[1, 32]``: the rows' raw limb sums ``[R, 16]`` and counts
    ``[R]`` added, normalised (bounded for the atomic merge), specials and count in their slots."""
    idx = tl.arange(0, 32)[None, :]
    x = normalize(widen(tl.sum(r16, axis=0)[None, :]))
    x = tl.where(idx == 17, tl.sum(nan, axis=0), x)
    x = tl.where(idx == 18, tl.sum(pinf, axis=0), x)
    x = tl.where(idx == 19, tl.sum(ninf, axis=0), x)
    return tl.where(idx == 20, tl.sum(count, axis=0), x)


@triton.jit
def atomic_merge(buf_ptr, x):
    """Add a state ``[1, 32]`` (slots 0..20) into the int64 global state at ``buf_ptr`` (integer
    atomics: exact in any order)."""
    idx = tl.arange(0, 32)[None, :]
    tl.atomic_add(buf_ptr + idx, x, mask=idx < 21, sem="relaxed")


__all__ = ["BLOCK_TERMS", "WIDTH", "atomic_merge", "col", "normalize", "put", "raw_limbs", "round_state",
           "special_counts", "state_row", "term_limbs", "widen"]
