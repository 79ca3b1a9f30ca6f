"""The RoPE cos/sin tables of the product: every entry the exact value correctly rounded to fp32.

A host constant (R8), written independently of the contract (``rlkernel.contracts.rope``): a
different argument reduction, a different evaluation, a different error bound and a different
slow path, so that a mistake in one cannot flow into the other; conformance pins both to the
same bits (the ``rope_tables`` and ``rope_table_rows`` cases). Only the standard library's
``decimal`` and NumPy are used.

Entry ``(p, i)`` is ``RN32(cos(p * w_i))`` and ``RN32(sin(p * w_i))``, ``w_i = theta**(-2i/D)``
with theta's exact binary64 value, p an integer in [0, 2**24).

Fast path, float64, vectorised:

1. ``w_i`` is computed in ``decimal`` at 60+ significant digits (``exp(-(2i/D) ln theta)``) and
   reduced to ``v_i = w_i - 2 pi round(w_i / (2 pi))`` in [-pi, pi] (same sines and cosines at
   integer multiples: ``p v_i = p w_i - 2 pi p n``). ``v_i`` is split into four float64 pieces
   of at most 26 significant bits each (relative error of the sum < 2**-100), so each
   ``p * piece`` (p < 2**24) is an exact float64.
2. Cody-Waite reduction in radians: ``k = rint((p v0 + p v1) * 2/pi)``, ``|k| <= 2**25``; pi/2 is split
   into four pieces of at most 27 bits, so each ``k * piece`` is exact. ``r = sum p v_j -
   sum k h_j`` is accumulated in double-double (TwoSum): ``p v0 - k h0`` is exact (Sterbenz),
   the other terms are exact products. Error of r: <= 2**-76 absolute (the truncated pieces),
   and only relative errors when k = 0.
3. Anchors at m/64: ``m = rint(64 r)``, ``|m| <= 51``, ``d = r - m/64`` in [-1/128, 1/128];
   ``sin d`` and ``cos d - 1`` by five-term Taylor polynomials (truncation < 2**-100 relative);
   ``sin(m/64)``, ``cos(m/64)`` as double-double constants from ``decimal``; then
   ``sin r = S + (S_lo + S (cos d - 1) + C sin d)`` and the same for ``cos r``; the quadrant
   ``k mod 4`` maps (cos r, sin r) to (cos x, sin x).

Error bound of the float64 value y against the exact value (derivation in step order: 2**-50
relative when k = m = 0; 3 * 2**-53 absolute for m != 0, where |sin r| >= 2**-7 and
|cos r| >= 0.69, i.e. 2**-44 relative; plus 2**-76 absolute from the reduction when k != 0):
``|y - exact| <= B = 2**-42 |y| + (2**-74 if k != 0 else 0) + 2**-1000`` (a factor 4 of margin).
Where ``RN32(y - B) == RN32(y + B)`` that is the answer (rounding is monotonic). The others
(about 2**-17 of all entries) take the slow path: the value in ``decimal`` at 50 digits
(Taylor series after reduction by 2 pi), rounded to fp32 by exact rational comparison with the
fp32 midpoints; precision doubles while the value's error interval straddles a midpoint.
Position 0 gives cos = 1, sin = +0 exactly.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import numpy as np

#: Positions lie in [0, MAX_POSITION).
MAX_POSITION = 1 << 24
#: Rows computed per block (bounds the float64 temporaries to a few MiB per column).
_BLOCK_ENTRIES = 1 << 19
_REL_BOUND = 2.0**-42
_ABS_BOUND_REDUCED = 2.0**-74
_ABS_FLOOR = 2.0**-1000
_ANCHORS = 51  # |m| <= 51: 51/64 > pi/4 + 1/128


def _context(digits: int) -> decimal.Context:
    return decimal.Context(prec=digits, rounding=decimal.ROUND_HALF_EVEN, Emin=-999999, Emax=999999)


@functools.lru_cache(maxsize=8)
def _pi(digits: int) -> Decimal:
    """pi to ``digits`` significant digits, by Machin's formula pi = 16 atan(1/5) - 4 atan(1/239)."""
    ctx = _context(digits + 10)

    def atan_inv(n: int) -> Decimal:
        x = ctx.divide(Decimal(1), Decimal(n))
        x2 = ctx.multiply(x, x)
        term, total, k = x, x, 1
        eps = Decimal(10) ** -(digits + 8)
        while abs(term) > eps:
            term = ctx.multiply(term, -x2)
            total = ctx.add(total, ctx.divide(term, Decimal(2 * k + 1)))
            k += 1
        return total

    return +ctx.subtract(ctx.multiply(16, atan_inv(5)), ctx.multiply(4, atan_inv(239)))


