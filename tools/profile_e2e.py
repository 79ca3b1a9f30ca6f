"""Where the end-to-end time goes (issue 12): GPU kernels of a rollout's decode steps and of one trainer step.

``tools/e2e_bench.py`` gives the two ratios; this gives the profile behind them, one
``torch.profiler`` run per part, grouped by GPU kernel name (device time summed over the run):

- **rollout**: the engine of :mod:`rlkernel.rollout` in eager mode (CUDA graphs hide the kernels
  from the profiler; their device time is the same) over ``--prompts`` prompts and
  ``--new-tokens`` tokens, once with ``ops="rlkernel"`` and once with ``ops="native"``;
- **train**: one rlkernel trainer step (``tools/train_step_time.py``'s ``time_ours``, after its
  warm-up step), kernels and the autograd nodes / ``rlkernel`` phases that launched them.

Writes ``profile_e2e.json`` and ``profile_e2e.md`` (top kernels per part) to ``--out``::

    python tools/profile_e2e.py --config qwen3-0.6b --prompts 256 --prompt-len 64 --new-tokens 8 \\
        --train-layers 4 --train-seqs 4 --train-len 256 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_bench  # noqa: E402
import train_step_time  # noqa: E402

TOP = 40


def _kernels(prof: Any) -> list[dict[str, Any]]:
    """GPU kernels of a finished profile: name, calls, total device ms, sorted by total."""
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in prof.events():  # kernels and copies; not the user ranges (phase:..., Optimizer.step#...) on the GPU lane
        if ev.device_type == torch.autograd.DeviceType.CUDA and not getattr(ev, "is_user_annotation", False):
            total[ev.name] += ev.device_time_total / 1e3 if hasattr(ev, "device_time_total") else ev.cuda_time / 1e3
            calls[ev.name] += 1
    rows = [{"kernel": k[:160], "calls": calls[k], "ms": round(v, 3)} for k, v in total.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def _ops(prof: Any) -> list[dict[str, Any]]:
    """CPU-side ranges (autograd nodes, rlkernel ops, aten ops) with the device time of the kernels under them."""
    rows = []
    for e in prof.key_averages():
        dev = getattr(e, "device_time_total", None)
        if dev is None:
            dev = e.cuda_time_total
        if dev <= 0:
            continue
        rows.append({"range": e.key[:160], "calls": e.count, "device_ms": round(dev / 1e3, 3),
                     "cpu_ms": round(e.cpu_time_total / 1e3, 3)})
    return sorted(rows, key=lambda r: -r["device_ms"])


def _profile(fn: Any, device: torch.device) -> Any:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    e2e_bench._sync(device)
    with profile(activities=acts) as prof:
        fn()
        e2e_bench._sync(device)
    return prof


def _minus(full: list[dict[str, Any]], part: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Kernels of ``full`` less those of ``part`` (by name): the decode steps' share of a generate."""
    sub = {r["kernel"]: r for r in part}
    rows = []
    for r in full:
        s = sub.get(r["kernel"], {"calls": 0, "ms": 0.0})
        rows.append({"kernel": r["kernel"], "calls": r["calls"] - s["calls"], "ms": round(r["ms"] - s["ms"], 3)})
    return sorted(rows, key=lambda r: -r["ms"])


def _generate(llm: Any, prompts: list[list[int]], params: Any, n: int) -> None:
    llm.generate(prompts, params(max_tokens=n, temperature=1.0, ignore_eos=True, seed=1))


