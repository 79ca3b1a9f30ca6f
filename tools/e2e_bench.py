"""End to end (issue 12): rollout tokens/s and the trainer step, rlkernel's exact ops vs torch's own.

Rollout: one engine (``rlkernel.rollout.LLM``: scheduler, block manager, paged KV cache, CUDA
graphs for decode) run twice in this process on the same random weights and prompts, first with
``ops="rlkernel"`` (the exact ops) and then with ``ops="native"`` (cuBLAS bf16, SDPA, torch
sampling: :mod:`rlkernel.rollout.native_ops`), so the ratio compares the ops and nothing else.
Each side builds its engine (CUDA graphs captured), runs a warm-up generate of 2 tokens per
prompt (compiles the prefill and sampling paths), then one timed generate of ``--prompts``
prompts of ``--prompt-len`` random tokens, ``--new-tokens`` sampled tokens each (eos ignored).
tokens/s = sampled tokens / wall seconds of that generate; the decode-only rate comes from the
engine's stats. Ratio = rlkernel tokens/s / native tokens/s (= native time / rlkernel time, the
``rlkernel bench`` convention; issue 12's goal: >= 0.6).

Trainer step: one GRPO-shaped update on a packed batch (``tools/train_step_time.py``'s two
sides: rlkernel's exact backward + ExactGradients + AdamW contract vs transformers bf16 + torch
AdamW), ratio = plain step / rlkernel step (goal: >= 0.3). It can run at fewer layers than the
rollout (``--train-layers``): the exact gradient states of all 28 layers need ~96 GB.

On the H200 (Qwen3-0.6B shapes, ~3 minutes)::

    python tools/e2e_bench.py --config qwen3-0.6b --prompts 256 --prompt-len 64 --new-tokens 128 \\
        --train-layers 4 --train-seqs 4 --train-len 256 --train-steps 1 --device cuda --out e2e-h200

On a CPU (the test's sizes)::

    python tools/e2e_bench.py --config tiny --prompts 4 --prompt-len 8 --new-tokens 4 --train-seqs 2 \\
        --train-len 16 --device cpu --out /tmp/e2e

Writes ``e2e.json`` and ``e2e.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step_time  # noqa: E402  (tools/train_step_time.py: the trainer step's two sides)

ROLLOUT_GOAL, TRAIN_GOAL = 0.6, 0.3


def random_model(config: Any, device: torch.device, seed: int = 0, std: float = 0.02) -> Any:
    """A :class:`Qwen3ForCausalLM` with N(0, std) weights and unit norm gains, drawn on ``device`` (fast at 0.6B).

    The values only shape the sampled distributions; neither side depends on them otherwise.
    """
    from rlkernel.model import Qwen3ForCausalLM

    model = Qwen3ForCausalLM(config, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g, device=device, dtype=torch.float32).mul_(std))
    return model.eval()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rollout_side(model: Any, ops: str, prompts: list[list[int]], new_tokens: int, args: argparse.Namespace,
                 device: torch.device) -> dict[str, Any]:
    """Build the engine with ``ops``, warm it up, time one generate: tokens/s and the engine's stats."""
    from rlkernel.rollout import LLM, SamplingParams

    block_size = 16
    max_len = len(prompts[0]) + new_tokens
    t0 = time.perf_counter()
    llm = LLM(model, num_blocks=len(prompts) * -(-max_len // block_size) + 8, block_size=block_size,
              max_num_seqs=len(prompts), max_num_batched_tokens=max(2048, len(prompts) * len(prompts[0])),
              max_model_len=max_len, enforce_eager=args.enforce_eager, seed=0, ops=ops)  # type: ignore[arg-type]
    _sync(device)
    setup = time.perf_counter() - t0
    params = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, ignore_eos=True, seed=1)
    llm.generate(prompts, SamplingParams(max_tokens=2, **params))  # type: ignore[arg-type]
    before = dict(llm.stats)
    graphs = llm.model_runner.graphs
    replays = graphs.replays if graphs is not None else 0
    _sync(device)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=new_tokens, **params))  # type: ignore[arg-type]
    _sync(device)
    seconds = time.perf_counter() - t0
    stats = {k: llm.stats[k] - before[k] for k in llm.stats}
    tokens = sum(len(o.token_ids) for o in outs)
    captured = graphs is not None
    replayed = graphs.replays - replays if graphs is not None else 0
    del llm, outs, graphs
    gc.collect()  # the engine's KV cache and graph pools go before the next side allocates its own
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "ops": ops, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "setup_s": setup,
        "decode_tokens_per_s": stats["decode_tokens"] / stats["decode_seconds"] if stats["decode_seconds"] else None,
        "prefill_tokens_per_s": stats["prefill_tokens"] / stats["prefill_seconds"] if stats["prefill_seconds"]
        else None,
        "steps": int(stats["steps"]), "preemptions": int(stats["preemptions"]),
        "cuda_graphs": captured, "graph_replays": replayed,
    }


