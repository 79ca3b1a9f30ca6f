"""``rlkernel.nn``: thin ``torch.nn`` modules over the exact ops, including the tensor-parallel layers.

One file per layer, as in nano-vllm's ``layers/``: each module holds its parameters and calls
``rlkernel.ops`` (dispatched by the tensors' device) or ``rlkernel.distributed``; nothing on
the forward path uses a torch matmul, softmax or norm. The ops are reached through ``self.ops``,
an :class:`~rlkernel.nn.opset.OpSet`: ``rlkernel.ops`` always, except in the model twin of the
rollout engine's measurement baseline (``LLM(model, ops="native")``, not bitwise). Parameters carry a ``weight_loader``
(and a ``weight_gatherer`` for saving) so Hugging Face checkpoints load shard by shard.

=====================================  ============================================================
module                                 contents
=====================================  ============================================================
:mod:`rlkernel.nn.linear`              Linear, ColumnParallelLinear, MergedColumnParallelLinear,
                                       QKVParallelLinear, RowParallelLinear
:mod:`rlkernel.nn.embed_head`          VocabParallelEmbedding, ParallelLMHead (log-probs, logits)
:mod:`rlkernel.nn.layernorm`           RMSNorm
:mod:`rlkernel.nn.rotary_embedding`    RotaryEmbedding
:mod:`rlkernel.nn.activation`          SiluAndMul
:mod:`rlkernel.nn.attention`           Attention (packed or paged), write_kv
:mod:`rlkernel.nn.metadata`            AttentionMetadata: the batch description of one forward
:mod:`rlkernel.nn.kv_cache`            KVCache: per-layer paged K/V tensors
:mod:`rlkernel.nn.parallel`            TP group facts and exact float-carrying collectives
:mod:`rlkernel.nn.opset`               OpSet: the functions the layers call (EXACT = rlkernel.ops)
=====================================  ============================================================
"""

from __future__ import annotations

from rlkernel.nn.activation import SiluAndMul
from rlkernel.nn.attention import Attention, write_kv
from rlkernel.nn.embed_head import ParallelLMHead, VocabParallelEmbedding
from rlkernel.nn.kv_cache import KVCache
from rlkernel.nn.layernorm import RMSNorm
from rlkernel.nn.linear import (
    ColumnParallelLinear,
    Linear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from rlkernel.nn.metadata import AttentionMetadata
from rlkernel.nn.rotary_embedding import RotaryEmbedding

__all__ = [
    "Attention", "AttentionMetadata", "ColumnParallelLinear", "KVCache", "Linear", "MergedColumnParallelLinear",
    "ParallelLMHead", "QKVParallelLinear", "RMSNorm", "RotaryEmbedding", "RowParallelLinear", "SiluAndMul",
    "VocabParallelEmbedding", "write_kv",
]
