"""Device-generic ``silu_mul`` backward: the forward's sigmoid (contract exp_c), IEEE fp32 steps.

Elementwise, in flat chunks of :data:`CHUNK_ELEMENTS`; each element depends on its own inputs
only, so chunking cannot change a bit.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import cast_out
from rlkernel.backends.generic._exact.transcendental import exp_c

CHUNK_ELEMENTS = 1 << 22


def _denominator(g: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """The forward's ``den = RN32(1 + exp_c(-g))``."""
    return one + exp_c(torch.neg(g))


def _sigmoid(den: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """``sig = RN32(1 ÷ den)``: one IEEE division."""
    return one / den


def _derivative(g: torch.Tensor, sig: torch.Tensor, one: torch.Tensor) -> torch.Tensor:
    """``RN32(sig * RN32(1 + RN32(g * RN32(1 - sig))))`` (PyTorch's silu_backward order)."""
    return sig * (one + g * (one - sig))


def _gate_product(dy: torch.Tensor, up: torch.Tensor, ds: torch.Tensor) -> torch.Tensor:
    """``RN32(RN32(dy * up) * ds)``."""
    return (dy * up) * ds


def _silu_value(g: torch.Tensor, den: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The forward's silu ``RN_dtype(RN32(g ÷ den))``, as fp32."""
    s = g / den
    return s if dtype == torch.float32 else s.to(dtype).to(torch.float32)


def silu_mul_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``dgate = RN(RN32(dy*up) * ds)``, ``dup = RN(dy * s)`` elementwise (contract ``silu_mul_backward`` v1).

    Parameters
    ----------
    grad, gate, up : Tensor, one dtype of bfloat16/float16/float32, [*, I]

    Returns
    -------
    dgate, dup : Tensor, gate's dtype, [*, I]
    """
    dtype = gate.dtype
    dgate = torch.empty(gate.shape, dtype=dtype, device=gate.device)
    dup = torch.empty(gate.shape, dtype=dtype, device=gate.device)
    if gate.numel() == 0:
        return dgate, dup
    one = torch.ones((), dtype=torch.float32, device=gate.device)
    flat = [t.reshape(-1) for t in (grad, gate, up)]
    out_g, out_u = dgate.view(-1), dup.view(-1)
    for start in range(0, flat[0].numel(), CHUNK_ELEMENTS):
        part = slice(start, start + CHUNK_ELEMENTS)
        dy, g, u = (t[part].to(torch.float32) for t in flat)
        den = _denominator(g, one)
        ds = _derivative(g, _sigmoid(den, one), one)
        out_g[part] = cast_out(_gate_product(dy, u, ds), dtype)
        out_u[part] = cast_out(dy * _silu_value(g, den, dtype), dtype)
    return dgate, dup
