"""``rms_norm``'s gradients (``rms_norm_backward`` through autograd) against float64 autograd,
next to torch's bf16 autograd of Hugging Face's Qwen3RMSNorm.

Each data set measures dx and dweight (two rows). rlkernel: ``loss.backward()`` through
``rlkernel.ops.rms_norm`` (dx from the contract, dweight the exact sum of the per-token terms,
rounded once to the weight's dtype). Native: torch autograd of ``w * (x.float() * rsqrt(...)).to(bf16)``.
Truth: autograd of the same formula in float64 on the bf16 inputs and gradient.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": (64, 1024), "full": (1024, 4096)}
EPS = 1e-6


def _grads(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor, w: torch.Tensor,
           dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    xl, wl = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    fn(xl, wl).backward(dy)
    assert xl.grad is not None and wl.grad is not None
    return xl.grad, wl.grad


def _hf(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def _truth(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def _run(kind: str, factor: float, which: int) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        t, h = SHAPES[size]
        name = f"rms_norm_backward/{kind}/{factor}/{size}"
        x = data.randn(f"{name}/x", (t, h))
        if kind == "outliers":
            x = data.outlier_channels(x, name, factor)
        elif kind == "massive":
            x = data.massive_tokens(x, name, factor)
        w = (1.0 + data.randn(f"{name}/w", (h,), std=0.3, dtype=torch.float64)).to(torch.bfloat16)
        dy = data.randn(f"{name}/dy", (t, h))
        x, w, dy = x.to(device), w.to(device), dy.to(device)
        truth = _grads(_truth, x.double(), w.double(), dy.double())[which]
        ours = _grads(lambda a, b: rlkernel.ops.rms_norm(a, b, eps=EPS), x, w, dy)[which]
        native = _grads(_hf, x, w, dy)[which]
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch autograd of HF Qwen3RMSNorm (bf16)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    sets = [("normal", "x, dy ~ N(0,1), weight ~ 1 + N(0,0.3^2), bf16", "normal", 0.0),
            *[(f"outliers_x{int(f)}", f"{data.OUTLIER_COUNT} channels of x x{int(f)}", "outliers", f)
              for f in data.OUTLIER_FACTORS],
            ("massive_tokens", "2 rows of x x1000", "massive", 1000.0)]
    return [Measurement("rms_norm_backward", f"{name}/{grad}", f"{desc}: {grad}", "rel_l2", _run(kind, f, i),
                        shape=lambda size: "T x H = {} x {}".format(*SHAPES[size]))
            for name, desc, kind, f in sets for i, grad in enumerate(("dx", "dweight"))]
