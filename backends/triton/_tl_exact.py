"""Triton device functions for the exact primitives (docs/numerics.md P1-P8), R1 operations only.

Every function here is ``@triton.jit`` and is inlined into the op kernels. The rules they keep
(docs/numerics.md R1-R6) and the static checks of ``static_checks.py`` enforce:

- fp32 arithmetic is ``+ - *`` (``add.f32``/``mul.f32``, round to nearest even) and
  ``tl.math.div_rn`` / ``tl.math.sqrt_rn``; never ``/`` on floats (``div.full``), never
  ``tl.exp``/``tl.log``/libdevice. Every launch passes ``enable_fp_fusion=False``.
- Exponents, powers of two and roundings to integers are built from the bits
  (``x.to(tl.int32, bitcast=True)``), so the interpreter and every GPU agree.
- Sums are integer sums on a fixed grid (P4); the order ``tl.sum`` picks cannot change a bit.

Kept independent of ``rlkernel.contracts`` (import-linter): these are a second implementation
of the definitions, and the conformance suite compares them bit for bit.
"""

from __future__ import annotations

import os
import struct

import triton
import triton.language as tl

from rlkernel.backends.generic._exact import transcendental as _GT

#: fraction bits of max-grid and probability sums (P4)
F_SUM = 40
#: magnitude bits of the linear grid (P5): |X| <= 2**20
GRID = 20
#: canonical NaN bit patterns (P8)
NAN_F32 = 0x7FC00000
NAN_BF16 = 0x7FC0
NAN_F16 = 0x7E00
GRID_C = tl.constexpr(GRID)


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# --------------------------------------------------------------------------------------------
# bits and exponents (P1)
# --------------------------------------------------------------------------------------------


@triton.jit
def f32_bits(x):
    """The fp32 bit pattern as int32."""
    return x.to(tl.float32).to(tl.int32, bitcast=True)


