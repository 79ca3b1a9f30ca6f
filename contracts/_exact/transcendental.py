"""Reference ``exp_c`` and ``log_c``: the contract exponential and logarithm of fp32 (R2, P6).

This module is the living definition. Every backend computes the same sequence of IEEE-754
binary32 operations, each rounded to nearest-even (``RN``), with the constants below, and so
returns the same bits; the device-generic implementation in
``rlkernel.backends.generic._exact.transcendental`` is written independently and
conformance compares the two on every fp32 bit pattern (``tools/measure_transcendentals.py``).

Rules of the sequence (docs/numerics.md R1): only fp32 ``+ - *``, no fused multiply-add, no
flush-to-zero, integer operations and exact conversions; each line below is one rounding.
Nothing here calls a math library: ``torch.round`` (ties to even) is exact on the values it
sees, ``torch.frexp`` only reads the exponent field, and powers of two are built from bits.

Constants (fp32; hex is the binary32 encoding)
----------------------------------------------
=========== ============ ====================================================================
name        bits         value
=========== ============ ====================================================================
LOG2E       0x3FB8AA3B   1.44269502162933349609375 (RN32(1/ln 2))
LN2_HI      0x3F317200   0.693145751953125 (ln 2 truncated to 15 significant bits; the 9 low
                         significand bits are zero, so ``k * LN2_HI`` is exact for |k| < 512)
LN2_LO      0x35BFBE8E   1.428606765330187e-06 (RN32(ln 2 - LN2_HI))
EXP_X_MAX   0x42B20000   89.0 (above: +inf; exp(89) > 2**128 already)
EXP_X_MIN   0xC2D00000   -104.0 (below: +0; exp(-104) < 2**-150, half the least subnormal)
SQRT_HALF   0x3F3504F3   0.707106769084930419921875 (RN32(sqrt(1/2)))
=========== ============ ====================================================================

Polynomial coefficients, fitted for this contract by ``tools/fit_transcendentals.py``
(weighted minimax in float64, rounded to fp32, then greedily adjusted by whole fp32 ulps to
minimise the measured error of the whole sequence); decimals are the shortest strings that
round-trip to the fp32 value:

====  ==========  ======================
name  bits        value
====  ==========  ======================
Q0    0x3EFFFFFE  0.4999999403953552
Q1    0x3E2AAA49  0.1666652113199234
Q2    0x3D2AAC79  0.04166838899254799
Q3    0x3C091D01  0.00836873147636652
Q4    0x3AB511F8  0.001381455920636654
R0    0x3EAAAAAA  0.3333333134651184
R1    0xBE800113  -0.2500081956386566
R2    0x3E4CD003  0.20001225173473358
R3    0xBE2A3924  -0.1662335991859436
R4    0x3E116D09  0.14201749861240387
R5    0xBE06C2A2  -0.13160184025764465
R6    0x3E02ADB5  0.1276157647371292
R7    0xBD9C5ABE  -0.07634495198726654
====  ==========  ======================

exp_c(x)
--------
Special cases, decided first: NaN -> the canonical NaN (0x7FC00000); ``x > 89`` (including
+inf) -> +inf; ``x < -104`` (including -inf) -> +0. Otherwise, with ``x`` in [-104, 89]:

1. ``t = RN(x * LOG2E)``
2. ``k = round_half_even(t)``, an integer in [-150, 128]; ``kf = float(k)`` (exact, +0 for 0)
3. ``r1 = RN(x - RN(kf * LN2_HI))`` -- both operations exact (Cody-Waite): the product has at
   most 24 significant bits; the difference is exact by Sterbenz's lemma when |k| >= 2 or
   |x| >= 1/2, and otherwise (|k| = 1, |x| < 1/2) it is a multiple of 2**-25 below 1/2 in
   magnitude. ``tools/fit_transcendentals.py`` checks every x with 1/8 <= |x| < 2.
4. ``c = RN(kf * LN2_LO)``
5. ``r = RN(r1 - c)``; |r| <= 0.3467
6. the rounding error of step 5, by TwoSum (exact): ``v = RN(r - r1)``,
   ``er = RN(RN(r1 - RN(r - v)) - RN(c + v))``
7. ``s = RN(1 + r)``; its exact rounding error by FastTwoSum: ``e1 = RN(RN(1 - s) + r)``
8. ``r2 = RN(r * r)``
9. Horner, highest coefficient first: ``q = Q4``; then for ``Qi`` in ``Q3, Q2, Q1, Q0``:
   ``q = RN(RN(q * r) + Qi)``  (so ``q ~ (e**r - 1 - r) / r**2``)
10. ``t2 = RN(r2 * q)``
11. ``tail = RN(RN(e1 + er) + t2)``
12. ``p = RN(s + tail)``; p ~ e**r in [0.70, 1.42]
13. ``y = ldexp_c(p, k) = RN(RN(p * 2**a) * 2**(k - a))`` with ``a = floor(k / 2)`` (P2);
    both powers of two are normal. The first product is exact; the second rounds once, to
    +inf above the range, into the subnormals or to +0 below it.

log_c(x)
--------
Special cases: NaN or ``x < 0`` (including -inf) -> the canonical NaN; ``x = +-0`` -> -inf;
``x = +inf`` -> +inf. Otherwise, with ``x`` positive and finite:

1. subnormal ``x < 2**-126``: ``xs = RN(x * 2**23)`` (exact) and ``eadj = -23``;
   else ``xs = x``, ``eadj = 0``
2. ``xs = mant * 2**ex`` with ``mant`` in [0.5, 1) (frexp, exact). If ``mant < SQRT_HALF``:
   ``m = 2 * mant``, ``e = ex - 1 + eadj``; else ``m = mant``, ``e = ex + eadj``.
   So ``m`` lies in [SQRT_HALF, 2 * SQRT_HALF) and ``x = m * 2**e``; e in [-149, 128].
3. ``f = RN(m - 1)`` (exact, Sterbenz), in [-0.29289, 0.41422)
4. ``ef = float(e)``; ``hi = RN(ef * LN2_HI)`` (exact); ``lo = RN(ef * LN2_LO)``
5. ``fh`` = f with the 12 low bits of its binary32 encoding cleared (f truncated toward zero
   to 12 significant bits); ``fl = RN(f - fh)`` (exact)
6. ``hh = RN(0.5 * RN(fh * fh))`` (exact: 12-bit times 12-bit); ``g = RN(f + fh)``;
   ``hl = RN(0.5 * RN(fl * g))``. (``hh + hl ~ f**2 / 2``, ``hh`` holding all but ~2**-12 of it.)
7. ``s1 = RN(f - hh)``; its exact rounding error by FastTwoSum: ``e1 = RN(RN(f - s1) - hh)``
8. Horner, highest coefficient first: ``q = R7``; then for ``Ri`` in ``R6, ..., R0``:
   ``q = RN(RN(q * f) + Ri)``  (so ``q ~ (log1p(f) - f + f**2 / 2) / f**3``)
9. ``f2 = RN(f * f)``; ``f3 = RN(f2 * f)``; ``t = RN(f3 * q)``
10. ``S = RN(hi + s1)``; its exact error by FastTwoSum: ``eS = RN(s1 - RN(S - hi))``
    (exact: |hi| >= 0.69 > |s1| when e != 0, and hi = +0 when e = 0)
11. ``tail = RN(RN(RN(e1 - hl) + t) + lo)``
12. ``y = RN(S + RN(eS + tail))``

``log_c(1)`` is exactly +0 (every intermediate is +0).

Accuracy (target of R2: at most 1 ulp from the correctly rounded result over the whole
finite range). Measured over all 2**32 inputs against float64 truth (docs/accuracy-exp-log.md,
``tools/measure_transcendentals.py exhaustive``): exp_c max 0.78 ulp (at a subnormal result;
0.70 ulp over normal results), 99.81 % correctly rounded on [-104, 89]; log_c max 0.69 ulp,
99.93 % correctly rounded on the positive finite numbers. The device-generic implementation
agreed bit for bit on all 2**32 inputs, on the CPU and on an NVIDIA H200.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Bumped whenever any output bit of exp_c or log_c changes (R10).
VERSION = 1

# --- constants, as binary32 encodings -------------------------------------------------------
LOG2E_BITS = 0x3FB8AA3B  # 1.44269502162933349609375
LN2_HI_BITS = 0x3F317200  # 0.693145751953125
LN2_LO_BITS = 0x35BFBE8E  # 1.428606765330187e-06
EXP_X_MAX_BITS = 0x42B20000  # 89.0
EXP_X_MIN_BITS = 0xC2D00000  # -104.0
SQRT_HALF_BITS = 0x3F3504F3  # 0.707106769084930419921875
CANONICAL_NAN_BITS = 0x7FC00000

#: exp: q(r) = Q0 + Q1 r + Q2 r^2 + Q3 r^3 + Q4 r^4 ~ (e^r - 1 - r) / r^2 on |r| <= 0.3467.
EXP_COEFFS: tuple[int, ...] = (
    0x3EFFFFFE,  # Q0 = 0.4999999403953552
    0x3E2AAA49,  # Q1 = 0.1666652113199234
    0x3D2AAC79,  # Q2 = 0.04166838899254799
    0x3C091D01,  # Q3 = 0.00836873147636652
    0x3AB511F8,  # Q4 = 0.001381455920636654
)

#: log: q(f) = R0 + R1 f + ... + R7 f^7 ~ (log1p(f) - f + f^2/2) / f^3 on [-0.2929, 0.4142).
LOG_COEFFS: tuple[int, ...] = (
    0x3EAAAAAA,  # R0 = 0.3333333134651184
    0xBE800113,  # R1 = -0.2500081956386566
    0x3E4CD003,  # R2 = 0.20001225173473358
    0xBE2A3924,  # R3 = -0.1662335991859436
    0x3E116D09,  # R4 = 0.14201749861240387
    0xBE06C2A2,  # R5 = -0.13160184025764465
    0x3E02ADB5,  # R6 = 0.1276157647371292
    0xBD9C5ABE,  # R7 = -0.07634495198726654
)


def f32_from_bits(bits: int) -> float:
    """The Python float equal to the binary32 number with encoding ``bits`` (exact)."""
    signed = bits - (1 << 32) if bits >= 1 << 31 else bits
    return float(torch.tensor(signed, dtype=torch.int32).view(torch.float32).item())


def _const(bits: int) -> torch.Tensor:
    """A 0-d fp32 tensor holding the binary32 number with encoding ``bits``."""
    signed = bits - (1 << 32) if bits >= 1 << 31 else bits
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """``2**n`` in fp32 for integer n in [-126, 127], built from its exponent field (exact)."""
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def _check_fp32(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name}: expected a float32 tensor, got {x.dtype}; cast with x.float() first")


def exp_c(x: torch.Tensor) -> torch.Tensor:
    """Contract exponential of fp32: ``y = exp_c(x) ~ e**x`` (R2, P6), the reference.

    Parameters
    ----------
    x : Tensor, float32, any shape (``[...]``), any device (the definition runs on the CPU)

    Returns
    -------
    Tensor, float32, shape ``[...]`` like ``x``

    Bitwise semantics
    -----------------
    The 13-step sequence of the module docstring, each step one RN32 rounding (no FMA),
    elementwise, so the result of an element depends only on that element: invariant under
    any batching, shape or layout. Special values: NaN -> 0x7FC00000; x > 89 or +inf -> +inf;
    x < -104 or -inf -> +0; ``exp_c(+-0) = 1``. Results are normal, subnormal (rounded once
    by the last multiply of ldexp_c), +0 or +inf. Max error 1 ulp by contract; measured in
    docs/accuracy-exp-log.md. Contract primitive ``exp_c``, version :data:`VERSION`.
    """
    _check_fp32("exp_c", x)
    return _exp_c_with(x, EXP_COEFFS)


def _exp_c_with(x: torch.Tensor, coeffs: Sequence[int]) -> torch.Tensor:
    """exp_c with the polynomial coefficients given as binary32 encodings (for the fit tool)."""
    dev = x.device
    log2e = _const(LOG2E_BITS).to(dev)
    ln2_hi = _const(LN2_HI_BITS).to(dev)
    ln2_lo = _const(LN2_LO_BITS).to(dev)
    x_max = _const(EXP_X_MAX_BITS).to(dev)
    x_min = _const(EXP_X_MIN_BITS).to(dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    q_coef = [_const(b).to(dev) for b in coeffs]

    # Special cases are selected at the end; the sequence runs on a harmless stand-in (0).
    is_nan = torch.isnan(x)
    too_big = x > x_max
    too_small = x < x_min
    xr = torch.where(is_nan | too_big | too_small, torch.zeros_like(x), x)

    t = xr * log2e  # 1
    k = torch.round(t).to(torch.int32)  # 2: ties to even; |t| < 151
    kf = k.to(torch.float32)
    r1 = xr - kf * ln2_hi  # 3: both exact
    c = kf * ln2_lo  # 4
    r = r1 - c  # 5
    v = r - r1  # 6: TwoSum error of r1 - c
    er = (r1 - (r - v)) - (c + v)
    s = one + r  # 7
    e1 = (one - s) + r
    r2 = r * r  # 8
    q = q_coef[-1].expand_as(r)  # 9: Horner, highest coefficient first
    for coef in reversed(q_coef[:-1]):
        q = q * r
        q = q + coef
    t2 = r2 * q  # 10
    tail = (e1 + er) + t2  # 11
    p = s + tail  # 12
    a = torch.div(k, 2, rounding_mode="floor")  # 13: ldexp_c(p, k)
    y = (p * _pow2(a)) * _pow2(k - a)

    y = torch.where(too_big, torch.full_like(y, float("inf")), y)
    y = torch.where(too_small, torch.zeros_like(y), y)
    nan = _const(CANONICAL_NAN_BITS).to(dev)
    return torch.where(is_nan, nan, y)


def log_c(x: torch.Tensor) -> torch.Tensor:
    """Contract natural logarithm of fp32: ``y = log_c(x) ~ ln(x)`` (R2, P6), the reference.

    Parameters
    ----------
    x : Tensor, float32, any shape (``[...]``), any device (the definition runs on the CPU)

    Returns
    -------
    Tensor, float32, shape ``[...]`` like ``x``

    Bitwise semantics
    -----------------
    The 12-step sequence of the module docstring, each step one RN32 rounding (no FMA),
    elementwise: invariant under any batching, shape or layout. Subnormal inputs are scaled
    by 2**23 (exact) first. Special values: NaN, x < 0 and -inf -> 0x7FC00000; +-0 -> -inf;
    +inf -> +inf; ``log_c(1) = +0``. Max error 1 ulp by contract; measured in
    docs/accuracy-exp-log.md. Contract primitive ``log_c``, version :data:`VERSION`.
    """
    _check_fp32("log_c", x)
    return _log_c_with(x, LOG_COEFFS)


def _log_c_with(x: torch.Tensor, coeffs: Sequence[int]) -> torch.Tensor:
    """log_c with the polynomial coefficients given as binary32 encodings (for the fit tool)."""
    dev = x.device
    ln2_hi = _const(LN2_HI_BITS).to(dev)
    ln2_lo = _const(LN2_LO_BITS).to(dev)
    sqrt_half = _const(SQRT_HALF_BITS).to(dev)
    one = torch.ones((), dtype=torch.float32, device=dev)
    half = torch.full((), 0.5, dtype=torch.float32, device=dev)
    two = torch.full((), 2.0, dtype=torch.float32, device=dev)
    two_p23 = torch.full((), 2.0**23, dtype=torch.float32, device=dev)
    smallest_normal = torch.full((), 2.0**-126, dtype=torch.float32, device=dev)
    r_coef = [_const(b).to(dev) for b in coeffs]

    is_nan = torch.isnan(x) | (x < 0)
    is_zero = x == 0
    is_inf = x == float("inf")
    xr = torch.where(is_nan | is_zero | is_inf, torch.ones_like(x), x)

    subnormal = xr < smallest_normal  # 1
    xs = torch.where(subnormal, xr * two_p23, xr)
    eadj = torch.where(subnormal, -23, 0).to(torch.int32)
    mant, ex = torch.frexp(xs)  # 2: xs = mant * 2**ex, mant in [0.5, 1)
    low = mant < sqrt_half
    m = torch.where(low, mant * two, mant)
    e = ex.to(torch.int32) - low.to(torch.int32) + eadj
    f = m - one  # 3: exact
    ef = e.to(torch.float32)  # 4
    hi = ef * ln2_hi
    lo = ef * ln2_lo
    fh = (f.view(torch.int32) & ~0xFFF).view(torch.float32)  # 5: 12 leading bits of f
    fl = f - fh
    hh = half * (fh * fh)  # 6: hh exact
    g = f + fh
    hl = half * (fl * g)
    s1 = f - hh  # 7
    e1 = (f - s1) - hh
    q = r_coef[-1].expand_as(f)  # 8: Horner, highest coefficient first
    for coef in reversed(r_coef[:-1]):
        q = q * f
        q = q + coef
    f2 = f * f  # 9
    f3 = f2 * f
    t = f3 * q
    big_s = hi + s1  # 10
    e_s = s1 - (big_s - hi)
    tail = ((e1 - hl) + t) + lo  # 11
    y = big_s + (e_s + tail)  # 12

    y = torch.where(is_zero, torch.full_like(y, float("-inf")), y)
    y = torch.where(is_inf, torch.full_like(y, float("inf")), y)
    nan = _const(CANONICAL_NAN_BITS).to(dev)
    return torch.where(is_nan, nan, y)
