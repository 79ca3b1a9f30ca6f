"""``rlkernel.validate``: check that the trainer's token log-probs equal the rollout's, bit for bit.

- :mod:`rlkernel.validate.record`: a recorded rollout (prompts, completions, log-probs, sampling
  parameters and seeds, model and config SHA-256) in one safetensors file; :func:`save_record`,
  :func:`load_record`.
- :mod:`rlkernel.validate.replay`: :func:`replay` a record through the trainer forward
  (:func:`rlkernel.rl.packed_logprobs`) in another batching; bitwise mismatches and ``|ratio - 1|``.
- :mod:`rlkernel.validate.layers`: :func:`compare_layers`, the rollout path (paged prefill and
  decode) against the trainer path (packed forward) per layer and op; names the first that differs.
- :mod:`rlkernel.validate.baseline`: the same through transformers' Qwen3 (generate with KV cache,
  full-sequence forward), side by side.
- :mod:`rlkernel.validate.models`: named random configurations and the weight/config hashes.
- :mod:`rlkernel.validate.run` and :mod:`rlkernel.validate.report`: the ``rlkernel validate`` run
  and its JSON/Markdown reports (docs/validate.md).

Submodules import what they need lazily where it is optional (the rollout engine, transformers).
"""

from __future__ import annotations

from rlkernel.validate.layers import LayerReport, OpDiff, compare_layers
from rlkernel.validate.models import CONFIGS, build_model, config_sha256, model_sha256, random_model
from rlkernel.validate.record import HashMismatch, Record, Sample, load_record, save_record
from rlkernel.validate.replay import ReplayResult, ratio_stats, replay, trainer_logprobs

__all__ = ["CONFIGS", "HashMismatch", "LayerReport", "OpDiff", "Record", "ReplayResult", "Sample", "build_model",
           "compare_layers", "config_sha256", "load_record", "model_sha256", "random_model", "ratio_stats",
           "replay", "save_record", "trainer_logprobs"]
