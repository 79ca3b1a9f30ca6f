"""``rlkernel.rl``: the trainer's side of RL post-training, with bits that do not depend on batching.

- :mod:`rlkernel.rl.losses`: PPO/GRPO losses and exact micro-batch/rank accumulation (verl's
  names: :func:`group_advantages`, :func:`ppo_loss`, :func:`kl_k3`, :func:`masked_mean`,
  :class:`ExactMean`, ...). Everything it exports is re-exported here, so
  ``from rlkernel.rl import ppo_loss`` and ``from rlkernel import rl; rl.ExactMean()`` work.
- :mod:`rlkernel.rl.optim`: :class:`AdamW` and :class:`SGD` (contracts ``adamw``/``sgd`` on fp32 master weights) and
  :func:`clip_grad_norm_` with an exact global norm: the same new weights on every backend.
- :mod:`rlkernel.rl.logprobs`: the trainer's forward, :func:`packed_logprobs` of packed
  variable-length sequences, micro-batched, bitwise equal to the rollout engine's log-probs.
"""

from __future__ import annotations

from rlkernel.rl.logprobs import micro_batches, packed_logprobs
from rlkernel.rl.losses import (
    MODES,
    PARTIAL_SLOTS,
    ExactMean,
    all_reduce_partial,
    count,
    finish_partials,
    group_advantages,
    kl_k3,
    masked_mean,
    masked_mean_partial,
    merge_partials,
    partial_count,
    ppo_loss,
    ppo_loss_partial,
)
from rlkernel.rl.optim import SGD, AdamW, clip_grad_norm_, grad_norm

__all__ = [
    "MODES",
    "AdamW",
    "PARTIAL_SLOTS",
    "SGD",
    "ExactMean",
    "all_reduce_partial",
    "clip_grad_norm_",
    "count",
    "finish_partials",
    "grad_norm",
    "group_advantages",
    "kl_k3",
    "masked_mean",
    "masked_mean_partial",
    "merge_partials",
    "micro_batches",
    "packed_logprobs",
    "partial_count",
    "ppo_loss",
    "ppo_loss_partial",
]