def _sin_cos(x: Decimal, digits: int) -> tuple[Decimal, Decimal]:
    """``sin x, cos x`` to about ``digits`` digits (absolute) by Taylor series after reducing x by 2 pi."""
    ctx = _context(digits + 20)
    two_pi = ctx.multiply(2, _pi(digits + 30))
    x = ctx.subtract(x, ctx.multiply(two_pi, ctx.divide(x, two_pi).to_integral_value(decimal.ROUND_HALF_EVEN)))
    x2 = ctx.multiply(x, x)
    eps = Decimal(10) ** -(digits + 15)
    s_term, c_term = x, Decimal(1)
    s, c, k = x, Decimal(1), 1
    while abs(s_term) > eps or abs(c_term) > eps:
        c_term = ctx.divide(ctx.multiply(c_term, -x2), Decimal((2 * k - 1) * (2 * k)))
        s_term = ctx.divide(ctx.multiply(s_term, -x2), Decimal((2 * k) * (2 * k + 1)))
        c, s, k = ctx.add(c, c_term), ctx.add(s, s_term), k + 1
    return s, c


def _split(value: Decimal, pieces: int, bits: int) -> list[float]:
    """``value`` as ``pieces`` float64s of at most ``bits`` significant bits each, largest first."""
    exact = Fraction(value)
    out = []
    for _ in range(pieces):
        if exact == 0:
            out.append(0.0)
            continue
        _, exponent = math.frexp(float(exact))  # |exact| < 2**exponent (float rounding can only raise it)
        scale = Fraction(2) ** (bits - exponent)
        # |round(exact * scale)| <= 2**bits: at most `bits` significant bits (2**bits itself has one)
        piece = Fraction(round(exact * scale)) / scale
        out.append(float(piece))  # exact
        exact -= piece
    return out


@functools.lru_cache(maxsize=1)
def _half_pi_pieces() -> tuple[float, ...]:
    return tuple(_split(_pi(60) / 2, 4, 27))


@functools.lru_cache(maxsize=1)
def _anchor_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Double-double sin and cos of m/64 for m in [-_ANCHORS, _ANCHORS]: (s_hi, s_lo, c_hi, c_lo)."""
    tables = np.zeros((4, 2 * _ANCHORS + 1))
    for j, m in enumerate(range(-_ANCHORS, _ANCHORS + 1)):
        s, c = _sin_cos(Decimal(m) / 64, 40)
        for row, value in ((0, s), (2, c)):
            hi = float(value)
            tables[row, j], tables[row + 1, j] = hi, float(value - Decimal(hi))
    return tables[0], tables[1], tables[2], tables[3]


def _int_digits(theta: float) -> int:
    """Decimal digits of the integer part of the largest w_i (> 1 only when theta < 1), plus margin."""
    return (max(0, math.ceil(-math.log10(theta))) if theta < 1 else 0) + 2


def _frequency(head_dim: int, theta: float, i: int, digits: int) -> Decimal:
    """``w_i = exp(-(2i/D) ln theta)`` to ``digits`` significant digits, theta's exact binary64 value."""
    ctx = _context(digits + 5)
    ln_theta = Decimal(theta).ln(ctx)
    return +ctx.exp(ctx.multiply(ctx.divide(Decimal(-2 * i), Decimal(head_dim)), ln_theta))


