"""Shared Triton kernel sources of the GPU backends: one kernel source, per-target configuration.

Not a backend of its own: ``rlkernel.backends.cuda`` (NVIDIA) and ``rlkernel.backends.rocm``
(AMD Instinct) are :class:`TritonBackend` subclasses that run these kernels with their own
:class:`~rlkernel.backends.triton.targets.TritonTarget` (tile sizes, warps, stages, compiler
target). A kernel function that takes ``target`` gets the backend's target bound by
:meth:`TritonBackend.kernel`; the kernel that ran is reported under the backend's name
(``rocm:linear.linear``), never under another backend's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from rlkernel.backend import Backend

from .targets import TritonTarget

#: op -> "module:function" in this package. An op without a kernel here is absent: dispatch then
#: raises an error naming the backends that have it (never a silent fallback). Ops under
#: ``torch_exact`` are exact device code in torch operations rather than Triton kernels.
KERNELS: dict[str, str] = {
    "all_reduce": "all_reduce:all_reduce",
    "attention": "attention:attention",
    "attention_paged": "attention_paged:attention_paged",
    "attention_backward": "attention_backward:attention_backward",
    "embedding": "embedding:embedding",
    "kl_k3": "rl:kl_k3",
    "linear": "linear:linear",
    "linear_exponents": "linear:linear_exponents",
    "linear_weight_digits": "linear:linear_weight_digits",
    "linear_partial": "linear:linear_partial",
    "linear_finish": "linear:linear_finish",
    "rms_norm": "rms_norm:rms_norm",
    "rope": "rope:rope",
    "silu_mul": "silu_mul:silu_mul",
    "token_logprobs": "token_logprobs:token_logprobs",
    "token_logprobs_partial": "token_logprobs:token_logprobs_partial",
    "token_logprobs_finish": "token_logprobs:token_logprobs_finish",
    "token_logprobs_backward": "token_logprobs_backward:token_logprobs_backward",
    "token_logprobs_backward_partial": "token_logprobs_backward:token_logprobs_backward_partial",
    "token_logprobs_backward_finish": "torch_exact:token_logprobs_backward_finish",
    "softmax": "softmax:softmax",
    "log_softmax": "softmax:log_softmax",
    "sample": "sample:sample",
    "group_advantages": "rl:group_advantages",
    "ppo_loss": "rl:ppo_loss",
    "masked_mean": "rl:masked_mean",
    "adamw": "optim:adamw",
    "sgd": "torch_exact:sgd",
    "exact_sum_partial": "exact_sum:exact_sum_partial",
    "exact_sum_merge": "exact_sum:exact_sum_merge",
    "exact_sum_finish": "exact_sum:exact_sum_finish",
    "exact_sum_accumulate": "exact_sum:exact_sum_accumulate",
    "exact_sum_total": "exact_sum:exact_sum_total",
    "rms_norm_backward": "rms_norm:rms_norm_backward",
    "rope_backward": "torch_exact:rope_backward",
    "silu_mul_backward": "silu_mul:silu_mul_backward",
    "kl_k3_backward": "rl:kl_k3_backward",
    "masked_mean_backward": "rl:masked_mean_backward",
    "token_entropy": "token_entropy:token_entropy",
    "token_entropy_backward": "token_entropy:token_entropy_backward",
}


class TritonBackend(Backend):
    """A backend running the shared Triton kernels with one target's configuration."""

    package = "rlkernel.backends.triton"
    kernels = KERNELS
    #: the launch configuration and compiler target of this backend (set by each subclass)
    target: ClassVar[TritonTarget]

    def kernel(self, op: str) -> Callable[..., Any]:
        """The kernel for ``op``, with this backend's target bound where the launcher takes one."""
        fn = self._cache.get(op)
        if fn is not None:
            return fn
        fn = super().kernel(op)
        if "target" in inspect.signature(fn).parameters:
            fn = functools.partial(fn, target=self.target)
            self._cache[op] = fn
        return fn
