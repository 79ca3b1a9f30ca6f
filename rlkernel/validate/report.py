"""Reports of a validate run: ``report.json`` (machines) and ``report.md`` (people), and the CLI summary."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import torch

from rlkernel.environment import describe, git_commit

__all__ = ["document", "markdown", "summary", "train_header", "train_row", "write"]


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
    if doc.get("mode") == "train":
        return _train_summary(doc)
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
    if doc.get("mode") == "train":
        return _train_markdown(doc)
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


# ---------------------------------------------------------------- the N-step training mode (--train-steps)
def train_header(baseline: bool) -> list[str]:
    """The per-step table's header lines (:func:`train_row` gives the rows)."""
    if not baseline:
        return [f"{'step':>5}  {'reward':>7}  {'mismatches':>14}  {'max|ratio-1|':>12}  {'loss':>10}  "
                f"{'grad norm':>9}  weights sha256"]
    return [f"{'':>5}  {'reward':^17}  {'mismatches (of tokens)':^27}  {'max |ratio-1|':^21}",
            f"{'step':>5}  {'ours':>8} {'ordinary':>8}  {'ours':>13} {'ordinary':>13}  {'ours':>10} "
            f"{'ordinary':>10}  ours weights sha256"]


def _of(m: dict[str, Any]) -> str:
    return f"{m['mismatches']}/{m['tokens']}"


def train_row(ours: dict[str, Any], base: dict[str, Any] | None) -> str:
    """One step of the table: ours (and the ordinary path's) reward, mismatches, max |ratio-1|."""
    if base is None:
        return (f"{ours['step']:>5}  {ours['reward']:>7.4f}  {_of(ours):>14}  {ours['max_ratio_dev']:>12.3g}  "
                f"{ours['loss']:>10.4g}  {ours['grad_norm']:>9.4g}  {ours['weights_sha256'][:16]}")
    return (f"{ours['step']:>5}  {ours['reward']:>8.4f} {base['reward']:>8.4f}  {_of(ours):>13} {_of(base):>13}  "
            f"{ours['max_ratio_dev']:>10.3g} {base['max_ratio_dev']:>10.3g}  {ours['weights_sha256'][:16]}")


def _train_summary(doc: dict[str, Any]) -> list[str]:
    s, m = doc["summary"], doc["model"]
    o, b = s["ours"], s["baseline"]
    lines = [f"model: {m['source']}, {m['dtype']} on {doc['device']}, {m['parameters']:,} parameters, initial "
             f"sha256 {m['initial_sha256'][:16]}",
             f"rlkernel: {s['steps']} steps, {o['mismatches']} of {o['tokens']} completion tokens mismatch "
             f"(rollout vs trainer, before each update), max |ratio-1| {_g(o['max_abs_ratio_minus_1'])}; reward "
             f"{_g(o['reward_first'], '.4f')} -> {_g(o['reward_last'], '.4f')}; final weights sha256 "
             f"{o['final_sha256']}"]
    if b is not None:
        lines.append(f"ordinary ({doc['baseline']['name']} {doc['baseline']['dtype']}, torch AdamW): "
                     f"{b['mismatches']} of {b['tokens']} tokens mismatch in {b['steps_with_mismatches']} of "
                     f"{s['steps']} steps, max |ratio-1| {_g(b['max_abs_ratio_minus_1'])}; reward "
                     f"{_g(b['reward_first'], '.4f')} -> {_g(b['reward_last'], '.4f')}; final weights sha256 "
                     f"{b['final_sha256']}")
    c = doc["micro_batch_check"]
    if c is not None:
        lines.append(f"micro-batch check {','.join(str(x) for x in c['sizes'])}: " + (
            "same final weights sha256" if c["ok"] else "DIFFERENT final weights: " + ", ".join(
                f"{r['micro_batch_size']}: {r['final_sha256'][:16]}" for r in c["runs"])))
    lines.append(f"{'OK' if doc['ok'] else 'FAILED'}: {o['mismatches']} mismatches in {s['steps']} steps"
                 + ("" if b is None else f" (ordinary path: {b['mismatches']})")
                 + ("" if c is None else f"; micro-batch check {'passed' if c['ok'] else 'FAILED'}"))
    return lines


