"""The template backend agrees with what the conformance suite calls and with the vendor guide."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from rlkernel.backends.template import TemplateBackend
from rlkernel.conformance import static

ROOT = Path(__file__).resolve().parent.parent


def _call_text(fn: object) -> str:
    """``static_checks(ops=None)``: the method's parameters as the docs write them."""
    params = inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
    args = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in params]
    return f"static_checks({', '.join(args)})"


def test_template_static_checks_receive_the_op_filter() -> None:
    """conformance/static.py passes ``--op`` positionally to a ``static_checks`` that takes a
    parameter, and calls one without parameters with none: the template takes it."""
    calls: list[list[str] | None] = []

    class Recording(TemplateBackend):
        def static_checks(self, ops: list[str] | None = None) -> list[tuple[str, str, bool, str]]:
            calls.append(ops)
            return super().static_checks(ops)

    assert inspect.signature(Recording.static_checks) == inspect.signature(TemplateBackend.static_checks)
    assert static.collect(Recording(), ["rms_norm"]) == [] and calls == [["rms_norm"]]
    assert static.collect(Recording()) == [] and calls[-1] is None
    assert _call_text(TemplateBackend().static_checks) == "static_checks(ops=None)"


def test_guide_template_and_runner_document_the_same_static_checks_signature() -> None:
    call = _call_text(TemplateBackend().static_checks)
    for path in ("docs/adding-a-backend.md", "backends/template/README.md"):
        written = set(re.findall(r"static_checks\([^)]*\)", (ROOT / path).read_text()))
        assert written == {call}, f"{path} writes {sorted(written)}; the template and the runner use {call}"
    assert "def static_checks(self, ops=None)" in inspect.getsource(static)
