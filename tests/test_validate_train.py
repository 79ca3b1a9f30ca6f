"""``rlkernel validate --train-steps N``: the ordinary PyTorch GRPO path, the CLI, and ours end to end.

Ours end to end needs the backward contracts of every op on the training path (rms_norm, rope,
silu_mul, attention, token_logprobs); until they are in this build those tests are skipped, and
they start running by themselves once ``rlkernel.ops.rms_norm`` accepts inputs that require grad
and the other ops export their ``*_backward``.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rlkernel.cli import build_parser, main
from rlkernel.dispatch import BackwardNotDefined
from rlkernel.rl import group_advantages, ppo_loss
from rlkernel.train import GRPOConfig, ReverseDigits, weights_sha256
from rlkernel.validate.train import TrainConfig, build_task_model


def _backward_available() -> bool:
    """Whether this build's ops on the training path have a backward: rms_norm takes requires-grad inputs,
    and the other ops of the model's forward export their backward op."""
    import rlkernel.ops
    from rlkernel.ops import rms_norm

    if not all(hasattr(rlkernel.ops, f"{op}_backward") for op in ("attention", "rope", "silu_mul", "token_logprobs")):
        return False
    x = torch.ones(1, 4, dtype=torch.bfloat16, requires_grad=True)
    try:
        with torch.enable_grad():
            rms_norm(x, torch.ones(4, dtype=torch.bfloat16))
    except BackwardNotDefined:
        return False
    return True


needs_backward = pytest.mark.skipif(not _backward_available(),
                                    reason="the backward contracts (rms_norm and the other training ops) are not in "
                                           "this build yet")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------- ordinary path