def trainer(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """The trainer step's two sides (``tools/train_step_time.py``) at the ``--train-*`` sizes."""
    config = train_step_time.qwen3_config(args.config, args.train_layers or args.layers)
    model = random_model(config, device)
    prompts, comps, adv = train_step_time.step_batch(config.vocab_size, args.train_seqs, args.train_len, device)
    out: dict[str, Any] = {"layers": config.num_hidden_layers, "seqs": args.train_seqs, "len": args.train_len,
                           "steps": args.train_steps}
    out["rlkernel"] = train_step_time.time_ours(model, prompts, comps, adv, args.train_steps, device)
    try:
        out["plain"] = train_step_time.time_plain(model, prompts, comps, adv, args.train_steps, device)
    except ImportError as e:  # transformers missing: say so in the report
        out["plain"] = {"skipped": str(e)}
        return out
    out["ratio"] = out["plain"]["median_s"] / out["rlkernel"]["median_s"]
    return out


def markdown(r: dict[str, Any]) -> str:
    ro = r["rollout"]
    lines = [
        f"# End to end: rlkernel vs torch's own ops ({r['config']}, {r['layers']} layers, {r['device_name']})",
        "",
        f"torch {r['torch']}, host {r.get('host', '?')}, command: `{r['command']}`",
        "",
    ]
    if "ratio" in ro:
        lines += _rollout_lines(r, ro)
    lines += _trainer_lines(r.get("trainer"))
    return "\n".join(lines) + "\n"


def _rollout_lines(r: dict[str, Any], ro: dict[str, Any]) -> list[str]:
    lines = [
        f"## Rollout: {r['prompts']} prompts x {r['prompt_len']} tokens, {r['new_tokens']} sampled tokens each "
        f"(T = {r['temperature']}, top-k {r['top_k']}, top-p {r['top_p']})",
        "",
        "| ops | tokens/s | decode tokens/s | prefill tokens/s | seconds | steps | CUDA graphs (replays) | setup s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for side in ("rlkernel", "native"):
        s = ro[side]

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:,.0f}"

        lines.append(f"| {side} | {f(s['tokens_per_s'])} | {f(s['decode_tokens_per_s'])} | "
                     f"{f(s['prefill_tokens_per_s'])} | {s['seconds']:.2f} | {s['steps']} | "
                     f"{'on' if s['cuda_graphs'] else 'off'} ({s['graph_replays']}) | {s['setup_s']:.1f} |")
    lines += ["", f"Ratio rlkernel / native tokens/s: **{ro['ratio']:.3f}** (goal >= {ROLLOUT_GOAL}: "
              f"{'met' if ro['ratio'] >= ROLLOUT_GOAL else 'missed'})", ""]
    return lines


def _trainer_lines(tr: dict[str, Any] | None) -> list[str]:
    lines: list[str] = []
    if tr is not None:
        lines += [f"## Trainer step: {tr['seqs']} sequences x {tr['len']} tokens, {tr['layers']} layers, median of "
                  f"{tr['steps']} after a warm-up", "", "| side | step s | peak GiB |", "|---|---|---|"]
        for side in ("rlkernel", "plain"):
            s = tr[side]
            if "skipped" in s:
                lines.append(f"| {side} | skipped: {s['skipped']} | |")
            else:
                peak = "-" if s["peak_gib"] is None else f"{s['peak_gib']:.1f}"
                lines.append(f"| {side} | {s['median_s']:.3f} | {peak} |")
        if "ratio" in tr:
            lines += ["", f"Ratio plain / rlkernel step: **{tr['ratio']:.4f}** (goal >= {TRAIN_GOAL}: "
                      f"{'met' if tr['ratio'] >= TRAIN_GOAL else 'missed'})"]
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="qwen3-0.6b", help="a rlkernel.validate.models.CONFIGS name")
    p.add_argument("--layers", type=int, help="override num_hidden_layers (the widths stay)")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs on either side")
    p.add_argument("--sides", default="rlkernel,native", help="rollout sides to run (\"\": the trainer step only)")
    p.add_argument("--train-layers", type=int, help="layers of the trainer-step model (default: --layers)")
    p.add_argument("--train-seqs", type=int, default=4)
    p.add_argument("--train-len", type=int, default=256, help="tokens per sequence (half prompt, half completion)")
    p.add_argument("--train-steps", type=int, default=1)
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", required=True, help="directory for e2e.json and e2e.md")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    config = train_step_time.qwen3_config(args.config, args.layers)
    from rlkernel import environment

    result: dict[str, Any] = {
        "command": "python tools/e2e_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": args.config, "layers": config.num_hidden_layers, "prompts": args.prompts,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "temperature": args.temperature,
        "top_k": args.top_k, "top_p": args.top_p, "device": str(device), "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        # both sides' steps are partly host time (ours more): the host is part of the measurement
        "host": f"{environment.cpu_model() or platform.machine()}, {os.cpu_count()} CPUs",
    }
    model = random_model(config, device)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    rollout: dict[str, Any] = {}
    with torch.inference_mode():
        for side in [x for x in args.sides.split(",") if x]:
            rollout[side] = rollout_side(model, side, prompts, args.new_tokens, args, device)
            print(f"rollout {side}: {rollout[side]['tokens_per_s']:,.0f} tokens/s", flush=True)
    if "rlkernel" in rollout and "native" in rollout:
        rollout["ratio"] = rollout["rlkernel"]["tokens_per_s"] / rollout["native"]["tokens_per_s"]
    result["rollout"] = rollout
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if not args.skip_train:
        result["trainer"] = trainer(args, device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps(result, indent=2) + "\n")
    if "ratio" in rollout or "trainer" in result:
        (out / "e2e.md").write_text(markdown(result))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
