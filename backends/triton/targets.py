"""Per-target configuration of the shared Triton kernels: everything that differs between vendors.

The kernels (``@triton.jit`` functions in this package) are one source for every GPU; what a
target changes is only *how they are launched*: tile sizes, warps and pipeline stages, and the
compiler target the static checks build for. None of it can change a bit: every sum is an
integer sum, so tiles, K splits and the number of programs are free (docs/numerics.md R2).

- ``CUDA``: NVIDIA, warps of 32, int8 ``mma.sync``/``wgmma``; 227 KiB of shared memory per block
  on the H200. The values are those the H200 conformance report was made with.
- ``ROCM``: AMD Instinct, wavefronts of 64, int8 MFMA (``v_mfma_i32_32x32x16_i8`` on gfx942,
  ``v_mfma_i32_32x32x8i8`` on gfx90a, ``v_mfma_i32_32x32x32_i8`` on gfx950); 64 KiB of LDS per
  workgroup on gfx90a/gfx942 (160 KiB on gfx950), so the prefill GEMM tile is smaller than on the
  H200 (four x digit planes of 128 x 128 and three weight planes of 64 x 128 need 88 KiB).

A backend binds its target to the launchers that take one (``TritonBackend.kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TritonTarget:
    """How the shared kernels are launched and compiled on one vendor's GPUs."""

    #: rlkernel backend name (``cuda``, ``rocm``)
    name: str
    #: Triton compiler backend of ``GPUTarget`` (``"cuda"``, ``"hip"``)
    compiler: str
    #: threads per warp / wavefront
    warp_size: int
    #: architectures the static checks compile for (``90``; ``"gfx942"``)
    static_archs: tuple[int | str, ...]
    #: linear prefill GEMM: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
    linear_prefill: tuple[int, int, int, int, int]
    #: linear decode GEMM (M <= 64): (BLOCK_N, BLOCK_K, num_warps, num_stages); BLOCK_M = next pow2 of M (>= 16)
    linear_decode: tuple[int, int, int, int]
    #: split-K decode launches aim at this many programs per SM / CU
    split_k_waves: int
    #: attention: warps of a 16-row (decode) block and of a 32-row block; pipeline stages
    attention_warps: int
    attention_stages: int
    #: attention_paged's pass-2 kernel: warps / wavefronts (the int8 path holds ten int32 [BLOCK_M, D]
    #: level accumulators, the fp64 path two fp64 ones)
    attention_sums_warps: int
    #: attention's exact integer products (q.k, R.V) as fp64 matrix products (one for q.k, two for R.V,
    #: DMMA / fp64 MFMA) instead of int8 digit products (nine, eighteen); exact either way, so the bits
    #: are the same (backends/triton/attention.py)
    attention_f64: bool = False
    #: pipeline stages of attention_paged's two key-range kernels (the forward and backward kernels
    #: take ``attention_stages``)
    attention_paged_stages: int = 1
    #: attention_paged blocks of at most this many packed query rows (decode) run attention_rows.py's
    #: fp64 CUDA-core kernels instead of the matrix-unit ones (0: never; needs ``attention_f64``)
    attention_rows_max: int = 0
    #: linear at 64 < M <= 256 rows (a decode step of a large batch): the decode kernel (weight digits
    #: made in registers from the bf16/fp16 weight, no weight planes) at this (BLOCK_M, BLOCK_N,
    #: BLOCK_K, num_warps, num_stages); None: the prefill path (weight digit planes)
    linear_mid: tuple[int, int, int, int, int] | None = None
    #: ``linear_mid``'s kernel where ``linear_mid``'s output tiles are at most ``linear.MID_FEW_WAVES``
    #: per SM (narrow outputs: more warps a tile hide more latency); None: ``linear_mid``
    linear_mid_few: tuple[int, int, int, int, int] | None = None
    #: module of a vendor digit GEMM for the prefill path (weight digit planes), used where its
    #: ``usable(device, K)`` says so, and for the mid rows where ``usable_mid(N)`` also does (weight
    #: planes made per call): ``digit_gemm(xd, wd, out)`` writes the int64 ``C`` that
    #: ``_linear_gemm_kernel`` would (the same integers), ``digit_gemm_finish(xd, wd, ex, ew, bias, y)``
    #: the output through the same P3' epilogue; None: Triton's
    digit_gemm: str | None = None


