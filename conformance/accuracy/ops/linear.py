"""``linear`` against float64, next to torch's GEMM (fp32 accumulation) on the same device.

Native: ``F.linear`` in the input dtype for a bf16/fp16 output (cuBLAS / CPU BLAS: fp32
accumulation, one rounding of the fp32 sum), and ``F.linear`` of the inputs widened to fp32
for an fp32 output (fp32 accumulation; TF32 off). Truth: ``x.double() @ w.double().T``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (M, K, N) per size: small for the CPU in CI; full is Qwen3-8B's hidden size and q/o width
SHAPES = {"small": (16, 1024, 256), "full": (256, 4096, 4096)}


def _native(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    if out_dtype == torch.float32:
        return F.linear(x.float(), w.float())
    return F.linear(x, w).to(out_dtype)


def _measure(make: Callable[[str], tuple[torch.Tensor, torch.Tensor]], out_dtype: torch.dtype) -> Callable[
        [str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        x, w = make(size)
        x, w = x.to(device), w.to(device)
        truth = x.double() @ w.double().T
        with torch.no_grad():
            ours = rlkernel.ops.linear(x, w, out_dtype=out_dtype)
            native = _native(x, w, out_dtype)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result(f"torch F.linear ({'fp32 inputs' if out_dtype == torch.float32 else 'bf16, fp32 accumulation'})",
                       tensor_errors(native, truth), native=True)]
    return run


def _operands(kind: str, factor: float = 0.0) -> Callable[[str], tuple[torch.Tensor, torch.Tensor]]:
    def make(size: str) -> tuple[torch.Tensor, torch.Tensor]:
        m, k, n = SHAPES[size]
        name = f"linear/{kind}/{factor}/{size}"
        x = data.randn(f"{name}/x", (m, k))
        w = data.randn(f"{name}/w", (n, k), std=0.02)
        if kind == "outliers":
            x = data.outlier_channels(x, name, factor)
        elif kind == "massive":
            x = data.massive_tokens(x, name, factor)
        elif kind == "halfway":
            x, w = data.halfway_rows(name, m, k, n)
        return x, w
    return make


def measurements() -> list[Measurement]:
    sets: list[tuple[str, str, Callable[[str], tuple[torch.Tensor, torch.Tensor]]]] = [
        ("normal", "x ~ N(0,1), w ~ N(0,0.02^2), bf16", _operands("normal")),
        *[(f"outliers_x{int(f)}", f"x with {data.OUTLIER_COUNT} channels x{int(f)} (LLM outlier channels)",
           _operands("outliers", f)) for f in data.OUTLIER_FACTORS],
        ("massive_tokens", "2 whole rows of x x1000 (massive activations)", _operands("massive", 1000.0)),
        ("halfway", "exact results within half an fp32 ulp of a bf16 midpoint (double-rounding trap)",
         _operands("halfway")),
    ]
    out: list[Measurement] = []
    for name, desc, make in sets:
        for odt, tag in ((torch.float32, "fp32_out"), (torch.bfloat16, "bf16_out")):
            out.append(Measurement(
                op="linear", dataset=f"{name}/{tag}", description=f"{desc}; {tag.replace('_', ' ')}",
                metric="rel_l2", run=_measure(make, odt),
                shape=lambda size: "M x K x N = {} x {} x {}".format(*SHAPES[size])))
    return out
