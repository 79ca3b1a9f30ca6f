"""AdamW on Triton: one elementwise kernel (contract ``adamw`` v1).

Per element, in the contract's order, each step one IEEE fp32 operation rounded to nearest-even
(no contraction: ``LAUNCH``; divisions and the square root ``tl.math.div_rn`` / ``sqrt_rn``,
correctly rounded)::

    m' = RN(RN(b1 * m) + RN(c1 * g))
    v' = RN(RN(b2 * v) + RN(RN(c2 * g) * g))
    d  = RN(RN(sqrt_rn(v') / bc2_sqrt) + eps)
    p' = RN(RN(p * decay) - RN(step_size * RN(m' / d)))

with ``g`` the gradient widened exactly to fp32 and every NaN output the canonical NaN. The
eight scalars are the contract's fp32 host scalars (``rlkernel.ops.adamw``), passed as their
binary32 bits and never specialised (an int argument equal to 1 becomes a constexpr in Triton).
It replaces the device-generic torch code (one torch operation per line and an integer square
root of ~150 bytes of temporaries per element): on the H200 that step took 225 ms for the
~170 M parameters of a one-layer Qwen3-0.6B (docs/bench/h200-profile-train-c68e6cf.md), where
the bytes (28 per element) take ~1.2 ms at the copy bandwidth.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, cdiv, f32_bits

#: elements per program: 8 per thread on 4 warps
BLOCK = 1024

@triton.jit(do_not_specialize=["b1_bits", "c1_bits", "b2_bits", "c2_bits", "eps_bits", "decay_bits", "step_bits",
                               "bc2_bits"])
def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, p_out, m_out, v_out, n, b1_bits, c1_bits, b2_bits, c2_bits, eps_bits,
                  decay_bits, step_bits, bc2_bits, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask, other=0.0)
    g = E.upcast(tl.load(g_ptr + offs, mask=mask, other=0.0))
    m = tl.load(m_ptr + offs, mask=mask, other=0.0)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0)
    b1 = b1_bits.to(tl.float32, bitcast=True)
    c1 = c1_bits.to(tl.float32, bitcast=True)
    b2 = b2_bits.to(tl.float32, bitcast=True)
    c2 = c2_bits.to(tl.float32, bitcast=True)
    eps = eps_bits.to(tl.float32, bitcast=True)
    decay = decay_bits.to(tl.float32, bitcast=True)
    step = step_bits.to(tl.float32, bitcast=True)
    bc2 = bc2_bits.to(tl.float32, bitcast=True)
    m2 = b1 * m + c1 * g
    v2 = b2 * v + (c2 * g) * g
    d = tl.math.div_rn(tl.math.sqrt_rn(v2), bc2) + eps
    u = tl.math.div_rn(m2, d)
    p2 = p * decay - step * u
    tl.store(p_out + offs, tl.where(p2 == p2, p2, E.canonical_nan_f32(p2)), mask=mask)
    tl.store(m_out + offs, tl.where(m2 == m2, m2, E.canonical_nan_f32(m2)), mask=mask)
    tl.store(v_out + offs, tl.where(v2 == v2, v2, E.canonical_nan_f32(v2)), mask=mask)


def adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
          b1: float, c1: float, b2: float, c2: float, eps: float, decay: float, step_size: float,
          bc2_sqrt: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step: ``(param', exp_avg', exp_avg_sq')``.

    Parameters
    ----------
    param, exp_avg, exp_avg_sq : Tensor, float32, any shape, contiguous, on the GPU
    grad : Tensor, float32/bfloat16/float16, param's shape, contiguous
    b1, c1, b2, c2, eps, decay, step_size, bc2_sqrt : float
        Contract ``adamw``'s fp32 host scalars (each already an fp32 value).

    Returns
    -------
    (param', exp_avg', exp_avg_sq') : three new float32 tensors of param's shape
    """
    p_out, m_out, v_out = (torch.empty(param.shape, dtype=torch.float32, device=param.device) for _ in range(3))
    n = param.numel()
    if n:
        bits = [f32_bits(s) for s in (b1, c1, b2, c2, eps, decay, step_size, bc2_sqrt)]
        _adamw_kernel[(cdiv(n, BLOCK),)](param, grad, exp_avg, exp_avg_sq, p_out, m_out, v_out, n, *bits,
                                         BLOCK=BLOCK, num_warps=4, **LAUNCH)
    return p_out, m_out, v_out


def static_specs(target):
    scalars = {f"{s}_bits": "i32" for s in ("b1", "c1", "b2", "c2", "eps", "decay", "step", "bc2")}
    return [("adamw", f"grad_{dt}", _adamw_kernel,
             {"p_ptr": "*fp32", "g_ptr": f"*{dt}", "m_ptr": "*fp32", "v_ptr": "*fp32", "p_out": "*fp32",
              "m_out": "*fp32", "v_out": "*fp32", "n": "i64", **scalars, "BLOCK": "constexpr"}, {"BLOCK": BLOCK})
            for dt in ("fp32", "bf16", "fp16")]
