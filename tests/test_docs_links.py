"""Every reference in the documentation points at something in this repository.

Relative markdown links in README.md, docs/ and the other READMEs must name files that exist
(and headings that exist, for ``file.md#anchor``); paths ``docs/....md`` written in code and
docstrings must exist; and nothing cites the design notes that live outside the repository.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("rlkernel", "contracts", "backends", "conformance", "tests", "tools", "docs", "examples", ".ci")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
# the design notes kept outside the repository, cited by section or rule (pattern split so that
# this file does not match itself)
OUTSIDE = re.compile(r"\b" + "DESIGN" + r"(?:\.md|\s*§|\s+R\d|'s)|\b" + "STYLE" + r"\.md")
DOC_PATH = re.compile(r"\bdocs/\w[\w./-]*\.md\b")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    files += sorted(p for d in ("backends", "examples") for p in (ROOT / d).rglob("README.md"))
    return files


def text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "setup.py", ROOT / "pyproject.toml"]
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            skip = {"__pycache__", "build", ".mypy_cache"} & set(path.parts) or path.name.endswith(".egg-info")
            if path.is_file() and path.suffix in {".py", ".md", ".toml", ".txt", ""} and not skip:
                files.append(path)
    return files


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def test_slug_matches_github_anchors() -> None:
    assert slug("P1. `expo(x)` — the binary exponent") == "p1-expox--the-binary-exponent"
    assert slug("Dispatch and backends") == "dispatch-and-backends"
    assert slug("linear_exponents") == "linear_exponents"


def test_relative_markdown_links_resolve() -> None:
    broken = []
    for md in markdown_files():
        for target in LINK.findall(FENCE.sub("", md.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            dest = (md.parent / path_part).resolve() if path_part else md
            where = f"{md.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: {path_part} does not exist")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_docs_paths_written_in_code_and_docs_exist() -> None:
    missing = sorted({f"{path.relative_to(ROOT)}: {ref}" for path in text_files()
                      for ref in DOC_PATH.findall(path.read_text(errors="replace"))
                      if not (ROOT / ref).exists() and "<" not in ref})
    assert not missing, "references to documents that do not exist:\n" + "\n".join(missing)


def test_nothing_cites_the_design_notes_outside_the_repository() -> None:
    cited = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}" for path in text_files()
             for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert not cited, ("cite docs/numerics.md (rules R1-R10) or docs/design.md (layers, dispatch, conformance, "
                       "performance) instead:\n" + "\n".join(cited))


def test_readme_backend_table_counts_are_those_of_the_committed_full_reports() -> None:
    """The README says the first command runs the quick suite and the table's counts come from
    ``--full`` runs: each row's ``N passed, N failed`` must be its linked report's, and that
    report a full run."""
    readme = (ROOT / "README.md").read_text()
    intro = readme.split("## What rlkernel is")[0]
    assert "quick conformance suite (`--quick`, the default" in intro and "`--full` runs" in intro
    rows = [line for line in readme.splitlines() if line.startswith("| ") and "conformance/results/" in line]
    static_rows = [row for row in rows if "-static/" in row]
    rows = [row for row in rows if row not in static_rows]
    assert len(rows) >= 3
    for row in static_rows:  # `compiled` rows: "N of M" kernels of that architecture pass the static checks
        link = re.search(r"\]\((conformance/results/[^)]+-static)/report\.md\)", row)
        counts = re.search(r"\((\d+) of (\d+)", row)
        arch = row.split("|")[2].split()[0]
        assert link and counts and "| compiled |" in row, row
        doc = json.loads((ROOT / link.group(1) / "report.json").read_text())
        passed = doc["archs"][arch]["passed"]
        total = doc["archs"][arch]["compiled"] + sum(1 for k in doc["kernels"] if k["arch"] == arch and k["error"])
        assert (passed, total) == (int(counts[1]), int(counts[2])) and passed == total, (row, doc["archs"][arch])
    for row in rows:
        link = re.search(r"\]\((conformance/results/[^)]+)\)", row)
        counts = re.search(r"\((\d+) passed, (\d+) failed", row)
        assert link and counts, row
        target = ROOT / link.group(1)
        report = target / "report.json" if target.is_dir() else target.with_suffix(".json")
        doc = json.loads(report.read_text())
        assert doc["mode"] == "full", f"{report.relative_to(ROOT)} is a {doc['mode']} run; the table promises --full"
        assert (doc["summary"]["passed"], doc["summary"]["failed"]) == (int(counts[1]), int(counts[2])), row
