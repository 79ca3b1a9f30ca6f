"""Tensor-parallel facts and the exact collectives the ``nn`` layers need beyond ``rlkernel.distributed``.

A layer's ``group`` is a ``torch.distributed`` process group of the tensor-parallel ranks, or
``None`` for no tensor parallelism (one process holds the whole layer). Note the difference
from ``torch.distributed``, where ``group=None`` means the world: a model inside a
data-parallel job must not silently shard over every rank.

Every collective here moves integers (``rlkernel.distributed.all_reduce_exact``) or copies
(``all_gather``), so its result is the same bits for any TP degree and any reduction order:

- :func:`combine_owned`: float tensors of which exactly one rank holds each element (the others
  hold +0): the owner's bit patterns are summed as integers, so -0, subnormals and NaN
  payloads survive (a float sum would turn -0 + 0 into +0).
- :func:`max_fp32`: the R5 maximum of fp32 values over the ranks (NaN propagates, -0 = +0 gives
  +0) through order-preserving integer keys.
- :func:`gather_cat`: concatenate every rank's shard along an axis (a copy).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlkernel.distributed import all_reduce_exact

__all__ = ["combine_owned", "divide", "from_order_key", "gather_cat", "max_fp32", "order_key", "tp_rank_size"]

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SIGN32 = 1 << 31
_CANONICAL_NAN32 = 0x7FC00000


def tp_rank_size(group: object) -> tuple[int, int]:
    """``(rank, world size)`` of this process in ``group``; ``(0, 1)`` for ``group=None``.

    Raises
    ------
    RuntimeError
        A group is given but ``torch.distributed`` is not initialised.
    """
    if group is None:
        return 0, 1
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor parallelism: a process group was given but torch.distributed is not "
                           "initialised; call torch.distributed.init_process_group first, or pass group=None "
                           "for a single-process model")
    return int(dist.get_rank(group)), int(dist.get_world_size(group))  # type: ignore[arg-type]


def divide(total: int, parts: int, what: str) -> int:
    """``total // parts``, or a ``ValueError`` naming ``what`` when ``parts`` does not divide it.

    Parameters
    ----------
    total : int
        E.g. the number of attention heads.
    parts : int
        The tensor-parallel degree.
    what : str
        What ``total`` counts, for the message (``"num_attention_heads"``).
    """
    if parts < 1 or total % parts:
        raise ValueError(f"tensor parallelism: {what} = {total} is not divisible by the TP degree {parts}; every "
                         f"rank must hold the same number of them. Choose a TP degree that divides {total} "
                         f"(e.g. {', '.join(str(d) for d in _divisors(total)[:6])})")
    return total // parts


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def combine_owned(x: torch.Tensor, group: object) -> torch.Tensor:
    """Exact combine of per-rank tensors where each element is owned by one rank and +0 elsewhere.

    ``out = bits⁻¹(Σ_r bits(x_r))`` with ``bits`` the signed integer view of the dtype

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, any shape
        This rank's contribution: the owner's values where it owns the element, +0 (bit
        pattern 0) everywhere else. Same shape and dtype on every rank.
    group : ProcessGroup
        The tensor-parallel group (initialised).

    Returns
    -------
    Tensor, x's dtype and shape: on every rank, the owner's exact bits.

    Bitwise semantics
    -----------------
    The signed integer bit patterns are widened to int64 and all-reduced with SUM
    (:func:`rlkernel.distributed.all_reduce_exact`); since all but one term are 0 the sum is
    the owner's pattern, whatever the reduction order or TP degree.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _CombineOwned.apply(x, group)  # type: ignore[no-any-return]
    return _combine(x, group)


def _combine(x: torch.Tensor, group: object) -> torch.Tensor:
    size = x.element_size()
    as_int = _INT_OF_SIZE[size]
    wide = x.detach().contiguous().view(as_int).to(torch.int64)
    total = all_reduce_exact(wide, "sum", group)
    return total.to(as_int).view(x.dtype)


class _CombineOwned(torch.autograd.Function):
    """Autograd of :func:`combine_owned`: the output is the sum of the contributions, so each
    rank's contribution receives the whole (replicated) output gradient, unchanged."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def,override]
        return _combine(x, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        return grad, None


def max_fp32(x: torch.Tensor, group: object) -> torch.Tensor:
    """R5 maximum of fp32 tensors over the ranks of ``group``, elementwise.

    ``out = max_r x_r``; NaN if any rank holds NaN; ``max(-0, +0) = +0``

    Parameters
    ----------
    x : Tensor, float32, any shape
        Same shape on every rank.
    group : ProcessGroup

    Returns
    -------
    Tensor, float32, x's shape, identical on every rank.

    Bitwise semantics
    -----------------
    Each value maps to an int64 key that orders like the value (``bits`` for x >= +0,
    ``-(bits & 0x7FFFFFFF)`` for negative values, so -0 and +0 share key 0; NaN becomes the
    canonical NaN, whose key exceeds +inf's). An all-reduce MAX of integers is exact in any
    order; the largest key maps back to its value (key 0 to +0).
    """
    if x.dtype != torch.float32:
        raise TypeError(f"max_fp32: x has dtype {x.dtype}; expected torch.float32")
    return from_order_key(all_reduce_exact(order_key(x), "max", group))


def order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys that order like the fp32 values (R5): -0 and +0 share key 0, NaN is above +inf.

    Parameters
    ----------
    x : Tensor, float32, any shape

    Returns
    -------
    Tensor, int64, x's shape: ``bits`` for values >= +0, ``-(bits & 0x7FFFFFFF)`` for negative
    values, the canonical NaN's bits (0x7FC00000) for every NaN.
    """
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    bits = torch.where(torch.isnan(x), torch.full_like(bits, _CANONICAL_NAN32), bits)
    return torch.where(bits >= 0, bits, -(bits & (_SIGN32 - 1)))


def from_order_key(key: torch.Tensor) -> torch.Tensor:
    """The fp32 value of an :func:`order_key` (key 0 gives +0)."""
    bits = torch.where(key >= 0, key, (-key) | _SIGN32)
    bits = torch.where(bits >= _SIGN32, bits - (1 << 32), bits)  # negative values as signed int32
    return bits.to(torch.int32).view(torch.float32)


def gather_cat(x: torch.Tensor, dim: int, group: object) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order (an exact copy).

    Parameters
    ----------
    x : Tensor, any dtype
        This rank's shard; every rank's shard has the same shape.
    dim : int
    group : ProcessGroup

    Returns
    -------
    Tensor, x's dtype, ``x.shape`` with ``dim`` multiplied by the world size.
    """
    _, size = tp_rank_size(group)
    if size == 1:
        return x
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(size)]
    dist.all_gather(parts, x.contiguous(), group=group)  # type: ignore[arg-type]
    return torch.cat(parts, dim=dim)
