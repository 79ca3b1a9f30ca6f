"""Batch tensors -> forward -> sampled tokens and their log-probs (nano-vllm's ``model_runner.py``).

The runner owns the paged KV cache. Each step it packs the scheduled sequences' new tokens,
builds the :class:`~rlkernel.nn.metadata.AttentionMetadata` (packed attention when the step is
made of whole fresh prompts, paged otherwise), runs the model, and for every sequence whose
last fed token is its last token it draws the next one with ``rlkernel.ops.sample`` and scores
it from the same fp32 logits with ``model.logprobs_of_logits`` (``token_logprobs``' bits, one
LM-head GEMM per step; through the model's op set: ``rlkernel.ops``, or torch's own for the
native baseline). Decode steps on CUDA replay captured CUDA graphs
(:mod:`rlkernel.rollout.cuda_graph`) unless the engine was built with ``enforce_eager``.
"""

from __future__ import annotations

import torch

from rlkernel.model import AttentionMetadata, Qwen3ForCausalLM
from rlkernel.rollout.cuda_graph import DecodeGraphs
from rlkernel.rollout.sequence import Sequence

__all__ = ["ModelRunner"]

Batch = list[tuple[Sequence, int]]


def _int64(seed: int) -> int:
    """A 64-bit pattern in [0, 2**64) as the int64 with those bits (the sample op's seed dtype)."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


class ModelRunner:
    """Runs steps of a :class:`~rlkernel.model.qwen3.Qwen3ForCausalLM` over its paged KV cache.

    Parameters
    ----------
    model : Qwen3ForCausalLM
    num_blocks : int
        Blocks the scheduler hands out; the cache holds these plus the CUDA graphs' padding blocks.
    block_size : int
    max_num_seqs : int
        Largest decode batch (the largest CUDA graph).
    max_model_len : int
        Longest sequence (the width of the graphs' block tables).
    enforce_eager : bool
        Never capture CUDA graphs (they are captured on CUDA at TP = 1 otherwise).
    weight_digits : bool
        The graphs hold the linear weights' digit planes (:class:`DecodeGraphs`).
    """

    def __init__(self, model: Qwen3ForCausalLM, num_blocks: int, block_size: int, max_num_seqs: int,
                 max_model_len: int, enforce_eager: bool, weight_digits: bool = False) -> None:
        self.model, self.block_size = model, block_size
        self.device = model.lm_head.weight.device
        self.graphs: DecodeGraphs | None = None
        #: Validate every eager step's inputs and metadata on the host (the tests turn it on; the
        #: engine builds its batches itself, so it is off by default: it costs host syncs).
        self.check = False
        pad_blocks = 0
        # TP > 1 stays eager: the exact all-reduce checks its int64 sums for overflow on the host,
        # which a capture cannot do
        if self.device.type == "cuda" and not enforce_eager and model.tp_size == 1:
            pad_blocks = DecodeGraphs.padding_blocks(max_num_seqs, block_size)
        self.kv_cache = model.allocate_kv_cache(num_blocks + pad_blocks, block_size)
        if pad_blocks:
            self.graphs = DecodeGraphs(model, self.kv_cache, max_num_seqs, max_model_len, first_pad_block=num_blocks,
                                       weight_digits=weight_digits)

    def refresh_weights(self) -> None:
        """Re-read what the decode graphs hold of the weights (their row exponents); no-op when eager."""
        if self.graphs is not None:
            self.graphs.refresh()

    # ------------------------------------------------------------------ one step
    def run(self, batch: Batch) -> tuple[list[Sequence], list[int], torch.Tensor]:
        """Feed each ``(seq, n)``: tokens ``seq.num_computed_tokens .. + n``.

        Returns
        -------
        (sequences, tokens, logprobs): the sequences that drew a token this step, the token ids
        and their float32 log-probs ``[len(sequences)]`` on the CPU.
        """
        hidden = self._forward(batch)
        rows, drawn = [], []
        end = 0
        for seq, n in batch:
            end += n
            if seq.num_computed_tokens + n == len(seq):
                rows.append(end - 1)
                drawn.append(seq)
        if not drawn:
            return [], [], torch.zeros(0, dtype=torch.float32)
        last = hidden[torch.tensor(rows, device=self.device)]
        logits = self.model.compute_logits(last)
        tokens = self._sample(logits, drawn)
        logprobs = torch.empty(len(drawn), dtype=torch.float32, device=self.device)
        by_temperature: dict[float, list[int]] = {}
        for k, seq in enumerate(drawn):
            by_temperature.setdefault(seq.params.logprob_temperature, []).append(k)
        for temperature, ks in by_temperature.items():  # the trainer's token_logprobs bits, from the same logits
            if len(ks) == len(drawn):
                logprobs = self.model.logprobs_of_logits(logits, tokens, temperature)
            else:
                idx = torch.tensor(ks, device=self.device)
                logprobs[idx] = self.model.logprobs_of_logits(logits[idx], tokens[idx], temperature)
        return drawn, [int(t) for t in tokens.tolist()], logprobs.cpu()

    def _forward(self, batch: Batch) -> torch.Tensor:
        if self.graphs is not None and all(seq.num_computed_tokens == len(seq) - 1 and n == 1 for seq, n in batch) \
                and len(batch) <= self.graphs.max_batch_size:
            return self.graphs.run([seq.token_ids[-1] for seq, _ in batch], [len(seq) for seq, _ in batch],
                                   [seq.block_table for seq, _ in batch])
        ids: list[int] = []
        positions: list[int] = []
        query_lens, context_lens = [], []
        for seq, n in batch:
            start = seq.num_computed_tokens
            ids += seq.token_ids[start:start + n]
            positions += range(start, start + n)
            query_lens.append(n)
            context_lens.append(start + n)
        width = max(len(seq.block_table) for seq, _ in batch)
        table = torch.tensor([seq.block_table + [-1] * (width - len(seq.block_table)) for seq, _ in batch],
                             dtype=torch.int32)
        if all(seq.num_computed_tokens == 0 and n == len(seq) for seq, n in batch):  # whole sequences
            # packed attention over the batch's own keys (they are written to the cache as well)
            meta = AttentionMetadata.prefill(query_lens, table, self.block_size, self.device)
        else:
            meta = AttentionMetadata.paged(query_lens, context_lens, table, self.block_size, self.device)
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        position_ids = torch.tensor(positions, dtype=torch.int64, device=self.device)  # = meta.positions()
        return self.model(input_ids, position_ids, meta, self.kv_cache, check=self.check)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """int64 [B]: each sequence's next token from the sample op on its fp32 logits [B, V] (its seed,
        the token's position)."""
        device = self.device
        temperature = torch.tensor([float(s.params.temperature) for s in seqs], dtype=torch.float32, device=device)
        top_k = torch.tensor([s.params.top_k for s in seqs], dtype=torch.int64, device=device)
        top_p = torch.tensor([float(s.params.top_p) for s in seqs], dtype=torch.float32, device=device)
        seed = torch.tensor([_int64(s.seed) for s in seqs], dtype=torch.int64, device=device)
        position = torch.tensor([len(s) for s in seqs], dtype=torch.int64, device=device)
        return self.model.ops.sample(logits, temperature, top_k, top_p, seed, position)
