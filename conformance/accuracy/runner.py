"""Run the accuracy measurements on one device and judge each by the rule.

Each measurement runs inside :func:`rlkernel.trace`, so a row names the kernels that produced
rlkernel's output. A measurement that raises is an ``error`` row, never skipped. A row whose
rlkernel metric exceeds the native kernel's is ``below native`` unless the data set is a
declared exception (:data:`~rlkernel.conformance.accuracy.suite.EXCEPTIONS`).
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import asdict
from typing import Any, TextIO

import torch

import rlkernel
from rlkernel.conformance.accuracy.ops import all_measurements
from rlkernel.conformance.accuracy.suite import EXCEPTIONS, verdict


def _status(row: dict[str, Any]) -> str:
    if row.get("error"):
        return "error"
    if row["verdict"]["meets"]:
        return "meets"
    return "exception" if (row["op"], row["dataset"]) in EXCEPTIONS else "below native"


def run(device: torch.device, size: str = "small", ops: list[str] | None = None,
        stream: TextIO | None = sys.stderr) -> list[dict[str, Any]]:
    """Every measurement of ``ops`` (default all) at ``size`` on ``device``; one row each.

    A row: ``op``, ``dataset``, ``description``, ``shape``, ``metric``, ``results`` (per
    implementation: name, metrics, whether it is the native baseline), ``verdict`` (the two
    primary metrics, their ratio, ``meets``), ``status`` (meets | exception | below native |
    error), ``kernels`` and ``seconds``.
    """
    measurements = all_measurements(ops)
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for i, m in enumerate(measurements):
        row: dict[str, Any] = {"op": m.op, "dataset": m.dataset, "description": m.description,
                               "shape": m.shape(size), "metric": m.metric, "size": size}
        t0 = time.perf_counter()
        try:
            with rlkernel.trace() as calls:
                results = m.run(size, device)
            row["results"] = [asdict(r) for r in results]
            row["verdict"] = verdict(results, m.metric)
            row["kernels"] = sorted({k for _, k in calls})
        except Exception as exc:  # reported as an error row; the run goes on
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            row["error"] = f"{type(exc).__name__}: {exc} (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
        row["seconds"] = time.perf_counter() - t0
        row["status"] = _status(row)
        if (row["op"], row["dataset"]) in EXCEPTIONS:
            row["exception"] = EXCEPTIONS[(row["op"], row["dataset"])]
        rows.append(row)
        if stream is not None:
            elapsed = time.perf_counter() - t_start
            stream.write(f"[{i + 1}/{len(measurements)} {elapsed:6.1f}s] {m.op}/{m.dataset}: {row['status']}\n")
            stream.flush()
    return rows
