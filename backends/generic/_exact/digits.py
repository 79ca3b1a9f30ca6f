"""Device-generic digit matmul (R4): balanced base-128 digits per operand.

Each digit is in [-64, 64], so a digit GEMM on any matrix unit (fp32, tf32, bf16, fp16 or int8
with int32 accumulation) is exact as long as a K-chunk keeps every partial sum below 2**24:
chunks of 4096. The digit products (3 x 3 for 21-bit operands, 4 x 3 for a 28-bit activation
row against a 21-bit weight row) are combined exactly in int64.
"""

from __future__ import annotations

import torch

from . import intpath
from .fp32 import exponent, int64_to_f32, pow2_f32, scale_pow2

GRID = 20
K_CHUNK = 4096
MAX_K = 1 << 22


def row_exponents(x: torch.Tensor) -> torch.Tensor:
    """Exponent of each row's largest finite magnitude (0 for a zero row); int64 [rows]."""
    if x.shape[-1] == 0:
        return torch.zeros(x.shape[:-1], dtype=torch.int64, device=x.device)
    finite = torch.where(torch.isfinite(x), x, 0.0).to(torch.float32)
    return exponent(finite.abs().amax(dim=-1))


def grid_rows(x: torch.Tensor, e: torch.Tensor, bits: int | None = None) -> torch.Tensor:
    """Rows on the 21-bit grid: ``RNE(x * 2**(20 - e))`` as int64 (non-finite -> 0); ``bits``
    replaces the 20 (default :data:`GRID`)."""
    from .fixed import to_fixed

    finite = torch.where(torch.isfinite(x), x, 0.0).to(torch.float32)
    return to_fixed(finite, e.unsqueeze(-1), GRID if bits is None else bits)


def split_digits(v: torch.Tensor, count: int = 3) -> torch.Tensor:
    """int64 [..., K] with |v| <= 2**(7 * count - 1) -> fp32 [count, ..., K] balanced base-128 digits
    (each in [-64, 63] but the top one, in [-64, 64])."""
    digits = []
    for _ in range(count - 1):
        d = ((v + 64) & 127) - 64
        digits.append(d)
        v = (v - d) >> 7
    digits.append(v)
    return torch.stack(digits).to(torch.float32)


def _round_grid(v: torch.Tensor) -> torch.Tensor:
    """The grid rounding of P5: to nearest, ties to even (exact in fp32 for the values it sees)."""
    return torch.round(v)


def digit_planes(t: torch.Tensor, e: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """fp32 [count, R, K]: balanced base-128 digits (each in [-64, 64]) of ``g = RNE(t * 2**(bits - e))``.

    ``t`` [R, K] bf16/fp16 (non-finite entries read as 0), ``e`` [R] int64 with ``bits - e`` in
    [-252, 254] (callers zero the rows they do not want). Every step is exact in fp32:
    ``t * 2**a * 2**b`` (a + b = bits - e, both factors normal powers of two) is exact whenever
    the scaled value can round to a nonzero grid integer (a bf16/fp16 value has at most 11
    significant bits and the intermediate is then normal); values that underflow in a step are
    below 2**-41 and round to 0 either way. ``g`` has at most 11 significant bits, so it is an
    exact fp32 even at 2**27. Then, from the low digit up, ``q = RNE(g / 128)``, ``d = g - 128 q``,
    ``g = q`` (scalings by 2**-7 are exact multiplications); the last quotient is the top digit.
    """
    s = bits - e
    a = torch.div(s, 2, rounding_mode="floor")
    tf = torch.where(torch.isfinite(t), t, torch.zeros_like(t)).to(torch.float32)
    g = _round_grid((tf * pow2_f32(a).unsqueeze(-1)) * pow2_f32(s - a).unsqueeze(-1))
    digits = []
    for _ in range(count - 1):
        q = torch.round(g * 2.0**-7)
        digits.append(g - q * 128.0)
        g = q
    digits.append(g)
    return torch.stack(digits)


def int_product(xd: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``X @ W.T`` from digit planes xd [A, M, K], wd [B, N, K]."""
    if intpath.int32(xd.device):  # the same product combined on int32 limbs
        from .digits32 import int_product as int_product_int32

        return int_product_int32(xd, wd)
    na, m, k = xd.shape
    nb, n = wd.shape[0], wd.shape[1]
    acc = torch.zeros((m, n), dtype=torch.int64, device=xd.device)
    w_all = wd.reshape(nb * n, k)
    for start in range(0, k, K_CHUNK):
        stop = min(start + K_CHUNK, k)
        w_chunk = w_all[:, start:stop]
        for a in range(na):
            part = (xd[a, :, start:stop] @ w_chunk.T).to(torch.int64).reshape(m, nb, n)
            for b in range(nb):
                acc += part[:, b, :] << (7 * (a + b))
    return acc


def matmul_exact(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 ``x @ w.T`` per the digit-matmul contract: x [M, K], w [N, K] (bf16/fp16)."""
    ex, ew = row_exponents(x), row_exponents(w)
    c = int_product(split_digits(grid_rows(x, ex)), split_digits(grid_rows(w, ew)))
    y = scale_pow2(int64_to_f32(c), ex.unsqueeze(1) + ew.unsqueeze(0) - 2 * GRID)
    bad = (~torch.isfinite(x)).any(dim=-1).unsqueeze(1) | (~torch.isfinite(w)).any(dim=-1).unsqueeze(0)
    return torch.where(bad, float("nan"), y)
