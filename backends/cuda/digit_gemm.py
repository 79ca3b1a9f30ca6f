"""``linear``'s exact digit GEMM as hand-issued Hopper ``wgmma`` (``digit_gemm_sm90.cu``), for sm_90.

Triton waits for every int8 ``wgmma`` dot (its pipeliner leaves only fp32 accumulators in flight),
which holds the twelve digit products of the prefill GEMM near 40 % of the int8 peak. The CUDA
kernel issues a 128-deep K step's products as one asynchronous group while the next stage loads.
It computes the same exact integers as ``_linear_gemm_kernel`` with ``FINISH=False``:
``C[m, n] = sum_k X[m, k] * W[n, k]`` as int64 from the balanced base-128 digit planes (x [4, M, K],
weight [3, N, K]); integer sums are order-free, so the bytes are the same (docs/numerics.md R2).
``digit_gemm`` stores ``C``; ``digit_gemm_finish`` rounds it in the kernel's epilogue with
``linear_epilogue.cuh`` (P3', the contract's ``linear_finish``; checked against the contract on
the host by tests/test_cuda_epilogue.py), so the int64 ``C`` never goes through memory.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
from pathlib import Path

import torch

from .nvrtc import CudaKernel, compile_cubin, compile_program, tensor_map_u8

SOURCE = Path(__file__).with_name("digit_gemm_sm90.cu")
#: (consumer warpgroups, BLOCK_N, stages, level split, producer): BLOCK_M = 64 x warpgroups, or 64
#: with the level split (two warpgroups on the same rows, levels 0-2 and 3-5); producer 1: one more
#: warpgroup loads the stages with TMA behind mbarriers (warp-specialised; no level split)
Config = tuple[int, int, int, int, int]
#: the producer warpgroup at 128 x 64, two stages (176 KiB): on an H100 at 8192 x 4096 x 4096
#: 2.77 ms against 7.57 for (2, 32, 2, 0, 0) and 4.19 for Triton's kernel, 1.19 P int8 op/s
#: (docs/bench/issue12-session16.md, h100-exp-wgmma-df7439c.json)
CONFIG: Config = (2, 64, 2, 0, 1)
#: where CONFIG's 128-row blocks would fill at most a third of the SMs (``config_for``): one
#: warpgroup, 64 x 32, four stages (M = 256, N = 1024, K = 3072 on the H100: 0.094 ms against 0.105)
SMALL_M_CONFIG: Config = (1, 32, 4, 0, 0)
#: the configurations tools/exp_wgmma.py times against each other and tests/test_cuda_gpu.py checks
#: byte for byte: the two above; 128 x 32 without a producer; the level split at 64 x 64; the
#: producer at 64 x 64 (three stages: 169 KiB)
CANDIDATES: list[Config] = [CONFIG, SMALL_M_CONFIG, (2, 32, 2, 0, 0), (2, 64, 3, 1, 0), (1, 64, 3, 0, 1)]
#: rows between the decode and prefill sizes (64 < M <= 256) run this kernel, on weight planes made
#: per call, from this many output columns: the LM head of a decode step (1.48 ms against the mid
#: kernel's 1.97 at M = 256, N = 151 936 on the H100); at N = 1024 and 4096 the mid kernel was as fast
#: or faster. Between those widths nothing was measured: the bound keeps the layers' widths out
MID_MIN_N = 16384
#: the same with the weight's planes made once by the caller: M = 256, K = 1024, N = 4096 took 0.125 ms
#: against the mid kernel's 0.161 (H100, df7439c, ``tools/exp_wgmma.py``'s cached column); N = 1024
#: (o_proj, down_proj) is not measured, so stays on the mid kernel
CACHED_MID_MIN_N = 4096
#: dynamic shared memory a block may have on sm_90 (227 KiB)
MAX_SHARED = 232448
#: K multiple of this: every row of a digit plane starts 16-byte aligned (``cp.async`` of 16 bytes)
K_ALIGN = 16
#: ``RLKERNEL_WGMMA=1`` turns the kernel on, ``0`` off (the Triton digit GEMM runs: the same integers)
ENV = "RLKERNEL_WGMMA"
#: the setting when ``RLKERNEL_WGMMA`` is unset: on since its default configuration (the producer)
#: passed on an H100 at d791831 with the kernel on: cuda ``--full`` of linear (104 passed),
#: token_logprobs, token_logprobs_backward and attention_backward (148 passed), and the rollout and
#: trainer benchmark (rollout 0.598 -> 0.682 of native)
DEFAULT = "1"


def block_m(wgs: int, split: int) -> int:
    return 64 if split else 64 * wgs


def shared_bytes(wgs: int, bn: int, stages: int, split: int, producer: int = 0) -> int:
    """Dynamic shared memory: four x tiles and three weight tiles of 128-byte rows a stage, plus
    1 KiB to align the tiles to the 128-byte swizzle's 1024-byte period (and with a producer, two
    8-byte mbarriers a stage)."""
    return stages * (4 * block_m(wgs, split) * 128 + 3 * bn * 128) + 1024 + (16 * stages if producer else 0)


def threads(config: Config) -> int:
    """Threads a block: 128 a consumer warpgroup, and 128 for the producer's."""
    return 128 * (config[0] + config[4])


