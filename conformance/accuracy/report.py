"""Reports of an accuracy run: ``accuracy.json`` (machines) and ``accuracy.md`` (people)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import torch

from rlkernel.conformance.accuracy.metrics import ULP_BUCKETS, fmt
from rlkernel.environment import describe, git_commit


def document(rows: list[dict[str, Any]], device: torch.device, size: str, command: list[str] | None) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {
        "device": str(device), "size": size, "commit": git_commit(), "command": command,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": describe(device), "summary": counts, "rows": rows,
    }


def _ulps(metrics: dict[str, Any]) -> str:
    hist = metrics.get("ulp") or {}
    total = sum(hist.values())
    if not total:
        return ""
    return " / ".join(f"{100.0 * hist[b] / total:.1f}" for b in ULP_BUCKETS)


def markdown(doc: dict[str, Any]) -> str:
    """Per op: one table row per (data set, implementation), the verdict on rlkernel's row."""
    env = doc["environment"]
    lines = [
        f"# Accuracy against float64 ({doc['size']} sizes, {doc['device']})", "",
        f"Commit `{doc['commit']}`, command `{' '.join(doc['command'] or [])}`, torch {env.get('torch')}, "
        f"{env.get('gpu_name') or env.get('cpu_model')}.", "",
        "Rule: on every data set rlkernel's primary metric is no larger than the native kernel's "
        "(the one a user would otherwise run, on the same device); within 0.5 % counts as equal (two "
        "kernels at the output rounding floor differ by one ulp on a few outputs in 10^4). *ulp %* is "
        "the share of outputs "
        "0 / 1 / 2-3 / 4-15 / >=16 ulps (of the output dtype) from the correctly rounded truth.", "",
        "Summary: " + ", ".join(f"{n} {s}" for s, n in sorted(doc["summary"].items())), "",
    ]
    op = None
    for row in doc["rows"]:
        if row["op"] != op:
            op = row["op"]
            lines += [f"## {op}", "", "| data set | shape | implementation | primary metric | rel L2 | max rel | "
                      "median rel | ulp % | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        if row.get("error"):
            lines.append(f"| {row['dataset']} | {row['shape']} | | | | | | | error: {row['error']} |")
            continue
        v = row["verdict"]
        for res in row["results"]:
            m = res["metrics"]
            native = " (native)" if res["native"] else ""
            verdict = ""
            if res["impl"] == "rlkernel":
                verdict = f"**{row['status']}** ({fmt(v['ratio'])}x native)"
            metric = f"{row['metric']} {fmt(m.get(row['metric'], 0.0))}"
            lines.append(f"| {row['dataset']} | {row['shape']} | {res['impl']}{native} | {metric} | "
                         f"{fmt(m.get('rel_l2', 0.0)) if 'rel_l2' in m else ''} | "
                         f"{fmt(m['max_rel']) if 'max_rel' in m else ''} | "
                         f"{fmt(m['median_rel']) if 'median_rel' in m else ''} | {_ulps(m)} | {verdict} |")
        if row.get("exception"):
            lines.append(f"| | | *exception*: {row['exception']} | | | | | | |")
    exceptions = [r for r in doc["rows"] if r["status"] in ("exception", "below native")]
    if exceptions:
        lines += ["", "## Data sets where rlkernel is less accurate than the native kernel", ""]
        for r in exceptions:
            v = r["verdict"]
            lines.append(f"- {r['op']}/{r['dataset']}: {r['metric']} {fmt(v['rlkernel'])} vs native {fmt(v['native'])} "
                         f"({fmt(v['ratio'])}x)" + (f" — {r['exception']}" if r.get("exception") else ""))
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "accuracy.json", "md": out / "accuracy.md"}
    paths["json"].write_text(json.dumps(doc, indent=1) + "\n")
    paths["md"].write_text(markdown(doc))
    return paths
