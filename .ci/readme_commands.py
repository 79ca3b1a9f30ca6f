#!/usr/bin/env python3
"""Print one of the two commands the README starts with: ``main`` (conformance) or ``test``.

The README's first code block holds exactly two lines: the main job, then the tests. CI runs
the second through this script, so the command CI runs is the one a new user copies.
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def commands(text: str) -> list[str]:
    """The lines of the README's first fenced code block."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("```"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    return [line for line in lines[start + 1:end] if line.strip()]


def main(argv: list[str]) -> int:
    which = {"main": 0, "test": 1}
    if len(argv) != 2 or argv[1] not in which:
        print(f"usage: {argv[0]} main|test", file=sys.stderr)
        return 2
    found = commands(README.read_text())
    if len(found) != 2:
        print(f"{README}: the first code block must hold exactly two commands, found {len(found)}", file=sys.stderr)
        return 1
    print(found[which[argv[1]]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
