"""``linear``'s exact digit GEMM as hand-issued Hopper ``wgmma`` (``digit_gemm_sm90.cu``), for sm_90.

Triton waits for every int8 ``wgmma`` dot (its pipeliner leaves only fp32 accumulators in flight),
which holds the twelve digit products of the prefill GEMM near 40 % of the int8 peak. The CUDA
kernel issues a 128-deep K step's products as one asynchronous group while the next stage loads.
It computes the same exact integers as ``_linear_gemm_kernel`` with ``FINISH=False``:
``C[m, n] = sum_k X[m, k] * W[n, k]`` as int64 from the balanced base-128 digit planes (x [4, M, K],
weight [3, N, K]); integer sums are order-free, so the bytes are the same (docs/numerics.md R2).
The launcher in ``backends/triton/linear.py`` rounds ``C`` with the shared finish kernel.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path

import torch

from .nvrtc import CudaKernel, compile_cubin, compile_program

SOURCE = Path(__file__).with_name("digit_gemm_sm90.cu")
#: (consumer warpgroups, BLOCK_N, stages, level split): BLOCK_M = 64 x warpgroups, or 64 with the
#: level split (two warpgroups on the same rows, levels 0-2 and 3-5)
CONFIG = (2, 32, 2, 0)
#: K multiple of this: every row of a digit plane starts 16-byte aligned (``cp.async`` of 16 bytes)
K_ALIGN = 16
#: ``RLKERNEL_WGMMA=1`` turns the kernel on, ``0`` off (the Triton digit GEMM runs: the same integers)
ENV = "RLKERNEL_WGMMA"
#: the setting when ``RLKERNEL_WGMMA`` is unset: off until a device run has proved the kernel
#: (conformance and tests/test_cuda_gpu.py on an H100/H200); it is built and statically checked only
DEFAULT = "0"


def block_m(wgs: int, split: int) -> int:
    return 64 if split else 64 * wgs


def shared_bytes(wgs: int, bn: int, stages: int, split: int) -> int:
    """Dynamic shared memory: four x tiles and three weight tiles of 128-byte rows a stage, plus
    1 KiB to align the tiles to the 128-byte swizzle's 1024-byte period."""
    return stages * (4 * block_m(wgs, split) * 128 + 3 * bn * 128) + 1024


def options(config: tuple[int, int, int, int]) -> list[str]:
    """NVRTC options of one configuration (sm_90a: ``wgmma`` needs the architecture-specific target)."""
    wgs, bn, stages, split = config
    return ["--gpu-architecture=sm_90a", "--std=c++17", f"-DWGS={wgs}", f"-DBN={bn}", f"-DSTAGES={stages}",
            f"-DLEVEL_SPLIT={split}"]


@functools.cache
def build(config: tuple[int, int, int, int] = CONFIG) -> CudaKernel:
    """The kernel of one configuration, built for sm_90a (NVRTC, cached on disk)."""
    try:
        cubin = compile_cubin(SOURCE.read_text(), "digit_gemm_sm90", options(config))
    except RuntimeError as e:
        raise RuntimeError(f"linear's sm_90 digit GEMM could not be built ({e}); {ENV}=0 runs the Triton digit "
                           f"GEMM instead (the same integers C)") from e
    return CudaKernel(cubin, "digit_gemm_s8", shared_bytes(*config))


def usable(device: torch.device, k: int) -> bool:
    """Whether ``device`` runs this kernel for a reduction of length ``k``: an sm_90 GPU (the
    ``wgmma`` instructions exist there only), K a multiple of 16, and turned on (``RLKERNEL_WGMMA=1``;
    ``DEFAULT`` when unset)."""
    if device.type != "cuda" or k % K_ALIGN or k == 0 or os.environ.get(ENV, DEFAULT) != "1":
        return False
    return torch.cuda.get_device_capability(device) == (9, 0)


def digit_gemm(xd: torch.Tensor, wd: torch.Tensor, out: torch.Tensor,
               config: tuple[int, int, int, int] = CONFIG, kernel: CudaKernel | None = None) -> None:
    """``out`` int64 [M, N] (contiguous) = the exact product of the digit planes ``xd`` int8
    [4, M, K] and ``wd`` int8 [3, N, K] (both contiguous, 16-byte aligned, K % 16 == 0).
    ``kernel``: ``config``'s kernel built elsewhere (tools/exp_wgmma.py's prebuilt cubins)."""
    _, m, k = xd.shape
    n = wd.shape[1]
    if not (xd.is_contiguous() and wd.is_contiguous() and out.is_contiguous()) or out.shape != (m, n):
        raise ValueError(f"digit_gemm: contiguous xd [4, M, K], wd [3, N, K], out [M, N] expected; got "
                         f"{tuple(xd.shape)}, {tuple(wd.shape)}, {tuple(out.shape)}")
    if k % K_ALIGN or xd.data_ptr() % 16 or wd.data_ptr() % 16 or out.data_ptr() % 16:
        raise ValueError(f"digit_gemm: K={k} must be a multiple of {K_ALIGN} and every tensor 16-byte aligned")
    wgs, bn, _, split = config
    grid = ((n + bn - 1) // bn, (m + block_m(wgs, split) - 1) // block_m(wgs, split), 1)
    args = [ctypes.c_void_p(xd.data_ptr()), ctypes.c_void_p(wd.data_ptr()), ctypes.c_void_p(out.data_ptr()),
            ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k)]
    (kernel or build(config)).launch(out.device, grid, 128 * wgs, args)


def static_check(config: tuple[int, int, int, int] = CONFIG) -> tuple[bool, str]:
    """Build one configuration without a GPU and check what makes it exact and fast: the PTX has a
    K step's products (4 x 12, or 4 x 6 a warpgroup with the level split) as ``wgmma.mma_async``
    with one ``wgmma.wait_group 1`` (products in flight), no forbidden instruction
    (``static_checks.scan_ptx``), and ptxas reports no stack, no spills and no warning (it warns
    when it serialises wgmma). Returns (passed, detail)."""
    from .static_checks import scan_ptx

    try:
        _, ptx, log = compile_program(SOURCE.read_text(), "digit_gemm_sm90", [*options(config), "--ptxas-options=-v"])
    except Exception as exc:  # reported as a failed check, with the reason
        return False, f"build failed: {type(exc).__name__}: {str(exc)[:500]}"
    problems = scan_ptx(ptx)
    products = len(re.findall(r"\bwgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.s32\.s8\.s8\b", ptx))
    expected = 4 * (6 if config[3] else 12)
    if products != expected:
        problems.append(f"{products} int8 wgmma products in the PTX, {expected} expected")
    waits = re.findall(r"\bwgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    if sorted(waits) != ["0", "1"]:
        problems.append(f"wgmma waits {waits}, expected one wait_group 1 (in the K loop) and one 0 (after it)")
    if "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" not in log:
        problems.append("ptxas: stack or spills: " + " | ".join(ln.strip() for ln in log.splitlines() if "stack" in ln))
    problems += [f"ptxas: {ln.strip()}" for ln in log.splitlines() if "warning" in ln.lower()]
    registers = re.search(r"Used (\d+) registers", log)
    return not problems, "; ".join(problems) or (f"clean: {products} wgmma a K step, one wait_group 1, "
                                                 f"{registers.group(1) if registers else '?'} registers, no stack")
