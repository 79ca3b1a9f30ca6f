"""Accuracy measurements, one module per op (the same stem as ``rlkernel.ops``)."""

from __future__ import annotations

import importlib

from rlkernel.conformance.accuracy.suite import Measurement

#: Modules in report order; each defines ``measurements() -> list[Measurement]``.
MODULES = ("linear", "token_logprobs", "token_entropy", "token_logprobs_backward", "attention", "attention_backward",
           "rms_norm", "rms_norm_backward", "rope", "rope_backward", "silu_mul", "silu_mul_backward", "softmax",
           "embedding", "all_reduce", "sample", "rl", "rl_backward", "optim", "exact_sum")


def all_measurements(ops: list[str] | None = None) -> list[Measurement]:
    """Every measurement, optionally only those of the public ops ``ops``."""
    found: list[Measurement] = []
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        found += [m for m in module.measurements() if ops is None or m.op in ops]
    return found
