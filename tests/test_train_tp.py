"""GRPO training at TP 2 (gloo, two CPU processes) ends in the weights of TP 1, bit for bit.

One spawn of two processes trains the ReverseDigits model with a tensor-parallel group of both
ranks (column-parallel qkv/gate_up with the exact dX sum over the ranks, row-parallel o/down,
vocabulary-parallel embedding and LM head with the sharded token_logprobs backward, q/k norm
gains reduced over the group); the parent trains the same model without a group. Every step's
weight SHA-256 (whole tensors, gathered) and mismatch count must agree.
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from gloo_group import run_in_gloo_group

from rlkernel.model import Qwen3ForCausalLM
from rlkernel.model.config import Qwen3Config
from rlkernel.train import GRPOConfig, GRPOTrainer, ReverseDigits, init_weights_, task_config

STEPS = 4


def _run(group: object) -> list[dict]:
    torch.set_num_threads(1)
    config = Qwen3Config.from_dict(task_config(hidden_size=32, num_layers=2))
    model = init_weights_(Qwen3ForCausalLM(config, group=group), seed=0, std=0.05)
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, lr=3e-3, micro_batch_size=3, kl_coef=0.0, seed=0)
    trainer = GRPOTrainer(model, ReverseDigits(max_digits=3), cfg)
    return [{"sha": m.weights_sha256, "mismatches": m.mismatches, "loss": m.loss, "reward": m.reward}
            for m in trainer.train(STEPS)]


def _body(rank: int, out: str) -> None:
    history = _run(dist.group.WORLD)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(history, f)


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    run_in_gloo_group(rank, world, init_file, _body, rank, out, timeout_s=300)


def test_grpo_tp2_ends_in_the_tp1_weights() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "init"), tmp), nprocs=2, join=True)
        ranks = [json.loads(open(os.path.join(tmp, f"rank{r}.json")).read()) for r in range(2)]
    one = _run(None)
    assert ranks[0] == ranks[1], "the two TP ranks disagree"
    assert [h["sha"] for h in ranks[0]] == [h["sha"] for h in one], (
        [h["sha"][:12] for h in ranks[0]], [h["sha"][:12] for h in one])
    assert all(h["mismatches"] == 0 for h in one + ranks[0])
    assert len({h["sha"] for h in one}) == STEPS, "the weights must change at every step"
    assert ranks[0] == one
