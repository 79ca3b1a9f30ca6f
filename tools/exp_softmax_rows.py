"""Where the one-launch softmax split stops paying: native vs three-launch vs fused, by row count.

For T rows of Qwen3's vocabulary (fp32, ``4 * randn`` as ``rlkernel bench``'s softmax cases), times
``torch.softmax`` / ``torch.log_softmax`` and rlkernel's two split forms (``FUSED_SPLIT`` False:
three launches; True: one) with ``triton.testing.do_bench`` (median, eager, as the bench times) and
as CUDA-graph replays (``profile_gpu._graph_ms``), and checks that the two forms give equal bytes
(the conformance suite is the check against the reference). At c349312 the fused form was nowhere
faster (docs/bench/h100-softmax-rows-c349312.json).

Usage (on the GPU machine, staged as tools/device_run.sh does)::

    python3 tools/exp_softmax_rows.py --out DIR [--rows 1 2 4 8 16 32 64]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_gpu import _graph_ms  # noqa: E402  (a sibling tool: the CUDA-graph replay median)

VOCAB = 151936


def _measure(rows: int, log: bool) -> dict[str, object]:
    import triton.testing

    from rlkernel.backends.triton import softmax as S

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = 4.0 * torch.randn(rows, VOCAB, generator=g, device="cuda")
    native = (lambda: torch.log_softmax(x, dim=-1)) if log else (lambda: torch.softmax(x, dim=-1))
    ours = (lambda: S.log_softmax(x)) if log else (lambda: S.softmax(x))
    row: dict[str, object] = {"op": "log_softmax" if log else "softmax", "rows": rows}
    row["native_ms"] = float(triton.testing.do_bench(native, return_mode="median"))
    row["native_graph_ms"] = _graph_ms(native)[0]
    outputs = {}
    for form, fused in (("split", False), ("fused", True)):
        S.FUSED_SPLIT = fused
        outputs[form] = ours().clone()
        row[f"{form}_ms"] = float(triton.testing.do_bench(ours, return_mode="median"))
        row[f"{form}_graph_ms"] = _graph_ms(ours)[0]
        row[f"{form}_ratio"] = row["native_ms"] / row[f"{form}_ms"]
        graphs = row["native_graph_ms"], row[f"{form}_graph_ms"]  # None where a capture failed
        row[f"{form}_graph_ratio"] = graphs[0] / graphs[1] if None not in graphs else None
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
