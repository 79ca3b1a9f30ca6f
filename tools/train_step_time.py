"""Training step time: rlkernel (exact backward, exact accumulators, AdamW contract) vs plain PyTorch bf16.

Both sides run one GRPO-shaped update on the same weights and the same packed batch: forward
of prompt + completion, the completion tokens' log-probs, the PPO-clip token-mean loss,
backward, the global-norm clip and AdamW. Plain PyTorch is transformers' ``Qwen3ForCausalLM`` in
bfloat16 (SDPA attention, cuBLAS), full logits -> float32 log_softmax -> gather, torch.optim.AdamW
(fused where available) and torch's clip_grad_norm_.

    python tools/train_step_time.py --config qwen3-0.6b --layers 28 --seqs 8 --len 512 --steps 3 \
        --device cuda --out step_time.json

Prints and writes JSON: per side the median step seconds (after one warm-up step) and the peak
memory; their ratio (plain / ours, higher is better for us).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def qwen3_config(name: str, layers: int | None = None) -> Any:
    """A :class:`~rlkernel.model.config.Qwen3Config` of the named shape (``rlkernel.validate.models.CONFIGS``)."""
    from rlkernel.model.config import Qwen3Config
    from rlkernel.validate.models import CONFIGS

    cfg = {k: v for k, v in CONFIGS[name].items() if k != "init_std"}
    if layers:
        cfg["num_hidden_layers"] = layers
    return Qwen3Config.from_dict({**cfg, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                  "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16"})


def step_batch(vocab_size: int, seqs: int, length: int,
               device: torch.device) -> tuple[list[list[int]], list[list[int]], torch.Tensor]:
    """``seqs`` random prompts and completions of ``length // 2`` and ``length - length // 2`` tokens, advantages."""
    g = torch.Generator().manual_seed(0)
    half = length // 2
    prompts = [torch.randint(0, vocab_size, (half,), generator=g).tolist() for _ in range(seqs)]
    comps = [torch.randint(0, vocab_size, (length - half,), generator=g).tolist() for _ in range(seqs)]
    return prompts, comps, torch.randn(seqs, generator=g).to(device)


def time_ours(model: Any, prompts: list[list[int]], comps: list[list[int]], adv: torch.Tensor, steps: int,
              device: torch.device) -> dict[str, Any]:
    """rlkernel's update (exact backward, ExactGradients, clip, AdamW contract): median of ``steps`` after a warm-up.

    The model's parameters are trained in place and frozen again afterwards.
    """
    from rlkernel import grads
    from rlkernel.rl import AdamW, clip_grad_norm_, ppo_loss
    from rlkernel.train.grpo import completion_logprobs

    n_tok = sum(len(c) for c in comps)
    model.requires_grad_(True)
    params = list(model.parameters())
    acc = grads.ExactGradients(params)
    opt = AdamW(params, lr=1e-6)
    times = []
    try:
        for i in range(steps + 1):
            _sync(device)
            t0 = time.perf_counter()
            acc.zero()
            logp = completion_logprobs(model, prompts, comps, 1.0, device)
            lp = logp.reshape(len(comps), -1)
            mask = torch.ones(lp.shape, dtype=torch.bool, device=device)
            loss = ppo_loss(lp, lp.detach(), adv, mask, denominator=n_tok)
            loss.backward()
            acc.finish()
            clip_grad_norm_(params, 1.0)
            opt.step()
            _sync(device)
            if i:
                times.append(time.perf_counter() - t0)
            print(f"ours step {i}: {time.perf_counter() - t0:.3f} s", flush=True)
    finally:
        acc.remove()
        model.requires_grad_(False)
    result = {"median_s": statistics.median(times) if times else None, "steps_s": times, "peak_gib": _peak(device)}
    del opt, acc
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return result


def time_plain(model: Any, prompts: list[list[int]], comps: list[list[int]], adv: torch.Tensor, steps: int,
               device: torch.device) -> dict[str, Any]:
    """The plain PyTorch update (transformers bf16, full logits, torch AdamW) on ``model``'s weights (a copy)."""
    from rlkernel.validate.baseline import hf_model

    n_tok = sum(len(c) for c in comps)
    half = len(prompts[0])
    hf = hf_model(model, torch.bfloat16).train()
    hf.requires_grad_(True)
    opt2 = torch.optim.AdamW(hf.parameters(), lr=1e-6, fused=device.type == "cuda")
    ids = torch.tensor([p + c for p, c in zip(prompts, comps)], device=device)
    tgt = ids[:, half:]
    times = []
    for i in range(steps + 1):
        _sync(device)
        t0 = time.perf_counter()
        opt2.zero_grad(set_to_none=True)
        logits = hf(ids).logits[:, half - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        a = adv.unsqueeze(1)
        loss = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2)).sum() / n_tok
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt2.step()
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
        print(f"plain step {i}: {time.perf_counter() - t0:.3f} s", flush=True)
    result = {"median_s": statistics.median(times) if times else None, "steps_s": times, "peak_gib": _peak(device)}
    del hf, opt2
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="qwen3-0.6b")
    p.add_argument("--layers", type=int, help="override num_hidden_layers (the widths stay)")
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--len", type=int, default=512, help="tokens per sequence (half prompt, half completion)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sides", default="plain,ours")
    p.add_argument("--out")
    args = p.parse_args()
    device = torch.device(args.device)

    from rlkernel.model import Qwen3ForCausalLM
    from rlkernel.train.tasks import init_weights_

    config = qwen3_config(args.config, args.layers)
    model = Qwen3ForCausalLM(config, device=device)
    init_weights_(model, seed=0, std=0.02)
    prompts, comps, adv = step_batch(config.vocab_size, args.seqs, args.len, device)
    result: dict[str, Any] = {"config": args.config, "layers": config.num_hidden_layers, "seqs": args.seqs,
                              "len": args.len, "device": str(device),
                              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    if "ours" in args.sides:
        result["ours"] = time_ours(model, prompts, comps, adv, args.steps, device)
    if "plain" in args.sides:
        result["plain"] = time_plain(model, prompts, comps, adv, args.steps, device)
    if "ours" in result and "plain" in result:
        result["ratio_plain_over_ours"] = result["plain"]["median_s"] / result["ours"]["median_s"]
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
