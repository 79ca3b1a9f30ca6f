"""``token_entropy`` on Triton: LM head + entropy of each token's softmax (contract ``token_entropy`` v1).

The construction is ``token_logprobs``' (:mod:`.token_logprobs`): the [T, V] logits are never held
whole; tokens are taken in chunks whose fp32 logits [chunk, V] fit in ``LOGITS_BUDGET`` bytes, and
per chunk

- ``linear.logits``: the chunk's logits exactly as ``linear`` makes them (int8 digit products of
  the hidden rows' planes with the bf16/fp16 weight, its digits made in registers on the weight
  rows' exponents of one pre-pass for the whole call), fp32;
- ``_entropy_rows_kernel``, one program per token over its stored row: ``z = y ÷ fp32(tau)``
  (IEEE division), the R5 max as an integer order key plus a NaN flag, then ``d = z - m``,
  ``p = exp_c(d)``, ``g = RN32(p (-d))`` (0 where p = 0) and the two exact int64 sums
  ``S = sum RNE(p 2**40)``, ``U = sum RNE(g 2**40)``, and at the row's end
  ``H = log_c(L) + RN32(Ubar ÷ L)`` with ``L``, ``Ubar`` rounded once each from ``S``, ``U``.

Each logit is made once and read twice (max, then the sums). Extra memory: the chunk's logits, its
hidden digit planes and O(T). The replaced torch path (the generic kernel) spent 154 ms on one
token of Qwen3-8B's head on an H100 (``docs/bench/h100-bench-all-bafe0b2.md``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch

from . import _tl_exact as E
from . import linear as L
from ._common import LAUNCH, f32_bits
from .targets import TritonTarget
from .token_logprobs import MAX_VOCAB, ROW_TILE, _token_chunk


@triton.jit
def _entropy_rows_kernel(y_ptr, stride_y, out_ptr, row0, V, tau_bits, BLOCK: tl.constexpr):
    """One token of a chunk: its stored logits row ``÷ fp32(tau)``; ``H`` to ``out[row0 + program]``.

    The max is exact (integer keys); both sums are exact int64 additions of terms placed on the
    absolute 2**-40 grid (``to_fixed_abs``: ``p <= 1`` and ``0 <= g < 1`` on rows with a finite max),
    so the order of the ``BLOCK`` lanes and of the loop is free. ``g = |RN32(p d)|`` is
    ``RN32(p (-d))``: ``d <= 0`` there, and the product's magnitude does not depend on signs.
    """
    r = tl.program_id(0)
    row = row0 + r
    y_row = y_ptr + r.to(tl.int64) * stride_y
    tau = tau_bits.to(tl.float32, bitcast=True)
    cols = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -2147483647, tl.int32)
    nanf = tl.zeros([BLOCK], tl.int32)
    for v0 in range(0, V, BLOCK):
        valid = v0 + cols < V
        z = tl.math.div_rn(tl.load(y_row + v0 + cols, mask=valid, other=0.0), tau)
        nan = E.is_nan(z)
        best = tl.maximum(best, tl.where(valid & ~nan, E.max_key(z), -2147483647))
        nanf = tl.maximum(nanf, (valid & nan).to(tl.int32))
    m = E.key_to_f32(tl.max(best, axis=0))
    finite = (tl.max(nanf, axis=0) == 0) & E.is_finite(m)
    m_safe = tl.where(finite, m, 0.0)
    s = tl.zeros([BLOCK], tl.int64)
    u = tl.zeros([BLOCK], tl.int64)
    for v0 in range(0, V, BLOCK):
        valid = v0 + cols < V
        z = tl.math.div_rn(tl.load(y_row + v0 + cols, mask=valid, other=0.0), tau)
        d = z - m_safe
        p = E.exp_c(d)
        g = tl.where(p == 0.0, 0.0, tl.abs(p * d))
        s += tl.where(valid, E.to_fixed_abs(p, 40), 0)
        u += tl.where(valid, E.to_fixed_abs(g, 40), 0)
    total = E.from_fixed(tl.sum(s, axis=0), 0, 40)
    mean = tl.math.div_rn(E.from_fixed(tl.sum(u, axis=0), 0, 40), total)
    h = E.log_c(total) + mean
    tl.store(out_ptr + row, tl.where(finite, h, E.canonical_nan_f32(h)))


def token_entropy(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0, *,
                  target: TritonTarget) -> torch.Tensor:
    """Kernel ``token_entropy``: hidden [T, H], weight [V, H] (bf16/fp16, contiguous) -> fp32 [T].

    The public op (:func:`rlkernel.ops.token_entropy`) has checked dtypes, shapes, ``1 <= V <= 2**22``,
    ``H <= 2**16 - 1`` and the temperature.
    """
    t, v = hidden.shape[0], weight.shape[0]
    if v > MAX_VOCAB:
        raise ValueError(f"token_entropy: vocab={v} exceeds the exact-sum bound 2**22 for int64 accumulation")
    out = torch.empty(t, dtype=torch.float32, device=hidden.device)
    if t == 0:
        return out
    dispatch.note_kernel("triton-fused-int8")
    _, ew = L._digits(weight, write=False)  # the weight rows' exponents, once for every chunk
    tau_bits = f32_bits(temperature)
    chunk = _token_chunk(t, v)
    block, warps = (32, 1) if L.SMALL_TILES else ROW_TILE
    for t0 in range(0, t, chunk):
        rows = min(chunk, t - t0)
        y = L.logits(hidden[t0:t0 + rows], weight, ew, target=target)  # [rows, V] fp32
        _entropy_rows_kernel[(rows,)](y, y.stride(0), out, t0, v, tau_bits, BLOCK=block, num_warps=warps, **LAUNCH)
        del y  # the next chunk reuses its memory: one chunk of logits at a time
    return out


def static_specs(target: TritonTarget):
    return [("token_entropy", "rows", _entropy_rows_kernel,
             {"y_ptr": "*fp32", "stride_y": "i64", "out_ptr": "*fp32", "row0": "i32", "V": "i32", "tau_bits": "i32",
              "BLOCK": "constexpr"},
             {"BLOCK": ROW_TILE[0]}, {"num_warps": ROW_TILE[1]})]
