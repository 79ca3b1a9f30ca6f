"""SwiGLU's activation over ``rlkernel.ops.silu_mul``."""

from __future__ import annotations

import torch
from torch import nn

from rlkernel.nn.opset import OpsUser

__all__ = ["SiluAndMul"]


class SiluAndMul(OpsUser, nn.Module):
    """``silu(x[..., :I]) * x[..., I:]`` for a fused gate/up projection output.

    Forward: x ``[*, 2I]`` (bfloat16/float16/float32; the output of a
    :class:`~rlkernel.nn.linear.MergedColumnParallelLinear` with parts ``[I, I]``, on a TP rank
    its local ``[gate slice; up slice]``) -> ``[*, I]``, x's dtype. Elementwise (contract
    ``silu_mul``), so batch and TP invariant.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] % 2:
            raise ValueError(f"SiluAndMul: x has shape {tuple(x.shape)}; expected an even last axis [*, 2I] "
                             f"(gate and up halves of a fused projection)")
        half = x.shape[-1] // 2
        return self.ops.silu_mul(x[..., :half], x[..., half:])
