"""Tensor parallelism with exact collectives over ``torch.distributed`` (docs/numerics.md R4).

Every rank gets the bits of the single-device computation, for any TP degree and any
backend (gloo on CPU, NCCL/RCCL/HCCL on accelerators):

- :func:`all_reduce_exact`: the int64 all-reduce (SUM or MAX). Integer addition is
  associative, so ring, tree or any other order gives the same result; float tensors are
  refused because a float all-reduce is not.
- :func:`row_parallel_linear`: ``linear`` with K sharded over the ranks (e.g. attention ``o_proj``
  and MLP ``down_proj``): local row exponents -> all-reduce MAX -> exact int64 partial sums on
  the global grids -> all-reduce SUM -> one rounding. Bits equal ``linear`` on the whole K.
- :func:`column_parallel_linear`: ``linear`` with N sharded (``q/k/v``, ``gate/up``): no
  communication; each rank's output is bitwise the matching slice of the whole output.

The process group must be initialised by the caller (``torch.distributed.init_process_group``);
nothing here falls back to a single process silently.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlkernel import dispatch, grads
from rlkernel.ops.all_reduce import check_integer
from rlkernel.ops.linear import (
    MAX_K,
    _backward_bound,
    _weight_grad,
    linear,
    linear_exponents,
    linear_finish,
    linear_partial,
)

__all__ = ["all_reduce_exact", "column_parallel_linear", "row_parallel_linear"]

_LOW = (1 << 32) - 1


def _require_group(op: str, group: object) -> int:
    """World size of ``group``; raises ``RuntimeError`` if torch.distributed is not initialised."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{op}: torch.distributed is not initialised; call torch.distributed.init_process_group "
                           f"(backend 'gloo' on CPU, 'nccl' on CUDA) on every rank first")
    return int(dist.get_world_size(group))  # type: ignore[arg-type]


def _reduce(t: torch.Tensor, op: str, group: object) -> torch.Tensor:
    """In-place int64 all-reduce of a contiguous tensor (no overflow check)."""
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM, group=group)  # type: ignore[arg-type]
    return t


def all_reduce_exact(t: torch.Tensor, op: str = "sum", group: object = None) -> torch.Tensor:
    """Exact all-reduce of an int64 tensor across the ranks of ``group``.

    ``out = sum_r t_r`` (``op="sum"``) or ``max_r t_r`` (``op="max"``), the same on every rank

    Parameters
    ----------
    t : Tensor, int64, any shape
        This rank's contribution (same shape on every rank). Not modified.
    op : {"sum", "max"}
    group : ProcessGroup, optional
        Default: the world group.

    Returns
    -------
    Tensor, int64, shape of ``t`` (a new tensor)

    Raises
    ------
    TypeError
        ``t`` is a float tensor (a float all-reduce is not exact: reduce int64 partials and
        round once) or not int64.
    ValueError
        Unknown ``op``, or an exact sum outside int64 (raised on every rank alike).
    RuntimeError
        torch.distributed is not initialised.

    Bitwise semantics
    -----------------
    Contract ``all_reduce`` v1 (:func:`rlkernel.ops.all_reduce` on the stacked contributions):
    the mathematical integer sum or maximum; any collective algorithm gives these bits. For
    ``sum`` one extra scalar all-reduce checks that no total can overflow (every |t| below
    2**62 / world); if that cannot be shown, the values are reduced as exact 32-bit halves
    (twice the traffic) and a total outside int64 raises instead of wrapping.
    """
    name = "all_reduce_exact"
    t = check_integer(name, "t", t)
    if op not in ("sum", "max"):
        raise ValueError(f"{name}: op={op!r}; expected 'sum' or 'max'")
    world = _require_group(name, group)
    out = t.contiguous().clone()
    if op == "max" or out.numel() == 0:
        return _reduce(out, op, group) if out.numel() else out
    bound = (1 << 62) // world
    unsafe = ((out < -bound) | (out > bound)).any().to(torch.int64).reshape(1)
    if int(_reduce(unsafe, "max", group)[0]) == 0:
        return _reduce(out, "sum", group)  # |total| <= 2**62: the wrapped int64 sum is exact
    halves = torch.stack([out >> 32, out & _LOW])  # out = hi * 2**32 + lo, lo in [0, 2**32)
    _reduce(halves, "sum", group)  # exact for world < 2**31
    hi = halves[0] + (halves[1] >> 32)
    over = (hi < -(1 << 31)) | (hi >= (1 << 31))
    if bool(over.any()):
        i = int(over.reshape(-1).nonzero()[0, 0])
        exact = (int(hi.reshape(-1)[i]) << 32) + (int(halves[1].reshape(-1)[i]) & _LOW)
        raise ValueError(f"{name}: the exact sum at flat index {i} is {exact}, outside int64 [-2**63, 2**63); "
                         f"the partials' bound is broken (use fewer terms per sum)")
    return (hi << 32) | (halves[1] & _LOW)


