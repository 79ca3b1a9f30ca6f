"""GRPO (and PPO-clip) on rlkernel: rollout with the engine, update with exact gradients.

One :meth:`GRPOTrainer.step`:

1. **Rollout.** ``n = group_size`` completions per prompt from :class:`rlkernel.rollout.LLM`
   (per-sample seeds from the step and prompt index), with their log-probs.
2. **Rewards and advantages.** The task scores each completion; :func:`group_advantages`
   normalises within each group (exact sums).
3. **Update.** For each micro-batch of whole sequences: the trainer's forward with autograd
   (``packed`` attention over prompt + completion), the completion tokens' log-probs by the LM
   head's ``token_logprobs``, the clipped objective :func:`ppo_loss` against the rollout's
   log-probs with the *global* denominator (token or sequence count), an optional k3 KL to a
   frozen reference model, and ``backward()``. Gradients go to exact accumulators
   (:class:`rlkernel.grads.ExactGradients`): per-token or per-sequence terms summed exactly, so
   the gradient is the same bits for every micro-batch size and packing. Then the exact global
   norm clip and :class:`rlkernel.rl.AdamW`.

Metrics per step: mean reward, loss and KL (exact means over the global batch), the number of
completion tokens whose trainer log-prob differs in any bit from the rollout's log-prob (before
the update: the on-policy check), max ``|exp(logp - old_logp) - 1|``, the gradient norm, and the
SHA-256 of the weights after the update.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from rlkernel import grads
from rlkernel.model.loader import state_dict_hf
from rlkernel.model.qwen3 import Qwen3ForCausalLM
from rlkernel.nn.metadata import AttentionMetadata
from rlkernel.rl.logprobs import micro_batches
from rlkernel.rl.losses import ExactMean, group_advantages, kl_k3, masked_mean, ppo_loss
from rlkernel.rl.optim import AdamW, clip_grad_norm_
from rlkernel.rollout import LLM, SamplingParams

__all__ = ["GRPOConfig", "GRPOTrainer", "RolloutBatch", "StepMetrics", "Task", "completion_logprobs",
           "weights_sha256"]


class Task(Protocol):
    """What :class:`GRPOTrainer` needs from a task (see :class:`rlkernel.rl.tasks.ReverseDigits`)."""

    def prompts(self, step: int, count: int) -> list[list[int]]: ...

    def reward(self, prompt: Sequence[int], completion: Sequence[int]) -> float: ...

    def max_tokens(self) -> int: ...


@dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters (verl's names in brackets).

    Attributes
    ----------
    prompts_per_step : int
        Prompts per step (``data.train_batch_size``).
    group_size : int
        Completions per prompt (``rollout.n``).
    temperature : float
        Sampling temperature of the rollout; the trainer's log-probs use the same.
    lr, weight_decay, betas : AdamW's.
    clip_low, clip_high : float
        PPO ratio clip (``clip_ratio_low/high``).
    kl_coef : float
        Weight of the k3 KL to the reference model (``kl_loss_coef``); 0 = no reference model.
    loss_agg_mode : str
        ``"token-mean"`` or ``"seq-mean-token-mean"`` (``loss_agg_mode``).
    micro_batch_size : int, optional
        Sequences per forward/backward (``ppo_micro_batch_size``); None = the whole batch.
    max_grad_norm : float, optional
        Global-norm clip (``grad_clip``); None = no clipping.
    seed : int
        Seeds the rollout's samples.
    """

    prompts_per_step: int = 4
    group_size: int = 4
    temperature: float = 1.0
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    micro_batch_size: int | None = None
    max_grad_norm: float | None = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.loss_agg_mode not in ("token-mean", "seq-mean-token-mean"):
            raise ValueError(f"GRPOConfig: loss_agg_mode = {self.loss_agg_mode!r}; expected 'token-mean' or "
                             f"'seq-mean-token-mean'")
        if self.group_size < 2:
            raise ValueError(f"GRPOConfig: group_size = {self.group_size}; GRPO needs >= 2 completions per prompt")


@dataclass
class RolloutBatch:
    """The sequences of one step, in a fixed order (prompt, then sample index)."""

    prompts: list[list[int]]
    completions: list[list[int]]
    old_logprobs: list[torch.Tensor]
    rewards: torch.Tensor  # float32 [P, G]
    advantages: torch.Tensor  # float32 [P * G]

    @property
    def num_tokens(self) -> int:
        return sum(len(c) for c in self.completions)


