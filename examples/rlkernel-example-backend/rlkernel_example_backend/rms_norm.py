"""``rms_norm`` for the example backend (contract ``rms_norm`` v1)."""

from __future__ import annotations

import torch

from ._fp32 import canonical, fixed_sum_last, sqrt_rn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``RN(fp32(w) * RN(fp32(x) * (1 ÷ sqrt(fixed_sum(x*x) ÷ H + eps))))`` over the last axis.

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [*, H] (validated by ``rlkernel.ops.rms_norm``)
    weight : Tensor, x's dtype or float32, [H]
    eps : float

    Returns
    -------
    Tensor, x's dtype, [*, H]
    """
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype)
    xf = x.to(torch.float32)
    total = fixed_sum_last(xf * xf)  # exact sum of the rounded squares: any order, same bits
    mean = total / torch.tensor(float(x.shape[-1]), dtype=torch.float32)
    r = torch.tensor(1.0) / sqrt_rn(mean + torch.tensor(eps, dtype=torch.float32))
    h = xf * r.unsqueeze(-1)
    if x.dtype != torch.float32:
        h = h.to(x.dtype).to(torch.float32)
    y = weight.to(torch.float32) * h
    return canonical(y.to(x.dtype))
