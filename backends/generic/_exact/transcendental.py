"""Device-generic ``exp_c`` and ``log_c`` (R2, docs/numerics.md P6): exact on any IEEE device.

Plain tensor operations that every device computes the same way: fp32 ``+ - *`` of two
tensors (a 0-d fp32 tensor counts as one), int32 arithmetic and shifts, bit reinterpretation
with ``Tensor.view``, comparisons and ``torch.where``. No math-library call (``exp``, ``log``,
``pow``, ``ldexp``, ``frexp``, ``round``), no division, no fused op (``addcmul``, ``lerp``,
``add(alpha=)``): each line below is one IEEE rounding, so CPU, CUDA, ROCm, NPU and MUSA
agree. Eager PyTorch does not fuse separate elementwise ops; do not run these functions
under ``torch.compile`` or any other compiler that may contract ``a * b + c`` into an FMA.

This implementation is written independently of the contract reference (it must not import
it, import-linter enforces that); conformance and ``tools/measure_transcendentals.py`` check
that the two agree bit for bit on every fp32 input. Where the reference is literal
(``round``, ``frexp``, multiplications by powers of two), this one works on the bits:
``k`` comes out of the significand of ``t + 1.5 * 2**23``, the exponent split of ``log``
is one integer subtraction, and the first half of the ``2**k`` scaling is an integer add to
the exponent field. The rounded fp32 operations are the same, in the same order.
"""

from __future__ import annotations

import torch

# binary32 encodings (values in comments); see the contract for their derivation
_LOG2E = 0x3FB8AA3B  # 1.44269502162933349609375
_LN2_HI = 0x3F317200  # 0.693145751953125, 9 trailing zero significand bits
_LN2_LO = 0x35BFBE8E  # 1.428606765330187e-06
_ROUNDER = 0x4B400000  # 1.5 * 2**23: t + ROUNDER rounds t to an integer, ties to even
_X_MAX = 0x42B20000  # 89.0
_X_MIN = 0xC2D00000  # -104.0
_SQRT_HALF = 0x3F3504F3  # 0.70710677
_TWO_P23 = 0x4B000000  # 2**23
_ONE = 0x3F800000
_HALF = 0x3F000000
_NAN = 0x7FC00000
_PINF = 0x7F800000
_NINF = 0xFF800000
_ABS_MASK = 0x7FFFFFFF
_MIN_NORMAL_BITS = 0x00800000
_F_HEAD_MASK = -4096  # log: f truncated to its 12 leading significand bits (12 low encoding bits cleared)

# exp: (e^r - 1 - r) / r^2 ~ E0 + E1 r + E2 r^2 + E3 r^3 + E4 r^4
_E0 = 0x3EFFFFFE  # 0.4999999403953552
_E1 = 0x3E2AAA49  # 0.1666652113199234
_E2 = 0x3D2AAC79  # 0.04166838899254799
_E3 = 0x3C091D01  # 0.00836873147636652
_E4 = 0x3AB511F8  # 0.001381455920636654

# log: (log1p(f) - f + f^2/2) / f^3 ~ L0 + L1 f + ... + L7 f^7
_L0 = 0x3EAAAAAA  # 0.3333333134651184
_L1 = 0xBE800113  # -0.2500081956386566
_L2 = 0x3E4CD003  # 0.20001225173473358
_L3 = 0xBE2A3924  # -0.1662335991859436
_L4 = 0x3E116D09  # 0.14201749861240387
_L5 = 0xBE06C2A2  # -0.13160184025764465
_L6 = 0x3E02ADB5  # 0.1276157647371292
_L7 = 0xBD9C5ABE  # -0.07634495198726654


def _f32(bits: int, device: torch.device) -> torch.Tensor:
    """0-d fp32 tensor on ``device`` with the given binary32 encoding."""
    if bits >= 1 << 31:
        bits -= 1 << 32
    return torch.full((), bits, dtype=torch.int32, device=device).view(torch.float32)


