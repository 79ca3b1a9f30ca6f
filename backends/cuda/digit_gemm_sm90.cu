// The exact digit GEMM of `linear` as Hopper wgmma with its int32 accumulators kept in flight
// (loaded by backends/cuda/digit_gemm.py; sm_90a only).
//
// Triton waits for every int8 wgmma dot (its WGMMA pipeliner makes a dot async only with an fp32
// accumulator), so the twelve digit products of a K step run one after another. Here the twelve
// products of a whole 128-deep K step (4 x 12 wgmma.m64nBNk32.s32.s8.s8 a warpgroup, or 4 x 6 with
// the level split) are issued as one group, and the next stage's tiles load while they run
// (wgmma.wait_group 1).
//
// C[m, n] = sum_k X[m, k] * Wt[n, k] exactly (int64), from the balanced base-128 digit planes of
// `backends/triton/linear.py` (`_digits`): x planes int8 [4, M, K], weight planes int8 [3, N, K],
// both K contiguous (K-major, as int8 wgmma requires). Level l = sum over a + b = l of
// X_a @ W_b (int32: |level| <= 3 * 64 * 64 * K < 2**31 for K < 174763); C = sum_l level_l << 7l.
// Output: int64 C [M, N] row-major, the integers of the Triton kernel's partial (integer sums:
// any order gives the same bytes), or with FINISH the linear output y [M, N] in format OUT through
// the P3' epilogue of linear_epilogue.cuh (the same arithmetic as the Triton finish kernel's;
// tests/test_cuda_epilogue.py checks it against the contract on the host).
//
// Shapes: any M and N (rows past the end load as zeros and are not stored); K % 16 == 0 (each
// row's 16-byte chunks; chunks past K load as zeros). Build: NVRTC or nvcc for sm_90a.

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

#include "linear_epilogue.cuh"  // inlined by backends/cuda/digit_gemm.py before NVRTC builds it

#ifndef WGS
#define WGS 2  // consumer warpgroups; BLOCK_M = 64 * WGS
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef BN
#define BN 32  // 32: 16 int32 a level a thread (96 for the six levels); 64: 32 (192, near the 255 limit)
#endif
#ifndef FINISH
#define FINISH 0  // 1: the P3' epilogue (linear_epilogue.cuh) writes y in format OUT instead of C
#endif
#ifndef OUT
#define OUT 0  // 0 fp32, 1 bf16, 2 fp16
#endif
#ifndef BIAS
#define BIAS 0  // 0 none, 1 fp32, 2 bf16, 3 fp16
#endif
#ifndef PRODUCER
#define PRODUCER 0  // 1: warp-specialised: one more warpgroup loads the stages with TMA behind mbarriers
#endif
#ifndef LEVEL_SPLIT
#define LEVEL_SPLIT 0  // 1 (with WGS 2): both warpgroups on the same 64 rows, levels 0-2 and 3-5
#endif
#if PRODUCER && LEVEL_SPLIT
#error "PRODUCER and LEVEL_SPLIT do not combine"
#endif
#if LEVEL_SPLIT
#if WGS != 2
#error "LEVEL_SPLIT needs WGS 2"
#endif
#define BM 64
#define NLEV 3  // levels a warpgroup holds: 0-2 (6 products) or 3-5 (6 products)
#else
#define BM (64 * WGS)
#define NLEV 6
#endif
#define NREG (BN / 2)  // accumulator registers a level a thread (wgmma m64nBN: 64 * BN / 128)
#define BK 128  // int8 elements of K a stage: one 128-byte swizzle row
#define XD 4
#define WD 3
#define A_TILE (BM * BK)
#define B_TILE (BN * BK)
#define STAGE_BYTES (XD * A_TILE + WD * B_TILE)
#define THREADS (128 * (WGS + PRODUCER))

static __device__ __forceinline__ u32 smem_addr(const void* p) {
    return static_cast<u32>(__cvta_generic_to_shared(p));
}

