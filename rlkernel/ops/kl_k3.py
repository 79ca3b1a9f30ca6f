"""``rlkernel.ops.kl_k3``: the per-token k3 KL estimate (contract ``kl_k3`` v1)."""

from __future__ import annotations

from typing import Any

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _rl

__all__ = ["KLK3Function", "kl_k3", "kl_k3_backward"]


class KLK3Function(torch.autograd.Function):
    """Autograd for :func:`kl_k3`: ``dlogp = RN32(g * RN32(1 - exp_c(d)))`` (contract
    ``kl_k3_backward``), elementwise, so deterministic and batch-invariant. No gradient for
    ``ref_logp`` (the reference policy is not trained)."""

    @staticmethod
    def forward(ctx: Any, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(logp, ref_logp)
        return dispatch.call("kl_k3", logp.device, logp=logp, ref_logp=ref_logp)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logp, ref_logp = ctx.saved_tensors
        g = v.contiguous(grad.detach().to(torch.float32))
        return dispatch.call("kl_k3_backward", logp.device, grad=g, logp=logp, ref_logp=ref_logp), None


def _check(op: str, logp: object, ref_logp: object) -> tuple[torch.Tensor, torch.Tensor, torch.device]:
    logp = _rl.fp32_tensor(op, "logp", logp)
    ref_logp = _rl.fp32_tensor(op, "ref_logp", ref_logp)
    if ref_logp.shape != logp.shape:
        raise ValueError(f"{op}: ref_logp has shape {tuple(ref_logp.shape)}; expected logp's shape "
                         f"{tuple(logp.shape)} (no broadcasting)")
    return logp, ref_logp, v.same_device(op, [("logp", logp), ("ref_logp", ref_logp)])


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
    inputs (or d = inf - inf) give the canonical NaN. No clamp. Differentiable in logp
    (:func:`kl_k3_backward`); ref_logp requiring grad raises
    ``rlkernel.dispatch.BackwardNotDefined`` rather than being detached silently. Invariances:
    batch, permutation, repeat. Contract ``kl_k3`` v1.
    """
    op = "kl_k3"
    logp, ref_logp, device = _check(op, logp, ref_logp)
    logp, ref_logp = v.contiguous(logp), v.contiguous(ref_logp)
    if torch.is_grad_enabled() and ref_logp.requires_grad:  # never detached silently: the backward is for logp
        raise dispatch.BackwardNotDefined(
            "rlkernel.ops.kl_k3: the backward is defined for logp only, and ref_logp requires grad (grad mode is "
            "on). The reference policy is not trained: pass ref_logp.detach(), or compute the forward only under "
            "torch.no_grad() or torch.inference_mode()"
        )
    if torch.is_grad_enabled() and logp.requires_grad:
        out: torch.Tensor = KLK3Function.apply(logp, ref_logp)
        return out
    return dispatch.call(op, device, logp=logp, ref_logp=ref_logp)


def kl_k3_backward(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Gradient of :func:`kl_k3` in logp: ``grad * (1 - exp(ref_logp - logp))``.

    Parameters
    ----------
    grad : Tensor, float32, [*] (logp's shape)
        The gradient of kl_k3's output.
    logp, ref_logp : Tensor, float32, [*]
        The forward's inputs.

    Returns
    -------
    Tensor, float32, [*]

    Raises
    ------
    TypeError, ValueError
        Not float32 tensors, shapes or devices differ.
    rlkernel.dispatch.BackwardNotDefined
        An input requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    ``d = RN32(ref_logp - logp)`` (the forward's), ``dlogp = RN32(grad * RN32(1 - exp_c(d)))``
    elementwise. d > 89 makes ``1 - e = -inf``: a zero grad there gives NaN (IEEE ``0 * inf``, as
    PyTorch), so masked-out positions must hold log-probs with ``ref_logp - logp <= 89``.
    Invariances: batch, permutation, repeat. Contract ``kl_k3_backward`` v1.
    """
    op = "kl_k3_backward"
    logp, ref_logp, device = _check(op, logp, ref_logp)
    grad = _rl.fp32_tensor(op, "grad", grad)
    if grad.shape != logp.shape:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)}; expected logp's shape {tuple(logp.shape)} "
                         f"(the gradient of kl_k3's output)")
    v.same_device(op, [("logp", logp), ("grad", grad)])
    return dispatch.call(op, device, grad=v.contiguous(grad), logp=v.contiguous(logp), ref_logp=v.contiguous(ref_logp))
