"""Order-dependent floating-point sums for the ``ORDER_FLOAT_SUM`` mutants (not a mutation module).

An exact grid or superaccumulator sum replaced by one of these gives bits that depend on the
order of the terms, which is what a backend with an ordinary float reduction would do.
"""

from __future__ import annotations

import torch

#: Lanes of the blocked sum (a vectorised reduction with this many accumulators).
LANES = 32


def blocked_reversed_sum(t: torch.Tensor, dim: int = -1, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sum along ``dim`` in ``dtype``, terms in reversed order, in :data:`LANES` strided accumulators
    that are then added lane by lane: every addition one IEEE rounding of ``dtype``."""
    x = t.movedim(dim, -1).flip(-1).to(dtype)
    n = x.shape[-1]
    blocks = -(-n // LANES)
    pad = blocks * LANES - n
    if pad:
        x = torch.cat([x, torch.zeros((*x.shape[:-1], pad), dtype=dtype, device=x.device)], dim=-1)
    x = x.reshape(*x.shape[:-1], blocks, LANES)
    acc = torch.zeros((*x.shape[:-2], LANES), dtype=dtype, device=x.device)
    for b in range(blocks):
        acc = acc + x[..., b, :]
    out = torch.zeros(x.shape[:-2], dtype=dtype, device=x.device)
    for lane in range(LANES):
        out = out + acc[..., lane]
    return out
