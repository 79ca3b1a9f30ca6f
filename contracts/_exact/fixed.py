"""Reference fixed-point sums (docs/numerics.md P4, R3).

A sum places every term on the grid ``2**(E - F)``, rounds each term half-to-even to an
integer, adds the integers exactly (int64) and rounds the total once. The order of the
integer additions cannot change a bit, so any tiling, split or all-reduce gives these bits.
"""

from __future__ import annotations

import torch

from .fp32 import expo, int_to_fp32, ldexp_c, pow2

#: Fraction bits of max-grid and probability sums.
F_SUM = 40


def check_count(op: str, count: int, frac_bits: int = F_SUM, what: str = "terms") -> None:
    """Raise ``ValueError`` if ``count`` terms of magnitude <= 2**F could overflow int64."""
    if count * (1 << frac_bits) >= 1 << 63:
        limit = (1 << (63 - frac_bits)) - 1
        raise ValueError(
            f"{op}: {count} {what} exceed the exact-sum bound of {limit} for int64 accumulation "
            f"with {frac_bits} fraction bits; split the reduction (shard it) and combine the partials"
        )


def quantize(t: torch.Tensor, e: torch.Tensor, frac_bits: int = F_SUM) -> torch.Tensor:
    """``RNE(t * 2**(F - e))`` as int64; t fp32 finite, e int64 broadcastable to t."""
    scaled = t.to(torch.float64) * pow2(frac_bits - e)  # exact: float64 holds every such product
    return torch.round(scaled).to(torch.int64)  # torch.round is round-half-to-even


def special_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """The IEEE sum of the non-finite terms alone: NaN, +-inf, or 0 if all are finite."""
    has_nan = torch.isnan(t).any(dim=dim)
    pos = (t == float("inf")).any(dim=dim)
    neg = (t == float("-inf")).any(dim=dim)
    out = torch.zeros(has_nan.shape, dtype=torch.float32)
    out = torch.where(pos, torch.full_like(out, float("inf")), out)
    out = torch.where(neg, torch.full_like(out, float("-inf")), out)
    return torch.where(has_nan | (pos & neg), torch.full_like(out, float("nan")), out)


def grid_exponent(t: torch.Tensor, dim: int) -> torch.Tensor:
    """``E = expo(max |t|)`` over ``dim`` among finite terms (0 if all are zero)."""
    finite = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    return expo(finite.abs().amax(dim=dim))


def fixed_sum(t: torch.Tensor, dim: int = -1, e: torch.Tensor | None = None, frac_bits: int = F_SUM,
              op: str = "fixed_sum") -> torch.Tensor:
    """Exact-grid sum of fp32 terms along ``dim`` (P4).

    Parameters
    ----------
    t : Tensor, float32, any shape
    dim : int
        Reduction axis.
    e : Tensor, int64, shape of ``t`` without ``dim``, optional
        Grid exponent; default the max grid ``expo(max |t|)``. Pass ``zeros`` for the
        absolute grid of probabilities.
    frac_bits : int
        F, the fraction bits.

    Returns
    -------
    Tensor, float32, shape of ``t`` without ``dim``

    Bitwise semantics
    -----------------
    ``ldexp_c(RN32(sum_i RNE(t_i * 2**(F - E))), E - F)``; NaN if any term is NaN or both
    infinities occur, else +-inf if an infinity occurs; +0 for an empty or zero total.
    """
    dim = dim % t.dim()
    check_count(op, t.shape[dim], frac_bits)
    if t.shape[dim] == 0:
        return torch.zeros(t.shape[:dim] + t.shape[dim + 1 :], dtype=torch.float32)
    if e is None:
        e = grid_exponent(t, dim)
    total = fixed_sum_int(t, e, dim, frac_bits)
    out = ldexp_c(int_to_fp32(total), e - frac_bits)
    special = special_sum(t, dim)
    return torch.where(torch.isfinite(special), out, special)


def fixed_sum_int(t: torch.Tensor, e: torch.Tensor, dim: int, frac_bits: int = F_SUM) -> torch.Tensor:
    """The exact int64 partial ``sum_i RNE(t_i * 2**(F - e))`` (non-finite terms count as 0)."""
    finite = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    return quantize(finite, e.unsqueeze(dim), frac_bits).sum(dim=dim)
