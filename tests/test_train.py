"""The GRPO loop on the ReverseDigits task (issue 11's CPU check).

- 200 steps (RLKERNEL_TRAIN_STEPS) at micro-batch size 4: 0 rollout/trainer log-prob mismatches
  and max |ratio - 1| = 0 at every step, and the weights change at every step.
- micro-batch sizes 1 and 2 (and the whole batch at once) for the first CHECK_STEPS steps: the
  same weight SHA-256 as the size-4 run after every one of those steps (exact gradient
  accumulation). The H200 report runs every size for the full 200 steps.
- a k3 KL to a reference model and the sequence-mean aggregation, whole batch vs micro-batches.
- after 200 steps, the weights SHA-256 of the committed H200 run of the same configuration
  (conformance/results/train/h200-*/report.json, ``rlkernel validate --train-steps 200 ...``):
  the CPU and the GPU end in the same bits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from rlkernel.model import Qwen3ForCausalLM
from rlkernel.model.config import Qwen3Config
from rlkernel.train import GRPOConfig, GRPOTrainer, ReverseDigits, StepMetrics, init_weights_, task_config

STEPS = int(os.environ.get("RLKERNEL_TRAIN_STEPS", "200"))
CHECK_STEPS = min(STEPS, 16)


def _trainer(micro_batch_size: int | None, kl_coef: float = 0.0, mode: str = "token-mean") -> GRPOTrainer:
    config = Qwen3Config.from_dict(task_config(hidden_size=32, num_layers=2))
    model = init_weights_(Qwen3ForCausalLM(config), seed=0, std=0.05)
    ref = init_weights_(Qwen3ForCausalLM(config), seed=0, std=0.05) if kl_coef else None
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, lr=3e-3, micro_batch_size=micro_batch_size,
                     kl_coef=kl_coef, loss_agg_mode=mode, seed=0)
    return GRPOTrainer(model, ReverseDigits(max_digits=3), cfg, ref_model=ref)


@pytest.fixture(scope="module")
def long_run() -> list[StepMetrics]:
    torch.set_num_threads(1)
    return _trainer(4).train(STEPS)


def test_every_step_has_zero_mismatches(long_run: list[StepMetrics]) -> None:
    assert len(long_run) == STEPS
    for m in long_run:
        assert m.mismatches == 0, f"step {m.step}: {m.mismatches} of {m.tokens} completion tokens differ"
        assert m.max_ratio_dev == 0.0, f"step {m.step}: max |ratio - 1| = {m.max_ratio_dev}"
        assert m.tokens > 0
    assert len({m.weights_sha256 for m in long_run}) == STEPS, "the weights must change at every step"


H200_REPORTS = sorted((Path(__file__).resolve().parents[1] / "conformance" / "results" / "train").glob("h200-*"))


def test_final_weights_equal_the_h200_run(long_run: list[StepMetrics]) -> None:
    if STEPS != 200:
        pytest.skip("the H200 report is of 200 steps (RLKERNEL_TRAIN_STEPS=200)")
    assert H200_REPORTS, "no committed H200 training report"
    report = json.loads((H200_REPORTS[-1] / "report.json").read_text())
    settings = report["settings"]
    assert (settings["steps"], settings["hidden_size"], settings["num_prompts"], settings["group_size"],
            settings["max_digits"], settings["lr"], settings["init_std"], settings["micro_batch"]) == (
        200, 32, 2, 4, 3, 0.003, 0.05, 4), "the H200 report is of another configuration than _trainer(4)"
    h200 = [s["ours"]["weights_sha256"] for s in report["steps"]]
    assert [m.weights_sha256 for m in long_run] == h200
    assert long_run[-1].weights_sha256 == report["final_sha256"]


@pytest.mark.parametrize("micro_batch_size", [1, 2, None])
def test_weights_identical_for_micro_batch_sizes(long_run: list[StepMetrics], micro_batch_size: int | None) -> None:
    torch.set_num_threads(1)
    other = _trainer(micro_batch_size).train(CHECK_STEPS)
    assert [m.weights_sha256 for m in other] == [m.weights_sha256 for m in long_run[:CHECK_STEPS]]


def test_kl_and_sequence_mean_modes_run_exactly() -> None:
    torch.set_num_threads(1)
    a = _trainer(1, kl_coef=0.1, mode="seq-mean-token-mean").train(2)
    b = _trainer(None, kl_coef=0.1, mode="seq-mean-token-mean").train(2)
    assert [m.weights_sha256 for m in a] == [m.weights_sha256 for m in b]
    assert all(m.mismatches == 0 for m in a)
    assert a[1].kl != 0.0
