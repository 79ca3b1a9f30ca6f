"""Device-generic RoPE backward: the forward's tables, the transposed rotation, two products and one add.

Tokens are processed in chunks of about :data:`CHUNK_ELEMENTS` elements; each token depends
only on its own gradient and table row, so chunking cannot change a bit.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import cast_out

CHUNK_ELEMENTS = 1 << 22


def _split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotate-half (NeoX) pairs as views: ``(t[..., :D/2], t[..., D/2:])``."""
    half = t.shape[-1] // 2
    return t[..., :half], t[..., half:]


def _rotate_back(dy1: torch.Tensor, dy2: torch.Tensor, c: torch.Tensor,
                 s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(RN(RN(dy1*c) + RN(dy2*s)), RN(RN(dy2*c) - RN(dy1*s)))``: the transpose of the forward's rotation."""
    return dy1 * c + dy2 * s, dy2 * c - dy1 * s


def rope_backward(grad: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``dx1 = RN(RN(dy1*c) + RN(dy2*s))``, ``dx2 = RN(RN(dy2*c) - RN(dy1*s))``, ``c, s = cos[p], sin[p]``.

    Parameters
    ----------
    grad : Tensor, bfloat16/float16/float32, [T, n_heads, D] or [T, D]
    positions : Tensor, int64, [T], each < cos.shape[0]
    cos, sin : Tensor, float32, [max_position, D // 2]
        The contract's host tables (the forward's), on grad's device.

    Returns
    -------
    Tensor, grad's dtype, grad's shape
    """
    out = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    if grad.numel() == 0:
        return out
    step = max(1, CHUNK_ELEMENTS // grad[0].numel())
    for start in range(0, grad.shape[0], step):
        pos = positions[start:start + step]
        c, s = cos.index_select(0, pos), sin.index_select(0, pos)
        if grad.dim() == 3:
            c, s = c.unsqueeze(1), s.unsqueeze(1)
        dx1, dx2 = _rotate_back(*_split(grad[start:start + step].to(torch.float32)), c, s)
        out1, out2 = _split(out[start:start + step])
        out1[...] = cast_out(dx1, grad.dtype)
        out2[...] = cast_out(dx2, grad.dtype)
    return out
