"""Run import-linter on the layer rules of pyproject.toml, on a staged tree where it can see them.

Why staged: contracts/, backends/ and conformance/ are installed as rlkernel.contracts,
rlkernel.backends and rlkernel.conformance through setuptools' package-dir mapping, and grimp
(import-linter's graph builder) only walks the directory of the root package: it never sees
the mapped subpackages, neither in an editable install nor in the source tree. So the tree is
copied into a temporary directory with the mapped folders placed under rlkernel/, and
import-linter runs there with the contracts of ``[tool.importlinter]`` in pyproject.toml.

A forbidden internal module that does not exist yet (``rlkernel.nn`` before anyone wrote it)
would make import-linter abort; it is dropped from that contract with a notice, and checked
again as soon as it exists. Finally a self-test plants, one at a time, a module that breaks a
rule (a backend or an op importing the contracts, the package root importing them, an op
reaching them through the conformance suite) and requires import-linter to fail on each: a
layer check that cannot fail is no check.

Usage: python .ci/lint_imports.py   (from the repository root, with import-linter installed)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
# Same mapping as setup.py's PACKAGE_DIR (installed name -> source folder).
PACKAGE_DIR = {
    "rlkernel": "rlkernel",
    "rlkernel.contracts": "contracts",
    "rlkernel.backends": "backends",
    "rlkernel.conformance": "conformance",
}
#: Self-test plants: (path in the staged tree, line appended to it, what it breaks). Each must be rejected.
PLANTS = (
    ("rlkernel/backends/_import_linter_selftest.py", "import rlkernel.contracts",
     "a backend importing rlkernel.contracts"),
    ("rlkernel/backends/triton/linear.py", "from rlkernel.contracts import linear",
     "the shared Triton kernels importing a contract"),
    ("rlkernel/backends/rocm/static_checks.py", "from rlkernel.conformance import runner",
     "the rocm backend importing the conformance suite"),
    ("rlkernel/backends/ascend/__init__.py", "import rlkernel.contracts.rms_norm",
     "the ascend backend importing a contract"),
    ("rlkernel/backends/musa/__init__.py", "from rlkernel.contracts import _exact",
     "the musa backend importing the reference primitives"),
    ("rlkernel/ops/_import_linter_selftest.py", "from rlkernel.contracts import rope",
     "an op importing rlkernel.contracts.rope"),
    ("rlkernel/__init__.py", "import rlkernel.contracts.attention",
     "the package root importing rlkernel.contracts.attention"),
    ("rlkernel/ops/_import_linter_selftest.py", "from rlkernel.conformance import runner",
     "an op importing the conformance suite (and through it the contracts)"),
    ("rlkernel/bench.py", "from rlkernel.contracts import load_contracts",
     "a module other than the CLI importing rlkernel.contracts"),
    ("rlkernel/cli.py", "from rlkernel.contracts import rope",
     "the CLI importing a contract module (its exception is rlkernel.contracts itself)"),
    ("rlkernel/rollout/_import_linter_selftest.py", "from rlkernel.validate import replay",
     "the rollout engine importing the validation tool that checks it"),
)


def stage(dest: Path) -> None:
    """Copy the source folders into ``dest`` in their installed layout."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name, folder in PACKAGE_DIR.items():
        shutil.copytree(ROOT / folder, dest / name.replace(".", "/"), ignore=ignore, dirs_exist_ok=True)


def module_exists(staged: Path, module: str) -> bool:
    path = staged / module.replace(".", "/")
    return (path / "__init__.py").exists() or path.with_suffix(".py").exists()


def write_config(staged: Path) -> list[str]:
    """Write ``staged/.importlinter`` from pyproject's ``[tool.importlinter]``; return notices."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    notices: list[str] = []
    lines = ["[importlinter]", "root_packages =", *(f"    {p}" for p in config["root_packages"]), ""]
    for i, contract in enumerate(config.get("contracts", [])):
        lines.append(f"[importlinter:contract:{i}]")
        for key, value in contract.items():
            if key == "forbidden_modules":
                present = [m for m in value if "*" in m or not m.startswith("rlkernel") or module_exists(staged, m)]
                for m in value:
                    if m not in present:
                        notices.append(f"note: {m} does not exist yet; not checked in contract {contract['name']!r}")
                value = present
            if isinstance(value, list):
                lines += [f"{key} =", *(f"    {v}" for v in value)]
            else:
                lines.append(f"{key} = {value}")
        lines.append("")
    (staged / ".importlinter").write_text("\n".join(lines))
    return notices


def lint(staged: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(staged))
    beside = Path(sys.executable).parent / "lint-imports"  # the one of this (virtual) environment
    exe = str(beside) if beside.exists() else shutil.which("lint-imports")
    if exe is None:
        raise SystemExit("lint-imports is not installed: pip install import-linter (the dev extra has it)")
    return subprocess.run([exe, "--no-cache"], cwd=staged, env=env, capture_output=True, text=True)


def rejects(staged: Path, path: str, line: str) -> tuple[bool, str]:
    """Plant ``line`` in ``staged/path``, lint, restore the file: ``(rejected, linter output)``."""
    target = staged / path
    before = target.read_text() if target.exists() else None
    target.write_text((before or "") + f"\n{line}  # self-test: must be rejected\n")
    try:
        result = lint(staged)
    finally:
        if before is None:
            target.unlink()
        else:
            target.write_text(before)
    return result.returncode != 0 and "BROKEN" in result.stdout, result.stdout + result.stderr


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="rlkernel-imports-") as tmp:
        staged = Path(tmp)
        stage(staged)
        for notice in write_config(staged):
            print(notice)
        result = lint(staged)
        print(result.stdout + result.stderr)
        if result.returncode != 0:
            print("lint-imports: the layer rules are broken (see above)")
            return result.returncode
        for path, line, what in PLANTS:
            rejected, output = rejects(staged, path, line)
            if not rejected:
                print(output)
                print(f"lint-imports self-test: {what} was NOT rejected; the rules (or import-linter's view "
                      f"of the mapped packages) are broken")
                return 1
            print(f"lint-imports self-test: {what} is rejected, as it must be")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
