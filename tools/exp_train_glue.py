"""Same-run A/B of the trainer step with the LM head backward's per-token glue and the partials' merge
on Triton kernels (the product's path) against the device-generic torch code they replace.

The "generic" side patches, for this process only, ``TritonSteps.token_terms`` / ``maxima_exponents`` /
``finish_hidden`` back to the generic ``Steps`` methods, the Triton ``masked_mean``'s partials merge
back to ``backends/generic/rl.py`` and ``attention``'s backward offsets back to device tensors (what
the product ran before). Both sides are the same
bits (the conformance suite checks the kernels); this measures only time. The sides alternate in
rounds (``--rounds``), each round ``--steps`` steps after a warm-up, and the plain side
(transformers + torch AdamW) runs once for the ratio.

Usage (on a GPU)::

    python tools/exp_train_glue.py OUT.json [--layers 4 --seqs 4 --len 256 --steps 5 --rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import e2e_bench  # noqa: E402
import train_step_time  # noqa: E402


@contextlib.contextmanager
def generic_glue() -> Iterator[None]:
    """The torch code the kernels replaced, for the duration of the block."""
    from rlkernel.backends.generic import rl as generic_rl
    from rlkernel.backends.generic import token_logprobs_backward as generic_tlb
    from rlkernel.backends.triton import rl as triton_rl
    from rlkernel.backends.triton import token_logprobs_backward as triton_tlb

    attention_op = importlib.import_module("rlkernel.ops.attention")  # the module (the package exports the function)

    steps = triton_tlb.TritonSteps
    saved = {name: getattr(steps, name) for name in ("token_terms", "maxima_exponents", "finish_hidden")}
    saved_merge = triton_rl._merge
    saved_offsets = attention_op.backward_offsets
    for name in saved:
        setattr(steps, name, getattr(generic_tlb.Steps, name))
    triton_rl._merge = lambda partials, denominator, partial: generic_rl.masked_mean(
        partials=partials, denominator=denominator, partial=partial)
    # the backward read the forward's device offsets again (a host read that waits for the GPU)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    attention_op.backward_offsets = lambda lens: tuple(t.to(device) for t in saved_offsets(lens))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(steps, name, fn)
        triton_rl._merge = saved_merge
        attention_op.backward_offsets = saved_offsets


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--config", default="qwen3-0.6b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seqs", type=int, default=4)
    p.add_argument("--len", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = train_step_time.qwen3_config(args.config, args.layers)
    model = e2e_bench.random_model(config, device)
    prompts, comps, adv = train_step_time.step_batch(config.vocab_size, args.seqs, args.len, device)
    runs: dict[str, list[float]] = {"kernels": [], "generic": []}
    for _ in range(args.rounds):
        for side in ("generic", "kernels"):
            ctx = generic_glue() if side == "generic" else contextlib.nullcontext()
            with ctx:
                r = train_step_time.time_ours(model, prompts, comps, adv, args.steps, device)
            runs[side] += r["steps_s"]
    plain = train_step_time.time_plain(model, prompts, comps, adv, args.steps, device)
    med = {side: statistics.median(t) for side, t in runs.items()}
    out = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
        "command": "python tools/exp_train_glue.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "layers": args.layers, "seqs": args.seqs, "len": args.len,
        "steps_s": runs, "median_s": med, "plain_median_s": plain["median_s"],
        "ratio": {side: plain["median_s"] / m for side, m in med.items()},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("median_s", "plain_median_s", "ratio")}, indent=1))
    return out


if __name__ == "__main__":
    main()
