"""Experiment (issue 12, trainer): ``exact_sum_accumulate``'s state traffic on the H200.

The product's ``_accumulate_kernel`` reads and writes each element's ``[20]`` int64 state as 20
strided 8-byte accesses (one per slot, 160 bytes apart across a warp): ~1.05 TB/s on the LM head's
25 GB state at 34eee00, a quarter of the 4.2 TB/s copy rate. The variants here move the state as
one coalesced ``[R, 32]`` tile (columns 20..31 masked) and get the slots out of it and back into it
with ``tl.split`` / ``tl.join`` trees (register moves when a thread holds a row), with the same
arithmetic (``_normalize``, ``_add_terms``). Every variant's state must equal the product's, bit
for bit. Not part of the product; JSON to argv[1].

Bytes floor per element and pass: 160 read + 160 written + 4 per term = 324 B; at 4.2 TB/s a
2**26-element state (10.7 GB) is 5.2 ms.
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from rlkernel.backends.triton import exact_sum as X
from rlkernel.backends.triton._common import LAUNCH


@triton.jit
def _eo(x, R: tl.constexpr, M: tl.constexpr):
    """``x [R, 2M]`` -> (columns 0, 2, 4, .., columns 1, 3, 5, ..), each ``[R, M]``."""
    return tl.split(tl.reshape(x, [R, M, 2]))


@triton.jit
def _pair(a, b, R: tl.constexpr, M: tl.constexpr):
    """The inverse of ``_eo``: ``[R, 2M]`` with a ``[R, M]`` in the even columns, b in the odd ones."""
    return tl.reshape(tl.join(a, b), [R, 2 * M])


@triton.jit
def _four(x, R: tl.constexpr):
    """``x [R, 4]`` holding slots r, r+8, r+16, r+24 -> those slots as ``[R]`` vectors."""
    a, b = _eo(x, R, 2)  # a: slots r, r+16 (columns 0, 2); b: r+8, r+24
    a0, a1 = _eo(a, R, 1)
    b0, b1 = _eo(b, R, 1)
    return tl.reshape(a0, [R]), tl.reshape(b0, [R]), tl.reshape(a1, [R]), tl.reshape(b1, [R])


@triton.jit
def _unpack(x, R: tl.constexpr):
    """The 20 slots of a state tile ``x [R, 32]`` as ``[R]`` vectors (even/odd splits five times)."""
    e, o = _eo(x, R, 16)  # slots 2i, 2i+1
    ee, eo = _eo(e, R, 8)  # 4i, 4i+2
    oe, oo = _eo(o, R, 8)  # 4i+1, 4i+3
    g0, g4 = _eo(ee, R, 4)  # 8i, 8i+4: each [R, 4] holding r, r+8, r+16, r+24 in columns 0, 1, 2, 3
    g2, g6 = _eo(eo, R, 4)
    g1, g5 = _eo(oe, R, 4)
    g3, g7 = _eo(oo, R, 4)
    s0, s8, s16, _u0 = _four(g0, R)
    s1, s9, s17, _u1 = _four(g1, R)
    s2, s10, s18, _u2 = _four(g2, R)
    s3, s11, s19, _u3 = _four(g3, R)
    s4, s12, _u4, _v4 = _four(g4, R)
    s5, s13, _u5, _v5 = _four(g5, R)
    s6, s14, _u6, _v6 = _four(g6, R)
    s7, s15, _u7, _v7 = _four(g7, R)
    return s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16, s17, s18, s19


@triton.jit
def _col(v, R: tl.constexpr):
    return tl.reshape(v, [R, 1])


@triton.jit
def _group(a, b, c, d, R: tl.constexpr):
    """Slots r, r+8, r+16, r+24 ``[R]`` -> ``[R, 4]`` in that column order (the inverse of ``_four``)."""
    return _pair(_pair(_col(a, R), _col(c, R), R, 1), _pair(_col(b, R), _col(d, R), R, 1), R, 2)


@triton.jit
def _pack(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15, s16, s17, s18, s19, R: tl.constexpr):
    """The inverse of ``_unpack``: a ``[R, 32]`` state tile (slots 20..31 zero)."""
    z = tl.zeros_like(s0)
    g0 = _group(s0, s8, s16, z, R)
    g1 = _group(s1, s9, s17, z, R)
    g2 = _group(s2, s10, s18, z, R)
    g3 = _group(s3, s11, s19, z, R)
    g4 = _group(s4, s12, z, z, R)
    g5 = _group(s5, s13, z, z, R)
    g6 = _group(s6, s14, z, z, R)
    g7 = _group(s7, s15, z, z, R)
    e = _pair(_pair(g0, g4, R, 4), _pair(g2, g6, R, 4), R, 8)
    o = _pair(_pair(g1, g5, R, 4), _pair(g3, g7, R, 4), R, 8)
    return _pair(e, o, R, 16)


@triton.jit
def _accumulate_tiled_kernel(s_ptr, t_ptr, S_TERMS, n, CHUNK_TERMS: tl.constexpr, R: tl.constexpr):
    """``X._accumulate_kernel`` with the state moved as one coalesced ``[R, 32]`` tile."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    c = tl.arange(0, 32)
    ptrs = s_ptr + e[:, None] * 20 + c[None, :]
    mask = ok[:, None] & (c < 20)[None, :]
    tile = tl.load(ptrs, mask=mask, other=0)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = _unpack(tile, R)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16 = X._normalize(
        l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16
    )
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = X._add_terms(
        t_ptr,
        S_TERMS,
        n,
        e,
        ok,
        CHUNK_TERMS,
        l0,
        l1,
        l2,
        l3,
        l4,
        l5,
        l6,
        l7,
        l8,
        l9,
        l10,
        l11,
        l12,
        l13,
        l14,
        l15,
        l16,
        nan,
        pinf,
        ninf,
    )
    tl.store(
        ptrs,
        _pack(l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf, R),
        mask=mask,
    )


