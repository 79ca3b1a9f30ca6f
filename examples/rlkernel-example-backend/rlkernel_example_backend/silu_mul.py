"""``silu_mul`` for the example backend (contract ``silu_mul`` v1)."""

from __future__ import annotations

import torch

from ._fp32 import canonical, exp_c


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
    if gate.numel() == 0:
        return torch.empty(gate.shape, dtype=gate.dtype)
    g = gate.to(torch.float32)
    s = g / (torch.tensor(1.0) + exp_c(-g))  # IEEE division of two tensors, never a reciprocal
    if gate.dtype != torch.float32:
        s = s.to(gate.dtype).to(torch.float32)
    return canonical((s * up.to(torch.float32)).to(gate.dtype))