def rollout(model: Any, ops: str, prompts: list[list[int]], args: argparse.Namespace,
            device: torch.device) -> dict[str, Any]:
    """Kernels of a generate of one token (the prefill) and of ``--new-tokens`` (prefill + decode steps)."""
    from rlkernel.rollout import LLM, SamplingParams

    max_len = len(prompts[0]) + args.new_tokens
    llm = LLM(model, num_blocks=len(prompts) * -(-max_len // 16) + 8, block_size=16, max_num_seqs=len(prompts),
              max_num_batched_tokens=max(2048, len(prompts) * len(prompts[0])), max_model_len=max_len,
              enforce_eager=True, seed=0, ops=ops)  # type: ignore[arg-type]

    _generate(llm, prompts, SamplingParams, 2)  # warm-up: compiles
    prefill = _kernels(_profile(functools.partial(_generate, llm, prompts, SamplingParams, 1), device))
    full = _kernels(_profile(functools.partial(_generate, llm, prompts, SamplingParams, args.new_tokens), device))
    decode = _minus(full, prefill)
    del llm
    if device.type == "cuda":
        torch.cuda.empty_cache()
    steps = args.new_tokens - 1
    return {"ops": ops, "prefill_ms": round(sum(r["ms"] for r in prefill), 3), "decode_steps": steps,
            "decode_ms_per_step": round(sum(r["ms"] for r in decode) / max(steps, 1), 3),
            "prefill": prefill[:TOP], "decode": decode[:TOP]}


def _host_profile(fn: Any) -> list[dict[str, Any]]:
    """cProfile of ``fn()``: the functions with the most cumulative host seconds (what the step's
    Python, validation and launches cost, the device time being hidden under them or not)."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    fn()
    pr.disable()
    stats = pstats.Stats(pr)
    rows = []
    for (file, line, name), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{Path(file).parent.name}/{Path(file).name}:{line}({name})" if line else name
        rows.append({"function": where[:160], "calls": calls, "tottime_ms": round(tottime * 1e3, 2),
                     "cumtime_ms": round(cumtime * 1e3, 2)})
    rows.sort(key=lambda r: -r["cumtime_ms"])
    return rows[:3 * TOP]


def train_phases(model: Any, acc: Any, opt: Any, prompts: list[list[int]], comps: list[list[int]],
                 adv: torch.Tensor, device: torch.device) -> dict[str, float]:
    """One rlkernel trainer step (``train_step_time.time_ours``'s body) with the seconds of each phase,
    on the accumulators ``acc`` and the optimizer ``opt`` of the steps before it (a steady step)."""
    from rlkernel.rl import clip_grad_norm_, ppo_loss
    from rlkernel.train.grpo import completion_logprobs

    n_tok = sum(len(c) for c in comps)
    params = list(model.parameters())
    phases: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:  # wall seconds, and a "phase:<name>" range in a profile
        t0 = time.perf_counter()
        with torch.profiler.record_function(f"phase:{name}"):
            yield
            e2e_bench._sync(device)
        phases[name] = round(phases.get(name, 0.0) + time.perf_counter() - t0, 4)

    with phase("zero_states"):
        acc.zero()
    with phase("forward_logprobs"):
        logp = completion_logprobs(model, prompts, comps, 1.0, device)
    with phase("loss"):
        lp = logp.reshape(len(comps), -1)
        mask = torch.ones(lp.shape, dtype=torch.bool, device=device)
        loss = ppo_loss(lp, lp.detach(), adv, mask, denominator=n_tok)
    with phase("backward"):
        loss.backward()
    with phase("finish_states"):
        acc.finish()
    with phase("clip"):
        clip_grad_norm_(params, 1.0)
    with phase("adamw"):
        opt.step()
    phases["step"] = round(sum(phases.values()), 4)
    return phases


def train(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    """Phase seconds of the trainer step at the ``--train-*`` sizes (warm), and a kernel profile of a
    small one (``--profile-layers``, ``--profile-seqs`` sequences of ``--profile-len``; the defaults keep the
    trace small, the ``--train-*`` sizes profile the whole step)."""
    from rlkernel import grads
    from rlkernel.rl import AdamW

    out: dict[str, Any] = {"layers": args.train_layers, "seqs": args.train_seqs, "len": args.train_len}

    def steady(layers: int, seqs: int, length: int, profiled: bool) -> tuple[dict[str, float], dict[str, float], Any]:
        """(warm-up step's phases, a steady step's phases, its profile or None) on one model and one
        set of accumulators and optimizer states, as ``train_step_time.time_ours`` runs them."""
        config = train_step_time.qwen3_config(args.config, layers)
        model = e2e_bench.random_model(config, device)
        prompts, comps, adv = train_step_time.step_batch(config.vocab_size, seqs, length, device)
        model.requires_grad_(True)
        params = list(model.parameters())
        acc, opt = grads.ExactGradients(params), AdamW(params, lr=1e-6)
        prof = None
        try:
            warm = train_phases(model, acc, opt, prompts, comps, adv, device)
            phases = train_phases(model, acc, opt, prompts, comps, adv, device)
            if profiled:
                prof = _profile(functools.partial(train_phases, model, acc, opt, prompts, comps, adv, device), device)
            if args.host_profile and not out.get("host"):  # the host's Python time of one more steady step
                out["host"] = _host_profile(functools.partial(train_phases, model, acc, opt, prompts, comps, adv,
                                                              device))
        finally:
            acc.remove()
            model.requires_grad_(False)
        del model, acc, opt
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return warm, phases, prof

    same = (args.profile_layers, args.profile_seqs, args.profile_len) == \
        (args.train_layers, args.train_seqs, args.train_len)
    out["warmup_phases_s"], out["phases_s"], prof = steady(args.train_layers, args.train_seqs, args.train_len, same)
    if not same:
        _, _, prof = steady(args.profile_layers, args.profile_seqs, args.profile_len, True)
    kernels = _kernels(prof)
    out["profile"] = {"layers": args.profile_layers, "seqs": args.profile_seqs, "len": args.profile_len,
                      "device_ms": round(sum(r["ms"] for r in kernels), 3), "kernels": kernels[:TOP],
                      "ranges": _ops(prof)[:2 * TOP]}
    return out


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Profile: {r['config']} on {r['device_name']}", "", f"Command: `{r['command']}`", ""]
    for part in r.get("rollout", []):
        lines += [f"## Rollout, ops={part['ops']}: decode {part['decode_ms_per_step']:.2f} ms of kernels per step "
                  f"({part['decode_steps']} steps), prefill {part['prefill_ms']:.1f} ms", "",
                  "| decode kernel | calls | ms (all steps) |", "|---|---:|---:|"]
        lines += [f"| `{k['kernel']}` | {k['calls']} | {k['ms']:.2f} |" for k in part["decode"]]
        lines += ["", "| prefill kernel | calls | ms |", "|---|---:|---:|"]
        lines += [f"| `{k['kernel']}` | {k['calls']} | {k['ms']:.2f} |" for k in part["prefill"]]
        lines.append("")
    if "train" in r:
        t = r["train"]
        lines += [f"## Trainer step (rlkernel), {t['layers']} layers, {t['seqs']} x {t['len']} tokens: phases", "",
                  "| phase | s (warm-up step) | s |", "|---|---:|---:|"]
        lines += [f"| {k} | {t['warmup_phases_s'].get(k, 0):.3f} | {v:.3f} |" for k, v in t["phases_s"].items()]
        t = t["profile"]
        lines += ["", f"### Kernel profile, {t['layers']} layers, {t['seqs']} x {t['len']} tokens: "
                  f"{t['device_ms']:.1f} ms of kernels", "",
                  "| kernel | calls | ms |", "|---|---:|---:|"]
        lines += [f"| `{k['kernel']}` | {k['calls']} | {k['ms']:.2f} |" for k in t["kernels"]]
        lines += ["", "| range | calls | device ms | cpu ms |", "|---|---:|---:|---:|"]
        lines += [f"| `{k['range']}` | {k['calls']} | {k['device_ms']:.2f} | {k['cpu_ms']:.1f} |" for k in t["ranges"]]
        if r["train"].get("host"):
            lines += ["", "### Host (cProfile) of one steady step: most cumulative time", "",
                      "| function | calls | own ms | cumulative ms |", "|---|---:|---:|---:|"]
            lines += [f"| `{k['function']}` | {k['calls']} | {k['tottime_ms']:.1f} | {k['cumtime_ms']:.1f} |"
                      for k in r["train"]["host"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="qwen3-0.6b")
    p.add_argument("--layers", type=int)
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--train-layers", type=int, default=4)
    p.add_argument("--train-seqs", type=int, default=4)
    p.add_argument("--train-len", type=int, default=256)
    p.add_argument("--profile-layers", type=int, default=1)
    p.add_argument("--profile-len", type=int, default=64)
    p.add_argument("--profile-seqs", type=int, default=2, help="sequences of the profiled step (the full step's "
                   "--train-seqs profiles every kernel of it; the default keeps the trace small)")
    p.add_argument("--parts", default="rlkernel,native,train")
    p.add_argument("--host-profile", action="store_true", help="also one steady trainer step under cProfile")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    parts = args.parts.split(",")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    out: dict[str, Any] = {"config": args.config, "device_name": name,
                           "command": "python tools/profile_e2e.py " + " ".join(argv or sys.argv[1:])}
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)

    def write() -> None:  # after every part: a part cut by a time limit keeps the ones before
        (dest / "profile_e2e.json").write_text(json.dumps(out, indent=1))
        (dest / "profile_e2e.md").write_text(markdown(out))

    rollout_ops = [o for o in ("rlkernel", "native") if o in parts]
    if rollout_ops:
        config = train_step_time.qwen3_config(args.config, args.layers)
        model = e2e_bench.random_model(config, device)
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, config.vocab_size, (args.prompt_len,), generator=g).tolist()
                   for _ in range(args.prompts)]
        out["rollout"] = []
        for ops in rollout_ops:
            out["rollout"].append(rollout(model, ops, prompts, args, device))
            write()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "train" in parts:
        out["train"] = train(args, device)
        write()
    print(markdown(out))
    return out


if __name__ == "__main__":
    main()
