"""Optimizer steps (contracts ``adamw``, ``sgd``): elementwise IEEE fp32, exact on any device.

Each line below is one torch operation on fp32 tensors, so one IEEE rounding to nearest-even
with no contraction across lines. Divisors are tensors, never Python scalars: PyTorch's CUDA
division by a CPU scalar multiplies by its reciprocal (two roundings). The square root is the
exact integer ``sqrt_rn`` (``torch.sqrt`` is not correctly rounded on every CPU build).
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import canonical_nan, sqrt_rn


def adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
          b1: float, c1: float, b2: float, c2: float, eps: float, decay: float, step_size: float,
          bc2_sqrt: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step: ``(param', exp_avg', exp_avg_sq')``, float32, param's shape.

    The scalars are contract ``adamw``'s fp32 host scalars (computed once by ``rlkernel.ops.adamw``).
    """
    g = grad.to(torch.float32)
    m = torch.add(torch.mul(exp_avg, b1), torch.mul(g, c1))
    v = torch.add(torch.mul(exp_avg_sq, b2), torch.mul(torch.mul(g, c2), g))
    root = sqrt_rn(v)
    d = torch.add(torch.div(root, torch.full_like(root, bc2_sqrt)), eps)
    u = torch.div(m, d)
    p = torch.sub(torch.mul(param, decay), torch.mul(u, step_size))
    return canonical_nan(p), canonical_nan(m), canonical_nan(v)


def sgd(param: torch.Tensor, grad: torch.Tensor, momentum_buffer: torch.Tensor, *, first: bool, lr: float,
        momentum: float, damp: float, weight_decay: float, nesterov: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step: ``(param', momentum_buffer')``, float32. Scalars are contract ``sgd``'s fp32
    host scalars; ``first`` is step 1 (the buffer starts as the gradient)."""
    g = grad.to(torch.float32)
    if weight_decay != 0:
        g = torch.add(g, torch.mul(param, weight_decay))
    if momentum != 0:
        buf = g if first else torch.add(torch.mul(momentum_buffer, momentum), torch.mul(g, damp))
        d = torch.add(g, torch.mul(buf, momentum)) if nesterov else buf
    else:
        buf = d = g
    p = torch.sub(param, torch.mul(d, lr))
    return canonical_nan(p), canonical_nan(buf)