#if !PRODUCER
// 16 bytes global -> shared, or 16 zero bytes where `valid` is false (src-size 0: nothing is read)
static __device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
#endif

// K-major tile of 128-byte rows, 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)),
// 1024-byte aligned: start address, LBO 1 (unused), SBO 1024 (8 rows), layout type 1 (SW128).
static __device__ __forceinline__ u64 make_desc(u32 addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}

// d[64 x BN] += A[64 x 32] @ B[BN x 32]^T (both K-major in shared memory), int8 in, int32 accumulate
#if BN == 32
static __device__ __forceinline__ void wgmma_s8(int (&d)[NREG], u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15])
        : "l"(da), "l"(db), "r"(1));
}
#elif BN == 64
static __device__ __forceinline__ void wgmma_s8(int (&d)[NREG], u64 da, u64 db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p;\n}\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]),
          "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]),
          "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]),
          "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "l"(da), "l"(db), "r"(1));
}
#else
#error "BN must be 32 or 64"
#endif

// pins the accumulators in their registers across the asynchronous products (no copies the
// compiler could schedule while a wgmma group that writes them is in flight)
static __device__ __forceinline__ void fence_acc(int (&acc)[NLEV][NREG]) {
#pragma unroll
    for (int l = 0; l < NLEV; ++l)
#pragma unroll
        for (int i = 0; i < NREG; ++i) asm volatile("" : "+r"(acc[l][i])::"memory");
}

#if !LEVEL_SPLIT
// the twelve digit products of 32 of K: X_a @ W_b into level a + b, for every a < 4, b < 3
static __device__ __forceinline__ void twelve_products(int (&acc)[NLEV][NREG], const u64 (&a)[XD], const u64 (&b)[WD]) {
    wgmma_s8(acc[0], a[0], b[0]);
    wgmma_s8(acc[1], a[0], b[1]);
    wgmma_s8(acc[2], a[0], b[2]);
    wgmma_s8(acc[3], a[1], b[2]);
    wgmma_s8(acc[4], a[2], b[2]);
    wgmma_s8(acc[5], a[3], b[2]);
    wgmma_s8(acc[1], a[1], b[0]);
    wgmma_s8(acc[2], a[1], b[1]);
    wgmma_s8(acc[3], a[2], b[1]);
    wgmma_s8(acc[4], a[3], b[1]);
    wgmma_s8(acc[2], a[2], b[0]);
    wgmma_s8(acc[3], a[3], b[0]);
}
#endif

// one thread's part of the output tile: its C values (wgmma m64nBN fragment: rows `row` and
// `row + 8`, columns n0 + 8j + 2(lane % 4) (+1)) stored as the int64 C, or with FINISH as y
static __device__ __forceinline__ void store_tile(const i64 (&c)[NREG], int row, int n0, int lane, int M, int N,
                                                  i64* __restrict__ out, const i64* __restrict__ ex,
                                                  const i64* __restrict__ ew, const void* __restrict__ bias,
                                                  void* __restrict__ y) {
#if FINISH
    // P3' per element: C * 2**(ex + ew - 47) rounded once to OUT (+ bias in fp32), NaN on sentinel rows
    i64 exr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) exr[h] = row + 8 * h < M ? ex[row + 8 * h] : 0;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = n0 + 8 * j + 2 * (lane % 4) + e;
            if (col >= N) continue;
            const i64 ewc = ew[col];
            float b = 0.0f;
#if BIAS == 1
            b = reinterpret_cast<const float*>(bias)[col];
#elif BIAS == 2
            b = rlk_bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(bias)[col]);
#elif BIAS == 3
            b = rlk_f16_bits_to_f32(reinterpret_cast<const unsigned short*>(bias)[col]);
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = row + 8 * h;
                if (r >= M) continue;
                const u32 v = rlk_linear_out(c[4 * j + 2 * h + e], exr[h], ewc, b, BIAS != 0, OUT);
                if (OUT == 0) reinterpret_cast<u32*>(y)[(long long)r * N + col] = v;
                else reinterpret_cast<unsigned short*>(y)[(long long)r * N + col] = (unsigned short)v;
            }
        }
    }