def _run(kernel, state: torch.Tensor, terms: torch.Tensor, r: int, warps: int) -> torch.Tensor:
    n = state.shape[0]
    kernel[(triton.cdiv(n, r),)](state, terms, terms.shape[0], n, CHUNK_TERMS=X.CHUNK, R=r, num_warps=warps, **LAUNCH)
    return state


def main() -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else (1 << 26 if dev == "cuda" else 1000)
    g = torch.Generator(device=dev).manual_seed(0)
    scale = torch.exp2(torch.randint(-40, 40, (n,), generator=g, device=dev).float())
    first = torch.randn(1, n, generator=g, device=dev) * scale
    terms = torch.randn(1, n, generator=g, device=dev) * scale
    terms[0, :7] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45, -3e38])
    base = X.exact_sum_partial(first).view(n, 20)
    want = _run(X._accumulate_kernel, base.clone(), terms, X.ROWS, X.WARPS)
    rows: list[dict] = []
    floor_ms = n * 324 / 4.2e9
    variants = [
        ("product", X._accumulate_kernel, X.ROWS, X.WARPS),
        ("product", X._accumulate_kernel, 256, 8),
        ("product", X._accumulate_kernel, 512, 4),
    ]
    variants += [("tiled", _accumulate_tiled_kernel, r, w) for r, w in ((32, 1), (64, 2), (128, 4), (128, 8), (256, 8))]
    if dev == "cpu":  # the interpreter: bits only
        variants = [v for v in variants if v[2] <= 128][:4]
    for name, kernel, r, w in variants:
        row: dict = {"variant": name, "R": r, "warps": w}
        try:
            got = _run(kernel, base.clone(), terms, r, w)
            row["equal"] = bool(torch.equal(got, want))
            if dev == "cuda":
                st = base.clone()
                ms = triton.testing.do_bench(lambda k=kernel, s=st, r=r, w=w: _run(k, s, terms, r, w), warmup=5, rep=50)
                row.update(ms=ms, tb_s=n * 324 / ms / 1e9, floor_ms=floor_ms, x_floor=ms / floor_ms)
        except Exception as exc:  # a variant that fails to compile is a row, not the end of the run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    if len(sys.argv) > 1 and sys.argv[1] != "-":
        with open(sys.argv[1], "w") as f:
            json.dump({"elements": n, "state_gb": n * 160 / 1e9, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
