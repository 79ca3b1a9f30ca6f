"""``rlkernel.train``: the RL loop, rollout and update together (torchtitan's ``train.py`` role).

- :mod:`rlkernel.train.grpo`: :class:`GRPOTrainer` (rollout with :class:`rlkernel.rollout.LLM`,
  update with exact gradients and :class:`rlkernel.rl.AdamW`), :class:`GRPOConfig`,
  :class:`StepMetrics`, :func:`weights_sha256`.
- :mod:`rlkernel.train.tasks`: :class:`ReverseDigits`, a verifiable task that needs no download,
  :func:`init_weights_` (the same initial bits on every machine) and :func:`task_config`.

It sits above both :mod:`rlkernel.rollout` and :mod:`rlkernel.rl`, which do not import each other.
"""

from __future__ import annotations

from rlkernel.train.grpo import GRPOConfig, GRPOTrainer, RolloutBatch, StepMetrics, completion_logprobs, weights_sha256
from rlkernel.train.tasks import ReverseDigits, init_weights_, task_config

__all__ = ["GRPOConfig", "GRPOTrainer", "ReverseDigits", "RolloutBatch", "StepMetrics", "completion_logprobs",
           "init_weights_", "task_config", "weights_sha256"]
