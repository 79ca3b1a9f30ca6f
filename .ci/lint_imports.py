"""Run import-linter on the layer rules of pyproject.toml, on a staged tree where it can see them.

Why staged: contracts/, backends/ and conformance/ are installed as rlkernel.contracts,
rlkernel.backends and rlkernel.conformance through setuptools' package-dir mapping, and grimp
(import-linter's graph builder) only walks the directory of the root package: it never sees
the mapped subpackages, neither in an editable install nor in the source tree. So the tree is
copied into a temporary directory with the mapped folders placed under rlkernel/, and
import-linter runs there with the contracts of ``[tool.importlinter]`` in pyproject.toml.

A forbidden internal module that does not exist yet (``rlkernel.nn`` before anyone wrote it)
would make import-linter abort; it is dropped from that contract with a notice, and checked
again as soon as it exists. Finally a self-test adds a backend module that imports the
contracts and requires import-linter to fail: a layer check that cannot fail is no check.

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
SELFTEST = "rlkernel/backends/_import_linter_selftest.py"


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
        (staged / SELFTEST).write_text("import rlkernel.contracts  # self-test: must be rejected\n")
        bad = lint(staged)
        if bad.returncode == 0 or "BROKEN" not in bad.stdout:
            print(bad.stdout + bad.stderr)
            print("lint-imports self-test: a backend importing rlkernel.contracts was NOT rejected; "
                  "import-linter is not seeing the mapped packages")
            return 1
        print("lint-imports self-test: a backend importing rlkernel.contracts is rejected, as it must be")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