def _require_fp32(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.float32:
        raise TypeError(f"{name}: expected a float32 tensor, got {x.dtype}; cast with x.float() first")


def _round_k(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, float(k))``, ``k = rne(t)`` for fp32 |t| < 2**22: one add of 1.5 * 2**23 (ties to even).

    The integer sits in the low significand bits of ``t + 1.5 * 2**23``; subtracting the
    constant again is exact.
    """
    rounder = _f32(_ROUNDER, t.device)
    shifted = t + rounder
    k = shifted.view(torch.int32) - _ROUNDER
    return k, shifted - rounder


def exp_c(x: torch.Tensor) -> torch.Tensor:
    """Contract exponential ``y = exp_c(x) ~ e**x`` of fp32, device-generic.

    Parameters
    ----------
    x : Tensor, float32, any shape ``[...]``, any device

    Returns
    -------
    Tensor, float32, shape ``[...]``, on ``x.device``

    Bitwise semantics
    -----------------
    Identical bits to the contract ``exp_c`` (version 1) on every input: Cody-Waite
    reduction ``r = x - k ln2`` with ``k = rne(RN(x * log2e))`` and two-part ln2, the
    reduction error and the rounding error of ``1 + r`` carried by TwoSum/FastTwoSum, a
    degree-4 Horner polynomial for ``(e^r - 1 - r) / r^2``, one rounding for ``p ~ e^r``, then
    ``RN(RN(p * 2**a) * 2**(k - a))``, ``a = floor(k / 2)``. Elementwise. NaN -> 0x7FC00000,
    x > 89 -> +inf, x < -104 -> +0, subnormal results rounded once.
    """
    _require_fp32("exp_c", x)
    dev = x.device
    bits = x.view(torch.int32)
    is_nan = (bits & _ABS_MASK) > _PINF
    overflow = x > _f32(_X_MAX, dev)
    underflow = x < _f32(_X_MIN, dev)
    dead = is_nan | overflow | underflow
    xr = torch.where(dead, torch.zeros_like(x), x)

    k, kf = _round_k(xr * _f32(_LOG2E, dev))  # t = RN(x * log2e), then k = rne(t)

    # Cody-Waite: the product with LN2_HI and the subtraction are exact
    r_hi = xr - kf * _f32(_LN2_HI, dev)
    corr = kf * _f32(_LN2_LO, dev)
    r = r_hi - corr
    back = r - r_hi
    r_err = (r_hi - (r - back)) - (corr + back)  # exact error of r (TwoSum)

    one = _f32(_ONE, dev)
    lead = one + r
    lead_err = (one - lead) + r  # exact error of lead (FastTwoSum, |1| >= |r|)

    poly = _f32(_E4, dev) * r + _f32(_E3, dev)
    poly = poly * r + _f32(_E2, dev)
    poly = poly * r + _f32(_E1, dev)
    poly = poly * r + _f32(_E0, dev)
    quad = (r * r) * poly
    p = lead + ((lead_err + r_err) + quad)  # p in [0.70, 1.42], normal

    # 2**k in two steps (P2). p * 2**a is exact and normal: add a to the exponent field.
    a = k >> 1  # floor(k / 2)
    p_a = (p.view(torch.int32) + (a << 23)).view(torch.float32)
    y = p_a * ((k - a + 127) << 23).view(torch.float32)  # the one rounding of the scaling

    y = torch.where(overflow, _f32(_PINF, dev), y)
    y = torch.where(underflow, torch.zeros_like(y), y)
    return torch.where(is_nan, _f32(_NAN, dev), y)


def log_c(x: torch.Tensor) -> torch.Tensor:
    """Contract natural logarithm ``y = log_c(x) ~ ln(x)`` of fp32, device-generic.

    Parameters
    ----------
    x : Tensor, float32, any shape ``[...]``, any device

    Returns
    -------
    Tensor, float32, shape ``[...]``, on ``x.device``

    Bitwise semantics
    -----------------
    Identical bits to the contract ``log_c`` (version 1) on every input: subnormals scaled by
    2**23, ``x = m * 2**e`` with m in [sqrt(1/2), sqrt(2)) from the bits, ``f = m - 1``
    exact, ``log1p(f) = f - f^2/2 + f^3 R(f)`` with ``f^2/2`` split exactly into a 24-bit
    head (from a 12-bit truncation of f) and a small tail, ``e * ln2`` in two parts, the
    leading sums carried by FastTwoSum, one final rounding. Elementwise. NaN, x < 0 ->
    0x7FC00000; +-0 -> -inf; +inf -> +inf; ``log_c(1) = +0``.
    """
    _require_fp32("log_c", x)
    dev = x.device
    bits = x.view(torch.int32)
    mag = bits & _ABS_MASK
    is_zero = mag == 0
    is_nan = (mag > _PINF) | ((bits < 0) & ~is_zero)  # NaN of any sign, or negative nonzero
    is_inf = bits == _PINF
    dead = is_nan | is_zero | is_inf
    xr = torch.where(dead, _f32(_ONE, dev), x)

    # exponent and significand from the bits; subnormals first scaled up by 2**23 (exact)
    tiny = xr.view(torch.int32) < _MIN_NORMAL_BITS
    xs = torch.where(tiny, xr * _f32(_TWO_P23, dev), xr)
    ix = xs.view(torch.int32)
    e = (ix - _SQRT_HALF) >> 23  # floor(log2(xs / SQRT_HALF))
    m = (ix - (e << 23)).view(torch.float32)  # xs * 2**-e, in [SQRT_HALF, 2 * SQRT_HALF)
    e = e - torch.where(tiny, 23, 0).to(torch.int32)

    one = _f32(_ONE, dev)
    half = _f32(_HALF, dev)
    f = m - one  # exact
    ef = e.to(torch.float32)
    hi = ef * _f32(_LN2_HI, dev)  # exact
    lo = ef * _f32(_LN2_LO, dev)

    f_head = (f.view(torch.int32) & _F_HEAD_MASK).view(torch.float32)  # 12 significant bits
    f_tail = f - f_head  # exact
    sq_head = half * (f_head * f_head)  # exact
    sq_tail = half * (f_tail * (f + f_head))  # f^2/2 - sq_head, rounded
    s1 = f - sq_head
    s1_err = (f - s1) - sq_head  # exact (FastTwoSum, |f| > sq_head)

    poly = _f32(_L7, dev) * f + _f32(_L6, dev)
    poly = poly * f + _f32(_L5, dev)
    poly = poly * f + _f32(_L4, dev)
    poly = poly * f + _f32(_L3, dev)
    poly = poly * f + _f32(_L2, dev)
    poly = poly * f + _f32(_L1, dev)
    poly = poly * f + _f32(_L0, dev)
    cubic = ((f * f) * f) * poly

    head = hi + s1
    head_err = s1 - (head - hi)  # exact (FastTwoSum: hi = 0 or |hi| > |s1|)
    small = ((s1_err - sq_tail) + cubic) + lo
    y = head + (head_err + small)

    y = torch.where(is_zero, _f32(_NINF, dev), y)
    y = torch.where(is_inf, _f32(_PINF, dev), y)
    return torch.where(is_nan, _f32(_NAN, dev), y)