def _train_markdown(doc: dict[str, Any]) -> str:
    env, m, s, g = doc["environment"], doc["model"], doc["summary"], doc["grpo"]
    where = env.get("gpu_name") or env.get("cpu_model")
    base = doc["baseline"]
    o = s["ours"]
    lines = [
        f"# rlkernel validate --train-steps {s['steps']}: {'OK' if doc['ok'] else 'FAILED'}", "",
        f"Commit `{doc['commit']}`, command `{' '.join(doc['command'] or [])}`, {doc['created']}.", "",
        f"Device {doc['device']} ({where}), torch {env.get('torch')}, triton {env.get('triton')}, "
        f"python {env.get('python')}, {env.get('platform')}.", "",
        f"Model: {m['source']}, {m['dtype']}, {m['parameters']:,} parameters; initial weights sha256 "
        f"`{m['initial_sha256']}`.", "",
        f"GRPO: {g['prompts_per_step']} prompts x {g['group_size']} completions per step, temperature "
        f"{g['temperature']}, AdamW lr {g['lr']} betas {tuple(g['betas'])} weight decay {g['weight_decay']}, clip "
        f"[1 - {g['clip_low']}, 1 + {g['clip_high']}], KL coef {g['kl_coef']}, {g['loss_agg_mode']}, micro-batch "
        f"{g['micro_batch_size'] or 'whole batch'}, grad clip {g['max_grad_norm']}.", "",
        f"**Final weights sha256 (rlkernel): `{o['final_sha256']}`**", "",
    ]
    if base is not None:
        lines += [f"Ordinary path: transformers `Qwen3ForCausalLM` {base['dtype']} ({base['attn_implementation']}), "
                  f"`generate` with its KV cache for the rollout, a full forward for the trainer, fp32 master "
                  f"weights with torch.optim.AdamW and `clip_grad_norm_`; same initial weights (sha256 "
                  f"`{base['initial_sha256']}`), prompts and rewards; its final weights sha256 "
                  f"`{s['baseline']['final_sha256']}`.", ""]
    else:
        lines += ["No ordinary path (`--baseline none`, or transformers is not installed).", ""]
    lines += ["Mismatches: completion tokens whose trainer log-prob, before the step's update, has other float32 "
              "bits than the rollout's; max |ratio-1|: `max |exp(trainer - rollout) - 1|` over them.", "",
              "## Per step", ""]
    if base is not None:
        lines += ["| step | reward (ours) | reward (ordinary) | mismatches (ours) | mismatches (ordinary) | "
                  "max \\|ratio-1\\| (ours) | max \\|ratio-1\\| (ordinary) | loss (ours) | grad norm (ours) | "
                  "weights sha256 (ours) |", "|---|---|---|---|---|---|---|---|---|---|"]
        for st in doc["steps"]:
            a, b = st["ours"], st["baseline"]
            lines.append(f"| {a['step']} | {a['reward']:.4f} | {b['reward']:.4f} | **{_of(a)}** | {_of(b)} | "
                         f"{_g(a['max_ratio_dev'])} | {_g(b['max_ratio_dev'])} | {_g(a['loss'], '.4g')} | "
                         f"{_g(a['grad_norm'], '.4g')} | `{a['weights_sha256'][:16]}` |")
    else:
        lines += ["| step | reward | mismatches | max \\|ratio-1\\| | loss | KL | grad norm | weights sha256 |",
                  "|---|---|---|---|---|---|---|---|"]
        for st in doc["steps"]:
            a = st["ours"]
            lines.append(f"| {a['step']} | {a['reward']:.4f} | **{_of(a)}** | {_g(a['max_ratio_dev'])} | "
                         f"{_g(a['loss'], '.4g')} | {_g(a['kl'], '.4g')} | {_g(a['grad_norm'], '.4g')} | "
                         f"`{a['weights_sha256'][:16]}` |")
    c = doc["micro_batch_check"]
    if c is not None:
        lines += ["", "## Micro-batch invariance", "",
                  "rlkernel again from the initial weights, once per micro-batch size: every run must end with "
                  "the main run's weights. " + ("**Same final weights sha256.**" if c["ok"] else
                                                 "**Different final weights.**"), "",
                  "| micro-batch | final weights sha256 | first step differing from the main run |", "|---|---|---|"]
        for r in c["runs"]:
            first = r["first_step_differing_from_main"]
            lines.append(f"| {r['micro_batch_size']} | `{r['final_sha256']}` | {'none' if first is None else first} |")
    lines += ["", "## Time", "", f"Whole run {_g(doc['seconds'])} s (both sides). rlkernel rollout "
              f"{_g(o['rollout_s'])} s, update {_g(o['train_s'])} s"
              + ("" if base is None else f"; ordinary rollout {_g(s['baseline']['rollout_s'])} s, update "
                                         f"{_g(s['baseline']['train_s'])} s") + "."]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` (created); return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "md": out / "report.md"}
    paths["json"].write_text(json.dumps(doc, indent=2, default=str) + "\n")
    paths["md"].write_text(markdown(doc))
    return paths
