"""``rlkernel validate --train-steps N``: N GRPO steps of ours next to the ordinary PyTorch path.

Both start from the same weights (a tiny Qwen3 for :class:`rlkernel.train.ReverseDigits`,
:func:`rlkernel.train.init_weights_` with the seed) and see the same prompts and rewards:

- **ours**: :class:`rlkernel.train.GRPOTrainer` (rollout engine, exact backward, exact gradient
  accumulation, exact clip, the ``adamw`` contract). Its on-policy check must read 0 mismatches
  at every step: the trainer's log-prob of every completion token, before the update, has the
  rollout's bits.
- **ordinary** (``baseline``): :class:`rlkernel.validate.train_baseline.OrdinaryGRPO`
  (transformers ``generate`` and full forward, torch.optim.AdamW, torch's clip). Its mismatches
  are the measurement, never a failure.

Optionally (``micro_batch_check``) ours runs again once per micro-batch size from the same
initial weights; every run must end with the same weights SHA-256 (the gradient accumulation
is exact, so the micro-batching cannot change a bit).

:func:`run_train` returns the report document (``mode: "train"``) that
:mod:`rlkernel.validate.report` prints and writes.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rlkernel.model import Qwen3Config, Qwen3ForCausalLM
from rlkernel.train import (
    GRPOConfig,
    GRPOTrainer,
    ReverseDigits,
    StepMetrics,
    init_weights_,
    task_config,
    weights_sha256,
)

__all__ = ["TrainConfig", "build_task_model", "run_train"]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_MODES = ("token-mean", "seq-mean-token-mean")

StepCallback = Callable[[StepMetrics, "StepMetrics | None"], None]


@dataclass
class TrainConfig:
    """Settings of an N-step run (the ``rlkernel validate --train-steps`` flags; docs/validate.md).

    Attributes
    ----------
    steps : int
        GRPO steps (rollout + one optimizer step each).
    seed : int
        Initial weights (:func:`init_weights_`), the task's prompts and the rollout's sampling seeds.
    device : str, optional
        Default: cuda when available, else cpu.
    dtype : str
        Our model's dtype (bfloat16 or float16; AdamW keeps fp32 masters).
    num_prompts, group_size : int
        Prompts per step and completions per prompt.
    temperature : float
        Sampling temperature (> 0), also the trainer's.
    lr, weight_decay : float
        AdamW's (betas 0.9, 0.999, eps 1e-8 on both sides).
    kl_coef : float
        k3 KL to a frozen copy of the initial model (0 = none).
    loss_agg_mode : str
        ``token-mean`` or ``seq-mean-token-mean``.
    micro_batch : int, optional
        Sequences per forward/backward (both sides); None = the whole step's batch.
    max_grad_norm : float, optional
        Global-norm clip; None = no clip.
    micro_batch_check : list of int
        Run ours once per size (fresh from the initial weights); the final hashes must agree.
    baseline : str
        ``transformers``, ``none`` or ``auto`` (transformers when installed).
    baseline_dtype : str, optional
        transformers' model dtype (default ``dtype``; float32 allowed).
    hidden_size, num_layers : int
        The tiny model's shape (:func:`rlkernel.train.task_config`).
    init_std : float
        Standard deviation of the initial weights (:func:`rlkernel.train.init_weights_`).
    min_digits, max_digits : int
        :class:`ReverseDigits` prompt lengths.
    """

    steps: int = 10
    seed: int = 0
    device: str | None = None
    dtype: str = "bfloat16"
    num_prompts: int = 4
    group_size: int = 4
    temperature: float = 1.0
    lr: float = 1e-3
    weight_decay: float = 0.0
    kl_coef: float = 0.0
    loss_agg_mode: str = "token-mean"
    micro_batch: int | None = None
    max_grad_norm: float | None = 1.0
    micro_batch_check: list[int] = field(default_factory=list)
    baseline: str = "auto"
    baseline_dtype: str | None = None
    hidden_size: int = 64
    num_layers: int = 2
    min_digits: int = 2
    max_digits: int = 4
    init_std: float = 0.02

    def check(self) -> None:
        """Raise ``ValueError`` for settings that cannot run (naming the flag to fix)."""
        ints = {"--train-steps": self.steps, "--num-prompts": self.num_prompts, "--hidden-size": self.hidden_size,
                "--num-layers": self.num_layers}
        for flag, value in ints.items():
            if value < 1:
                raise ValueError(f"validate: {flag} = {value}; expected an int >= 1")
        if self.group_size < 2:
            raise ValueError(f"validate: --group-size = {self.group_size}; GRPO needs >= 2 completions per prompt")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ValueError(f"validate: --grpo-micro-batch = {self.micro_batch}; expected an int >= 1")
        if any(v < 1 for v in self.micro_batch_check):
            raise ValueError(f"validate: --train-micro-batch-check = {self.micro_batch_check}; expected ints >= 1")
        if not (self.temperature > 0 and math.isfinite(self.temperature)):
            raise ValueError(f"validate: --temperature = {self.temperature}; GRPO samples, expected a finite value > 0")
        if not (self.lr >= 0 and math.isfinite(self.lr)):
            raise ValueError(f"validate: --lr = {self.lr}; expected a finite value >= 0")
        if not (self.kl_coef >= 0 and math.isfinite(self.kl_coef)):
            raise ValueError(f"validate: --kl-coef = {self.kl_coef}; expected a finite value >= 0")
        if self.loss_agg_mode not in _MODES:
            raise ValueError(f"validate: --loss-agg-mode = {self.loss_agg_mode!r}; expected one of {_MODES}")
        if self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"validate: --dtype {self.dtype}; rlkernel's model runs bfloat16 or float16")
        if self.baseline_dtype is not None and self.baseline_dtype not in _DTYPES:
            raise ValueError(f"validate: --baseline-dtype {self.baseline_dtype}; expected one of {sorted(_DTYPES)}")
        if self.baseline not in ("transformers", "none", "auto"):
            raise ValueError(f"validate: --baseline {self.baseline}; expected transformers, none or auto")
        if not 1 <= self.min_digits <= self.max_digits:
            raise ValueError(f"validate: digits {self.min_digits}..{self.max_digits}; expected 1 <= min <= max")

    def grpo_config(self, micro_batch: int | None) -> GRPOConfig:
        """The :class:`GRPOConfig` both sides use, with ``micro_batch`` sequences per forward/backward."""
        return GRPOConfig(prompts_per_step=self.num_prompts, group_size=self.group_size,
                          temperature=self.temperature, lr=self.lr, weight_decay=self.weight_decay,
                          kl_coef=self.kl_coef, loss_agg_mode=self.loss_agg_mode, micro_batch_size=micro_batch,
                          max_grad_norm=self.max_grad_norm, seed=self.seed)

    def task(self) -> ReverseDigits:
        return ReverseDigits(min_digits=self.min_digits, max_digits=self.max_digits, seed=self.seed)


def build_task_model(cfg: TrainConfig, device: torch.device) -> Qwen3ForCausalLM:
    """The tiny ReverseDigits Qwen3 (:func:`task_config`) with :func:`init_weights_` (seed ``cfg.seed``)."""
    config = Qwen3Config.from_dict(task_config(hidden_size=cfg.hidden_size, num_layers=cfg.num_layers))
    model = Qwen3ForCausalLM(config, dtype=_DTYPES[cfg.dtype], device=device)
    init_weights_(model, seed=cfg.seed, std=cfg.init_std)
    return model


def _device(name: str | None) -> torch.device:
    return torch.device(name) if name else torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _baseline_wanted(mode: str) -> bool:
    if mode == "none":
        return False
    if mode == "transformers":
        from rlkernel.validate.baseline import _transformers

        _transformers()  # raises ImportError with the install hint
        return True
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _trainer(model: Qwen3ForCausalLM, cfg: TrainConfig, micro_batch: int | None) -> GRPOTrainer:
    ref = None
    if cfg.kl_coef > 0:
        ref = copy.deepcopy(model).requires_grad_(False)
    return GRPOTrainer(model, cfg.task(), cfg.grpo_config(micro_batch), ref_model=ref)


def _side_summary(history: list[dict[str, Any]]) -> dict[str, Any]:
    return {"mismatches": sum(m["mismatches"] for m in history), "tokens": sum(m["tokens"] for m in history),
            "steps_with_mismatches": sum(1 for m in history if m["mismatches"]),
            "max_abs_ratio_minus_1": max((m["max_ratio_dev"] for m in history), default=0.0),
            "reward_first": history[0]["reward"] if history else None,
            "reward_last": history[-1]["reward"] if history else None,
            "rollout_s": sum(m["rollout_s"] for m in history), "train_s": sum(m["train_s"] for m in history),
            "final_sha256": history[-1]["weights_sha256"] if history else None}


def run_train(cfg: TrainConfig, on_step: StepCallback | None = None,
              on_check: Callable[[int, str], None] | None = None,
              command: list[str] | None = None) -> dict[str, Any]:
    """Run ``cfg.steps`` GRPO steps of ours (and of the ordinary path) and return the report document.

    Parameters
    ----------
    cfg : TrainConfig
    on_step : callable, optional
        Called after each step with (ours, ordinary or None) :class:`StepMetrics`.
    on_check : callable, optional
        Called after each micro-batch check run with (micro-batch size, final SHA-256).
    command : list of str, optional
        The command line, for the report.

    Raises
    ------
    ValueError
        Bad settings.
    ImportError
        ``baseline="transformers"`` without transformers installed.
    """
    cfg.check()
    device = _device(cfg.device)
    baseline = _baseline_wanted(cfg.baseline)
    model = build_task_model(cfg, device)
    initial = weights_sha256(model)
    doc: dict[str, Any] = {
        "mode": "train", "settings": asdict(cfg), "device": str(device), "command": command,
        "model": {"source": f"ReverseDigits tiny Qwen3 (task_config hidden {cfg.hidden_size}, {cfg.num_layers} "
                            f"layers), init_weights_ seed {cfg.seed} std {cfg.init_std}",
                  "dtype": cfg.dtype, "config": {k: v for k, v in vars(model.config).items() if k != "extra"},
                  "parameters": sum(p.numel() for p in model.parameters()), "initial_sha256": initial},
        "grpo": asdict(cfg.grpo_config(cfg.micro_batch)),
    }
    ordinary = None
    if baseline:
        from rlkernel.validate.train_baseline import OrdinaryGRPO

        bdtype = cfg.baseline_dtype or cfg.dtype
        ordinary = OrdinaryGRPO(model, cfg.task(), cfg.grpo_config(cfg.micro_batch), dtype=_DTYPES[bdtype])
        doc["baseline"] = {"name": "transformers", "dtype": bdtype, "attn_implementation": "sdpa",
                           "initial_sha256": ordinary.weights_sha256()}
    else:
        doc["baseline"] = None
    trainer = _trainer(model, cfg, cfg.micro_batch)
    steps: list[dict[str, Any]] = []
    start = time.perf_counter()
    for _ in range(cfg.steps):
        ours = trainer.step()
        theirs = ordinary.step() if ordinary is not None else None
        steps.append({"step": ours.step, "ours": ours.as_dict(), "baseline": theirs.as_dict() if theirs else None})
        if on_step is not None:
            on_step(ours, theirs)
    doc["seconds"] = time.perf_counter() - start
    doc["steps"] = steps
    del trainer, ordinary

    doc["micro_batch_check"] = None
    if cfg.micro_batch_check:
        runs = []
        main_hashes = [s["ours"]["weights_sha256"] for s in steps]
        for mb in cfg.micro_batch_check:
            if mb == cfg.micro_batch:
                hashes = main_hashes
            else:
                t = _trainer(build_task_model(cfg, device), cfg, mb)
                hashes = [m.weights_sha256 for m in t.train(cfg.steps)]
                del t
            first = next((i for i, (a, b) in enumerate(zip(hashes, main_hashes)) if a != b), None)
            runs.append({"micro_batch_size": mb, "final_sha256": hashes[-1], "first_step_differing_from_main": first})
            if on_check is not None:
                on_check(mb, hashes[-1])
        doc["micro_batch_check"] = {"sizes": list(cfg.micro_batch_check), "runs": runs,
                                    "ok": len({r["final_sha256"] for r in runs}) == 1 and
                                    runs[0]["final_sha256"] == main_hashes[-1]}

    ours_hist = [s["ours"] for s in steps]
    base_hist = [s["baseline"] for s in steps if s["baseline"] is not None]
    doc["summary"] = {"steps": cfg.steps, "ours": _side_summary(ours_hist),
                      "baseline": _side_summary(base_hist) if base_hist else None,
                      "micro_batch_check_ok": None if doc["micro_batch_check"] is None
                      else doc["micro_batch_check"]["ok"]}
    doc["final_sha256"] = doc["summary"]["ours"]["final_sha256"]
    doc["ok"] = doc["summary"]["ours"]["mismatches"] == 0 and doc["summary"]["micro_batch_check_ok"] is not False
    return doc
