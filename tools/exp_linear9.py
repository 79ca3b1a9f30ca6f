"""Experiment (issue 12, linear prefill): nine Karatsuba digit products, one int32 accumulator, flattened K loop.

Not part of the product: measures on the H200 whether one standard int8 tile looping over the
nine products (D0 D1 D2 P01 P02 P12 E0 E1 E2) beats the 12-dot kernel, and checks its int64 C
equals ``linear_partial``'s bit for bit.
"""

# ruff: noqa: B023  (each lambda is timed inside its own loop iteration)
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

# product p -> (x plane, w plane); x planes [a0 a1 a2 a3 s01 s02 s12], w planes [b0 b1 b2 t01 t02 t12]
XP = (0, 1, 2, 4, 5, 6, 3, 3, 3)
WP = (0, 1, 2, 3, 4, 5, 0, 1, 2)
# C = sum_p coef_p * P_p
COEF = (1 - (1 << 7) - (1 << 14), -(1 << 7) + (1 << 14) - (1 << 21), -(1 << 14) - (1 << 21) + (1 << 28),
        1 << 7, 1 << 14, 1 << 21, 1 << 21, 1 << 28, 1 << 35)


@triton.jit
def _sel(p, v0, v1, v2, v3, v4, v5, v6, v7, v8):
    return tl.where(p == 0, v0, tl.where(p == 1, v1, tl.where(p == 2, v2, tl.where(p == 3, v3, tl.where(
        p == 4, v4, tl.where(p == 5, v5, tl.where(p == 6, v6, tl.where(p == 7, v7, v8))))))))


@triton.jit
def _tile_rows(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """Rows and columns of this program's output tile, tiles in groups of GROUP row-tiles (L2 reuse)."""
    pid = tl.program_id(0)
    npm = tl.cdiv(M, BM)
    width = GROUP * tl.cdiv(N, BN)
    first = (pid // width) * GROUP
    gs = tl.minimum(npm - first, GROUP)
    pm = first + (pid % width) % gs
    pn = (pid % width) // gs
    return pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN)


@triton.jit
def prod9_kernel(xd, wd, c_ptr, M, N, K, x_plane, w_plane,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    rm, rn = _tile_rows(M, N, BM, BN, GROUP)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    nk = tl.cdiv(K, BK)
    acc = tl.zeros([BM, BN], tl.int32)
    c = tl.zeros([BM, BN], tl.int64)
    ki = -1
    p = 0
    for _ in range(0, 9 * nk):
        ki = tl.where(ki == nk - 1, 0, ki + 1)
        xo = _sel(p, 0, 1, 2, 4, 5, 6, 3, 3, 3).to(tl.int64) * x_plane
        wo = _sel(p, 0, 1, 2, 3, 4, 5, 0, 1, 2).to(tl.int64) * w_plane
        kk = ki * BK + rk
        k_ok = kk < K
        a = tl.load(xd + xo + rm[:, None].to(tl.int64) * K + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0)
        b = tl.load(wd + wo + rn[None, :].to(tl.int64) * K + kk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        if ki == nk - 1:
            coef = _sel(p, 1 - 128 - 16384, -128 + 16384 - 2097152, -16384 - 2097152 + 268435456, 128, 16384,
                        2097152, 2097152, 268435456, 34359738368)
            c += acc.to(tl.int64) * coef
            acc = tl.zeros([BM, BN], tl.int32)
            p += 1
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], c, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def prod9s_kernel(xd, wd, c_ptr, M, N, K, x_plane, w_plane,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):
    """The nine products as nine unrolled K loops (one int32 accumulator each), folded into int64 C."""
    rm, rn = _tile_rows(M, N, BM, BN, GROUP)
    rk = tl.arange(0, BK)
    m_ok = rm < M
    n_ok = rn < N
    c = tl.zeros([BM, BN], tl.int64)
    for p in tl.static_range(9):
        xo = _sel(p, 0, 1, 2, 4, 5, 6, 3, 3, 3) * x_plane
        wo = _sel(p, 0, 1, 2, 3, 4, 5, 0, 1, 2) * w_plane
        xp = xd + xo + rm[:, None].to(tl.int64) * K + rk[None, :]
        wp = wd + wo + rn[None, :].to(tl.int64) * K + rk[:, None]
        acc = tl.zeros([BM, BN], tl.int32)
        for k0 in range(0, K, BK):
            k_ok = k0 + rk < K
            a = tl.load(xp + k0, mask=m_ok[:, None] & k_ok[None, :], other=0)
            b = tl.load(wp + k0, mask=k_ok[:, None] & n_ok[None, :], other=0)
            acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        c += acc.to(tl.int64) * _sel(p, 1 - 128 - 16384, -128 + 16384 - 2097152, -16384 - 2097152 + 268435456, 128,
                                     16384, 2097152, 2097152, 268435456, 34359738368)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], c, mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def int8_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     GROUP: tl.constexpr):
    rm, rn = _tile_rows(M, N, BM, BN, GROUP)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BM, BN], tl.int32)
    for k0 in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * K + (k0 + rk)[None, :])
        b = tl.load(b_ptr + rn[None, :].to(tl.int64) * K + (k0 + rk)[:, None])
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc)