@triton.jit
def f32_from_bits(b):
    return b.to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def canonical_nan_f32(x):
    """A tensor of the canonical fp32 NaN (0x7FC00000) shaped like ``x``."""
    return tl.full(x.shape, 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def abs_bits(x):
    """``|x|`` as its int32 bit pattern (monotone in |x| for non-NaN values)."""
    return f32_bits(x) & 0x7FFFFFFF


@triton.jit
def is_nan(x):
    return abs_bits(x) > 0x7F800000


@triton.jit
def is_finite(x):
    return abs_bits(x) < 0x7F800000


@triton.jit
def expo_from_abs_bits(a):
    """P1 from a magnitude bit pattern ``a`` (int32, finite): e with 2**(e-1) <= |x| < 2**e; 0 for 0."""
    biased = a >> 23
    mant = a & 0x7FFFFF
    # subnormal: bit length of the mantissa, read from its exact (< 2**24) fp32 conversion
    mant_len = (f32_bits(mant.to(tl.float32)) >> 23) - 126
    e = tl.where(biased == 0, mant_len - 149, biased - 126)
    return tl.where(a == 0, 0, e)


@triton.jit
def expo_f32(x):
    """P1 for finite fp32 ``x`` (int32)."""
    return expo_from_abs_bits(abs_bits(x))


@triton.jit
def pow2_f32(k):
    """fp32 ``2**k`` for int32 k in [-126, 127], built from the exponent bits."""
    return ((k.to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def ldexp_c(y, k):
    """P2: ``RN32(RN32(y * 2**a) * 2**(k - a))``, ``a = floor(k / 2)``; y fp32, k int32, |k| <= 252."""
    k = tl.zeros(y.shape, tl.int32) + k  # k may be a Python int
    a = k >> 1  # arithmetic shift: floor division by 2
    return (y * pow2_f32(a)) * pow2_f32(k - a)


# --------------------------------------------------------------------------------------------
# int64 -> fp32 in one rounding (P3)
# --------------------------------------------------------------------------------------------


@triton.jit
def bit_length_i64(mag):
    """Bit length of non-negative int64 ``mag`` (0 for 0).

    Read from the exponent of any fp32 conversion of ``mag`` (a conversion that rounds up can
    only overshoot by one, which the shift test corrects), so it is exact however the
    conversion rounds.
    """
    e = ((f32_bits(mag.to(tl.float32)) >> 23) - 126).to(tl.int64)
    e = tl.where(mag == 0, 0, e)
    over = (e > 0) & ((mag >> tl.maximum(e - 1, 0)) == 0)
    return tl.where(over, e - 1, e)


@triton.jit
def int64_to_f32(s):
    """P3: round int64 ``s`` to fp32, nearest-even, in integer arithmetic (|s| < 2**63)."""
    s = s.to(tl.int64)
    neg = s < 0
    mag = tl.where(neg, -s, s)
    drop = tl.maximum(bit_length_i64(mag) - 24, 0)
    q = mag >> drop
    rem = mag - (q << drop)
    half = tl.where(drop > 0, tl.full(drop.shape, 1, tl.int64) << tl.maximum(drop - 1, 0), 0)
    up = (drop > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    q = q + up.to(tl.int64)  # q <= 2**24: exact in fp32
    out = q.to(tl.int32).to(tl.float32) * pow2_f32(drop.to(tl.int32))  # drop <= 39: exact scaling
    return tl.where(neg, -out, out)


@triton.jit
def ro53(mag):
    """Non-negative int64 ``mag`` (< 2**63) rounded to odd at 53 bits, as fp64 (exact below 2**53).

    Round-to-odd keeps what a later nearest-even rounding needs: ``RN_p(RO_q(v)) = RN_p(v)`` for
    ``q >= p + 2``. ``mag = hi * 2**32 + lo`` is converted by halves (both exact in fp64) and one
    addition (its single rounding: nearest-even); the rounding error is read exactly from ``d -
    hi * 2**32`` (Sterbenz: ``d`` lies within a factor two of ``hi * 2**32`` when ``hi >= 1``; ``d =
    lo`` when ``hi = 0``) against ``lo``; the result is moved one ulp toward zero where the addition
    went up and gets its last bit set where it was inexact. No 64-bit integer <-> float conversion:
    AMD GPUs have none, and their compiler's expansion of one uses fused multiply-adds that the
    static checks refuse.
    """
    hf = (mag >> 32).to(tl.int32).to(tl.float64) * 4294967296.0
    lf = (mag & 4294967295).to(tl.uint32).to(tl.float64)
    d = hf + lf
    r = d - hf
    odd = (d.to(tl.int64, bitcast=True) - (r > lf).to(tl.int64)) | (r != lf).to(tl.int64)
    return odd.to(tl.float64, bitcast=True)


@triton.jit
def f64_to_out(y, OUT: tl.constexpr):
    """fp64 ``y >= 0``, rounded to odd at 53 bits or exact, rounded to nearest-even in the output
    format ``OUT`` (0 fp32, 1 bf16, 2 fp16; subnormals and overflow to +inf included), returned
    as the fp32 holding that value: the hardware's conversion for fp32; for bf16 / fp16 a round
    to odd at fp32's 24 bits (the conversion, then one ulp toward zero where it went up and the
    last bit set where it was inexact), then the format's nearest-even rounding."""
    f = y.to(tl.float32)
    if OUT != 0:
        fd = f.to(tl.float64)
        f = f32_from_bits((f32_bits(f) - (fd > y).to(tl.int32)) | (fd != y).to(tl.int32))
        if OUT == 1:
            f = bf16_round(f)
        else:
            f = f.to(tl.float16).to(tl.float32)
    return f


@triton.jit
def int64_to_out(s, k, OUT: tl.constexpr):
    """P3': ``s * 2**k`` (int64 s, |s| < 2**63; int32/int64 k) rounded once, nearest-even, to the
    output format ``OUT`` (0 fp32, 1 bf16, 2 fp16), returned as the fp32 holding that value.

    ``|s|`` rounded to odd at 53 bits (:func:`ro53`), scaled exactly by ``2**k`` in fp64 (``k``
    clamped to [-1000, 1000]: below, every such value rounds to +-0 and above, to +-inf, in every
    output format), then rounded once to the format (:func:`f64_to_out`). Zero gives +0; a
    negative value that rounds to zero gives -0.
    """
    return int64_scaled_to_out(s, pow2_f64(tl.minimum(tl.maximum(k, -1000), 1000).to(tl.int32)), 1.0, OUT)


@triton.jit
def int64_scaled_to_out(s, a, b, OUT: tl.constexpr):
    """P3' of ``s * a * b`` for int64 ``s`` (|s| < 2**63) and fp64 powers of two ``a``, ``b`` whose
    products with ``|s|`` stay in fp64's normal range (exact): ``|s|`` rounded to odd at 53 bits
    (:func:`ro53`), times ``a`` then ``b``, rounded once to format ``OUT`` (:func:`f64_to_out`), as
    the fp32 holding that value. A row and a column factor (``linear``'s ``2**ex`` and
    ``2**(ew - 47)``) scale a tile without an exponent per element. Zero gives +0; a negative value
    that rounds to zero gives -0, its sign set from the bits (a float negation may compile to
    0 - x, which gives +0 for a zero)."""
    s = s.to(tl.int64)
    neg = s < 0
    f = f64_to_out((ro53(tl.where(neg, -s, s)) * a) * b, OUT)
    return f32_from_bits(f32_bits(f) | tl.where(neg, -2147483648, 0))


@triton.jit
def int2_to_out(hi, lo, SHIFT: tl.constexpr, k, OUT: tl.constexpr):
    """P3' of a two-limb integer: ``(hi * 2**SHIFT + lo) * 2**k`` rounded once to format ``OUT``
    (as fp32); int64 ``|hi|, |lo| < 2**62``, ``1 <= SHIFT <= 40``.

    The magnitude is carried as ``top * 2**SHIFT + low`` (``0 <= low < 2**SHIFT``); while it fits
    in 62 bits it is rounded whole, beyond that ``low`` lies below the rounding position and
    only sets the sticky bit, folded into ``top``'s last bit.
    """
    hi = hi.to(tl.int64)
    lo = lo.to(tl.int64)
    carry = lo >> SHIFT
    low = lo - (carry << SHIFT)
    top = hi + carry
    neg = top < 0
    borrow = neg & (low != 0)
    top = tl.where(neg, -top - borrow.to(tl.int64), top)
    low = tl.where(borrow, (1 << SHIFT) - low, low)
    fits = top < (1 << (62 - SHIFT))
    whole = (tl.where(fits, top, 0) << SHIFT) + low
    mag = tl.where(fits, whole, top | (low != 0).to(tl.int64))
    return int64_to_out(tl.where(neg, -mag, mag), tl.where(fits, k, k + SHIFT), OUT)


# --------------------------------------------------------------------------------------------
# fixed-point grid (P4)
# --------------------------------------------------------------------------------------------


@triton.jit
def to_fixed(t, e, FRAC: tl.constexpr):
    """P4 quantisation: ``RNE(t * 2**(FRAC - e))`` as int64 from the bits of fp32 ``t``.

    ``e`` (int32) broadcasts against ``t``; non-finite terms give 0. The caller guarantees
    ``|t| < 2**e`` (max grid) or ``|t| <= 1`` with ``e = 0`` (absolute grid), so the result
    fits in ``FRAC + 1`` bits.
    """
    b = f32_bits(t)
    biased = (b >> 23) & 0xFF
    sig = ((b & 0x7FFFFF) | tl.where(biased > 0, 0x800000, 0)).to(tl.int64)
    sig = tl.where(biased == 0xFF, 0, sig)
    shift = (tl.maximum(biased, 1) - 150 + FRAC - e).to(tl.int64)
    left = sig << tl.minimum(tl.maximum(shift, 0), 62)
    r = tl.minimum(tl.maximum(-shift, 1), 40)
    q = sig >> r
    rem = sig - (q << r)
    half = tl.full(r.shape, 1, tl.int64) << (r - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int64)
    mag = tl.where(shift >= 0, left, q)
    return tl.where(b < 0, -mag, mag)


@triton.jit
def to_fixed_abs(t, FRAC: tl.constexpr):
    """``to_fixed(t, 0, FRAC)`` on the absolute grid in fp32 arithmetic, for ``|t| * 2**FRAC < 2**62``
    (softmax's ``p <= 1``; the same int64 there, 0 for non-finite ``t``).

    With ``c = 2**(23 - FRAC)``: below c, ``(|t| + c) - c`` rounds ``|t|`` once to a multiple of
    ``2**-FRAC`` (RNE: the sum's ulp is ``2**-FRAC``, the difference exact); from c up ``|t|`` is such
    a multiple already; ``y = |t| * 2**FRAC`` is then an exact scale to an integer below 2**62. Below
    2**23 the int32 conversion of y is exact; from 2**23 up y's significand shifted by its exponent.
    No product feeds an addition (R1: a compiler may not fuse them; the AMD compiler fused
    ``|t| * 2**FRAC + 2**23`` into an fma) and there is no fp32 -> int64 conversion (the AMD compiler
    expands it with fmas). A few fp32 and integer operations where ``to_fixed``'s decoding and
    rounding take ~20 int64 operations (the softmax sum kernel was bound by them).
    """
    a = tl.abs(t)
    c = 2.0 ** (23 - FRAC)
    a = tl.where(a < c, (a + c) - c, a)
    y = a * (2.0 ** FRAC)
    y = tl.where(y < 4611686018427387904.0, y, 0.0)  # NaN and inf (and |t| * 2**FRAC >= 2**62): 0
    small = tl.minimum(y, 8388608.0).to(tl.int32).to(tl.int64)  # exact below 2**23
    b = f32_bits(y)
    shift = tl.maximum(((b >> 23) & 0xFF) - 150, 0).to(tl.int64)
    big = ((b & 0x7FFFFF) | 0x800000).to(tl.int64) << shift  # y >= 2**23: an integer, < 2**62
    q = tl.where(y < 8388608.0, small, big)
    return tl.where(t < 0, -q, q)


@triton.jit
def to_grid_unit(t, FRAC: tl.constexpr):
    """``RNE(t * 2**FRAC)`` for fp32 ``t`` in [0, 1] (FRAC <= 40) as an integer-valued fp32, exact (at most
    2**FRAC): :func:`to_fixed_abs`'s rounding without its sign and range handling (softmax's terms on
    rows with a finite max). Up to ``2**(52 - FRAC) - 1`` of them add exactly in fp64, read back by
    :func:`f64_count_to_i64`: two fp32 operations and an fp64 addition an element where the int64
    route takes a conversion and ~15 integer operations."""
    c = 2.0 ** (23 - FRAC)
    a = tl.where(t < c, (t + c) - c, t)
    return a * (2.0 ** FRAC)


@triton.jit
def f64_count_to_i64(acc):
    """int64 of an integer-valued fp64 ``acc`` in [0, 2**52): the significand bits of ``acc + 2**52`` (one
    exact addition, no conversion)."""
    return (acc + 4503599627370496.0).to(tl.int64, bitcast=True) & 4503599627370495


@triton.jit
def from_fixed(total, e, FRAC: tl.constexpr):
    """fp32 of the exact ``total * 2**(e - FRAC)``: one rounding (P3), then ldexp_c (P2)."""
    return ldexp_c(int64_to_f32(total), e - FRAC)


@triton.jit
def special_sum_code(x, mask):
    """Non-finite bookkeeping of a sum: bit 0 any NaN, bit 1 any +inf, bit 2 any -inf (int32)."""
    b = f32_bits(x)
    a = b & 0x7FFFFFFF
    nan = (a > 0x7F800000) & mask
    pinf = (b == 0x7F800000) & mask
    ninf = (b == -8388608) & mask  # 0xFF800000 as int32
    return nan.to(tl.int32) | (pinf.to(tl.int32) << 1) | (ninf.to(tl.int32) << 2)


@triton.jit
def apply_special(y, code):
    """Replace a finite sum ``y`` by NaN / +inf / -inf according to ``special_sum_code`` (OR-reduced)."""
    inf = tl.full(y.shape, 0x7F800000, tl.int32).to(tl.float32, bitcast=True)
    y = tl.where((code & 2) != 0, inf, y)
    y = tl.where((code & 4) != 0, -inf, y)
    nan = ((code & 1) != 0) | ((code & 6) == 6)
    return tl.where(nan, canonical_nan_f32(y), y)


# --------------------------------------------------------------------------------------------
# max (P7) and casts (P8)
# --------------------------------------------------------------------------------------------


@triton.jit
def max_key(x):
    """An int32 key whose integer order is the fp32 order of non-NaN ``x`` (-0 == +0 -> same key)."""
    b = f32_bits(x)
    a = b & 0x7FFFFFFF
    return tl.where(b < 0, -a, a)


@triton.jit
def key_to_f32(k):
    """Inverse of ``max_key`` (a zero key gives +0)."""
    return tl.where(k < 0, (-k) | -2147483648, k).to(tl.float32, bitcast=True)


@triton.jit
def nan_to_canonical(y):
    return tl.where(y != y, canonical_nan_f32(y), y)


@triton.jit
def f32_to_bf16_bits(y):
    """fp32 -> bf16 round-to-nearest-even as int16 bits; NaN -> 0x7FC0 (P8). Integer arithmetic."""
    b = f32_bits(y)
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = tl.where((b & 0x7FFFFFFF) > 0x7F800000, 0x7FC0, r)
    return r.to(tl.int16)


@triton.jit
def cast_out(y, OUT: tl.constexpr):
    """fp32 ``y`` -> output dtype code ``OUT`` (0 fp32, 1 bf16, 2 fp16) with canonical NaN (P8)."""
    if OUT == 1:
        return f32_to_bf16_bits(y).to(tl.bfloat16, bitcast=True)
    elif OUT == 2:
        nan16 = tl.full(y.shape, 0x7E00, tl.int16).to(tl.float16, bitcast=True)
        return tl.where(y != y, nan16, y.to(tl.float16))
    else:
        return nan_to_canonical(y)


# --------------------------------------------------------------------------------------------
# the 21-bit grid and its base-128 digits (P5)
# --------------------------------------------------------------------------------------------


@triton.jit
def grid_int(x, e):
    """``RNE(x * 2**(20 - e))`` as int32 for fp32 ``x`` on its row grid (|x| < 2**e; non-finite -> 0).

    Scaling by 2**(20-e) in two exact power-of-two steps (the first cannot round unless the
    result is below 1/2), then the 1.5 * 2**23 magic add rounds half-to-even to an integer.
    """
    s1, s2 = grid_scales(e)
    return grid_int_scaled(tl.where(is_finite(x), x, 0.0), s1, s2)


@triton.jit
def grid_scales(e):
    """The two power-of-two factors (fp32) whose product is ``2**(20 - e)``, ``grid_int``'s steps.

    Computed on a row's exponent before it is broadcast over the row, they cost one evaluation
    per row instead of one per element."""
    k = GRID_C - e
    a = k >> 1
    return pow2_f32(a), pow2_f32(k - a)


@triton.jit
def grid_int_scaled(x, s1, s2):
    """``grid_int`` of finite fp32 ``x`` from its row's ``grid_scales`` (broadcast against ``x``)."""
    v = (x * s1) * s2
    magic = 12582912.0  # 1.5 * 2**23
    r = v + magic
    return f32_bits(r) - 0x4B400000  # bits of 1.5 * 2**23


@triton.jit
def pow2_f64(k):
    """fp64 ``2**k`` for int32 k in [-1022, 1023], built from the exponent bits."""
    return ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def rne_f64(x):
    """``RNE(x)`` of fp64 ``|x| <= 2**51`` as fp64: the 1.5 * 2**52 magic add (one rounding, an
    exact subtraction)."""
    magic = 6755399441055744.0  # 1.5 * 2**52
    return (x + magic) - magic



@triton.jit
def grid_int_bits(x, e, BITS: tl.constexpr):
    """``RNE(x * 2**(BITS - e))`` as int32 for a bf16/fp16 value ``x`` (as fp32) on its row grid
    (|x| < 2**e; non-finite -> 0), for grids of up to 28 signed bits (BITS <= 27).

    The two power-of-two steps are exact; a scaled value below 2**22 is rounded half-to-even by
    the 1.5 * 2**23 magic add, and one at or above 2**22 is already an integer (a bf16/fp16
    value has at most 11 significant bits), converted exactly.
    """
    x = tl.where(is_finite(x), x, 0.0)
    k = BITS - e
    a = k >> 1
    v = (x * pow2_f32(a)) * pow2_f32(k - a)
    magic = 12582912.0  # 1.5 * 2**23
    small = f32_bits(v + magic) - 0x4B400000
    return tl.where(abs_bits(v) < 0x4A800000, small, v.to(tl.int32))  # 0x4A800000: 2**22


@triton.jit
def grid_int_f32(x, e, BITS: tl.constexpr):
    """``RNE(x * 2**(BITS - e))`` as int32 for any fp32 ``x`` on its row grid (|x| < 2**e; non-finite
    -> 0), BITS <= 27 (``token_logprobs_backward``'s fp32 coefficients on their 28-bit grids).

    The two power-of-two steps as in :func:`grid_int_bits` (a value that underflows in the first
    is below 2**-38 after the second and rounds to 0 either way). A 24-bit significand can leave
    a fraction up to 2**23, so the rounding adds and subtracts ``2**23`` with the value's sign
    (one RNE to an integer, an exact subtraction) below 2**23; at or above it the value is an
    integer, converted exactly.
    """
    x = tl.where(is_finite(x), x, 0.0)
    k = BITS - e
    a = k >> 1
    v = (x * pow2_f32(a)) * pow2_f32(k - a)
    big = tl.where(v < 0, -8388608.0, 8388608.0)  # 2**23 with v's sign
    r = (v + big) - big
    return tl.where(abs_bits(v) < 0x4B000000, r, v).to(tl.int32)  # 0x4B000000: 2**23


@triton.jit
def split4(v):
    """int32 |v| <= 2**27 -> four balanced base-128 digits (d0..d2 in [-64, 63], d3 in [-64, 64]) as int8."""
    d0 = ((v + 64) & 127) - 64
    v1 = (v - d0) >> 7
    d1 = ((v1 + 64) & 127) - 64
    v2 = (v1 - d1) >> 7
    d2 = ((v2 + 64) & 127) - 64
    d3 = (v2 - d2) >> 7
    return d0.to(tl.int8), d1.to(tl.int8), d2.to(tl.int8), d3.to(tl.int8)


@triton.jit
def split3(v):
    """int32 |v| <= 2**20 -> three balanced base-128 digits (d0, d1 in [-64, 63], d2 in [-64, 64]) as int8."""
    d0 = ((v + 64) & 127) - 64
    v1 = (v - d0) >> 7
    d1 = ((v1 + 64) & 127) - 64
    d2 = (v1 - d1) >> 7
    return d0.to(tl.int8), d1.to(tl.int8), d2.to(tl.int8)


@triton.jit
def fold6(l0, l1, l2, l3, l4, l5):
    """The exact int64 ``sum_k l_k * 128**k`` of six int32 digit-product levels."""
    return l0.to(tl.int64) + (l1.to(tl.int64) << 7) + (l2.to(tl.int64) << 14) + (l3.to(tl.int64) << 21) \
        + (l4.to(tl.int64) << 28) + (l5.to(tl.int64) << 35)


@triton.jit
def levels12(a0, a1, a2, a3, b0, b1, b2, l0, l1, l2, l3, l4, l5):
    """Four int8 digits of A ``[M, K]`` times three of B ``[K, N]``: the twelve digit products added to
    the six int32 levels (level k holds the products of digits i + j = k)."""
    l0 = tl.dot(a0, b0, l0, out_dtype=tl.int32)
    l1 = tl.dot(a0, b1, l1, out_dtype=tl.int32)
    l1 = tl.dot(a1, b0, l1, out_dtype=tl.int32)
    l2 = tl.dot(a0, b2, l2, out_dtype=tl.int32)
    l2 = tl.dot(a1, b1, l2, out_dtype=tl.int32)
    l2 = tl.dot(a2, b0, l2, out_dtype=tl.int32)
    l3 = tl.dot(a1, b2, l3, out_dtype=tl.int32)
    l3 = tl.dot(a2, b1, l3, out_dtype=tl.int32)
    l3 = tl.dot(a3, b0, l3, out_dtype=tl.int32)
    l4 = tl.dot(a2, b2, l4, out_dtype=tl.int32)
    l4 = tl.dot(a3, b1, l4, out_dtype=tl.int32)
    l5 = tl.dot(a3, b2, l5, out_dtype=tl.int32)
    return l0, l1, l2, l3, l4, l5


# --------------------------------------------------------------------------------------------
# exp_c and log_c (R2, P6): the contract sequences, step for step
# --------------------------------------------------------------------------------------------


def _f32(bits: int) -> float:
    """The Python float equal to the binary32 number with encoding ``bits`` (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


# The constants of the exp_c / log_c definition, as binary32 encodings. They are read from the
# device-generic backend's module (same layer, so allowed by import-linter; the reference in
# contracts/ is never imported by a backend): one place to update when the contract refits its
# polynomials, and conformance compares both backends with the reference bit for bit.
_LOG2E = tl.constexpr(_f32(_GT._LOG2E))
_LN2_HI = tl.constexpr(_f32(_GT._LN2_HI))
_LN2_LO = tl.constexpr(_f32(_GT._LN2_LO))
_EXP_X_MAX = tl.constexpr(_f32(_GT._X_MAX))
_EXP_X_MIN = tl.constexpr(_f32(_GT._X_MIN))
_SQRT_HALF = tl.constexpr(_f32(_GT._SQRT_HALF))
_Q0 = tl.constexpr(_f32(_GT._E0))
_Q1 = tl.constexpr(_f32(_GT._E1))
_Q2 = tl.constexpr(_f32(_GT._E2))
_Q3 = tl.constexpr(_f32(_GT._E3))
_Q4 = tl.constexpr(_f32(_GT._E4))
_R0 = tl.constexpr(_f32(_GT._L0))
_R1 = tl.constexpr(_f32(_GT._L1))
_R2 = tl.constexpr(_f32(_GT._L2))
_R3 = tl.constexpr(_f32(_GT._L3))
_R4 = tl.constexpr(_f32(_GT._L4))
_R5 = tl.constexpr(_f32(_GT._L5))
_R6 = tl.constexpr(_f32(_GT._L6))
_R7 = tl.constexpr(_f32(_GT._L7))


@triton.jit
def round_half_even_small(t):
    """``(RNE(t) as int32, as fp32)`` for fp32 |t| < 2**22: the 1.5 * 2**23 magic add (one rounding)."""
    r = t + 12582912.0
    k = f32_bits(r) - 0x4B400000
    return k, k.to(tl.float32)


@triton.jit
def _exp_c_reduced(xr, kf):
    """Steps 3-12 of ``exp_c`` for ``xr`` in [-104, 89] and ``kf`` = RNE(RN32(xr * LOG2E)) as fp32:
    ``p ~ e**r`` in [0.70, 1.42] (``exp_c = ldexp_c(p, k)``)."""
    r1 = xr - kf * _LN2_HI  # 3: exact
    c = kf * _LN2_LO  # 4
    r = r1 - c  # 5
    v = r - r1  # 6: TwoSum error
    er = (r1 - (r - v)) - (c + v)
    s = 1.0 + r  # 7
    e1 = (1.0 - s) + r
    r2 = r * r  # 8
    q = tl.full(r.shape, _Q4, tl.float32)  # 9: Horner
    q = q * r + _Q3
    q = q * r + _Q2
    q = q * r + _Q1
    q = q * r + _Q0
    t2 = r2 * q  # 10
    tail = (e1 + er) + t2  # 11
    return s + tail  # 12


@triton.jit
def exp_c(x):
    """Contract exponential of fp32 ``x`` (P6): the 13-step sequence, one RN32 rounding per step."""
    x = x.to(tl.float32)
    nan = x != x
    too_big = x > _EXP_X_MAX
    too_small = x < _EXP_X_MIN
    xr = tl.where(nan | too_big | too_small, 0.0, x)
    t = xr * _LOG2E  # 1
    k, kf = round_half_even_small(t)  # 2
    y = ldexp_c(_exp_c_reduced(xr, kf), k)  # 3-12, 13
    inf = tl.full(y.shape, 0x7F800000, tl.int32).to(tl.float32, bitcast=True)
    y = tl.where(too_big, inf, y)
    y = tl.where(too_small, 0.0, y)
    return tl.where(nan, canonical_nan_f32(y), y)


@triton.jit
def exp_c_nonpos(x):
    """``exp_c(x)`` for fp32 ``x <= 0`` or -inf, never NaN (the terms ``x - m`` of a row with a finite max):
    the same steps without the NaN and overflow cases, and ``kf`` as ``(t + 1.5 * 2**23) - 1.5 * 2**23``
    (exact: that sum is the integer ``k + 1.5 * 2**23``) instead of an int-to-float conversion."""
    too_small = x < _EXP_X_MIN
    xr = tl.where(too_small, 0.0, x)
    t = xr * _LOG2E  # 1
    r = t + 12582912.0  # 2
    k = f32_bits(r) - 0x4B400000
    y = ldexp_c(_exp_c_reduced(xr, r - 12582912.0), k)  # 3-12, 13
    return tl.where(too_small, 0.0, y)


@triton.jit
def log_c(x):
    """Contract natural logarithm of fp32 ``x`` (P6): the 12-step sequence, one RN32 rounding per step."""
    x = x.to(tl.float32)
    b = f32_bits(x)
    bad = (x != x) | (b < 0) & (x != 0.0)  # NaN, negative, -inf (but -0 is a zero)
    zero = x == 0.0
    inf_in = b == 0x7F800000
    xr = tl.where(bad | zero | inf_in, 1.0, x)
    subnormal = f32_bits(xr) < 0x00800000  # 1
    xs = tl.where(subnormal, xr * 8388608.0, xr)
    eadj = tl.where(subnormal, -23, 0)
    bs = f32_bits(xs)  # 2: frexp from the bits
    ex = ((bs >> 23) & 0xFF) - 126
    mant = ((bs & 0x007FFFFF) | (126 << 23)).to(tl.float32, bitcast=True)
    low = mant < _SQRT_HALF
    m = tl.where(low, mant * 2.0, mant)
    e = ex - low.to(tl.int32) + eadj
    f = m - 1.0  # 3
    ef = e.to(tl.float32)  # 4
    hi = ef * _LN2_HI
    lo = ef * _LN2_LO
    fh = (f32_bits(f) & -4096).to(tl.float32, bitcast=True)  # 5: ~0xFFF
    fl = f - fh
    hh = 0.5 * (fh * fh)  # 6
    g = f + fh
    hl = 0.5 * (fl * g)
    s1 = f - hh  # 7
    e1 = (f - s1) - hh
    q = tl.full(f.shape, _R7, tl.float32)  # 8: Horner
    q = q * f + _R6
    q = q * f + _R5
    q = q * f + _R4
    q = q * f + _R3
    q = q * f + _R2
    q = q * f + _R1
    q = q * f + _R0
    f2 = f * f  # 9
    f3 = f2 * f
    t = f3 * q
    big_s = hi + s1  # 10
    e_s = s1 - (big_s - hi)
    tail = ((e1 - hl) + t) + lo  # 11
    y = big_s + (e_s + tail)  # 12
    inf = tl.full(y.shape, 0x7F800000, tl.int32).to(tl.float32, bitcast=True)
    y = tl.where(zero, -inf, y)
    y = tl.where(inf_in, inf, y)
    return tl.where(bad, canonical_nan_f32(y), y)


@triton.jit
def or_reduce_flags(flags):
    """OR of the 3 flag bits of ``special_sum_code`` over a 1-D tensor (as a scalar int32)."""
    nan_any = tl.max(((flags & 1) != 0).to(tl.int32), axis=0)
    pinf_any = tl.max(((flags & 2) != 0).to(tl.int32), axis=0)
    ninf_any = tl.max(((flags & 4) != 0).to(tl.int32), axis=0)
    return nan_any | (pinf_any << 1) | (ninf_any << 2)


@triton.jit
def bf16_round(y):
    """fp32 -> bf16 (RNE) -> fp32, in integer arithmetic (NaN stays NaN)."""
    return (f32_to_bf16_bits(y).to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def upcast(x):
    """bf16/fp16/fp32 -> fp32, exactly. bf16 goes through its bits (the interpreter's bf16
    conversion loses subnormals; on the GPU this is the same shift the conversion does)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)
