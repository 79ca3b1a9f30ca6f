"""The ordinary PyTorch path of the GRPO loop, side by side with :class:`rlkernel.train.GRPOTrainer`.

Everything here is what a plain PyTorch RL trainer does, on the same initial weights, task,
prompts, rewards and hyper-parameters (:class:`rlkernel.train.GRPOConfig`) as ours:

- **Model.** transformers' ``Qwen3ForCausalLM`` (:func:`rlkernel.validate.baseline.hf_model`,
  built from the configuration, no download) in ``dtype`` (bfloat16 by default), with fp32
  master weights and fp32 gradient accumulation (mixed precision as Megatron/apex O2 do it:
  the model computes in its dtype, each micro-batch's gradients are added to the masters'
  fp32 ``.grad``, and the updated masters are cast back to the model after the step).
- **Rollout.** ``generate`` with its KV cache, ``group_size`` samples per prompt, sampling at
  the config's temperature from torch's global generator seeded per step (inside
  ``torch.random.fork_rng``, so the caller's random state is untouched); the old log-probs are
  ``log_softmax(logits / T)`` of the sampled tokens from generate's raw step logits
  (``output_logits``), in float32, as :mod:`rlkernel.validate.baseline` does.
- **Advantages.** Per group ``(r - mean) / (std + 1e-6)`` with the unbiased std, in torch.
- **Update.** Micro-batches of whole sequences in order (right-padded, one full forward of
  prompt + completion each), the completion tokens' log-probs from the full logits, the
  PPO-clip loss aggregated with the *global* denominator (token count, or non-empty sequence
  count for ``seq-mean-token-mean``), an optional k3 KL to a frozen copy of the initial
  model, ``backward()`` per micro-batch, then ``torch.nn.utils.clip_grad_norm_`` and
  ``torch.optim.AdamW`` (same lr, betas, eps 1e-8 and weight decay as ours).

Per step it returns the same :class:`rlkernel.train.StepMetrics`: the mismatches are the
completion tokens whose trainer log-prob (before the update) differs in any bit from the
rollout's. Nothing here is bitwise by design, so they are expected to be > 0: a decode step's
GEMM is not a prefill's, padding changes the shapes, SDPA picks kernels by shape. The weights
hash is :func:`rlkernel.train.weights_sha256` of the weights loaded into an rlkernel model of
the same configuration, so it is comparable with ours (equal before the first step).

transformers is an optional dependency (the ``test`` extra).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlkernel.model import Qwen3ForCausalLM, load_weights
from rlkernel.train.grpo import GRPOConfig, RolloutBatch, StepMetrics, Task, weights_sha256
from rlkernel.validate.baseline import _generate, hf_model

__all__ = ["OrdinaryGRPO", "grpo_advantages", "ppo_clip_loss"]

#: Added to each group's std (as GRPOConfig's exact ``group_advantages`` default).
ADV_EPS = 1e-6


def grpo_advantages(rewards: torch.Tensor, eps: float = ADV_EPS) -> torch.Tensor:
    """Plain torch GRPO advantages: ``(r - mean) / (std + eps)`` per row of ``rewards`` [P, G] (unbiased std)."""
    mean = rewards.mean(dim=-1, keepdim=True)
    std = rewards.std(dim=-1, keepdim=True)
    return (rewards - mean) / (std + eps)


def _aggregate(tok: torch.Tensor, mask: torch.Tensor, mode: str, denominator: int) -> torch.Tensor:
    """Masked token values [B, T] -> the batch's share of the global mean (``denominator`` tokens or sequences)."""
    m = mask.to(tok.dtype)
    if mode == "token-mean":
        return (tok * m).sum() / denominator
    per_seq = (tok * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)  # an empty sequence contributes 0
    return per_seq.sum() / denominator


