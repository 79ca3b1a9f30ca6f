"""Which sequences run in the next forward, and how many tokens each feeds (nano-vllm's ``scheduler.py``).

Every step has a token budget (``max_num_batched_tokens``) and a sequence cap (``max_num_seqs``):

1. Running sequences, oldest first, feed what they have not fed yet: one token in decode, the
   next chunk of their prompt while it is longer than the budget left (chunked prefill). When
   the free list cannot hold a sequence's next tokens, the most recently started running
   sequence is preempted (its blocks freed; it waits at the front of the queue and is
   recomputed later), possibly the sequence itself.
2. Then waiting sequences join, first come first served, while the budget, the cap and the free
   blocks allow (a prompt longer than the budget left starts with a chunk). None join in a step
   that preempted.

Decode and prefill chunks share steps (continuous batching). The bits of every token do not
depend on any of it.
"""

from __future__ import annotations

from collections import deque

from rlkernel.rollout.block_manager import BlockManager
from rlkernel.rollout.sequence import Sequence, SequenceStatus

__all__ = ["Scheduler"]

#: One step's work: (sequence, number of its tokens to feed), in packing order.
Batch = list[tuple[Sequence, int]]


class Scheduler:
    """Waiting and running queues over a :class:`BlockManager`.

    Parameters
    ----------
    block_manager : BlockManager
    max_num_seqs : int
        Sequences per step at most.
    max_num_batched_tokens : int
        Tokens per step at most.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def schedule(self) -> Batch:
        """The next step's batch; blocks for its tokens are allocated."""
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        batch: Batch = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not bm.can_allocate(seq, n):
                preempted = True
                victim = self.running[-1]
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                bm.allocate(seq, n)
                batch.append((seq, n))
                budget -= n
                i += 1
                continue
            break  # seq preempted itself: it was the last running one
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            n = min(seq.num_uncomputed_tokens, budget)
            if not bm.can_allocate(seq, n):
                break
            self.waiting.popleft()
            bm.allocate(seq, n)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.append((seq, n))
            budget -= n
        if not batch:
            raise RuntimeError(f"Scheduler: nothing fits in a step ({len(self.waiting)} waiting, "
                               f"{len(self.running)} running, {bm.num_free_blocks} of {bm.num_blocks} blocks free); "
                               f"the engine checks that every sequence fits the cache alone, so this is a bug")
        return batch

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and queue it first for recomputation."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def abort_all(self) -> None:
        """Drop every unfinished sequence and free its blocks (a ``generate`` that raised)."""
        for seq in self.running:
            self.block_manager.free(seq)
            seq.status = SequenceStatus.FINISHED
        for seq in self.waiting:
            seq.status = SequenceStatus.FINISHED
        self.running.clear()
        self.waiting.clear()

    def finish(self, seq: Sequence) -> None:
        """Free a finished sequence's blocks and drop it from the running queue."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
