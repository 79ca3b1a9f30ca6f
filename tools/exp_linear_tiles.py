"""Experiment (issue 12, linear): the 12-dot digit GEMM's tile configurations on one GPU.

Not part of the product: times ``_linear_gemm_kernel`` (FINISH to bf16) for each (BLOCK_M, BLOCK_N,
BLOCK_K, warps, stages) at prefill shapes, checks every configuration gives the current
configuration's bits, and writes JSON (argv[1]). The launch configuration cannot change a bit
(integer sums), so the fastest one can replace ``targets.CUDA.linear_prefill``.

``--rollout``: the four linears of a Qwen3-0.6B decode step of 256 sequences and its LM head
(M = 256), device time under CUDA graphs (no host time: a rollout replays graphs) with the weights
rotated beyond L2, for the GEMM on the bf16 weight and on digit planes made once (see
``rollout``); every variant's bytes are compared with the op's::

    python tools/exp_linear_tiles.py OUT.json [--rollout | --prefill06]

``--prefill06``: the four linears of a Qwen3-0.6B prefill of 16 384 tokens (the end-to-end
benchmark's) at the current tile and at 32-row tiles (``PREFILL06_EXTRA``: below 64 rows Triton issues
``mma.sync`` instead of ``wgmma``, whose int32-accumulator dots it never leaves in flight).
"""

# ruff: noqa: B023  (each closure is timed inside its own loop iteration)
from __future__ import annotations

import functools
import json
import sys

import torch
import triton

CONFIGS = [(128, 64, 128, 8, 2), (128, 64, 64, 8, 3), (128, 64, 64, 8, 4), (64, 128, 128, 8, 2),
           (64, 64, 128, 4, 3), (128, 32, 128, 4, 3), (64, 128, 64, 4, 3), (128, 64, 128, 4, 2)]
SHAPES = [(8192, 4096, 4096), (2048, 4096, 12288), (16384, 1024, 6144), (16384, 3072, 1024)]
#: the four linears of the end-to-end benchmark's Qwen3-0.6B prefill (256 prompts x 64 tokens)
PREFILL06_SHAPES = [(16384, 1024, 4096), (16384, 2048, 1024), (16384, 1024, 6144), (16384, 3072, 1024)]
PREFILL06_EXTRA = [(32, 64, 128, 4, 2), (32, 64, 64, 4, 3), (32, 64, 128, 4, 3), (32, 64, 128, 8, 2),
                   (32, 64, 64, 8, 3), (64, 64, 64, 4, 3)]


#: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the rollout variants
ROLLOUT_TILES_BF16W = [(32, 64, 128, 4, 2), (32, 64, 64, 8, 3)]
#: 32-row tiles run mma.sync (pipelined); 64 and 128 rows wgmma (each int32-accumulator dot waited for)
ROLLOUT_TILES_PLANES = [(128, 64, 64, 8, 3), (64, 64, 64, 4, 3), (32, 64, 128, 4, 2), (32, 64, 64, 8, 3),
                        (32, 64, 128, 8, 2), (32, 64, 64, 4, 3)]
#: the four linears of a Qwen3-0.6B decode step at 256 sequences, and its LM head (fp32 logits)
ROLLOUT_SHAPES = [(256, 1024, 4096, "bf16"), (256, 2048, 1024, "bf16"), (256, 1024, 6144, "bf16"),
                  (256, 3072, 1024, "bf16"), (256, 1024, 151936, "fp32")]
#: weight copies rotate through at least this many bytes (beyond the L2 cache, as a decode step reads them)
ROTATE_BYTES = 160 << 20


