"""Ops the CUDA backend serves with exact device code in torch tensor operations, not Triton.

``sgd`` and the backwards (``token_logprobs_backward_finish``, ``rope_backward``; their digit products are exact
GEMMs combined in int64; fused Triton kernels come with the performance work) run on the GPU as the device-generic
implementations (R1 elementwise fp32, the contract ``exp_c``, exact integer sums and digit
products): every
operation they use is exact, or one IEEE rounding, on any IEEE device, so they give the
contract's bits on CUDA as on the CPU. They are listed in ``KERNELS`` under this module, so the
kernel that ran reads ``cuda:torch_exact.<op>`` (``rlkernel.dispatch.trace``), never a Triton
name. They are memory-bound and launch-bound (many small torch kernels per call); fused Triton
kernels are the next step for speed (see docs/cuda-backend.md).
"""

from __future__ import annotations

from rlkernel.backends.generic.optim import sgd
from rlkernel.backends.generic.rl_backward import kl_k3_backward, masked_mean_backward
from rlkernel.backends.generic.rope_backward import rope_backward
from rlkernel.backends.generic.token_logprobs_backward import token_logprobs_backward_finish

__all__ = ["kl_k3_backward", "masked_mean_backward",
           "rope_backward", "sgd", "token_logprobs_backward_finish"]
