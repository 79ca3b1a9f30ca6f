"""The conformance runner, end to end, on a fake contract and fake backends (no GPU).

The fake op ``fake_sum`` sums each row of an fp32 matrix. Its reference is order-free (the
exactly rounded ``math.fsum``, rounded to fp32), so a backend that sums sequentially in some
order is wrong on some rows in the last bit: the suite must see it, in the golden hashes and
in the reduction-order invariance.
"""

from __future__ import annotations

import io
import json
import math
import sys
import types
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from rlkernel import cli, dispatch, registry
from rlkernel.backend import Backend
from rlkernel.conformance import manifest, report, runner, targets
from rlkernel.conformance.hashing import canonical_bytes, first_difference, sha256_of
from rlkernel.conformance.progress import StreamProgress
from rlkernel.contracts import CONTRACT_MODULES, load_contracts
from rlkernel.contracts._contract import Case, Contract, InvarianceCase
from rlkernel.contracts._gen import normal

PKG = "_rlkernel_test_fake_sum_kernels"
ROWS, COLS = 4, 16


# --- the fake op: reference and three kernels -------------------------------------------------

def exact_sum(x: torch.Tensor) -> torch.Tensor:
    """Row sums, exactly rounded to float64 by fsum (order-free), then to fp32."""
    rows = [np.float32(math.fsum(float(v) for v in row)) for row in x.reshape(-1, x.shape[-1]).tolist()]
    return torch.tensor(np.array(rows, dtype=np.float32).reshape(x.shape[:-1]))