def graph_ms(calls: list, reps: int = 7) -> float:
    """Device ms of one call: ``calls`` (one per weight copy) captured once in a CUDA graph and
    replayed, the median over ``reps`` replays divided by the number of calls (no host time)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2] / len(calls)


def rollout() -> list[dict]:
    """The rollout's linears (M = 256), device time a call under CUDA graphs (weights rotated beyond
    L2), for: the op as launched (``op``), the GEMM kernel on the bf16 weight (digits in registers,
    ``bf16w``) at ``ROLLOUT_TILES_BF16W``, on weight digit planes made once outside the timed calls
    (``planes``, what a cache of the planes would run) at ``ROLLOUT_TILES_PLANES``, on planes made in
    the call itself (``percall_planes``, 32-row tiles), and each of the first tiles without its
    epilogue (``noepi``: the int64 C stored, to see the epilogue's share).
    Every variant's bytes are compared with the op's."""
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton._common import OUT_CODE
    from rlkernel.backends.triton.targets import CUDA

    out = []
    for m, k, n, ydt in ROLLOUT_SHAPES:
        out_dtype = torch.bfloat16 if ydt == "bf16" else torch.float32
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        copies = max(1, -(-ROTATE_BYTES // (n * k * 2)))
        ws = [(torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16) for _ in range(copies)]
        row: dict = {"m": m, "k": k, "n": n, "out": ydt, "weight_copies": copies,
                     "native_ms": graph_ms([lambda w=w: torch.nn.functional.linear(x, w).to(out_dtype) for w in ws]),
                     "op_ms": graph_ms([lambda w=w: L.linear(x, w, out_dtype=out_dtype, target=CUDA) for w in ws])}
        ref = L.linear(x, ws[0], out_dtype=out_dtype, target=CUDA)
        xd, ex = L._digits(x)
        ews = [L._digits(w, write=False, activation=False)[1] for w in ws]
        wds = [L._digits(w, activation=False)[0] for w in ws]
        y = torch.empty(m, n, dtype=out_dtype, device="cuda")
        acc = torch.empty(m, n, dtype=torch.int64, device="cuda")
        variants = [(f"bf16w_{'x'.join(map(str, t[:3]))}_w{t[3]}s{t[4]}", t, False, True)
                    for t in ROLLOUT_TILES_BF16W]
        variants += [(f"planes_{'x'.join(map(str, t[:3]))}_w{t[3]}s{t[4]}", t, True, True)
                     for t in ROLLOUT_TILES_PLANES]
        variants += [("noepi_bf16w", ROLLOUT_TILES_BF16W[0], False, False),
                     ("noepi_planes", ROLLOUT_TILES_PLANES[0], True, False)]
        # planes made in every call (one digits kernel: the exponents and the three planes), then the
        # GEMM on them: what the op would run without any cache, in place of its exponent pass and
        # the bf16-weight GEMM that makes the digits once per 32-row tile of M
        variants += [(f"percall_planes_{'x'.join(map(str, t[:3]))}_w{t[3]}s{t[4]}", t, "percall", True)
                     for t in ROLLOUT_TILES_PLANES if t[0] == 32]
        for name, cfg, planes, finish in variants:
            def call(i: int, cfg=cfg, planes=planes, finish=finish) -> torch.Tensor:
                w = ws[i]
                wd, ew = L._digits(w, activation=False) if planes == "percall" else (wds[i] if planes else w, ews[i])
                L._launch_gemm(xd, ex, w, wd, ew, None, y if finish else acc, k, cfg,
                               w_digits=bool(planes), finish=finish, atomic=False,
                               out_code=OUT_CODE[out_dtype] if finish else 0)
                return y
            try:
                call(0)
                if finish:
                    bits = torch.int32 if ydt == "fp32" else torch.int16
                    row[name + "_equal"] = bool(torch.equal(y.view(bits), ref.view(bits)))
                row[name + "_ms"] = graph_ms([functools.partial(call, i) for i in range(copies)])
            except Exception as e:  # e.g. out of shared memory or registers: recorded, the next one runs
                row[name + "_err"] = str(e)[:200]
        print(json.dumps(row), flush=True)
        out.append(row)
        for lst in (ws, wds, ews):
            lst.clear()
        torch.cuda.empty_cache()
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
    prefill06 = "--prefill06" in sys.argv
    for m, k, n in PREFILL06_SHAPES if prefill06 else SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, generator=g, device="cuda").to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        xd, ex = L._digits(x)
        wd, ew = L._digits(w, activation=False)
        row: dict = {"m": m, "k": k, "n": n,
                     "native_ms": triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w))}
        ref = None
        for cfg in [(128, 64, 64, 8, 3), *PREFILL06_EXTRA] if prefill06 else CONFIGS:
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
