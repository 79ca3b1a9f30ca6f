"""Experiment (issue 12): the digit GEMM as hand-issued Hopper wgmma (``tools/wgmma_digit_gemm.cu``).

Not part of the product. Triton waits for every int8 wgmma dot (int32 accumulators are never
left in flight by its pipeliner), which holds ``linear``'s twelve digit products near 40 % of the
int8 peak. The CUDA kernel issues a K step's products (twelve per 32 of K) as one asynchronous group and loads the
next stage meanwhile. This tool builds it (NVRTC from the CUDA wheels beside torch, or a cubin
built elsewhere with ``nvcc -arch=sm_90a -cubin``), loads and launches it through the driver API
(ctypes; torch's context and stream), checks that its int64 ``C`` equals the Triton kernel's on the same
digit planes (exact integers: any order gives the same bytes), and times both, next to torch's
bf16 matmul, at the shapes of the end-to-end benchmark (Qwen3-0.6B prefill and decode) and a
large square one::

    python tools/exp_wgmma.py OUT.json [--cubin DIR] [--config WGS,BN,STAGES,SPLIT ...]

Prints one line per shape and configuration; OUT.json has every figure.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import statistics
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("wgmma_digit_gemm.cu")
#: (M, K, N): Qwen3-0.6B prefill of 16 384 tokens, a decode step of 256 sequences with its LM
#: head, and a large square product
SHAPES = [(16384, 1024, 4096), (16384, 2048, 1024), (16384, 1024, 6144), (16384, 3072, 1024),
          (256, 1024, 4096), (256, 3072, 1024), (256, 1024, 151936), (8192, 4096, 4096)]
#: (warpgroups, BLOCK_N, stages, level split), 128-deep K steps: BLOCK_M = 64 x warpgroups, or 64
#: with the level split (two warpgroups on the same rows, levels 0-2 and 3-5: half the accumulators
#: a thread, so BLOCK_N 64 fits without spilling)
CONFIGS = [(2, 32, 2, 0), (1, 32, 4, 0), (2, 64, 3, 1), (2, 64, 4, 1)]


def block_m(wgs: int, split: int) -> int:
    return 64 if split else 64 * wgs


def smem_bytes(wgs: int, bn: int, stages: int, split: int) -> int:
    """Dynamic shared memory of a configuration: four x tiles and three weight tiles of 128-byte
    rows a stage, plus 1 KiB to align the tiles to the swizzle's 1024 bytes."""
    return stages * (4 * block_m(wgs, split) * 128 + 3 * bn * 128) + 1024


def _nvrtc() -> ctypes.CDLL:
    """libnvrtc from the CUDA wheels next to torch (nvidia/*/lib), with its builtins preloaded."""
    import glob
    import site

    roots = [*site.getsitepackages(), site.getusersitepackages(), str(Path(torch.__file__).parent.parent)]
    for root in roots:
        libs = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*")))
        builtins = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc-builtins.so*")))
        if libs:
            for b in builtins:  # libnvrtc dlopens its builtins by name: load them first, globally
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            return ctypes.CDLL([lib for lib in libs if ".alt." not in lib][0])
    found = ctypes.util.find_library("nvrtc")
    if found is None:
        raise RuntimeError("no libnvrtc found (nvidia/*/lib under site-packages, or the loader's path); "
                           "pass --cubin DIR with cubins built by nvcc -arch=sm_90a -cubin")
    return ctypes.CDLL(found)


