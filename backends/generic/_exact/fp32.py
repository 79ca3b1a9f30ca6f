"""Device-generic fp32 helpers built from integer bit manipulation (no float64, no libm).

Exponents are read from the bits, powers of two are built from bits, and int64 -> fp32 is
rounded in integer arithmetic, so every device that has int32/int64 and IEEE fp32 gives the
same bits.
"""

from __future__ import annotations

import torch

from . import intpath

_NAN_BITS = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def bits_of(x: torch.Tensor) -> torch.Tensor:
    """The fp32 bit pattern of ``x`` (upcast exactly) as int64 in [0, 2**32)."""
    return x.to(torch.float32).view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def bit_length(a: torch.Tensor) -> torch.Tensor:
    """Bit length of non-negative int64 values (0 for 0), read from the exponent of their fp32 conversion.

    A conversion rounds ``a >= 2**(n-1)`` (n its bit length) to a value in ``[2**(n-1), 2**n]``
    whatever its rounding, so the exponent gives n, or n + 1 where it rounded up to ``2**n``; the
    shift test ``a >> n == 0`` takes that one back. 14 torch operations (a binary search took 37:
    the generic backwards on a GPU are bound by the host's time per operation).
    """
    e = ((a.to(torch.float32).view(torch.int32) >> 23).to(torch.int64) - 126).clamp(min=0)
    over = (e > 0) & ((a >> (e - 1).clamp(min=0)) == 0)
    return e - over.to(torch.int64)


def exponent(x: torch.Tensor) -> torch.Tensor:
    """``e`` with ``2**(e-1) <= |x| < 2**e`` for finite nonzero x, 0 for zero; int64."""
    b = bits_of(x)
    biased = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    sub = bit_length(mant) - 149
    e = torch.where(biased == 0, sub, biased - 126)
    return torch.where((b & 0x7FFFFFFF) == 0, torch.zeros_like(e), e)


