"""The accuracy suite (``rlkernel accuracy``): its metrics, its data, and the rule on the CPU.

These are accuracy tests against float64 — the only place with tolerances. The rule: on every
data set rlkernel's primary metric is no larger than the native kernel's, except the declared
exceptions, each of which must still be below native (a fixed exception must be removed).
"""

from __future__ import annotations

import json

import pytest
import torch

from rlkernel.cli import main
from rlkernel.conformance.accuracy import data, metrics, runner
from rlkernel.conformance.accuracy.suite import EXCEPTIONS


def test_round_to_is_one_correct_rounding() -> None:
    # 1 + 2**-8 + 2**-30: rounding through fp32 lands on the bf16 tie and goes to 1; correct is 1 + 2**-7
    t = torch.tensor([1 + 2**-8 + 2**-30, 1 + 2**-8, -(1 + 3 * 2**-8), 2.0**-130, 2.0**-140, 1e39], dtype=torch.float64)
    got = metrics.round_to(t, torch.bfloat16).double()
    assert got.tolist() == [1 + 2**-7, 1.0, -(1 + 2**-6), 2.0**-130, 0.0, float("inf")]
    assert metrics.round_to(t, torch.float32).tolist() == t.float().tolist()


def test_ulp_histogram_counts_distance_from_the_rounded_truth() -> None:
    truth = torch.tensor([1.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    out = torch.tensor([1.0, 1 + 2**-7, 1 + 3 * 2**-7, 1 - 2**-8 * 20], dtype=torch.bfloat16)
    assert metrics.ulp_histogram(out, truth) == {"0": 1, "1": 1, "2-3": 1, "4-15": 0, ">=16": 1}


def test_halfway_rows_are_double_rounding_traps() -> None:
    x, w = data.halfway_rows("test", 64, 8, 3)
    exact = x.double() @ w.double().T
    through_fp32 = exact.float().to(torch.bfloat16)
    correct = metrics.round_to(exact, torch.bfloat16)
    wrong = (through_fp32 != correct).float().mean()
    assert 0.3 < float(wrong) < 0.7  # about half the ties break the wrong way through fp32


@pytest.fixture(scope="module")
def cpu_rows() -> list[dict]:
    return runner.run(torch.device("cpu"), "small", stream=None)


def test_every_op_has_measurements(cpu_rows: list[dict]) -> None:
    from rlkernel.ops import __all__ as public

    measured = {r["op"] for r in cpu_rows}
    sub_ops = {"linear_exponents", "linear_partial", "linear_finish", "linear_weight_digits",
               "token_logprobs_partial", "token_logprobs_finish", "attention_paged", "rope_tables", "rope_table_rows",
               "exact_sum_merge", "exact_sum_finish",
               "token_logprobs_backward_partial", "token_logprobs_backward_finish"}  # through their parent op
    assert set(public) - sub_ops <= measured, sorted(set(public) - sub_ops - measured)


def test_accuracy_rule_on_cpu(cpu_rows: list[dict]) -> None:
    errors = [f"{r['op']}/{r['dataset']}: {r['error']}" for r in cpu_rows if r["status"] == "error"]
    assert not errors, errors
    below = [f"{r['op']}/{r['dataset']}: {r['verdict']}" for r in cpu_rows if r["status"] == "below native"]
    assert not below, "rlkernel is less accurate than the native kernel on:\n" + "\n".join(below)
    stale = [key for key in EXCEPTIONS
             if any((r["op"], r["dataset"]) == key and r["verdict"]["meets"] for r in cpu_rows)]
    assert not stale, f"declared exceptions that now meet the rule (remove them): {stale}"
    unknown = [key for key in EXCEPTIONS if not any((r["op"], r["dataset"]) == key for r in cpu_rows)]
    assert not unknown, f"exceptions naming no data set: {unknown}"


def test_cli_writes_json_and_markdown(tmp_path) -> None:
    status = main(["accuracy", "--op", "rms_norm", "--op", "linear", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "accuracy.json").read_text())
    assert {r["op"] for r in doc["rows"]} == {"rms_norm", "linear"}
    assert all(r["kernels"] for r in doc["rows"]), "every row names the kernels that ran"
    md = (tmp_path / "accuracy.md").read_text()
    assert "## linear" in md and "outliers_x1000/fp32_out" in md
    assert status == 0  # exceptions are reported, not failures