#: (FINISH, OUT, BIAS) of the kernel that stores the int64 C
C_ONLY = (0, 0, 0)
#: output dtype -> OUT code of the epilogue; bias dtype -> BIAS code (0: no bias)
OUT_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
BIAS_CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}
HEADER = SOURCE.with_name("linear_epilogue.cuh")


def source() -> str:
    """The kernel's source with ``linear_epilogue.cuh`` inlined (so the build cache's key covers both)."""
    text = SOURCE.read_text()
    include = '#include "linear_epilogue.cuh"'
    if include not in text:
        raise RuntimeError(f"{SOURCE.name} does not include linear_epilogue.cuh")
    return text.replace(include, HEADER.read_text(), 1)


def options(config: Config, variant: tuple[int, int, int] = C_ONLY) -> list[str]:
    """NVRTC options of one configuration and variant (FINISH, OUT, BIAS); sm_90a: ``wgmma`` and
    ``setmaxnreg`` need the architecture-specific target; FMA contraction off (R1: the epilogue's
    roundings are explicit)."""
    wgs, bn, stages, split, producer = config
    finish, out, bias = variant
    return ["--gpu-architecture=sm_90a", "--std=c++17", "--fmad=false", f"-DWGS={wgs}", f"-DBN={bn}",
            f"-DSTAGES={stages}", f"-DLEVEL_SPLIT={split}", f"-DPRODUCER={producer}", f"-DFINISH={finish}",
            f"-DOUT={out}", f"-DBIAS={bias}"]


def name(config: Config) -> str:
    """A configuration's name in reports: ``w<WGS>_n<BN>_s<STAGES>_l<SPLIT>_p<PRODUCER>``."""
    return "w{}_n{}_s{}_l{}_p{}".format(*config)


@functools.cache
def build(config: Config = CONFIG, variant: tuple[int, int, int] = C_ONLY) -> CudaKernel:
    """The kernel of one configuration and variant, built for sm_90a (NVRTC, cached on disk)."""
    try:
        cubin = compile_cubin(source(), "digit_gemm_sm90", options(config, variant))
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
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0)


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    """A GPU's compute capability (asked once: the question costs ~25 us of host time, and linear asks it
    at every call)."""
    return torch.cuda.get_device_capability(index)


@functools.cache
def _sm_count(index: int) -> int:
    """A GPU's SM count (asked once, as :func:`_capability`)."""
    return torch.cuda.get_device_properties(index).multi_processor_count


def usable_mid(n: int, planes: bool = False) -> bool:
    """Whether linear's rows between the decode and prefill sizes (64 < M <= 256: a decode step of
    many sequences) with ``n`` output columns run this kernel too (where :func:`usable`) instead of
    the Triton kernel that makes the weight's digits in registers: on weight planes made per call
    from ``MID_MIN_N`` columns (the LM head), on planes the caller made once (``planes``,
    ``linear_weight_digits``) from ``CACHED_MID_MIN_N``, where the measurements show it faster."""
    return n >= (CACHED_MID_MIN_N if planes else MID_MIN_N)


