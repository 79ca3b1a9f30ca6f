"""Public ``all_reduce``: the exact int64 reduction of tensor parallelism in one process (contract v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch

__all__ = ["all_reduce"]

_OPS = ("sum", "max")


def check_integer(op: str, name: str, t: object) -> torch.Tensor:
    """``t`` must be an int64 tensor; float tensors are refused with the reason."""
    t = v.tensor(op, name, t)
    if t.is_floating_point() or t.is_complex():
        raise TypeError(
            f"{op}: {name} has dtype {str(t.dtype).replace('torch.', '')}; expected int64. A floating-point "
            f"all-reduce is not exact: its result depends on the reduction order, which differs between "
            f"devices, topologies and world sizes. Reduce int64 partial sums instead (for linear: "
            f"rlkernel.ops.linear_partial, then rlkernel.ops.linear_finish) and round once afterwards"
        )
    if t.dtype != torch.int64:
        raise TypeError(f"{op}: {name} has dtype {str(t.dtype).replace('torch.', '')}; expected int64. "
                        f"Convert it with .to(torch.int64) (exact for every integer dtype)")
    return t


def all_reduce(partials: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """Exact all-reduce of int64 partials, simulated over a leading world axis.

    ``out = sum_r partials[r]`` (``op="sum"``) or ``max_r partials[r]`` (``op="max"``)

    Parameters
    ----------
    partials : Tensor, int64, [world, *]
        One slice per rank (world >= 1). Any layout.
    op : {"sum", "max"}

    Returns
    -------
    Tensor, int64, [*]

    Raises
    ------
    TypeError
        Float (or non-int64) partials: a float all-reduce is not exact.
    ValueError
        Unknown ``op``, ``world == 0``, or an exact sum outside int64.

    Bitwise semantics
    -----------------
    The mathematical integer sum (or maximum) over the world axis; integer addition is
    associative, so any reduction order, tree, ring or device gives these bits. A total outside
    ``[-2**63, 2**63)`` raises ``ValueError`` instead of wrapping (intermediate sums may leave
    the range: only the total matters). Invariant to the order of the world axis, element
    permutation and repeats. This is the TP primitive that
    :func:`rlkernel.distributed.all_reduce_exact` performs across processes.

    Contract: ``all_reduce``, version 1.
    """
    name = "all_reduce"
    partials = check_integer(name, "partials", partials)
    if op not in _OPS:
        raise ValueError(f"{name}: op={op!r}; expected 'sum' or 'max'")
    if partials.dim() < 1 or partials.shape[0] < 1:
        raise ValueError(f"{name}: partials has shape {tuple(partials.shape)}; expected [world, *] with world >= 1 "
                         f"(stack one partial per rank along axis 0)")
    world = partials.shape[0]
    if world >= 1 << 31:
        raise ValueError(f"{name}: world = {world} exceeds 2**31 - 1 ranks")
    rest = tuple(partials.shape[1:])
    elements = 1
    for s in rest:
        elements *= int(s)
    flat = partials.reshape(world, elements)
    out = dispatch.call(name, partials.device, partials=flat, reduction=op)  # kernel argument: reduction
    return out.reshape(rest)
