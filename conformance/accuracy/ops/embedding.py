"""``embedding``: a gather, exact by construction; measured to show it (error 0 on both sides)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": (256, 8192, 512), "full": (4096, 151936, 4096)}


def _run(size: str, device: torch.device) -> list[Result]:
    t, v, h = SHAPES[size]
    w = data.randn(f"embedding/{size}/w", (v, h)).to(device)
    ids = data.randint(f"embedding/{size}/ids", (t,), 0, v).to(device)
    truth = w.double()[ids]
    with torch.no_grad():
        ours = rlkernel.ops.embedding(ids, w)
        native = F.embedding(ids, w)
    return [Result(RLKERNEL, tensor_errors(ours, truth)), Result("torch F.embedding", tensor_errors(native, truth),
                                                                 native=True)]


def measurements() -> list[Measurement]:
    return [Measurement("embedding", "normal", "bf16 table ~ N(0,1), random ids", "rel_l2", _run,
                        shape=lambda size: "T x V x H = {} x {} x {}".format(*SHAPES[size]))]
