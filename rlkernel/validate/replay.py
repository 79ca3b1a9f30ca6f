"""Replay a recorded rollout through the trainer's forward and compare the log-probs bit for bit.

The trainer side is :func:`rlkernel.rl.packed_logprobs` over whole sequences (prompt +
completion), packed in a shuffled order and split into micro-batches of a size the rollout
never used. Each completion token's trainer log-prob is compared with the rollout's on its
float32 bits; the importance ratio ``exp(trainer - rollout)`` of an unchanged policy, which
should be exactly 1, is summarised as ``|ratio - 1|``.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from rlkernel.model import Qwen3ForCausalLM
from rlkernel.rl import packed_logprobs
from rlkernel.validate.record import Record

__all__ = ["Mismatch", "ReplayResult", "compare_logprobs", "ratio_stats", "replay", "synchronize",
           "trainer_logprobs"]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (for timing); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Mismatch:
    """One completion token whose trainer log-prob has other bits than the rollout's."""

    sample: int
    position: int
    token: int
    rollout: float
    trainer: float

    def describe(self) -> str:
        r = int(torch.tensor(self.rollout, dtype=torch.float32).view(torch.int32).item()) & 0xFFFFFFFF
        t = int(torch.tensor(self.trainer, dtype=torch.float32).view(torch.int32).item()) & 0xFFFFFFFF
        return (f"sample {self.sample} completion token {self.position} (id {self.token}): rollout "
                f"{self.rollout!r} ({r:#010x}), trainer {self.trainer!r} ({t:#010x})")


def ratio_stats(rollout: torch.Tensor, trainer: torch.Tensor) -> dict[str, Any]:
    """Bitwise mismatches and the ``|exp(trainer - rollout) - 1|`` distribution of two float32 log-prob vectors.

    Parameters
    ----------
    rollout, trainer : Tensor, float32, [T]

    Returns
    -------
    dict: ``tokens``, ``mismatches`` (tokens whose float32 bits differ, +0/-0 and NaN payloads
    included), and ``max``, ``p50``, ``p99``, ``mean`` of ``|ratio - 1|`` computed in float64
    (0.0 for no tokens).
    """
    a = rollout.detach().to("cpu", torch.float32).contiguous()
    b = trainer.detach().to("cpu", torch.float32).contiguous()
    if a.shape != b.shape:
        raise ValueError(f"ratio_stats: rollout {tuple(a.shape)} and trainer {tuple(b.shape)} log-probs differ in "
                         f"shape; expected one value per completion token on each side")
    mismatches = int((a.view(torch.int32) != b.view(torch.int32)).sum())
    dev = (torch.exp(b.double() - a.double()) - 1).abs()
    if dev.numel() == 0:
        return {"tokens": 0, "mismatches": 0, "max": 0.0, "p50": 0.0, "p99": 0.0, "mean": 0.0}
    return {"tokens": int(a.numel()), "mismatches": mismatches, "max": float(dev.max()),
            "p50": float(torch.quantile(dev, 0.5)), "p99": float(torch.quantile(dev, 0.99)),
            "mean": float(dev.mean())}


def compare_logprobs(rollout: list[torch.Tensor], trainer: list[torch.Tensor], tokens: list[list[int]],
                     limit: int = 10) -> tuple[dict[str, Any], list[Mismatch]]:
    """:func:`ratio_stats` over every sample, and the first ``limit`` mismatching tokens."""
    first: list[Mismatch] = []
    for j, (r, t) in enumerate(zip(rollout, trainer)):
        if len(first) >= limit:
            break
        diff = (r.to("cpu", torch.float32).contiguous().view(torch.int32)
                != t.to("cpu", torch.float32).contiguous().view(torch.int32)).nonzero()
        for i in diff[:, 0].tolist()[:limit - len(first)]:
            first.append(Mismatch(j, i, tokens[j][i], float(r[i]), float(t[i])))
    return ratio_stats(_cat(rollout), _cat(trainer)), first


