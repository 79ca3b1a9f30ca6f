"""``token_logprobs_backward`` with its matrix products on the int8 Triton GEMM of ``linear``.

Contract ``token_logprobs_backward`` v1. The passes, the chunking and every elementwise step
(softmax coefficients, the exact complement on the target, the two-word d_hidden sum, the one
rounding of each output) are the device-generic implementation's
(``backends/generic/token_logprobs_backward.py``); only its three kinds of matrix product run
here instead of as fp32 digit GEMMs in torch:

* the logits recomputed per token chunk: ``linear``'s fp32 epilogue (:func:`.linear.logits`,
  the same contract ``linear`` v2 product rounded once), then the same IEEE division by tau;
* ``d_hidden``'s ``c @ W`` over vocabulary chunks and ``d_weight``'s ``c.T @ h``: the exact int64
  ``C`` of ``linear``'s GEMM kernel (:func:`.linear.partial_from_planes`). The fp32 coefficient
  rows go on their 28-bit grids as four balanced base-128 digits made by the generic digit
  helper (exact for 24-bit significands; ``linear``'s digit kernel rounds bf16/fp16 grids
  only), cast to int8 (every digit lies in [-64, 64]); the other operand (W.T or h.T, bf16/fp16,
  strided views) gets its three digits from ``linear``'s digit kernel on the given exponents;
* the one rounding of d_weight's exact sums, ``RN32(C 2**(ec + eh - 47))`` over ``V x H``
  elements: ``linear``'s finish kernel (:func:`.linear.linear_finish`; the grids are ``linear``'s,
  28 + 21 bits, and so is the sentinel). In torch int64 operations it was ~80 % of the bytes the
  generic elementwise passes moved at T = 128, V = 151 936, H = 1024 (235 of 302 GB counted by
  ``tools/tlb_bytes.py``).

Every product is exact or rounded once by contract, so the bits are those of the generic
backward (the conformance suite checks both against the golden hashes). The profile that asked
for it (H200, a9c3e31): the generic backward of 128 tokens x 151 936 vocabulary took 581 ms of
device time, fp32 FFMA GEMMs and their int64 combines.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlkernel.backends.generic import token_logprobs_backward as _generic
from rlkernel.backends.generic.linear import _digits_f32

from . import linear as L
from .targets import TritonTarget


class TritonProducts(_generic.Products):
    """The generic backward's products on ``linear``'s int8 Triton kernels for one target."""

    def __init__(self, target: TritonTarget) -> None:
        self.target = target

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor, vc: int,
               tau: torch.Tensor | None) -> Iterator[tuple[int, int, torch.Tensor]]:
        ew = L.weight_exponents(weight)
        for v0 in range(0, weight.shape[0], vc):
            v1 = min(v0 + vc, weight.shape[0])
            z = L.logits(hidden, weight[v0:v1], ew[v0:v1], target=self.target)
            yield v0, v1, z if tau is None else z / tau  # one IEEE division, as the generic _divide

    def exact(self, x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
            return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
        planes = _digits_f32(x, ex, _generic.C_BITS, _generic.C_DIGITS).to(torch.int8)
        return L.partial_from_planes(planes, ex, w, ew, target=self.target)

    def finish(self, acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        # C_BITS + O_BITS == X_BITS + W_BITS (47) and the same sentinel: linear_finish's kernel is this rounding
        return L.linear_finish(acc, ex, ew, None, torch.float32)


def token_logprobs_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            temperature: float = 1.0, need_hidden: bool = True, need_weight: bool = True, *,
                            target: TritonTarget) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Kernel ``token_logprobs_backward``: the generic backward with :class:`TritonProducts`
    (arguments and results as :func:`rlkernel.backends.generic.token_logprobs_backward.token_logprobs_backward`)."""
    return _generic.backward_with(TritonProducts(target), grad, hidden, weight, targets, temperature, need_hidden,
                                  need_weight)


def token_logprobs_backward_partial(grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor,
                                    targets: torch.Tensor, vocab_start: int, row_max: torch.Tensor,
                                    sum_int: torch.Tensor, temperature: float = 1.0,
                                    exponents: tuple[torch.Tensor, torch.Tensor] | None = None,
                                    need_weight: bool = True, *,
                                    target: TritonTarget) -> tuple[torch.Tensor | None, ...]:
    """Kernel ``token_logprobs_backward_partial``: one vocabulary shard's part, with :class:`TritonProducts`
    (as :func:`rlkernel.backends.generic.token_logprobs_backward.token_logprobs_backward_partial`)."""
    return _generic.partial_with(TritonProducts(target), grad, hidden, weight_shard, targets, vocab_start, row_max,
                                 sum_int, temperature, exponents, need_weight)


def static_specs(target: TritonTarget):
    """The ``linear`` kernel specialisations this op launches beyond those ``linear`` lists: the
    weight's row exponents alone, the digit planes of W.T / h.T on given exponents, the exact
    int64 products on both paths (T <= 64 rows: decode tiles reading the bf16 operand; more:
    prefill tiles on int8 planes, K split with int64 atomics when the tiles are few), and the
    finish kernel rounding d_weight to fp32 without a bias."""
    prefill, decode = L.gemm_tiles(target)
    return [
        L.digits_spec("token_logprobs_backward", "bf16_weight_exponents", "bf16", has_e=False, write=False, bits=20),
        L.digits_spec("token_logprobs_backward", "bf16_transposed_digits_given_exponents", "bf16", has_e=True,
                      write=True, bits=20),
        L.gemm_spec("token_logprobs_backward", "decode_int64_partial", "*bf16", "*i64", decode, w_digits=False,
                    finish=False),
        L.gemm_spec("token_logprobs_backward", "prefill_int64_partial", "*i8", "*i64", prefill, w_digits=True,
                    finish=False),
        L.gemm_spec("token_logprobs_backward", "prefill_split_k_int64_atomic", "*i8", "*i64", prefill,
                    w_digits=True, finish=False, atomic=True),
        L.finish_spec("token_logprobs_backward", "d_weight_finish_fp32_out", "*fp32", bias=False, out=0),
    ]
