"""``rms_norm`` against float64, next to Hugging Face Qwen3's RMSNorm in torch.

Native: ``w * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(dtype)`` (``Qwen3RMSNorm``).
Truth: the same formula in float64 on the bf16 inputs (no intermediate rounding).
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


def _hf(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    h = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def _run(kind: str, factor: float = 0.0) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        t, h = SHAPES[size]
        name = f"rms_norm/{kind}/{factor}/{size}"
        x = data.randn(f"{name}/x", (t, h))
        if kind == "outliers":
            x = data.outlier_channels(x, name, factor)
        elif kind == "massive":
            x = data.massive_tokens(x, name, factor)
        w = (1.0 + data.randn(f"{name}/w", (h,), std=0.3, dtype=torch.float64)).to(torch.bfloat16)
        x, w = x.to(device), w.to(device)
        xd = x.double()
        truth = w.double() * xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
        with torch.no_grad():
            ours = rlkernel.ops.rms_norm(x, w, eps=EPS)
            native = _hf(x, w)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("HF Qwen3RMSNorm (torch)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    sets = [("normal", "x ~ N(0,1), weight ~ 1 + N(0,0.3^2), bf16", _run("normal")),
            *[(f"outliers_x{int(f)}", f"{data.OUTLIER_COUNT} channels x{int(f)}", _run("outliers", f))
              for f in data.OUTLIER_FACTORS],
            ("massive_tokens", "2 rows x1000", _run("massive", 1000.0))]
    return [Measurement("rms_norm", name, desc, "rel_l2", run, shape=lambda size: "T x H = {} x {}".format(
        *SHAPES[size])) for name, desc, run in sets]