#else
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        const int col = n0 + 8 * j + 2 * (lane % 4);  // even
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = row + 8 * h;
            if (r >= M || col >= N) continue;
            i64* dst = out + (long long)r * N + col;
            if ((N & 1) == 0) {  // col + 1 < N and 16-byte aligned
                longlong2 v;
                v.x = c[4 * j + 2 * h];
                v.y = c[4 * j + 2 * h + 1];
                *reinterpret_cast<longlong2*>(dst) = v;
            } else {
                dst[0] = c[4 * j + 2 * h];
                if (col + 1 < N) dst[1] = c[4 * j + 2 * h + 1];
            }
        }
    }
#endif
}

#if PRODUCER
// ---- warp-specialised variant: warpgroup 0 produces, warpgroups 1..WGS consume ---------------------
// The stages are filled by the Tensor Memory Accelerator (cp.async.bulk.tensor, one thread), which
// writes the same 128-byte-swizzled tiles (zeros outside the tensor) and signals an mbarrier with
// the bytes it wrote; the consumers release a stage through a second mbarrier once the products
// that read it are complete. The producer gives its registers to the consumers (setmaxnreg), which
// lets BLOCK_N 64 keep its 6 x 32 accumulators a thread in registers.

// a CUtensorMap (cuTensorMapEncodeTiled, 128 bytes, 64-byte aligned), passed by value
struct __align__(64) TmaMap {
    u64 words[16];
};

static __device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

static __device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

static __device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// until the phase of parity `parity` of the mbarrier has completed
static __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

// the box (128 of K, rows, one plane) at (k, row, plane) of the tensor `map` into shared memory
static __device__ __forceinline__ void tma_load(u32 dst, const TmaMap* map, int k, int row, int plane, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
        ::"r"(dst), "l"(reinterpret_cast<u64>(map)), "r"(k), "r"(row), "r"(plane), "r"(bar) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
digit_gemm_s8(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, i64* __restrict__ out,
              const i64* __restrict__ ex, const i64* __restrict__ ew, const void* __restrict__ bias,
              void* __restrict__ y, int M, int N, int K) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((unsigned long long)smem_raw + 1023) & ~1023ull);
    // after the stages: STAGES "full" barriers (the producer's bytes landed), then STAGES "empty" ones
    const u32 bars = smem_addr(smem + STAGES * STAGE_BYTES);
    const int tid = threadIdx.x;
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    const int ksteps = (K + BK - 1) / BK;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(bars + 8 * s, 1);                       // the producer's arrive + the TMA bytes
            mbar_init(bars + 8 * (STAGES + s), 4 * WGS);      // one arrive a consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {  // producer
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (tid == 0) {
            for (int kt = 0; kt < ksteps; ++kt) {
                const int s = kt % STAGES;
                if (kt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) - 1) & 1);
                const u32 full = bars + 8 * s;
                mbar_expect_tx(full, STAGE_BYTES);
                const u32 base = smem_addr(smem + s * STAGE_BYTES);
#pragma unroll
                for (int d = 0; d < XD; ++d) tma_load(base + d * A_TILE, &xmap, kt * BK, m0, d, full);
#pragma unroll
                for (int d = 0; d < WD; ++d) tma_load(base + XD * A_TILE + d * B_TILE, &wmap, kt * BK, n0, d, full);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int cw = wg - 1;  // consumer warpgroup: rows m0 + 64 cw ..
    int acc[NLEV][NREG];
#pragma unroll
    for (int l = 0; l < NLEV; ++l)
