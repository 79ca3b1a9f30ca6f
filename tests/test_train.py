"""The GRPO loop on the ReverseDigits task: 0 rollout/trainer mismatches at every step, and the
final weights' SHA-256 the same for every micro-batch size (exact gradient accumulation).

The runs share one trajectory prefix: the micro-batch sizes 1, 2 and 4 each train STEPS steps
from the same initial weights and must end in the same bits; the 200-step run of the issue is
the micro-batch-2 run continued (its hash is recorded in the report of the H200 comparison).
"""

from __future__ import annotations

import os

import pytest
import torch

from rlkernel.model import Qwen3ForCausalLM
from rlkernel.model.config import Qwen3Config
from rlkernel.train import GRPOConfig, GRPOTrainer, ReverseDigits, init_weights_, task_config

#: Steps per micro-batch size in CI; RLKERNEL_TRAIN_STEPS=200 for the full check.
STEPS = int(os.environ.get("RLKERNEL_TRAIN_STEPS", "12"))


def _trainer(micro_batch_size: int | None, kl_coef: float = 0.0, mode: str = "token-mean") -> GRPOTrainer:
    config = Qwen3Config.from_dict(task_config(hidden_size=32, num_layers=2))
    model = init_weights_(Qwen3ForCausalLM(config), seed=0, std=0.05)
    ref = None
    if kl_coef:
        ref = init_weights_(Qwen3ForCausalLM(config), seed=0, std=0.05)
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, lr=3e-3, micro_batch_size=micro_batch_size,
                     kl_coef=kl_coef, loss_agg_mode=mode, seed=0)
    return GRPOTrainer(model, ReverseDigits(), cfg, ref_model=ref)


@pytest.fixture(scope="module")
def runs() -> dict[int | None, list]:
    torch.set_num_threads(1)
    return {mb: _trainer(mb).train(STEPS) for mb in (1, 2, 4)}


def test_every_step_has_zero_mismatches(runs: dict) -> None:
    for mb, history in runs.items():
        for m in history:
            assert m.mismatches == 0, f"micro-batch {mb}, step {m.step}: {m.mismatches} of {m.tokens} tokens differ"
            assert m.max_ratio_dev == 0.0
            assert m.tokens > 0


def test_final_weights_identical_for_micro_batch_sizes(runs: dict) -> None:
    hashes = {mb: [m.weights_sha256 for m in h] for mb, h in runs.items()}
    assert hashes[1] == hashes[2] == hashes[4], {mb: h[-1][:16] for mb, h in hashes.items()}
    assert len(set(hashes[1])) == STEPS, "the weights must change at every step"


def test_kl_and_sequence_mean_modes_run_exactly() -> None:
    a = _trainer(1, kl_coef=0.1, mode="seq-mean-token-mean").train(2)
    b = _trainer(None, kl_coef=0.1, mode="seq-mean-token-mean").train(2)
    assert [m.weights_sha256 for m in a] == [m.weights_sha256 for m in b]
    assert all(m.mismatches == 0 for m in a)
    assert a[1].kl != 0.0
