"""The generic path's primitive set is written down honestly, and the primitive probes name a broken one.

``docs/generic-primitives.md`` lists every ATen op and dtype combination the device-generic
kernels run (traced over the golden case of every op); a new op or dtype in the code, or a
stale entry in the document, fails here. The probes of ``rlkernel conformance`` pass on the CPU
and name the first primitive that a device gets wrong (a device that flushes subnormals or
rounds a division differently is simulated by a wrong operation, never by a faked result).
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import torch

from rlkernel.conformance import kit, primitives

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "generic-primitives.md"


def test_documented_primitives_are_the_traced_ones() -> None:
    documented = primitives.parse(DOC.read_text())
    traced = primitives.trace()
    new = {op: sorted(traced[op] - documented.get(op, set())) for op in traced
           if traced[op] - documented.get(op, set())}
    stale = {op: sorted(documented[op] - traced.get(op, set())) for op in documented
             if documented[op] - traced.get(op, set())}
    assert not new and not stale, (
        f"docs/generic-primitives.md is stale (new in the code: {new}; listed but no longer used: {stale}); "
        f"regenerate it: python -m rlkernel.conformance.primitives --write docs/generic-primitives.md")


#: contract modules whose sums moved to the int32 limbs (the trace of all of them takes minutes: --write does it)
INT32_OPS = ["exact_sum", "softmax", "rms_norm", "masked_mean", "all_reduce", "kl_k3"]


def test_int32_limb_block_is_the_traced_one() -> None:
    """What docs/generic-primitives.md says still runs int64 arithmetic with the int32 limbs forced."""
    text = DOC.read_text()
    added, clean, left = primitives.parse_int32(text)
    main = primitives.parse(text)
    per_op = primitives.trace(INT32_OPS, width="int32", by_op=True)
    for seen in per_op.values():
        for aten, combos in seen.items():
            missing = combos - main.get(aten, set()) - added.get(aten, set())
            assert not missing, f"{aten}: {sorted(missing)} is not in docs/generic-primitives.md; regenerate it"
    traced = primitives.int64_left(per_op)
    assert traced
    for op, names in traced.items():
        documented = [] if op in clean else left.get(op)
        assert documented == names, (
            f"docs/generic-primitives.md's int32-limb block is stale for {op}: documented {documented}, traced "
            f"{names}; regenerate it: python -m rlkernel.conformance.primitives --write docs/generic-primitives.md")


def test_probes_pass_on_the_cpu() -> None:
    results = primitives.probe("cpu")
    assert [r["name"] for r in results] == list(primitives.PROBES)
    assert all(r["status"] == "pass" for r in results), results
    assert primitives.first_failure(results) is None


def test_a_wrong_primitive_is_named_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device that flushes subnormals: the probe's device-side run happens with the CPU's own
    flush-to-zero mode on (``torch.set_flush_denormal``), a real FTZ/DAZ arithmetic, not a faked value."""
    checks, fn = primitives.PROBES["subnormals_kept"]
    calls = []

    def on_a_flushing_device(t):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:  # the CPU reference run
            return fn(t)
        if not torch.set_flush_denormal(True):
            pytest.skip("this CPU has no flush-to-zero mode")
        try:
            return tuple(o.clone() for o in fn(t))
        finally:
            torch.set_flush_denormal(False)

    monkeypatch.setitem(primitives.PROBES, "subnormals_kept", (checks, on_a_flushing_device))
    line = primitives.first_failure(primitives.probe("cpu"))
    assert line is not None and line.startswith("primitive subnormals_kept is wrong on this device"), line


def test_kit_archive_and_manifest(tmp_path: Path) -> None:
    from rlkernel.cli import main

    out = tmp_path / "kit"
    assert main(["conformance", "--backend", "cpu", "--op", "rope", "--kit", "--out", str(out)]) == 0
    assert kit.verify(out) == []
    assert json.loads((out / "primitives.json").read_text())[0]["status"] == "pass"
    with tarfile.open(tmp_path / "kit.tar.gz") as tar:
        names = set(tar.getnames())
    assert {f"kit/{n}" for n in ("report.json", "junit.xml", "MANIFEST.sha256", "kernels.json")} <= names
    (out / "report.json").write_text("{}")
    assert kit.verify(out) == ["report.json: SHA-256 differs from the manifest"]
