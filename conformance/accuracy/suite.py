"""The shape of an accuracy measurement, and the rule it is judged by.

A :class:`Measurement` computes one op on one named data set three ways on the device under
test: rlkernel (the public op, whichever backend serves the device), the native PyTorch
kernel a user would otherwise run, and the float64 truth. Each implementation's errors
against the truth are :mod:`.metrics`; the rule (docs/numerics.md R4) is that
rlkernel's primary metric is no larger than the native kernel's on every data set. Where a
data set cannot be met, it is an :data:`EXCEPTIONS` entry with its reason: the suite reports
it, it is never silently passed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

#: Implementation names in every row.
RLKERNEL = "rlkernel"


@dataclass
class Result:
    """One implementation's errors on one measurement."""

    impl: str
    metrics: dict[str, Any]
    #: the baseline the rule compares with (exactly one per measurement)
    native: bool = False
    note: str = ""


@dataclass(frozen=True)
class Measurement:
    """One op on one data set.

    Attributes
    ----------
    op : str
        The public op (``rlkernel.ops.<op>``).
    dataset : str
        Data set name, unique per op (``outliers_x1000/fp32_out``).
    description : str
        What the data is, in a few words.
    metric : str
        The metric the rule compares (a key of the results' ``metrics``).
    run : callable
        ``run(size, device) -> list[Result]``: rlkernel, the native kernel (``native=True``) and
        any extra yardsticks, each measured against the float64 truth.
    shape : callable
        ``shape(size) -> str``: the problem size, for the report.
    """

    op: str
    dataset: str
    description: str
    metric: str
    run: Callable[[str, torch.device], list[Result]]
    shape: Callable[[str], str] = field(default=lambda size: "")


#: (op, data set) -> why the rule is not met there (reported with the numbers). An entry whose
#: data set meets the rule is stale and fails tests/test_accuracy.py.
EXCEPTIONS: dict[tuple[str, str], str] = {
}


#: Two kernels at the output rounding floor differ by one ulp on a few outputs in ten thousand;
#: a primary metric within this relative margin of the native one is that noise, not a loss.
EQUAL_MARGIN = 5e-3


def verdict(results: list[Result], metric: str) -> dict[str, Any]:
    """``{"rlkernel": x, "native": y, "ratio": x / y, "meets": x <= y * (1 + EQUAL_MARGIN)}``."""
    ours = next(r for r in results if r.impl == RLKERNEL).metrics[metric]
    native = next(r for r in results if r.native).metrics[metric]
    ratio = ours / native if native > 0 else (0.0 if ours == 0 else float("inf"))
    return {"metric": metric, "rlkernel": ours, "native": native, "ratio": ratio,
            "meets": ours <= native * (1 + EQUAL_MARGIN)}