@functools.lru_cache(maxsize=64)
def _pieces(head_dim: int, theta: float) -> np.ndarray:
    """float64 [4, D/2]: the pieces of ``w_i mod 2 pi`` in [-pi, pi] (module docstring, step 1)."""
    digits = 60 + _int_digits(theta)
    ctx = _context(digits)
    two_pi = ctx.multiply(2, _pi(digits + 10))
    pieces = np.zeros((4, head_dim // 2))
    for i in range(head_dim // 2):
        w = _frequency(head_dim, theta, i, digits)
        turns = ctx.divide(w, two_pi).to_integral_value(decimal.ROUND_HALF_EVEN)
        pieces[:, i] = _split(ctx.subtract(w, ctx.multiply(two_pi, turns)), 4, 26)
    return pieces


def _exact_value(p: int, head_dim: int, theta: float, i: int, which: int, digits: int) -> Decimal:
    """``sin`` (which = 0) or ``cos`` (which = 1) of ``p w_i`` with absolute error below 10**-digits."""
    extra = len(str(p)) + _int_digits(theta) + 10  # digits of p * w_i before the point, and margin
    x = _context(digits + 2 * extra).multiply(Decimal(p), _frequency(head_dim, theta, i, digits + 2 * extra))
    return _sin_cos(x, digits + extra)[which]


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast(positions: np.ndarray, pieces: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Float64 cos, sin [P, F] of ``p * w`` and the error bound of each (module docstring)."""
    p = positions.astype(np.float64)[:, None]
    h = _half_pi_pieces()
    t0, t1 = p * pieces[0], p * pieces[1]
    k = np.rint((t0 + t1) * (2.0 / math.pi))  # t1 (<= 2**-25 |t0|) still moves x by up to pi/4
    hi, lo = t0 - k * h[0], np.zeros_like(t0)  # exact (Sterbenz, or both on a 2**-50 grid below 2)
    for term in (t1, -k * h[1], p * pieces[2], -k * h[2], p * pieces[3], -k * h[3]):
        hi, err = _two_sum(hi, term)
        lo = lo + err
    m = np.rint(hi * 64.0)
    d = (hi - m / 64.0) + lo  # hi - m/64 exact (Sterbenz)
    z = d * d
    sin_d = d + d * (z * (-1 / 6 + z * (1 / 120 + z * (-1 / 5040 + z * (1 / 362880)))))
    cos_dm1 = z * (-1 / 2 + z * (1 / 24 + z * (-1 / 720 + z * (1 / 40320 + z * (-1 / 3628800)))))
    s_hi, s_lo, c_hi, c_lo = (t[(m + _ANCHORS).astype(np.int64)] for t in _anchor_tables())
    sin_r = s_hi + (s_lo + s_hi * cos_dm1 + c_hi * sin_d)
    cos_r = c_hi + (c_lo + c_hi * cos_dm1 - s_hi * sin_d)
    quadrant = k.astype(np.int64) & 3
    cos = np.choose(quadrant, [cos_r, -sin_r, -cos_r, sin_r])
    sin = np.choose(quadrant, [sin_r, cos_r, -sin_r, -cos_r])
    absolute = np.where(k != 0, _ABS_BOUND_REDUCED, 0.0) + _ABS_FLOOR
    return cos, sin, absolute


def _settled(y: np.ndarray, absolute: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp32 of y, and where it is certainly the correct rounding of the exact value (same bits,
    so -0 and +0 differ: the sign of a value that rounds to zero must be certain too)."""
    bound = _REL_BOUND * np.abs(y) + absolute
    low, high = (y - bound).astype(np.float32), (y + bound).astype(np.float32)
    return low, low.view(np.int32) == high.view(np.int32)


def _round_fp32(value_at: Callable[[int], Decimal], max_digits: int = 400) -> float:
    """Correct fp32 rounding of a nonzero real given by ``value_at(digits)`` (absolute error < 10**-digits).

    The fp32 neighbours of the float guess are tried; one wins when the value's whole error
    interval lies strictly between its two rounding midpoints (exact rational comparisons).
    Otherwise the precision doubles.
    """
    digits = 50
    while digits <= max_digits:
        value = value_at(digits)
        exact, err = Fraction(value), Fraction(1, 10**digits)
        guess = np.float32(float(value))
        for c in (guess, np.nextafter(guess, np.float32(-np.inf)), np.nextafter(guess, np.float32(np.inf))):
            here = Fraction(float(c))
            below = Fraction(float(np.nextafter(c, np.float32(-np.inf))))
            above = Fraction(float(np.nextafter(c, np.float32(np.inf))))
            if (here + below) / 2 < exact - err and exact + err < (here + above) / 2:
                return math.copysign(float(c), float(exact)) if c == 0 else float(c)  # -0 for tiny negatives
        digits *= 2
    raise RuntimeError(f"rope tables: a value could not be rounded to fp32 at {max_digits} digits "
                       f"(an exact fp32 midpoint?)")


def table_rows(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Correctly rounded fp32 ``cos(p w_i)``, ``sin(p w_i)`` for the given positions.

    Parameters
    ----------
    positions : ndarray of int, [P], values in [0, 2**24)
    head_dim : int
        Even, >= 2; the tables have head_dim / 2 columns.
    theta : float
        Finite, > 0 (its exact binary64 value is used).

    Returns
    -------
    cos, sin : ndarray, float32, [P, head_dim // 2]
    """
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    theta = float(theta)
    pieces = _pieces(head_dim, theta)
    half = head_dim // 2
    cos32 = np.empty((positions.size, half), dtype=np.float32)
    sin32 = np.empty_like(cos32)
    rows_per_block = max(1, _BLOCK_ENTRIES // half)
    for start in range(0, positions.size, rows_per_block):
        block = positions[start:start + rows_per_block]
        cos64, sin64, absolute = _fast(block, pieces)
        for fast, out, which in ((cos64, cos32, 1), (sin64, sin32, 0)):
            rounded, settled = _settled(fast, absolute)
            out[start:start + block.size] = rounded
            for row, col in zip(*np.nonzero(~settled)):
                p = int(block[row])
                if p:  # position 0 is set exactly below
                    out[start + row, col] = _round_fp32(functools.partial(_exact_value, p, head_dim, theta,
                                                                          int(col), which))
        zero = np.nonzero(block == 0)[0]
        cos32[start + zero] = 1.0
        sin32[start + zero] = 0.0
    return cos32, sin32
