"""``silu_mul`` against float64, next to Hugging Face's ``act_fn(gate) * up`` in the input dtype."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": (64, 2048), "full": (1024, 12288)}


def _run(std: float) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        name = f"silu_mul/{std}/{size}"
        g = data.randn(f"{name}/g", SHAPES[size], std=std).to(device)
        u = data.randn(f"{name}/u", SHAPES[size]).to(device)
        gd = g.double()
        truth = gd * torch.sigmoid(gd) * u.double()
        with torch.no_grad():
            ours = rlkernel.ops.silu_mul(g, u)
            native = F.silu(g) * u
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch F.silu(gate) * up (bf16)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    sets = [("normal", "gate, up ~ N(0,1), bf16", _run(1.0)),
            ("wide_gates", "gate ~ N(0,8^2): saturated and vanishing sigmoid", _run(8.0))]
    return [Measurement("silu_mul", name, desc, "rel_l2", run, shape=lambda size: "{} x {}".format(*SHAPES[size]))
            for name, desc, run in sets]
