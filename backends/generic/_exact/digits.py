"""Device-generic digit matmul (R4): three balanced base-128 digits per operand.

Each digit is in [-64, 64], so a digit GEMM on any matrix unit (fp32, tf32, bf16, fp16 or int8
with int32 accumulation) is exact as long as a K-chunk keeps every partial sum below 2**24:
chunks of 4096. The nine digit products are combined exactly in int64.
"""

from __future__ import annotations

import torch

from .fp32 import exponent, int64_to_f32, scale_pow2

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


def split_digits(v: torch.Tensor) -> torch.Tensor:
    """int64 [..., K] with |v| <= 2**20 -> fp32 [3, ..., K] balanced base-128 digits."""
    d0 = ((v + 64) & 127) - 64
    v1 = (v - d0) >> 7
    d1 = ((v1 + 64) & 127) - 64
    d2 = (v1 - d1) >> 7
    return torch.stack((d0, d1, d2)).to(torch.float32)


def int_product(xd: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``X @ W.T`` from digit planes xd [3, M, K], wd [3, N, K]."""
    m, n, k = xd.shape[1], wd.shape[1], xd.shape[2]
    acc = torch.zeros((m, n), dtype=torch.int64, device=xd.device)
    w_all = wd.reshape(3 * n, k)
    for start in range(0, k, K_CHUNK):
        stop = min(start + K_CHUNK, k)
        w_chunk = w_all[:, start:stop]
        for a in range(3):
            part = (xd[a, :, start:stop] @ w_chunk.T).to(torch.int64).reshape(m, 3, n)
            for b in range(3):
                acc += part[:, b, :] << (7 * (a + b))
    return acc


def matmul_exact(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 ``x @ w.T`` per the digit-matmul contract: x [M, K], w [N, K] (bf16/fp16)."""
    ex, ew = row_exponents(x), row_exponents(w)
    c = int_product(split_digits(grid_rows(x, ex)), split_digits(grid_rows(w, ew)))
    y = scale_pow2(int64_to_f32(c), ex.unsqueeze(1) + ew.unsqueeze(0) - 2 * GRID)
    bad = (~torch.isfinite(x)).any(dim=-1).unsqueeze(1) | (~torch.isfinite(w)).any(dim=-1).unsqueeze(0)
    return torch.where(bad, float("nan"), y)
