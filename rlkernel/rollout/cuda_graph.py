"""Decode steps replayed from CUDA graphs at a few padded batch sizes (nano-vllm's ``capture_cudagraph``).

A decode step feeds one token per sequence, so its shapes depend only on the batch size B. For
each size in ``1, 2, 4, 8, 16, 32, 48, ...`` up to ``max_num_seqs`` the forward is captured once
over static input buffers (token ids, positions, context lengths, block tables, slot mapping)
and replayed with the step's values copied in. A batch of B sequences runs in the smallest
captured size >= B; the extra rows are padding.

Padding row r (``B <= r < size``) feeds token 0 at position ``r % block_size`` from its own slot
in one of the cache's padding blocks (blocks ``first_pad_block ..``, never handed to a
sequence): its key/value write touches no sequence's slot, and every op is per row (attention
per query), so the real rows' bits are those of an eager step.

Capture needs every op on the path to launch without reading device values on the host; the
ops skip their value checks while a stream is capturing (``rlkernel._validate.capturing``) and
the runner vouches for the inputs: it builds them itself.

The linear layers run with their weights' row exponents held in buffers
(:class:`~rlkernel.rollout.weight_exponents.WeightExponents`): a replay reads them instead of
reading every weight for them. :meth:`DecodeGraphs.run` refreshes them when a weight's version
counter moved; the engine refreshes them at every ``generate`` and ``refresh_weights``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from rlkernel.model import AttentionMetadata, KVCache, Qwen3ForCausalLM
from rlkernel.rollout.weight_exponents import WeightExponents

__all__ = ["DecodeGraphs", "graph_batch_sizes"]


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The captured batch sizes: 1, 2, 4, 8, then every multiple of 16, and ``max_batch_size`` itself."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch_size] + list(range(16, max_batch_size, 16))
    return [*sizes, max_batch_size]


class DecodeGraphs:
    """Captured decode forwards of one model over one KV cache.

    Parameters
    ----------
    model : Qwen3ForCausalLM
        On a CUDA device.
    kv_cache : KVCache
        The engine's cache, with :meth:`padding_blocks` extra blocks from ``first_pad_block`` on.
    max_batch_size : int
        The largest decode batch (``max_num_seqs``).
    max_model_len : int
        Longest sequence: block tables are ``ceil(max_model_len / block_size)`` wide and the RoPE
        tables are grown to cover every position before capture.
    first_pad_block : int
        First of the padding blocks.
    capture : bool
        Capture the graphs (default). False runs the same padded static-buffer forward eagerly
        on any device: the tests check the padding on the CPU that way.
    weight_digits : bool
        Hold the linear weights' digit planes as well as their exponents (``WeightExponents``'s
        ``digits``) and pass them to ``rlkernel.ops.linear``: 3 bytes a weight element.
    """

    @staticmethod
    def padding_blocks(max_batch_size: int, block_size: int) -> int:
        """Cache blocks the padding rows write to (one slot each)."""
        return -(-max_batch_size // block_size)

    def __init__(self, model: Qwen3ForCausalLM, kv_cache: KVCache, max_batch_size: int, max_model_len: int,
                 first_pad_block: int, capture: bool = True, weight_digits: bool = False) -> None:
        self.model, self.kv_cache = model, kv_cache
        self.max_batch_size = max_batch_size
        self.block_size = bs = kv_cache.block_size
        device = model.lm_head.weight.device
        width = -(-max_model_len // bs)
        r = torch.arange(max_batch_size, dtype=torch.int64)
        pad_block = first_pad_block + r // bs
        #: Host-side padding values of every row (rows >= B of a step take them).
        self.pad_positions = r % bs
        self.pad_slots = pad_block * bs + self.pad_positions
        self.pad_table = torch.full((max_batch_size, width), -1, dtype=torch.int32)
        self.pad_table[:, 0] = pad_block.to(torch.int32)
        # static device buffers, filled with the padding rows
        self.input_ids = torch.zeros(max_batch_size, dtype=torch.int64, device=device)
        self.positions = self.pad_positions.to(device)
        self.context_lens = (self.pad_positions + 1).to(torch.int32).to(device)
        self.block_tables = self.pad_table.to(device)
        self.slot_mapping = self.pad_slots.to(device)
        self.cu_seqlens_q = torch.arange(max_batch_size + 1, dtype=torch.int32, device=device)
        self.hidden = torch.zeros(max_batch_size, model.config.hidden_size, dtype=model.dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        #: Decode steps run, replayed from a graph, run with padding rows.
        self.steps = self.replays = self.padded_steps = 0
        #: Validate the padded batch on the host before each eager run (capture=False; tests).
        self.check = False
        self.sizes = graph_batch_sizes(max_batch_size)
        #: The linear weights' exponents the graphs read (the exact ops only; torch's have none).
        self.exponents = WeightExponents(model, digits=weight_digits) if model.ops.bitwise else None
        if capture:
            self._capture(max_model_len)

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(cu_seqlens_q=self.cu_seqlens_q[:size + 1], context_lens=self.context_lens[:size],
                                 block_tables=self.block_tables[:size], slot_mapping=self.slot_mapping[:size])

    def _forward(self, size: int, check: bool = False) -> None:
        with self.exponents.active() if self.exponents is not None else nullcontext():
            self.hidden[:size] = self.model(self.input_ids[:size], self.positions[:size], self._meta(size),
                                            self.kv_cache, check=check)

    def refresh(self) -> None:
        """Recompute the held weight exponents from the weights as they are now."""
        if self.exponents is not None:
            self.exponents.refresh()

    @torch.inference_mode()
    def _capture(self, max_model_len: int) -> None:
        c = self.model.config
        # the RoPE tables must cover every position before capture (a capture cannot grow them)
        probe = torch.zeros(1, 1, c.head_dim, dtype=self.model.dtype, device=self.hidden.device)
        self.model.ops.rope(probe, torch.tensor([max_model_len - 1], device=self.hidden.device), c.rope_theta)
        pool = None
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its memory pool
            self._forward(size)  # warm-up (Triton compiles and autotunes outside the capture)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                self._forward(size)
            if pool is None:
                pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()

    def run(self, tokens: list[int], context_lens: list[int], block_tables: list[list[int]]) -> torch.Tensor:
        """Replay the decode forward of B sequences: hidden states [B, H] (a view of the output buffer,
        valid until the next replay).

        Parameters
        ----------
        tokens : list of int
            Each sequence's last token (the one being fed).
        context_lens : list of int
            Each sequence's length including that token (its position is ``context_len - 1``).
        block_tables : list of list of int
            Each sequence's blocks (covering its context).
        """
        b = len(tokens)
        size = next(s for s in self.sizes if s >= b)
        bs = self.block_size
        pos = torch.tensor(context_lens, dtype=torch.int64) - 1
        width = max(len(row) for row in block_tables)
        table = torch.tensor([row + [-1] * (width - len(row)) for row in block_tables], dtype=torch.int32)
        last_block = table.gather(1, (pos // bs).unsqueeze(1)).squeeze(1).to(torch.int64)
        positions = torch.cat([pos, self.pad_positions[b:size]])
        self.input_ids[:size].copy_(torch.cat([torch.tensor(tokens, dtype=torch.int64),
                                               torch.zeros(size - b, dtype=torch.int64)]))
        self.positions[:size].copy_(positions)
        self.context_lens[:size].copy_((positions + 1).to(torch.int32))
        self.slot_mapping[:size].copy_(torch.cat([last_block * bs + pos % bs, self.pad_slots[b:size]]))
        # entries past a row's used blocks are never read: copy only the used width (stale
        # entries to its right are harmless), and the padding rows' one block
        self.block_tables[:b, :width].copy_(table)
        self.block_tables[b:size, 0].copy_(self.pad_table[b:size, 0])
        self.steps += 1
        self.padded_steps += b < size
        if self.exponents is not None:
            self.exponents.refresh_if_changed()
        graph = self.graphs.get(size)
        if graph is None:  # built with capture=False
            self._forward(size, self.check)
        else:
            graph.replay()
            self.replays += 1
        return self.hidden[:b]
