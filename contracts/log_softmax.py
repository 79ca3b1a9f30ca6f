"""Log-softmax over the last axis: ``d - log_c(L)`` with the exact probability sum of softmax.

Every step up to the sum ``L`` is the one of :mod:`rlkernel.contracts.softmax` (the same
bits of ``d``, ``p`` and ``L``); the output subtracts the contract logarithm of ``L``.
"""

from __future__ import annotations

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import round_to
from rlkernel.contracts._exact.transcendental import log_c
from rlkernel.contracts.softmax import (
    EXP_PARAMETERS,
    SUM_PARAMETERS,
    make_adversarial_cases,
    make_bench_cases,
    make_golden_cases,
    make_invariance_cases,
    out_dtype,
    row_terms,
)

#: log_c (P6, contracts/_exact/transcendental.py) as log_softmax uses it, on L in [1, N]: its
#: special rules (zero, negative, infinite, NaN and subnormal arguments) never change a bit
#: here (L is NaN or at least 1), and SQRT_HALF one ulp up only moves arguments below 1.
LOG_PARAMETERS = {
    "ln2_hi": "LN2_HI = 0x3F317200 (ln 2 to 15 bits): exp_c's r1 = x - k * LN2_HI and log_c's hi = e * LN2_HI, "
              "both exact",
    "ln2_lo": "LN2_LO = 0x35BFBE8E: exp_c's k * LN2_LO and log_c's lo = e * LN2_LO",
    "log_sqrt_half": "SQRT_HALF = 0x3F3504F3: x = m * 2**e with m in [SQRT_HALF, 2 * SQRT_HALF)",
    "log_r0": "R0 = 0x3EAAAAAA, coefficient of the degree-7 polynomial for (log1p(f) - f + f**2/2) / f**3",
    "log_r1": "R1 = 0xBE800113",
    "log_r2": "R2 = 0x3E4CD003",
    "log_r3": "R3 = 0xBE2A3924",
    "log_r4": "R4 = 0x3E116D09",
    "log_r5": "R5 = 0xBE06C2A2",
    "log_r6": "R6 = 0x3E02ADB5",
    "log_r7": "R7 = 0xBD9C5ABE",
    "log_f_head_bits": "f**2/2 split exactly through fh = f truncated to 12 significant bits",
}

CONTRACT = Contract(
    name="log_softmax",
    version=1,
    summary="y = RN_out(d - log_c(L)), d = x - max x, L = fixed_sum(exp_c(d); E = 0, F = 40), last axis",
    invariances=("batch", "permutation", "reduction_order", "repeat"),
    dtypes={"x": (torch.float32, torch.bfloat16, torch.float16)},
    parameters={
        **SUM_PARAMETERS,
        **EXP_PARAMETERS,
        **LOG_PARAMETERS,
        "max_zero_sign": "a zero row max is +0 (R5), so a -0 logit gives d = -0 and y = -0 where L = 1",
        "output_rounding": "fp32 -> bf16/fp16 output rounded to nearest, ties to even (overflow to inf)",
    },
)


def reference(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Log-softmax over the last axis (the definition of ``log_softmax``'s bits).

    ``y = RN_out(d - log_c(L))``, ``d = fp32(x) - max x``, ``L = fixed_sum(exp_c(d))`` (E = 0, F = 40).

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, [*, N]
        Logits. N may be 0 (empty output); N <= 2**22.
    dtype : torch.dtype, optional
        Output dtype: x's dtype (default, as ``torch.log_softmax``) or float32.

    Returns
    -------
    Tensor, ``dtype`` or x's dtype, [*, N]

    Bitwise semantics
    -----------------
    Per row, every fp32 operation one IEEE round-to-nearest-even rounding, no FMA:

    1. ``xf = fp32(x)``; ``m = max(xf)`` (P7: NaN propagates, a zero max is +0).
    2. ``d_i = RN32(xf_i - m)``; ``p_i = exp_c(d_i)`` (P6).
    3. ``L = fixed_sum(p)`` on the absolute grid ``2**-40`` (P4, E = 0, F = 40); L in [1, N]:
       independent of the order, split or tiling of the reduced axis.
    4. ``y_i = RN_out(RN32(d_i - log_c(L)))`` (contract logarithm, P6; one more rounding for
       bf16/fp16 output); NaN canonical.

    Special values: a row holding NaN or +inf is all NaN; a row of only ``-inf`` is all NaN
    (as in PyTorch); ``-inf`` entries of any other row give ``-inf``. N = 1: ``y = +0`` for
    finite x (``log_c(1) = +0``).

    Invariances: batch, permutation, reduction_order (permuting the last axis permutes y the
    same way), repeat.

    Contract ``log_softmax`` version 1.
    """
    odt = out_dtype(x, dtype)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=odt)
    d, _, big_l = row_terms(x, "log_softmax")
    return round_to(d - log_c(big_l), odt)


def golden_cases() -> list[Case]:
    """The softmax golden inputs, run through log_softmax."""
    return make_golden_cases("log_softmax")


def adversarial_cases() -> list[Case]:
    return make_adversarial_cases("log_softmax")


def invariance_cases() -> list[InvarianceCase]:
    return make_invariance_cases("log_softmax")


def _native(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.log_softmax(x, dim=-1, dtype=dtype)


def bench_cases() -> list[BenchCase]:
    """Qwen3 vocabulary rows, fp32: T in 1, 64, 256, 2048."""
    return make_bench_cases("log_softmax", _native)
