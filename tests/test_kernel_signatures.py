"""The kernel interface a vendor implements: docs/kernel-signatures.md is generated from the
device-generic kernels and committed; the public ops pass exactly those keyword names."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from rlkernel import dispatch
from rlkernel.backends.generic import KERNELS
from rlkernel.conformance import kernel_signatures
from rlkernel.conformance.cases import bit_cases, op_of
from rlkernel.contracts import load_contracts
from rlkernel.public import public_op

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "kernel-signatures.md"


def test_committed_kernel_signatures_are_the_generated_ones() -> None:
    assert DOC.read_text() == kernel_signatures.render(), (
        f"docs/kernel-signatures.md is stale; regenerate it: {kernel_signatures.COMMAND}")


def test_check_mode_fails_on_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "kernel-signatures.md"
    text = kernel_signatures.render()
    assert "rms_norm(x, weight, eps=1e-06)" in text
    stale.write_text(text.replace("rms_norm(x, weight, eps=1e-06)", "rms_norm(x, weight, eps=1e-05)"))
    assert kernel_signatures.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    kernel_signatures.main(["--out", str(stale)])
    assert kernel_signatures.main(["--check", str(stale)]) == 0


def _documented(x: torch.Tensor, w: torch.Tensor, k: int, scale: float | None = None) -> None:
    """Summary.

    Parameters
    ----------
    x, w : Tensor, bfloat16, [M, K]
        Two operands.
    k : int; scale : float, optional
        Shared words.

    Returns
    -------
    Tensor, float32, [M]
    """


def test_parameter_docs_read_numpydoc_entries() -> None:
    assert kernel_signatures.parameter_docs(_documented) == {
        "x": "Tensor, bfloat16, [M, K]: Two operands.",
        "w": "Tensor, bfloat16, [M, K]: Two operands.",
        "k": "int: Shared words.",
        "scale": "float, optional: Shared words.",
    }
    assert kernel_signatures.returns_doc(_documented) == "Tensor, float32, [M]"
    text = kernel_signatures.render({"fake": _documented})
    assert "| `scale` | `None` | `float \\| None` | float, optional: Shared words. |" in text
    assert "`_documented(x, w, k, scale=None)`" in text


def test_generic_kernel_signatures_name_every_argument() -> None:
    """No ``**kwargs`` or positional-only parameters: the signature is the whole interface."""
    for op, fn in kernel_signatures.generic_kernels().items():
        kinds = {p.kind for p in inspect.signature(fn).parameters.values()}
        assert kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY}, (op, kinds)


def test_public_ops_pass_exactly_the_generic_kernel_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run each op's first golden case through ``rlkernel.ops`` and record what reaches dispatch."""
    seen: dict[str, set[str]] = {}
    original = dispatch.call

    def recording_call(op: str, device: torch.device, /, **kwargs: Any) -> Any:
        seen.setdefault(op, set()).add(tuple(sorted(kwargs)))  # type: ignore[arg-type]
        return original(op, device, **kwargs)

    monkeypatch.setattr(dispatch, "call", recording_call)
    modules, _ = load_contracts()
    for module in modules.values():
        done: set[str] = set()
        for case in bit_cases(module, full=False):
            op = op_of(module, case)
            if case.kind == "golden" and op not in done:
                done.add(op)
                public_op(op)(**case.make())
    kernels = kernel_signatures.generic_kernels()
    assert set(seen) == set(KERNELS), f"kernels never reached through a public op: {set(KERNELS) - set(seen)}"
    for op, calls in seen.items():
        params = inspect.signature(kernels[op]).parameters
        required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
        for names in calls:
            unknown = set(names) - set(params)
            assert not unknown, f"rlkernel.ops passes {sorted(unknown)} to {op!r}; the kernel takes {list(params)}"
            missing = required - set(names)
            assert not missing, f"rlkernel.ops leaves out the required {sorted(missing)} of {op!r}"
