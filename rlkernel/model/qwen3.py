"""The Qwen3 dense architecture, composed from ``rlkernel.nn`` only (nano-vllm's ``models/qwen3.py``).

Parameter names mirror Hugging Face's (``model.layers.N.self_attn.o_proj.weight``), except the
fused projections ``qkv_proj`` (q/k/v) and ``gate_up_proj`` (gate/up), mapped by
:attr:`Qwen3ForCausalLM.packed_modules_mapping`.

One forward serves the trainer and the rollout engine; :class:`~rlkernel.nn.metadata.AttentionMetadata`
says which. Every step is a per-row or per-query contract op (or an fp32 residual addition), so
a token's hidden state has the same bits whatever else is in the batch, however its sequence
was chunked, whether its keys came from the batch or the paged cache, and at every
tensor-parallel degree.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import torch
from torch import nn

from rlkernel.model.config import Qwen3Config
from rlkernel.nn import (
    Attention,
    AttentionMetadata,
    KVCache,
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    SiluAndMul,
    VocabParallelEmbedding,
)
from rlkernel.nn.opset import EXACT, OpSet, OpsUser
from rlkernel.nn.parallel import divide, tp_rank_size

__all__ = ["Qwen3Attention", "Qwen3DecoderLayer", "Qwen3ForCausalLM", "Qwen3MLP", "Qwen3Model", "residual_add"]

Layer = tuple[torch.Tensor, torch.Tensor]


#: Devices whose torch adds bfloat16/float16 tensors in fp32 ("opmath") and rounds once to nearest
#: even: there ``residual + x`` is one kernel with the spelled-out computation's bits (tests check
#: every bit pattern class on the CPU and random patterns on CUDA); elsewhere it is spelled out.
_FP32_OPMATH_DEVICES = ("cpu", "cuda")


def residual_add(residual: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``RN_dtype(fp32(residual) + fp32(x))``: one IEEE fp32 addition, one round-to-nearest-even cast.

    The residual stream stays in the model dtype, as in Hugging Face (where ``residual + x`` on
    bfloat16 tensors is this computation). Elementwise, so batch and TP invariant. No op contract
    covers addition: on CPU and CUDA (and ROCm builds) torch's own half-precision add is this
    computation in one kernel (its opmath is fp32, its cast RNE, NaN canonical); on other devices
    it is spelled out as four steps (two exact upcasts, the fp32 add, the cast).
    """
    if residual.dtype == x.dtype and residual.device.type in _FP32_OPMATH_DEVICES:
        return residual + x
    return (residual.float() + x.float()).to(x.dtype)


class Qwen3Attention(nn.Module):
    """Fused qkv projection -> per-head q/k RMSNorm -> RoPE -> attention -> o_proj (row-parallel)."""

    def __init__(self, config: Qwen3Config, group: object = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        _, tp = tp_rank_size(group)
        d = config.head_dim
        self.num_heads = divide(config.num_attention_heads, tp, "num_attention_heads")
        self.num_kv_heads = divide(config.num_key_value_heads, tp, "num_key_value_heads")
        self.head_dim = d
        self.qkv_proj = QKVParallelLinear(config.hidden_size, d, config.num_attention_heads,
                                          config.num_key_value_heads, config.attention_bias, group, dtype, device)
        self.o_proj = RowParallelLinear(config.num_attention_heads * d, config.hidden_size, config.attention_bias,
                                        group, dtype, device)
        self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
        self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype, device)
        if tp > 1:  # each rank normalises its own heads: the gains' gradients add over the ranks
            self.q_norm.weight.grad_reduce_group = group  # type: ignore[attr-defined]
            self.k_norm.weight.grad_reduce_group = group  # type: ignore[attr-defined]
        self.rotary_emb = RotaryEmbedding(d, config.rope_theta, config.max_position_embeddings)
        self.attn = Attention(self.num_heads, self.num_kv_heads, d)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata,
                kv_cache: Layer | None) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        q_size, kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        q = qkv[:, :q_size].unflatten(-1, (self.num_heads, self.head_dim))
        k = qkv[:, q_size:q_size + kv_size].unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = qkv[:, q_size + kv_size:].unflatten(-1, (self.num_kv_heads, self.head_dim))
        q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        o = self.attn(q, k, v, meta, kv_cache)
        return self.o_proj(o.flatten(1))


class Qwen3MLP(nn.Module):
    """SwiGLU: fused gate/up (column-parallel) -> silu(gate) * up -> down (row-parallel)."""

    def __init__(self, config: Qwen3Config, group: object = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        i = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [i, i], False, group, dtype, device)
        self.act_fn = SiluAndMul()
        self.down_proj = RowParallelLinear(i, config.hidden_size, False, group, dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Qwen3DecoderLayer(nn.Module):
    """Pre-norm block: ``h += attn(norm(h))``, ``h += mlp(norm(h))`` (Hugging Face order)."""

    def __init__(self, config: Qwen3Config, group: object = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config, group, dtype, device)
        self.mlp = Qwen3MLP(config, group, dtype, device)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, meta: AttentionMetadata,
                kv_cache: Layer | None) -> torch.Tensor:
        hidden = residual_add(hidden, self.self_attn(positions, self.input_layernorm(hidden), meta, kv_cache))
        return residual_add(hidden, self.mlp(self.post_attention_layernorm(hidden)))


