"""Reference fp32 helpers: exponent, power-of-two scaling, int64 -> fp32, NaN canonicalisation.

These are the definitions of docs/numerics.md P1-P3 and P7-P8, written for clarity (float64
is used where it is exact). They run on the CPU.
"""

from __future__ import annotations

import math

import torch

CANONICAL_NAN_BITS = {torch.float32: 0x7FC00000, torch.bfloat16: 0x7FC0, torch.float16: 0x7E00}


def expo(x: torch.Tensor) -> torch.Tensor:
    """Binary exponent e with ``2**(e-1) <= |x| < 2**e`` (P1); 0 for zeros.

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, any shape, finite

    Returns
    -------
    Tensor, int64, same shape
    """
    _, e = torch.frexp(x.to(torch.float64))
    return torch.where(x == 0, torch.zeros_like(e), e).to(torch.int64)


def pow2(k: torch.Tensor) -> torch.Tensor:
    """``2**k`` as float64 (exact for |k| <= 1022)."""
    return torch.ldexp(torch.ones_like(k, dtype=torch.float64), k.to(torch.int64))


def ldexp_c(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """P2: ``RN32(RN32(y * 2**a) * 2**(k - a))`` with ``a = floor(k / 2)``; y fp32, k int64."""
    k = k.to(torch.int64)
    a = torch.div(k, 2, rounding_mode="floor")
    first = (y.to(torch.float64) * pow2(a)).to(torch.float32)  # y * 2^a: exact in float64, one rounding
    return (first.to(torch.float64) * pow2(k - a)).to(torch.float32)


def int_to_fp32(s: torch.Tensor) -> torch.Tensor:
    """P3: int64 -> fp32 correctly rounded (ties to even), via a 53-bit sticky reduction.

    Parameters
    ----------
    s : Tensor, int64, any shape, ``|s| < 2**63``

    Returns
    -------
    Tensor, float32, same shape
    """
    s = s.to(torch.int64)
    a = s.abs()
    _, e = torch.frexp(a.to(torch.float64))  # bit length, possibly one too large after rounding
    shift = (e.to(torch.int64) - 53).clamp(min=0)
    kept = a >> shift
    lost = a - (kept << shift)
    kept = kept | (lost != 0).to(torch.int64)  # sticky bit: >= 52 bits remain, far below fp32's 24
    mag = (kept.to(torch.float64) * pow2(shift)).to(torch.float32)  # exact, then one rounding
    return torch.where(s < 0, -mag, mag)


#: Output formats of :func:`int_to_float`: significand bits (with the implicit one) and the
#: exponent of the smallest subnormal (its quantum).
FORMATS = {torch.float32: (24, -149), torch.bfloat16: (8, -133), torch.float16: (11, -24)}


def int_to_float(s: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P3': ``RN_dtype(s * 2**k)`` for an int64 ``s`` and an integer ``k``, in one rounding.

    The exact value ``s * 2**k`` is rounded once, half to even, to ``dtype`` (float32,
    bfloat16 or float16): to the format's significand bits, or to its smallest subnormal's
    quantum where the value is below the normal range; a rounded magnitude beyond the largest
    finite value is +-inf; a zero ``s`` gives +0. Going through fp32 first (P3 then a cast, or
    P3 then P2) rounds twice and is wrong on halfway values.

    Parameters
    ----------
    s : Tensor, int64, any shape, ``|s| < 2**63``
    k : Tensor, int64, broadcastable to ``s``, ``|k| <= 512``
    dtype : torch.dtype

    Returns
    -------
    Tensor, ``dtype``, the broadcast shape
    """
    bits, quantum = FORMATS[dtype]
    s, k = torch.broadcast_tensors(s.to(torch.int64), k.to(torch.int64))
    a = s.abs()
    _, e = torch.frexp(a.to(torch.float64))  # bit length of a, or one more where the float64 rounded up
    n = e.to(torch.int64)
    n = torch.where((n > 0) & ((a >> (n - 1).clamp(min=0)) == 0), n - 1, n)
    r = torch.maximum(n - bits, quantum - k).clamp(min=0, max=63)  # bits to drop
    q = a >> r
    rem = a - (q << r)
    half = torch.where(r > 0, torch.ones_like(r) << (r - 1).clamp(min=0), torch.zeros_like(r))
    up = (r > 0) & ((rem > half) | ((rem == half) & ((q & 1) == 1)))
    q = q + up.to(torch.int64)
    mag = (q.to(torch.float64) * pow2(r + k)).to(dtype)  # exact: representable, or beyond the range -> inf
    return torch.where(s < 0, -mag, mag)


def int2_to_float(hi: torch.Tensor, lo: torch.Tensor, shift: int, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P3' for a two-limb integer: ``RN_dtype((hi * 2**shift + lo) * 2**k)`` in one rounding.

    ``hi`` and ``lo`` are int64 (any signs, ``|hi| < 2**62``, ``|lo| < 2**62``), ``1 <= shift <= 40``.
    The value is normalised to ``H * 2**shift + L`` with ``0 <= L < 2**shift`` on the magnitude;
    while ``H < 2**(62 - shift)`` the magnitude fits int64 and :func:`int_to_float` rounds it;
    beyond, it has at least 63 bits, every bit of L lies below the rounding position, and
    ``H | (L != 0)`` (a sticky bit in H's last place, itself below the rounding position)
    rounds to the same value.
    """
    hi, lo = hi.to(torch.int64), lo.to(torch.int64)
    carry = lo >> shift  # floor
    low = lo - (carry << shift)  # in [0, 2**shift)
    top = hi + carry
    neg = top < 0
    big_h = torch.where(neg, torch.where(low == 0, -top, -top - 1), top)
    big_l = torch.where(neg & (low != 0), (1 << shift) - low, low)
    small = big_h < (1 << (62 - shift))
    mag = torch.where(small, (big_h.clamp(max=(1 << (62 - shift)) - 1) << shift) + big_l,
                      big_h | (big_l != 0).to(torch.int64))
    kk = torch.where(small, k, k + shift)
    out = int_to_float(torch.where(neg, -mag, mag), kk, dtype)
    return out


def canonicalize(t: torch.Tensor) -> torch.Tensor:
    """P8: replace every NaN by the canonical NaN of ``t``'s dtype (no-op for integers)."""
    if not t.is_floating_point():
        return t
    bits = CANONICAL_NAN_BITS[t.dtype]
    width = torch.finfo(t.dtype).bits
    signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
    int_dtype = torch.int32 if width == 32 else torch.int16
    nan = torch.tensor(signed, dtype=int_dtype).view(t.dtype)
    return torch.where(torch.isnan(t), nan, t)


def round_to(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P8: fp32 -> ``dtype`` round-to-nearest-even (overflow to inf), NaN canonical."""
    return canonicalize(y.to(dtype))


def max_r5(x: torch.Tensor, dim: int) -> torch.Tensor:
    """P7: max along ``dim``; NaN propagates; a zero max is +0."""
    m = torch.amax(x, dim=dim)
    any_nan = torch.isnan(x).any(dim=dim)
    m = torch.where(m == 0, torch.zeros_like(m), m)
    return torch.where(any_nan, torch.full_like(m, float("nan")), m)


def argmax_r5(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """P7: index of the max along ``dim``: the first NaN if any, else the lowest tied index."""
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    idx = torch.arange(n, dtype=torch.int64).expand(x.shape)
    nan = torch.isnan(x)
    first_nan = torch.where(nan, idx, torch.full_like(idx, n)).amin(dim=-1)
    m = torch.amax(torch.where(nan, torch.full_like(x, float("-inf")), x), dim=-1, keepdim=True)
    first_max = torch.where(x == m, idx, torch.full_like(idx, n)).amin(dim=-1)
    return torch.where(first_nan < n, first_nan, first_max)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 square root, correctly rounded (ties to even), in exact integer arithmetic.

    ``torch.sqrt`` is not used: it is not correctly rounded on every build (the CPU build in CI
    misrounds about 17% of fp32 and 1% of float64 square roots). For finite ``x > 0`` with
    ``x = M * 2**E`` (M integer, E even) the root is ``isqrt(M * 2**(2k)) * 2**(E/2 - k)`` with
    ``k = 32``, rounded to 24 bits with the remainder of the integer root as sticky bit.
    ``sqrt(+-0) = +-0``, ``sqrt(+inf) = +inf``, ``sqrt(x < 0) = sqrt(NaN) = NaN``.

    Parameters
    ----------
    x : Tensor, float32, any shape (CPU)

    Returns
    -------
    Tensor, float32, same shape
    """
    flat = x.to(torch.float32).reshape(-1).tolist()
    out = []
    for v in flat:
        if v != v or v < 0:
            out.append(float("nan"))
        elif v == 0 or v == float("inf"):
            out.append(v)
        else:
            mant, e = math.frexp(v)  # v = mant * 2**e exactly, mant in [0.5, 1)
            m, e = int(mant * (1 << 53)), e - 53
            if e % 2:
                m, e = m << 1, e - 1
            k = 32
            n = m << (2 * k)
            r = math.isqrt(n)
            exact = r * r == n
            drop = r.bit_length() - 24
            q, rem, half = r >> drop, r & ((1 << drop) - 1), 1 << (drop - 1)
            if rem > half or (rem == half and (not exact or q & 1)):
                q += 1
            out.append(math.ldexp(q, drop + e // 2 - k))
    return torch.tensor(out, dtype=torch.float32).reshape(x.shape)
