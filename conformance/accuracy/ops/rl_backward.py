"""The RL losses' gradients (``kl_k3_backward``, ``masked_mean_backward`` through autograd) against
float64 autograd, next to torch's fp32 autograd of the expressions RL trainers write (verl-style)."""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (B sequences, T tokens) per size
SHAPES = {"small": (64, 512), "full": (512, 8192)}


def _grad(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    xl = x.detach().clone().requires_grad_(True)
    fn(xl).backward(g)
    assert xl.grad is not None
    return xl.grad


def _kl(spread: float) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        name = f"rl_backward/kl_k3/{spread}/{size}"
        ref = -data.randn(f"{name}/ref", SHAPES[size], std=2.0, dtype=torch.float32).abs()
        logp = ref + data.randn(f"{name}/d", SHAPES[size], std=spread, dtype=torch.float32)
        g = data.randn(f"{name}/g", SHAPES[size], dtype=torch.float32)
        logp, ref, g = logp.to(device), ref.to(device), g.to(device)

        def k3(lp: torch.Tensor, rf: torch.Tensor) -> torch.Tensor:
            d = rf - lp
            return torch.exp(d) - d - 1

        truth = _grad(lambda lp: k3(lp, ref.double()), logp.double(), g.double())
        ours = _grad(lambda lp: rlkernel.ops.kl_k3(lp, ref), logp, g)
        native = _grad(lambda lp: k3(lp, ref), logp, g)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch autograd of exp(d) - d - 1 (fp32)", tensor_errors(native, truth), native=True)]
    return run


def _torch_mean(x: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    m = mask.to(x.dtype)
    if mode == "token-mean":
        return (x * m).sum() / m.sum()
    seq = (x * m).sum(-1)
    keep = (m.sum(-1) > 0).to(x.dtype)
    return (seq * keep).sum() / keep.sum()


def _mean(mode: str) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        b, t = SHAPES[size]
        name = f"rl_backward/masked_mean/{mode}/{size}"
        x = data.randn(f"{name}/x", (b, t), dtype=torch.float32).to(device)
        lens = data.randint(f"{name}/len", (b,), 1, t + 1)
        mask = (torch.arange(t)[None, :] < lens[:, None]).to(device)
        g = torch.tensor(0.7, dtype=torch.float32, device=device)
        truth = _grad(lambda a: _torch_mean(a, mask, mode), x.double(), g.double())
        ours = _grad(lambda a: rlkernel.ops.masked_mean(a, mask, mode=mode), x, g)
        native = _grad(lambda a: _torch_mean(a, mask, mode), x, g)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch autograd of (x * mask).sum() / count (fp32)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    shape = "B x T = {} x {}".format
    out = [Measurement("kl_k3_backward", name, desc, "rel_l2", _kl(spread), shape=lambda size: shape(*SHAPES[size]))
           for name, desc, spread in (("close_policies", "ref - logp ~ N(0, 0.05^2)", 0.05),
                                      ("far_policies", "ref - logp ~ N(0, 1)", 1.0))]
    # seq-mean-token-mean divides twice (by c_b and by the count), as torch does, in the other order;
    # both are two fp32 roundings, so its row compares rounding luck, not accuracy: not listed.
    out += [Measurement("masked_mean_backward", mode, f"{mode}, ragged masks", "rel_l2", _mean(mode),
                        shape=lambda size: shape(*SHAPES[size]))
            for mode in ("token-mean", "seq-mean-token-sum")]
    return out
