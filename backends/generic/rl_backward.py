"""Device-generic backwards of the RL ops: k3 KL (contract exp_c) and the masked means.

Elementwise IEEE fp32 steps; constants are 0-d fp32 tensors, never Python scalars in a division.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.fp32 import canonical_nan, int64_to_f32, int_sum
from rlkernel.backends.generic._exact.transcendental import exp_c

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _one_minus_exp(d: torch.Tensor) -> torch.Tensor:
    """``RN32(1 - exp_c(d))``: d k3 / d logp."""
    return torch.ones((), dtype=torch.float32, device=d.device) - exp_c(d)


def kl_k3_backward(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``RN32(g * RN32(1 - exp_c(RN32(ref_logp - logp))))`` elementwise (contract ``kl_k3_backward`` v1).

    Parameters
    ----------
    grad, logp, ref_logp : Tensor, float32, one shape

    Returns
    -------
    Tensor, float32, logp's shape
    """
    return canonical_nan(grad * _one_minus_exp(ref_logp - logp))


def _denominator(mask: torch.Tensor, counts: torch.Tensor, mode: str, denominator: float | None) -> torch.Tensor:
    """``fp32(denominator)`` (already rounded by the caller: exact here) or fp32 of the mode's count."""
    if denominator is not None:
        return torch.full((), denominator, dtype=torch.float32, device=mask.device)
    if mode == "token-mean":
        return int64_to_f32(int_sum(counts))
    return int64_to_f32(int_sum(mask.any(dim=1)))  # sequences with a kept token


def _per_token(g: torch.Tensor, counts: torch.Tensor, d: torch.Tensor, mode: str) -> torch.Tensor:
    """``RN32(g ÷ D)``, or ``RN32(RN32(g ÷ fp32(c_b)) ÷ D)`` for seq-mean-token-mean: [B, 1] or []."""
    if mode == "seq-mean-token-mean":
        return (g / int64_to_f32(counts)) / d
    return g / d


def masked_mean_backward(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                         denominator: float | None = None) -> torch.Tensor:
    """Gradient of ``masked_mean`` in x (contract ``masked_mean_backward`` v1).

    Parameters
    ----------
    grad : Tensor, float32, []
    mask : Tensor, bool, [B, T]
    mode : str
    denominator : float, optional
        Already rounded to fp32 by the caller.

    Returns
    -------
    Tensor, float32, [B, T]: the per-token gradient on kept tokens, +0 elsewhere
    """
    if mode not in MODES:
        raise ValueError(f"masked_mean_backward: mode {mode!r}; expected one of {MODES}")
    counts = int_sum(mask, dim=1, keepdim=True)
    g = grad.to(torch.float32).reshape(())
    value = _per_token(g, counts, _denominator(mask, counts, mode, denominator), mode)
    zero = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return canonical_nan(torch.where(mask, value.expand(mask.shape), zero))
