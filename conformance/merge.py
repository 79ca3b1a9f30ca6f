"""Merge the reports of one backend's conformance run split by ``--op`` groups into one report.

A lent accelerator often limits a command's time, so a ``--full`` run is split by op groups
(``rlkernel conformance --op linear ...``), each writing its own report. This joins them::

    python -m rlkernel.conformance.merge --out conformance/results/cuda-sm_90-H200 part0/ part1/ ...

The parts must agree on backend, device, architecture, mode, suite version, manifest and
commit, and no op's cases (nor its static checks) may appear in two parts (a case counted twice
would inflate the totals);
anything else is refused with the field that differs. The merged ``report.json`` keeps every
part's command (``commands``) and creation time; its ``commit`` is the parts' commit, not the
commit of the tree that merges them.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rlkernel.conformance.records import Record, RunResult
from rlkernel.conformance.report import as_junit, as_markdown

#: fields every part must share
SAME = ("backend", "device", "architecture", "mode", "suite_version", "manifest_sha256", "commit")


def load(part: Path) -> dict[str, Any]:
    """A part's ``report.json`` (``part`` is the report folder or the file itself)."""
    path = part / "report.json" if part.is_dir() else part
    if not path.is_file():
        raise FileNotFoundError(f"merge: no conformance report at {path}; pass the --out folder of a "
                                f"`rlkernel conformance` run")
    return json.loads(path.read_text())


def merge(parts: list[dict[str, Any]]) -> tuple[RunResult, dict[str, Any]]:
    """The merged run and the extra ``report.json`` fields (``commit``, ``commands``, ``created``)."""
    if not parts:
        raise ValueError("merge: no reports given; expected at least one report folder")
    first = parts[0]
    for i, p in enumerate(parts[1:], 1):
        for key in SAME:
            if p.get(key) != first.get(key):
                raise ValueError(f"merge: part {i} has {key} = {p.get(key)!r} but part 0 has {first.get(key)!r}; "
                                 f"only reports of one run configuration (one commit) can be merged")
    owner: dict[tuple[str, bool], int] = {}
    records: list[Record] = []
    versions: dict[str, int] = {}
    missing: set[str] = set()
    not_run = 0
    for i, p in enumerate(parts):
        # an op's cases come from one part, and its static checks from one part (a case counted
        # twice would inflate the totals); ``--jobs`` runs the static checks in a part of their own
        held = {(c["op"], c.get("kind") == "static") for c in p["cases"]}
        for op_kind in sorted(held):
            if op_kind in owner:
                what = "static checks" if op_kind[1] else "cases"
                raise ValueError(f"merge: the {what} of op {op_kind[0]!r} are in part {owner[op_kind]} and in part "
                                 f"{i}; merge reports of disjoint --op groups")
            owner[op_kind] = i
        records += [Record(**c) for c in p["cases"]]
        versions.update(p.get("contract_version") or {})
        missing.update(p.get("missing_contracts") or [])
        not_run += int(p.get("not_run") or 0)
    result = RunResult(
        backend=first["backend"], device=first["device"], architecture=first["architecture"], records=records,
        contract_versions=versions, missing_contracts=sorted(missing), suite_version=first["suite_version"],
        manifest_sha256=first["manifest_sha256"], environment=first["environment"], mode=first["mode"],
        not_run=not_run)
    extra = {"commit": first.get("commit"), "commands": [p.get("command") for p in parts],
             "created": [p.get("created") for p in parts]}
    return result, extra


def write(result: RunResult, extra: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """``report.json`` (with every part's command), ``report.md`` and ``junit.xml`` in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "backend": result.backend, "device": result.device, "architecture": result.architecture,
        "mode": result.mode, "not_run": result.not_run, "contract_version": result.contract_versions,
        "missing_contracts": result.missing_contracts, "suite_version": result.suite_version,
        "manifest_sha256": result.manifest_sha256, "environment": result.environment,
        **extra, "summary": result.summary(), "cases": [r.as_dict() for r in result.records],
    }
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "junit": out_dir / "junit.xml"}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    commands = "\n".join(f"- `{' '.join(c or [])}`" for c in extra["commands"])
    paths["md"].write_text(as_markdown(result) + f"\nCommit `{extra['commit']}`; merged from {len(extra['commands'])} "
                           f"runs:\n\n{commands}\n")
    tree = as_junit(result)
    ET.indent(tree)
    tree.write(paths["junit"], encoding="utf-8", xml_declaration=True)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlkernel.conformance.merge", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the merged report.{json,md} and junit.xml")
    parser.add_argument("parts", type=Path, nargs="+", help="report folders (or report.json files) of the parts")
    args = parser.parse_args(argv)
    result, extra = merge([load(p) for p in args.parts])
    write(result, extra, args.out)
    print(result.final_line())
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
