"""``rlkernel.model``: the Qwen3 dense family on the exact ops, with Hugging Face checkpoints.

- :class:`Qwen3Config` (:mod:`rlkernel.model.config`): the architecture's sizes, from config.json.
- :class:`Qwen3ForCausalLM` (:mod:`rlkernel.model.qwen3`): one forward for the trainer (packed
  whole sequences) and the rollout engine (prefill, chunked prefill and decode over a paged KV
  cache), described by :class:`~rlkernel.nn.AttentionMetadata`; log-probs and sampling logits.
- :mod:`rlkernel.model.loader`: :func:`load_checkpoint` / :func:`save_checkpoint` of a checkpoint
  directory (config.json + safetensors, sharded or not), tensor-parallel aware.
"""

from __future__ import annotations

from rlkernel.model.config import Qwen3Config
from rlkernel.model.loader import load_checkpoint, load_weights, save_checkpoint, state_dict_hf
from rlkernel.model.qwen3 import Qwen3ForCausalLM
from rlkernel.nn.kv_cache import KVCache
from rlkernel.nn.metadata import AttentionMetadata

__all__ = ["AttentionMetadata", "KVCache", "Qwen3Config", "Qwen3ForCausalLM", "load_checkpoint", "load_weights",
           "save_checkpoint", "state_dict_hf"]
