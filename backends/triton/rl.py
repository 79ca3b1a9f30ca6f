"""RL ops on Triton: ``kl_k3`` (contract ``kl_k3`` v1). ``group_advantages``, ``ppo_loss`` and
``masked_mean`` (exact superaccumulator reductions, P10) have no Triton kernel yet; the backend
serves them with exact torch device code (``torch_exact.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH

BLOCK = 1024


@triton.jit
def _kl_k3_fwd_kernel(lp_ptr, ref_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    lp = tl.load(lp_ptr + offs, mask=mask, other=0.0)
    ref = tl.load(ref_ptr + offs, mask=mask, other=0.0)
    d = ref - lp
    tl.store(y_ptr + offs, E.nan_to_canonical((E.exp_c(d) - d) - 1.0), mask=mask)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Kernel ``kl_k3``: ``(exp_c(d) - d) - 1``, ``d = ref_logp - logp``; fp32 [*] elementwise."""
    lp = logp.to(torch.float32).contiguous()
    ref = ref_logp.to(torch.float32).contiguous()
    out = torch.empty(lp.shape, dtype=torch.float32, device=lp.device)
    n = lp.numel()
    if n:
        _kl_k3_fwd_kernel[(triton.cdiv(n, BLOCK),)](lp, ref, out, n, BLOCK=BLOCK, num_warps=4, **LAUNCH)
    return out


def static_specs(target):
    return [("kl_k3", "fp32", _kl_k3_fwd_kernel,
             {"lp_ptr": "*fp32", "ref_ptr": "*fp32", "y_ptr": "*fp32", "n": "i64", "BLOCK": "constexpr"},
             {"BLOCK": BLOCK})]
