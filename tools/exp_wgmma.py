"""Experiment (issue 12): ``linear``'s digit GEMM as hand-issued Hopper wgmma
(``backends/cuda/digit_gemm_sm90.cu``, launched by ``backends/cuda/digit_gemm.py``) against the Triton one.

Triton waits for every int8 wgmma dot (int32 accumulators are never left in flight by its
pipeliner), which holds ``linear``'s twelve digit products near 40 % of the int8 peak. The CUDA
kernel issues a K step's products (twelve per 32 of K) as one asynchronous group and loads the
next stage meanwhile. For each configuration (``digit_gemm.CANDIDATES`` unless ``--config``) this
tool builds it (the product's NVRTC build, or a cubin built elsewhere with ``nvcc -arch=sm_90a
-cubin`` and ``digit_gemm.options``' macros),
checks that its int64 ``C`` equals the Triton kernel's on the same digit planes (exact integers:
any order gives the same bytes; poisoned output, so every element must be written), and times both,
next to torch's bf16 matmul, at the shapes of the end-to-end benchmark (Qwen3-0.6B prefill and
decode), a large square one and ragged ones (M, N off the tiles, K off the 128-deep step). Each
configuration is also timed as a whole op with the weight's digit planes made once
(``*_cached_planes_op_ms``: x digits, the wgmma GEMM with its own P3' epilogue, whose bf16 bytes
are compared with the Triton finish of the Triton C: ``*_fused_equal``) and with both operands'
planes made at each call (``*_percall_planes_op_ms``), next to the op as it runs
(``product_op_ms``; at M <= 256 the decode/mid kernel, which makes the weight's digits in
registers): the decode step's question is whether a weight-plane cache plus wgmma beats it::

    python tools/exp_wgmma.py OUT.json [--cubin DIR] [--config WGS,BN,STAGES,SPLIT,PRODUCER ...]

Prints one line per shape and configuration; OUT.json has every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

#: (M, K, N): Qwen3-0.6B prefill of 16 384 tokens, a decode step of 256 sequences with its LM
#: head, a large square product, and ragged shapes (tails in M and N, odd N, K % 128 != 0)
SHAPES = [(16384, 1024, 4096), (16384, 2048, 1024), (16384, 1024, 6144), (16384, 3072, 1024),
          (256, 1024, 4096), (256, 3072, 1024), (256, 1024, 151936), (8192, 4096, 4096),
          (1000, 1040, 1000), (77, 2064, 4097), (130, 16, 33)]


def build(cfg: tuple[int, ...], cubin_dir: Path | None):
    """The kernel of one configuration: a prebuilt cubin from ``cubin_dir`` if there is one, else
    the product's NVRTC build (``backends/cuda/digit_gemm.py``)."""
    from rlkernel.backends.cuda import digit_gemm as D
    from rlkernel.backends.cuda.nvrtc import CudaKernel

    cubin = cubin_dir / f"wgmma_digit_gemm_{D.name(cfg)}.cubin" if cubin_dir else None
    if cubin is not None and cubin.is_file():
        return CudaKernel(cubin.read_bytes(), "digit_gemm_s8", D.shared_bytes(*cfg))
    return D.build(cfg)


def launch(fn, cfg: tuple[int, ...], xd: torch.Tensor, wd: torch.Tensor, out: torch.Tensor) -> None:
    """The product launcher's argument checks and grid, with kernel ``fn`` of configuration ``cfg``."""
    from rlkernel.backends.cuda import digit_gemm as D

    D.digit_gemm(xd, wd, out, cfg, kernel=fn)


