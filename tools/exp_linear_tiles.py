"""Experiment (issue 12, linear prefill): the 12-dot digit GEMM's tile configurations on one GPU.

Not part of the product: times ``_linear_gemm_kernel`` (weight digit planes, FINISH to bf16) for
each (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) at prefill shapes, checks every configuration
gives the current configuration's bits, and writes JSON (argv[1]). The launch configuration
cannot change a bit (integer sums), so the fastest one can replace ``targets.CUDA.linear_prefill``.
"""

# ruff: noqa: B023  (each closure is timed inside its own loop iteration)
from __future__ import annotations

import json
import sys

import torch
import triton

CONFIGS = [(128, 64, 128, 8, 2), (128, 64, 64, 8, 3), (128, 64, 64, 8, 4), (64, 128, 128, 8, 2),
           (64, 64, 128, 4, 3), (128, 32, 128, 4, 3), (64, 128, 64, 4, 3), (128, 64, 128, 4, 2)]
SHAPES = [(8192, 4096, 4096), (2048, 4096, 12288), (16384, 1024, 6144), (16384, 3072, 1024)]


def main() -> None:
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton._common import OUT_CODE

    out = []
    for m, k, n in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        xd, ex = L._digits(x)
        wd, ew = L._digits(w, activation=False)
        row: dict = {"m": m, "k": k, "n": n,
                     "native_ms": triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w))}
        ref = None
        for cfg in CONFIGS:
            y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            name = "x".join(map(str, cfg[:3])) + f"_w{cfg[3]}s{cfg[4]}"

            def call(cfg=cfg, y=y) -> None:
                L._launch_gemm(xd, ex, w, wd, ew, None, y, k, cfg, w_digits=True, finish=True, atomic=False,
                               out_code=OUT_CODE[torch.bfloat16])
            try:
                call()
                if ref is None:
                    ref = y.clone()
                row[name + "_equal"] = bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
                row[name + "_ms"] = triton.testing.do_bench(call)
            except Exception as e:  # e.g. out of shared memory: recorded, the next one runs
                row[name + "_err"] = str(e)[:200]
        print(json.dumps(row), flush=True)
        out.append(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