def nvrtc_cubin(source: str, options: list[str]) -> bytes:
    """``source`` compiled by NVRTC to a cubin (``options`` must name an sm_ architecture)."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"wgmma_digit_gemm.cu", 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status:
        raise RuntimeError(f"NVRTC status {status}: {log.value.decode(errors='replace')[-2000:]}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw


class Kernel:
    """``digit_gemm_s8`` of one configuration, loaded and launched through the CUDA driver API
    (ctypes; torch's context and current stream)."""

    def __init__(self, cubin: bytes, cfg: tuple[int, int, int, int]) -> None:
        torch.cuda.init()
        torch.empty(1, device="cuda")  # the primary context is current on this thread
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.cfg = cfg
        self.module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(self.cuda.cuModuleLoadData(ctypes.byref(self.module), cubin), "cuModuleLoadData")
        self._check(self.cuda.cuModuleGetFunction(ctypes.byref(self.fn), self.module, b"digit_gemm_s8"),
                    "cuModuleGetFunction")
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        self._check(self.cuda.cuFuncSetAttribute(self.fn, 8, smem_bytes(*cfg)), "cuFuncSetAttribute")

    def _check(self, status: int, what: str) -> None:
        if status:
            msg = ctypes.c_char_p()
            self.cuda.cuGetErrorString(status, ctypes.byref(msg))
            raise RuntimeError(f"{what}: CUDA error {status} ({(msg.value or b'').decode()})")

    def __call__(self, xd: torch.Tensor, wd: torch.Tensor, out: torch.Tensor) -> None:
        wgs, bn, _, split = self.cfg
        _, m, k = xd.shape
        n = wd.shape[1]
        values = [ctypes.c_void_p(xd.data_ptr()), ctypes.c_void_p(wd.data_ptr()), ctypes.c_void_p(out.data_ptr()),
                  ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k)]
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self._check(self.cuda.cuLaunchKernel(self.fn, n // bn, m // block_m(wgs, split), 1, 128 * wgs, 1, 1,
                                             smem_bytes(*self.cfg), stream, params, None), "cuLaunchKernel")


def build(wgs: int, bn: int, stages: int, split: int, cubin_dir: Path | None) -> Kernel:
    """The kernel of one configuration: a prebuilt cubin from ``cubin_dir`` if there is one, else NVRTC."""
    cubin = cubin_dir / f"wgmma_digit_gemm_w{wgs}_n{bn}_s{stages}_l{split}.cubin" if cubin_dir else None
    if cubin is not None and cubin.is_file():
        image = cubin.read_bytes()
    else:
        image = nvrtc_cubin(SOURCE.read_text(), ["--gpu-architecture=sm_90a", "--std=c++17", f"-DWGS={wgs}",
                                                 f"-DBN={bn}", f"-DSTAGES={stages}", f"-DLEVEL_SPLIT={split}"])
    return Kernel(image, (wgs, bn, stages, split))


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

    triton_c()
    row = {"m": m, "k": k, "n": n, "int8_products_T": 12 * 2 * m * n * k / 1e12,
           "native_bf16_ms": device_ms(lambda: torch.nn.functional.linear(x, w)),
           "triton_int64_ms": device_ms(triton_c), "triton_tile": tile}
    for cfg, fn in kernels.items():
        name = "w{}_n{}_s{}_l{}".format(*cfg)
        if m % block_m(cfg[0], cfg[3]) or n % cfg[1] or k % 128:
            row[name + "_skipped"] = "shape not a multiple of the tile"
            continue
        out = torch.full((m, n), -1, dtype=torch.int64, device="cuda")  # poisoned: every element must be written
        try:
            fn(xd, wd, out)
            torch.cuda.synchronize()
            row[name + "_equal"] = bool(torch.equal(out, ref))
            if not row[name + "_equal"]:
                bad = (out != ref).nonzero()
                row[name + "_first_diff"] = [int(v) for v in bad[0]]
                row[name + "_diff_count"] = int(len(bad))
            row[name + "_ms"] = device_ms(lambda fn=fn, out=out: fn(xd, wd, out))
        except Exception as e:  # recorded: the next configuration still runs
            row[name + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--cubin", type=Path,
                   help="folder of prebuilt cubins (wgmma_digit_gemm_w<WGS>_n<BN>_s<STAGES>_l<SPLIT>.cubin)")
    p.add_argument("--config", action="append", help=f"WGS,BN,STAGES,SPLIT (repeatable; default: {CONFIGS})")
    args = p.parse_args(argv)
    configs = [tuple(int(v) for v in c.split(",")) for c in args.config] if args.config else CONFIGS
    kernels, rows = {}, []
    for cfg in configs:
        try:
            kernels[cfg] = build(*cfg, args.cubin)
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
