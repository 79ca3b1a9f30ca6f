"""The paged KV cache: one K and one V tensor per layer in vLLM's block layout."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["KVCache"]


@dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer, in blocks of ``block_size`` token slots.

    Slot ``s`` of the cache is token ``s % block_size`` of block ``s // block_size``; a sequence
    owns a list of blocks (its block table row) and its token at position ``p`` lives in slot
    ``block_table[p // block_size] * block_size + p % block_size``. Which blocks a sequence owns
    is the rollout engine's business (a block allocator); the model only writes the slots it is
    given and reads the blocks it is told about (:class:`~rlkernel.nn.metadata.AttentionMetadata`).

    Attributes
    ----------
    k, v : Tensor, the model dtype, [num_layers, num_blocks, block_size, Hkv_local, D]
        ``k[i]`` is layer i's cache in ``rlkernel.ops.attention_paged``'s layout (vLLM's
        ``[num_blocks, block_size, num_kv_heads, head_dim]``); Hkv_local is the number of KV
        heads on this tensor-parallel rank.

    Bitwise semantics
    -----------------
    Writing is a copy of each new token's k/v bits into its slot; attention reads only the
    slots of positions below each sequence's context length, so stale contents of reused
    blocks, the block size and which physical blocks a sequence got never change a bit.
    """

    k: torch.Tensor
    v: torch.Tensor

    def __post_init__(self) -> None:
        for name, t in (("k", self.k), ("v", self.v)):
            if t.dim() != 5:
                raise ValueError(f"KVCache: {name} has shape {tuple(t.shape)}; expected [num_layers, num_blocks, "
                                 f"block_size, num_kv_heads, head_dim]")
            if not t.is_contiguous():
                raise ValueError(f"KVCache: {name} is not contiguous; allocate it with KVCache.allocate")
        if self.k.shape != self.v.shape or self.k.dtype != self.v.dtype or self.k.device != self.v.device:
            raise ValueError(f"KVCache: k is {self.k.dtype} {tuple(self.k.shape)} on {self.k.device} but v is "
                             f"{self.v.dtype} {tuple(self.v.shape)} on {self.v.device}; expected the same")

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16, device: torch.device | str | None = None) -> KVCache:
        """A zero-filled cache (``Qwen3ForCausalLM.allocate_kv_cache`` fills in the model's sizes).

        Parameters
        ----------
        num_layers, num_blocks, block_size, num_kv_heads, head_dim : int
            ``num_kv_heads`` is per tensor-parallel rank.
        dtype : torch.dtype
            The model's dtype (bfloat16 or float16).
        device : torch.device or str, optional
        """
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"KVCache.allocate: {name} = {value!r}; expected an int >= 1")
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype = torch.bfloat16) -> int:
        """Memory of one block over all layers, K and V: size a cache to a memory budget with it."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize

    @property
    def num_layers(self) -> int:
        return int(self.k.shape[0])

    @property
    def num_blocks(self) -> int:
        return int(self.k.shape[1])

    @property
    def block_size(self) -> int:
        return int(self.k.shape[2])

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k_cache, v_cache)`` of layer ``index``: views [num_blocks, block_size, Hkv_local, D]."""
        return self.k[index], self.v[index]
