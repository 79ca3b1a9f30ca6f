"""``rlkernel conformance --jobs N``: the suite split over processes gives the records of one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlkernel.conformance.parallel import case_counts, plan_groups


def test_groups_are_balanced_by_case_count() -> None:
    weights = {"a": 10, "b": 9, "c": 4, "d": 3, "e": 3, "f": 1}
    groups = plan_groups(weights, 2)
    # largest first, each to the lighter group (the first on a tie): 10+3+3 and 9+4+1
    assert groups == [["a", "d", "e"], ["b", "c", "f"]]
    assert plan_groups(weights, 1) == [sorted(weights)]
    assert plan_groups({"a": 1}, 4) == [["a"]]  # no empty parts
    assert sorted(op for g in plan_groups(weights, 3) for op in g) == sorted(weights)
    with pytest.raises(ValueError, match="--jobs 0"):
        plan_groups(weights, 0)


def test_case_counts_refuse_unknown_modules() -> None:
    counts, missing = case_counts(["rms_norm", "softmax"], full=False)
    assert set(counts) == {"rms_norm", "softmax"} and min(counts.values()) > 1 and missing == []
    with pytest.raises(ValueError, match="unknown contract module"):
        case_counts(["no_such_op"], full=False)


def _cases(report: Path) -> list[str]:
    doc = json.loads((report / "report.json").read_text())
    return sorted(json.dumps({k: v for k, v in c.items() if k != "seconds"}, sort_keys=True) for c in doc["cases"])


def test_jobs_give_the_records_of_one_process(tmp_path: Path) -> None:
    ops = ["--op", "rms_norm", "--op", "silu_mul", "--op", "embedding"]
    cli = [sys.executable, "-m", "rlkernel.cli", "conformance", "--backend", "cpu", *ops]
    one = subprocess.run([*cli, "--out", str(tmp_path / "one")], capture_output=True, text=True)
    two = subprocess.run([*cli, "--jobs", "2", "--out", str(tmp_path / "two")], capture_output=True, text=True)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert two.stdout.splitlines()[-1] == one.stdout.splitlines()[-1]  # "N passed, 0 failed"
    assert "part 1:" in two.stderr and (tmp_path / "two" / "parts" / "part1.log").is_file()
    assert _cases(tmp_path / "two") == _cases(tmp_path / "one")


def test_jobs_refuse_the_kit_and_nonpositive_counts(tmp_path: Path) -> None:
    from rlkernel.cli import main

    assert main(["conformance", "--backend", "cpu", "--op", "rms_norm", "--jobs", "2", "--kit",
                 "--out", str(tmp_path / "k")]) == 2
    assert main(["conformance", "--backend", "cpu", "--op", "rms_norm", "--jobs", "0",
                 "--out", str(tmp_path / "z")]) == 2