def row_parallel_linear(x_shard: torch.Tensor, w_shard: torch.Tensor, bias: torch.Tensor | None = None,
                        out_dtype: torch.dtype | None = None, group: object = None) -> torch.Tensor:
    """``linear`` with K sharded across ranks; every rank gets the bits of ``linear`` on the whole K.

    ``y = x @ w.T + bias`` with ``x = cat_r(x_shard_r, -1)``, ``w = cat_r(w_shard_r, 1)``

    Parameters
    ----------
    x_shard : Tensor, bfloat16/float16, [*, K_r]
        This rank's slice of K (slices may differ in size, in rank order or not: the result
        does not depend on how K is split). Leading axes equal on every rank.
    w_shard : Tensor, same dtype, [N, K_r]
        The matching columns of the weight; N equal on every rank.
    bias : Tensor, x dtype or float32, [N], optional
        The full bias, identical on every rank; added once after the reduction.
    out_dtype : torch.dtype, optional
        Default ``x_shard.dtype``.
    group : ProcessGroup, optional

    Returns
    -------
    Tensor, out_dtype, [*, N], identical on every rank

    Raises
    ------
    ValueError
        Shapes that differ between ranks, or the total K above 2**16 - 1 (on every rank alike).

    Bitwise semantics
    -----------------
    Contract ``linear`` v2 via its sub-ops: ``linear_exponents`` -> all-reduce MAX (one
    collective for ex and ew; the non-finite sentinel propagates) -> ``linear_partial`` ->
    all-reduce SUM of int64 (exact in any order) -> ``linear_finish``. Three collectives: the
    shape check, MAX, SUM.
    """
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x_shard, w_shard, bias)):
        return _RowParallel.apply(x_shard, w_shard, bias, out_dtype, group)  # type: ignore[no-any-return]
    return _row_parallel(x_shard, w_shard, bias, out_dtype, group)


def _row_parallel(x_shard: torch.Tensor, w_shard: torch.Tensor, bias: torch.Tensor | None,
                  out_dtype: torch.dtype | None, group: object) -> torch.Tensor:
    name = "row_parallel_linear"
    _require_group(name, group)
    ex, ew = linear_exponents(x_shard, w_shard)  # validates dtypes and shapes
    m, n, k = ex.numel(), ew.numel(), x_shard.shape[-1]
    lead = tuple(x_shard.shape[:-1])
    shape = torch.tensor([m, n, -m, -n, x_shard.dim(), -x_shard.dim()], dtype=torch.int64, device=ex.device)
    _reduce(shape, "max", group)
    if shape.tolist() != [m, n, -m, -n, x_shard.dim(), -x_shard.dim()]:
        raise ValueError(f"{name}: x_shard {tuple(x_shard.shape)} and w_shard {tuple(w_shard.shape)} on this rank do "
                         f"not match the other ranks (rows M and features N must agree; only K may differ)")
    exps = torch.cat([ex.reshape(-1), ew])
    _reduce(exps, "max", group)
    ex, ew = exps[:m].reshape(lead), exps[m:]
    acc = linear_partial(x_shard, w_shard, ex, ew)
    flat = torch.cat([acc.reshape(-1), torch.tensor([k], dtype=torch.int64, device=acc.device)])
    _reduce(flat, "sum", group)  # |sum| <= K_total 2**40 <= 2**62 once K_total is checked below
    k_total = int(flat[-1])
    if k_total > MAX_K:
        raise ValueError(f"{name}: the total K = {k_total} over all shards exceeds the exact-sum bound 2**16 - 1 = "
                         f"{MAX_K} of linear")
    return linear_finish(flat[:-1].reshape(acc.shape), ex, ew, bias, out_dtype or x_shard.dtype)