def main() -> None:
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    out = []
    torch.manual_seed(0)
    for m, k, n in ((8192, 4096, 4096), (2048, 4096, 12288), (256, 1024, 3072), (256, 1024, 151936)):
        x = (torch.randn(m, k, device="cuda") * torch.where(torch.rand(k, device="cuda") < 0.01, 100.0, 1.0)).bfloat16()
        w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
        xd, ex = L._digits(x)
        wd, ew = L._digits(w, activation=False)
        xs = torch.cat([xd, (xd[0] + xd[1])[None], (xd[0] + xd[2])[None], (xd[1] + xd[2])[None]]).contiguous()
        ws = torch.cat([wd, (wd[0] + wd[1])[None], (wd[0] + wd[2])[None], (wd[1] + wd[2])[None]]).contiguous()
        ref = L.linear_partial(x, w, ex, ew, target=CUDA)
        row: dict = {"m": m, "k": k, "n": n}
        row["native_bf16_ms"] = triton.testing.do_bench(lambda: torch.nn.functional.linear(x, w))
        row["rlkernel_linear_ms"] = triton.testing.do_bench(lambda: L.linear(x, w, target=CUDA))
        row["digits_x_ms"] = triton.testing.do_bench(lambda: L._digits(x))
        row["digits_w_ms"] = triton.testing.do_bench(lambda: L._digits(w, activation=False))
        row["partial_12dot_ms"] = triton.testing.do_bench(lambda: L.linear_partial(x, w, ex, ew, target=CUDA))
        a8, b8 = xd[0].contiguous(), wd[0].contiguous()
        try:
            row["int_mm_ms_x1"] = triton.testing.do_bench(lambda: torch._int_mm(a8, b8.T))
        except Exception as e:
            row["int_mm_err"] = str(e)[:200]
        c32 = torch.empty(m, n, dtype=torch.int32, device="cuda")
        for bm, bn, bk, warps, stages in ((128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (128, 256, 128, 8, 4)):
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            try:
                row[f"tl_int8_x1_{bm}x{bn}x{bk}_w{warps}s{stages}_ms"] = triton.testing.do_bench(
                    lambda: int8_gemm_kernel[grid](a8, b8, c32, m, n, k, BM=bm, BN=bn, BK=bk, GROUP=8,
                                                   num_warps=warps, num_stages=stages))
            except Exception as e:
                row[f"tl_int8_{bm}x{bn}x{bk}_err"] = str(e)[:200]
        c = torch.empty(m, n, dtype=torch.int64, device="cuda")
        variants = [("prod9s", prod9s_kernel, cfg) for cfg in
                    ((128, 128, 128, 8, 3), (128, 128, 128, 8, 4), (128, 128, 64, 8, 4), (64, 128, 128, 4, 4),
                     (128, 64, 128, 4, 4), (64, 256, 128, 8, 3), (128, 256, 64, 8, 3))]
        variants += [("prod9", prod9_kernel, (64, 128, 128, 4, 4))]
        for kind, fn, (bm, bn, bk, warps, stages) in variants:
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            name = f"{kind}_{bm}x{bn}x{bk}_w{warps}s{stages}"
            try:
                c.zero_()
                h = fn[grid](xs, ws, c, m, n, k, m * k, n * k, BM=bm, BN=bn, BK=bk, GROUP=8,
                             num_warps=warps, num_stages=stages)
                row[name + "_equal"] = bool(torch.equal(c, ref))
                row[name + "_regs_spills"] = [getattr(h, "n_regs", None), getattr(h, "n_spills", None)]
                row[name + "_ms"] = triton.testing.do_bench(
                    lambda: fn[grid](xs, ws, c, m, n, k, m * k, n * k, BM=bm, BN=bn, BK=bk, GROUP=8,
                                     num_warps=warps, num_stages=stages))
            except Exception as e:
                row[name + "_err"] = str(e)[:300]
        print(json.dumps(row), flush=True)
        out.append(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
