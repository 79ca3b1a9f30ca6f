"""``embedding`` on Triton (contract ``embedding`` v1): a row gather with canonical NaNs.

The kernel checks the ids itself, so the launch needs no range check on the host (which took
four extra launches and a sync): an id outside ``[0, V)`` never reads outside the table (its
output row is the canonical NaN) and is counted, by an integer ``atomic_add``, in a one-word
error buffer. Eager, the launcher reads that word once after the kernel and, only when it is not
zero, finds the first bad id and raises :class:`rlkernel._validate.IdOutOfRange`; under
CUDA-graph capture it neither zeroes nor reads it (the capturing caller vouches for the ids, as the public op
documents). The kernel copies bits (NaN payloads are replaced by the canonical NaN of the dtype,
P8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import _validate as v

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, pow2_block


@triton.jit
def _embedding_fwd_kernel(ids_ptr, w_ptr, y_ptr, err_ptr, vocab, hidden, w_row_stride, w_col_stride,
                          OUT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    row = tl.load(ids_ptr + i).to(tl.int64)
    ok = (row >= 0) & (row < vocab)
    if not ok:  # a count (integer add: native on every target; min is a compare-and-swap loop on gfx90a)
        tl.atomic_add(err_ptr, 1)
    row = tl.where(ok, row, 0)
    cols = tl.arange(0, BLOCK)
    if OUT == 1:
        canon = tl.full([BLOCK], 0x7FC0, tl.int16).to(tl.bfloat16, bitcast=True)
    elif OUT == 2:
        canon = tl.full([BLOCK], 0x7E00, tl.int16).to(tl.float16, bitcast=True)
    else:
        canon = tl.full([BLOCK], 0x7FC00000, tl.int32).to(tl.float32, bitcast=True)
    for h0 in range(0, hidden, BLOCK):
        h = h0 + cols
        mask = h < hidden
        val = tl.load(w_ptr + row * w_row_stride + h * w_col_stride, mask=mask, other=0.0)  # row 0 if bad
        val = tl.where(E.is_nan(E.upcast(val)), canon, val)
        tl.store(y_ptr + i * hidden + h, tl.where(ok, val, canon), mask=mask)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Kernel ``embedding``: ids int64 [L], weight [V, H] -> [L, H]; ids are checked in the kernel.

    Raises
    ------
    rlkernel._validate.IdOutOfRange
        An id outside ``[0, V)`` (not under CUDA-graph capture: then its row is NaN).
    """
    length, hidden = ids.shape[0], weight.shape[1]
    out = torch.empty((length, hidden), dtype=weight.dtype, device=weight.device)
    if length == 0 or hidden == 0:
        return out
    if length >= 1 << 31:
        raise ValueError(f"embedding: {length} ids; expected fewer than 2**31 (the error count is int32); "
                         f"split the ids into batches")
    capturing = v.capturing(weight.device)
    # captured, the count is never read: no zero fill (a graph node of its own beside a 2 us gather)
    err = (torch.empty if capturing else torch.zeros)(1, dtype=torch.int32, device=weight.device)
    block = pow2_block(hidden, 16, 4096)
    _embedding_fwd_kernel[(length,)](ids.contiguous(), weight, out, err, weight.shape[0], hidden, weight.stride(0),
                                     weight.stride(1), OUT=OUT_CODE[weight.dtype], BLOCK=block, num_warps=4, **LAUNCH)
    if not capturing:
        if int(err[0]):  # the one host read: a 4-byte copy after the kernel
            bad = ((ids < 0) | (ids >= weight.shape[0])).nonzero()  # only when there is an error
            raise v.IdOutOfRange("embedding", int(bad[0, 0]))
    return out


#: the public op leaves the id range check to this kernel
embedding.checks_ids = True  # type: ignore[attr-defined]


def static_specs(target):
    return [("embedding", dt, _embedding_fwd_kernel,
             {"ids_ptr": "*i64", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "err_ptr": "*i32", "vocab": "i64",
              "hidden": "i32", "w_row_stride": "i64", "w_col_stride": "i64", "OUT": "constexpr",
              "BLOCK": "constexpr"}, {"OUT": code, "BLOCK": 4096})
            for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0))]
