"""The fixed-point exact sum (R3) in int32 limbs: :func:`fixed.exact_sum`'s bits without int64 arithmetic.

Each fp32 term ``m * 2**(b - 150)`` goes on the grid ``2**(E - F)``: a left shift of the 24-bit
significand (three 16-bit pieces at the limbs it reaches, :func:`limbs32.place24`) or a right
shift rounded half to even in int32 (at most 25 places: beyond, the term rounds to 0 either
way). The terms' limbs are summed exactly (int32 ``scatter_add_`` in blocks, normalised), the
total is rounded once to 24 bits from its top limbs, built exactly as an fp32, and scaled by
``2**(E - F)`` with the same two fp32 multiplies as :func:`fp32.scale_pow2`. Identical to the
int64 path wherever that path's int64 terms and total do not overflow (the contracts' bound:
``count * 2**F < 2**63``, checked the same way).
"""

from __future__ import annotations

import torch

from . import limbs32 as L
from .fixed import F_SUM, nonfinite_total, sum_bound_error

#: 64-bit totals, one limb for term shifts up to 62, one of headroom
WIDTH = 7
I32 = torch.int32


def exponent(x: torch.Tensor) -> torch.Tensor:
    """``e`` with ``2**(e-1) <= |x| < 2**e`` for finite nonzero fp32 x, 0 for zero; int32."""
    b = x.to(torch.float32).contiguous().view(I32)
    biased = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    e = torch.where(biased == 0, L.bit_length(mant) - 149, biased - 126)
    return torch.where((b & 0x7FFFFFFF) == 0, 0, e)


def _place(t: torch.Tensor, e: torch.Tensor, frac_bits: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Limb and pieces of ``RNE(t * 2**(F - e))`` for fp32 ``t`` (non-finite -> 0)."""
    b = t.contiguous().view(I32)
    biased = (b >> 23) & 0xFF
    sig = (b & 0x7FFFFF) | torch.where(biased > 0, 1 << 23, 0).to(I32)
    sig = torch.where(biased == 0xFF, 0, sig)
    shift = biased.clamp(min=1) - 150 + frac_bits - e.to(I32)
    r = (-shift).clamp(min=1, max=25)  # >= 25 places: sig < 2**24 <= half, the term rounds to 0 either way
    q = sig >> r
    rem = sig - (q << r)
    half = torch.ones_like(r) << (r - 1)
    q = q + ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(I32)
    left = shift >= 0
    return L.place24(torch.where(left, sig, q), torch.where(left, shift.clamp(max=62), 0), b < 0)


def exact_sum(t: torch.Tensor, dim: int = -1, e: torch.Tensor | None = None, frac_bits: int = F_SUM,
              op: str = "sum", keepdim: bool = False) -> torch.Tensor:
    """Exact-grid sum of fp32 ``t`` along ``dim`` (max grid unless ``e`` is given); :func:`fixed.exact_sum`'s bits."""
    err = sum_bound_error(op, t.shape[dim], frac_bits)
    if err is not None:
        raise err
    if t.shape[dim] == 0:  # the empty sum is +0
        return torch.zeros_like(t.sum(dim=dim, keepdim=keepdim), dtype=torch.float32)
    t = t.to(torch.float32)
    if e is None:
        finite = torch.where(torch.isfinite(t), t, 0.0)
        e = exponent(finite.abs().amax(dim=dim, keepdim=True))
    elif not keepdim:
        e = e.unsqueeze(dim)
    e = e.to(I32)
    moved = t.movedim(dim, -1)
    lead = tuple(moved.shape[:-1])
    e_rows = torch.broadcast_to(e, t.shape).movedim(dim, -1).reshape(-1, moved.shape[-1])
    limb, pieces = _place(moved.reshape(-1, moved.shape[-1]), e_rows, frac_bits)
    total = L.row_sums(limb, pieces, WIDTH)
    y = L.to_f32(total).reshape(*lead, 1).movedim(-1, dim)
    out = L.scale_pow2(y, e - frac_bits)
    special = nonfinite_total(t, dim, keepdim=True)
    out = torch.where(torch.isfinite(special), out, special)
    return out if keepdim else out.squeeze(dim)
