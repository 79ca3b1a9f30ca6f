"""``rlkernel bench``: every contract's benchmark shapes, rlkernel against native PyTorch.

For each :class:`~rlkernel.contracts._contract.BenchCase` of the chosen shape set (``small`` on the
CPU, ``large`` — the Qwen3-8B shapes of the H200 reports — on an accelerator) of each contract
module, the native baseline (``case.native(**inputs)``) and the rlkernel op
(``rlkernel.ops.<op>(**inputs)``) are timed in the same run on the same device. On CUDA:
``triton.testing.do_bench`` medians; elsewhere ``time.perf_counter`` medians after a warm-up.
Inputs smaller than 256 MB are built three times and rotated so that caches do not flatter small
shapes. Throughput comes from the case's declared ``flops`` and ``bytes`` formulas;
``ratio = native_ms / rlkernel_ms`` (the goals are in docs/design.md, "Performance"). Decode-step
cases (``BenchCase.graph``) are also timed replayed from a CUDA graph on both sides, as rollout
engines run decode steps (``graph_ratio``): eager times of small calls are bound by the host's
launch and Python costs, graph replay by the kernels alone. An interrupt
(Ctrl-C, or SIGTERM through the CLI) ends the run with a report of the rows measured so far,
marked partial.
"""

from __future__ import annotations

import itertools
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch

from rlkernel.dispatch import trace
from rlkernel.environment import describe, device_name, git_commit, package_version
from rlkernel.public import public_op

logger = logging.getLogger(__name__)

#: Inputs below this size are built three times and rotated between calls.
ROTATE_BELOW_BYTES = 256 * 2**20
ROTATIONS = 3

#: Shape sets (a contract's ``BenchCase.sizes``): ``small`` keep a whole CPU run within a couple of
#: minutes; ``large`` are the model shapes accelerators are measured on (the H200 reports).
SHAPES = ("small", "large")


def default_shapes(device: torch.device) -> str:
    """``small`` on the CPU, ``large`` on an accelerator (CUDA, ROCm, NPU, ...)."""
    return "small" if device.type == "cpu" else "large"


class Progress(Protocol):
    """What :func:`run` reports progress to (:class:`rlkernel.conformance.progress.StreamProgress`)."""

    def start(self, total: int) -> None: ...

    def update(self, row: BenchRow) -> None: ...

    def finish(self) -> None: ...


@dataclass
class Timing:
    """One side of a bench row (native or rlkernel)."""

    ms: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    peak_mem_bytes: int | None = None
    error: str | None = None


@dataclass
class BenchRow:
    """One bench case measured on both sides."""

    op: str
    case: str
    flops: float
    bytes: float
    native: Timing = field(default_factory=Timing)
    rlkernel: Timing = field(default_factory=Timing)
    #: kernels that served the rlkernel side
    kernel: str | None = None
    input_sets: int = 1
    #: both sides replayed from a CUDA graph (decode-step cases on CUDA; ``None`` when not timed)
    native_graph: Timing | None = None
    rlkernel_graph: Timing | None = None

    @property
    def failed(self) -> bool:
        """Whether either side recorded an error."""
        return bool(self.native.error or self.rlkernel.error)

    @property
    def ratio(self) -> float | None:
        """``native_ms / rlkernel_ms`` (higher is better for rlkernel)."""
        if self.native.ms is None or not self.rlkernel.ms:
            return None
        return self.native.ms / self.rlkernel.ms

    @property
    def graph_ratio(self) -> float | None:
        """``native_ms / rlkernel_ms`` of the CUDA-graph replays, where both were timed."""
        if self.native_graph is None or self.rlkernel_graph is None:
            return None
        if self.native_graph.ms is None or not self.rlkernel_graph.ms:
            return None
        return self.native_graph.ms / self.rlkernel_graph.ms

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = self.ratio
        d["graph_ratio"] = self.graph_ratio
        return d


