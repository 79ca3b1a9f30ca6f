"""Where an op's time goes on a CUDA GPU: eager median, CUDA-graph replay median, GPU kernels.

For the bench cases of the given contract modules (``rlkernel bench``'s inputs), both sides
(native PyTorch and rlkernel) get:

- ``eager_ms``: ``triton.testing.do_bench`` median of one call, as ``rlkernel bench`` times it
  (host launch costs included when the GPU outruns the host);
- ``graph_ms``: the median of replaying one call captured in a CUDA graph (launch costs gone;
  ``None`` with the reason when the call cannot be captured, e.g. it reads a tensor on the host);
- ``kernels``: every GPU kernel one call runs, with its mean device time (``torch.profiler``).

- ``host_us``: the host's time to issue one call (200 calls issued back to back, no sync between
  them, the clock stopped before the final sync), which bounds ``eager_ms`` from below.

``eager_ms`` far above the kernels' sum means the call is bound by host launches, not the GPU.
``--host-profile`` prints where rlkernel's host time goes (cProfile of 200 calls, top functions by
their own time).
``--set module.ATTR=VALUE`` overrides a tuning constant before the run (several allowed), e.g.
``--set rlkernel.backends.triton.rms_norm.MAX_BLOCK=1024`` (longer rows loop over tiles), to compare variants.

Usage (on the GPU machine; see tools/device_run.sh for the staging)::

    python3 tools/profile_gpu.py --op linear --case m1_ --out DIR [--set MOD.ATTR=V ...]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PROFILED_CALLS = 5
HOST_CALLS = 200


def _set(assignment: str) -> None:
    target, value = assignment.split("=", 1)
    module_name, attr = target.rsplit(".", 1)
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise SystemExit(f"--set {assignment}: {module_name} has no attribute {attr}")
    current = getattr(module, attr)
    kind = type(current)
    if kind is bool:  # bool("False") is True: spell the two values out
        if value not in ("True", "False"):
            raise SystemExit(f"--set {assignment}: {attr} is a bool; give True or False")
        setattr(module, attr, value == "True")
        return
    if current is None or kind is tuple:  # a tile, or a knob off by default: a Python literal
        import ast

        try:
            parsed = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise SystemExit(f"--set {assignment}: {attr} takes a Python literal, e.g. (128, 32, 64, 8, 3) "
                             "or None") from None
        setattr(module, attr, parsed)
        return
    setattr(module, attr, kind(value))


def _graph_ms(call: Callable[[], Any]) -> tuple[float | None, str]:
    import triton

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                call()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        return float(triton.testing.do_bench(graph.replay, return_mode="median")), ""
    except Exception as exc:  # not capturable: reported, the other numbers still stand
        torch.cuda.synchronize()
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"


def _kernels(call: Callable[[], Any]) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_CALLS):
            call()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None)
        if device_us is None:
            device_us = getattr(event, "cuda_time_total", 0.0)
        if device_us and event.count:
            rows.append({"name": event.key[:90], "per_call": event.count / PROFILED_CALLS,
                         "us_per_call": device_us / PROFILED_CALLS})
    return sorted(rows, key=lambda r: -r["us_per_call"])


def _host_us(call: Callable[[], Any]) -> float:
    import time

    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(HOST_CALLS):
        call()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return host / HOST_CALLS * 1e6


def host_profile(call: Callable[[], Any], top: int = 14) -> str:
    """cProfile of :data:`HOST_CALLS` calls: the functions with the most own time, per call."""
    import cProfile
    import io
    import pstats

    call()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(HOST_CALLS):
        call()
    prof.disable()
    torch.cuda.synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def profile_side(call: Callable[[], Any]) -> dict[str, Any]:
    import triton

    eager = float(triton.testing.do_bench(call, return_mode="median"))
    host = _host_us(call)
    graph, why = _graph_ms(call)
    kernels = _kernels(call)
    return {"eager_ms": eager, "host_us": host, "graph_ms": graph, "graph_error": why, "kernels": kernels,
            "kernel_ms": sum(k["us_per_call"] for k in kernels) / 1000.0}


def launch_floors() -> dict[str, float]:
    """Host microseconds of the cheapest calls on this machine: a torch op, ``torch.empty``, the
    launch of a one-element Triton kernel through ``kernel[grid](...)`` and a dict-free Python call."""
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    x = torch.ones(16, device="cuda")
    y = torch.empty_like(x)
    floors = {
        "torch_add": _host_us(lambda: torch.add(x, x)),
        "torch_empty": _host_us(lambda: torch.empty(16, device="cuda")),
        "triton_launch": _host_us(lambda: _copy[(1,)](x, y, 16, BLOCK=16)),
    }
    print("launch floors (host us a call): " + ", ".join(f"{k} {v:.1f}" for k, v in floors.items()), flush=True)
    return floors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", action="append", required=True, help="contract module (repeatable)")
    parser.add_argument("--case", action="append", help="substring of the bench case names to keep")
    parser.add_argument("--shapes", choices=("small", "large"), default="large",
                        help="bench shape set (default: %(default)s, the shapes of the H200 reports)")
    parser.add_argument("--set", action="append", default=[], help="MODULE.ATTR=VALUE before the run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="", help="label of this variant in the output")
    parser.add_argument("--host-profile", action="store_true", help="cProfile rlkernel's host time per case")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("profile_gpu: needs a CUDA device")
    for assignment in args.set:
        _set(assignment)
    from rlkernel.contracts import load_contracts
    from rlkernel.public import public_op

    device = torch.device("cuda")
    modules, missing = load_contracts(args.op)
    if missing:
        raise SystemExit(f"profile_gpu: unknown contract module(s) {missing}")
    results: list[dict[str, Any]] = [{"launch_floors": launch_floors()}]
    for module in modules.values():
        for case in module.bench_cases():
            if args.shapes not in case.sizes or (args.case and not any(s in case.name for s in args.case)):
                continue
            op = case.op or module.CONTRACT.name
            inputs = case.make(device)
            native = functools.partial(case.native, **inputs)
            ours = functools.partial(public_op(op), **inputs)
            row = {"op": op, "case": case.name, "tag": args.tag, "set": args.set,
                   "native": profile_side(native), "rlkernel": profile_side(ours)}
            results.append(row)
            r, n = row["rlkernel"], row["native"]
            print(f"{args.tag:>8} {op}/{case.name}: rlkernel eager {r['eager_ms']:.4f} host {r['host_us']:.1f} us "
                  f"graph {r['graph_ms']} kernels {r['kernel_ms']:.4f} ({len(r['kernels'])}) | native eager "
                  f"{n['eager_ms']:.4f} host {n['host_us']:.1f} us graph {n['graph_ms']} kernels "
                  f"{n['kernel_ms']:.4f}", flush=True)
            for k in r["kernels"][:6]:
                print(f"{'':>10}{k['us_per_call']:9.1f} us x{k['per_call']:.0f}  {k['name']}", flush=True)
            if args.host_profile:
                row["host_profile"] = host_profile(ours)
                print(row["host_profile"], flush=True)
            del inputs, native, ours
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile{('-' + args.tag) if args.tag else ''}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
