"""Shared pytest hooks: the mutation test's summary (how many mutants ran, which case caught each),
and the Triton-interpreter children started early and their tests run last."""

from __future__ import annotations

import sys
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    module = sys.modules.get("test_mutations")
    results = getattr(module, "RESULTS", None)
    if not results:
        return
    caught = sum(1 for _, by in results if by is not None)
    terminalreporter.section("mutation test")
    for mutant, by in results:
        terminalreporter.write_line(f"{mutant} -> {by or 'NOT CAUGHT'}")
    terminalreporter.write_line(f"mutation test: {len(results)} mutations applied, {caught} caught, "
                                f"{len(results) - caught} not caught")


INTERPRETER_MODULE = "test_cuda_interpreter"


def _module_name(item: Any) -> str:
    return getattr(getattr(item, "module", None), "__name__", "")


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Run the Triton-interpreter tests last: their child processes (started when collection
    finishes) then work beside the rest of the suite, instead of the suite waiting ~30 minutes
    for them at the module's place in file order."""
    items.sort(key=lambda item: _module_name(item) == INTERPRETER_MODULE)


def pytest_collection_finish(session: Any) -> None:
    """Start the interpreter children when any of their tests is selected (after ``-k``/``-m``)."""
    ops = [item.callspec.params["op"] for item in session.items
           if _module_name(item) == INTERPRETER_MODULE and hasattr(item, "callspec")]
    if ops:
        sys.modules[INTERPRETER_MODULE].start_child(ops)


def pytest_sessionfinish(session: Any) -> None:
    module = sys.modules.get(INTERPRETER_MODULE)
    if module is not None:
        module.stop_child()