def config_for(m: int, n: int, device: torch.device) -> Config:
    """The configuration of one launch: ``CONFIG``, or ``SMALL_M_CONFIG`` where ``CONFIG``'s blocks
    would fill at most a third of the SMs (a decode step's M = 256 at N = 1024)."""
    blocks = -(-m // block_m(CONFIG[0], CONFIG[3])) * -(-n // CONFIG[1])
    if 3 * blocks <= _sm_count(device.index if device.index is not None else torch.cuda.current_device()):
        return SMALL_M_CONFIG
    return CONFIG


def _check_planes(xd: torch.Tensor, wd: torch.Tensor, out: torch.Tensor, what: str) -> None:
    _, m, k = xd.shape
    n = wd.shape[1]
    if not (xd.is_contiguous() and wd.is_contiguous() and out.is_contiguous()) or out.shape != (m, n):
        raise ValueError(f"digit_gemm: contiguous xd [4, M, K], wd [3, N, K], {what} [M, N] expected; got "
                         f"{tuple(xd.shape)}, {tuple(wd.shape)}, {tuple(out.shape)}")
    if k % K_ALIGN or xd.data_ptr() % 16 or wd.data_ptr() % 16 or out.data_ptr() % 16:
        raise ValueError(f"digit_gemm: K={k} must be a multiple of {K_ALIGN} and every tensor 16-byte aligned")


def _launch(kernel: CudaKernel, config: Config, xd: torch.Tensor, wd: torch.Tensor,
            pointers: list[int], device: torch.device) -> None:
    _, m, k = xd.shape
    n = wd.shape[1]
    wgs, bn, _, split, producer = config
    bm = block_m(wgs, split)
    grid = ((n + bn - 1) // bn, (m + bm - 1) // bm, 1)
    if producer:  # TMA descriptors of the planes [4, M, K] and [3, N, K]: 128 of K x a tile's rows x one plane
        operands: list = [tensor_map_u8(xd.data_ptr(), (k, m, 4), (k, m * k), (128, bm, 1)),
                          tensor_map_u8(wd.data_ptr(), (k, n, 3), (k, n * k), (128, bn, 1))]
    else:
        operands = [ctypes.c_void_p(xd.data_ptr()), ctypes.c_void_p(wd.data_ptr())]
    args = [*operands, *[ctypes.c_void_p(p) for p in pointers], ctypes.c_int(m), ctypes.c_int(n), ctypes.c_int(k)]
    kernel.launch(device, grid, threads(config), args)


def digit_gemm(xd: torch.Tensor, wd: torch.Tensor, out: torch.Tensor,
               config: Config | None = None, kernel: CudaKernel | None = None) -> None:
    """``out`` int64 [M, N] (contiguous) = the exact product of the digit planes ``xd`` int8
    [4, M, K] and ``wd`` int8 [3, N, K] (both contiguous, 16-byte aligned, K % 16 == 0).
    ``config``: default :func:`config_for` the shape; ``kernel``: ``config``'s kernel built
    elsewhere (tools/exp_wgmma.py's prebuilt cubins)."""
    _check_planes(xd, wd, out, "out")
    config = config or config_for(out.shape[0], out.shape[1], out.device)
    _launch(kernel or build(config), config, xd, wd, [out.data_ptr(), 0, 0, 0, 0], out.device)


def digit_gemm_finish(xd: torch.Tensor, wd: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                      bias: torch.Tensor | None, y: torch.Tensor, config: Config | None = None) -> None:
    """``y`` [M, N] (fp32/bf16/fp16, contiguous) = linear's output from the same product: the P3'
    epilogue (``linear_epilogue.cuh``) rounds ``C * 2**(ex + ew - 47)`` once to y's dtype (with a
    bias [N] of any of the three dtypes: to fp32, + bias, then to y's dtype), NaN on sentinel rows;
    ``ex`` int64 [M], ``ew`` int64 [N] contiguous; ``config`` as in :func:`digit_gemm`. The int64 C
    is never written."""
    _check_planes(xd, wd, y, "y")
    m, n = y.shape
    if ex.shape != (m,) or ew.shape != (n,) or not (ex.is_contiguous() and ew.is_contiguous()) \
            or ex.dtype != torch.int64 or ew.dtype != torch.int64:
        raise ValueError(f"digit_gemm_finish: contiguous int64 ex [{m}] and ew [{n}] expected; got "
                         f"{ex.dtype} {tuple(ex.shape)}, {ew.dtype} {tuple(ew.shape)}")
    if bias is not None and (bias.shape != (n,) or not bias.is_contiguous() or bias.dtype not in BIAS_CODES):
        raise ValueError(f"digit_gemm_finish: a contiguous bias [{n}] of fp32/bf16/fp16 expected; got "
                         f"{bias.dtype} {tuple(bias.shape)}")
    variant = (1, OUT_CODES[y.dtype], BIAS_CODES[bias.dtype] if bias is not None else 0)
    config = config or config_for(m, n, y.device)
    _launch(build(config, variant), config, xd, wd,
            [0, ex.data_ptr(), ew.data_ptr(), bias.data_ptr() if bias is not None else 0, y.data_ptr()], y.device)


def static_check(config: Config = CONFIG, variant: tuple[int, int, int] = C_ONLY) -> tuple[bool, str]:
    """Build one configuration without a GPU and check what makes it exact and fast: the PTX has a
    K step's products (4 x 12, or 4 x 6 a warpgroup with the level split) as ``wgmma.mma_async``
    with one ``wgmma.wait_group 1`` (products in flight), with a producer its TMA loads and
    ``setmaxnreg``, shared memory within sm_90's 227 KiB, no forbidden instruction
    (``static_checks.scan_ptx``), and ptxas reports no stack, no spills and no warning (it warns
    when it serialises wgmma). Returns (passed, detail)."""
    from .static_checks import scan_ptx

    try:
        _, ptx, log = compile_program(source(), "digit_gemm_sm90", [*options(config, variant), "--ptxas-options=-v"])
    except Exception as exc:  # reported as a failed check, with the reason
        return False, f"build failed: {type(exc).__name__}: {str(exc)[:500]}"
    problems = scan_ptx(ptx)
    if shared_bytes(*config) > MAX_SHARED:
        problems.append(f"{shared_bytes(*config)} bytes of shared memory, above sm_90's {MAX_SHARED}")
    products = len(re.findall(r"\bwgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.s32\.s8\.s8\b", ptx))
    expected = 4 * (6 if config[3] else 12)
    if products != expected:
        problems.append(f"{products} int8 wgmma products in the PTX, {expected} expected")
    waits = re.findall(r"\bwgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
    if sorted(waits) != ["0", "1"]:
        problems.append(f"wgmma waits {waits}, expected one wait_group 1 (in the K loop) and one 0 (after it)")
    if config[4]:  # the producer: seven TMA loads a stage, registers handed to the consumers
        loads = len(re.findall(r"\bcp\.async\.bulk\.tensor\.3d\.", ptx))
        if loads != 7 or "setmaxnreg.inc.sync.aligned.u32" not in ptx:
            problems.append(f"producer: {loads} TMA loads a stage (7 expected: 4 x planes, 3 weight planes) "
                            f"or no setmaxnreg")
    if "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" not in log:
        problems.append("ptxas: stack or spills: " + " | ".join(ln.strip() for ln in log.splitlines() if "stack" in ln))
    problems += [f"ptxas: {ln.strip()}" for ln in log.splitlines() if "warning" in ln.lower()]
    registers = re.search(r"Used (\d+) registers", log)
    return not problems, "; ".join(problems) or (f"clean: {products} wgmma a K step, one wait_group 1, "
                                                 f"{registers.group(1) if registers else '?'} registers, no stack")
