"""Shared pytest hooks: the mutation test's summary (how many mutants ran, which case caught each)."""

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
