"""The RL losses against float64, next to the usual torch code of RL trainers (verl-style, fp32).

``masked_mean`` and ``ppo_loss`` reduce a whole batch to a scalar (metric: relative error of
that scalar); ``kl_k3`` and ``group_advantages`` are elementwise / per group (relative L2).
Native: the fp32 torch expressions verl writes (``(x * mask).sum() / mask.sum()``,
``torch.exp``, ``torch.maximum``, ``torch.clamp``, ``std(unbiased)``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (B sequences, T tokens) per size
SHAPES = {"small": (64, 512), "full": (512, 8192)}
CLIP = 0.2


def _scalar_errors(out: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    o, t = float(out), float(truth)
    return {"rel": abs(o - t) / abs(t) if t else abs(o - t), "abs": abs(o - t)}


def _batch(size: str, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    b, t = SHAPES[size]
    old = -data.randn(f"{name}/old", (b, t), std=2.0, dtype=torch.float32).abs()
    logp = old + data.randn(f"{name}/d", (b, t), std=0.05, dtype=torch.float32)
    lens = data.randint(f"{name}/len", (b,), 1, t + 1)
    mask = torch.arange(t)[None, :] < lens[:, None]
    adv = data.randn(f"{name}/a", (b,), dtype=torch.float32)
    return logp, old, adv, mask


def _masked_mean(size: str, device: torch.device) -> list[Result]:
    logp, _, _, mask = _batch(size, f"rl/masked_mean/{size}")
    x, mask = (logp * 1000.0).to(device), mask.to(device)  # token losses of mixed magnitude and sign
    x = x + data.randn(f"rl/masked_mean/{size}/off", tuple(x.shape), std=1e4, dtype=torch.float32).to(device)
    truth = (x.double() * mask).sum() / mask.sum()
    with torch.no_grad():
        ours = rlkernel.ops.masked_mean(x, mask)
        native = (x * mask).sum() / mask.sum()
    return [Result(RLKERNEL, _scalar_errors(ours, truth)),
            Result("(x * mask).sum() / mask.sum() (fp32)", _scalar_errors(native, truth), native=True)]


def _ppo(size: str, device: torch.device) -> list[Result]:
    logp, old, adv, mask = (t.to(device) for t in _batch(size, f"rl/ppo/{size}"))
    a = adv[:, None].expand_as(logp)

    def loss(lp: torch.Tensor, op: torch.Tensor, av: torch.Tensor) -> torch.Tensor:
        r = torch.exp(lp - op)
        tok = torch.maximum(-av * r, -av * torch.clamp(r, 1 - CLIP, 1 + CLIP))
        return (tok * mask).sum() / mask.sum()

    truth = loss(logp.double(), old.double(), a.double())
    with torch.no_grad():
        ours = rlkernel.ops.ppo_loss(logp, old, adv, mask, clip_low=CLIP, clip_high=CLIP)
        native = loss(logp, old, a)
    return [Result(RLKERNEL, _scalar_errors(ours, truth)),
            Result("verl-style fp32 clipped loss", _scalar_errors(native, truth), native=True)]


def _kl(size: str, device: torch.device) -> list[Result]:
    logp, old, _, _ = (t.to(device) for t in _batch(size, f"rl/kl/{size}"))
    d = old.double() - logp.double()
    truth = torch.exp(d) - d - 1
    with torch.no_grad():
        ours = rlkernel.ops.kl_k3(logp, old)
        dn = old - logp
        native = torch.exp(dn) - dn - 1
    return [Result(RLKERNEL, tensor_errors(ours, truth)), Result("torch exp(d) - d - 1 (fp32)",
                                                                 tensor_errors(native, truth), native=True)]


def _advantages(size: str, device: torch.device) -> list[Result]:
    b, _ = SHAPES[size]
    r = (data.randint(f"rl/adv/{size}", (b, 8), 0, 2).to(torch.float32)
         + data.randn(f"rl/adv/{size}/n", (b, 8), std=0.01, dtype=torch.float32)).to(device)
    rd = r.double()
    truth = (rd - rd.mean(-1, keepdim=True)) / (rd.std(-1, keepdim=True) + 1e-6)
    with torch.no_grad():
        ours = rlkernel.ops.group_advantages(r)
        native = (r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)
    return [Result(RLKERNEL, tensor_errors(ours, truth)), Result("torch (r - mean) / (std + eps) (fp32)",
                                                                 tensor_errors(native, truth), native=True)]


def measurements() -> list[Measurement]:
    shape: Callable[[str], str] = lambda size: "B x T = {} x {}".format(*SHAPES[size])  # noqa: E731
    return [
        Measurement("masked_mean", "token_mean", "token losses ~ N(0,1e4^2), ragged masks", "rel", _masked_mean,
                    shape=shape),
        Measurement("ppo_loss", "grpo_token_mean", "logp within N(0,0.05^2) of the rollout's, GRPO advantages",
                    "rel", _ppo, shape=shape),
        Measurement("kl_k3", "near_policy", "logp within N(0,0.05^2) of the reference", "rel_l2", _kl, shape=shape),
        Measurement("group_advantages", "binary_rewards", "groups of 8 binary rewards + N(0,0.01^2)", "rel_l2",
                    _advantages, shape=lambda size: f"G x n = {SHAPES[size][0]} x 8"),
    ]
