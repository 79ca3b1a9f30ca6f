"""``rope``'s gradient (``rope_backward`` through autograd) against float64 autograd, next to torch's
bf16 autograd of Hugging Face's rotary embedding (fp32 angles, cos/sin cast to bf16)."""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (tokens, heads, head_dim)
SHAPES = {"small": (256, 8, 128), "full": (4096, 32, 128)}
THETA = 1e6


def _hf(x: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.int64, device=x.device).to(dtype) / d))
    emb = torch.cat([positions.to(dtype)[:, None] * inv[None, :]] * 2, dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    if dtype == torch.float32:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _grad(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    xl = x.detach().clone().requires_grad_(True)
    fn(xl).backward(dy)
    assert xl.grad is not None
    return xl.grad


def _run(start: int) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        name = f"rope_backward/{start}/{size}"
        x = data.randn(f"{name}/x", SHAPES[size]).to(device)
        dy = data.randn(f"{name}/dy", SHAPES[size]).to(device)
        pos = torch.arange(start, start + SHAPES[size][0], device=device)
        truth = _grad(lambda a: _hf(a, pos, torch.float64), x.double(), dy.double())
        ours = _grad(lambda a: rlkernel.ops.rope(a, pos, theta=THETA), x, dy)
        native = _grad(lambda a: _hf(a, pos, torch.float32), x, dy)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch autograd of HF rotary embedding (bf16 tables)", tensor_errors(native, truth),
                       native=True)]
    return run


def measurements() -> list[Measurement]:
    sets = [("positions_0", "dy ~ N(0,1) bf16, positions 0..T-1", 0),
            ("positions_30000", "positions 30000..30000+T-1 (large angles)", 30000)]
    return [Measurement("rope_backward", name, desc, "rel_l2", _run(start),
                        shape=lambda size: "T x H x D = {} x {} x {}".format(*SHAPES[size]))
            for name, desc, start in sets]
