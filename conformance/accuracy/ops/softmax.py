"""``softmax`` and ``log_softmax`` against float64, next to ``torch.softmax``/``log_softmax`` in fp32."""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import logprob_errors, tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": (16, 8192), "full": (64, 151936)}


def _logits(kind: str, size: str) -> torch.Tensor:
    name = f"softmax/{kind}/{size}"
    x = data.randn(f"{name}/x", SHAPES[size], std=3.0 if kind == "normal" else 10.0, dtype=torch.float32)
    if kind == "sink":
        x[:, 0] = x.max(dim=-1).values + 30.0  # one logit 30 nats above the rest
    return x


def _run(op: str, kind: str) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        x = _logits(kind, size).to(device)
        fn = getattr(torch, op)
        truth = fn(x.double(), dim=-1)
        errors = logprob_errors if op == "log_softmax" else tensor_errors
        with torch.no_grad():
            ours = getattr(rlkernel.ops, op)(x)
            native = fn(x, dim=-1)
        return [Result(RLKERNEL, errors(ours, truth)), Result(f"torch.{op} (fp32)", errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    out = []
    for op, metric in (("softmax", "rel_l2"), ("log_softmax", "max_abs")):
        for kind, desc in (("normal", "vocabulary-wide fp32 logits ~ N(0,3^2)"),
                           ("wide", "logits ~ N(0,10^2): most probabilities underflow"),
                           ("sink", "one logit 30 nats above the rest")):
            out.append(Measurement(op, kind, desc, metric, _run(op, kind),
                                   shape=lambda size: "rows x V = {} x {}".format(*SHAPES[size])))
    return out
