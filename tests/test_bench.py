"""``rlkernel bench`` on the CPU with a fake contract: timings, ratios, recorded errors, outputs."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from rlkernel import bench
from rlkernel.contracts._contract import BenchCase, Contract


def _module(with_cases: bool) -> types.ModuleType:
    mod = types.ModuleType("fake_bench_contract")
    mod.CONTRACT = Contract(name="fake_add", version=1, summary="y = x + 1", invariances=())  # type: ignore[attr-defined]
    if with_cases:
        def make(device: torch.device) -> dict[str, Any]:
            return {"x": torch.ones(256, device=device)}

        mod.bench_cases = lambda: [  # type: ignore[attr-defined]
            BenchCase("ok", make, native=lambda x: x + 1, flops=256.0, bytes=2048.0),
            BenchCase("broken", make, native=lambda x: x + 1, flops=256.0, bytes=2048.0, op="fake_broken"),
        ]
    return mod


def test_bench_times_both_sides_and_records_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def fake_public_op(op: str) -> Any:
        if op == "fake_add":
            return lambda x: x + 1

        def broken(x: torch.Tensor) -> torch.Tensor:
            raise ValueError("fake_broken: no kernel today")

        return broken

    monkeypatch.setattr(bench, "public_op", fake_public_op)
    seen: list[str] = []
    doc = bench.run({"fake": _module(True), "plain": _module(False)}, torch.device("cpu"), repeat=2,
                    command=["rlkernel", "bench"], missing=["linear"], on_row=lambda r: seen.append(r.case))
    assert seen == ["ok", "broken"]
    ok, broken = doc["rows"]
    assert ok["native"]["ms"] > 0 and ok["rlkernel"]["ms"] > 0 and ok["ratio"] > 0
    assert ok["rlkernel"]["gbps"] == pytest.approx(2048.0 / (ok["rlkernel"]["ms"] * 1e-3) / 1e9)
    assert ok["input_sets"] == bench.ROTATIONS  # small inputs are rotated
    assert broken["rlkernel"]["error"] == "ValueError: fake_broken: no kernel today" and broken["ratio"] is None
    assert broken["native"]["ms"] is not None
    assert doc["no_bench_cases"] == ["plain"] and doc["missing_contracts"] == ["linear"]
    assert doc["command"] == ["rlkernel", "bench"] and doc["device"] == "cpu"
    paths = bench.write(doc, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"][0]["case"] == "ok"
    md = paths["md"].read_text()
    assert "| fake_add | ok |" in md and "no kernel today" in md and "no bench cases: plain" in md
