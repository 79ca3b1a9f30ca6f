"""``rlkernel bench`` on the CPU: timings, ratios, recorded errors, outputs (with a fake contract);
the shape sets of the real contracts; progress; a partial report when interrupted."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from rlkernel import bench, cli
from rlkernel.conformance.progress import StreamProgress
from rlkernel.contracts import load_contracts
from rlkernel.contracts._contract import BENCH_SIZES, BenchCase, Contract

ROOT = Path(__file__).resolve().parent.parent


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
    doc = bench.run({"fake": _module(True), "plain": _module(False)}, torch.device("cpu"), repeat=2, shapes="large",
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
    assert "| fake_add | ok |" in md and "no kernel today" in md and "no large bench cases: plain" in md


def _counting_module(n: int, sizes: tuple[str, ...] = ("small", "large")) -> types.ModuleType:
    """A fake contract with ``n`` cheap bench cases ``c0 .. c{n-1}`` of ``sizes``."""
    mod = types.ModuleType("fake_counting_contract")
    mod.CONTRACT = Contract(name="fake_add", version=1, summary="y = x + 1", invariances=())  # type: ignore[attr-defined]

    def make(device: torch.device) -> dict[str, Any]:
        return {"x": torch.ones(16, device=device)}

    mod.bench_cases = lambda: [  # type: ignore[attr-defined]
        BenchCase(f"c{i}", make, native=lambda x: x + 1, flops=16.0, bytes=128.0, sizes=sizes) for i in range(n)]
    return mod


def test_default_shapes_are_small_on_the_cpu_and_large_on_accelerators() -> None:
    assert bench.default_shapes(torch.device("cpu")) == "small"
    for device in ("cuda", "cuda:1", "xpu", "hpu", "mps"):
        assert bench.default_shapes(torch.device(device)) == "large"
    assert bench.SHAPES == BENCH_SIZES
    parser = cli.build_parser()
    for shapes in bench.SHAPES:
        assert parser.parse_args(["bench", "--shapes", shapes]).shapes == shapes
    assert parser.parse_args(["bench"]).shapes is None  # chosen by the device
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--shapes", "huge"])


def test_shapes_select_the_cases_of_that_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "public_op", lambda op: lambda x: x + 1)
    mod = types.ModuleType("fake_sized")
    mod.CONTRACT = Contract(name="fake_add", version=1, summary="y = x + 1", invariances=())  # type: ignore[attr-defined]

    def make(device: torch.device) -> dict[str, Any]:
        return {"x": torch.ones(8, device=device)}

    mod.bench_cases = lambda: [  # type: ignore[attr-defined]
        BenchCase("big", make, native=lambda x: x + 1, flops=8.0, bytes=64.0),  # large by default
        BenchCase("tiny", make, native=lambda x: x + 1, flops=8.0, bytes=64.0, sizes=("small",)),
        BenchCase("both", make, native=lambda x: x + 1, flops=8.0, bytes=64.0, sizes=("small", "large")),
    ]
    cpu = torch.device("cpu")
    small = bench.run({"fake": mod}, cpu, repeat=1)  # the CPU's default
    assert small["shapes"] == "small" and [r["case"] for r in small["rows"]] == ["tiny", "both"]
    large = bench.run({"fake": mod, "only_large": _counting_module(1, ("large",))}, cpu, repeat=1, shapes="large")
    assert [r["case"] for r in large["rows"]] == ["big", "both", "c0"] and large["no_bench_cases"] == []
    assert bench.run({"x": _counting_module(1, ("large",))}, cpu, repeat=1)["no_bench_cases"] == ["x"]
    with pytest.raises(ValueError, match="shapes='huge'; expected one of"):
        bench.run({"fake": mod}, cpu, repeat=1, shapes="huge")
    with pytest.raises(ValueError, match="sizes=.*expected a non-empty tuple"):
        BenchCase("bad", make, native=lambda x: x, flops=1.0, bytes=1.0, sizes=("medium",))


def test_every_contract_has_small_and_large_bench_cases_with_unique_names() -> None:
    modules, _ = load_contracts()
    for name, module in modules.items():
        cases = module.bench_cases()
        keys = [(c.op or module.CONTRACT.name, c.name) for c in cases]
        assert len(set(keys)) == len(keys), f"{name}: duplicate bench case names {keys}"
        for size in BENCH_SIZES:
            assert any(size in c.sizes for c in cases), f"{name}: no {size} bench case"
        assert all(c.flops >= 0 and c.bytes > 0 for c in cases), name


def test_large_shapes_are_the_ones_of_the_committed_h200_report() -> None:
    """The H200 report (every op it measured) stays comparable: same case names, same declared work.
    Ops added after it (adamw, sgd, token_entropy, the backwards, exact_sum) have cases of their own, not in that
    report."""
    committed = json.loads((ROOT / "docs" / "bench" / "h200.json").read_text())
    expected = {(r["op"], r["case"], r["flops"], r["bytes"]) for r in committed["rows"]}
    measured = {op for op, *_ in expected}
    cases, without = bench.plan(load_contracts()[0], "large")
    assert without == []
    #: cases added later to cover the performance issue's goal ranges (decode at batch 256 / context 32k,
    #: sampling with top-k and top-p and with top-p alone, the Qwen3-0.6B projections and attention of a
    #: 256-sequence decode step)
    added = {("attention_paged", "qwen3_8b_decode_B256_ctx4096_bs16_bf16"),
             ("attention_paged", "qwen3_0.6b_decode_B256_ctx128_bs16_bf16"),
             ("attention_paged", "qwen3_8b_decode_B8_ctx32768_bs16_bf16"),
             ("sample", "qwen3_vocab_b64_topk50_topp0.9"), ("sample", "qwen3_vocab_b64_topp0.9"),
             ("linear", "qwen3_0.6b_m256_k2048_n1024_bf16"), ("linear", "qwen3_0.6b_m256_k3072_n1024_bf16")}
    #: linear's decode shapes as the rollout's decode graphs run them (the weight's exponents or planes given)
    added |= {("linear", f"{shape}_bf16_{given}_given") for shape, given in (
        ("qwen3_8b_m1_k4096_n4096", "exponents"), ("qwen3_8b_m8_k4096_n12288", "exponents"),
        ("qwen3_8b_m64_k4096_n4096", "exponents"), ("qwen3_0.6b_m256_k2048_n1024", "planes"),
        ("qwen3_0.6b_m256_k3072_n1024", "planes"))}
    assert {(op, c.name, float(c.flops), float(c.bytes)) for op, c in cases
            if op in measured and (op, c.name) not in added} == expected
    assert added <= {(op, c.name) for op, c in cases}
    later = {op for op, _ in cases if op.endswith("_backward") or op.startswith("exact_sum")}
    assert {op for op, _ in cases} - measured - later == {"adamw", "sgd", "token_entropy"}


def test_every_small_case_runs_on_the_cpu() -> None:
    """Each small case builds its inputs and runs both sides once on the CPU, without error; the
    whole small set is what ``rlkernel bench --device cpu`` times (each call ~12 times)."""
    cases, without = bench.plan(load_contracts()[0], "small")
    assert without == [] and len(cases) >= 15
    cpu = torch.device("cpu")
    for op, case in cases:
        inputs = case.make(cpu)
        case.native(**inputs)
        with rlkernel_trace() as calls:
            bench.public_op(op)(**inputs)
        assert calls and all(kernel.startswith("cpu:") for _, kernel in calls), (op, case.name, calls)


def rlkernel_trace() -> Any:
    from rlkernel.dispatch import trace

    return trace()


def test_cli_bench_small_shapes_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench"
    assert cli.main(["bench", "--device", "cpu", "--op", "rms_norm", "--op", "silu_mul", "--repeat", "1",
                     "--out", str(out)]) == 0
    doc = json.loads((out / "bench.json").read_text())
    assert doc["shapes"] == "small" and not doc["partial"] and doc["cases_planned"] == len(doc["rows"]) == 4
    assert {r["case"] for r in doc["rows"]} == {"qwen3_0.6b_T1_bf16", "qwen3_0.6b_T64_bf16"}
    assert all(r["ratio"] and r["kernel"].startswith("cpu:") for r in doc["rows"])
    err = capsys.readouterr().err
    assert "small shapes on cpu" in err and "[4/4 " in err and "silu_mul/qwen3_0.6b_T64_bf16: ratio" in err
    assert len((out / "bench.rows.jsonl").read_text().splitlines()) == 4


def test_progress_counts_cases_with_elapsed_time() -> None:
    rows = [bench.BenchRow(op="rms_norm", case=f"T{t}", flops=1.0, bytes=1.0) for t in (1, 64)]
    rows[1].rlkernel.error = "ValueError: boom"
    plain = io.StringIO()
    progress = StreamProgress(plain, describe=lambda r: "failed" if r.failed else "ok")
    progress.start(2)
    for row in rows:
        progress.update(row)
    progress.finish()
    assert plain.getvalue().splitlines() == ["[1/2 0:00] rms_norm/T1: ok", "[2/2 0:00] rms_norm/T64: failed"]

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Terminal()
    progress = StreamProgress(tty, width=10, describe=lambda r: "ok")
    progress.start(2)
    progress.update(rows[0])
    text = tty.getvalue()
    assert text.startswith("\r[..........] 0/2 0:00")  # the bar is up before the first case ends
    assert "[1/2 0:00] rms_norm/T1: ok" in text and text.endswith("\r[#####.....] 1/2 0:00 rms_norm/T1" + " " * 39)


def test_interrupt_keeps_the_rows_measured_so_far(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(bench, "public_op", lambda op: lambda x: x + 1)
    seen: list[str] = []

    def on_row(row: bench.BenchRow) -> None:
        seen.append(row.case)
        if len(seen) == 2:
            raise KeyboardInterrupt("signal 15")

    doc = bench.run({"fake": _counting_module(4)}, torch.device("cpu"), repeat=1, on_row=on_row)
    assert doc["partial"] and doc["interrupted"] == "KeyboardInterrupt: signal 15"
    assert [r["case"] for r in doc["rows"]] == ["c0", "c1"] and doc["cases_planned"] == 4
    md = bench.write(doc, tmp_path)["md"].read_text()
    assert "**Partial report: interrupted (KeyboardInterrupt: signal 15) after 2 of 4 cases" in md
    assert "| fake_add | c1 |" in md and "| fake_add | c2 |" not in md


def test_cli_interrupt_writes_a_partial_report_and_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    measure = bench.bench_case

    def interrupted_at_the_second(op: str, case: Any, device: torch.device, repeat: int,
                                  graph: str = "auto") -> bench.BenchRow:
        if case.name == "qwen3_0.6b_T64_bf16":
            raise KeyboardInterrupt
        return measure(op, case, device, repeat, graph)

    monkeypatch.setattr(bench, "bench_case", interrupted_at_the_second)
    out = tmp_path / "bench"
    assert cli.main(["bench", "--device", "cpu", "--op", "rms_norm", "--repeat", "1", "--out", str(out)]) == 1
    doc = json.loads((out / "bench.json").read_text())
    assert doc["partial"] and [r["case"] for r in doc["rows"]] == ["qwen3_0.6b_T1_bf16"]
    assert "Partial report" in (out / "bench.md").read_text()
    assert "interrupted (KeyboardInterrupt) after 1 of 2 cases; the report is partial" in capsys.readouterr().err


def test_sigterm_ends_the_bench_with_a_partial_report(tmp_path: Path) -> None:
    """A real ``rlkernel bench`` process killed by SIGTERM (a time limit) writes what it measured."""
    out = tmp_path / "bench"
    rows = out / "bench.rows.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "rlkernel.cli", "bench", "--device", "cpu", "--op",
                             "token_logprobs", "--repeat", "3", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (rows.exists() and rows.read_text().strip()) and proc.poll() is None:
            assert time.monotonic() < deadline, "no bench row within 300 s"
            time.sleep(0.05)
        assert proc.poll() is None, f"the bench ended before the signal: {proc.communicate()}"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, stderr
    doc = json.loads((out / "bench.json").read_text())
    assert doc["partial"] and doc["interrupted"] == "KeyboardInterrupt: signal 15"
    assert [r["case"] for r in doc["rows"]] == ["h1024_v8192_t1"] and doc["cases_planned"] == 2
    assert "after 1 of 2 cases; the report is partial" in stderr


def test_graph_timings_give_the_graph_ratio_and_reach_the_table() -> None:
    """Decode-step rows carry CUDA-graph timings of both sides (timed on CUDA only: the H200 run is the
    proof of capture); the ratio and the table's columns come from them, and a failed capture is shown."""
    row = bench.BenchRow(op="linear", case="m1", flops=1.0, bytes=1.0,
                         native=bench.Timing(ms=0.02), rlkernel=bench.Timing(ms=0.2),
                         native_graph=bench.Timing(ms=0.018), rlkernel_graph=bench.Timing(ms=0.036))
    failed = bench.BenchRow(op="sample", case="b1", flops=0.0, bytes=1.0, native=bench.Timing(ms=0.1),
                            rlkernel=bench.Timing(ms=0.1), native_graph=bench.Timing(error="graph: RuntimeError: sync"),
                            rlkernel_graph=bench.Timing(ms=0.05))
    assert row.graph_ratio == pytest.approx(0.5) and failed.graph_ratio is None
    assert bench.BenchRow(op="x", case="y", flops=0.0, bytes=1.0).graph_ratio is None
    doc = {"device_name": "d", "device": "cuda", "shapes": "large", "torch": "t", "triton": "t", "commit": "c",
           "rows": [row.as_dict(), failed.as_dict()]}
    table = bench.markdown(doc)
    assert "| 0.0180 / 0.0360 | 0.500 |" in table and "native: graph: RuntimeError: sync" in table
    with pytest.raises(ValueError, match="graph='sometimes'"):
        bench.run({}, torch.device("cpu"), 1, graph="sometimes")
