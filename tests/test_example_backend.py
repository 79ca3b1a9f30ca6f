"""examples/rlkernel-example-backend, installed as a vendor would install it: found through its
entry point, never chosen by default, and conformant on the two ops it serves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "rlkernel-example-backend"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``pip install --target`` of a copy of the example (the build writes into its source
    folder); yields the environment of a process that sees it on ``PYTHONPATH``."""
    tmp = tmp_path_factory.mktemp("example_backend")
    source, target = tmp / "src", tmp / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--no-index", "--target", str(target), str(source)], capture_output=True, text=True)
    assert pip.returncode == 0, (
        f"pip could not install the example backend (setuptools>=70.1 comes with the test extra: "
        f"pip install -e '.[test]'):\n{pip.stdout}\n{pip.stderr}")
    env = {k: v for k, v in os.environ.items() if k != "RLKERNEL_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(target), *filter(None, [env.get("PYTHONPATH")])])
    yield env


def _python(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=900)


def test_entry_point_registers_it_without_changing_the_default(installed: dict[str, str]) -> None:
    probe = _python(installed, "-c", """
import inspect, torch, rlkernel
from rlkernel import registry
from rlkernel.backends.generic import GenericBackend
example = registry.get_backend("example")
assert registry.backend_for("cpu").name == "cpu", registry.backend_for("cpu").name
with rlkernel.trace() as calls:
    rlkernel.ops.rms_norm(torch.ones(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16))
assert calls == [("rms_norm", "cpu:rms_norm.rms_norm")], calls
with rlkernel.use_backend("example"), rlkernel.trace() as calls:
    rlkernel.ops.silu_mul(torch.ones(2, 8), torch.ones(2, 8))
assert calls == [("silu_mul", "example:silu_mul.silu_mul")], calls
for op in example.kernels:  # the signatures of docs/kernel-signatures.md
    assert inspect.signature(example.kernel(op)) == inspect.signature(GenericBackend().kernel(op)), op
print("ok")
""")
    assert probe.returncode == 0 and probe.stdout.strip() == "ok", probe.stderr
    info = _python(installed, "-m", "rlkernel.cli", "info")
    line = next(x for x in info.stdout.splitlines() if x.strip().startswith("example "))
    assert "usable" in line and "devices=cpu" in line and "kernels=2" in line, line


def test_conformance_passes_its_ops_and_summarises_the_others(installed: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = _python(installed, "-m", "rlkernel.cli", "conformance", "--backend", "example", "--device", "cpu",
                  "--op", "rms_norm", "--op", "silu_mul", "--op", "embedding", "--out", str(out))
    assert run.returncode == 1, run.stdout + run.stderr  # embedding has no kernel: a failure, by design
    report = json.loads((out / "report.json").read_text())
    by_op: dict[str, set[str]] = {}
    for case in report["cases"]:
        by_op.setdefault(case["op"], set()).add(case["status"])
    assert by_op == {"rms_norm": {"pass"}, "silu_mul": {"pass"}, "embedding": {"not_supported"}}, by_op
    kinds = {c["kind"] for c in report["cases"] if c["op"] in ("rms_norm", "silu_mul")}
    assert kinds == {"golden", "adversarial", "invariance"}
    count = sum(c["op"] == "embedding" for c in report["cases"])
    lines = run.stdout.splitlines()
    assert [x for x in lines if "not supported" in x.lower()] == [
        f"not supported: embedding ({count} cases): backend example has no kernel for them "
        f"(every case is in {out / 'report.json'})"]
    passed = sum(c["status"] == "pass" for c in report["cases"])
    assert lines[-1] == f"{passed} passed, {count} failed"


def test_example_imports_only_the_backend_interface_from_rlkernel() -> None:
    """Independent kernels: no contract reference, no rlkernel backend code (a vendor's position)."""
    import ast

    for path in (EXAMPLE / "rlkernel_example_backend").glob("*.py"):
        tree = ast.parse(path.read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level}
        modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        ours = {m for m in modules if m.split(".")[0] == "rlkernel"}
        assert ours <= {"rlkernel.backend"}, f"{path.name} imports {sorted(ours)}"