def pow2_f32(k: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**k`` for int64 k in [-126, 127], built from the exponent bits."""
    return ((k + 127) << 23).to(torch.int32).view(torch.float32)


def scale_pow2(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(y * 2**a) * 2**(k - a)``, ``a = floor(k / 2)``: two fp32 multiplies.

    k is clamped to [-252, 254], where both factors are normal powers of two. For the
    |y| < 2**64 that the contracts scale (int64 totals), every k below -252 gives +-0 and
    every k above 254 gives +-inf either way, so the clamp changes no bit.
    """
    k = k.clamp(min=-252, max=254)
    a = torch.div(k, 2, rounding_mode="floor")
    return (y * pow2_f32(a)) * pow2_f32(k - a)


def _int_rounds_up(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    """int64 -> fp32 rounding, half to even: does ``q + rem / (2 * half)`` round up to ``q + 1``?"""
    return (rem > half) | ((rem == half) & ((q & 1) == 1))


def int64_to_f32(s: torch.Tensor) -> torch.Tensor:
    """Round int64 to fp32 (nearest, ties to even) in integer arithmetic, then convert exactly."""
    if intpath.int32(s.device):  # the same rounding on int32 limbs
        from . import limbs32

        return limbs32.to_f32(limbs32.from_int64(s).reshape(-1, 4)).reshape(s.shape)
    mag = s.abs()
    drop = (bit_length(mag) - 24).clamp(min=0)
    q = mag >> drop
    rem = mag - (q << drop)
    half = torch.where(drop > 0, torch.ones_like(drop) << (drop - 1).clamp(min=0), torch.zeros_like(drop))
    up = (drop > 0) & _int_rounds_up(q, rem, half)
    q = q + up.to(torch.int64)  # q <= 2**24: exact in fp32
    out = scale_pow2(q.to(torch.float32), drop)
    return torch.where(s < 0, -out, out)


#: significand bits and log2 of the smallest subnormal of each output format
_FORMATS = {torch.float32: (24, -149), torch.bfloat16: (8, -133), torch.float16: (11, -24)}


def int64_to_float(s: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``s * 2**k`` rounded once (nearest, ties to even) to ``dtype``, in integer arithmetic.

    The kept bits are the format's significand, or fewer where the value falls below the
    format's normal range (the subnormal quantum); ``q * 2**(drop + k)`` is then a value of
    ``dtype`` (or beyond its range: +-inf), built exactly in fp32 and converted exactly. Zero
    gives +0. ``s``: int64 with ``|s| < 2**63``; ``k``: int64 broadcastable to ``s``.
    """
    if intpath.int32(s.device):  # the same rounding read from int32 limbs
        from .digits32 import int64_to_float as int64_to_float_int32

        return int64_to_float_int32(s, k, dtype)
    bits, quantum = _FORMATS[dtype]
    mag = s.abs()
    drop = torch.maximum(bit_length(mag) - bits, quantum - k).clamp(min=0, max=63)
    q = mag >> drop
    rem = mag - (q << drop)
    half = torch.where(drop > 0, torch.ones_like(drop) << (drop - 1).clamp(min=0), torch.zeros_like(drop))
    up = (drop > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    q = q + up.to(torch.int64)  # q <= 2**bits: exact in fp32
    out = scale_pow2(q.to(torch.float32), drop + k).to(dtype)
    return torch.where(s < 0, -out, out)


def int64_pair_to_float(hi: torch.Tensor, lo: torch.Tensor, shift: int, k: torch.Tensor,
                        dtype: torch.dtype) -> torch.Tensor:
    """``(hi * 2**shift + lo) * 2**k`` rounded once to ``dtype`` (|hi|, |lo| < 2**62, 1 <= shift <= 40).

    The magnitude is carried as ``top * 2**shift + low`` with ``0 <= low < 2**shift``. While it fits
    in 62 bits it is rounded whole; beyond, the rounding position lies above bit ``shift`` of it,
    so ``low`` only decides the sticky bit, folded into ``top``'s last bit.
    """
    carry = lo >> shift  # arithmetic shift: floor division
    low = lo - (carry << shift)
    top = hi + carry
    neg = top < 0
    borrow = neg & (low != 0)
    top = torch.where(neg, -top - borrow.to(torch.int64), top)
    low = torch.where(borrow, (1 << shift) - low, low)
    fits = top < (1 << (62 - shift))
    whole = (torch.where(fits, top, torch.zeros_like(top)) << shift) + low
    sticky = top | (low != 0).to(torch.int64)
    mag = torch.where(fits, whole, sticky)
    out = int64_to_float(torch.where(neg, -mag, mag), torch.where(fits, k, k + shift), dtype)
    return out


def int_sum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Exact integer sum of bool or int64 ``x`` (all of it, or along ``dim``), int64.

    Counts and sums of counts: int64 ``sum`` by default; where :mod:`intpath` selects int32 limbs,
    booleans are counted in int32 (below 2**31 elements) and int64 values summed on limbs.
    """
    if not intpath.int32(x.device):
        return x.sum() if dim is None else x.sum(dim=dim, keepdim=keepdim)
    from . import limbs32

    if x.dtype == torch.bool and x.numel() < 1 << 31:
        out = x.sum(dtype=torch.int32) if dim is None else x.sum(dim=dim, keepdim=keepdim, dtype=torch.int32)
        return out.to(torch.int64)
    return limbs32.int64_sum(x.to(torch.int64), dim, keepdim)


def canonical_nan(t: torch.Tensor) -> torch.Tensor:
    """Replace NaNs by the dtype's canonical NaN (fp32 0x7FC00000, bf16 0x7FC0, fp16 0x7E00)."""
    if not t.is_floating_point():
        return t
    if t.dtype == torch.float32:
        nan = torch.full((), 0x7FC00000, dtype=torch.int32, device=t.device).view(torch.float32)
    else:
        nan = torch.full((), _NAN_BITS[t.dtype], dtype=torch.int16, device=t.device).view(t.dtype)
    return torch.where(t != t, nan, t)


def cast_out(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 -> ``dtype`` (round to nearest even, overflow to inf), canonical NaN."""
    return canonical_nan(y.to(dtype))


def nan_max(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Max along ``dim`` with NaN propagation and a +0 zero (R5)."""
    m = torch.amax(x, dim=dim, keepdim=keepdim) + 0.0  # -0 + 0 = +0 under round-to-nearest
    has_nan = torch.isnan(x).any(dim=dim, keepdim=keepdim)
    return torch.where(has_nan, torch.full_like(m, float("nan")), m)


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """Argmax over the last axis: first NaN if any, else the lowest index among ties (R5)."""
    n = x.shape[-1]
    pos = torch.arange(n, device=x.device)
    nan = x != x
    key = torch.where(nan, torch.full_like(x, float("inf")), x)
    best = torch.amax(key, dim=-1, keepdim=True)
    hit = (key == best) & (~nan.any(dim=-1, keepdim=True) | nan)
    return torch.where(hit, pos, n).amin(dim=-1)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 square root, correctly rounded, from int64 tensor arithmetic only.

    ``torch.sqrt`` is not used: it is not correctly rounded on every build (the CPU build in CI
    misrounds about 17% of fp32 roots), and float64 is not available on every device. For finite
    ``x > 0``: ``x = m * 2**e`` with m in [2**23, 2**25) and e even, ``n = m * 2**28`` (< 2**53),
    ``r = isqrt(n)`` (27 bits at most) by integer Newton steps from an fp32 estimate and exact
    corrections, then ``r`` is rounded to 24 bits with ``r*r != n`` as the sticky bit. The result
    is ``q * 2**(e/2 - 14 + drop)``, always normal. ``sqrt(+-0) = +-0``, ``sqrt(+inf) = +inf``,
    ``sqrt(x < 0)`` and ``sqrt(NaN)`` are NaN.

    Parameters
    ----------
    x : Tensor, float32, any shape, any device

    Returns
    -------
    Tensor, float32, same shape
    """
    if intpath.int32(x.device):  # the same bits from int32 operations (sqrt32.py)
        from .sqrt32 import sqrt_rn as sqrt_rn_int32

        return sqrt_rn_int32(x)
    x = x.to(torch.float32)
    b = bits_of(x)
    biased = (b >> 23) & 0xFF
    frac = b & 0x7FFFFF
    # x = m * 2**e exactly, m in [2**23, 2**24) for normals; subnormals are normalised below
    norm = torch.where(biased == 0, 24 - bit_length(frac), torch.zeros_like(frac))
    m = torch.where(biased == 0, frac, frac | (1 << 23)) << norm
    e = torch.where(biased == 0, torch.full_like(frac, -149), biased - 150) - norm
    odd = (e & 1) == 1
    m = torch.where(odd, m << 1, m)
    e = torch.where(odd, e - 1, e)
    n = torch.where((x > 0) & (biased < 255), m, torch.full_like(m, 1 << 23)) << 28  # in [2**51, 2**53)
    # an estimate within a factor 2 of sqrt(n) in [2**25.5, 2**26.5); six Newton steps bring any
    # such start within 1 of isqrt(n) (from above), the two corrections make it exact
    r = torch.sqrt(n.to(torch.float32)).to(torch.int64).clamp(min=1 << 25, max=1 << 27)
    for _ in range(6):
        r = (r + torch.div(n, r, rounding_mode="floor")) >> 1
    for _ in range(2):
        r = r - (r * r > n).to(torch.int64)
        r = r + ((r + 1) * (r + 1) <= n).to(torch.int64)
    drop = bit_length(r) - 24
    q = r >> drop
    rem = r - (q << drop)
    half = torch.ones_like(drop) << (drop - 1)
    up = (rem > half) | ((rem == half) & ((r * r != n) | ((q & 1) == 1)))
    q = q + up.to(torch.int64)
    y = scale_pow2(q.to(torch.float32), drop + (e >> 1) - 14)
    special = ~((x > 0) & (biased < 255))  # zeros, +inf, negatives, NaN: IEEE's own results
    nan = torch.full_like(x, float("nan"))
    return torch.where(special, torch.where(x >= 0, x, nan), y)
