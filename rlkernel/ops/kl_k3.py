"""``rlkernel.ops.kl_k3``: the per-token k3 KL estimate (contract ``kl_k3`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _rl

__all__ = ["kl_k3"]


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || pi_ref): ``exp(ref_logp - logp) - (ref_logp - logp) - 1``.

    Parameters
    ----------
    logp : Tensor, float32, [*]
        Current-policy log-probs of the sampled tokens.
    ref_logp : Tensor, float32, [*] (same shape)
        Reference-policy log-probs.

    Returns
    -------
    Tensor, float32, [*]

    Raises
    ------
    TypeError, ValueError
        Not float32 tensors, shapes or devices differ.

    Bitwise semantics
    -----------------
    ``d = RN32(ref_logp - logp)``, ``k3 = RN32(RN32(exp_c(d) - d) - 1)`` elementwise (contract
    exp, P6): exactly +0 where the log-probs are equal. d > 89 or d = -inf give +inf; NaN
    inputs (or d = inf - inf) give the canonical NaN. No clamp. No backward yet: inputs that
    require grad (grad mode on) raise ``rlkernel.dispatch.BackwardNotDefined`` rather than
    being detached silently. Invariances: batch, permutation, repeat. Contract ``kl_k3`` v1.
    """
    op = "kl_k3"
    logp = _rl.fp32_tensor(op, "logp", logp)
    ref_logp = _rl.fp32_tensor(op, "ref_logp", ref_logp)
    if ref_logp.shape != logp.shape:
        raise ValueError(f"{op}: ref_logp has shape {tuple(ref_logp.shape)}; expected logp's shape "
                         f"{tuple(logp.shape)} (no broadcasting)")
    device = v.same_device(op, [("logp", logp), ("ref_logp", ref_logp)])
    return dispatch.call(op, device, logp=v.contiguous(logp), ref_logp=v.contiguous(ref_logp))
