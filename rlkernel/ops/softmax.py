"""``rlkernel.ops.softmax`` and ``log_softmax``: bitwise-reproducible (contracts ``softmax`` v1,
``log_softmax`` v1)."""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch

#: Largest reduced length the exact probability sum allows (P4, F = 40).
MAX_N = 1 << 22


def _prepare(op: str, x: torch.Tensor, dim: int, dtype: torch.dtype | None) -> tuple[torch.Tensor, int]:
    """Validate; returns x with the reduced axis last (contiguous) and the normalised dim."""
    v.tensor(op, "x", x)
    v.dtype(op, "x", x, v.FLOATS)
    if x.dim() == 0:
        raise ValueError(f"{op}: x is a 0-d tensor; expected shape [*, N] with at least one axis (use x.reshape(1))")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{op}: dim = {dim} is out of range for x of shape {tuple(x.shape)}; "
                         f"expected -{x.dim()} <= dim < {x.dim()}")
    if dtype is not None and dtype not in (x.dtype, torch.float32):
        names = list(dict.fromkeys(["None (x's dtype)", str(x.dtype), "torch.float32"]))  # float32 x: listed once
        allowed = ", ".join(names[:-1]) + " or " + names[-1]
        raise TypeError(f"{op}: dtype = {dtype} is not supported for x of dtype {x.dtype}; expected {allowed}. "
                        f"Cast the result if you need another dtype")
    dim = dim % x.dim()
    n = x.shape[dim]
    if n > MAX_N:
        raise ValueError(f"{op}: the reduced axis has N = {n} elements, above the exact-sum bound {MAX_N} "
                         f"(2**22) for int64 accumulation with 40 fraction bits; shard the axis (e.g. the "
                         f"vocabulary over tensor-parallel ranks) and combine the partial sums")
    moved = x if dim == x.dim() - 1 else x.movedim(dim, -1)
    return v.contiguous(moved), dim


def _restore(y: torch.Tensor, dim: int) -> torch.Tensor:
    return y if dim == y.dim() - 1 else y.movedim(-1, dim).contiguous()


def softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax along ``dim``, the same bits on every backend.

    ``y = RN_out(p ÷ L)``, ``p = exp_c(fp32(x) - max x)``, ``L = fixed_sum(p)`` (grid 2**-40)

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, [*, N]
        Logits. Any leading shape, zero rows, N = 0 (empty output); N <= 2**22.
        Non-contiguous inputs are accepted (read through a contiguous copy).
    dim : int
        The reduced axis (default the last). The contract is stated for the last axis;
        another axis is moved last and back (a layout change, no arithmetic).
    dtype : torch.dtype, optional
        Output dtype: None (x's dtype, as ``torch.softmax``), x's dtype or torch.float32.
        The computation is fp32 either way; float32 output skips the final rounding.

    Returns
    -------
    Tensor, ``dtype`` or x's dtype, x's shape

    Raises
    ------
    TypeError
        x is not a float tensor of a supported dtype; unsupported ``dtype``; dim not an int.
    ValueError
        0-d x, dim out of range, or N > 2**22.

    Bitwise semantics
    -----------------
    ``m`` = max of the fp32 row (NaN propagates, zero max is +0); ``d = RN32(xf - m)``;
    ``p = exp_c(d)`` (contract exponential); ``L`` = exact fixed-point sum of ``p`` on the
    absolute grid 2**-40 (each term rounded half-to-even, integers summed exactly, one final
    rounding), so any split or order of the axis gives the same L; ``y = RN_out(RN32(p ÷ L))``,
    NaN canonical. Rows with NaN or +inf, and rows of only -inf, are all NaN (as PyTorch).
    Invariances: batch, permutation, reduction_order, repeat. Contract ``softmax`` v1
    (``rlkernel.contracts.softmax``).
    """
    xm, d = _prepare("softmax", x, dim, dtype)
    return _restore(dispatch.call("softmax", xm.device, x=xm, dtype=dtype), d)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-softmax along ``dim``, the same bits on every backend.

    ``y = RN_out(d - log_c(L))``, ``d = fp32(x) - max x``, ``L = fixed_sum(exp_c(d))`` (grid 2**-40)

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, [*, N]
        Logits. Any leading shape, zero rows, N = 0 (empty output); N <= 2**22.
        Non-contiguous inputs are accepted (read through a contiguous copy).
    dim : int
        The reduced axis (default the last); another axis is moved last and back.
    dtype : torch.dtype, optional
        Output dtype: None (x's dtype, as ``torch.log_softmax``), x's dtype or torch.float32.

    Returns
    -------
    Tensor, ``dtype`` or x's dtype, x's shape

    Raises
    ------
    TypeError
        x is not a float tensor of a supported dtype; unsupported ``dtype``; dim not an int.
    ValueError
        0-d x, dim out of range, or N > 2**22.

    Bitwise semantics
    -----------------
    The steps of :func:`softmax` up to the exact sum ``L`` (same bits of d, p, L), then
    ``y = RN_out(RN32(d - log_c(L)))`` with the contract logarithm; NaN canonical. Rows with
    NaN or +inf, and rows of only -inf, are all NaN; -inf entries of other rows give -inf.
    Invariances: batch, permutation, reduction_order, repeat. Contract ``log_softmax`` v1
    (``rlkernel.contracts.log_softmax``).
    """
    xm, d = _prepare("log_softmax", x, dim, dtype)
    return _restore(dispatch.call("log_softmax", xm.device, x=xm, dtype=dtype), d)
