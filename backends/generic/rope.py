"""Device-generic rotate-half RoPE: gather the table rows, two products and one add per output.

Tokens are processed in chunks of about :data:`CHUNK_ELEMENTS` elements; each token depends
only on its own values and table row, so chunking cannot change a bit.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import cast_out

CHUNK_ELEMENTS = 1 << 22


def _split(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotate-half (NeoX) pairs as views: ``(t[..., :D/2], t[..., D/2:])``."""
    half = t.shape[-1] // 2
    return t[..., :half], t[..., half:]


def _rotate(x1: torch.Tensor, x2: torch.Tensor, c: torch.Tensor,
            s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(RN(RN(x1*c) - RN(x2*s)), RN(RN(x2*c) + RN(x1*s)))``: each product rounded, no FMA."""
    return x1 * c - x2 * s, x2 * c + x1 * s


def rope(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``y1 = RN(RN(x1*c) - RN(x2*s))``, ``y2 = RN(RN(x2*c) + RN(x1*s))``, ``c, s = cos[p], sin[p]``.

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [T, n_heads, D] or [T, D]
    positions : Tensor, int64, [T], each < cos.shape[0]
    cos, sin : Tensor, float32, [max_position, D // 2]
        The contract's host tables, on x's device.

    Returns
    -------
    Tensor, x's dtype, x's shape
    """
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    per_token = x[0].numel()
    step = max(1, CHUNK_ELEMENTS // per_token)
    for start in range(0, x.shape[0], step):
        pos = positions[start:start + step]
        c, s = cos.index_select(0, pos), sin.index_select(0, pos)
        if x.dim() == 3:
            c, s = c.unsqueeze(1), s.unsqueeze(1)
        y1, y2 = _rotate(*_split(x[start:start + step].to(torch.float32)), c, s)
        out1, out2 = _split(out[start:start + step])
        out1[...] = cast_out(y1, x.dtype)
        out2[...] = cast_out(y2, x.dtype)
    return out
