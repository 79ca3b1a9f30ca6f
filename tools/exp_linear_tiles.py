"""Experiment (issue 12, linear): the 12-dot digit GEMM's tile configurations on one GPU.

Not part of the product: times ``_linear_gemm_kernel`` (FINISH to bf16) for each (BLOCK_M, BLOCK_N,
BLOCK_K, warps, stages) at prefill shapes, checks every configuration gives the current
configuration's bits, and writes JSON (argv[1]). The launch configuration cannot change a bit
(integer sums), so the fastest one can replace ``targets.CUDA.linear_prefill``.

``--rollout``: the four linears of a Qwen3-0.6B decode step of 256 sequences (M = 256, beyond the
M <= 64 decode path, so today on the prefill tile without a K split for most of them), with the
weight's digit planes made first (``digits+``, the launcher's path today) or in registers from the
bf16 weight (``bf16w``), without and with a K split (int64 atomics, then the finish kernel); every
variant is timed whole (planes, zero-fill and finish included) and its bytes compared::

    python tools/exp_linear_tiles.py OUT.json [--rollout]
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


#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, weight digits made first, K splits)
ROLLOUT_CONFIGS = [(128, 64, 64, 8, 3, True, 1), (128, 64, 64, 8, 3, True, 4), (64, 64, 64, 4, 3, True, 1),
                   (64, 64, 64, 4, 3, True, 2), (64, 128, 64, 4, 3, True, 1), (64, 64, 128, 4, 3, True, 2),
                   (128, 64, 64, 8, 3, False, 1), (64, 64, 64, 4, 3, False, 1), (64, 64, 128, 4, 2, False, 1),
                   (64, 64, 64, 4, 3, False, 2), (128, 32, 128, 4, 2, False, 1), (32, 64, 128, 4, 2, False, 1)]
ROLLOUT_SHAPES = [(256, 1024, 4096), (256, 2048, 1024), (256, 1024, 6144), (256, 3072, 1024)]


def rollout() -> list[dict]:
    """``ROLLOUT_CONFIGS`` at ``ROLLOUT_SHAPES`` (M, K, N), each call timed whole."""
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton._common import OUT_CODE
    from rlkernel.backends.triton.targets import CUDA

    out = []
    for m, k, n in ROLLOUT_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        row: dict = {"m": m, "k": k, "n": n,
                     "native_ms": triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w)),
                     "launcher_ms": triton.testing.do_bench(lambda: L.linear(x, w, target=CUDA))}
        ref = L.linear(x, w, target=CUDA)
        for bm, bn, bk, warps, stages, planes, splits in ROLLOUT_CONFIGS:
            name = f"{bm}x{bn}x{bk}_w{warps}s{stages}_{'digits+' if planes else 'bf16w'}_k{splits}"
            k_split = triton.cdiv(triton.cdiv(k, bk), splits) * bk

            def call(cfg=(bm, bn, bk, warps, stages), planes=planes, k_split=k_split) -> torch.Tensor:
                xd, ex = L._digits(x)
                if planes:
                    wd, ew = L._digits(w, activation=False)
                else:
                    wd, ew = w, L._digits(w, write=False, activation=False)[1]
                if k_split >= k:
                    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                    L._launch_gemm(xd, ex, w, wd, ew, None, y, k, cfg, w_digits=planes, finish=True, atomic=False,
                                   out_code=OUT_CODE[torch.bfloat16])
                    return y
                acc = torch.zeros(m, n, dtype=torch.int64, device="cuda")
                L._launch_gemm(xd, ex, w, wd, ew, None, acc, k_split, cfg, w_digits=planes, finish=False,
                               atomic=True, out_code=0)
                return L._finish(acc, ex, ew, None, torch.bfloat16)
            try:
                row[name + "_equal"] = bool(torch.equal(call().view(torch.int16), ref.view(torch.int16)))
                row[name + "_ms"] = triton.testing.do_bench(call)
            except Exception as e:  # e.g. out of shared memory or registers: recorded, the next one runs
                row[name + "_err"] = str(e)[:200]
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton._common import OUT_CODE

    if "--rollout" in sys.argv:
        doc = rollout()
        with open(sys.argv[1], "w") as f:
            json.dump(doc, f, indent=1)
        return
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
