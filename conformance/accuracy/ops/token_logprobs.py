"""``token_logprobs`` against float64, next to an fp32 LM head + ``log_softmax`` + gather.

Native: ``log_softmax(F.linear(h.float(), w.float()), -1).gather(targets)`` (fp32 logits, the
usual RL trainer path); a bf16-logits yardstick (``F.linear`` in bf16, ``log_softmax`` in fp32)
is shown beside it. Truth: float64 logits and float64 ``log_softmax``. Metrics: the absolute
log-prob error and the importance-ratio error ``|exp(err) - 1|``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import logprob_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (T, H, V) per size: full is Qwen3-8B's hidden size and the Qwen3 vocabulary
SHAPES = {"small": (16, 512, 8192), "full": (64, 4096, 151936)}


def _gathered(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]


def _truth(h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    out = []
    for s in range(0, h.shape[0], chunk):  # float64 logits of a few rows at a time
        out.append(_gathered(h[s:s + chunk].double() @ w.double().T, targets[s:s + chunk]))
    return torch.cat(out)


def _run(make: Callable[[str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Callable[
        [str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        h, w, targets = (t.to(device) for t in make(size))
        truth = _truth(h, w, targets)
        with torch.no_grad():
            ours = rlkernel.ops.token_logprobs(h, w, targets)
            native = _gathered(F.linear(h.float(), w.float()), targets)
            bf16 = _gathered(F.linear(h, w).float(), targets)
        return [Result(RLKERNEL, logprob_errors(ours, truth)),
                Result("fp32 LM head + log_softmax", logprob_errors(native, truth), native=True),
                Result("bf16 LM head + fp32 log_softmax", logprob_errors(bf16, truth))]
    return run


def _operands(kind: str, factor: float = 0.0) -> Callable[[str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    def make(size: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, hd, v = SHAPES[size]
        name = f"token_logprobs/{kind}/{factor}/{size}"
        h = data.randn(f"{name}/h", (t, hd))
        w = data.randn(f"{name}/w", (v, hd), std=0.05)
        if kind == "outliers":
            h = data.outlier_channels(h, name, factor)
        elif kind == "peaked":
            h = data.randn(f"{name}/h", (t, hd), std=4.0)  # confident predictions: logit spread ~ 20 nats
        targets = data.randint(f"{name}/targets", (t,), 0, v)
        return h, w, targets
    return make


def measurements() -> list[Measurement]:
    sets = [
        ("normal", "hidden ~ N(0,1), head ~ N(0,0.05^2), bf16", _operands("normal")),
        ("peaked", "hidden ~ N(0,4^2): confident, wide logit range", _operands("peaked")),
        *[(f"outliers_x{int(f)}", f"hidden with {data.OUTLIER_COUNT} channels x{int(f)}", _operands("outliers", f))
          for f in data.OUTLIER_FACTORS],
    ]
    return [Measurement(op="token_logprobs", dataset=name, description=desc, metric="max_abs", run=_run(make),
                        shape=lambda size: "T x H x V = {} x {} x {}".format(*SHAPES[size]))
            for name, desc, make in sets]
