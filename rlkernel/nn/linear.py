"""Linear layers over the exact digit matmul, plain and tensor-parallel (nano-vllm's shapes).

=============================  ===============================  ==============================
class                          weight on each rank              forward
=============================  ===============================  ==============================
:class:`Linear`                [N, K] (replicated)              ``linear``
:class:`ColumnParallelLinear`  [N / tp, K] (rows of N)          ``column_parallel_linear``
:class:`MergedColumnParallel-  [sum(N_i) / tp, K]: each part    one ``linear`` for all parts
Linear`                        sharded, the parts concatenated  (MLP gate/up)
:class:`QKVParallelLinear`     [(Hq + 2 Hkv) D / tp, K]         one ``linear`` for q, k, v
:class:`RowParallelLinear`     [N, K / tp] (columns of K)       ``row_parallel_linear``
=============================  ===============================  ==============================

Each weight parameter carries a ``weight_loader(param, full_tensor[, shard_id])`` that copies
this rank's slice of a checkpoint tensor (the whole tensor as stored by Hugging Face), and a
``weight_gatherer(param) -> {shard_id: full_tensor}`` that rebuilds the checkpoint tensors
(a collective under TP) for saving. ``shard_ids`` lists the checkpoint tensors one parameter
is made from (``("q", "k", "v")`` for the fused projection, ``(None,)`` otherwise).

Every output element depends only on its input row and weight row (contract ``linear``), and
row-parallel shards exchange exact int64 partial sums, so any TP degree gives the bits of
:class:`Linear` with the whole weight; with ``group=None`` or a group of one rank each class
calls ``rlkernel.ops.linear`` on the whole weight directly.

Parameters are created frozen (``requires_grad=False``), as a rollout engine wants them; call
``model.requires_grad_()`` to train (:class:`rlkernel.train.GRPOTrainer` does). The backward is
exact: ``dX`` per token, ``dW`` per sequence unit summed exactly (:mod:`rlkernel.grads`); under
TP, column-parallel ``dX`` is an exact sum over the ranks (docs/training.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rlkernel.distributed import column_parallel_linear, row_parallel_linear
from rlkernel.nn.opset import OpsUser
from rlkernel.nn.parallel import divide, gather_cat, tp_rank_size

__all__ = ["ColumnParallelLinear", "Linear", "MergedColumnParallelLinear", "QKVParallelLinear",
           "RowParallelLinear"]

ShardId = str | int | None


def _expect_shape(what: str, loaded: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != shape:
        raise ValueError(f"{what}: the checkpoint tensor has shape {tuple(loaded.shape)}; expected {list(shape)}. "
                         f"Check config.json (hidden_size, intermediate_size, head counts, head_dim, vocab_size) "
                         f"against the checkpoint")


def frozen(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str | None) -> nn.Parameter:
    """A zero-filled parameter with ``requires_grad=False`` (``requires_grad_()`` to train it)."""
    return nn.Parameter(torch.zeros(tuple(shape), dtype=dtype, device=device), requires_grad=False)


def load_replicated(param: nn.Parameter, loaded: torch.Tensor) -> None:
    """Copy a whole checkpoint tensor into a replicated parameter (norm gains, row-parallel bias)."""
    _expect_shape("replicated parameter", loaded, tuple(param.shape))
    param.data.copy_(loaded)


def gather_replicated(param: nn.Parameter) -> dict[ShardId, torch.Tensor]:
    """The checkpoint tensor of a replicated parameter: the parameter itself."""
    return {None: param.data}


class LinearBase(OpsUser, nn.Module):
    """Weight ``[out_local, in_local]`` and optional bias, with the TP facts of ``group``.

    Parameters
    ----------
    input_size, output_size : int
        The whole layer's K and N (all ranks together).
    bias : bool
        Whether the layer has a bias (Qwen3: no; Qwen2's q/k/v: yes).
    tp_dim : int or None
        Axis of the weight that is sharded (0: output rows, 1: input columns, None: replicated).
    group : ProcessGroup, optional
        Tensor-parallel group; None = no tensor parallelism.
    dtype : torch.dtype
        ``torch.bfloat16`` (default) or ``torch.float16``: the exact matmul takes half-precision
        operands only.
    device : torch.device or str, optional
    """

    def __init__(self, input_size: int, output_size: int, bias: bool, tp_dim: int | None, group: object = None,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> None:
        super().__init__()
        if dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{type(self).__name__}: dtype is {dtype}; expected torch.bfloat16 or torch.float16 "
                            f"(the exact digit matmul rounds fp32 operands to a 21-bit grid, so it takes half "
                            f"precision weights; load fp32 checkpoints with dtype=torch.bfloat16)")
        self.input_size, self.output_size = input_size, output_size
        self.tp_dim = tp_dim
        self.group = group
        self.tp_rank, self.tp_size = tp_rank_size(group)
        in_local = divide(input_size, self.tp_size, f"{type(self).__name__} input size") if tp_dim == 1 \
            else input_size
        out_local = divide(output_size, self.tp_size, f"{type(self).__name__} output size") if tp_dim == 0 \
            else output_size
        self.weight = frozen((out_local, in_local), dtype, device)
        #: The weight's row exponents, int64 [out_local], when a CUDA-graph capture holds them in a
        #: buffer (``rlkernel.rollout.weight_exponents``): forwards then pass them to
        #: ``rlkernel.ops.linear`` (``weight_exponents=``); None (default): the op computes them.
        self.weight_exponents: torch.Tensor | None = None
        #: With ``weight_exponents``: the weight's digit planes, int8 [3, out_local, in_local]
        #: (``rlkernel.ops.linear_weight_digits``), passed as ``weight_digits=``; None: not given.
        self.weight_digits: torch.Tensor | None = None
        self.weight.weight_loader = self.weight_loader  # type: ignore[attr-defined]
        self.weight.weight_gatherer = self.weight_gatherer  # type: ignore[attr-defined]
        self.weight.shard_ids = (None,)  # type: ignore[attr-defined]
        if bias:
            self.bias: nn.Parameter | None = frozen((out_local if tp_dim == 0 else output_size,), dtype, device)
            self.bias.weight_loader = self.weight_loader  # type: ignore[attr-defined]
            self.bias.weight_gatherer = self.weight_gatherer  # type: ignore[attr-defined]
            self.bias.shard_ids = (None,)  # type: ignore[attr-defined]
        else:
            self.register_parameter("bias", None)

    def _full_shape(self, param: nn.Parameter) -> tuple[int, ...]:
        return (self.output_size, self.input_size) if param.dim() == 2 else (self.output_size,)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Copy this rank's slice of the whole checkpoint tensor ``loaded`` into ``param``."""
        _expect_shape(type(self).__name__, loaded, self._full_shape(param))
        dim = self.tp_dim
        if dim is not None and dim < param.dim() and self.tp_size > 1:
            size = param.shape[dim]
            loaded = loaded.narrow(dim, self.tp_rank * size, size)
        param.data.copy_(loaded)

    def weight_gatherer(self, param: nn.Parameter) -> dict[ShardId, torch.Tensor]:
        """The whole checkpoint tensor (every rank's slice, gathered: a collective under TP)."""
        dim = self.tp_dim
        if dim is None or dim >= param.dim():
            return {None: param.data}
        return {None: gather_cat(param.data, dim, self.group)}

    def _local(self, x: torch.Tensor) -> torch.Tensor:
        """``linear`` on this rank's whole weight (no communication), with its held exponents if any."""
        if self.weight_exponents is None:
            return self.ops.linear(x, self.weight, self.bias)
        if self.weight_digits is None:
            return self.ops.linear(x, self.weight, self.bias, weight_exponents=self.weight_exponents)
        return self.ops.linear(x, self.weight, self.bias, weight_exponents=self.weight_exponents,
                               weight_digits=self.weight_digits)

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}, "
                f"tp={self.tp_rank}/{self.tp_size}, dtype={self.weight.dtype}")