def ppo_clip_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_low: float, clip_high: float, mode: str, denominator: int) -> torch.Tensor:
    """Plain torch PPO-clip: ``agg(max(-A r, -A clamp(r, 1 - lo, 1 + hi)))``, ``r = exp(logp - old)``.

    ``logp``, ``old_logp``, ``mask`` [B, T]; ``advantages`` [B] (one per sequence).
    """
    ratio = torch.exp(logp - old_logp)
    a = advantages.unsqueeze(-1)
    tok = torch.maximum(-a * ratio, -a * ratio.clamp(1.0 - clip_low, 1.0 + clip_high))
    return _aggregate(tok, mask, mode, denominator)


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def _pad(rows: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length float rows -> [B, max len] (zeros after each row) and the bool mask."""
    width = max((len(r) for r in rows), default=0)
    out = torch.zeros(len(rows), width, dtype=torch.float32, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r.to(device)
        mask[i, :len(r)] = True
    return out, mask


class OrdinaryGRPO:
    """GRPO with transformers and torch.optim.AdamW: the ordinary path next to :class:`GRPOTrainer`.

    Parameters
    ----------
    model : rlkernel Qwen3ForCausalLM
        The initial weights (copied; ``model`` is not changed) and the device.
    task : Task
        Prompts and rewards (:class:`rlkernel.train.ReverseDigits`).
    config : GRPOConfig
        The same hyper-parameters as ours (prompts per step, group size, temperature, AdamW's lr,
        betas and weight decay, clip range, KL weight, loss aggregation, micro-batch size,
        gradient clip, seed).
    dtype : torch.dtype
        transformers' model dtype (default bfloat16; float32 is allowed).
    attn_implementation : str
        ``"sdpa"`` (default) or ``"eager"``.
    """

    def __init__(self, model: Qwen3ForCausalLM, task: Task, config: GRPOConfig, dtype: torch.dtype = torch.bfloat16,
                 attn_implementation: str = "sdpa") -> None:
        if config.temperature <= 0:
            raise ValueError(f"OrdinaryGRPO: temperature = {config.temperature}; GRPO samples (expected > 0)")
        self.task, self.config, self.dtype = task, config, dtype
        self.hf = hf_model(model, dtype, attn_implementation)
        self.hf.requires_grad_(True)
        self.device = self.hf.device
        self.params = list(self.hf.parameters())  # a tied head is one parameter
        self.masters = [p.detach().to(torch.float32).clone().requires_grad_(True) for p in self.params]
        self.optimizer = torch.optim.AdamW(self.masters, lr=config.lr, betas=config.betas, eps=1e-8,
                                           weight_decay=config.weight_decay)
        self.ref: Any = None
        if config.kl_coef > 0:
            self.ref = copy.deepcopy(self.hf).requires_grad_(False).eval()
        # The hash's view of the weights: an rlkernel model of the same config (CPU), loaded from the HF tensors.
        self._mirror = Qwen3ForCausalLM(model.config, dtype=next(model.parameters()).dtype, device="cpu")
        eos = model.config.extra.get("eos_token_id")
        self.eos = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        self.step_index = 0

    def weights_sha256(self) -> str:
        """:func:`rlkernel.train.weights_sha256` of the current weights (rlkernel parameter names and dtype)."""
        with torch.no_grad():
            load_weights(self._mirror, ((n, t.detach().cpu()) for n, t in self.hf.named_parameters()))
        return weights_sha256(self._mirror)

    # ------------------------------------------------------------------ rollout
    def rollout(self, step: int) -> RolloutBatch:
        """``group_size`` samples of each prompt of ``step`` with ``generate``, their log-probs, rewards, advantages."""
        cfg = self.config
        prompts = self.task.prompts(step, cfg.prompts_per_step)
        params = {"temperature": cfg.temperature, "max_tokens": self.task.max_tokens(), "n": cfg.group_size,
                  "top_k": 0, "top_p": 1.0}
        seed = (cfg.seed * 1_000_003 + step) * 4099
        self.hf.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            outs = _generate(self.hf, prompts, params, seed, self.eos)  # prompt r // G, sample r % G
        seq_prompts = [prompts[r // cfg.group_size] for r in range(len(outs))]
        completions = [toks for toks, _ in outs]
        rewards = torch.tensor([self.task.reward(p, c) for p, c in zip(seq_prompts, completions)],
                               dtype=torch.float32).reshape(len(prompts), cfg.group_size)
        adv = grpo_advantages(rewards).reshape(-1)
        return RolloutBatch(seq_prompts, completions, [lp for _, lp in outs], rewards, adv)

    # ------------------------------------------------------------------ update
    def _logprobs(self, model: Any, prompts: Sequence[Sequence[int]],
                  completions: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Completion log-probs of each sequence from one right-padded full forward of prompt + completion."""
        seqs = [list(p) + list(c) for p, c in zip(prompts, completions)]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], dtype=torch.int64, device=self.device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], dtype=torch.int64,
                            device=self.device)
        logits = model(input_ids=ids, attention_mask=mask).logits
        out = []
        for r, (p, c) in enumerate(zip(prompts, completions)):
            s, n = len(p), len(p) + len(c)
            rows = torch.log_softmax(logits[r, s - 1:n - 1].float() / self.config.temperature, dim=-1)
            out.append(rows.gather(-1, ids[r, s:n, None])[:, 0])
        return out

    def update(self, batch: RolloutBatch) -> dict[str, Any]:
        """One optimizer step on ``batch``: micro-batched forward/backward, clip, AdamW (plain torch)."""
        cfg = self.config
        n = len(batch.completions)
        den = batch.num_tokens if cfg.loss_agg_mode == "token-mean" else sum(1 for c in batch.completions if c)
        den = max(den, 1)
        mbs = cfg.micro_batch_size or n
        loss_total, kl_total = 0.0, 0.0
        mismatches, max_dev = 0, 0.0
        self.hf.train()
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        for start in range(0, n, mbs):
            idx = list(range(start, min(start + mbs, n)))
            prompts = [batch.prompts[i] for i in idx]
            comps = [batch.completions[i] for i in idx]
            logp, mask = _pad(self._logprobs(self.hf, prompts, comps), self.device)
            old, _ = _pad([batch.old_logprobs[i] for i in idx], self.device)
            with torch.no_grad():
                lp = logp.detach()[mask]
                od = old[mask]
                mismatches += int((lp.view(torch.int32) != od.view(torch.int32)).sum())
                if lp.numel():
                    max_dev = max(max_dev, float((lp.double() - od.double()).exp().sub(1.0).abs().max()))
            adv = batch.advantages[idx].to(self.device)
            loss = ppo_clip_loss(logp, old, adv, mask, cfg.clip_low, cfg.clip_high, cfg.loss_agg_mode, den)
            loss_total += float(loss.detach())
            if cfg.kl_coef > 0:
                with torch.no_grad():
                    ref, _ = _pad(self._logprobs(self.ref, prompts, comps), self.device)
                kl = _aggregate(_k3(logp, ref), mask, cfg.loss_agg_mode, den)
                kl_total += float(kl.detach())
                loss = loss + cfg.kl_coef * kl
            if loss.requires_grad:  # a micro-batch of empty completions has no graph
                loss.backward()
            with torch.no_grad():
                for p, master in zip(self.params, self.masters):
                    if p.grad is not None:
                        master.grad.add_(p.grad.to(torch.float32))  # type: ignore[union-attr]
                        p.grad = None
        norm = math.nan
        if cfg.max_grad_norm is not None:
            norm = float(torch.nn.utils.clip_grad_norm_(self.masters, cfg.max_grad_norm))
        self.optimizer.step()
        with torch.no_grad():
            for p, master in zip(self.params, self.masters):
                p.copy_(master.to(p.dtype))
        return {"loss": loss_total, "kl": kl_total, "mismatches": mismatches, "max_ratio_dev": max_dev,
                "grad_norm": norm}

    def step(self) -> StepMetrics:
        """Rollout, update, metrics; advances the step counter."""
        t0 = time.perf_counter()
        batch = self.rollout(self.step_index)
        t1 = time.perf_counter()
        out = self.update(batch)
        t2 = time.perf_counter()
        m = StepMetrics(self.step_index, float(batch.rewards.double().mean()), out["loss"], out["kl"],
                        out["mismatches"], batch.num_tokens, out["max_ratio_dev"], out["grad_norm"],
                        self.weights_sha256(), t1 - t0, t2 - t1)
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
