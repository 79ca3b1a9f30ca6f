"""``rlkernel conformance --jobs N``: the suite in N processes, one report.

A first run on a new GPU is mostly compilation (Triton's passes and ``ptxas``: CPU work, one
kernel at a time in one process). Here the contract modules are split into N groups of about
equal case counts (largest first, each to the lightest group); each group runs as ``rlkernel
conformance --op ... --no-static`` in a subprocess that writes its own report, while this process
runs the static checks of compiled kernels (the phase a single run ends with). The parts are then
merged (:func:`rlkernel.conformance.merge.merge`): the records a single process would write, in
another order, with the same totals.

Every part runs on the same device; the processes share Triton's on-disk cache.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rlkernel.conformance import merge, report, runner
from rlkernel.conformance.cases import bit_cases, invariance_cases
from rlkernel.conformance.records import RunResult
from rlkernel.contracts import load_contracts

__all__ = ["case_counts", "plan_groups", "run_parallel"]


def case_counts(ops: list[str] | None, full: bool) -> tuple[dict[str, int], list[str]]:
    """Cases per contract module (bit cases + invariance cases; 1 for a module that fails to load),
    and the contract modules not written yet (a single run reports them; the parts run named ones).

    Raises
    ------
    ValueError
        ``ops`` names a contract module that does not exist.
    """
    broken: dict[str, BaseException] = {}
    modules, missing = load_contracts(ops, errors=broken)
    if ops and missing:
        raise ValueError(f"contract module(s) {missing} do not exist yet; present: {sorted(modules)}")
    counts = dict.fromkeys(broken, 1)
    for name, module in modules.items():
        try:
            counts[name] = len(bit_cases(module, full=full)) + len(invariance_cases(module, full=full))
        except Exception:  # the part reports the module's error record
            counts[name] = 1
    return counts, missing


def plan_groups(weights: dict[str, int], jobs: int) -> list[list[str]]:
    """At most ``jobs`` non-empty groups of the ops, balanced by weight (largest first, each to the
    lightest group, ties to the first); each group in name order."""
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: expected a positive number of processes")
    groups: list[list[str]] = [[] for _ in range(min(jobs, len(weights)))]
    load = [0] * len(groups)
    for op in sorted(weights, key=lambda o: (-weights[o], o)):
        i = load.index(min(load))
        groups[i].append(op)
        load[i] += weights[op]
    return [sorted(g) for g in groups if g]


def _command(child_args: list[str], ops: list[str], out: Path) -> list[str]:
    python = [sys.executable, "-P"] if getattr(sys.flags, "safe_path", False) else [sys.executable]  # staged
    return [*python, "-m", "rlkernel.cli", "conformance", *child_args, "--no-static",
            *[a for op in ops for a in ("--op", op)], "--out", str(out)]


def run_parallel(config: runner.RunConfig, jobs: int, parts_dir: Path, child_args: list[str],
                 log: TextIO = sys.stderr) -> RunResult:
    """Run the suite of ``config`` in ``jobs`` processes (and the static phase here); the merged result.

    Parameters
    ----------
    config : RunConfig
        What a single process would run.
    jobs : int
        Processes for the cases.
    parts_dir : Path
        Where each part writes its report folder (``part<i>``) and log (``part<i>.log``).
    child_args : list of str
        ``rlkernel conformance`` arguments every part takes (backend, device, mode, manifest,
        cases, fail-fast); ``--op``, ``--out`` and ``--no-static`` are added per part.
    log : text stream
        One line per part started and finished.

    Raises
    ------
    RuntimeError
        A part exited with a usage error or crashed (its log's last lines are in the message).
    """
    weights, missing = case_counts(config.ops, config.full)
    groups = plan_groups(weights, jobs)
    parts_dir.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[subprocess.Popen[bytes], Path, list[str], float]] = []
    for i, ops in enumerate(groups):
        out, path = parts_dir / f"part{i}", parts_dir / f"part{i}.log"
        with open(path, "wb") as f:
            procs.append((subprocess.Popen(_command(child_args, ops, out), stdout=f, stderr=subprocess.STDOUT),
                          path, ops, time.perf_counter()))
        print(f"part {i}: {sum(weights[o] for o in ops)} cases of {', '.join(ops)} (log {path})", file=log)
    docs: list[dict[str, Any]] = []
    done: set[int] = set()
    not_run = 0
    try:
        if config.static:  # the static checks compile kernels too: here, beside the parts
            docs.append(report.as_json(runner.run(dataclasses.replace(config, cases_phase=False))))
        for i, (proc, path, ops, start) in enumerate(procs):
            docs.append(_finished(i, proc, path, ops, parts_dir / f"part{i}", start, log))
            done.add(i)
    except KeyboardInterrupt:  # SIGINT / SIGTERM: each unfinished part stops and reports what it ran
        for proc, *_ in procs:
            if proc.poll() is None:
                proc.terminate()
        for i, (proc, _, ops, _) in enumerate(procs):
            proc.wait()
            if i in done:
                continue
            if (parts_dir / f"part{i}" / "report.json").is_file():
                docs.append(merge.load(parts_dir / f"part{i}"))
            else:
                not_run += sum(weights[o] for o in ops)
    finally:
        for proc, *_ in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    if not docs:
        raise RuntimeError("rlkernel conformance --jobs: interrupted before any part wrote a report")
    result, _ = merge.merge(docs)
    result.not_run += not_run
    result.missing_contracts = sorted(set(result.missing_contracts) | set(missing))
    return result


def _finished(i: int, proc: subprocess.Popen[bytes], path: Path, ops: list[str], out: Path, start: float,
              log: TextIO) -> dict[str, Any]:
    """Part ``i``'s report once its process exits (status 0, or 1 when cases failed)."""
    code = proc.wait()
    if code not in (0, 1):  # anything else: a usage error or a crash, no usable report
        tail = path.read_text(errors="replace").strip().splitlines()[-5:]
        raise RuntimeError(f"part {i} (--op {' --op '.join(ops)}) exited with status {code}; the end of "
                           f"{path}:\n" + "\n".join(tail))
    doc = merge.load(out)
    print(f"part {i}: {doc['summary']['passed']} passed, {doc['summary']['failed']} failed in "
          f"{time.perf_counter() - start:.0f} s", file=log)
    return doc
