"""KV cache blocks: a free list and each sequence's block table (nano-vllm's ``block_manager.py``).

No prefix sharing: every sequence owns its blocks. Which physical blocks a sequence gets never
changes a bit (attention reads only the slots of its positions; see ``KVCache``).
"""

from __future__ import annotations

from collections import deque

from rlkernel.rollout.sequence import Sequence

__all__ = ["BlockManager"]


class BlockManager:
    """Hands out blocks ``0 .. num_blocks - 1`` of the cache from a free list.

    Parameters
    ----------
    num_blocks : int
        Blocks the scheduler may hand out (the cache may hold more: the model runner keeps a few
        of its own for CUDA-graph padding).
    block_size : int
        Token slots per block.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """More blocks ``seq`` needs to feed ``num_new_tokens`` after its computed ones."""
        return max(0, self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= len(self.free_blocks)

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq.block_table`` to cover its computed tokens plus ``num_new_tokens``."""
        need = self.blocks_needed(seq, num_new_tokens)
        if need > len(self.free_blocks):
            raise RuntimeError(f"BlockManager: {need} blocks needed, {len(self.free_blocks)} free (the scheduler "
                               f"checks can_allocate first)")
        seq.block_table.extend(self.free_blocks.popleft() for _ in range(need))

    def free(self, seq: Sequence) -> None:
        """Return all of ``seq``'s blocks (finished or preempted)."""
        self.free_blocks.extend(seq.block_table)
        seq.block_table = []
