"""Correctly rounded fp32 square root from int32 operations: :func:`fp32.sqrt_rn`'s bits without int64.

For finite ``x > 0``: ``x = m * 2**e`` with m in [2**23, 2**25) and e even, ``N = m * 2**26``
(in [2**49, 2**51)), ``r = isqrt(N)`` (25 or 26 bits, so int32), rounded to 24 bits with
``r*r != N`` as the sticky bit; the result is ``q * 2**(drop + e/2 - 13)``, always normal.
``N - r*r`` is never formed as one integer: its three base-2**13 digits (``m - r1**2``,
``-2 r1 r0``, ``-r0**2`` for ``r = r1 * 2**13 + r0``) are int32 products below 2**27, and a
carry ripple gives its exact sign. ``r`` starts from an fp32 estimate, takes one Newton step
on that residual and is then corrected by exact comparisons (two each way, as in the int64
version). Specials follow IEEE: ``sqrt(+-0) = +-0``, ``sqrt(+inf) = +inf``, negatives and NaN
give NaN.
"""

from __future__ import annotations

import torch

from . import limbs32 as L

I32 = torch.int32
_D = 13  # digit width of the residual


def _residual(m: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Base-2**13 digits ``(d2, d1, d0)`` of ``m * 2**26 - r*r`` (not normalised), int32."""
    r1 = r >> _D
    r0 = r & ((1 << _D) - 1)
    return m - r1 * r1, -2 * r1 * r0, -(r0 * r0)


def _sign(m: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """Exact sign (-1, 0, 1) of ``m * 2**26 - r*r``, int32."""
    d2, d1, d0 = _residual(m, r)
    mask = (1 << _D) - 1
    d1 = d1 + (d0 >> _D)  # floor carries: the low digits land in [0, 2**13)
    d0 = d0 & mask
    d2 = d2 + (d1 >> _D)
    d1 = d1 & mask
    low = ((d1 | d0) != 0).to(I32)
    return torch.where(d2 != 0, torch.sign(d2), low)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """IEEE fp32 square root, correctly rounded, from int32 tensor arithmetic only.

    Parameters
    ----------
    x : Tensor, float32, any shape, any device

    Returns
    -------
    Tensor, float32, same shape (:func:`fp32.sqrt_rn`'s bits)
    """
    x = x.to(torch.float32)
    b = x.contiguous().view(I32)
    biased = (b >> 23) & 0xFF
    frac = b & 0x7FFFFF
    norm = torch.where(biased == 0, 24 - L.bit_length(frac), 0)
    m = torch.where(biased == 0, frac, frac | (1 << 23)) << norm  # in [2**23, 2**24)
    e = torch.where(biased == 0, -149, biased - 150) - norm
    odd = (e & 1) == 1
    m = torch.where(odd, m << 1, m)
    e = torch.where(odd, e - 1, e)
    m = torch.where((x > 0) & (biased < 255), m, 1 << 23)  # a harmless stand-in for the specials
    # estimate, one Newton step on the exact residual's digits, then exact corrections
    n_f = m.to(torch.float32) * 2.0**26  # exact: m has at most 24 significant bits
    r = torch.sqrt(n_f).to(I32).clamp(min=1 << 24, max=(1 << 26) - 1)
    d2, d1, d0 = _residual(m, r)
    res = (d2.to(torch.float32) * 2.0**26 + d1.to(torch.float32) * 2.0**13) + d0.to(torch.float32)
    r = (r + torch.round(res / (2.0 * r.to(torch.float32))).to(I32)).clamp(min=1 << 24, max=(1 << 26) - 1)
    for _ in range(2):
        r = r - (_sign(m, r) < 0).to(I32)
        r = r + (_sign(m, r + 1) >= 0).to(I32)
    drop = L.bit_length(r) - 24  # 1 or 2
    q = r >> drop
    rem = r - (q << drop)
    half = torch.ones_like(drop) << (drop - 1)
    up = (rem > half) | ((rem == half) & ((_sign(m, r) != 0) | ((q & 1) == 1)))
    q = q + up.to(I32)
    y = L.scale_pow2(q.to(torch.float32), drop + (e >> 1) - 13)
    special = ~((x > 0) & (biased < 255))  # zeros, +inf, negatives, NaN: IEEE's own results
    nan = torch.full_like(x, float("nan"))
    return torch.where(special, torch.where(x >= 0, x, nan), y)
