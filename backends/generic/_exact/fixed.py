"""Device-generic fixed-point sums (R3): integer quantisation from the fp32 bits.

Each term ``t = m * 2**(b - 150)`` (m the 24-bit significand, b the biased exponent, at least
1) is placed on the grid ``2**(E - F)`` by an integer shift of m, rounding half-to-even with
integer comparisons; the int64 terms are summed in any order.
"""

from __future__ import annotations

import torch

from .fp32 import bits_of, exponent, int64_to_f32, scale_pow2

F_SUM = 40


def sum_bound_error(op: str, count: int, frac_bits: int = F_SUM) -> ValueError | None:
    """A ``ValueError`` to raise if ``count`` terms could overflow int64, else None."""
    if count * (1 << frac_bits) < 1 << 63:
        return None
    return ValueError(
        f"{op}: {count} terms exceed the exact-sum bound of {(1 << (63 - frac_bits)) - 1} for int64 "
        f"accumulation with {frac_bits} fraction bits; shard the reduction and combine the partials"
    )


def _rounds_up(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    """Round half to even: does the magnitude ``q + rem / (2 * half)`` round up to ``q + 1``?"""
    return (rem > half) | ((rem == half) & ((q & 1) == 1))


def to_fixed(t: torch.Tensor, e: torch.Tensor, frac_bits: int = F_SUM) -> torch.Tensor:
    """``RNE(t * 2**(F - e))`` as int64 for fp32 ``t`` (non-finite -> 0); ``e`` broadcasts."""
    b = bits_of(t)
    biased = (b >> 23) & 0xFF
    sig = (b & 0x7FFFFF) | torch.where(biased > 0, 1 << 23, 0)
    sig = torch.where(biased == 0xFF, torch.zeros_like(sig), sig)
    shift = biased.clamp(min=1) - 150 + frac_bits - e
    left = sig << shift.clamp(min=0, max=62)
    r = (-shift).clamp(min=1, max=40)
    q = sig >> r
    rem = sig - (q << r)
    half = torch.ones_like(r) << (r - 1)
    q = q + _rounds_up(q, rem, half).to(torch.int64)
    mag = torch.where(shift >= 0, left, q)
    return torch.where((b >> 31) == 1, -mag, mag)


def nonfinite_total(t: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """IEEE sum of the non-finite terms only (0 when there are none)."""
    inf = torch.isinf(t)
    pos = (inf & (t > 0)).any(dim=dim, keepdim=keepdim)
    neg = (inf & (t < 0)).any(dim=dim, keepdim=keepdim)
    nan = torch.isnan(t).any(dim=dim, keepdim=keepdim) | (pos & neg)
    z = torch.zeros(pos.shape, dtype=torch.float32, device=t.device)
    z = torch.where(pos, float("inf"), z)
    z = torch.where(neg, float("-inf"), z)
    return torch.where(nan, float("nan"), z)


def max_exponent(t: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """Grid exponent ``expo(max |t|)`` over finite terms along ``dim`` (0 for all-zero)."""
    finite = torch.where(torch.isfinite(t), t, 0.0)
    return exponent(finite.abs().amax(dim=dim, keepdim=keepdim))


def from_fixed(total: torch.Tensor, e: torch.Tensor, frac_bits: int = F_SUM) -> torch.Tensor:
    """fp32 of the exact ``total * 2**(e - F)``: one rounding to 24 bits, then the scaling."""
    return scale_pow2(int64_to_f32(total), e - frac_bits)


def exact_sum(t: torch.Tensor, dim: int = -1, e: torch.Tensor | None = None, frac_bits: int = F_SUM,
              op: str = "sum", keepdim: bool = False) -> torch.Tensor:
    """Exact-grid sum of fp32 ``t`` along ``dim`` (max grid unless ``e`` is given)."""
    from . import fixed32, intpath  # fixed32 imports this module's helpers

    if intpath.int32(t.device):
        return fixed32.exact_sum(t, dim, e, frac_bits, op, keepdim)
    err = sum_bound_error(op, t.shape[dim], frac_bits)
    if err is not None:
        raise err
    if t.shape[dim] == 0:  # the empty sum is +0
        return torch.zeros_like(t.sum(dim=dim, keepdim=keepdim), dtype=torch.float32)
    if e is None:
        e = max_exponent(t, dim, keepdim=True)
    elif not keepdim:
        e = e.unsqueeze(dim)
    total = to_fixed(t, e, frac_bits).sum(dim=dim, keepdim=True)
    out = from_fixed(total, e, frac_bits)
    special = nonfinite_total(t, dim, keepdim=True)
    out = torch.where(torch.isfinite(special), out, special)
    return out if keepdim else out.squeeze(dim)
