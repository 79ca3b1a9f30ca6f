"""Packaging facts a new user relies on: extras install what their backend imports, and CI runs
the README's test command verbatim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
#: extras that are not a backend's
TOOLING = {"test", "dev"}


def _import_name(requirement: str) -> str:
    name = re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]
    return name.replace("-", "_").lower()


def _imports_of(package: Path, seen: set[Path] | None = None) -> set[str]:
    """Top-level modules imported by ``package``, and by the backend packages it imports
    (``rlkernel.backends.triton``: the cuda and rocm backends run its kernels)."""
    seen = set() if seen is None else seen
    seen.add(package)
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*(?:from|import)\s+([A-Za-z_][\w]*)", line)
            if m:
                found.add(m.group(1).lower())
            shared = re.match(r"\s*from\s+rlkernel\.backends\.(\w+)", line)
            if shared and package.parent == ROOT / "backends" and (ROOT / "backends" / shared.group(1)).is_dir() \
                    and ROOT / "backends" / shared.group(1) not in seen:
                found |= _imports_of(ROOT / "backends" / shared.group(1), seen)
    return found


def test_every_backend_extra_installs_only_what_its_backend_imports() -> None:
    problems = []
    for extra, requirements in EXTRAS.items():
        if extra in TOOLING:
            continue
        package = ROOT / "backends" / extra
        if not package.is_dir():
            problems.append(f"extra {extra!r} has no backend package backends/{extra}/")
            continue
        imported = _imports_of(package)
        unused = [r for r in requirements if _import_name(r) not in imported]
        if unused:
            problems.append(f"extra {extra!r} installs {unused}, which backends/{extra}/ never imports")
    assert not problems, "\n".join(problems)


def test_ci_runs_the_readme_test_command_first() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    command = subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), "test"], check=True,
                             capture_output=True, text=True).stdout.strip()
    assert command.startswith("python3 -m venv .venv && ") and "pytest" in command, command
    first_step = script.index("bash -c \"$test_command\"")
    assert "readme_commands.py test" in script[:first_step]
    for later in ("ruff check", "mypy", "lint_imports"):
        assert script.index(later) > first_step, f"{later} runs before the README's test command"


def test_readme_test_extra_carries_what_the_tests_import() -> None:
    """The README's test command installs '.[test]': the tests' third-party imports must be in it
    (or in the runtime dependencies), or a fresh machine fails where CI passes."""
    declared = {_import_name(r) for r in EXTRAS["test"] + PYPROJECT["project"]["dependencies"]}
    declared |= {"rlkernel", "mutations", "conftest"}
    stdlib = set(sys.stdlib_module_names)
    missing = set()
    for name in _imports_of(ROOT / "tests"):
        if name not in stdlib and name not in declared and not (ROOT / "tests" / f"{name}.py").exists():
            missing.add(name)
    assert not missing, f"tests import {sorted(missing)}, which '.[test]' does not install"


def test_cuda_c_sources_are_package_data() -> None:
    """The CUDA C that NVRTC builds at run time ships in the wheel: every .cu / .cuh under backends/
    matches its package's package-data patterns (pyproject's table wins over setup.py's)."""
    from fnmatch import fnmatch

    data = PYPROJECT["tool"]["setuptools"]["package-data"]
    sources = [p for p in (ROOT / "backends").rglob("*") if p.suffix in (".cu", ".cuh")]
    assert sources, "no CUDA C sources found under backends/"
    for path in sources:
        package = "rlkernel.backends." + ".".join(path.parent.relative_to(ROOT / "backends").parts)
        assert any(fnmatch(path.name, pattern) for pattern in data.get(package, [])), \
            f"{path.relative_to(ROOT)} is not package data of {package} in pyproject.toml"
