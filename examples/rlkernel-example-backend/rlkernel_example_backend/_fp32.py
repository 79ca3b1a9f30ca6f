"""The exact fp32 building blocks the two kernels need, in plain PyTorch on the CPU.

Written from docs/numerics.md (P1-P4, P6, P8). Every fp32 ``+ - * /`` below is one PyTorch
elementwise op on two tensors: one IEEE round-to-nearest-even each, never fused (eager PyTorch
does not contract ``a * b + c``; do not run this under ``torch.compile``).
"""

from __future__ import annotations

import numpy as np
import torch

#: canonical NaN encodings (P8)
_NAN_BITS = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def f32(bits: int) -> torch.Tensor:
    """The 0-d fp32 tensor with binary32 encoding ``bits``."""
    return torch.tensor(bits - (1 << 32) if bits >= 1 << 31 else bits, dtype=torch.int32).view(torch.float32)


def pow2(n: torch.Tensor) -> torch.Tensor:
    """``2**n`` in fp32, exact, for integer ``n`` in [-126, 127]: written into the exponent field."""
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def ldexp_c(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """P2: ``RN(RN(y * 2**a) * 2**(k - a))`` with ``a = floor(k / 2)``, for |k| <= 252."""
    a = torch.div(k, 2, rounding_mode="floor")
    return (y * pow2(a)) * pow2(k - a)


def int64_to_fp32(s: torch.Tensor) -> torch.Tensor:
    """P3: int64 to fp32 with one correct rounding (ties to even).

    Below 2**53 the float64 conversion is exact, so rounding it to fp32 is the one rounding.
    Above, the 11 low bits are folded into a sticky bit ("round to odd" on 52 bits): the
    float64 value is then exact again, and rounding it to 24 bits gives the correctly rounded
    result.
    """
    mag = s.abs()
    odd = (mag >> 11) | ((mag & 2047) != 0).to(torch.int64)
    wide = torch.where(mag >= 1 << 53, odd.to(torch.float64) * 2048.0, mag.to(torch.float64))
    return torch.where(s < 0, -wide, wide).to(torch.float32)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 square root, correctly rounded.

    ``torch.sqrt`` is not correctly rounded on every CPU build; NumPy's float64 ``sqrt`` is
    the IEEE operation, and rounding a correctly rounded 53-bit root to 24 bits is again
    correctly rounded (53 >= 2 * 24 + 2). ``sqrt(-0) = -0``, negative and NaN give NaN.
    """
    with np.errstate(invalid="ignore"):
        root = np.asarray(np.sqrt(x.to(torch.float64).numpy()))
    return torch.from_numpy(root).to(torch.float32)


def canonical(y: torch.Tensor) -> torch.Tensor:
    """P8: every NaN replaced by the canonical NaN of ``y``'s dtype."""
    bits = _NAN_BITS[y.dtype]
    width = torch.finfo(y.dtype).bits
    signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
    nan = torch.tensor(signed, dtype=torch.int32 if width == 32 else torch.int16).view(y.dtype)
    return torch.where(torch.isnan(y), nan, y)


def fixed_sum_last(t: torch.Tensor, frac_bits: int = 40) -> torch.Tensor:
    """P4 on the max grid over the last axis: ``ldexp_c(RN32(sum RNE(t * 2**(F - E))), E - F)``.

    ``E = expo(max |t|)`` over the finite terms (0 for an all-zero row). Each term is placed on
    the grid exactly in float64 and rounded half to even; the int64 sum is exact, so the order
    of the additions cannot matter. NaN, or +inf and -inf together, give NaN; otherwise an
    infinity gives that infinity. The caller keeps ``count * 2**F < 2**63``.
    """
    finite = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    _, e = torch.frexp(finite.abs().amax(dim=-1).to(torch.float64))  # expo: 2**(e-1) <= |m| < 2**e; 0 -> 0
    e = e.to(torch.int64)
    scale = torch.ldexp(torch.ones_like(e, dtype=torch.float64), frac_bits - e)  # exact powers of two
    total = torch.round(finite.to(torch.float64) * scale.unsqueeze(-1)).to(torch.int64).sum(dim=-1)
    out = ldexp_c(int64_to_fp32(total), e - frac_bits)
    pos, neg = (t == float("inf")).any(dim=-1), (t == float("-inf")).any(dim=-1)
    out = torch.where(pos, torch.full_like(out, float("inf")), out)
    out = torch.where(neg, torch.full_like(out, float("-inf")), out)
    bad = torch.isnan(t).any(dim=-1) | (pos & neg)
    return torch.where(bad, torch.full_like(out, float("nan")), out)


# exp_c (P6): the constants and the 13 steps of the contract's exponential, as documented.
_LOG2E, _LN2_HI, _LN2_LO = f32(0x3FB8AA3B), f32(0x3F317200), f32(0x35BFBE8E)
_X_MAX, _X_MIN = f32(0x42B20000), f32(0xC2D00000)  # 89.0, -104.0
_Q = [f32(b) for b in (0x3EFFFFFE, 0x3E2AAA49, 0x3D2AAC79, 0x3C091D01, 0x3AB511F8)]  # Q0 .. Q4
_ONE = f32(0x3F800000)


def exp_c(x: torch.Tensor) -> torch.Tensor:
    """The contract exponential of fp32 ``x``: Cody-Waite reduction, a degree-4 polynomial with
    carried rounding errors, then ``ldexp_c``. NaN -> canonical NaN, x > 89 -> +inf,
    x < -104 -> +0."""
    nan, big, small = torch.isnan(x), x > _X_MAX, x < _X_MIN
    xr = torch.where(nan | big | small, torch.zeros_like(x), x)
    k = torch.round(xr * _LOG2E).to(torch.int32)  # steps 1-2: ties to even, exact here
    kf = k.to(torch.float32)  # +0 for k = 0
    r1 = xr - kf * _LN2_HI  # 3 (both operations exact)
    c = kf * _LN2_LO  # 4
    r = r1 - c  # 5
    v = r - r1  # 6: TwoSum error of r1 - c
    er = (r1 - (r - v)) - (c + v)
    s = _ONE + r  # 7, with its FastTwoSum error
    e1 = (_ONE - s) + r
    r2 = r * r  # 8
    q = _Q[4] * torch.ones_like(r)  # 9: Horner from Q4 down to Q0, one rounding per operation
    for coef in (_Q[3], _Q[2], _Q[1], _Q[0]):
        q = q * r
        q = q + coef
    t2 = r2 * q  # 10
    tail = (e1 + er) + t2  # 11
    p = s + tail  # 12
    y = ldexp_c(p, k)  # 13
    y = torch.where(big, torch.full_like(y, float("inf")), y)
    y = torch.where(small, torch.zeros_like(y), y)
    return canonical(torch.where(nan, torch.full_like(y, float("nan")), y))