class Linear(LinearBase):
    """``y = x @ W.T (+ b)`` with the whole weight on every rank (``rlkernel.ops.linear``).

    Forward: x ``[*, K]`` (weight dtype) -> y ``[*, N]`` (weight dtype).
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__(input_size, output_size, bias, None, None, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._local(x)


class ColumnParallelLinear(LinearBase):
    """Output features sharded: rank r computes ``y[..., r N/tp : (r+1) N/tp]``, no communication.

    Forward: x ``[*, K]`` (the whole input, equal on every rank) -> ``[*, N / tp]``, bitwise the
    matching slice of :class:`Linear`'s output.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False, group: object = None,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> None:
        super().__init__(input_size, output_size, bias, 0, group, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._local(x)
        return column_parallel_linear(x, self.weight, self.bias, group=self.group)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one weight (MLP ``gate_up_proj``).

    Parameters
    ----------
    input_size : int
    output_sizes : sequence of int
        N of each part (Qwen3 MLP: ``[intermediate_size, intermediate_size]``); each part is
        sharded over the ranks on its own, so rank r holds ``[part_0 slice r; part_1 slice r]``.

    ``weight_loader(param, loaded, shard_id)`` takes part ``shard_id`` (0, 1, ...) whole.
    """

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False, group: object = None,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> None:
        self.output_sizes = [int(n) for n in output_sizes]
        super().__init__(input_size, sum(self.output_sizes), bias, group, dtype, device)
        for n in self.output_sizes:
            divide(n, self.tp_size, f"{type(self).__name__} part of size")
        for p in (self.weight, self.bias):
            if p is not None:
                p.shard_ids = tuple(range(len(self.output_sizes)))  # type: ignore[attr-defined]

    def _part(self, shard_id: ShardId) -> tuple[int, int]:
        """(offset in the local parameter, local size) of part ``shard_id``."""
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"{type(self).__name__}: shard_id = {shard_id!r}; expected a part index in "
                             f"[0, {len(self.output_sizes)})")
        sizes = [n // self.tp_size for n in self.output_sizes]
        return sum(sizes[:shard_id]), sizes[shard_id]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,  # type: ignore[override]
                      shard_id: ShardId = None) -> None:
        offset, size = self._part(shard_id)
        whole = self.output_sizes[int(shard_id)]  # type: ignore[arg-type]
        full = (whole, self.input_size) if param.dim() == 2 else (whole,)
        _expect_shape(f"{type(self).__name__} part {shard_id}", loaded, full)
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp_rank * size, size))

    def weight_gatherer(self, param: nn.Parameter) -> dict[ShardId, torch.Tensor]:
        out: dict[ShardId, torch.Tensor] = {}
        for shard_id in range(len(self.output_sizes)):
            offset, size = self._part(shard_id)
            out[shard_id] = gather_cat(param.data.narrow(0, offset, size), 0, self.group)
        return out


class QKVParallelLinear(ColumnParallelLinear):
    """The fused q/k/v projection of grouped-query attention, sharded by heads.

    Parameters
    ----------
    hidden_size : int
        K.
    head_dim : int
        D.
    num_heads, num_kv_heads : int
        Query and key/value heads of the whole layer; both must divide by the TP degree.

    Rank r holds query heads ``[r Hq/tp, (r+1) Hq/tp)`` and KV heads ``[r Hkv/tp, (r+1) Hkv/tp)``
    as ``[q; k; v]`` rows, so its query heads read their own KV heads (GQA grouping is
    preserved). ``weight_loader(param, loaded, shard_id)`` takes ``"q"``, ``"k"`` or ``"v"``
    (Hugging Face ``q_proj``/``k_proj``/``v_proj``) whole.
    """

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool = False,
                 group: object = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        _, tp = tp_rank_size(group)
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp, "num_attention_heads")
        self.num_kv_heads = divide(num_kv_heads, tp, "num_key_value_heads")
        self.total_num_heads, self.total_num_kv_heads = num_heads, num_kv_heads
        super().__init__(hidden_size, (num_heads + 2 * num_kv_heads) * head_dim, bias, group, dtype, device)
        for p in (self.weight, self.bias):
            if p is not None:
                p.shard_ids = ("q", "k", "v")  # type: ignore[attr-defined]

    @property
    def q_size(self) -> int:
        """Local query width ``Hq/tp * D``."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Local key (and value) width ``Hkv/tp * D``."""
        return self.num_kv_heads * self.head_dim

    def _part(self, shard_id: ShardId) -> tuple[int, int, int]:
        """(offset in the local parameter, local size, whole size) of ``"q"``, ``"k"`` or ``"v"``."""
        q, kv = self.q_size, self.kv_size
        parts = {"q": (0, q, self.total_num_heads * self.head_dim),
                 "k": (q, kv, self.total_num_kv_heads * self.head_dim),
                 "v": (q + kv, kv, self.total_num_kv_heads * self.head_dim)}
        if shard_id not in parts:
            raise ValueError(f"{type(self).__name__}: shard_id = {shard_id!r}; expected 'q', 'k' or 'v'")
        return parts[shard_id]  # type: ignore[index]

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor,  # type: ignore[override]
                      shard_id: ShardId = None) -> None:
        offset, size, whole = self._part(shard_id)
        full = (whole, self.input_size) if param.dim() == 2 else (whole,)
        _expect_shape(f"{type(self).__name__} {shard_id}_proj", loaded, full)
        param.data.narrow(0, offset, size).copy_(loaded.narrow(0, self.tp_rank * size, size))

    def weight_gatherer(self, param: nn.Parameter) -> dict[ShardId, torch.Tensor]:
        out: dict[ShardId, torch.Tensor] = {}
        for shard_id in ("q", "k", "v"):
            offset, size, _ = self._part(shard_id)
            out[shard_id] = gather_cat(param.data.narrow(0, offset, size), 0, self.group)
        return out


class RowParallelLinear(LinearBase):
    """Input features sharded: rank r holds ``W[:, r K/tp : (r+1) K/tp]`` and its slice of x.

    Forward: x ``[*, K / tp]`` (this rank's slice, e.g. its heads' attention output) -> ``[*, N]``
    on every rank: ``rlkernel.distributed.row_parallel_linear`` (exponents MAX, exact int64
    partial sums SUM, one rounding), bitwise :class:`Linear` on the whole K. The bias is whole
    on every rank and added once.
    """

    def __init__(self, input_size: int, output_size: int, bias: bool = False, group: object = None,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> None:
        super().__init__(input_size, output_size, bias, 1, group, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._local(x)
        return row_parallel_linear(x, self.weight, self.bias, group=self.group)
