"""Reports of a partial backend: one line per op without kernels, every case kept in report.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlkernel import cli
from rlkernel.conformance import report, runner
from rlkernel.conformance.records import Record, RunResult


def _partial_result() -> RunResult:
    """rms_norm runs (one case fails), linear and attention have no kernel."""
    records = [Record(op="rms_norm", case="ok", kind="golden", status="pass"),
               Record(op="rms_norm", case="bad", kind="golden", status="fail", detail="first difference at 3",
                      repro="rlkernel conformance --op rms_norm --case bad")]
    for op, n in (("linear", 38), ("attention", 57)):
        records += [Record(op=op, case=f"c{i}", kind="golden" if i % 2 else "invariance", status="not_supported",
                           detail=f"backend 'example' has no kernel for {op!r}; backends that do: ['cpu']")
                    for i in range(n)]
    return RunResult(backend="example", device="cpu", architecture="x86_64", records=records,
                     contract_versions={"rms_norm": 1, "linear": 3, "attention": 1}, missing_contracts=[],
                     suite_version=1, manifest_sha256=None, environment={})


def test_not_supported_is_one_line_per_op_in_report_md(tmp_path: Path) -> None:
    result = _partial_result()
    assert report.not_supported_line(result) == "not supported: linear (38 cases), attention (57 cases)"
    md = report.as_markdown(result)
    section = md.split("## Not supported\n", 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if line.startswith("- ")]
    assert items == ["- `linear`: 38 cases: backend 'example' has no kernel for 'linear'; backends that do: ['cpu']",
                     "- `attention`: 57 cases: backend 'example' has no kernel for 'attention'; backends that do: "
                     "['cpu']"]
    assert "linear/c0" not in md and "`rms_norm/bad` (golden) **fail**" in md
    assert len(md.splitlines()) < 40
    paths = report.write(result, tmp_path)
    cases = json.loads(paths["json"].read_text())["cases"]
    assert len(cases) == 97 and sum(c["status"] == "not_supported" for c in cases) == 95


def test_cli_prints_one_line_for_the_ops_without_kernels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    def fake_run(config: runner.RunConfig, progress: Any = None) -> RunResult:
        return _partial_result()

    monkeypatch.setattr(runner, "run", fake_run)
    assert cli.main(["conformance", "--backend", "example", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "1 passed, 96 failed"
    assert [line for line in out if "not supported" in line.lower()] == [
        "not supported: linear (38 cases), attention (57 cases): backend example has no kernel for them "
        f"(every case is in {tmp_path / 'report.json'})"]
    assert "FAIL rms_norm/bad (golden): first difference at 3" in out and len(out) < 10
