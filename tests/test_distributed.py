"""Tensor parallelism over real torch.distributed (gloo) processes: TP = 2 and 4 give TP = 1 bits.

One ``torch.multiprocessing.spawn`` of four CPU processes covers TP = 2 (two process groups of
two ranks) and TP = 4; every check runs inside the workers and compares bytes (an assertion in
any rank fails the test with that rank's traceback).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import run_in_gloo_group

from rlkernel.contracts._gen import normal, seed_of, with_outlier_channels
from rlkernel.distributed import all_reduce_exact, column_parallel_linear, row_parallel_linear
from rlkernel.ops.all_reduce import all_reduce
from rlkernel.ops.linear import linear

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])


def _assert_same_bits(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, \
        f"{what}: expected {expected.dtype}{list(expected.shape)}, got {actual.dtype}{list(actual.shape)}"
    e, a = _bits(expected).reshape(-1), _bits(actual).reshape(-1)
    diff = (e != a).nonzero()
    if diff.numel():
        i = int(diff[0])
        raise AssertionError(f"{what}: {diff.numel()} elements differ; first at flat index {i}: "
                             f"expected {expected.reshape(-1)[i].item()!r} ({int(e[i]):#x}), "
                             f"got {actual.reshape(-1)[i].item()!r} ({int(a[i]):#x})")


def _inputs(name: str, lead: tuple[int, ...], k: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = normal(seed_of("test_distributed", name, "x"), (*lead, k), 1.0, FP32)
    x = with_outlier_channels(x, seed_of("test_distributed", name, "ch"), count=3, factor=3000.0).to(dtype)
    w = normal(seed_of("test_distributed", name, "w"), (n, k), 0.05, dtype)
    b = normal(seed_of("test_distributed", name, "b"), (n,), 0.5, FP32)
    return x, w, b


def _bounds(sizes: list[int]) -> list[tuple[int, int]]:
    out, start = [], 0
    for s in sizes:
        out.append((start, start + s))
        start += s
    return out


def _check_row_parallel(rank: int, world: int, group: object) -> None:
    x, w, b = _inputs("row", (2, 3), 384, 40, BF16)
    x[1, 2, 7 + 300 * (world - 1) // world] = float("nan")  # a NaN on one rank's shard only
    x[0, 1, 5] = float("inf")
    for out_dtype, sizes in ((None, [384 // world] * world), (FP32, _uneven(384, world))):
        a, c = _bounds(sizes)[rank]
        got = row_parallel_linear(x[..., a:c], w[:, a:c], bias=b, out_dtype=out_dtype, group=group)
        _assert_same_bits(linear(x, w, b, out_dtype), got, f"row-parallel tp={world} sizes={sizes} rank={rank}")
    # fp16, no bias, a shard whose K-slice is empty on the last rank
    x16, w16, _ = _inputs("row16", (5,), 96, 24, FP16)
    sizes = [96 // (world - 1)] * (world - 1) + [0]
    a, c = _bounds(sizes)[rank]
    got = row_parallel_linear(x16[:, a:c], w16[:, a:c], out_dtype=FP32, group=group)
    _assert_same_bits(linear(x16, w16, out_dtype=FP32), got, f"row-parallel fp16 tp={world} rank={rank}")


def _uneven(k: int, world: int) -> list[int]:
    sizes = [1 + 37 * r for r in range(world - 1)]
    return [*sizes, k - sum(sizes)]


def _check_column_parallel(rank: int, world: int, group: object) -> None:
    x, w, b = _inputs("col", (7,), 256, 48, BF16)
    whole = linear(x, w, b)
    size = 48 // world
    sl = slice(rank * size, (rank + 1) * size)
    mine = column_parallel_linear(x, w[sl], b[sl])
    _assert_same_bits(whole[:, sl], mine, f"column-parallel tp={world} rank={rank}")
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    _assert_same_bits(whole, torch.cat(gathered, dim=-1), f"column-parallel gathered tp={world}")


def _check_all_reduce(rank: int, world: int, group: object) -> None:
    contributions = torch.stack([
        torch.arange(60, dtype=torch.int64).reshape(6, 10) * (r + 1) * 1_000_003 * (1 << 30) * (-1) ** r
        for r in range(world)])
    for op in ("sum", "max"):
        got = all_reduce_exact(contributions[rank], op=op, group=group)
        _assert_same_bits(all_reduce(contributions, op=op), got, f"all_reduce_exact {op} world={world}")
    # the slow path: values too large for the one-scalar bound, total fits only after cancellation
    big = [1 << 62] * (world // 2) + [-(1 << 62)] * (world // 2)
    big[-1] += 7
    got = all_reduce_exact(torch.tensor([big[rank], rank], dtype=torch.int64), group=group)
    assert got.tolist() == [7, sum(range(world))], got
    # a total outside int64 raises on every rank
    with pytest.raises(ValueError, match="outside int64"):
        all_reduce_exact(torch.tensor([1 << 62], dtype=torch.int64), group=group)
    # ranks that disagree on the rows raise on every rank instead of hanging
    x, w, _ = _inputs("mismatch", (3 + rank,), 64, 8, BF16)
    with pytest.raises(ValueError, match="do not match the other ranks"):
        row_parallel_linear(x[:, : 64 // world], w[:, : 64 // world], group=group)


def _body(rank: int, world: int) -> None:
    # TP = 2 inside pairs of ranks (every rank takes part in creating every group), then TP = 4.
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)]
    for size, group in ((2, pairs[rank // 2]), (world, None)):
        r = dist.get_rank(group) if group is not None else rank
        _check_row_parallel(r, size, group)
        _check_column_parallel(r, size, group)
        _check_all_reduce(r, size, group)


def _worker(rank: int, world: int, init_file: str) -> None:
    torch.set_num_threads(1)
    run_in_gloo_group(rank, world, init_file, _body, rank, world, timeout_s=60)


def test_tensor_parallel_tp2_tp4_bits_equal_tp1() -> None:
    """One spawn of 4 gloo processes: TP = 2 (two pairs) and TP = 4, each against linear on one rank."""
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(4, os.path.join(tmp, "init")), nprocs=4, join=True)


def test_all_reduce_exact_refuses_floats() -> None:
    with pytest.raises(TypeError, match="not exact"):
        all_reduce_exact(torch.zeros(3, dtype=torch.float32))


def test_all_reduce_exact_needs_a_process_group() -> None:
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    with pytest.raises(RuntimeError, match="init_process_group"):
        all_reduce_exact(torch.zeros(3, dtype=torch.int64))
