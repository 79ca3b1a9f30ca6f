"""Experiment (issue 12, attention): the exact products on fp64 CUDA cores, fp64 MMAs and int8 MMAs, on one GPU.

Not part of the product: runs ``attention_paged`` (decode) and ``attention`` (prefill) of the Triton
backend with the CUDA target three times: as configured (decode blocks of at most
``attention_rows_max`` rows on attention_rows.py's fp64 CUDA-core kernels), with every decode block
on the fp64 matrix-unit kernels (``attention_rows_max=0``), and with the int8 digit products (nine
for q.k, eighteen for R.V); checks that all give the same bytes (every product is an exact integer
either way), and times each (CUDA graph replays for decode, ``triton.testing.do_bench`` for
prefill) next to the bench's native baseline. Writes JSON to argv[1]::

    python tools/exp_attention_f64.py OUT.json
"""

# ruff: noqa: B023  (each closure is timed inside its own loop iteration)
from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch
import triton

CASES = ("qwen3_0.6b_decode_B256_ctx128_bs16_bf16", "qwen3_8b_decode_B64_ctx4096_bs16_bf16",
         "qwen3_8b_decode_B8_ctx32768_bs16_bf16", "qwen3_8b_decode_B256_ctx4096_bs16_bf16",
         "qwen3_8b_prefill_T2048_causal_bf16", "qwen3_8b_prefill_T8192_causal_bf16")


def _graph_ms(fn, reps: int = 20) -> float:
    """Median device ms of one call replayed from a CUDA graph (``exp_linear_tiles.graph_ms``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from exp_linear_tiles import graph_ms

    return graph_ms([fn], reps)


def main() -> None:
    from rlkernel.backends.triton import attention as A
    from rlkernel.backends.triton import attention_paged as P
    from rlkernel.backends.triton.targets import CUDA
    from rlkernel.contracts.attention import bench_cases

    int8 = dataclasses.replace(CUDA, attention_f64=False, attention_sums_warps=16, attention_rows_max=0)
    mma = dataclasses.replace(CUDA, attention_rows_max=0)
    # the prefill cases run the first and the last only (the others differ in decode kernels only)
    variants = {"f64": CUDA, "f64_mma": mma, "int8": int8}
    dev = torch.device("cuda")
    rows = []
    for case in bench_cases():
        if case.name not in CASES:
            continue
        kw = case.make(dev)
        paged = case.op == "attention_paged"
        row: dict = {"case": case.name}
        outs = {}
        names = list(variants) if paged else ["f64", "int8"]
        for name in names:
            target = variants[name]
            if paged:
                def call(t=target):
                    return P.attention_paged(kw["q"], kw["k_cache"], kw["v_cache"], kw["block_table"],
                                             kw["seq_lens_k"], kw["cu_seqlens_q"], target=t)
            else:
                def call(t=target):
                    return A.attention(kw["q"], kw["k"], kw["v"], kw["cu_seqlens_q"], kw["cu_seqlens_k"], target=t)
            t0 = time.perf_counter()
            outs[name] = call()
            torch.cuda.synchronize()
            row[f"{name}_first_s"] = round(time.perf_counter() - t0, 2)  # compile included
            row[f"{name}_ms"] = _graph_ms(call) if paged else triton.testing.do_bench(call)
        row["native_ms"] = (_graph_ms(lambda: case.native(**kw)) if paged
                            else triton.testing.do_bench(lambda: case.native(**kw)))
        row["same_bytes"] = all(bool(torch.equal(outs[v].view(torch.int16), outs["int8"].view(torch.int16)))
                                for v in names)
        for name in names:
            row[f"{name}_ratio"] = row["native_ms"] / row[f"{name}_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
           "rows": rows}
    with open(sys.argv[1], "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