def device_ms(fn, reps: int = 10) -> float:
    """Median device ms of ``fn()`` over ``reps`` timed calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def measure(m: int, k: int, n: int, kernels: dict, g: torch.Generator) -> dict:
    """One shape: the Triton kernel's int64 C on the op's digit planes, each CUDA configuration's C
    (poisoned output, compared byte for byte) and the device times, next to torch's bf16 matmul."""
    from rlkernel.backends.cuda import digit_gemm as D
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    x = torch.randn(m, k, generator=g, device="cuda")
    x[:, :4] *= 300.0  # outlier channels, as real activations have
    x = x.to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    xd, ex = L._digits(x)
    wd, ew = L._digits(w, activation=False)
    ref = torch.empty(m, n, dtype=torch.int64, device="cuda")
    tile = CUDA.linear_prefill

    def triton_c() -> None:
        L._launch_gemm(xd, ex, w, wd, ew, None, ref, k, tile, w_digits=True, finish=False, atomic=False, out_code=0)

    def product_op() -> None:  # the op as it runs (RLKERNEL_WGMMA as set), the weight's exponents given as in
        # the decode graphs
        L._gemm(x, w, None, ew, None, torch.bfloat16, CUDA)

    triton_c()
    row = {"m": m, "k": k, "n": n, "int8_products_T": 12 * 2 * m * n * k / 1e12,
           "native_bf16_ms": device_ms(lambda: torch.nn.functional.linear(x, w)),
           "triton_int64_ms": device_ms(triton_c), "triton_tile": tile,
           # M <= 256: x digits + the decode/mid kernel (bf16 weight, digits in registers); above:
           # x digits + weight planes + the prefill kernel
           "product_op_ms": device_ms(product_op)}
    for cfg, fn in kernels.items():
        name = D.name(cfg)
        out = torch.full((m, n), -1, dtype=torch.int64, device="cuda")  # poisoned: every element must be written
        try:
            launch(fn, cfg, xd, wd, out)
            torch.cuda.synchronize()
            row[name + "_equal"] = bool(torch.equal(out, ref))
            if not row[name + "_equal"]:
                bad = (out != ref).nonzero()
                row[name + "_first_diff"] = [int(v) for v in bad[0]]
                row[name + "_diff_count"] = int(len(bad))
            row[name + "_ms"] = device_ms(lambda fn=fn, cfg=cfg, out=out: launch(fn, cfg, xd, wd, out))

            def cached_planes_op(cfg=cfg) -> torch.Tensor:  # weight planes made once (a cache), x per call
                xd_, ex_ = L._digits(x)
                y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                D.digit_gemm_finish(xd_, wd, ex_, ew, None, y, cfg)  # the kernel's own P3' epilogue
                return y

            # the fused epilogue's bytes against the Triton finish of the Triton C
            want = L._finish(ref, ex, ew, None, torch.bfloat16)
            row[name + "_fused_equal"] = bool(torch.equal(cached_planes_op().view(torch.int16), want.view(torch.int16)))
            # what a weight-plane cache would give the decode step (M <= 256) against product_op_ms
            row[name + "_cached_planes_op_ms"] = device_ms(cached_planes_op)

            def percall_planes_op(cfg=cfg) -> torch.Tensor:  # the prefill path's work: both operands' planes
                xd_, ex_ = L._digits(x)
                wd_, _ = L._digits(w, ew, activation=False)
                y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                D.digit_gemm_finish(xd_, wd_, ex_, ew, None, y, cfg)
                return y

            # without a cache: the weight's planes made at every call (M <= 256: against product_op_ms)
            row[name + "_percall_planes_op_ms"] = device_ms(percall_planes_op)
        except Exception as e:  # recorded: the next configuration still runs
            row[name + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--cubin", type=Path,
                   help="folder of prebuilt cubins (wgmma_digit_gemm_<digit_gemm.name(config)>.cubin)")
    p.add_argument("--config", action="append",
                   help="WGS,BN,STAGES,SPLIT,PRODUCER (repeatable; default: digit_gemm.CANDIDATES)")
    args = p.parse_args(argv)
    from rlkernel.backends.cuda import digit_gemm as D

    configs = [tuple(int(v) for v in c.split(",")) for c in args.config] if args.config else D.CANDIDATES
    kernels, rows = {}, []
    for cfg in configs:
        try:
            kernels[cfg] = build(cfg, args.cubin)
        except Exception as e:  # recorded: the other configurations still run
            rows.append({"config": cfg, "build_error": f"{type(e).__name__}: {str(e)[-1500:]}"})
            print(f"config {cfg}: build failed: {type(e).__name__}: {str(e)[-300:]}", flush=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, k, n in SHAPES:
        row = measure(m, k, n, kernels, g)
        rows.append(row)
        cells = " ".join(f"{k_}={v:.4g}" if isinstance(v, float) else f"{k_}={v}" for k_, v in row.items()
                         if k_.endswith(("_ms", "_equal", "_error")))
        print(f"M={m} K={k} N={n}: {cells}", flush=True)
        torch.cuda.empty_cache()
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                        "pid": os.getpid(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
