"""``all_reduce``: an exact int64 sum of partials; measured against the exact integer sum."""

from __future__ import annotations

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": (4, 4096), "full": (8, 1 << 20)}


def _run(size: str, device: torch.device) -> list[Result]:
    world, n = SHAPES[size]
    parts = data.randint(f"all_reduce/{size}", (world, n), -(1 << 58), 1 << 58).to(device)
    truth = parts.sum(dim=0)  # int64, exact: |sum| < 8 * 2**58
    with torch.no_grad():
        ours = rlkernel.ops.all_reduce(parts, op="sum")
        native = parts.sum(dim=0)
    # integers: the metric is the number of elements that differ from the exact sum
    exact = {"mismatches": int((ours != truth).sum())}
    native_m = {"mismatches": int((native != truth).sum())}
    return [Result(RLKERNEL, exact), Result("torch sum (int64)", native_m, native=True)]


def measurements() -> list[Measurement]:
    return [Measurement("all_reduce", "int64_partials", "int64 partials up to 2**58 per rank", "mismatches", _run,
                        shape=lambda size: "world x n = {} x {}".format(*SHAPES[size]))]