@dataclass
class StepMetrics:
    """One step's log line (see the module docstring)."""

    step: int
    reward: float
    loss: float
    kl: float
    mismatches: int
    tokens: int
    max_ratio_dev: float
    grad_norm: float
    weights_sha256: str
    rollout_s: float = 0.0
    train_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def weights_sha256(model: Qwen3ForCausalLM) -> str:
    """SHA-256 of the whole weights: every Hugging Face-named tensor in name order (name, dtype,
    shape and bytes), gathered over tensor-parallel ranks (every rank calls it and gets the hash)."""
    h = hashlib.sha256()
    for name, p in sorted(state_dict_hf(model), key=lambda kv: kv[0]):
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def completion_logprobs(model: Qwen3ForCausalLM, prompts: Sequence[Sequence[int]],
                        completions: Sequence[Sequence[int]], temperature: float,
                        device: torch.device) -> torch.Tensor:
    """The trainer's log-probs of every completion token, packed: float32 ``[sum of completion lengths]``.

    One packed forward over prompt + completion of each sequence (autograd on when grad mode
    is), then the LM head on the rows that predict completion tokens. The sequences are the
    gradient units (:func:`rlkernel.grads.sequence_units`) of both the body and the head.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
    lens = [len(s) for s in seqs]
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64, device=device)
    meta = AttentionMetadata.packed(lens, device)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    with grads.sequence_units(cu):
        hidden = model(ids, meta.positions(), meta)
    rows: list[int] = []
    head_cu = [0]
    for b, (p, c) in enumerate(zip(prompts, completions)):
        start = cu[b] + len(p) - 1  # the row of the last prompt token predicts the first completion token
        rows.extend(range(start, start + len(c)))
        head_cu.append(head_cu[-1] + len(c))
    row = torch.tensor(rows, dtype=torch.int64, device=device)
    targets = torch.tensor([t for c in completions for t in c], dtype=torch.int64, device=device)
    with grads.sequence_units(head_cu):
        return model.logprobs(hidden[row], targets, temperature)


def _padded(values: torch.Tensor, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed [N] values as [B, max(lengths)] rows and their mask (an exact gather; autograd passes)."""
    width = max(lengths) if lengths else 0
    mask = torch.arange(width, device=values.device).unsqueeze(0) < torch.tensor(
        list(lengths), device=values.device).unsqueeze(1)
    out = values.new_zeros((len(lengths), width))
    return out.masked_scatter(mask, values), mask


