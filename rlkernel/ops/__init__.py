"""Public functional ops: validate the inputs, dispatch by device, run the backend kernel.

Every op has the same name in every layer: ``contracts/<op>.py`` defines it bitwise,
``backends/<vendor>/<op>.py`` implements it, and ``rlkernel.ops.<op>`` is what users call.
The functions are bound eagerly: a submodule named like its op (``rlkernel.ops.rms_norm``)
would otherwise shadow the function once imported.
"""

from __future__ import annotations

from rlkernel.ops.adamw import adamw
from rlkernel.ops.all_reduce import all_reduce
from rlkernel.ops.attention import attention, attention_backward, attention_paged
from rlkernel.ops.embedding import embedding
from rlkernel.ops.exact_sum import (
    exact_sum_accumulate,
    exact_sum_finish,
    exact_sum_merge,
    exact_sum_partial,
    exact_sum_total,
)
from rlkernel.ops.group_advantages import group_advantages
from rlkernel.ops.kl_k3 import kl_k3, kl_k3_backward
from rlkernel.ops.linear import linear, linear_exponents, linear_finish, linear_partial, linear_weight_digits
from rlkernel.ops.masked_mean import masked_mean, masked_mean_backward
from rlkernel.ops.ppo_loss import ppo_loss
from rlkernel.ops.rms_norm import rms_norm, rms_norm_backward
from rlkernel.ops.rope import rope, rope_backward, rope_table_rows, rope_tables
from rlkernel.ops.sample import sample
from rlkernel.ops.sgd import sgd
from rlkernel.ops.silu_mul import silu_mul, silu_mul_backward
from rlkernel.ops.softmax import log_softmax, softmax
from rlkernel.ops.token_entropy import token_entropy, token_entropy_backward
from rlkernel.ops.token_logprobs import (
    token_logprobs,
    token_logprobs_backward,
    token_logprobs_backward_finish,
    token_logprobs_backward_partial,
    token_logprobs_finish,
    token_logprobs_partial,
)

__all__ = [
    "adamw", "all_reduce", "attention", "attention_backward", "attention_paged", "embedding", "exact_sum_accumulate",
    "exact_sum_finish", "exact_sum_merge", "exact_sum_partial", "exact_sum_total", "group_advantages", "kl_k3",
    "kl_k3_backward", "linear", "linear_exponents", "linear_finish", "linear_partial", "linear_weight_digits",
    "log_softmax", "masked_mean", "masked_mean_backward",
    "ppo_loss", "rms_norm", "rms_norm_backward", "rope", "rope_backward", "rope_table_rows", "rope_tables", "sample",
    "sgd", "silu_mul", "silu_mul_backward", "softmax", "token_entropy", "token_entropy_backward", "token_logprobs",
    "token_logprobs_backward", "token_logprobs_backward_finish", "token_logprobs_backward_partial",
    "token_logprobs_finish", "token_logprobs_partial",
]
