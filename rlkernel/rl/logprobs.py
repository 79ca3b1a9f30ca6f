"""The trainer's forward: token log-probs of packed variable-length sequences, micro-batched.

``packed_logprobs`` runs whole sequences through the model in packed (varlen) micro-batches and
scores every token but each sequence's first through the LM head's ``token_logprobs`` (the
``[T, V]`` logits are never held). Every op on the way is row- or query-local (contracts
``linear``, ``rms_norm``, ``rope``, ``attention``, ``token_logprobs``, ...), so a token's
log-prob has the same bits whatever the micro-batch size, the packing order, the head chunk
size, the tensor-parallel degree — and the same bits the rollout engine computed for it while
generating with prefill, chunked prefill and decode over the paged KV cache.

It is the scoring path (old log-probs, reference log-probs, validation); run it under
``torch.no_grad()``. The training forward with autograd is
:func:`rlkernel.train.grpo.completion_logprobs`, which also records the sequences as the units
of the weight gradients (:mod:`rlkernel.grads`).

Entropy is a separate call on the same hidden rows: :meth:`Qwen3ForCausalLM.entropy` /
``rlkernel.ops.token_entropy`` (contract ``token_entropy`` v1: ``-sum_v p_v log p_v`` from
token_logprobs' exact normaliser plus one more exact sum over the vocabulary, memory-bounded,
differentiable; TP = 1 only for now). ``packed_logprobs`` itself returns log-probs only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlkernel.model.qwen3 import Qwen3ForCausalLM
from rlkernel.nn.metadata import AttentionMetadata

__all__ = ["micro_batches", "packed_logprobs"]


def micro_batches(seq_lens: Sequence[int], micro_batch_size: int | None = None,
                  max_tokens: int | None = None) -> list[list[int]]:
    """Split sequences, in order, into micro-batches (lists of sequence indices).

    Parameters
    ----------
    seq_lens : sequence of int
        Length of each sequence.
    micro_batch_size : int, optional
        At most this many sequences per micro-batch (default: no limit).
    max_tokens : int, optional
        At most this many tokens per micro-batch (verl's dynamic batch size); a sequence
        longer than ``max_tokens`` gets a micro-batch of its own (default: no limit).

    Returns
    -------
    list of list of int: consecutive index runs covering ``range(len(seq_lens))``.
    """
    for name, value in (("micro_batch_size", micro_batch_size), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"micro_batches: {name} = {value!r}; expected an int >= 1 or None (no limit)")
    batches: list[list[int]] = []
    tokens = 0
    for i, n in enumerate(seq_lens):
        full = bool(batches) and (
            (micro_batch_size is not None and len(batches[-1]) >= micro_batch_size)
            or (max_tokens is not None and tokens + n > max_tokens))
        if not batches or full:
            batches.append([])
            tokens = 0
        batches[-1].append(i)
        tokens += n
    return batches


def _offsets(cu_seqlens: torch.Tensor, num_tokens: int) -> list[int]:
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (
            torch.int32, torch.int64):
        raise ValueError(f"packed_logprobs: cu_seqlens must be an int32/int64 tensor [B + 1], got "
                         f"{getattr(cu_seqlens, 'dtype', type(cu_seqlens).__name__)} "
                         f"{tuple(getattr(cu_seqlens, 'shape', ()))}")
    c = [int(x) for x in cu_seqlens.tolist()]
    if not c or c[0] != 0 or any(b < a for a, b in zip(c, c[1:])) or c[-1] != num_tokens:
        raise ValueError(f"packed_logprobs: cu_seqlens = {c}; expected non-decreasing offsets from 0 to "
                         f"T = {num_tokens} (input_ids.shape[0])")
    return c


def packed_logprobs(model: Qwen3ForCausalLM, input_ids: torch.Tensor, cu_seqlens: torch.Tensor, *,
                    temperature: float = 1.0, micro_batch_size: int | None = None, max_tokens: int | None = None,
                    head_chunk_size: int | None = None) -> torch.Tensor:
    """Log-probability of every token given the tokens before it in its sequence.

    ``out[i] = log softmax(logits(input_ids[s_b .. i-1]) / temperature)[input_ids[i]]`` for
    ``s_b < i < s_{b+1}``; ``out[s_b] = 0`` (a sequence's first token has no prediction: mask it)

    Parameters
    ----------
    model : Qwen3ForCausalLM
        With or without a tensor-parallel group (every rank calls this with the same inputs
        and gets the same result).
    input_ids : Tensor, int64, [T]
        Whole sequences (prompt + response), packed.
    cu_seqlens : Tensor, int32/int64, [B + 1]
        Offsets of the sequences in ``input_ids``: ``0 = s_0 <= ... <= s_B = T``.
    temperature : float
        Logits are divided by ``fp32(temperature)`` (> 0), as the sampler did.
    micro_batch_size : int, optional
        Sequences per forward (default: all in one).
    max_tokens : int, optional
        Tokens per forward (sequences are never split; see :func:`micro_batches`).
    head_chunk_size : int, optional
        Rows per LM-head call (bounds the head's working memory; default: a micro-batch's rows
        at once).

    Returns
    -------
    Tensor, float32, [T], aligned with ``input_ids`` (the log-prob of the token at that row).

    Bitwise semantics
    -----------------
    Each value depends only on its sequence's tokens up to and including it: invariant to
    batch composition, packing order, micro-batch size, head chunking, TP degree, and equal to
    the rollout engine's log-prob of that token (``model.logprobs`` of the row before it,
    computed by prefill or decode). Contracts of every op on the path (``token_logprobs`` v1
    for the last step).
    """
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1 or input_ids.dtype != torch.int64:
        raise ValueError(f"packed_logprobs: input_ids must be an int64 tensor [T], got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    if head_chunk_size is not None and (isinstance(head_chunk_size, bool) or not isinstance(head_chunk_size, int)
                                        or head_chunk_size < 1):
        raise ValueError(f"packed_logprobs: head_chunk_size = {head_chunk_size!r}; expected an int >= 1 or None")
    cu = _offsets(cu_seqlens, input_ids.shape[0])
    lens = [cu[b + 1] - cu[b] for b in range(len(cu) - 1)]
    device = input_ids.device
    out = torch.zeros(input_ids.shape[0], dtype=torch.float32, device=device)
    for batch in micro_batches(lens, micro_batch_size, max_tokens):
        ids = torch.cat([input_ids[cu[b]:cu[b + 1]] for b in batch])
        meta = AttentionMetadata.packed([lens[b] for b in batch], device)
        hidden = model(ids, meta.positions(), meta)
        rows, dest, local = [], [], 0
        for b in batch:
            rows.append(torch.arange(local, local + max(lens[b] - 1, 0), device=device))
            dest.append(torch.arange(cu[b] + 1, max(cu[b + 1], cu[b] + 1), device=device))
            local += lens[b]
        row, dst = torch.cat(rows), torch.cat(dest)
        step = head_chunk_size or max(row.shape[0], 1)
        for start in range(0, row.shape[0], step):
            r, d = row[start:start + step], dst[start:start + step]
            out[d] = model.logprobs(hidden[r], input_ids[d], temperature)
    return out
