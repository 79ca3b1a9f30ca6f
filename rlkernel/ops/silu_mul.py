"""``rlkernel.ops.silu_mul``: bitwise-reproducible SwiGLU activation (contract ``silu_mul`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch

__all__ = ["SiluMulFunction", "silu_mul", "silu_mul_backward"]


class SiluMulFunction(torch.autograd.Function):
    """Autograd for :func:`silu_mul`: the contract's elementwise ``silu_mul_backward`` (dgate, dup)."""

    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[no-untyped-def,override]
        ctx.save_for_backward(gate, up)
        return dispatch.call("silu_mul", gate.device, gate=gate, up=up)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        gate, up = ctx.saved_tensors
        dgate, dup = dispatch.call("silu_mul_backward", gate.device, grad=v.contiguous(grad.to(gate.dtype)),
                                   gate=gate, up=up)
        return (dgate if ctx.needs_input_grad[0] else None), (dup if ctx.needs_input_grad[1] else None)


def _check(op: str, gate: object, up: object) -> tuple[torch.Tensor, torch.Tensor, torch.device]:
    gate = v.tensor(op, "gate", gate)
    up = v.tensor(op, "up", up)
    v.dtype(op, "gate", gate, v.FLOATS)
    v.same_dtype(op, "gate", gate, "up", up)
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate has shape {tuple(gate.shape)} but up has shape {tuple(up.shape)}; "
                         f"expected equal shapes [*, I] (broadcasting is not supported)")
    return gate, up, v.same_device(op, [("gate", gate), ("up", up)])


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise, the same bits on every backend.

    ``y = RN_dtype(fp32(RN_dtype(g ÷ (1 + exp_c(-g)))) * fp32(up))`` with ``g = fp32(gate)``

    Parameters
    ----------
    gate : Tensor, bfloat16/float16/float32, [*, I]
        Gate projection. Non-contiguous views (e.g. halves of a fused projection) are
        accepted (read through a contiguous copy).
    up : Tensor, gate's dtype, [*, I] (gate's shape), on gate's device
        Up projection.

    Returns
    -------
    Tensor, gate's dtype, [*, I]

    Raises
    ------
    TypeError
        Not tensors, unsupported dtype, or gate and up dtypes differ.
    ValueError
        Shapes or devices differ.

    Bitwise semantics
    -----------------
    Hugging Face Qwen3 MLP order: silu in fp32 with the contract exponential ``exp_c`` (R2)
    and an IEEE division, rounded to the input dtype, then one fp32 product with ``up``
    rounded to the input dtype; NaN canonical. ``silu(-inf)`` is NaN (``-inf ÷ inf``), gates
    below -89 give ``-0``. Elementwise: invariant under batch, permutation, repeat.
    Contract ``silu_mul`` v1 (``rlkernel.contracts.silu_mul``).
    """
    op = "silu_mul"
    gate, up, device = _check(op, gate, up)
    gate, up = v.contiguous(gate), v.contiguous(up)
    if torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad):
        out: torch.Tensor = SiluMulFunction.apply(gate, up)
        return out
    return dispatch.call(op, device, gate=gate, up=up)


def silu_mul_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of :func:`silu_mul` in gate and up, elementwise.

    ``dgate = dy * up * sig * (1 + g * (1 - sig))``, ``dup = dy * silu(g)``, ``sig = 1 / (1 + exp_c(-g))``

    Parameters
    ----------
    grad : Tensor, gate's dtype, [*, I] (gate's shape)
        ``dy``, the gradient of silu_mul's output.
    gate, up : Tensor, bfloat16/float16/float32 (one dtype), [*, I]
        The forward's inputs.

    Returns
    -------
    dgate, dup : Tensor, gate's dtype, [*, I]

    Raises
    ------
    TypeError, ValueError
        As :func:`silu_mul`; grad not in gate's dtype or shape.
    rlkernel.dispatch.BackwardNotDefined
        An input requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    ``g = fp32(gate)``; ``den = RN32(1 + exp_c(-g))`` (the forward's); ``sig = RN32(1 ÷ den)``;
    ``ds = RN32(sig * RN32(1 + RN32(g * RN32(1 - sig))))``;
    ``dgate = RN_dtype(RN32(RN32(dy * up) * ds))``; ``dup = RN_dtype(RN32(dy * RN_dtype(RN32(g ÷ den))))``
    (the silu value the forward multiplied). NaN canonical; ``g = ±inf`` give NaN in dgate, as
    PyTorch. Invariances: batch, permutation, repeat. Contract ``silu_mul_backward`` v1.
    """
    op = "silu_mul_backward"
    gate, up, device = _check(op, gate, up)
    grad = v.tensor(op, "grad", grad)
    v.same_dtype(op, "gate", gate, "grad", grad)
    if grad.shape != gate.shape:
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)} but gate has shape {tuple(gate.shape)}; "
                         f"expected the gradient of silu_mul's output (gate's shape)")
    v.same_device(op, [("gate", gate), ("grad", grad)])
    return dispatch.call(op, device, grad=v.contiguous(grad), gate=v.contiguous(gate), up=v.contiguous(up))
