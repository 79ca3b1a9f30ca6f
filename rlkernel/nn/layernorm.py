"""RMSNorm over ``rlkernel.ops.rms_norm`` (Hugging Face Qwen3 order, exact sum of squares)."""

from __future__ import annotations

import torch
from torch import nn

from rlkernel.nn.linear import frozen, gather_replicated, load_replicated
from rlkernel.nn.opset import OpsUser

__all__ = ["RMSNorm"]


class RMSNorm(OpsUser, nn.Module):
    """``y = weight * (x / sqrt(mean(x**2) + eps))`` over the last axis, the same bits everywhere.

    Parameters
    ----------
    hidden_size : int
        H, the normalised axis (Qwen3: ``hidden_size`` for the layer norms, ``head_dim`` for the
        per-head q/k norms).
    eps : float
        Added to the mean square (Qwen3: ``rms_norm_eps``, 1e-6).
    dtype : torch.dtype
        Of the gain (and of the activations it is used with): bfloat16 (default), float16 or
        float32.
    device : torch.device or str, optional

    Forward: x ``[*, H]`` (e.g. ``[T, H]``, or ``[T, heads, head_dim]`` for QK-norm) -> ``[*, H]``,
    x's dtype. Each row is normalised on its own (contract ``rms_norm``: batch invariant), and
    the gain is replicated on every tensor-parallel rank.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = frozen((hidden_size,), dtype, device)
        self.weight.data.fill_(1.0)
        self.weight.weight_loader = load_replicated  # type: ignore[attr-defined]
        self.weight.weight_gatherer = gather_replicated  # type: ignore[attr-defined]
        self.weight.shard_ids = (None,)  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
