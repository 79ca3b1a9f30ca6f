"""Where the one-launch softmax split stops paying: native vs three-launch vs fused, by row count.

For T rows of Qwen3's vocabulary (fp32, ``4 * randn`` as ``rlkernel bench``'s softmax cases), times
``torch.softmax`` / ``torch.log_softmax`` and rlkernel's two split forms (``FUSED_SPLIT_ROWS = 0``:
three launches; ``FUSED_SPLIT = True``: one) with ``triton.testing.do_bench`` (median, eager, as the
bench times) and as CUDA-graph replays, and checks that the two forms give equal bytes (the
conformance suite is the check against the reference). ``FUSED_SPLIT_ROWS`` is set from this table:
the largest T where the fused form is faster eager.

Usage (on the GPU machine, staged as tools/device_run.sh does)::

    python3 tools/exp_softmax_rows.py --out DIR [--rows 1 2 4 8 16 32 64]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

VOCAB = 151936


def _graph_ms(fn: Callable[[], torch.Tensor]) -> float:
    """Median ms of replaying one captured call (20 replays a sample, as do_bench takes samples)."""
    import triton.testing

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm: compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return float(triton.testing.do_bench(graph.replay, return_mode="median"))


def _measure(rows: int, log: bool) -> dict[str, object]:
    import triton.testing

    from rlkernel.backends.triton import softmax as S

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = 4.0 * torch.randn(rows, VOCAB, generator=g, device="cuda")
    native = (lambda: torch.log_softmax(x, dim=-1)) if log else (lambda: torch.softmax(x, dim=-1))
    ours = (lambda: S.log_softmax(x)) if log else (lambda: S.softmax(x))
    row: dict[str, object] = {"op": "log_softmax" if log else "softmax", "rows": rows}
    row["native_ms"] = float(triton.testing.do_bench(native, return_mode="median"))
    row["native_graph_ms"] = _graph_ms(native)
    outputs = {}
    for form, fused in (("split", False), ("fused", True)):
        S.FUSED_SPLIT, S.FUSED_SPLIT_ROWS = fused, 0
        outputs[form] = ours().clone()
        row[f"{form}_ms"] = float(triton.testing.do_bench(ours, return_mode="median"))
        row[f"{form}_graph_ms"] = _graph_ms(ours)
        row[f"{form}_ratio"] = row["native_ms"] / row[f"{form}_ms"]
        row[f"{form}_graph_ratio"] = row["native_graph_ms"] / row[f"{form}_graph_ms"]
    S.FUSED_SPLIT = False
    a, b = outputs["split"], outputs["fused"]
    row["bitwise_equal"] = bool(torch.equal(a.view(torch.int32), b.view(torch.int32)))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for log in (False, True):
        for t in args.rows:
            row = _measure(t, log)
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "softmax_rows.json").write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                                           "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