def input_bytes(obj: Any) -> int:
    """Total bytes of the tensors in ``obj`` (recursively in lists, tuples and dicts)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(input_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(input_bytes(o) for o in obj.values())
    return 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], Any], device: torch.device, repeat: int) -> float:
    """Median milliseconds of ``fn()``.

    CUDA: ``triton.testing.do_bench(fn, rep=10 * repeat, return_mode="median")``. Elsewhere:
    two warm-up calls, then the median of ``repeat`` ``time.perf_counter`` timings.
    """
    if device.type == "cuda":
        import triton.testing  # lazily: CPU-only machines need no triton

        return float(triton.testing.do_bench(fn, rep=10 * repeat, return_mode="median"))
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def peak_memory(fn: Callable[[], Any], device: torch.device) -> int | None:
    """Bytes allocated at peak by one call of ``fn`` beyond what was allocated before (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def _with_throughput(timing: Timing, flops: float, nbytes: float) -> Timing:
    """``timing`` with TFLOP/s and GB/s from its milliseconds and the case's declared work."""
    assert timing.ms is not None
    seconds = timing.ms * 1e-3
    if seconds > 0:
        timing.tflops = flops / seconds / 1e12
        timing.gbps = nbytes / seconds / 1e9
    return timing


def measure(fn: Callable[..., Any], input_sets: list[dict[str, Any]], device: torch.device, repeat: int,
            flops: float, nbytes: float) -> Timing:
    """Time ``fn(**inputs)`` rotating over ``input_sets``; errors are recorded, not raised."""
    cycle = itertools.cycle(input_sets)

    def call() -> Any:
        return fn(**next(cycle))

    timing = Timing()
    try:
        timing.peak_mem_bytes = peak_memory(call, device)
        timing.ms = time_ms(call, device, repeat)
    except Exception as exc:  # recorded in the report; the bench goes on
        timing.error = f"{type(exc).__name__}: {exc}"
        logger.info("bench: %s failed: %s", getattr(fn, "__name__", fn), timing.error)
        return timing
    return _with_throughput(timing, flops, nbytes)


def measure_graph(fn: Callable[..., Any], inputs: dict[str, Any], device: torch.device, repeat: int,
                  flops: float, nbytes: float) -> Timing:
    """Time ``fn(**inputs)`` captured once in a CUDA graph and replayed; errors are recorded, not raised.

    The warm-up calls run on a side stream (compiling kernels and settling allocations, as
    ``torch.cuda.graphs`` asks), then one call is captured and ``graph.replay()`` is timed like an
    eager call. A capture that fails (an op that reads a device value on the host, or allocates in a
    way graphs refuse) is recorded as the error.
    """
    timing = Timing()
    try:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(**inputs)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(**inputs)
        timing.ms = time_ms(graph.replay, device, repeat)
    except Exception as exc:  # recorded in the report; the bench goes on
        timing.error = f"graph: {type(exc).__name__}: {exc}"
        logger.info("bench: graph of %s failed: %s", getattr(fn, "__name__", fn), timing.error)
        _settle_after_failed_capture(device)
        return timing
    return _with_throughput(timing, flops, nbytes)


def _settle_after_failed_capture(device: torch.device) -> None:
    """Leave CUDA as a failed capture found it not: one trivial capture that succeeds.

    A capture that raises midway never runs the epilogue of the generators it registered, so the
    default CUDA generator stays "capturing" and every later random op on the device (the next
    case's native ``torch.multinomial``) fails with "Offset increment outside graph capture"
    (seen on the H200). A successful capture runs the prologue and epilogue again and resets it.
    """
    try:
        torch.cuda.synchronize(device)
    except Exception as exc:  # a capture error surfaces here at the latest; it is already recorded
        logger.info("bench: after a failed capture: %s", exc)
    try:
        scratch = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            scratch.add_(1)
        torch.cuda.synchronize(device)
    except Exception as exc:
        logger.warning("bench: CUDA graphs did not recover after a failed capture: %s", exc)


#: Which cases the bench also times from CUDA graphs: ``auto`` the decode-step cases
#: (``BenchCase.graph``), ``all`` every case, ``none`` none. Graphs are timed on CUDA only.
GRAPH_MODES = ("auto", "all", "none")


def plan(modules: dict[str, ModuleType], shapes: str) -> tuple[list[tuple[str, Any]], list[str]]:
    """The ``(op, case)`` pairs of shape set ``shapes``, and the modules that have none.

    Raises
    ------
    ValueError
        ``shapes`` is not one of :data:`SHAPES`.
    """
    if shapes not in SHAPES:
        raise ValueError(f"shapes={shapes!r}; expected one of {SHAPES} (small: minutes on a CPU, large: the "
                         f"accelerator shapes)")
    cases: list[tuple[str, Any]] = []
    without: list[str] = []
    for name, module in modules.items():
        chosen = [c for c in module.bench_cases() if shapes in c.sizes] if hasattr(module, "bench_cases") else []
        if not chosen:
            without.append(name)
        cases += [(case.op or module.CONTRACT.name, case) for case in chosen]
    return cases, without


def bench_case(op: str, case: Any, device: torch.device, repeat: int, graph: str = "auto") -> BenchRow:
    """Time one bench case on both sides; errors are recorded in the row, not raised.

    ``graph`` (:data:`GRAPH_MODES`) says whether the case is also timed replayed from CUDA graphs.
    """
    row = BenchRow(op=op, case=case.name, flops=float(case.flops), bytes=float(case.bytes))
    try:
        first = case.make(device)
        sets = [first] + [case.make(device) for _ in range(ROTATIONS - 1)] if input_bytes(
            first) < ROTATE_BELOW_BYTES else [first]
    except Exception as exc:
        row.native.error = row.rlkernel.error = f"inputs: {type(exc).__name__}: {exc}"
        return row
    row.input_sets = len(sets)
    row.native = measure(case.native, sets, device, repeat, row.flops, row.bytes)
    try:
        fn = public_op(op)
    except Exception as exc:
        row.rlkernel.error = f"{type(exc).__name__}: {exc}"
    else:
        with trace() as calls:
            row.rlkernel = measure(fn, sets, device, repeat, row.flops, row.bytes)
        row.kernel = ", ".join(sorted({kernel for _, kernel in calls})) or None
        if device.type == "cuda" and (graph == "all" or (graph == "auto" and getattr(case, "graph", False))):
            row.native_graph = measure_graph(case.native, first, device, repeat, row.flops, row.bytes)
            row.rlkernel_graph = measure_graph(fn, first, device, repeat, row.flops, row.bytes)
    del sets, first
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run(modules: dict[str, ModuleType], device: torch.device, repeat: int, *, shapes: str | None = None,
        command: list[str] | None = None, missing: list[str] | None = None,
        on_row: Callable[[BenchRow], None] | None = None, progress: Progress | None = None,
        graph: str = "auto") -> dict[str, Any]:
    """Benchmark every module; returns the ``bench.json`` document.

    An interrupt (``KeyboardInterrupt``: Ctrl-C, or SIGTERM as the CLI maps it) stops the run and
    returns the rows measured so far with ``partial`` set: the caller writes that report and fails.

    Parameters
    ----------
    modules : dict of str to module
        Contract modules by name; those without bench cases of ``shapes`` are listed as such.
    device : torch.device
        Where inputs are built and both sides run.
    repeat : int
        Timed calls per side on the CPU; on CUDA, ``do_bench`` runs for ``10 * repeat`` ms.
    shapes : {"small", "large"}, optional
        The shape set (default: :func:`default_shapes` of ``device``).
    command : list of str, optional
        The command line, recorded as is.
    missing : list of str, optional
        Contract modules not present in this tree, recorded as such.
    on_row : callable, optional
        Called with each row as soon as it is measured (an interrupt raised there also ends the run).
    progress : Progress, optional
        Receives ``start(total)``, ``update(row)`` and ``finish()``.
    graph : {"auto", "all", "none"}
        Which cases are also timed replayed from CUDA graphs (CUDA only): ``auto`` the decode-step
        cases.

    Raises
    ------
    ValueError
        ``shapes`` is not one of :data:`SHAPES`, or ``graph`` not one of :data:`GRAPH_MODES`.
    """
    if graph not in GRAPH_MODES:
        raise ValueError(f"graph={graph!r}; expected one of {GRAPH_MODES} (auto: the decode-step cases)")
    shapes = default_shapes(device) if shapes is None else shapes
    cases, without = plan(modules, shapes)
    rows: list[BenchRow] = []
    interrupted: str | None = None
    if progress is not None:
        progress.start(len(cases))
    try:
        for op, case in cases:
            row = bench_case(op, case, device, repeat, graph)
            rows.append(row)
            if progress is not None:
                progress.update(row)
            if on_row:
                on_row(row)
    except KeyboardInterrupt as exc:  # report what was measured; the caller fails the run
        interrupted = f"KeyboardInterrupt: {exc}" if str(exc) else "KeyboardInterrupt"
    finally:
        if progress is not None:
            progress.finish()
    return {
        "commit": git_commit(),
        "command": command if command is not None else sys.argv,
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "environment": describe(device),
        "repeat": repeat,
        "shapes": shapes,
        "graph": graph,
        "partial": interrupted is not None,
        "interrupted": interrupted,
        "cases_planned": len(cases),
        "rows": [r.as_dict() for r in rows],
        "no_bench_cases": without,
        "missing_contracts": list(missing or []),
    }


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def markdown(doc: dict[str, Any]) -> str:
    """The ``bench.md`` table."""
    lines = [f"# rlkernel bench on {doc['device_name']} (`{doc['device']}`)", ""]
    if doc.get("partial"):
        lines += [f"**Partial report: interrupted ({doc['interrupted']}) after {len(doc['rows'])} of "
                  f"{doc['cases_planned']} cases; only the rows measured before that are below.**", ""]
    shapes = f"{doc['shapes']} shapes, " if doc.get("shapes") else ""  # reports made before --shapes lack it
    lines += [
        f"{shapes}torch {doc['torch']}, triton {doc['triton']}, commit `{doc['commit']}`; "
        "ratio = native ms / rlkernel ms",
        "",
        "| op | case | native ms | rlkernel ms | ratio | rlkernel TFLOP/s | rlkernel GB/s | native GB/s "
        "| peak MiB (rlk/native) | graph native / rlkernel ms | graph ratio | kernel | error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- | --- |",
    ]
    for r in doc["rows"]:
        n, k = r["native"], r["rlkernel"]
        ng, kg = r.get("native_graph"), r.get("rlkernel_graph")
        graph_ms = f"{_fmt(ng['ms'], '.4f')} / {_fmt(kg['ms'], '.4f')}" if ng and kg else ""
        mem = ""
        if k["peak_mem_bytes"] is not None:
            mem = f"{k['peak_mem_bytes'] / 2**20:.1f}/{(n['peak_mem_bytes'] or 0) / 2**20:.1f}"
        sides = [("native", n), ("rlkernel", k), ("native", ng or {}), ("rlkernel", kg or {})]
        err = "; ".join(f"{side}: {t['error']}" for side, t in sides if t.get("error"))
        lines.append(
            f"| {r['op']} | {r['case']} | {_fmt(n['ms'], '.4f')} | {_fmt(k['ms'], '.4f')} | {_fmt(r['ratio'], '.3f')} "
            f"| {_fmt(k['tflops'], '.2f')} | {_fmt(k['gbps'], '.1f')} | {_fmt(n['gbps'], '.1f')} | {mem} "
            f"| {graph_ms} | {_fmt(r.get('graph_ratio'), '.3f')} | {r['kernel'] or ''} "
            f"| {err.replace('|', '/')[:200]} |"
        )
    no_cases = f"no {doc['shapes']} bench cases" if doc.get("shapes") else "no bench cases"
    for key, label in (("no_bench_cases", no_cases), ("missing_contracts", "contract not present")):
        if doc.get(key):
            lines += ["", f"{label}: " + ", ".join(doc[key])]
    return "\n".join(lines) + "\n"


def write(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``bench.json`` and ``bench.md`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "md": out_dir / "bench.md"}
    paths["json"].write_text(json.dumps(doc, indent=2) + "\n")
    paths["md"].write_text(markdown(doc))
    return paths
