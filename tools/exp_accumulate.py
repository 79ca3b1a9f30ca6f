"""Experiment (issue 12, trainer): ``exact_sum_accumulate``'s state traffic on the H200.

Until e028916 ``_accumulate_kernel`` read and wrote each element's ``[20]`` int64 state as 20
strided 8-byte accesses (one per slot, 160 bytes apart across a warp): ~1.05 TB/s on the LM head's
25 GB state at 34eee00, a quarter of the 4.2 TB/s copy rate. That kernel is kept here
(``_accumulate_strided_kernel``) next to the product's, which moves the state as one coalesced
``[R, 32]`` tile (columns 20..31 masked) taken apart and put together by ``tl.split`` / ``tl.join``
trees, with the same arithmetic (``_normalize``, ``_add_terms``). Every variant's state must equal
the strided kernel's, bit for bit. Measured at e028916 (the tile variants then lived here):
strided 128 / 4 warps 21.3 ms (4.1x the floor), tiled 32 / 1 warp 5.16 ms (1.00x), 64 / 2 5.21 ms,
128 / 4 5.96 ms, 256 / 8 6.77 ms ([json](../docs/bench/h200-exp-accumulate-e028916.json)). Not
part of the product; JSON to argv[1].

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
def _ld(ptr, e, ok, i):
    """Slot ``i`` of the states of elements ``e [R]``: one strided 8-byte access (the layout before)."""
    return tl.load(ptr + e * 20 + i, mask=ok, other=0)


@triton.jit
def _st(ptr, e, ok, i, v):
    tl.store(ptr + e * 20 + i, v, mask=ok)


@triton.jit
def _accumulate_strided_kernel(s_ptr, t_ptr, S_TERMS, n, CHUNK_TERMS: tl.constexpr, R: tl.constexpr):
    """``X._accumulate_kernel`` as it was at 34eee00..e028916: each slot its own strided load and store."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    p = s_ptr
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16 = X._normalize(
        _ld(p, e, ok, 0), _ld(p, e, ok, 1), _ld(p, e, ok, 2), _ld(p, e, ok, 3), _ld(p, e, ok, 4),
        _ld(p, e, ok, 5), _ld(p, e, ok, 6), _ld(p, e, ok, 7), _ld(p, e, ok, 8), _ld(p, e, ok, 9),
        _ld(p, e, ok, 10), _ld(p, e, ok, 11), _ld(p, e, ok, 12), _ld(p, e, ok, 13), _ld(p, e, ok, 14),
        _ld(p, e, ok, 15), _ld(p, e, ok, 16))
    nan = _ld(p, e, ok, 17)
    pinf = _ld(p, e, ok, 18)
    ninf = _ld(p, e, ok, 19)
    l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, nan, pinf, ninf = X._add_terms(
        t_ptr, S_TERMS, n, e, ok, CHUNK_TERMS, l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14,
        l15, l16, nan, pinf, ninf)
    _st(p, e, ok, 0, l0)
    _st(p, e, ok, 1, l1)
    _st(p, e, ok, 2, l2)
    _st(p, e, ok, 3, l3)
    _st(p, e, ok, 4, l4)
    _st(p, e, ok, 5, l5)
    _st(p, e, ok, 6, l6)
    _st(p, e, ok, 7, l7)
    _st(p, e, ok, 8, l8)
    _st(p, e, ok, 9, l9)
    _st(p, e, ok, 10, l10)
    _st(p, e, ok, 11, l11)
    _st(p, e, ok, 12, l12)
    _st(p, e, ok, 13, l13)
    _st(p, e, ok, 14, l14)
    _st(p, e, ok, 15, l15)
    _st(p, e, ok, 16, l16)
    _st(p, e, ok, 17, nan)
    _st(p, e, ok, 18, pinf)
    _st(p, e, ok, 19, ninf)


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
    want = _run(_accumulate_strided_kernel, base.clone(), terms, 128, 4)
    rows: list[dict] = []
    floor_ms = n * 324 / 4.2e9
    variants = [("strided", _accumulate_strided_kernel, 128, 4), ("strided", _accumulate_strided_kernel, 512, 4)]
    variants += [("tiled", X._accumulate_kernel, r, w) for r, w in ((32, 1), (64, 2), (128, 4), (256, 8))]
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
