"""Mutants of sgd's parameters: each host scalar one ulp off (or doubly rounded), the decay, the
first-step buffer, the momentum and Nesterov steps, a fused update, a batch-dependent kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap

OP = "sgd"
SCALARS = "rlkernel.ops._optim_scalars"
NAMES = ("lr", "mu", "wd", "damp")


def _scalar(name: str, change: Any) -> Any:
    base = original(SCALARS, "sgd_scalars")
    i = NAMES.index(name)

    def mutant(*args: Any) -> tuple[float, ...]:
        s = list(base(*args))
        s[i] = change(s[i], args)
        return tuple(s)

    return patch(SCALARS, "sgd_scalars", mutant)


def _up(x: float, a: Any) -> float:
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def _kernel(*, grad_via_bf16: bool = False, fused_decay: bool = False, use_buffer_first: bool = False,
            fused_momentum: bool = False, nesterov_old_buffer: bool = False, fused_update: bool = False) -> Any:
    canonical = original("optim", "canonical_nan")

    def kernel(param: torch.Tensor, grad: torch.Tensor, momentum_buffer: torch.Tensor, *, first: bool, lr: float,
               momentum: float, damp: float, weight_decay: float, nesterov: bool) -> tuple[torch.Tensor, torch.Tensor]:
        g = grad.to(torch.bfloat16).to(torch.float32) if grad_via_bf16 else grad.to(torch.float32)
        if weight_decay != 0:
            g = (g.double() + param.double() * weight_decay).float() if fused_decay else g + param * weight_decay
        if momentum != 0:
            if first and not use_buffer_first:
                buf = g
            elif fused_momentum:
                buf = (momentum_buffer.double() * momentum + g.double() * damp).float()
            else:
                buf = momentum_buffer * momentum + g * damp
            d = (g + (momentum_buffer if nesterov_old_buffer else buf) * momentum) if nesterov else buf
        else:
            buf = d = g
        p = (param.double() - d.double() * lr).float() if fused_update else param - d * lr
        return canonical(p), canonical(buf)

    return patch("optim", "sgd", kernel)


def _batched(fn: Any) -> Any:
    fused = _kernel(fused_update=True).value

    def mutant(param: torch.Tensor, *args: Any, **kw: Any) -> Any:
        return (fused if param.numel() > 2000 else fn)(param, *args, **kw)

    return mutant


MUTATIONS: list[Mutation] = [
    *[mutation(OP, "host_scalars", f"{n} one ulp up", _scalar(n, _up)) for n in NAMES],
    mutation(OP, "host_scalars", "damp = RN32(1 - RN32(dampening)) (fp32 arithmetic)",
             _scalar("damp", lambda x, a: float(np.float32(1.0 - float(np.float32(a[2])))))),
    mutation(OP, "grad_widening", "g = fp32(bf16(grad))", _kernel(grad_via_bf16=True)),
    mutation(OP, "weight_decay", "g + wd * p in one rounding", _kernel(fused_decay=True)),
    mutation(OP, "first_step_buffer", "step 1 reads the given buffer", _kernel(use_buffer_first=True)),
    mutation(OP, "momentum_update", "mu * buf + damp * g in one rounding", _kernel(fused_momentum=True)),
    mutation(OP, "nesterov", "direction from the buffer before this step", _kernel(nesterov_old_buffer=True)),
    mutation(OP, "param_update", "p - lr * d in one rounding", _kernel(fused_update=True)),
    mutation(OP, ORDER_BATCH, "tensors > 2000 elements fuse the update", wrap("optim", "sgd", _batched)),
]
