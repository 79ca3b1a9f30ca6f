"""``exact_sum`` (the weight-gradient accumulator) against the float64 sum, next to torch's fp32 sum.

Gradient-shaped data: S per-sequence partials of a weight (a sum over dim 0), with outlier
sequences (a long sequence's partial 1000x the others) and with cancelling partials (advantages of
both signs). ``exact_sum_merge`` and ``exact_sum_finish`` are measured through the same path:
micro-batch partials merged, then finished. ``exact_sum_accumulate``: the micro-batches accumulated
into one state in turn (the trainer's exact accumulator), next to an fp32 ``.grad`` buffer that adds
each micro-batch's fp32 sum in turn (PyTorch's gradient accumulation). ``exact_sum_total``: all the
terms at once, next to ``torch.sum(dim=0)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlkernel import ops
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (S terms, elements) per size
SHAPES = {"small": (64, 4096), "full": (256, 1 << 20)}


def _run(kind: str, op: str) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        s, n = SHAPES[size]
        name = f"exact_sum/{kind}/{size}"
        terms = data.randn(f"{name}/t", (s, n), dtype=torch.float32)
        if kind == "outlier_sequences":
            terms[: max(1, s // 16)] *= 1000.0
        elif kind == "cancelling":
            terms = torch.cat([terms[: s // 2], -terms[: s // 2] * (1 + 2.0 ** -20)])
        terms = terms.to(device)
        truth = terms.double().sum(dim=0)
        if op == "exact_sum_total":  # every unit's terms at once
            return [Result(RLKERNEL, tensor_errors(ops.exact_sum_total(terms), truth)),
                    Result("torch.sum(dim=0) (fp32)", tensor_errors(terms.sum(dim=0), truth), native=True)]
        if op == "exact_sum_accumulate":
            state = ops.exact_sum_partial(terms[:16])
            buf = terms[:16].sum(dim=0)
            for i in range(16, s, 16):  # micro-batches, in turn
                ops.exact_sum_accumulate(state, terms[i:i + 16])
                buf += terms[i:i + 16].sum(dim=0)
            return [Result(RLKERNEL, tensor_errors(ops.exact_sum_finish(state), truth)),
                    Result("fp32 .grad += micro-batch sum", tensor_errors(buf, truth), native=True)]
        parts = [ops.exact_sum_partial(terms[i:i + 16]) for i in range(0, s, 16)]  # micro-batches
        ours = ops.exact_sum_finish(ops.exact_sum_merge(torch.stack(parts)))
        native = terms.sum(dim=0)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch.sum(dim=0) (fp32)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    shape = "S x N = {} x {}".format
    kinds = (("normal", "S per-sequence partials ~ N(0, 1)"),
             ("outlier_sequences", "1/16 of the partials x1000"),
             ("cancelling", "partials in +/- pairs that cancel to 2**-20 relative"))
    return [Measurement(op, kind, desc, "rel_l2", _run(kind, op), shape=lambda size: shape(*SHAPES[size]))
            for op in ("exact_sum_partial", "exact_sum_accumulate", "exact_sum_total") for kind, desc in kinds]