def column_parallel_linear(x: torch.Tensor, w_shard: torch.Tensor, bias_shard: torch.Tensor | None = None,
                           out_dtype: torch.dtype | None = None, group: object = None) -> torch.Tensor:
    """``linear`` with the output features N sharded across ranks (no communication).

    ``y_r = x @ w_shard_r.T + bias_shard_r``

    Parameters
    ----------
    x : Tensor, bfloat16/float16, [*, K]
        The full input, identical on every rank.
    w_shard : Tensor, same dtype, [N_r, K]
        This rank's rows of the weight.
    bias_shard : Tensor, x dtype or float32, [N_r], optional
    out_dtype : torch.dtype, optional
        Default ``x.dtype``.
    group : ProcessGroup, optional
        The ranks holding the other shards: the backward's ``dX`` sums over all of them (exactly,
        as :func:`row_parallel_linear`). None: one rank holds the whole weight.

    Returns
    -------
    Tensor, out_dtype, [*, N_r]

    Bitwise semantics
    -----------------
    Contract ``linear`` v2: each output element depends only on its row of x and its row of the
    weight, so ``y_r`` is bitwise the matching column slice of the unsharded output, and
    gathering the slices (``torch.distributed.all_gather``, a copy) rebuilds it exactly.

    Backward (with ``group``): ``dX = row_parallel_linear(RN(dY_r), w_shard_r.T)``, the exact
    sum over the ranks' output features, bitwise the one-rank ``dX``; ``dW_r`` and ``db_r`` are
    the matching rows of the one-rank gradients (per sequence unit, exact sums).
    """
    if group is not None and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x, w_shard, bias_shard)):
        return _ColumnParallel.apply(x, w_shard, bias_shard, out_dtype, group)  # type: ignore[no-any-return]
    return linear(x, w_shard, bias_shard, out_dtype)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1])


class _RowParallel(torch.autograd.Function):
    """Autograd of :func:`row_parallel_linear`: dY is whole on every rank, so every gradient is local.

    ``dX_r = linear(RN(dY), w_shard_r.T)``; ``dW_r`` per sequence unit ``linear(RN(dY_u).T, x_r,u.T)``
    summed exactly (the matching columns of the one-rank dW); ``db`` the exact token sum of dY,
    equal on every rank (the bias is whole on each).
    """

    @staticmethod
    def forward(ctx, x_shard, w_shard, bias, out_dtype, group):  # type: ignore[no-untyped-def,override]
        x2 = _rows(x_shard)
        ctx.save_for_backward(x2, w_shard, bias)
        ctx.x_shape = x_shard.shape
        ctx.units = grads.current_units(x2.shape[0])
        y = _row_parallel(x2, w_shard, bias, out_dtype, group)
        return y.reshape(*x_shard.shape[:-1], w_shard.shape[0])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        x2, w_shard, bias = ctx.saved_tensors
        grad = _rows(grad)
        gy = grad.to(x2.dtype)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            _backward_bound("dX = dY @ weight", "N (output features)", gy.shape[1])
            gx = dispatch.call("linear", gy.device, x=gy, weight=w_shard.T, bias=None, out_dtype=x2.dtype)
            gx = gx.reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = _weight_grad(w_shard, gy, x2, ctx.units)
        if ctx.needs_input_grad[2]:
            gb = grads.weight_grad(bias, grad.to(torch.float32))
        return gx, gw, gb, None, None


class _ColumnParallel(torch.autograd.Function):
    """Autograd of :func:`column_parallel_linear` over ``group`` (see its docstring)."""

    @staticmethod
    def forward(ctx, x, w_shard, bias, out_dtype, group):  # type: ignore[no-untyped-def,override]
        x2 = _rows(x)
        ctx.save_for_backward(x2, w_shard, bias)
        ctx.x_shape, ctx.group = x.shape, group
        ctx.units = grads.current_units(x2.shape[0])
        y = dispatch.call("linear", x2.device, x=x2, weight=w_shard, bias=bias, out_dtype=out_dtype)
        return y.reshape(*x.shape[:-1], w_shard.shape[0])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        x2, w_shard, bias = ctx.saved_tensors
        grad = _rows(grad)
        gy = grad.to(x2.dtype)
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = _row_parallel(gy, w_shard.T, None, x2.dtype, ctx.group).reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = _weight_grad(w_shard, gy, x2, ctx.units)
        if ctx.needs_input_grad[2]:
            gb = grads.weight_grad(bias, grad.to(torch.float32))
        return gx, gw, gb, None, None