CUDA = TritonTarget(
    name="cuda", compiler="cuda", warp_size=32, static_archs=(90,),
    # K steps of 64, three stages: four x digit planes of 128 x 64 and three weight planes of 64 x 64
    # take 44 KiB a stage. Measured on the H200 against (128, 64, 128, 8, 2) (two stages of 88 KiB),
    # same bits: 7-15 % faster at M >= 2048 of Qwen3-8B shapes, 2 % slower at 16384 x 3072 x 1024
    # (tools/exp_linear_tiles.py, docs/bench/h200-linear-tiles-45b4539.json)
    linear_prefill=(128, 64, 64, 8, 3),
    # sm_90, on by default (RLKERNEL_WGMMA=0: off): int8 wgmma products kept in flight (Triton does not)
    digit_gemm="rlkernel.backends.cuda.digit_gemm",
    linear_decode=(32, 128, 4, 2),
    split_k_waves=4,
    attention_warps=4, attention_stages=1,
    # the fp64 path's two fp64 [16, 128] accumulators are 64 registers a thread at 4 warps (the
    # int8 path's ten int32 levels needed 16 warps to avoid spills: one program per SM)
    attention_sums_warps=4,
    # Triton 3.6 and 3.9 lower fp64 tl.dot to mma.sync ... .f64 on sm_90 (3.6: m16n8k16, 3.9: m8n8k4)
    attention_f64=True,
    # two stages: 6-9 % faster on every paged decode bench shape, 3.5x slower for the prefill kernel
    # (H200 at b27c290, tools/exp_attention_f64.py, docs/bench/h200-exp-attention-f64-b27c290.json)
    attention_paged_stages=2,
    # decode of GQA groups of up to 4 query heads a KV head on the fp64 CUDA cores: at 8 rows the
    # pass-2 kernel spills registers (ptxas for sm_90), at 4 it holds 220, at 2 (Qwen3-0.6B) 127
    attention_rows_max=4,
    # the linears of a Qwen3-0.6B decode step of 256 sequences, device time under CUDA graphs
    # (tools/exp_linear_tiles.py --rollout; H100 at 78328fb, H200 at 78cf962: docs/bench/
    # h100-exp-linear-rollout-78328fb.json, h200-exp-linear-rollout-78cf962.json): (32, 64, 128, 4, 2)
    # is fastest from N = 4096 (512 output tiles; H200: qkv 0.057 against 0.064 ms at 8 warps, the LM
    # head 1.88 against 2.20); at N = 1024 (128 tiles, under one per SM) 8 warps and K steps of 64
    # are (o_proj 0.040 -> 0.030, down_proj 0.059 -> 0.044 ms); same bytes
    linear_mid=(32, 64, 128, 4, 2),
    linear_mid_few=(32, 64, 64, 8, 3),
)

ROCM = TritonTarget(
    name="rocm", compiler="hip", warp_size=64, static_archs=("gfx942", "gfx90a", "gfx950"),
    # 64 KiB of LDS per workgroup (gfx90a/gfx942): a 128 x 64 tile with K steps of 64 holds
    # 4 * 128 * 64 + 3 * 64 * 64 = 44 KiB of digit planes (the compile reports the LDS each
    # specialisation takes; the AMD static checks require it to fit)
    linear_prefill=(128, 64, 64, 8, 2),
    linear_decode=(32, 128, 4, 2),
    split_k_waves=4,
    attention_warps=4, attention_stages=1,
    # wavefronts of 64: 4 of them hold the accumulators in 80 VGPRs a lane
    attention_sums_warps=4,
)

TARGETS = {t.name: t for t in (CUDA, ROCM)}
