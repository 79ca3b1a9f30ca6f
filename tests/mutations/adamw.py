"""Mutants of adamw's parameters: each host scalar one ulp off or doubly rounded, the order and
rounding of every elementwise step, a fused step, a batch-dependent kernel."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap

OP = "adamw"
SCALARS = "rlkernel.ops._optim_scalars"
NAMES = ("b1", "c1", "b2", "c2", "eps", "decay", "step_size", "bc2_sqrt")


def _ulp_up(x: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def _scalar(name: str, change: Any) -> Any:
    """host_scalars with one scalar replaced by ``change(value, args)``."""
    base = original(SCALARS, "host_scalars")
    i = NAMES.index(name)

    def mutant(*args: Any) -> tuple[float, ...]:
        s = list(base(*args))
        s[i] = change(s[i], args)
        return tuple(s)

    return mutant


def _f32(x: float) -> float:
    return float(np.float32(x))


def _kernel(*, lerp: bool = False, v_square_first: bool = False, sqrt: str = "rn", eps_first: bool = False,
            reciprocal: bool = False, decay_last: bool = False, fused_m: bool = False,
            grad_via_bf16: bool = False) -> Any:
    sqrt_rn = original("optim", "sqrt_rn")
    canonical = original("optim", "canonical_nan")

    def kernel(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
               b1: float, c1: float, b2: float, c2: float, eps: float, decay: float, step_size: float,
               bc2_sqrt: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        g = grad.to(torch.bfloat16).to(torch.float32) if grad_via_bf16 else grad.to(torch.float32)
        if lerp:
            m = exp_avg + (g - exp_avg) * c1
        elif fused_m:
            m = (exp_avg.double() * b1 + g.double() * c1).to(torch.float32)
        else:
            m = exp_avg * b1 + g * c1
        v = exp_avg_sq * b2 + ((g * g) * c2 if v_square_first else (g * c2) * g)
        root = sqrt_rn(v)
        if sqrt == "rz":  # round toward zero: one ulp down where the root was rounded up
            up = root.double() * root.double() > v.double()
            root = torch.where(up, torch.nextafter(root, torch.zeros_like(root)), root)
        bc = torch.full_like(root, bc2_sqrt)
        d = (root + eps) / bc if eps_first else root / bc + eps
        u = m * (1.0 / d) if reciprocal else m / d
        p = (param - u * step_size) * decay if decay_last else param * decay - u * step_size
        return canonical(p), canonical(m), canonical(v)

    return kernel


def _batched(fn: Any) -> Any:
    """More than 2000 elements take the lerp path."""
    lerp = _kernel(lerp=True)

    def mutant(param: torch.Tensor, *args: Any, **kw: Any) -> Any:
        return (lerp if param.numel() > 2000 else fn)(param, *args, **kw)

    return mutant


def _s(name: str, change: Any) -> Any:
    return patch(SCALARS, "host_scalars", _scalar(name, change))


def _k(**kw: bool | str) -> Any:
    return patch("optim", "adamw", _kernel(**kw))  # type: ignore[arg-type]


def _up(x: float, a: Any) -> float:
    return _ulp_up(x)


MUTATIONS: list[Mutation] = [
    *[mutation(OP, "host_scalars", f"{n} one ulp up", _s(n, _up)) for n in ("b1", "c1", "b2", "c2", "eps")],
    mutation(OP, "host_scalars", "c1 = RN32(1 - RN32(beta1)) (fp32 arithmetic)",
             _s("c1", lambda x, a: _f32(1.0 - _f32(a[2])))),
    mutation(OP, "decay_scalar", "decay one ulp up", _s("decay", _up)),
    mutation(OP, "decay_scalar", "decay = RN32(1 - RN32(RN32(lr) * RN32(wd)))",
             _s("decay", lambda x, a: _f32(1.0 - _f32(_f32(a[1]) * _f32(a[5]))))),
    mutation(OP, "step_size", "step_size one ulp up", _s("step_size", _up)),
    mutation(OP, "step_size", "step_size = RN32(RN32(lr) / RN32(1 - beta1**step)) (fp64 pow)",
             _s("step_size", lambda x, a: _f32(_f32(a[1]) / _f32(1 - a[2] ** a[0])))),
    mutation(OP, "bc2_sqrt", "bc2_sqrt one ulp up", _s("bc2_sqrt", _up)),
    mutation(OP, "grad_widening", "g = fp32(bf16(grad))", _k(grad_via_bf16=True)),
    mutation(OP, "exp_avg_update", "m' = m + RN(c1 * RN(g - m)) (torch's lerp)", _k(lerp=True)),
    mutation(OP, "exp_avg_sq_update", "RN(c2 * RN(g * g)) instead of RN(RN(c2 * g) * g)", _k(v_square_first=True)),
    mutation(OP, "sqrt_rounding", "square root rounded toward zero", _k(sqrt="rz")),
    mutation(OP, "denominator", "RN(RN(sqrt + eps) / bc2_sqrt): eps before the bias correction", _k(eps_first=True)),
    mutation(OP, "division_rounding", "m' * RN(1 / d) instead of RN(m' / d)", _k(reciprocal=True)),
    mutation(OP, "param_update", "decay applied after the update", _k(decay_last=True)),
    mutation(OP, "no_contraction", "m' = one rounding of b1 * m + c1 * g (fused)", _k(fused_m=True)),
    mutation(OP, ORDER_BATCH, "tensors > 2000 elements use lerp", wrap("optim", "adamw", _batched)),
]
