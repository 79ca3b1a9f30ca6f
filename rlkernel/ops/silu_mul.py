"""``rlkernel.ops.silu_mul``: bitwise-reproducible SwiGLU activation (contract ``silu_mul`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch


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
    v.tensor(op, "gate", gate)
    v.tensor(op, "up", up)
    v.dtype(op, "gate", gate, v.FLOATS)
    v.same_dtype(op, "gate", gate, "up", up)
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate has shape {tuple(gate.shape)} but up has shape {tuple(up.shape)}; "
                         f"expected equal shapes [*, I] (broadcasting is not supported)")
    device = v.same_device(op, [("gate", gate), ("up", up)])
    return dispatch.call(op, device, gate=v.contiguous(gate), up=v.contiguous(up))