class GRPOTrainer:
    """Rollout and exact-gradient update of a :class:`Qwen3ForCausalLM` on a :class:`Task`.

    Parameters
    ----------
    model : Qwen3ForCausalLM
        The policy; its parameters are trained in place (the rollout engine reads them).
    task : Task
    config : GRPOConfig
    ref_model : Qwen3ForCausalLM, optional
        Frozen reference policy for the k3 KL (needed when ``config.kl_coef > 0``).
    llm : rlkernel.rollout.LLM, optional
        The rollout engine over ``model`` (default: one with a KV cache for the step's batch).
    """

    def __init__(self, model: Qwen3ForCausalLM, task: Task, config: GRPOConfig,
                 ref_model: Qwen3ForCausalLM | None = None, llm: LLM | None = None) -> None:
        if config.kl_coef > 0 and ref_model is None:
            raise ValueError("GRPOTrainer: kl_coef > 0 needs a ref_model (a frozen copy of the initial policy)")
        for name, m in (("model", model), ("ref_model", ref_model), ("llm.model", llm.model if llm else None)):
            if m is not None and not m.ops.bitwise:
                raise ValueError(f"GRPOTrainer: {name} runs the {m.ops.name!r} op set, a performance baseline that "
                                 f"is not bitwise; train the model built with the exact ops (the default) and its "
                                 f"LLM(model) engine")
        self.model, self.task, self.config, self.ref_model = model, task, config, ref_model
        self.device = next(model.parameters()).device
        seqs = config.prompts_per_step * config.group_size
        self.llm = llm or LLM(model, num_blocks=seqs * 4 + 8, block_size=16, max_num_seqs=seqs,
                              max_model_len=model.config.max_position_embeddings, seed=config.seed)
        model.requires_grad_(True)
        self.params = [p for p in model.parameters() if p.requires_grad]
        #: weights held whole on every tensor-parallel rank (the norm gains)
        self.replicated = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
        self.grads = grads.ExactGradients(self.params)
        self.optimizer = AdamW(self.params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
        self.step_index = 0

    # ------------------------------------------------------------------ rollout
    def rollout(self, step: int) -> RolloutBatch:
        """Sample ``group_size`` completions of each prompt of ``step`` and score them."""
        cfg = self.config
        prompts = self.task.prompts(step, cfg.prompts_per_step)
        params = [SamplingParams(temperature=cfg.temperature, max_tokens=self.task.max_tokens(), n=cfg.group_size,
                                 seed=(cfg.seed * 1_000_003 + step) * 4099 + i) for i in range(len(prompts))]
        with torch.no_grad():
            outs = self.llm.generate(prompts, params, use_tqdm=False)
        outs = sorted(outs, key=lambda o: (o.prompt_index, o.sample_index))
        seq_prompts = [prompts[o.prompt_index] for o in outs]
        completions = [list(o.token_ids) for o in outs]
        rewards = torch.tensor([self.task.reward(p, c) for p, c in zip(seq_prompts, completions)],
                               dtype=torch.float64).to(torch.float32).reshape(len(prompts), cfg.group_size)
        adv = group_advantages(rewards).reshape(-1)
        return RolloutBatch(seq_prompts, completions, [o.logprobs for o in outs], rewards, adv)

    # ------------------------------------------------------------------ update
    def _denominator(self, batch: RolloutBatch) -> int:
        if self.config.loss_agg_mode == "token-mean":
            return batch.num_tokens
        return sum(1 for c in batch.completions if c)

    def update(self, batch: RolloutBatch) -> dict[str, Any]:
        """One optimizer step on ``batch`` (micro-batched, exact gradient accumulation)."""
        cfg = self.config
        den = self._denominator(batch)
        lens = [len(p) + len(c) for p, c in zip(batch.prompts, batch.completions)]
        loss_acc, kl_acc = ExactMean(), ExactMean()
        mismatches, max_dev = 0, 0.0
        self.grads.zero()
        for mb in micro_batches(lens, cfg.micro_batch_size):
            prompts = [batch.prompts[i] for i in mb]
            comps = [batch.completions[i] for i in mb]
            clens = [len(c) for c in comps]
            logp = completion_logprobs(self.model, prompts, comps, cfg.temperature, self.device)
            old = torch.cat([batch.old_logprobs[i] for i in mb]).to(self.device)
            same = logp.detach().view(torch.int32) == old.view(torch.int32)
            mismatches += int((~same).sum())
            if logp.numel():
                dev = (logp.detach().double() - old.double()).exp().sub(1.0).abs().max()
                max_dev = max(max_dev, float(dev))
            logp2, mask = _padded(logp, clens)
            old2, _ = _padded(old, clens)
            adv = batch.advantages[torch.tensor(mb)].to(self.device)
            loss = ppo_loss(logp2, old2, adv, mask, cfg.clip_low, cfg.clip_high, mode=cfg.loss_agg_mode,
                            denominator=den)
            with torch.no_grad():
                loss_acc.add(ppo_loss(logp2.detach(), old2, adv, mask, cfg.clip_low, cfg.clip_high,
                                      mode=cfg.loss_agg_mode, partial=True))
            if cfg.kl_coef > 0:
                assert self.ref_model is not None
                with torch.no_grad():
                    ref = completion_logprobs(self.ref_model, prompts, comps, cfg.temperature, self.device)
                ref2, _ = _padded(ref, clens)
                k3 = kl_k3(logp2, ref2)
                kl = masked_mean(k3, mask, cfg.loss_agg_mode, denominator=den)
                with torch.no_grad():
                    kl_acc.add(masked_mean(k3.detach(), mask, cfg.loss_agg_mode, partial=True))
                loss = loss + kl * cfg.kl_coef
            loss.backward()
        self.grads.finish()
        norm = math.nan
        if cfg.max_grad_norm is not None:
            if self.model.tp_size > 1:
                norm = clip_grad_norm_(self.params, cfg.max_grad_norm, group=self.model.group,
                                       replicated=self.replicated)
            else:
                norm = clip_grad_norm_(self.params, cfg.max_grad_norm)
        self.optimizer.step()
        self.grads.zero()
        return {"loss": float(loss_acc.value()), "kl": float(kl_acc.value()) if cfg.kl_coef > 0 else 0.0,
                "mismatches": mismatches, "max_ratio_dev": max_dev, "grad_norm": float(norm)}

    def step(self) -> StepMetrics:
        """Rollout, update, metrics; advances the step counter."""
        t0 = time.perf_counter()
        batch = self.rollout(self.step_index)
        t1 = time.perf_counter()
        out = self.update(batch)
        t2 = time.perf_counter()
        reward = float(batch.rewards.double().mean())
        m = StepMetrics(self.step_index, reward, out["loss"], out["kl"], out["mismatches"], batch.num_tokens,
                        out["max_ratio_dev"], out["grad_norm"], weights_sha256(self.model), t1 - t0, t2 - t1)
        self.step_index += 1
        return m

    def train(self, steps: int, log: Callable[[StepMetrics], None] | None = None) -> list[StepMetrics]:
        """Run ``steps`` steps; ``log`` is called with each step's metrics."""
        history = []
        for _ in range(steps):
            m = self.step()
            history.append(m)
            if log is not None:
                log(m)
        return history
