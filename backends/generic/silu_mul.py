"""Device-generic ``silu(gate) * up``: contract exp_c, IEEE division, two named roundings.

Elementwise, processed in flat chunks of :data:`CHUNK_ELEMENTS` so exp_c's temporaries stay
small; each element depends on its own inputs only, so chunking cannot change a bit.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import cast_out
from rlkernel.backends.generic._exact.transcendental import exp_c

CHUNK_ELEMENTS = 1 << 22


def _silu(g: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """``RN32(g ÷ RN32(1 + exp_c(-g)))``: IEEE division, not a reciprocal multiply."""
    return g / (one + exp_c(torch.neg(g)))


def _round_s(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """silu rounded to the activation dtype before the product with up (Hugging Face's order), as fp32."""
    return s if dtype == torch.float32 else s.to(dtype).to(torch.float32)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``RN(fp32(RN(g ÷ (1 + exp_c(-g)))) * fp32(up))`` elementwise, ``g = fp32(gate)``.

    Parameters
    ----------
    gate : Tensor, bfloat16/float16/float32, [*, I]
    up : Tensor, gate's dtype, [*, I]

    Returns
    -------
    Tensor, gate's dtype, [*, I]
    """
    dtype = gate.dtype
    out = torch.empty(gate.shape, dtype=dtype, device=gate.device)
    if gate.numel() == 0:
        return out
    one = torch.ones((), dtype=torch.float32, device=gate.device)
    g_flat, u_flat, y_flat = gate.reshape(-1), up.reshape(-1), out.view(-1)
    for start in range(0, g_flat.numel(), CHUNK_ELEMENTS):
        stop = start + CHUNK_ELEMENTS
        s = _round_s(_silu(g_flat[start:stop].to(torch.float32), one), dtype)
        y_flat[start:stop] = cast_out(s * u_flat[start:stop].to(torch.float32), dtype)
    return out
