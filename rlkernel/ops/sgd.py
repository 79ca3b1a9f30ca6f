"""``rlkernel.ops.sgd``: one SGD step with momentum (contract ``sgd`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops import _optim_scalars
from rlkernel.ops._optim_checks import hyper, state_tensors

__all__ = ["sgd"]


def sgd(param: torch.Tensor, grad: torch.Tensor, momentum_buffer: torch.Tensor, *, step: int, lr: float,
        momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of torch.optim.SGD's algorithm, out of place: the same bits on every backend.

    Parameters
    ----------
    param : Tensor, float32, [*]
    grad : Tensor, float32, bfloat16 or float16, [*] (param's shape)
    momentum_buffer : Tensor, float32, [*] (param's shape)
        The buffer after the previous step; ignored at step 1 and without momentum
        (pass ``torch.zeros_like(param)``).
    step : int
        >= 1 (1 for the first update: the buffer starts as the gradient).
    lr : float
        >= 0.
    momentum, dampening : float
        >= 0 (torch's SGD: usually momentum 0.9, dampening 0).
    weight_decay : float
        >= 0 (coupled L2: added to the gradient, as torch's SGD).
    nesterov : bool
        Needs momentum > 0 and dampening = 0.

    Returns
    -------
    (param', momentum_buffer') : float32 tensors of param's shape

    Bitwise semantics
    -----------------
    Scalars ``lr32 = RN32(lr)``, ``mu = RN32(momentum)``, ``wd32 = RN32(weight_decay)``,
    ``damp = RN32(1 - dampening)`` (exact real). Elementwise, one IEEE fp32 rounding per
    operation, no fused multiply-add: ``g = RN(g + RN(wd32 * p))`` (if weight_decay != 0);
    ``buf = g`` at step 1 else ``RN(RN(mu * buf) + RN(damp * g))`` (if momentum != 0);
    direction ``RN(g + RN(mu * buf))`` with nesterov, else ``buf`` (``g`` without momentum);
    ``p' = RN(p - RN(lr32 * d))``. NaN outputs canonical. Contract ``sgd`` v1.
    """
    op = "sgd"
    device = state_tensors(op, {"param": param, "grad": grad, "momentum_buffer": momentum_buffer})
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(f"sgd: step = {step!r}; expected an int >= 1 (1 for the first update)")
    lr = hyper("lr", lr, 0.0, None, False, "the learning rate", op)
    momentum = hyper("momentum", momentum, 0.0, None, False, "0 turns momentum off", op)
    dampening = hyper("dampening", dampening, 0.0, None, False, "usually 0", op)
    weight_decay = hyper("weight_decay", weight_decay, 0.0, None, False, "0 turns decay off", op)
    if nesterov and (momentum <= 0 or dampening != 0):
        raise ValueError(f"sgd: nesterov needs momentum > 0 and dampening = 0; got momentum = {momentum}, "
                         f"dampening = {dampening}")
    lr32, mu, wd32, damp = _optim_scalars.sgd_scalars(lr, momentum, dampening, weight_decay)
    return dispatch.call(op, device, param=v.contiguous(param), grad=v.contiguous(grad),
                         momentum_buffer=v.contiguous(momentum_buffer), first=step == 1, lr=lr32, momentum=mu,
                         damp=damp, weight_decay=wd32, nesterov=bool(nesterov))
