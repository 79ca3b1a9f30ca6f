"""Reports of a validate run: ``report.json`` (machines) and ``report.md`` (people), and the CLI summary."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import torch

from rlkernel.environment import describe, git_commit

__all__ = ["document", "markdown", "summary", "write"]


def document(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (from :func:`rlkernel.validate.run.run`) with commit, creation time and environment added."""
    return {"commit": git_commit(), "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "environment": describe(torch.device(doc["device"])), **doc}


def _g(v: float | None, spec: str = ".3g") -> str:
    return "" if v is None else format(v, spec)


def _ratio_cells(r: dict[str, Any]) -> str:
    q = r["ratio"]
    return f"{_g(q['max'])} | {_g(q['p50'])} | {_g(q['p99'])} | {_g(q['mean'])}"


def summary(doc: dict[str, Any]) -> list[str]:
    """A few lines for the terminal: verdict, mismatches next to the baseline's, hashes, timing ratios."""
    s, h, m = doc["summary"], doc["hashes"], doc["model"]
    lines = [f"model: {m['source']}, {m['dtype']} on {doc['device']}, {m['parameters']:,} parameters, "
             f"sha256 {m['model_sha256'][:16]}",
             f"rollout: {h['sequences']} sequences, {h['tokens']} completion tokens; logprobs sha256 "
             f"{h['logprobs_sha256']}"]
    if len(doc["rollouts"]) > 1:
        lines.append(f"engine batches {', '.join(r['name'] for r in doc['rollouts'])}: "
                     + ("same tokens and log-probs" if s["engine_invariance"] else "DIFFERENT tokens or log-probs"))
    for r in doc["replays"]:
        lines.append(f"rlkernel   {r['rollout']}, trainer micro-batch {r['micro_batch_size']}: {r['mismatches']} of "
                     f"{r['tokens']} tokens mismatch, max |ratio-1| {_g(r['ratio']['max'])}")
    if doc["baseline"] is not None:
        b = doc["baseline"]
        for r in b["replays"]:
            lines.append(f"transformers {b['dtype']}, trainer micro-batch {r['micro_batch_size']}: {r['mismatches']} "
                         f"of {r['tokens']} tokens mismatch, |ratio-1| max {_g(r['ratio']['max'])} p50 "
                         f"{_g(r['ratio']['p50'])} p99 {_g(r['ratio']['p99'])} mean {_g(r['ratio']['mean'])}")
    for t in doc["timing"]["rollout"]:
        if t["baseline_tokens_per_s"]:
            lines.append(f"rollout tokens/s ({t['rollout']}): rlkernel {_g(t['tokens_per_s'], ',.0f')}, transformers "
                         f"{_g(t['baseline_tokens_per_s'], ',.0f')} (ratio {_g(t['ratio'])})")
    for t in doc["timing"]["trainer"]:
        if t["baseline_seconds"]:
            lines.append(f"trainer forward s (micro-batch {t['micro_batch_size']}): rlkernel {_g(t['seconds'])}, "
                         f"transformers {_g(t['baseline_seconds'])} (ratio {_g(t['ratio'])})")
    if doc["layers"] is not None:
        fd = doc["layers"]["first_difference"]
        lines.append(f"layers: all {len(doc['layers']['ops'])} ops equal on {doc['layers']['tokens']} tokens"
                     if fd is None else f"layers: first difference at {_op_name(fd)} (sequence {fd['first_token'][0]}, "
                     f"position {fd['first_token'][1]}; {fd['differing_elements']} values)")
    lines.append(f"{'OK' if doc['ok'] else 'FAILED'}: {s['mismatches']} mismatches in {s['tokens_compared']} "
                 f"replayed tokens" + ("" if s["baseline_mismatches"] is None
                                       else f" (transformers: up to {s['baseline_mismatches']})"))
    return lines


def _op_name(op: dict[str, Any]) -> str:
    return op["op"] if op["layer"] is None else f"layer {op['layer']} {op['op']}"


def markdown(doc: dict[str, Any]) -> str:
    """The report for people: settings, rollout hashes, ours next to the baseline, timing, layers."""
    env, m = doc["environment"], doc["model"]
    where = env.get("gpu_name") or env.get("cpu_model")
    lines = [
        f"# rlkernel validate: {'OK' if doc['ok'] else 'FAILED'}", "",
        f"Commit `{doc['commit']}`, command `{' '.join(doc['command'] or [])}`, {doc['created']}.", "",
        f"Device {doc['device']} ({where}), torch {env.get('torch')}, triton {env.get('triton')}, "
        f"python {env.get('python')}, {env.get('platform')}.", "",
        f"Model: {m['source']}, {m['dtype']}, {m['parameters']:,} parameters; weights sha256 `{m['model_sha256']}`, "
        f"config sha256 `{m['config_sha256']}`.", "",
        "## Rollout", "",
        "| rollout | sequences | completion tokens | tokens/s | finish reasons | log-probs sha256 |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["rollouts"]:
        reasons = ", ".join(f"{k} {v}" for k, v in r["finish_reasons"].items())
        lines.append(f"| {r['name']} | {r['sequences']} | {r['tokens']} | {_g(r['engine'].get('tokens_per_s'), ',.0f')}"
                     f" | {reasons} | `{r['logprobs_sha256']}` |")
    if len(doc["rollouts"]) > 1:
        lines += ["", "Every engine batch size gave " + ("the same tokens and log-probs." if
                                                          doc["engine_invariance"]["ok"] else
                                                          "**different** tokens or log-probs.")]
    lines += ["", "The log-probs sha256 is over the float32 bytes of every completion log-prob in output order: "
              "the same configuration and seeds give the same hash on every backend and device.", "",
              "## Rollout vs trainer log-probs", "",
              "Mismatches: completion tokens whose trainer log-prob has other float32 bits than the rollout's. "
              "|ratio-1|: `|exp(trainer - rollout) - 1|` of an unchanged policy (0 when bitwise equal).", "",
              "| path | rollout | trainer micro-batch | tokens | mismatches | max | p50 | p99 | mean | trainer s |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["replays"]:
        lines.append(f"| rlkernel | {r['rollout']} | {r['micro_batch_size']} | {r['tokens']} | **{r['mismatches']}** | "
                     f"{_ratio_cells(r)} | {_g(r['seconds'])} |")
    b = doc["baseline"]
    if b is not None:
        for r in b["replays"]:
            lines.append(f"| transformers {b['dtype']} ({b['attn_implementation']}) | generate, batch "
                         f"{b['engine_batch']} | {r['micro_batch_size']} | {r['tokens']} | **{r['mismatches']}** | "
                         f"{_ratio_cells(r)} | {_g(r['seconds'])} |")
        lines += ["", "transformers samples its own completions (its random generator), so its token counts "
                  "and hashes differ from ours; each side compares its own rollout with its own trainer forward."]
    else:
        lines += ["", "No baseline (`--baseline none`, or transformers is not installed)."]
    first = [r for r in doc["replays"] if r["first_mismatches"]]
    if first:
        lines += ["", "First mismatching tokens (rlkernel):", ""]
        lines += [f"- {x}" for x in first[0]["first_mismatches"]]
    t = doc["timing"]
    if b is not None:
        lines += ["", "## Timing (same device, same run)", "",
                  "| what | rlkernel | transformers | ratio (rlkernel / transformers) |", "|---|---|---|---|"]
        for x in t["rollout"]:
            if x["baseline_tokens_per_s"]:
                lines.append(f"| rollout tokens/s, {x['rollout']} | {_g(x['tokens_per_s'], ',.0f')} | "
                             f"{_g(x['baseline_tokens_per_s'], ',.0f')} | {_g(x['ratio'])} |")
        for x in t["trainer"]:
            lines.append(f"| trainer forward s, micro-batch {x['micro_batch_size']} | {_g(x['seconds'])} | "
                         f"{_g(x['baseline_seconds'])} | {_g(x['ratio'])} |")
    if doc["layers"] is not None:
        L = doc["layers"]
        lines += ["", "## Layer by layer (rollout prefill + decode over the paged KV cache vs the packed trainer "
                  "forward)", ""]
        fd = L["first_difference"]
        if fd is None:
            lines.append(f"All {len(L['ops'])} ops have the same bits on {L['tokens']} tokens of {L['sequences']} "
                         f"sequences.")
        else:
            lines.append(f"First difference: **{_op_name(fd)}** (sequence {fd['first_token'][0]}, position "
                         f"{fd['first_token'][1]}); every op before it has the same bits.")
            lines += ["", "| op | tokens | differing tokens | differing values | max abs diff |",
                      "|---|---|---|---|---|"]
            for op in L["ops"]:
                if op["differing_elements"]:
                    lines.append(f"| {_op_name(op)} | {op['tokens']} | {op['differing_tokens']} | "
                                 f"{op['differing_elements']} | {_g(op['max_abs_diff'])} |")
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` (created); return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "md": out / "report.md"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["md"].write_text(markdown(doc))
    return paths
