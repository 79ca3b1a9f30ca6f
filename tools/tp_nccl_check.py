"""Tensor parallelism over NCCL on real GPUs: the Qwen3 model's bits at TP = 1 and TP = world.

Run on a machine with 2 (or 4) GPUs, NVLink multicast off::

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \\
        python -m torch.distributed.run --nproc_per_node 2 tools/tp_nccl_check.py --out DIR

Every rank builds a Qwen3-0.6B-shaped model (``--layers`` of its 28) with the counter-hash weights
of ``rlkernel.train.init_weights_`` (the same bits at any TP degree), once whole on its own GPU
(TP = 1) and once sharded over the world group (TP = world, exact all-reduce over NCCL), and
compares on bytes:

* the trainer's log-probs (``packed_logprobs``, micro-batched) of fixed packed sequences;
* the rollout engine's sampled tokens and their log-probs (``rlkernel.rollout.LLM``, top-k, eager);
* the TP = 1 bits of every rank with rank 0's (one GPU model, different devices);
* rank 0 also computes the trainer's log-probs of the first sequences on the CPU (``--cpu-seqs``);
* ``--train-steps`` GRPO steps of the ReverseDigits model (the configuration of the committed
  200-step run, conformance/results/train/h200-827c023) at TP = 1 and TP = world: every step's
  weight SHA-256 must agree with each other and with that single-GPU report's steps.

Rank 0 writes ``DIR/tp_nccl.json`` after each stage (a run stopped midway keeps what it proved).
Exit status 0 only if every comparison made is equal.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlkernel.model import Qwen3Config, Qwen3ForCausalLM
from rlkernel.rl import packed_logprobs
from rlkernel.rollout import LLM, SamplingParams
from rlkernel.train import GRPOConfig, GRPOTrainer, ReverseDigits, task_config
from rlkernel.train.tasks import init_weights_

QWEN3_06B = {"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rms_norm_eps": 1e-6,
             "rope_theta": 1000000.0, "max_position_embeddings": 40960, "tie_word_embeddings": True}
SEQ_LENS = (100, 37, 256, 5, 63)


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def sequences(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, vocab, (sum(SEQ_LENS),), generator=g)
    cu = torch.tensor([0, *torch.tensor(SEQ_LENS).cumsum(0).tolist()], dtype=torch.int32)
    return ids, cu


def engine_run(model: Qwen3ForCausalLM) -> list[Any]:
    g = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (17, 5, 40, 9)]
    params = SamplingParams(temperature=0.9, top_k=50, max_tokens=12, seed=3)
    llm = LLM(model, num_blocks=64, block_size=16, max_num_seqs=4, max_num_batched_tokens=256, enforce_eager=True)
    return llm.generate(prompts, params)


#: the committed single-GPU GRPO run whose configuration the training stage repeats
TRAIN_REPORT = Path(__file__).resolve().parents[1] / "conformance/results/train/h200-827c023/report.json"


def train_shas(group: object, device: torch.device, steps: int) -> list[str]:
    """Every step's weight SHA-256 of ``steps`` GRPO steps of the committed run's configuration."""
    config = Qwen3Config.from_dict(task_config(hidden_size=32, num_layers=2))
    model = init_weights_(Qwen3ForCausalLM(config, group=group, device=device), seed=0, std=0.05)
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, temperature=1.0, lr=3e-3, weight_decay=0.0, kl_coef=0.0,
                     loss_agg_mode="token-mean", micro_batch_size=4, max_grad_norm=1.0, seed=0)
    trainer = GRPOTrainer(model, ReverseDigits(min_digits=2, max_digits=3, seed=0), cfg)
    return [m.weights_sha256 for m in trainer.train(steps)]


def build(config: Qwen3Config, group: object, device: torch.device) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM(config, group=group, device=device)
    return init_weights_(model, seed=0, std=0.02).eval()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--cpu-seqs", type=int, default=2, help="sequences rank 0 also scores on the CPU (0: none)")
    p.add_argument("--train-steps", type=int, default=4, help="GRPO steps at TP 1 and TP = world (0: none)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    config = Qwen3Config.from_dict({**QWEN3_06B, "num_hidden_layers": args.layers})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"world": world, "layers": args.layers, "seq_lens": list(SEQ_LENS),
                              "device_name": torch.cuda.get_device_name(device), "torch": torch.__version__,
                              "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                              "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",
                                                                      "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                                      "NVSHMEM_DISABLE_NVLS")},
                              "command": sys.argv, "checks": {}}
    ok = True

    def record(name: str, equal: bool, **detail: Any) -> None:
        nonlocal ok
        ok = ok and equal
        report["checks"][name] = {"equal": equal, **detail}
        if rank == 0:
            (out / "tp_nccl.json").write_text(json.dumps(report, indent=2) + "\n")
            print(f"{name}: {'equal' if equal else 'DIFFERENT'} {detail}", flush=True)

    ids, cu = sequences(config.vocab_size)
    t0 = time.perf_counter()
    one = build(config, None, device)
    lp1 = packed_logprobs(one, ids.to(device), cu.to(device), micro_batch_size=2)
    eng1 = engine_run(one)
    del one
    torch.cuda.empty_cache()
    shas = [None] * world
    dist.all_gather_object(shas, sha(lp1))
    record("trainer_tp1_same_on_every_gpu", len(set(shas)) == 1, sha256=shas)

    tp = build(config, dist.group.WORLD, device)
    lp2 = packed_logprobs(tp, ids.to(device), cu.to(device), micro_batch_size=2)
    record(f"trainer_tp{world}_equals_tp1", torch.equal(lp1.view(torch.int32), lp2.view(torch.int32)),
           sha256_tp1=sha(lp1), sha256_tpn=sha(lp2), tokens=int(lp1.numel()))
    eng2 = engine_run(tp)
    same_tokens = [a.token_ids for a in eng1] == [b.token_ids for b in eng2]
    same_lp = all(sha(torch.as_tensor(a.logprobs)) == sha(torch.as_tensor(b.logprobs)) for a, b in zip(eng1, eng2))
    record(f"rollout_tp{world}_equals_tp1", same_tokens and same_lp, tokens_equal=same_tokens, logprobs_equal=same_lp,
           sampled=[len(a.token_ids) for a in eng1])
    report["seconds_gpu"] = round(time.perf_counter() - t0, 1)
    del tp
    dist.barrier()

    if args.train_steps:
        one_steps = train_shas(None, device, args.train_steps)
        tp_steps = train_shas(dist.group.WORLD, device, args.train_steps)
        committed = [s["ours"]["weights_sha256"] for s in json.loads(TRAIN_REPORT.read_text())["steps"]]
        record(f"grpo_tp{world}_equals_tp1_and_the_committed_run",
               tp_steps == one_steps == committed[:args.train_steps], steps=args.train_steps,
               tp1=[h[:16] for h in one_steps], tpn=[h[:16] for h in tp_steps],
               committed=[h[:16] for h in committed[:args.train_steps]])
    dist.barrier()

    if rank == 0 and args.cpu_seqs:
        n = int(cu[args.cpu_seqs])
        cpu = build(config, None, torch.device("cpu"))
        lpc = packed_logprobs(cpu, ids[:n], cu[:args.cpu_seqs + 1], micro_batch_size=2)
        gpu_part = lp1[:lpc.numel()].to("cpu")
        record("trainer_cpu_equals_gpu_tp1", torch.equal(lpc.view(torch.int32), gpu_part.view(torch.int32)),
               sequences=args.cpu_seqs, sha256_cpu=sha(lpc), sha256_gpu=sha(gpu_part))
    dist.barrier()
    gc.collect()  # the trainers' cycles hold the group (docs/training.md, "Ending a TP run")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