def test_plain_advantages_and_loss_are_the_usual_formulas() -> None:
    """The ordinary path's torch formulas agree with rlkernel's exact ops to float32 rounding (a tolerance on
    purpose: this is the ordinary path, not a contract)."""
    from rlkernel.validate.train_baseline import grpo_advantages, ppo_clip_loss

    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(3, 4, generator=g)
    torch.testing.assert_close(grpo_advantages(rewards), group_advantages(rewards), rtol=1e-5, atol=1e-6)
    logp = -torch.rand(3, 5, generator=g) * 3
    old = logp + torch.randn(3, 5, generator=g) * 0.3
    adv = torch.randn(3, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    for mode, den in (("token-mean", 20), ("seq-mean-token-mean", 4)):
        ours = ppo_loss(logp, old, adv, mask, 0.2, 0.2, mode=mode, denominator=den)
        plain = ppo_clip_loss(logp, old, adv, mask, 0.2, 0.2, mode, den)
        torch.testing.assert_close(plain, ours, rtol=1e-5, atol=1e-7)


def test_ordinary_path_trains_two_steps() -> None:
    pytest.importorskip("transformers")
    from rlkernel.validate.train_baseline import OrdinaryGRPO

    cfg = TrainConfig(steps=2, num_prompts=2, group_size=3, kl_coef=0.05, loss_agg_mode="seq-mean-token-mean",
                      micro_batch=4)
    model = build_task_model(cfg, torch.device("cpu"))
    initial = weights_sha256(model)
    ordinary = OrdinaryGRPO(model, cfg.task(), cfg.grpo_config(cfg.micro_batch))
    assert ordinary.weights_sha256() == initial  # the same starting point as ours, in ours' hash
    history = ordinary.train(2)
    assert weights_sha256(model) == initial  # our model is only read
    assert [m.step for m in history] == [0, 1]
    hashes = {m.weights_sha256 for m in history}
    assert len(hashes) == 2 and initial not in hashes
    for m in history:
        assert 0.0 <= m.reward <= 1.0 and m.tokens > 0 and 0 <= m.mismatches <= m.tokens
        assert all(map(torch.isfinite, map(torch.tensor, (m.loss, m.kl, m.grad_norm, m.max_ratio_dev))))
        assert m.kl >= 0
    assert all(m.tokens <= 6 * ReverseDigits().max_tokens() for m in history)
    # bf16 generate (KV cache, decode-shaped GEMMs) vs a bf16 full forward: the ordinary mismatch, where
    # this machine's bf16 GEMM depends on the row count (some CPUs' bf16 kernels do not: an AVX-512-BF16
    # EPYC gave row-by-row == whole-matrix bits and 0 mismatches on 50 tokens).
    if _bf16_gemm_depends_on_rows():
        assert sum(m.mismatches for m in history) > 0
        assert max(m.max_ratio_dev for m in history) > 0
    # the counter itself, on any machine: old log-probs moved by 1.0 differ from every recomputed one
    batch = ordinary.rollout(2)
    assert 0 <= copy.deepcopy(ordinary).update(batch)["mismatches"] <= batch.num_tokens
    batch.old_logprobs = [lp + 1.0 for lp in batch.old_logprobs]
    assert copy.deepcopy(ordinary).update(batch)["mismatches"] == batch.num_tokens > 0


def _bf16_gemm_depends_on_rows() -> bool:
    """Whether ``x @ w.T`` in bf16 on this CPU gives other bits for a row alone than within the matrix."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(37, 256, generator=gen).bfloat16()
    w = torch.randn(384, 256, generator=gen).bfloat16()
    rows = torch.cat([x[i:i + 1] @ w.T for i in range(x.shape[0])])
    return bool(((x @ w.T).view(torch.int16) != rows.view(torch.int16)).any())


def test_ordinary_path_micro_batches_accumulate_the_same_gradient() -> None:
    """Global denominator + plain autograd accumulation: micro-batch 1 and the whole batch agree to rounding."""
    pytest.importorskip("transformers")
    from rlkernel.validate.train_baseline import OrdinaryGRPO

    cfg = TrainConfig(steps=1, num_prompts=2, group_size=2, baseline_dtype="float32")
    model = build_task_model(cfg, torch.device("cpu"))
    sides = [OrdinaryGRPO(model, cfg.task(), cfg.grpo_config(mb), dtype=torch.float32) for mb in (None, 1)]
    batch = sides[0].rollout(0)
    grads = []
    for side in sides:
        side.optimizer.step = lambda: None  # keep the gradient, skip the update
        side.update(batch)
        grads.append(torch.cat([m.grad.reshape(-1) for m in side.masters]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)
    assert grads[0].abs().sum() > 0


# ---------------------------------------------------------------------------------------- CLI
def test_cli_parses_the_training_flags() -> None:
    args = build_parser().parse_args(
        ["validate", "--train-steps", "5", "--grpo-micro-batch", "3", "--group-size", "6", "--num-prompts", "2",
         "--lr", "3e-4", "--kl-coef", "0.01", "--loss-agg-mode", "seq-mean-token-mean", "--train-micro-batch-check",
         "1,2", "--train-micro-batch-check", "4", "--max-grad-norm", "0", "--baseline", "none"])
    assert args.train_steps == 5 and args.grpo_micro_batch == 3 and args.group_size == 6 and args.num_prompts == 2
    assert args.lr == 3e-4 and args.kl_coef == 0.01 and args.loss_agg_mode == "seq-mean-token-mean"
    assert args.train_micro_batch_check == [[1, 2], [4]] and args.max_grad_norm == 0
    plain = build_parser().parse_args(["validate"])
    assert plain.train_steps is None and plain.num_prompts is None  # the rollout/replay mode (8 prompts)


@pytest.mark.parametrize(("flags", "message"), [
    (["--checkpoint", "somewhere"], "--checkpoint"),
    (["--layers"], "--layers"),
    (["--group-size", "1"], "--group-size"),
    (["--train-micro-batch-check", "0,2"], "--train-micro-batch-check"),
    (["--temperature", "0"], "--temperature"),
])
def test_cli_refuses_bad_training_settings(flags, message, capsys) -> None:
    assert main(["validate", "--train-steps", "1", "--baseline", "none", *flags]) == 2
    assert message in capsys.readouterr().err


def test_train_config_maps_to_grpo_config() -> None:
    cfg = TrainConfig(steps=1, num_prompts=3, group_size=5, lr=2e-3, kl_coef=0.1, micro_batch=2, seed=7)
    g = cfg.grpo_config(4)
    assert isinstance(g, GRPOConfig)
    assert (g.prompts_per_step, g.group_size, g.lr, g.kl_coef, g.micro_batch_size, g.seed) == (3, 5, 2e-3, 0.1, 4, 7)


# ---------------------------------------------------------------------------------------- ours, end to end
@needs_backward
def test_ours_trains_with_zero_mismatches_and_micro_batch_invariance(tmp_path, capsys) -> None:
    out = tmp_path / "report"
    status = main(["validate", "--train-steps", "2", "--num-prompts", "2", "--group-size", "2",
                   "--train-micro-batch-check", "1,3", "--baseline", "none", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    doc = json.loads((out / "report.json").read_text())
    assert doc["mode"] == "train" and doc["ok"]
    assert [s["ours"]["mismatches"] for s in doc["steps"]] == [0, 0]
    assert all(s["ours"]["max_ratio_dev"] == 0.0 for s in doc["steps"])
    assert doc["final_sha256"] != doc["model"]["initial_sha256"]  # it trained
    check = doc["micro_batch_check"]
    assert check["ok"] and {r["final_sha256"] for r in check["runs"]} == {doc["final_sha256"]}
    md = (out / "report.md").read_text()
    assert doc["final_sha256"] in md and "Same final weights sha256" in md
    assert f"final weights sha256 {doc['final_sha256']}" in printed


@needs_backward
def test_ours_next_to_the_ordinary_path(tmp_path, capsys) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "report"
    status = main(["validate", "--train-steps", "2", "--num-prompts", "2", "--group-size", "2", "--kl-coef", "0.05",
                   "--loss-agg-mode", "seq-mean-token-mean", "--grpo-micro-batch", "3", "--out", str(out)])
    printed = capsys.readouterr().out
    assert status == 0, printed
    doc = json.loads((out / "report.json").read_text())
    assert doc["summary"]["ours"]["mismatches"] == 0
    assert doc["baseline"]["initial_sha256"] == doc["model"]["initial_sha256"]
    assert all(s["baseline"] is not None for s in doc["steps"])
    assert "ordinary" in printed
