"""The layer rules of docs/design.md, enforced by import-linter on a staged tree (.ci/lint_imports.py):
the product never imports the reference, and each rule fails on a planted import."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT_RULE = "the product never imports the reference (rlkernel.*, except rlkernel.conformance and rlkernel.cli)"
ROOT_RULE = "the package root never imports the reference"
SUITE_RULE = "only the CLI starts the conformance suite"
BACKEND_RULE = "backends never import the contracts (no reference in a backend)"
LAYER_RULE = "above the ops, one direction: validate -> train -> rollout | rl -> model -> nn -> ops"


def _linter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_lint_imports", ROOT / ".ci" / "lint_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, Path]]:
    beside = Path(sys.executable).parent / "lint-imports"
    if not beside.exists() and shutil.which("lint-imports") is None:
        pytest.skip("import-linter is not installed (the dev extra has it; CI runs .ci/lint_imports.py)")
    linter = _linter()
    tree = tmp_path_factory.mktemp("staged")
    linter.stage(tree)
    linter.write_config(tree)
    yield linter, tree


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_tree_keeps_every_layer_rule(staged: tuple[ModuleType, Path]) -> None:
    linter, tree = staged
    result = linter.lint(tree)
    out = _flat(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    for rule in (PRODUCT_RULE, ROOT_RULE, SUITE_RULE, BACKEND_RULE, LAYER_RULE):
        assert f"{rule} KEPT" in out, rule


# path, planted line, the rule that must break. Before this rule set, only the backend plant failed.
PLANTS = [
    ("rlkernel/backends/_planted.py", "import rlkernel.contracts", BACKEND_RULE),
    ("rlkernel/ops/_planted.py", "from rlkernel.contracts import rope", PRODUCT_RULE),
    ("rlkernel/ops/rope.py", "from rlkernel.contracts.rope import table_rows", PRODUCT_RULE),
    ("rlkernel/dispatch.py", "import rlkernel.contracts", PRODUCT_RULE),
    ("rlkernel/__init__.py", "import rlkernel.contracts.attention", ROOT_RULE),
    ("rlkernel/ops/_planted.py", "from rlkernel.conformance import runner", SUITE_RULE),
    ("rlkernel/cli.py", "from rlkernel.contracts import rope", PRODUCT_RULE),
    ("rlkernel/rollout/_planted.py", "from rlkernel.validate import replay", LAYER_RULE),
    ("rlkernel/rl/_planted.py", "import rlkernel.validate.record", LAYER_RULE),
]


@pytest.mark.parametrize(("path", "line", "rule"), PLANTS, ids=[f"{p}:{line}" for p, line, _ in PLANTS])
def test_a_planted_import_breaks_its_rule(staged: tuple[ModuleType, Path], path: str, line: str, rule: str) -> None:
    linter, tree = staged
    rejected, output = linter.rejects(tree, path, line)
    assert rejected, output
    assert f"{rule} BROKEN" in _flat(output), output
    assert linter.lint(tree).returncode == 0, "the plant was not removed"


def test_the_cli_exception_is_the_one_import_of_the_contracts_package() -> None:
    """The CLI reaches the contracts only through `from rlkernel.contracts import load_contracts`,
    inside its commands (so `import rlkernel.cli` does not load the reference)."""
    text = (ROOT / "rlkernel" / "cli.py").read_text()
    imports = re.findall(r"^(\s*)from rlkernel\.contracts(\S*) import (.+)$", text, flags=re.M)
    assert imports and all(indent and sub == "" and names == "load_contracts" for indent, sub, names in imports)


def test_triton_host_code_uses_plain_python_helpers() -> None:
    """``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function`` objects (Triton
    3.6+: ~2-4 us a host call, a dozen a linear call); kernels use ``tl.cdiv``, the host ``_common``'s."""
    root = Path(__file__).resolve().parents[1] / "backends" / "triton"
    found = [f"{p.name}:{i}" for p in sorted(root.glob("*.py")) for i, line in enumerate(p.read_text().splitlines(), 1)
             if "triton.cdiv(" in line or "triton.next_power_of_2(" in line]
    assert not found, f"use backends.triton._common.cdiv / next_pow2 on the host: {found}"
