"""Optimizer host scalars, each the correctly rounded fp32 of an exact real (contracts ``adamw``, ``sgd``).

Written for the product, independently of the contract's reference (which uses exact
fractions): integer arithmetic only. ``beta**step`` is bracketed between a lower and an upper
bound on a 2**-160 grid (exponentiation by squaring, rounding down and up); a scalar whose two
bounds round to the same fp32 value is that value (rounding is monotone), otherwise it is
computed again from the exact power (never seen for steps below 2**31 but kept for
correctness). Results are cached per argument tuple: a training step asks once per parameter.
"""

from __future__ import annotations

import functools
import math

__all__ = ["host_scalars", "rn32", "rn32_sqrt", "sgd_scalars"]

_P = 160  # fractional bits of the bounds on beta**step


def _floor_log2(n: int, d: int) -> int:
    """floor(log2(n / d)) for positive integers."""
    e = n.bit_length() - d.bit_length()
    if (n << max(0, -e)) < (d << max(0, e)):
        e -= 1
    return e


def rn32(n: int, d: int) -> float:
    """fp32 nearest to the rational ``n / d`` (``d > 0``), ties to even, +-inf past the range."""
    if n == 0:
        return 0.0
    if n < 0:
        return -rn32(-n, d)
    e = max(_floor_log2(n, d), -126)  # subnormals share the exponent -126 (and the 2**-149 step)
    if e > 127:
        return math.inf
    shift = 23 - e
    num, den = (n << shift, d) if shift >= 0 else (n, d << -shift)
    q, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and q & 1):
        q += 1
    value = math.ldexp(q, -shift)
    return math.inf if value >= 2.0**128 else value


def rn32_sqrt(n: int, d: int) -> float:
    """fp32 nearest to ``sqrt(n / d)`` for ``n, d > 0`` with a normal fp32 result."""
    e = _floor_log2(n, d) // 2  # floor(log2(sqrt(n / d)))
    shift = 23 - e  # sqrt(n / d) * 2**shift lies in [2**23, 2**24)
    num, den = (n << (2 * shift), d) if shift >= 0 else (n, d << (-2 * shift))
    q = math.isqrt(num // den)  # floor(sqrt(num / den))
    # nearer to q + 1 iff num / den > (q + 1/2)**2  <=>  4 num > den (2q + 1)**2
    lhs, rhs = 4 * num, den * (2 * q + 1) ** 2
    if lhs > rhs or (lhs == rhs and q & 1):
        q += 1
    return math.ldexp(q, -shift)


def _ratio(x: float) -> tuple[int, int]:
    return x.as_integer_ratio()


def _pow_bounds(beta: float, step: int) -> tuple[int, int]:
    """Integers lo <= beta**step * 2**_P <= hi."""
    n, d = _ratio(beta)  # d is a power of two
    one = 1 << _P
    b_lo = (n << _P) // d
    b_hi = -((-(n << _P)) // d)
    lo = hi = one
    e = step
    while e:
        if e & 1:
            lo, hi = (lo * b_lo) >> _P, -((-(hi * b_hi)) >> _P)
        e >>= 1
        if e:
            b_lo, b_hi = (b_lo * b_lo) >> _P, -((-(b_hi * b_hi)) >> _P)
    return lo, min(hi, one)


def _one_minus_pow(beta: float, step: int) -> list[tuple[int, int]]:
    """``1 - beta**step`` as rationals: [upper bound, lower bound], or [exact] if the bounds are
    too wide (the caller rounds each and compares)."""
    lo, hi = _pow_bounds(beta, step)
    one = 1 << _P
    return [(one - lo, one), (one - hi, one)]


def _exact_one_minus_pow(beta: float, step: int) -> tuple[int, int]:
    n, d = _ratio(beta)
    dn = d**step
    return dn - n**step, dn


@functools.lru_cache(maxsize=256)
def host_scalars(step: int, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> tuple[float, ...]:
    """``(b1, c1, b2, c2, eps, decay, step_size, bc2_sqrt)`` of contract ``adamw``.

    ``b = RN32(beta)``, ``c = RN32(1 - beta)``, ``eps = RN32(eps)``,
    ``decay = RN32(1 - lr * weight_decay)``, ``step_size = RN32(lr / (1 - beta1**step))``,
    ``bc2_sqrt = RN32(sqrt(1 - beta2**step))``: exact real arithmetic on the fp64 arguments,
    one rounding each.
    """
    b1n, b1d = _ratio(beta1)
    b2n, b2d = _ratio(beta2)
    lrn, lrd = _ratio(lr)
    wdn, wdd = _ratio(weight_decay)
    en, ed = _ratio(eps)

    def step_size(one_minus: tuple[int, int]) -> float:
        n, d = one_minus
        return rn32(lrn * d, lrd * n)

    def bc2(one_minus: tuple[int, int]) -> float:
        return rn32_sqrt(*one_minus)

    s1 = {step_size(b) for b in _one_minus_pow(beta1, step)}
    s2 = {bc2(b) for b in _one_minus_pow(beta2, step)}
    ss = s1.pop() if len(s1) == 1 else step_size(_exact_one_minus_pow(beta1, step))
    bc = s2.pop() if len(s2) == 1 else bc2(_exact_one_minus_pow(beta2, step))
    return (rn32(b1n, b1d), rn32(b1d - b1n, b1d), rn32(b2n, b2d), rn32(b2d - b2n, b2d), rn32(en, ed),
            rn32(lrd * wdd - lrn * wdn, lrd * wdd), ss, bc)


@functools.lru_cache(maxsize=256)
def sgd_scalars(lr: float, momentum: float, dampening: float, weight_decay: float) -> tuple[float, ...]:
    """``(lr32, mu, wd32, damp)`` of contract ``sgd``: ``RN32`` of lr, momentum, weight_decay and of
    the exact real ``1 - dampening``."""
    dn, dd = _ratio(dampening)
    return (rn32(*_ratio(lr)), rn32(*_ratio(momentum)), rn32(*_ratio(weight_decay)), rn32(dd - dn, dd))