#pragma unroll
        for (int i = 0; i < NREG; ++i) acc[l][i] = 0;
    const int warp = (tid % 128) / 32, lane = tid % 32;

    for (int kt = 0; kt < ksteps; ++kt) {
        const int s = kt % STAGES;
        mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
        const u32 a_base = smem_addr(smem + s * STAGE_BYTES) + cw * 64 * 128;
        const u32 b_base = smem_addr(smem + s * STAGE_BYTES + XD * A_TILE);
        fence_acc(acc);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 32; ++kk) {
            u64 a[XD], b[WD];
#pragma unroll
            for (int d = 0; d < XD; ++d) a[d] = make_desc(a_base + d * A_TILE) + 2 * kk;
#pragma unroll
            for (int d = 0; d < WD; ++d) b[d] = make_desc(b_base + d * B_TILE) + 2 * kk;
            twelve_products(acc, a, b);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        fence_acc(acc);
        // the previous step's products are complete in this warp: release its stage
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kt > 0 && lane == 0) mbar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_acc(acc);

    const int row = m0 + cw * 64 + 16 * warp + lane / 4;
    i64 c[NREG];
#pragma unroll
    for (int i = 0; i < NREG; ++i) {
        c[i] = 0;
#pragma unroll
        for (int l = 0; l < NLEV; ++l) c[i] += (i64)acc[l][i] * (1LL << (7 * l));
    }
    store_tile(c, row, n0, lane, M, N, out, ex, ew, bias, y);
}

#else
extern "C" __global__ void __launch_bounds__(THREADS, 1)
digit_gemm_s8(const signed char* __restrict__ xd, const signed char* __restrict__ wd, i64* __restrict__ out,
              const i64* __restrict__ ex, const i64* __restrict__ ew, const void* __restrict__ bias,
              void* __restrict__ y, int M, int N, int K) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // 1024-byte alignment of every tile (the swizzle pattern repeats every 8 rows of 128 bytes)
    unsigned char* smem = (unsigned char*)(((unsigned long long)smem_raw + 1023) & ~1023ull);
    const int tid = threadIdx.x;
    // warp-uniform for the compiler (a lane-0 shuffle), so per-warpgroup descriptors stay in uniform registers
    const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int m0 = blockIdx.y * BM;
    const int n0 = blockIdx.x * BN;
    const long long plane_x = (long long)M * K, plane_w = (long long)N * K;
    const int ksteps = (K + BK - 1) / BK;

    int acc[NLEV][NREG];
#pragma unroll
    for (int l = 0; l < NLEV; ++l)
