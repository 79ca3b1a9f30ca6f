"""Reference digit matmul (docs/numerics.md P5, R4).

``C = X @ W.T`` exactly, for integer matrices on a 21-bit signed grid. The reference splits
each operand into two base-1024 halves and runs four float64 GEMMs; every partial sum is an
integer below 2**53, so BLAS order cannot matter. (Backends use other digit splits; the
integer C is the contract, not how it is formed.)
"""

from __future__ import annotations

import torch

from .fp32 import expo, int_to_fp32, ldexp_c, pow2

#: Magnitude bits of the integer grid: |X| <= 2**GRID_BITS (W = 21 signed bits).
GRID_BITS = 20
#: Largest K: |C| <= K * 2**40 < 2**63.
MAX_K = 1 << 22


def row_exponent(x: torch.Tensor) -> torch.Tensor:
    """``expo(max_k |x_k|)`` over the last axis, finite entries only (0 for a zero row)."""
    if x.shape[-1] == 0:
        return torch.zeros(x.shape[:-1], dtype=torch.int64)
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return expo(finite.abs().amax(dim=-1))


def to_grid(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``RNE(x * 2**(20 - e))`` per row as int64 (non-finite entries -> 0)."""
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x)).to(torch.float64)
    return torch.round(finite * pow2(GRID_BITS - e).unsqueeze(-1)).to(torch.int64)


def int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact ``a @ b.T`` for int64 matrices with entries in [-2**20, 2**20] and K <= 2**22."""
    half = 1 << 10
    a_lo = torch.remainder(a, half)
    a_hi = (a - a_lo) >> 10
    b_lo = torch.remainder(b, half)
    b_hi = (b - b_lo) >> 10

    def mm(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return (u.to(torch.float64) @ v.to(torch.float64).T).to(torch.int64)

    return (mm(a_hi, b_hi) << 20) + ((mm(a_hi, b_lo) + mm(a_lo, b_hi)) << 10) + mm(a_lo, b_lo)


def nonfinite_rows(x: torch.Tensor) -> torch.Tensor:
    """Bool per row: does the row hold NaN or +-inf?"""
    return (~torch.isfinite(x)).any(dim=-1)


def digit_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``y = x @ w.T`` per P5, fp32 output.

    Parameters
    ----------
    x : Tensor, bfloat16/float16, [M, K]
    w : Tensor, bfloat16/float16, [N, K]

    Returns
    -------
    Tensor, float32, [M, N]

    Bitwise semantics
    -----------------
    ``ldexp_c(RN32(sum_k X_ik W_jk), ex_i + ew_j - 40)`` with the 21-bit row grids of P5;
    NaN where row i of x or row j of w holds a non-finite value.
    """
    ex, ew = row_exponent(x), row_exponent(w)
    c = int_matmul(to_grid(x, ex), to_grid(w, ew))
    y = ldexp_c(int_to_fp32(c), ex.unsqueeze(1) + ew.unsqueeze(0) - 2 * GRID_BITS)
    bad = nonfinite_rows(x).unsqueeze(1) | nonfinite_rows(w).unsqueeze(0)
    return torch.where(bad, torch.full_like(y, float("nan")), y)
