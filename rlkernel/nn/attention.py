"""Causal grouped-query attention over packed sequences or a paged KV cache."""

from __future__ import annotations

import torch
from torch import nn

from rlkernel.nn.metadata import AttentionMetadata
from rlkernel.nn.opset import OpsUser

__all__ = ["Attention", "write_kv"]


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Copy each new token's key and value into its cache slot (in place).

    Parameters
    ----------
    k_cache, v_cache : Tensor, [num_blocks, block_size, Hkv, D], contiguous
    k, v : Tensor, the cache's dtype, [T, Hkv, D], any strides
    slot_mapping : Tensor, int64, [T]
        Distinct slots in ``[0, num_blocks * block_size)`` (checked by
        :meth:`AttentionMetadata.validate`).

    Bitwise semantics
    -----------------
    A copy: the cached bits are the new keys' bits.
    """
    hkv, d = k_cache.shape[-2], k_cache.shape[-1]
    slots = slot_mapping.to(device=k_cache.device, dtype=torch.int64)
    k_cache.view(-1, hkv, d).index_copy_(0, slots, k)
    v_cache.view(-1, hkv, d).index_copy_(0, slots, v)


class Attention(OpsUser, nn.Module):
    """``softmax(q k^T * scale + causal mask) v`` per sequence, the same bits in every batch mode.

    Parameters
    ----------
    num_heads : int
        Query heads on this rank (Hq).
    num_kv_heads : int
        Key/value heads on this rank (Hkv, dividing Hq: query head h reads KV head
        ``h // (Hq / Hkv)``).
    head_dim : int
        D.
    scale : float, optional
        Score scale, rounded once to fp32; default the correctly rounded ``RN32(1/sqrt(D))``.

    Forward
    -------
    ``(q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D], meta, kv_cache=None) -> [T, Hq, D]`` (q's
    dtype). ``kv_cache`` is this layer's ``(k_cache, v_cache)``, each ``[num_blocks,
    block_size, Hkv, D]``. If ``meta.slot_mapping`` is set, k and v are first written to their
    slots; then packed mode runs ``rlkernel.ops.attention`` over the batch's own keys (each
    segment a whole sequence) and paged mode runs ``rlkernel.ops.attention_paged`` over the
    cache. Contract ``attention``: a query's output depends only on its row and the keys it
    may see, never on the batch, the chunking or the cache layout.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float | None = None) -> None:
        super().__init__()
        if num_kv_heads < 1 or num_heads % num_kv_heads:
            raise ValueError(f"Attention: {num_heads} query heads and {num_kv_heads} KV heads; expected the query "
                             f"heads to be a positive multiple of the KV heads (grouped-query attention)")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                kv_cache: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if meta.slot_mapping is not None:
            if kv_cache is None:
                raise ValueError("Attention: meta.slot_mapping is set but no kv_cache was given; pass this "
                                 "layer's (k_cache, v_cache)")
            write_kv(kv_cache[0], kv_cache[1], k, v, meta.slot_mapping)
        if meta.block_tables is None:
            cu = meta.cu_seqlens_q
            return self.ops.attention(q, k, v, cu, cu, scale=self.scale, causal=True)
        if kv_cache is None or meta.context_lens is None:
            raise ValueError("Attention: paged mode (meta.block_tables set) needs kv_cache and meta.context_lens")
        return self.ops.attention_paged(q, kv_cache[0], kv_cache[1], meta.block_tables, meta.context_lens,
                               meta.cu_seqlens_q, scale=self.scale, causal=True)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"
