"""Rounding-mode variants of the generic primitives, for mutants (not a mutation module).

Each function is the generic backend's primitive with its rounding changed to a neighbour of
round-to-nearest-even: ties away from zero, toward zero, or (int64 -> fp32) two roundings
through float64. Everything else (ranges, special values) is the generic code's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernel.backends.generic._exact import fp32

#: ``round_up(q, rem, half)``: does the kept integer ``q`` round up, given the dropped ``rem``
#: and the half-way point ``half``? (magnitudes; ``rem < 2 * half``)
RoundUp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def ties_even(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return (rem > half) | ((rem == half) & ((q & 1) == 1))


def ties_away(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return rem >= half


def toward_zero(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(rem, dtype=torch.bool)


def int64_to_f32_rounding(round_up: RoundUp) -> Callable[[torch.Tensor], torch.Tensor]:
    """``fp32.int64_to_f32`` with the rounding of the dropped bits given by ``round_up``."""

    def int64_to_f32(s: torch.Tensor) -> torch.Tensor:
        mag = s.abs()
        drop = (fp32.bit_length(mag) - 24).clamp(min=0)
        q = mag >> drop
        rem = mag - (q << drop)
        half = torch.where(drop > 0, torch.ones_like(drop) << (drop - 1).clamp(min=0), torch.zeros_like(drop))
        up = (drop > 0) & round_up(q, rem, half)
        q = q + up.to(torch.int64)
        out = fp32.scale_pow2(q.to(torch.float32), drop)
        return torch.where(s < 0, -out, out)

    return int64_to_f32


def int64_to_f32_via_float64(s: torch.Tensor) -> torch.Tensor:
    """int64 -> float64 -> fp32: two roundings (wrong for |s| >= 2**53 on halfway inputs)."""
    return s.to(torch.float64).to(torch.float32)


def to_fixed_rounding(round_up: RoundUp) -> Callable[..., torch.Tensor]:
    """``fixed.to_fixed`` (P4 quantisation ``t * 2**(F - e)`` to an integer) with another rounding."""

    def to_fixed(t: torch.Tensor, e: torch.Tensor, frac_bits: int = 40) -> torch.Tensor:
        b = fp32.bits_of(t)
        biased = (b >> 23) & 0xFF
        sig = (b & 0x7FFFFF) | torch.where(biased > 0, 1 << 23, 0)
        sig = torch.where(biased == 0xFF, torch.zeros_like(sig), sig)
        shift = biased.clamp(min=1) - 150 + frac_bits - e
        left = sig << shift.clamp(min=0, max=62)
        r = (-shift).clamp(min=1, max=40)
        q = sig >> r
        rem = sig - (q << r)
        half = torch.ones_like(r) << (r - 1)
        q = q + round_up(q, rem, half).to(torch.int64)
        mag = torch.where(shift >= 0, left, q)
        return torch.where((b >> 31) == 1, -mag, mag)

    return to_fixed


def cast_rounding(mode: str) -> Callable[[torch.Tensor, torch.dtype], torch.Tensor]:
    """``fp32.cast_out`` (fp32 -> dtype) rounding ``"away"`` (ties away from zero) or ``"zero"``
    (toward zero; overflow then gives the largest finite value) instead of to nearest even."""

    def cast_out(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        r = y.to(dtype)
        if dtype == torch.float32:
            return fp32.canonical_nan(r)
        y64, r64 = y.to(torch.float64), r.to(torch.float64)
        if mode == "zero":
            out = torch.where(r64.abs() > y64.abs(), torch.nextafter(r, torch.zeros_like(r)), r)
        else:
            other = torch.nextafter(r, torch.where(y64 > r64, float("inf"), float("-inf")).to(dtype))
            tie = (y64 != r64) & ((y64 - r64).abs() == (other.to(torch.float64) - y64).abs())
            out = torch.where(tie & (other.to(torch.float64).abs() > r64.abs()), other, r)
        return fp32.canonical_nan(torch.where(torch.isnan(y), r, out))

    return cast_out


def scale_pow2_ftz(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``fp32.scale_pow2`` with subnormal results flushed to (signed) zero."""
    out = fp32.scale_pow2(y, k)
    tiny = out.abs() < 2.0**-126
    return torch.where(tiny, out * 0.0, out)


def int64_to_float_rounding(round_up: RoundUp) -> Callable[[torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]:
    """``fp32.int64_to_float`` (P3': ``s * 2**k`` to ``dtype`` in one rounding) with the rounding of the
    dropped bits given by ``round_up``."""

    def int64_to_float(s: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        bits, quantum = fp32._FORMATS[dtype]
        mag = s.abs()
        drop = torch.maximum(fp32.bit_length(mag) - bits, quantum - k).clamp(min=0, max=63)
        q = mag >> drop
        rem = mag - (q << drop)
        half = torch.where(drop > 0, torch.ones_like(drop) << (drop - 1).clamp(min=0), torch.zeros_like(drop))
        q = q + ((drop > 0) & round_up(q, rem, half)).to(torch.int64)
        out = fp32.scale_pow2(q.to(torch.float32), drop + k).to(dtype)
        return torch.where(s < 0, -out, out)

    return int64_to_float


def int64_to_float_via_fp32(s: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """P3 to fp32, P2 scaling, then the cast: up to three roundings (wrong on halfway values)."""
    return fp32.scale_pow2(fp32.int64_to_f32(s), k).to(dtype)


def int64_to_float_ftz(s: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``fp32.int64_to_float`` with results below the format's normal range flushed to (signed) zero."""
    out = fp32.int64_to_float(s, k, dtype)
    tiny = out.abs() < torch.finfo(dtype).tiny
    return torch.where(tiny, out * 0.0, out)
