"""``silu_mul``'s gradients (``silu_mul_backward`` through autograd) against float64 autograd, next
to torch's bf16 autograd of ``F.silu(gate) * up`` (Hugging Face's Qwen3 MLP). Two rows per data
set: dgate and dup."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": (64, 2048), "full": (1024, 12288)}


def _grads(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], g: torch.Tensor, u: torch.Tensor,
           dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gl, ul = g.detach().clone().requires_grad_(True), u.detach().clone().requires_grad_(True)
    fn(gl, ul).backward(dy)
    assert gl.grad is not None and ul.grad is not None
    return gl.grad, ul.grad


def _run(std: float, outliers: bool, which: int) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        name = f"silu_mul_backward/{std}/{outliers}/{size}"
        g = data.randn(f"{name}/g", SHAPES[size], std=std)
        u = data.randn(f"{name}/u", SHAPES[size])
        if outliers:
            g = data.outlier_channels(g, f"{name}/gch", 40.0)
            u = data.outlier_channels(u, f"{name}/uch", 1000.0)
        dy = data.randn(f"{name}/dy", SHAPES[size])
        g, u, dy = g.to(device), u.to(device), dy.to(device)
        truth = _grads(lambda a, b: a * torch.sigmoid(a) * b, g.double(), u.double(), dy.double())[which]
        ours = _grads(rlkernel.ops.silu_mul, g, u, dy)[which]
        native = _grads(lambda a, b: F.silu(a) * b, g, u, dy)[which]
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch autograd of F.silu(gate) * up (bf16)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    sets = [("normal", "gate, up, dy ~ N(0,1), bf16", 1.0, False),
            ("wide_gates", "gate ~ N(0,8^2): saturated and vanishing sigmoid", 8.0, False),
            ("outliers", f"{data.OUTLIER_COUNT} channels: gate x40, up x1000", 1.0, True)]
    return [Measurement("silu_mul_backward", f"{name}/{grad}", f"{desc}: {grad}", "rel_l2", _run(std, out, i),
                        shape=lambda size: "{} x {}".format(*SHAPES[size]))
            for name, desc, std, out in sets for i, grad in enumerate(("dgate", "dup"))]
