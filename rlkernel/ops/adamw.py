"""``rlkernel.ops.adamw``: one AdamW step on fp32 master weights (contract ``adamw`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _optim_scalars
from rlkernel.ops._optim_checks import hyper, state_tensors

__all__ = ["adamw"]


def adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
          step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step (torch.optim.AdamW's algorithm), out of place: the same bits on every backend.

    Parameters
    ----------
    param : Tensor, float32, [*]
        fp32 master weights (keep a fp32 copy of bf16 model weights; see ``rlkernel.rl.AdamW``).
    grad : Tensor, float32, bfloat16 or float16, [*] (param's shape)
    exp_avg, exp_avg_sq : Tensor, float32, [*] (param's shape)
        First and second moments before this step (zeros before the first).
    step : int
        The number of this step, >= 1 (1 for the first update), as torch's ``state["step"]``
        after its increment.
    lr : float
        Learning rate, finite, >= 0.
    beta1, beta2 : float
        In [0, 1).
    eps : float
        > 0, added to the bias-corrected root of the second moment.
    weight_decay : float
        Decoupled weight decay, >= 0: ``param * (1 - lr * weight_decay)``.

    Returns
    -------
    (param', exp_avg', exp_avg_sq') : three new float32 tensors of param's shape (contiguous)

    Raises
    ------
    TypeError, ValueError
        Wrong dtypes, shapes or devices; hyper-parameters out of range (the message says which).

    Bitwise semantics
    -----------------
    Host scalars, each the correctly rounded fp32 of an exact real computed from the fp64
    arguments: ``b1 = RN32(beta1)``, ``c1 = RN32(1 - beta1)``, ``b2``, ``c2`` likewise,
    ``eps32 = RN32(eps)``, ``decay = RN32(1 - lr * weight_decay)``,
    ``step_size = RN32(lr / (1 - beta1**step))``, ``bc2_sqrt = RN32(sqrt(1 - beta2**step))``.
    Then elementwise, each operation one IEEE fp32 rounding to nearest-even, no fused
    multiply-add, ``sqrt_rn`` correctly rounded::

        m' = RN(RN(b1 * m) + RN(c1 * g))            g = fp32(grad), exact
        v' = RN(RN(b2 * v) + RN(RN(c2 * g) * g))
        d  = RN(RN(sqrt_rn(v') / bc2_sqrt) + eps32)
        p' = RN(RN(p * decay) - RN(step_size * RN(m' / d)))

    NaN outputs are canonical. Elementwise, so a slice updated alone, inside a flat buffer or
    as a tensor-parallel shard gets the same bits. Not differentiable (inputs that require
    grad under grad mode raise ``BackwardNotDefined``; call it under ``torch.no_grad()``).
    Contract ``adamw`` v1.
    """
    op = "adamw"
    device = state_tensors(op, {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq})
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step < 2**31:
        raise ValueError(f"adamw: step = {step!r}; expected an int in [1, 2**31) (1 for the first update)")
    scalars = _optim_scalars.host_scalars(
        step,
        hyper("lr", lr, 0.0, None, False, "the learning rate"),
        hyper("beta1", beta1, 0.0, 1.0, False, "torch's betas[0]"),
        hyper("beta2", beta2, 0.0, 1.0, False, "torch's betas[1]"),
        hyper("eps", eps, 0.0, None, True, "e.g. 1e-8"),
        hyper("weight_decay", weight_decay, 0.0, None, False, "0 turns decay off"))
    b1, c1, b2, c2, eps32, decay, step_size, bc2_sqrt = scalars
    return dispatch.call(op, device, param=v.contiguous(param), grad=v.contiguous(grad),
                         exp_avg=v.contiguous(exp_avg), exp_avg_sq=v.contiguous(exp_avg_sq), b1=b1, c1=c1, b2=b2,
                         c2=c2, eps=eps32, decay=decay, step_size=step_size, bc2_sqrt=bc2_sqrt)
