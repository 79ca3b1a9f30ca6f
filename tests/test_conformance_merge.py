"""Merging the reports of a conformance run split by --op groups (python -m rlkernel.conformance.merge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkernel.conformance import merge, report
from rlkernel.conformance.records import Record, RunResult


def _part(tmp_path: Path, name: str, ops: dict[str, list[str]], command: list[str], kind: str = "golden") -> Path:
    records = [Record(op=op, case=f"c{i}", kind=kind, status=status)
               for op, statuses in ops.items() for i, status in enumerate(statuses)]
    result = RunResult(backend="cuda", device="cuda", architecture="sm_90", records=records,
                       contract_versions=dict.fromkeys(ops, 2), missing_contracts=[], suite_version=1,
                       manifest_sha256="ab" * 32, environment={"gpu_name": "H200"}, mode="full")
    out = tmp_path / name
    report.write(result, out, command)
    return out


def test_parts_merge_into_one_report_with_every_command(tmp_path: Path) -> None:
    a = _part(tmp_path, "a", {"linear": ["pass", "pass"]}, ["rlkernel", "conformance", "--op", "linear"])
    b = _part(tmp_path, "b", {"rope": ["pass", "fail"], "softmax": ["pass"]},
              ["rlkernel", "conformance", "--op", "rope"])
    assert merge.main(["--out", str(tmp_path / "all"), str(a), str(b / "report.json")]) == 1  # one case failed
    doc = json.loads((tmp_path / "all" / "report.json").read_text())
    assert (doc["summary"]["passed"], doc["summary"]["failed"]) == (4, 1)
    assert list(doc["summary"]["by_op"]) == ["linear", "rope", "softmax"]
    assert doc["commands"] == [["rlkernel", "conformance", "--op", "linear"],
                               ["rlkernel", "conformance", "--op", "rope"]]
    assert doc["commit"] == json.loads((a / "report.json").read_text())["commit"]
    md = (tmp_path / "all" / "report.md").read_text()
    assert "**4 passed, 1 failed**" in md and "merged from 2 runs" in md
    assert (tmp_path / "all" / "junit.xml").read_text().count("<testcase") == 5


def test_overlapping_ops_and_other_runs_are_refused(tmp_path: Path) -> None:
    a = _part(tmp_path, "a", {"linear": ["pass"]}, ["x"])
    b = _part(tmp_path, "b", {"linear": ["pass"]}, ["y"])
    with pytest.raises(ValueError, match="the cases of op 'linear' are in part 0 and in part 1"):
        merge.merge([merge.load(a), merge.load(b)])
    other = merge.load(b)
    other["commit"] = "0" * 40
    with pytest.raises(ValueError, match="part 1 has commit"):
        merge.merge([merge.load(a), other])
    with pytest.raises(FileNotFoundError, match="no conformance report"):
        merge.load(tmp_path / "missing")


def test_static_checks_may_come_from_their_own_part(tmp_path: Path) -> None:
    """``rlkernel conformance --jobs`` runs the static checks in a part of their own: an op's cases and
    its static checks may come from two parts, but neither from two."""
    cases = _part(tmp_path, "cases", {"linear": ["pass"]}, ["x"])
    static = _part(tmp_path, "static", {"linear": ["pass", "pass"]}, ["y"], kind="static")
    result, _ = merge.merge([merge.load(cases), merge.load(static)])
    assert sorted((r.kind, r.case) for r in result.records) == [("golden", "c0"), ("static", "c0"), ("static", "c1")]
    with pytest.raises(ValueError, match="the static checks of op 'linear' are in part 1 and in part 2"):
        merge.merge([merge.load(cases), merge.load(static), merge.load(static)])
