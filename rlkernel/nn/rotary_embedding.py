"""Rotary position embedding of queries and keys over ``rlkernel.ops.rope``."""

from __future__ import annotations

import torch
from torch import nn

from rlkernel.nn.opset import OpsUser

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(OpsUser, nn.Module):
    """NeoX/Hugging Face rotate-half RoPE with correctly rounded fp32 tables (contract ``rope``).

    Parameters
    ----------
    head_dim : int
        D (even); the whole head is rotated (Qwen3).
    theta : float
        RoPE base (config ``rope_theta``; Qwen3 checkpoints use 1e6).
    max_position : int
        Largest position + 1 the model accepts (config ``max_position_embeddings``).

    Forward: ``(positions [T] int64, q [T, Hq, D], k [T, Hkv, D])`` -> rotated ``(q, k)``, same
    shapes and dtypes. Each token depends only on its values and its position, so a token at
    position p gets the same bits in a full sequence, a prefill chunk or a decode step.
    """

    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        self.head_dim, self.theta, self.max_position = head_dim, float(theta), max_position

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rope(q, positions, self.theta), self.ops.rope(k, positions, self.theta)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, max_position={self.max_position}"