def _cat(xs: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([x.to("cpu", torch.float32) for x in xs]) if xs else torch.zeros(0, dtype=torch.float32)


def _temperature(t: float) -> float:
    # greedy requests (temperature 0) carry the log-probs of the unscaled distribution
    return t if t > 0 else 1.0


def trainer_logprobs(model: Qwen3ForCausalLM, prompts: list[list[int]], completions: list[list[int]],
                     temperatures: list[float], *, micro_batch_size: int | None = None,
                     order: list[int] | None = None) -> list[torch.Tensor]:
    """The trainer forward's log-prob of every completion token, one float32 CPU tensor per sequence.

    Sequences are packed in ``order`` (default: as given), grouped by temperature (one
    :func:`~rlkernel.rl.packed_logprobs` call per distinct temperature, its logits divided by it),
    and split into micro-batches of ``micro_batch_size`` sequences.
    """
    device = model.lm_head.weight.device
    order = list(range(len(prompts))) if order is None else order
    out: list[torch.Tensor] = [torch.zeros(0)] * len(prompts)
    for temp in dict.fromkeys(temperatures[j] for j in order):
        group = [j for j in order if temperatures[j] == temp]
        seqs = [prompts[j] + completions[j] for j in group]
        cu = [0]
        for s in seqs:
            cu.append(cu[-1] + len(s))
        ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int64, device=device)
        with torch.no_grad():
            logp = packed_logprobs(model, ids, torch.tensor(cu, dtype=torch.int64, device=device),
                                   temperature=_temperature(temp), micro_batch_size=micro_batch_size).cpu()
        for k, j in enumerate(group):
            start = cu[k] + len(prompts[j])
            out[j] = logp[start:cu[k + 1]].clone()
    return out


@dataclass
class ReplayResult:
    """The trainer forward of a record in one batching, compared with the record's log-probs.

    Attributes
    ----------
    micro_batch_size : int or None
        Sequences per trainer forward (None: all in one).
    order_seed : int
        Seed of the shuffled packing order.
    sequences, tokens : int
        Sequences replayed and completion tokens compared.
    mismatches : int
        Completion tokens whose trainer log-prob has other bits than the rollout's (expected 0).
    ratio : dict
        ``|exp(trainer - rollout) - 1|``: ``max``, ``p50``, ``p99``, ``mean``.
    seconds : float
        Wall time of the trainer forward (every micro-batch, the log-prob head included).
    first_mismatches : list of Mismatch
    """

    micro_batch_size: int | None
    order_seed: int
    sequences: int
    tokens: int
    mismatches: int
    ratio: dict[str, float]
    seconds: float
    first_mismatches: list[Mismatch] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["first_mismatches"] = [m.describe() for m in self.first_mismatches]
        return d


def replay(model: Qwen3ForCausalLM, record: Record, micro_batch_size: int | None = None, *,
           order_seed: int = 0, check_hashes: tuple[str, str] | None = None) -> ReplayResult:
    """Run ``record``'s sequences through the trainer forward in a shuffled packing order and compare.

    Parameters
    ----------
    model : Qwen3ForCausalLM
        The model the record was made with.
    record : Record
    micro_batch_size : int, optional
        Sequences per forward (default: all in one).
    order_seed : int
        The packing order is ``random.Random(order_seed).shuffle``'d sample order.
    check_hashes : (model_sha256, config_sha256), optional
        The loaded model's hashes (:func:`~rlkernel.validate.models.model_sha256`,
        :func:`~rlkernel.validate.models.config_sha256`): a record made with another model raises
        :class:`~rlkernel.validate.record.HashMismatch` before anything runs.

    Returns
    -------
    ReplayResult
    """
    if check_hashes is not None:
        record.check_model(*check_hashes)
    order = list(range(len(record.samples)))
    random.Random(order_seed).shuffle(order)
    prompts = [record.prompts[s.prompt_index] for s in record.samples]
    completions = [s.token_ids for s in record.samples]
    temps = [record.temperature(s) for s in record.samples]
    device = model.lm_head.weight.device
    synchronize(device)
    start = time.perf_counter()
    trainer = trainer_logprobs(model, prompts, completions, temps, micro_batch_size=micro_batch_size, order=order)
    synchronize(device)
    seconds = time.perf_counter() - start
    stats, first = compare_logprobs([s.logprobs for s in record.samples], trainer, completions)
    ratio = {k: stats[k] for k in ("max", "p50", "p99", "mean")}
    return ReplayResult(micro_batch_size, order_seed, len(order), stats["tokens"], stats["mismatches"], ratio,
                        seconds, first)