class Qwen3Model(nn.Module):
    """Embedding -> decoder layers -> final RMSNorm."""

    def __init__(self, config: Qwen3Config, group: object = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, group, dtype, device)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, group, dtype, device)
                                    for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: KVCache | None = None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            hidden = layer(positions, hidden, meta, None if kv_cache is None else kv_cache.layer(i))
        return self.norm(hidden)


class Qwen3ForCausalLM(OpsUser, nn.Module):
    """Qwen3 dense causal LM over the exact ops: hidden states, log-probs and sampling logits.

    Parameters
    ----------
    config : Qwen3Config
    group : ProcessGroup, optional
        Tensor-parallel group (heads, intermediate size and vocabulary are sharded over it;
        each must divide by its size); None = one process holds the whole model.
    dtype : torch.dtype
        bfloat16 (default) or float16 (the exact matmul's operand types).
    device : torch.device or str, optional
    ops : OpSet
        The functions every layer calls (:data:`~rlkernel.nn.opset.EXACT`, ``rlkernel.ops``, by
        default). Another set is for measurement only: the rollout engine's native baseline builds
        one with :meth:`with_ops` (``LLM(model, ops="native")``); a model whose set is not bitwise
        is refused by the trainer.

    Usage
    -----
    Trainer (packed whole sequences)::

        meta = AttentionMetadata.packed(seq_lens)
        hidden = model(input_ids, meta.positions(), meta)               # [T, H]
        logp = model.logprobs(hidden[rows], targets)                     # fp32

    Rollout engine (paged KV cache)::

        cache = model.allocate_kv_cache(num_blocks, block_size)
        meta = AttentionMetadata.prefill(prompt_lens, block_tables, block_size)   # whole prompts
        meta = AttentionMetadata.paged(query_lens, context_lens, block_tables, block_size)  # chunks, mixed
        meta = AttentionMetadata.decode(context_lens, block_tables, block_size)              # one token each
        hidden = model(input_ids, meta.positions(), meta, cache)
        last = hidden[meta.cu_seqlens_q[1:] - 1]                          # each sequence's last row
        next_tokens = rlkernel.ops.sample(model.compute_logits(last), ...)
        logp = model.logprobs(last, next_tokens)                          # = the trainer's bits
    """

    #: Hugging Face module name -> (this model's fused module, shard id), for the loader.
    packed_modules_mapping: ClassVar[dict[str, tuple[str, str | int]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: Qwen3Config, group: object = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, ops: OpSet = EXACT) -> None:
        super().__init__()
        if not isinstance(ops, OpSet):
            raise TypeError(f"Qwen3ForCausalLM: ops is a {type(ops).__name__}; expected an rlkernel.nn.opset.OpSet "
                            f"(EXACT, the default; rlkernel.rollout.native_ops.NATIVE for the rollout baseline)")
        self.config, self.group, self.dtype = config, group, dtype
        self.tp_rank, self.tp_size = tp_rank_size(group)
        if not ops.bitwise and self.tp_size > 1:
            raise ValueError(f"Qwen3ForCausalLM: the {ops.name!r} op set is a one-device baseline; tensor "
                             f"parallelism (tp_size = {self.tp_size}) runs the exact ops only")
        #: KV heads on this rank (the KV cache's head axis).
        self.num_kv_heads = divide(config.num_key_value_heads, self.tp_size, "num_key_value_heads")
        self.model = Qwen3Model(config, group, dtype, device)
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, group, dtype, device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        for module in self.modules():
            if isinstance(module, OpsUser):
                module.ops = ops

    def with_ops(self, ops: OpSet) -> Qwen3ForCausalLM:
        """This model's weights (shared, not copied) behind another op set: a second model object.

        Parameters
        ----------
        ops : OpSet
            E.g. :data:`rlkernel.rollout.native_ops.NATIVE`, torch's own ops: the rollout engine's
            baseline (``LLM(model, ops="native")``) builds its model this way.

        Returns
        -------
        Qwen3ForCausalLM, built on the meta device and given this model's parameter tensors
        (``load_state_dict(assign=True)``): no weight memory is added, and the two models read the
        same values. One device only (``tp_size == 1``).
        """
        twin = Qwen3ForCausalLM(self.config, self.group, self.dtype, device="meta", ops=ops)
        twin.load_state_dict(self.state_dict(), assign=True)
        return twin.train(self.training)

    @classmethod
    def from_pretrained(cls, path: str | Path, group: object = None, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str | None = None) -> Qwen3ForCausalLM:
        """Build from a Hugging Face checkpoint directory on disk (:func:`rlkernel.model.loader.load_checkpoint`)."""
        from rlkernel.model.loader import load_checkpoint

        return load_checkpoint(path, group, dtype, device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                kv_cache: KVCache | None = None, *, check: bool = True) -> torch.Tensor:
        """Final hidden states (after the last norm) of the batch's new tokens.

        Parameters
        ----------
        input_ids : Tensor, int64, [T]
            New tokens of every sequence, packed by ``meta.cu_seqlens_q``.
        positions : Tensor, int64, [T]
            Position of each token in its sequence (``meta.positions()``).
        meta : AttentionMetadata
            Packed or paged batch description.
        kv_cache : KVCache, optional
            Needed when ``meta`` writes (``slot_mapping``) or reads (paged) the cache.
        check : bool
            Validate the inputs, the metadata and the cache on the host first (default). An
            engine that builds its batches itself and must not synchronise (CUDA-graph capture)
            may pass False once its batches are known good; the ops still validate their own
            arguments.

        Returns
        -------
        Tensor, the model dtype, [T, hidden_size], identical on every TP rank.

        Raises
        ------
        ValueError
            Inconsistent shapes, metadata or cache (see :meth:`AttentionMetadata.validate`),
            positions outside ``[0, max_position_embeddings)``.
        """
        if check:
            self._check_inputs(input_ids, positions, meta, kv_cache)
        return self.model(input_ids, positions, meta, kv_cache)

    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """``log softmax(hidden @ lm_head.T / temperature)[targets]``: float32 ``[T]``, never full logits.

        ``hidden`` ``[T, H]`` rows of :meth:`forward` (each row predicts the token after it);
        ``targets`` int64 ``[T]``. Contract ``token_logprobs``: a row's result depends only on that
        row, so the rollout's and the trainer's log-probs of a token agree bit for bit.
        """
        return self.lm_head.logprobs(hidden, targets, temperature)

    def logprobs_of_logits(self, logits: torch.Tensor, targets: torch.Tensor,
                           temperature: float = 1.0) -> torch.Tensor:
        """:meth:`logprobs` of the rows whose :meth:`compute_logits` are given (float32 ``[B, V]``):
        the same bits without a second LM-head GEMM (see ``ParallelLMHead.logprobs_of_logits``)."""
        return self.lm_head.logprobs_of_logits(logits, targets, temperature)

    def entropy(self, hidden: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """Entropy of each row's next-token distribution: float32 ``[T]``, never full logits.

        ``hidden`` ``[T, H]`` rows of :meth:`forward`; ``p = softmax(hidden @ lm_head.T / temperature)``,
        ``H = -sum_v p_v log p_v`` (contract ``token_entropy`` v1, differentiable for an entropy
        bonus such as verl's ``entropy_coeff``). TP = 1 only (raises ``NotImplementedError`` otherwise).
        """
        return self.lm_head.entropy(hidden, temperature)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Whole-vocabulary float32 logits ``[B, V]`` of a few rows (the next-token rows, for ``sample``)."""
        return self.lm_head.logits(hidden)

    def allocate_kv_cache(self, num_blocks: int, block_size: int,
                          device: torch.device | str | None = None) -> KVCache:
        """A zero-filled paged cache for this model (this rank's KV heads), on the model's device by default."""
        c = self.config
        device = device if device is not None else self.lm_head.weight.device
        return KVCache.allocate(c.num_hidden_layers, num_blocks, block_size,
                                self.num_kv_heads, c.head_dim, self.dtype, device)

    def kv_cache_bytes_per_block(self, block_size: int) -> int:
        """Bytes of one cache block on this rank (all layers, K and V), to size the cache to a budget."""
        c = self.config
        return KVCache.bytes_per_block(c.num_hidden_layers, block_size,
                                       self.num_kv_heads, c.head_dim, self.dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load Hugging Face-named tensors (see :func:`rlkernel.model.loader.load_weights`)."""
        from rlkernel.model.loader import load_weights

        load_weights(self, weights)

    def _check_inputs(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                      kv_cache: KVCache | None) -> None:
        name = type(self).__name__
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or input_ids.dtype != torch.int64:
            got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, torch.Tensor) else input_ids
            raise ValueError(f"{name}: input_ids is {got}; expected an int64 tensor [T] of packed token ids")
        t = input_ids.shape[0]
        if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (t,) or \
                positions.dtype != torch.int64:
            got = f"{positions.dtype} {tuple(positions.shape)}" if isinstance(positions, torch.Tensor) else positions
            raise ValueError(f"{name}: positions is {got}; expected int64 [{t}] (meta.positions() gives them)")
        if t and int(positions.max()) >= self.config.max_position_embeddings:
            raise ValueError(f"{name}: a position is {int(positions.max())}; expected positions below "
                             f"max_position_embeddings = {self.config.max_position_embeddings}")
        meta.validate(t, kv_cache)
        if kv_cache is not None:
            c = self.config
            want = (c.num_hidden_layers, self.num_kv_heads, c.head_dim, self.dtype)
            have = (kv_cache.num_layers, kv_cache.k.shape[3], kv_cache.k.shape[4], kv_cache.k.dtype)
            if have != want:
                raise ValueError(f"{name}: kv_cache has (layers, kv heads, head_dim, dtype) = {have}; expected "
                                 f"{want} for this model and rank (use model.allocate_kv_cache)")
