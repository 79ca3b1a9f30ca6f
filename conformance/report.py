"""Reports of a conformance run: ``report.json`` (machines), ``report.md`` (people), ``junit.xml`` (CI)."""

from __future__ import annotations

import datetime
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from rlkernel.conformance.records import KINDS, Record, RunResult
from rlkernel.environment import git_commit


def as_json(result: RunResult, command: list[str] | None = None) -> dict[str, Any]:
    """The ``report.json`` document."""
    return {
        "backend": result.backend,
        "device": result.device,
        "architecture": result.architecture,
        "mode": result.mode,
        "not_run": result.not_run,
        "contract_version": result.contract_versions,
        "missing_contracts": result.missing_contracts,
        "suite_version": result.suite_version,
        "manifest_sha256": result.manifest_sha256,
        "environment": result.environment,
        "commit": git_commit(),
        "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "summary": result.summary(),
        "cases": [r.as_dict() for r in result.records],
    }


def not_supported(result: RunResult) -> dict[str, list[Record]]:
    """The ``not_supported`` records by op, in run order: a partial backend has hundreds of them,
    which people read as one line per op (``report.json`` keeps every record)."""
    by_op: dict[str, list[Record]] = {}
    for r in result.records:
        if r.status == "not_supported":
            by_op.setdefault(r.op, []).append(r)
    return by_op


def not_supported_line(result: RunResult) -> str:
    """``not supported: linear (38 cases), attention (57 cases)``, or "" when every op ran."""
    by_op = not_supported(result)
    if not by_op:
        return ""
    return "not supported: " + ", ".join(f"{op} ({len(rs)} case{'s' if len(rs) != 1 else ''})"
                                         for op, rs in by_op.items())


def as_markdown(result: RunResult) -> str:
    """The ``report.md`` text: counts per op and kind, one line per op without kernels, then every
    other failure with its reproduction."""
    s = result.summary()
    env = result.environment
    lines = [
        f"# Conformance: backend `{result.backend}` on `{result.device}` ({result.architecture})",
        "",
        f"**{result.final_line()}** ({s['fail']} fail, {s['error']} error, {s['not_supported']} not supported; "
        f"mode {result.mode}, suite v{result.suite_version}, manifest `{(result.manifest_sha256 or 'none')[:16]}`)",
        "",
        f"torch {env.get('torch')}, triton {env.get('triton')}, python {env.get('python')}, "
        f"{env.get('gpu_name') or env.get('cpu_model')}",
        "",
        "| op | version | " + " | ".join(KINDS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in KINDS) + " |",
    ]
    for op, kinds in s["by_op"].items():
        cells = []
        for kind in KINDS:
            c = kinds.get(kind)
            if not c:
                cells.append("")
                continue
            bad = c["fail"] + c["error"] + c["not_supported"]
            cells.append(f"{c['pass']}/{c['pass'] + bad}" + (" **FAIL**" if bad else ""))
        lines.append(f"| {op} | {result.contract_versions.get(op, '')} | " + " | ".join(cells) + " |")
    if result.missing_contracts:
        lines += ["", "Contracts not present in this tree: " + ", ".join(result.missing_contracts)]
    unsupported = not_supported(result)
    if unsupported:
        lines += ["", "## Not supported", "",
                  f"The backend has no kernel for these ops ({s['not_supported']} cases; each counts as a failure; "
                  "report.json lists every case):", ""]
        for op, records in unsupported.items():
            lines.append(f"- `{op}`: {len(records)} case{'s' if len(records) != 1 else ''}: {records[0].detail}")
    failures = [r for r in result.records if r.failed and r.status != "not_supported"]
    if failures:
        lines += ["", "## Failures", ""]
        for r in failures:
            lines.append(f"- `{r.op}/{r.case}` ({r.kind}) **{r.status}**: {r.detail}")
            if r.repro:
                lines.append(f"  - reproduce: `{r.repro}`")
    return "\n".join(lines) + "\n"


def as_junit(result: RunResult) -> ET.ElementTree:
    """JUnit XML: one ``testsuite`` per op, one ``testcase`` per record (``kind/case``)."""
    root = ET.Element("testsuites", name=f"rlkernel-conformance-{result.backend}")
    suites: dict[str, ET.Element] = {}
    for r in result.records:
        suite = suites.get(r.op)
        if suite is None:
            suite = suites[r.op] = ET.SubElement(root, "testsuite", name=r.op)
        tc = ET.SubElement(suite, "testcase", name=f"{r.kind}/{r.case}",
                           classname=f"rlkernel.conformance.{result.backend}.{r.op}", time=f"{r.seconds:.6f}")
        if r.status == "fail":
            ET.SubElement(tc, "failure", type="fail", message=r.detail[:500]).text = f"{r.detail}\n{r.repro}"
        elif r.status == "not_supported":
            ET.SubElement(tc, "failure", type="not_supported", message=r.detail[:500]).text = r.detail
        elif r.status == "error":
            ET.SubElement(tc, "error", type="error", message=r.detail[:500]).text = f"{r.detail}\n{r.repro}"
    for suite in root:
        cases = list(suite)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
        suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    s = result.summary()
    root.set("tests", str(len(result.records)))
    root.set("failures", str(s["fail"] + s["not_supported"]))
    root.set("errors", str(s["error"]))
    return ET.ElementTree(root)


def write(result: RunResult, out_dir: Path, command: list[str] | None = None) -> dict[str, Path]:
    """Write ``report.json``, ``report.md`` and ``junit.xml`` into ``out_dir`` (created if needed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "junit": out_dir / "junit.xml"}
    paths["json"].write_text(json.dumps(as_json(result, command), indent=2) + "\n")
    paths["md"].write_text(as_markdown(result))
    tree = as_junit(result)
    ET.indent(tree)
    tree.write(paths["junit"], encoding="utf-8", xml_declaration=True)
    return paths
