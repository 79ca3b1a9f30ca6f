"""``all_reduce`` on Triton (contract ``all_reduce`` v1): exact int64 sum / max over axis 0.

This is the local combine of partials already gathered on one device (the TP simulation of the
conformance suite, or the step after an NCCL all-gather). The sum is exact in any order; its
overflow check splits each value into a signed high and an unsigned low 32-bit half, sums the
halves separately (exact for world < 2**31) and tests that the carried high sum fits int32. A
block with an overflow adds 1 to a one-word count (an integer ``atomic_add``), which the launcher
reads once; only when it is not zero does it find the first such element (the same split sums in
torch) for the error message.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import LAUNCH, cdiv

BLOCK = 1024


@triton.jit
def _all_reduce_kernel(p_ptr, out_ptr, over_ptr, world, L, MAX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < L
    if MAX:
        p = p_ptr + offs  # rank w's row is reached by pointer steps of L: no int32 w * L product
        acc = tl.load(p, mask=mask, other=0)
        for w in range(1, world):
            p += L
            acc = tl.maximum(acc, tl.load(p, mask=mask, other=0))
        tl.store(out_ptr + offs, acc, mask=mask)
    else:
        acc = tl.zeros([BLOCK], tl.int64)
        lo = tl.zeros([BLOCK], tl.int64)
        hi = tl.zeros([BLOCK], tl.int64)
        p = p_ptr + offs
        for w in range(0, world):
            v = tl.load(p, mask=mask, other=0)
            p += L
            acc += v
            lo += v & 0xFFFFFFFF
            hi += v >> 32
        hi += lo >> 32
        over = mask & ((hi < -2147483648) | (hi > 2147483647))
        tl.store(out_ptr + offs, acc, mask=mask)
        if tl.max(over.to(tl.int32), axis=0) != 0:
            tl.atomic_add(over_ptr, 1)


def all_reduce(partials: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Kernel ``all_reduce``: partials int64 [world, L] (world >= 1) -> int64 [L]."""
    if reduction not in ("sum", "max"):
        raise ValueError(f"all_reduce: op={reduction!r}; expected 'sum' or 'max'")
    p = partials.contiguous()
    world, length = p.shape
    out = torch.empty(length, dtype=torch.int64, device=p.device)
    if length == 0:
        return out
    over = torch.zeros(1, dtype=torch.int32, device=p.device)
    _all_reduce_kernel[(cdiv(length, BLOCK),)](p, out, over, world, length, MAX=reduction == "max",
                                                      BLOCK=BLOCK, num_warps=4, **LAUNCH)
    if reduction == "sum" and int(over[0]):  # the one host read: a 4-byte copy after the kernel
        i = _first_overflow(p)
        exact = sum(int(v) for v in p[:, i].tolist())
        raise ValueError(f"all_reduce: the exact sum at flat index {i} is {exact}, outside int64 "
                         f"[-2**63, 2**63); the partials' bound is broken (use fewer terms per sum)")
    return out


def _first_overflow(p: torch.Tensor) -> int:
    """The first element whose exact sum over axis 0 leaves int64 (the kernel's split sums, in torch)."""
    lo = (p & 0xFFFFFFFF).sum(dim=0)
    hi = (p >> 32).sum(dim=0) + (lo >> 32)
    return int(((hi < -(2**31)) | (hi > 2**31 - 1)).nonzero()[0, 0])


def static_specs(target):
    return [("all_reduce", name, _all_reduce_kernel,
             {"p_ptr": "*i64", "out_ptr": "*i64", "over_ptr": "*i32", "world": "i32", "L": "i64",
              "MAX": "constexpr", "BLOCK": "constexpr"}, {"MAX": mx, "BLOCK": BLOCK})
            for name, mx in (("sum", False), ("max", True))]
