"""``token_entropy`` on Triton: LM head + entropy of each token's softmax (contract ``token_entropy`` v1).

The construction is ``token_logprobs``' (:mod:`.token_logprobs`): the [T, V] logits are never held
whole; tokens are taken in chunks whose fp32 logits [chunk, V] fit in ``LOGITS_BUDGET`` bytes, and
per chunk

- ``linear.logits``: the chunk's logits exactly as ``linear`` makes them (int8 digit products of
  the hidden rows' planes with the bf16/fp16 weight, its digits made in registers on the weight
  rows' exponents of one pre-pass for the whole call, or read from its digit planes made
  once in that pre-pass where the vendor GEMM takes the chunks: ``linear.logits_weight``), fp32;
- ``_entropy_rows_kernel``, one program per token over its stored row: ``z = y ÷ fp32(tau)``
  (IEEE division), the R5 max as an integer order key plus a NaN flag, then ``d = z - m``,
  ``p = exp_c(d)``, ``g = RN32(p (-d))`` (0 where p = 0) and the two exact int64 sums
  ``S = sum RNE(p 2**40)``, ``U = sum RNE(g 2**40)``, and at the row's end
  ``H = log_c(L) + RN32(Ubar ÷ L)`` with ``L``, ``Ubar`` rounded once each from ``S``, ``U``.

Each logit is made once and read twice (max, then the sums). Extra memory: the chunk's logits, its
hidden digit planes and O(T); with the vendor GEMM, the weight's digit planes (3 bytes a weight
element). The replaced torch path (the generic kernel) spent 154 ms on one token of Qwen3-8B's head
on an H100 (``docs/bench/h100-bench-all-bafe0b2.md``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch
from rlkernel.backends.generic import token_entropy as _generic

from . import _tl_exact as E
from . import linear as L
from ._common import LAUNCH, cdiv, f32_bits
from .targets import TritonTarget
from .token_logprobs import MAX_VOCAB, ROW_TILE, _token_chunk, row_max_key
from .token_logprobs_backward import TritonSteps, coefficients_spec


@triton.jit
def _entropy_rows_kernel(y_ptr, stride_y, out_ptr, m_ptr, fin_ptr, total_ptr, mean_ptr, row0, V, tau_bits,
                         STATS: tl.constexpr, BLOCK: tl.constexpr):
    """One token of a chunk: its stored logits row ``÷ fp32(tau)``; ``H`` to ``out[row0 + program]``, or
    with STATS the backward's row statistics to ``m`` (``m0``: the max, 0 where not finite), ``fin``
    (int32: the max is finite), ``total`` (``L``, 1 where not finite) and ``mean`` (0 there).

    The max is exact (integer keys); both sums are exact int64 additions of terms placed on the
    absolute 2**-40 grid (``to_fixed_abs``: ``p <= 1`` and ``0 <= g < 1`` on rows with a finite max),
    so the order of the ``BLOCK`` lanes and of the loop is free. ``g = |RN32(p d)|`` is
    ``RN32(p (-d))``: ``d <= 0`` there, and the product's magnitude does not depend on signs.
    """
    r = tl.program_id(0)
    row = row0 + r
    y_row = y_ptr + r.to(tl.int64) * stride_y
    tau = tau_bits.to(tl.float32, bitcast=True)
    key, nan = row_max_key(y_row, V, tau, BLOCK)
    m = E.key_to_f32(key)
    finite = (nan == 0) & E.is_finite(m)
    cols = tl.arange(0, BLOCK)
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
    if STATS:
        tl.store(m_ptr + row, m_safe)
        tl.store(fin_ptr + row, finite.to(tl.int32))
        tl.store(total_ptr + row, tl.where(finite, total, 1.0))
        tl.store(mean_ptr + row, tl.where(finite, mean, 0.0))
    else:
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
    tau_bits = f32_bits(temperature)
    chunk = _token_chunk(t, v)
    # the weight rows' exponents (and, where the vendor GEMM takes the chunks, its planes), once for every chunk
    wd, ew = L.logits_weight(weight, min(chunk, t), cdiv(t, chunk), target=target)
    block, warps = (32, 1) if L.SMALL_TILES else ROW_TILE
    for t0 in range(0, t, chunk):
        rows = min(chunk, t - t0)
        y = L.logits(hidden[t0:t0 + rows], weight, ew, target=target, wd=wd)  # [rows, V] fp32
        _entropy_rows_kernel[(rows,)](y, y.stride(0), out, out, out, out, out, t0, v, tau_bits, STATS=False,
                                      BLOCK=block, num_warps=warps, **LAUNCH)
        del y  # the next chunk reuses its memory: one chunk of logits at a time
    return out


class TritonEntropySteps(TritonSteps, _generic.EntropySteps):
    """The generic entropy backward's steps: ``token_logprobs_backward``'s kernels (logits, exact
    products, column exponents, d_weight's rounding), the row statistics by ``_entropy_rows_kernel``
    (STATS) and the coefficients by ``_tlb_coefficients_kernel`` (ENTROPY), for one target."""

    def entropy_stats(self, z: torch.Tensor, vs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        # z is already divided by tau (fill_logits): the kernel's division by fp32(1) changes no bit
        r, v = z.shape
        dev = z.device
        m0, total, mean = (torch.empty(r, dtype=torch.float32, device=dev) for _ in range(3))
        fin = torch.empty(r, dtype=torch.int32, device=dev)
        if r:
            block, warps = (32, 1) if L.SMALL_TILES else ROW_TILE
            _entropy_rows_kernel[(r,)](z, z.stride(0), m0, m0, fin, total, mean, 0, v, f32_bits(1.0), STATS=True,
                                       BLOCK=block, num_warps=warps, **LAUNCH)
        return m0, fin != 0, total, mean

    def entropy_coefficients(self, z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor, total: torch.Tensor,
                             mean: torch.Tensor, s: torch.Tensor, vs: int,
                             columns: tuple[torch.Tensor, torch.Tensor] | None,
                             row_exponents: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        unused = torch.zeros(1, dtype=torch.int64, device=z.device)
        return self.launch_coefficients(z, m0, total, mean, s, unused.expand(z.shape[0]), finite, columns,
                                        row_exponents, True)


def token_entropy_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
                           need_hidden: bool = True, need_weight: bool = True, *,
                           target: TritonTarget) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Kernel ``token_entropy_backward``: the generic backward with :class:`TritonEntropySteps`
    (arguments and results as :func:`rlkernel.backends.generic.token_entropy.token_entropy_backward`)."""
    return _generic.backward_with(TritonEntropySteps(target), grad, hidden, weight, temperature, need_hidden,
                                  need_weight)


def static_specs(target: TritonTarget):
    """The rows kernel (forward; the backward's statistics) and the coefficient kernel's ENTROPY mode; the
    backward's logits, products and roundings are ``token_logprobs_backward``'s specialisations."""
    rows = {"y_ptr": "*fp32", "stride_y": "i64", "out_ptr": "*fp32", "m_ptr": "*fp32", "fin_ptr": "*i32",
            "total_ptr": "*fp32", "mean_ptr": "*fp32", "row0": "i32", "V": "i32", "tau_bits": "i32",
            "STATS": "constexpr", "BLOCK": "constexpr"}
    return [("token_entropy", "rows", _entropy_rows_kernel, rows, {"STATS": False, "BLOCK": ROW_TILE[0]},
             {"num_warps": ROW_TILE[1]}),
            ("token_entropy_backward", "row_stats", _entropy_rows_kernel, rows, {"STATS": True, "BLOCK": ROW_TILE[0]},
             {"num_warps": ROW_TILE[1]})] + [
        coefficients_spec("token_entropy_backward", cols, rows_, True) for cols, rows_ in
        ((True, True), (True, False), (False, False))]