#pragma unroll
        for (int i = 0; i < NREG; ++i) acc[l][i] = 0;

    // one stage: 4 x tiles of BM rows and 3 weight tiles of BN rows, 8 chunks of 16 bytes a row
    auto load_stage = [&](int stage, int kt) {
        unsigned char* base = smem + stage * STAGE_BYTES;
        const int k0 = kt * BK;
        constexpr int A_CHUNKS = XD * BM * 8, B_CHUNKS = WD * BN * 8;
#pragma unroll 1
        for (int q = tid; q < A_CHUNKS; q += THREADS) {
            const int d = q / (BM * 8), r = (q / 8) % BM, c = q % 8;
            const bool ok = m0 + r < M && k0 + c * 16 < K;  // rows past M and K past its end: zeros
            const signed char* src = ok ? xd + d * plane_x + (long long)(m0 + r) * K + k0 + c * 16 : xd;
            cp_async16(smem_addr(base + d * A_TILE + r * 128 + ((c ^ (r & 7)) << 4)), src, ok);
        }
#pragma unroll 1
        for (int q = tid; q < B_CHUNKS; q += THREADS) {
            const int d = q / (BN * 8), r = (q / 8) % BN, c = q % 8;
            const bool ok = n0 + r < N && k0 + c * 16 < K;
            const signed char* src = ok ? wd + d * plane_w + (long long)(n0 + r) * K + k0 + c * 16 : wd;
            cp_async16(smem_addr(base + XD * A_TILE + d * B_TILE + r * 128 + ((c ^ (r & 7)) << 4)), src, ok);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ksteps) load_stage(s, s);
        else asm volatile("cp.async.commit_group;\n" ::: "memory");  // keep the group count uniform
    }

    for (int kt = 0; kt < ksteps; ++kt) {
        const int stage = kt % STAGES;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        // this thread's copies, made through the generic proxy, become visible to wgmma's async
        // proxy; the barrier then orders every thread's copies before the products
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        const u32 a_base = smem_addr(smem + stage * STAGE_BYTES) + (LEVEL_SPLIT ? 0 : wg * 64 * 128);
        const u32 b_base = smem_addr(smem + stage * STAGE_BYTES + XD * A_TILE);
        fence_acc(acc);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 32; ++kk) {  // 32 bytes of K an instruction: +2 in 16-byte units
            u64 a[XD], b[WD];
#pragma unroll
            for (int d = 0; d < XD; ++d) a[d] = make_desc(a_base + d * A_TILE) + 2 * kk;
#pragma unroll
            for (int d = 0; d < WD; ++d) b[d] = make_desc(b_base + d * B_TILE) + 2 * kk;
#if LEVEL_SPLIT
            // the same six slots in both warpgroups (no divergent branch around wgmma): warpgroup 0
            // holds levels 0, 1, 2 in acc[0..2], warpgroup 1 levels 5, 4, 3 (1, 2, 3 products each)
            const bool hi = wg != 0;
            wgmma_s8(acc[0], hi ? a[3] : a[0], hi ? b[2] : b[0]);
            wgmma_s8(acc[1], hi ? a[2] : a[0], hi ? b[2] : b[1]);
            wgmma_s8(acc[1], hi ? a[3] : a[1], hi ? b[1] : b[0]);
            wgmma_s8(acc[2], hi ? a[1] : a[0], hi ? b[2] : b[2]);
            wgmma_s8(acc[2], hi ? a[2] : a[1], hi ? b[1] : b[1]);
            wgmma_s8(acc[2], hi ? a[3] : a[2], hi ? b[0] : b[0]);
#else
            twelve_products(acc, a, b);
#endif
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        fence_acc(acc);
        // the previous step's products are done: its stage may be refilled while this one runs
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < ksteps) load_stage(next % STAGES, next);
        else asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_acc(acc);

    // accumulator fragment of wgmma m64nN: warp w of the warpgroup holds rows 16w + lane/4 (+8),
    // columns 8j + 2(lane % 4) (+1) in registers 4j .. 4j + 3, j < N / 8
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int row = m0 + (LEVEL_SPLIT ? 0 : wg * 64) + 16 * warp + lane / 4;
#if LEVEL_SPLIT
    // the levels 3-5 warpgroup hands its part of C to the levels 0-2 one through shared memory
    // (the same fragment position at the same thread index of the other warpgroup)
    const bool hi_levels = wg != 0;  // acc[l] holds level 5 - l
    i64* part = reinterpret_cast<i64*>(smem);
    __syncthreads();  // every stage's products are complete in both warpgroups
#else
    const bool hi_levels = false;
#endif
    i64 c[NREG];
#pragma unroll
    for (int i = 0; i < NREG; ++i) {
        c[i] = 0;
#pragma unroll
        for (int l = 0; l < NLEV; ++l) c[i] += (i64)acc[l][i] * (1LL << (7 * (hi_levels ? 5 - l : l)));
    }
#if LEVEL_SPLIT
    if (wg == 1) {
#pragma unroll
        for (int i = 0; i < NREG; ++i) part[i * 128 + (tid % 128)] = c[i];
    }
    __syncthreads();
    if (wg == 1) return;
#pragma unroll
    for (int i = 0; i < NREG; ++i) c[i] += part[i * 128 + tid];
#endif
    store_tile(c, row, n0, lane, M, N, out, ex, ew, bias, y);
}
#endif  // PRODUCER
