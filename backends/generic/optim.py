"""Optimizer steps (contracts ``adamw``, ``sgd``): elementwise IEEE fp32, exact on any device.

Each line below is one torch operation on fp32 tensors, so one IEEE rounding to nearest-even
with no contraction across lines. Divisors are tensors, never Python scalars: PyTorch's CUDA
division by a CPU scalar multiplies by its reciprocal (two roundings). The square root is the
exact integer ``sqrt_rn`` (``torch.sqrt`` is not correctly rounded on every CPU build).
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import canonical_nan, sqrt_rn

#: Elements per chunk of an AdamW step: the exact integer square root takes ~150 bytes of
#: temporaries per element (a 155M-element LM head would need 24 GB at once; a chunk ~1.2 GB).
#: On the H200, 2**20-element chunks made a 67M-element step 3.5x slower (launch-bound);
#: elementwise, so chunking changes no bit.
CHUNK = 1 << 23


def adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
          b1: float, c1: float, b2: float, c2: float, eps: float, decay: float, step_size: float,
          bc2_sqrt: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step: ``(param', exp_avg', exp_avg_sq')``, float32, param's shape (contiguous inputs).

    The scalars are contract ``adamw``'s fp32 host scalars (computed once by ``rlkernel.ops.adamw``).
    Tensors above :data:`CHUNK` elements are processed in chunks (bounded temporaries).
    """
    scalars = {"b1": b1, "c1": c1, "b2": b2, "c2": c2, "eps": eps, "decay": decay, "step_size": step_size,
               "bc2_sqrt": bc2_sqrt}
    n = param.numel()
    if n <= CHUNK:
        return _adamw(param, grad, exp_avg, exp_avg_sq, **scalars)
    outs = tuple(torch.empty(param.shape, dtype=torch.float32, device=param.device) for _ in range(3))
    flat_in = [t.reshape(-1) for t in (param, grad, exp_avg, exp_avg_sq)]
    flat_out = [t.view(-1) for t in outs]
    for start in range(0, n, CHUNK):
        part = _adamw(*(t[start:start + CHUNK] for t in flat_in), **scalars)
        for dst, src in zip(flat_out, part):
            dst[start:start + CHUNK] = src
    return outs  # type: ignore[return-value]


def _adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
           b1: float, c1: float, b2: float, c2: float, eps: float, decay: float, step_size: float,
           bc2_sqrt: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