def sequential_sum(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Row sums accumulated one fp32 addition at a time, left to right (or right to left)."""
    flat = x.reshape(-1, x.shape[-1]).numpy()
    out = np.zeros(flat.shape[0], dtype=np.float32)
    for i, row in enumerate(flat):
        acc = np.float32(0.0)
        for v in row[::-1] if reverse else row:
            acc = np.float32(acc + v)
        out[i] = acc
    return torch.from_numpy(out.reshape(x.shape[:-1]))


def swapped_sum(x: torch.Tensor) -> torch.Tensor:
    return sequential_sum(x, reverse=True)


FLIP_INDEX = 2


def flipped_sum(x: torch.Tensor) -> torch.Tensor:
    """The exact sums with the lowest bit of output element FLIP_INDEX flipped."""
    out = exact_sum(x).clone()
    out.view(torch.int32).view(-1)[FLIP_INDEX] ^= 1
    return out


def rows_of(seed: int) -> torch.Tensor:
    return normal(seed, (ROWS, COLS), dtype=torch.float32)


def order_sensitive_seed() -> int:
    """The first seed whose rows the swapped sum gets wrong by exactly one ulp somewhere, and whose
    forward and reverse sequential sums differ (so the reduction-order invariance breaks too)."""
    for seed in range(1000):
        x = rows_of(seed)
        exact, rev, fwd = exact_sum(x), swapped_sum(x), sequential_sum(x)
        ulps = (exact.view(torch.int32).long() - rev.view(torch.int32).long()).abs()
        if int(ulps.max()) == 1 and not torch.equal(rev, fwd):
            return seed
    raise AssertionError("no order-sensitive input among 1000 seeds; the generator changed")


SEED = order_sensitive_seed()


def make_contract_module(version: int = 1) -> types.ModuleType:
    """A contract module shaped like ``contracts/<op>.py``."""
    mod = types.ModuleType("rlkernel_test_fake_sum_contract")
    mod.CONTRACT = Contract(name="fake_sum", version=version, summary="y_i = sum_j x_ij (exact)",  # type: ignore[attr-defined]
                            invariances=("batch", "reduction_order"))
    mod.reference = exact_sum  # type: ignore[attr-defined]

    def golden_cases() -> list[Case]:
        return [
            Case("order_sensitive", "golden", lambda: {"x": rows_of(SEED)}),
            # small integers: every order of summation is exact, so even the swapped sum passes
            Case("integer_rows", "golden", lambda: {"x": torch.arange(float(ROWS * COLS)).view(ROWS, -1)}),
            Case("large", "golden", lambda: {"x": rows_of(7).repeat(8, 1)}, full_only=True),
        ]

    def adversarial_cases() -> list[Case]:
        return [Case("zeros_and_signed_zero", "adversarial",
                     lambda: {"x": torch.tensor([[0.0, -0.0], [-0.0, -0.0], [1.0, -1.0]])})]

    def row_alone(run: Callable[..., Any]) -> tuple[Any, Any]:
        x = rows_of(SEED)
        return run("fake_sum", x=x)[1:2], run("fake_sum", x=x[1:2])

    def reversed_terms(run: Callable[..., Any]) -> tuple[Any, Any]:
        x = rows_of(SEED)
        return run("fake_sum", x=x), run("fake_sum", x=x.flip(-1).contiguous())

    def invariance_cases() -> list[InvarianceCase]:
        return [InvarianceCase("row_alone_vs_batch", "batch", row_alone),
                InvarianceCase("reversed_terms", "reduction_order", reversed_terms)]

    mod.golden_cases, mod.adversarial_cases = golden_cases, adversarial_cases  # type: ignore[attr-defined]
    mod.invariance_cases = invariance_cases  # type: ignore[attr-defined]
    return mod


def fake_backend(kernel: str | None, static: list[tuple[str, str, bool, str]] | None = None) -> Backend:
    class FakeBackend(Backend):
        name = "fake"
        device_types = ("cpu",)
        package = PKG
        kernels: ClassVar[dict[str, str]] = {"fake_sum": f"ops:{kernel}"} if kernel else {}
        verification: ClassVar[dict[str, str]] = {"*": "unverified"}

        def architecture(self, device: torch.device) -> str:
            return "fakearch"

    backend = FakeBackend()
    if static is not None:
        backend.static_checks = lambda: static  # type: ignore[attr-defined]
    return backend


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture
def contract() -> types.ModuleType:
    return make_contract_module()


@pytest.fixture
def manifest_path(tmp_path: Path, contract: types.ModuleType) -> Path:
    path = tmp_path / "manifest.json"
    manifest.update({"fake_sum": contract}, path)
    return path


@pytest.fixture
def use_fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Backend]:
    """Register a fake backend (replacing every other) and route ``rlkernel.ops`` lookups to dispatch."""
    pkg = types.ModuleType(PKG)
    pkg.__path__ = []
    ops = types.ModuleType(f"{PKG}.ops")
    for fn in (exact_sum, swapped_sum, flipped_sum):
        setattr(ops, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, PKG, pkg)
    monkeypatch.setitem(sys.modules, f"{PKG}.ops", ops)
    monkeypatch.delenv("RLKERNEL_BACKEND", raising=False)

    def public(op: str) -> Callable[..., Any]:
        return lambda **kw: dispatch.call(op, kw["x"].device, **kw)

    monkeypatch.setattr(targets, "public_op", public)

    def install(kernel: str | None, static: list[tuple[str, str, bool, str]] | None = None) -> Backend:
        backend = fake_backend(kernel, static)
        monkeypatch.setattr(registry, "_backends", {"fake": backend})
        monkeypatch.setattr(registry, "_probes", {"fake": (True, "test")})
        return backend

    return install


def run(contract: types.ModuleType, manifest_path: Path, backend: str = "fake", **kw: Any) -> Any:
    config = runner.RunConfig(backend=backend, device="cpu" if backend != "reference" else None,
                              manifest_path=manifest_path, **kw)
    return runner.run(config, modules={"fake_sum": contract})


def by_case(result: Any) -> dict[str, Any]:
    return {r.case: r for r in result.records}


# --- tests ---------------------------------------------------------------------------------------

def test_all_pass_when_bits_match(use_fake: Any, contract: types.ModuleType, manifest_path: Path) -> None:
    use_fake("exact_sum")
    result = run(contract, manifest_path)
    assert [r.status for r in result.records] == ["pass"] * 5, [r.detail for r in result.records]
    assert {r.case for r in result.records} == {"order_sensitive", "integer_rows", "zeros_and_signed_zero",
                                                "row_alone_vs_batch", "reversed_terms"}  # --quick: no "large"
    assert result.ok and result.final_line() == "5 passed, 0 failed"
    assert result.records[0].kernels == ["fake:ops.exact_sum"]
    assert (result.backend, result.device, result.architecture) == ("fake", "cpu", "fakearch")


def test_full_mode_runs_full_only_cases(use_fake: Any, contract: types.ModuleType, manifest_path: Path) -> None:
    use_fake("exact_sum")
    assert by_case(run(contract, manifest_path, full=True))["large"].status == "pass"


def test_one_flipped_bit_fails_with_first_index_and_hex(use_fake: Any, contract: types.ModuleType,
                                                        manifest_path: Path) -> None:
    use_fake("flipped_sum")
    rec = by_case(run(contract, manifest_path))["order_sensitive"]
    assert rec.status == "fail" and rec.kind == "golden"
    expected = exact_sum(rows_of(SEED))
    want_bits = int(expected.view(torch.int32)[FLIP_INDEX]) & 0xFFFFFFFF
    assert f"first difference at flat index {FLIP_INDEX} of {ROWS} (1 differ)" in rec.detail
    assert f"(0x{want_bits:08x})" in rec.detail and f"(0x{want_bits ^ 1:08x})" in rec.detail
    assert rec.actual_sha256 != rec.expected_sha256
    assert rec.repro == ("rlkernel conformance --backend fake --device cpu --op fake_sum "
                         "--case order_sensitive --out conformance-repro")


def test_swapped_summation_order_is_reported(use_fake: Any, contract: types.ModuleType, manifest_path: Path) -> None:
    use_fake("swapped_sum")
    cases = by_case(run(contract, manifest_path))
    assert cases["order_sensitive"].status == "fail"
    assert "first difference at flat index" in cases["order_sensitive"].detail
    inv = cases["reversed_terms"]
    assert inv.status == "fail" and inv.kind == "invariance"
    assert inv.detail.startswith("invariance reduction_order broken: first difference at flat index")
    assert inv.expected_sha256 and inv.actual_sha256 and inv.expected_sha256 != inv.actual_sha256
    assert cases["row_alone_vs_batch"].status == "pass"  # row sums are still batch-invariant


def test_missing_kernel_is_not_supported_and_counts_as_failure(use_fake: Any, contract: types.ModuleType,
                                                                manifest_path: Path) -> None:
    use_fake(None)
    result = run(contract, manifest_path)
    assert {r.status for r in result.records} == {"not_supported"}
    summary = result.summary()
    assert summary["not_supported"] == 5 and summary["failed"] == 5 and summary["passed"] == 0
    assert "has no kernel for 'fake_sum'" in result.records[0].detail
    assert not result.ok


def test_manifest_gaps_and_stale_versions_are_errors(use_fake: Any, tmp_path: Path, manifest_path: Path) -> None:
    use_fake("exact_sum")
    newer = make_contract_module(version=2)
    rec = by_case(run(newer, manifest_path))["order_sensitive"]
    assert rec.status == "error"
    assert rec.detail.startswith("manifest holds version 1, contract is 2: regenerate with "
                                 "`python -m rlkernel.conformance.manifest --update --op fake_sum`")
    rec = by_case(run(newer, tmp_path / "absent.json"))["order_sensitive"]
    assert rec.status == "error" and "not in the manifest" in rec.detail
    # the invariances do not need the manifest
    assert by_case(run(newer, manifest_path))["reversed_terms"].status == "pass"


def test_reference_is_checked_against_the_manifest(contract: types.ModuleType, manifest_path: Path) -> None:
    result = run(contract, manifest_path, backend="reference")
    assert [r.kind for r in result.records] == ["golden", "golden", "adversarial"]  # no invariance
    assert result.ok
    data = json.loads(manifest_path.read_text())
    data["ops"]["fake_sum"]["cases"]["integer_rows"] = "0" * 64
    manifest_path.write_text(json.dumps(data))
    rec = by_case(run(contract, manifest_path, backend="reference"))["integer_rows"]
    assert rec.status == "fail" and "the reference drifted" in rec.detail


def test_static_checks_become_records(use_fake: Any, contract: types.ModuleType, manifest_path: Path) -> None:
    use_fake("exact_sum", static=[("fake_sum", "sm_90/no-ex2-approx", True, ""),
                                  ("fake_sum", "sm_90/no-ftz", False, "found add.ftz.f32 in _k"),
                                  ("other_op", "gfx942/no-v_exp", True, "")])
    result = run(contract, manifest_path, ops=["fake_sum"])
    static = [r for r in result.records if r.kind == "static"]
    assert [(r.case, r.status) for r in static] == [("sm_90/no-ex2-approx", "pass"), ("sm_90/no-ftz", "fail")]
    assert static[1].detail == "found add.ftz.f32 in _k"


def test_static_phase_alone(use_fake: Any, contract: types.ModuleType, manifest_path: Path) -> None:
    """``cases_phase=False`` (what ``--jobs`` runs beside its parts): the static records only."""
    use_fake("exact_sum", static=[("fake_sum", "sm_90/no-ftz", True, "")])
    result = run(contract, manifest_path, ops=["fake_sum"], cases_phase=False)
    assert [(r.kind, r.case) for r in result.records] == [("static", "sm_90/no-ftz")]
    assert result.ok and result.not_run == 0


def test_static_checks_get_the_op_filter(use_fake: Any, contract: types.ModuleType,
                                         manifest_path: Path) -> None:
    """A provider taking ``ops`` is told which ops to compile (a cold compile of every kernel
    takes minutes on a GPU machine); its records are still filtered by op."""
    backend = use_fake("exact_sum")
    asked: list[Any] = []

    def checks(ops: list[str] | None = None) -> list[tuple[str, str, bool, str]]:
        asked.append(ops)
        return [("fake_sum", "sm_90/clean", True, ""), ("other_op", "sm_90/clean", True, "")]

    backend.static_checks = checks  # type: ignore[attr-defined]
    result = run(contract, manifest_path, ops=["fake_sum"])
    assert asked == [["fake_sum"]]
    assert [(r.op, r.case) for r in result.records if r.kind == "static"] == [("fake_sum", "sm_90/clean")]


def test_interrupt_during_static_checks_still_reports(use_fake: Any, contract: types.ModuleType,
                                                     manifest_path: Path) -> None:
    """SIGTERM (mapped to KeyboardInterrupt) while the static checks compile: the cases that ran
    are reported, the unfinished static phase counts as not run, and the run is not ok."""
    backend = use_fake("exact_sum")

    def checks() -> list[tuple[str, str, bool, str]]:
        raise KeyboardInterrupt("signal 15")

    backend.static_checks = checks  # type: ignore[attr-defined]
    result = run(contract, manifest_path)
    assert [r.status for r in result.records] == ["pass"] * 5
    assert result.not_run == 1 and not result.ok
    assert "not run" in result.final_line()


def test_case_filter(use_fake: Any, contract: types.ModuleType, manifest_path: Path) -> None:
    use_fake("swapped_sum")
    result = run(contract, manifest_path, cases=["row_alone_vs_batch"])
    assert [(r.case, r.status) for r in result.records] == [("row_alone_vs_batch", "pass")]


def test_reports_have_the_schema(use_fake: Any, contract: types.ModuleType, manifest_path: Path,
                                 tmp_path: Path) -> None:
    use_fake("swapped_sum")
    result = run(contract, manifest_path)
    paths = report.write(result, tmp_path / "out")
    doc = json.loads(paths["json"].read_text())
    assert {"backend", "device", "architecture", "contract_version", "suite_version", "manifest_sha256",
            "environment", "summary", "cases"} <= set(doc)
    assert doc["contract_version"] == {"fake_sum": 1}
    assert doc["manifest_sha256"] == manifest.file_sha256(manifest_path)
    assert {"python", "torch", "numpy", "platform", "cpu_model"} <= set(doc["environment"])
    assert {"passed", "failed", "not_supported", "error", "by_op"} <= set(doc["summary"])
    assert doc["summary"]["by_op"]["fake_sum"]["invariance"] == {"pass": 1, "fail": 1, "not_supported": 0,
                                                                 "error": 0}
    for case in doc["cases"]:
        assert {"op", "case", "kind", "status", "expected_sha256", "actual_sha256", "detail"} <= set(case)
        assert case["kind"] in ("golden", "adversarial", "invariance", "static")
        assert case["status"] in ("pass", "fail", "not_supported", "error")
    junit = ET.parse(paths["junit"]).getroot()
    assert junit.get("tests") == "5" and junit.get("failures") == "2"
    assert len(junit.findall(".//testcase/failure")) == 2
    md = paths["md"].read_text()
    assert "fake_sum/reversed_terms" in md and "reproduce:" in md


def test_cli_exit_status_and_last_line(use_fake: Any, contract: types.ModuleType, manifest_path: Path,
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "load_contracts", lambda ops=None, errors=None: ({"fake_sum": contract}, ["linear"]))
    argv = ["conformance", "--backend", "fake", "--device", "cpu", "--manifest", str(manifest_path)]
    use_fake("swapped_sum")
    assert cli.main([*argv, "--out", str(tmp_path / "bad")]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "3 passed, 2 failed"
    assert "FAIL fake_sum/order_sensitive (golden): first difference at flat index" in out
    assert "reproduce: rlkernel conformance --backend fake --device cpu --op fake_sum --case order_sensitive" in out
    assert "contracts not present in this tree (not run): linear" in err
    assert (tmp_path / "bad" / "junit.xml").exists()
    use_fake("exact_sum")
    assert cli.main([*argv, "--out", str(tmp_path / "good")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "5 passed, 0 failed"
    assert cli.main(["conformance", "--backend", "nope", "--out", str(tmp_path / "x")]) == 2


def test_progress_without_a_terminal_prints_one_line_per_op(use_fake: Any, contract: types.ModuleType,
                                                            manifest_path: Path) -> None:
    use_fake("exact_sum")
    stream = io.StringIO()
    config = runner.RunConfig(backend="fake", device="cpu", manifest_path=manifest_path)
    runner.run(config, modules={"fake_sum": contract}, progress=StreamProgress(stream))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fake_sum: 5 passed, 0 failed")


def test_manifest_update_keeps_other_ops(tmp_path: Path, contract: types.ModuleType) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"suite_version": manifest.SUITE_VERSION,
                                "ops": {"linear": {"version": 3, "cases": {"a": "1" * 64}}}}))
    data = manifest.update({"fake_sum": contract}, path)
    assert data["ops"]["linear"] == {"version": 3, "cases": {"a": "1" * 64}}
    assert data["ops"]["fake_sum"]["version"] == 1
    cases = {"order_sensitive", "integer_rows", "large", "zeros_and_signed_zero"}
    assert set(data["ops"]["fake_sum"]["cases"]) == cases
    assert data["ops"]["fake_sum"]["cases"]["order_sensitive"] == sha256_of(exact_sum(rows_of(SEED)))


def test_hashing_is_bitwise_and_nan_canonical() -> None:
    nan_a = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    nan_b = torch.tensor([-0x400000], dtype=torch.int32).view(torch.float32)  # 0xFFC00000: negative NaN
    assert canonical_bytes(nan_a) == canonical_bytes(nan_b) == bytes.fromhex("0000c07f")
    assert canonical_bytes(torch.tensor([float("nan")], dtype=torch.bfloat16)) == bytes.fromhex("c07f")
    assert canonical_bytes(torch.tensor([float("nan")], dtype=torch.float16)) == bytes.fromhex("007e")
    assert sha256_of(torch.tensor([0.0])) != sha256_of(torch.tensor([-0.0]))
    assert first_difference(torch.tensor([0.0]), torch.tensor([-0.0])) is not None
    assert sha256_of(torch.zeros(2, 3)) != sha256_of(torch.zeros(3, 2))  # shape is hashed
    assert sha256_of(torch.zeros(2)) != sha256_of(torch.zeros(2, dtype=torch.float64))  # so is dtype
    t = torch.arange(12.0).reshape(3, 4)
    assert sha256_of(t.t()) == sha256_of(t.t().contiguous())  # layout is not
    assert sha256_of((t, (t,))) == sha256_of([t, t])


def test_load_contracts_reports_missing_and_broken_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rlkernel.contracts as contracts_pkg

    assert list(CONTRACT_MODULES[:3]) == ["embedding", "linear", "rms_norm"]
    (tmp_path / "_t_present.py").write_text("VALUE = 1\n")
    (tmp_path / "_t_broken.py").write_text("raise ImportError('half-written contract')\n")
    monkeypatch.setattr(contracts_pkg, "__path__", [*contracts_pkg.__path__, str(tmp_path)])
    monkeypatch.setattr(contracts_pkg, "CONTRACT_MODULES", ("_t_present", "_t_missing", "_t_broken"))
    for name in ("_t_present", "_t_broken"):  # imported below; removed again when the test ends
        monkeypatch.setitem(sys.modules, f"rlkernel.contracts.{name}", None)
        monkeypatch.delitem(sys.modules, f"rlkernel.contracts.{name}")
    loaded, missing = load_contracts(["_t_present", "_t_missing"])
    assert list(loaded) == ["_t_present"] and loaded["_t_present"].VALUE == 1 and missing == ["_t_missing"]
    with pytest.raises(ImportError, match="half-written contract"):
        load_contracts()
    errors: dict[str, BaseException] = {}
    loaded, missing = load_contracts(errors=errors)
    assert list(loaded) == ["_t_present"] and missing == ["_t_missing"] and list(errors) == ["_t_broken"]
    with pytest.raises(ValueError, match="unknown contract module"):
        load_contracts(["not_an_op"])
