"""Where an op's time goes on a CUDA GPU: eager median, CUDA-graph replay median, GPU kernels.

For the bench cases of the given contract modules (``rlkernel bench``'s inputs), both sides
(native PyTorch and rlkernel) get:

- ``eager_ms``: ``triton.testing.do_bench`` median of one call, as ``rlkernel bench`` times it
  (host launch costs included when the GPU outruns the host);
- ``graph_ms``: the median of replaying one call captured in a CUDA graph (launch costs gone;
  ``None`` with the reason when the call cannot be captured, e.g. it reads a tensor on the host);
- ``kernels``: every GPU kernel one call runs, with its mean device time (``torch.profiler``).

``eager_ms`` far above the kernels' sum means the call is bound by host launches, not the GPU.
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


def _set(assignment: str) -> None:
    target, value = assignment.split("=", 1)
    module_name, attr = target.rsplit(".", 1)
    module = importlib.import_module(module_name)
    if not hasattr(module, attr):
        raise SystemExit(f"--set {assignment}: {module_name} has no attribute {attr}")
    setattr(module, attr, type(getattr(module, attr))(value))


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


def profile_side(call: Callable[[], Any]) -> dict[str, Any]:
    import triton

    eager = float(triton.testing.do_bench(call, return_mode="median"))
    graph, why = _graph_ms(call)
    kernels = _kernels(call)
    return {"eager_ms": eager, "graph_ms": graph, "graph_error": why, "kernels": kernels,
            "kernel_ms": sum(k["us_per_call"] for k in kernels) / 1000.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", action="append", required=True, help="contract module (repeatable)")
    parser.add_argument("--case", action="append", help="substring of the bench case names to keep")
    parser.add_argument("--shapes", choices=("small", "large"), default="large",
                        help="bench shape set (default: %(default)s, the shapes of the H200 reports)")
    parser.add_argument("--set", action="append", default=[], help="MODULE.ATTR=VALUE before the run")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="", help="label of this variant in the output")
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
    results = []
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
            print(f"{args.tag:>8} {op}/{case.name}: rlkernel eager {r['eager_ms']:.4f} graph {r['graph_ms']} "
                  f"kernels {r['kernel_ms']:.4f} ({len(r['kernels'])}) | native eager {n['eager_ms']:.4f} "
                  f"graph {n['graph_ms']} kernels {n['kernel_ms']:.4f}", flush=True)
            for k in r["kernels"][:6]:
                print(f"{'':>10}{k['us_per_call']:9.1f} us x{k['per_call']:.0f}  {k['name']}", flush=True)
            del inputs, native, ours
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"profile{('-' + args.tag) if args.tag else ''}.json"
    path.write_text(json.dumps(results, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
