"""Ops the CUDA backend serves with exact device code in torch tensor operations, not Triton.

``attention_backward``, ``sample``, ``group_advantages``, ``ppo_loss``, ``masked_mean``, ``adamw``, ``sgd`` and
the ``exact_sum`` ops run on the GPU as the device-generic implementations (exact digit GEMMs on the fp32 matmul
for ``attention_backward``, integer ranking and Philox for ``sample``, the P10 exact superaccumulator for the RL
reductions, R1 elementwise fp32 and the contract ``exp_c``): every
operation they use is exact, or one IEEE rounding, on any IEEE device, so they give the
contract's bits on CUDA as on the CPU. They are listed in ``KERNELS`` under this module, so the
kernel that ran reads ``cuda:torch_exact.<op>`` (``rlkernel.dispatch.trace``), never a Triton
name. They are memory-bound and launch-bound (many small torch kernels per call); fused Triton
kernels are the next step for speed (see docs/cuda-backend.md).
"""

from __future__ import annotations

from rlkernel.backends.generic.attention_backward import attention_backward
from rlkernel.backends.generic.exact_sum import exact_sum_finish, exact_sum_merge, exact_sum_partial
from rlkernel.backends.generic.optim import adamw, sgd
from rlkernel.backends.generic.rl import group_advantages, masked_mean, ppo_loss
from rlkernel.backends.generic.sample import sample

__all__ = ["adamw", "attention_backward", "exact_sum_finish", "exact_sum_merge", "exact_sum_partial",
           "group_advantages", "masked_mean", "ppo_loss", "sample", "sgd"]
