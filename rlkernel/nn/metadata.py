"""What one forward pass computes: which tokens belong to which sequence, and where their keys live.

:class:`AttentionMetadata` is nano-vllm's ``Context`` passed explicitly (never a global). One
instance describes a batch of B sequences whose new tokens are packed into T rows
(``input_ids [T]``, ``positions [T]``, hidden states ``[T, H]``):

* **packed** (trainer; a fresh prompt): every segment is a whole sequence starting at
  position 0; attention runs over the batch's own keys (``rlkernel.ops.attention``). With a
  ``slot_mapping`` the new keys are also written to the KV cache (batched prefill).
* **paged** (chunked prefill, decode, prefix reuse, mixed batches): each segment holds the
  last ``query_len`` tokens of a sequence whose ``context_len`` keys (cached ones plus the new
  ones) live in the KV cache blocks named by its block table; the new keys are written to
  their slots, then ``rlkernel.ops.attention_paged`` reads the cache.

Every op is invariant to batch composition, packing order, chunking and KV block layout, so a
token's hidden state, and its log-probability, has the same bits in every mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlkernel.nn.kv_cache import KVCache

__all__ = ["AttentionMetadata"]

_INTS = (torch.int32, torch.int64)
Lengths = Sequence[int] | torch.Tensor


def _lengths(name: str, values: Lengths) -> list[int]:
    out = [int(x) for x in (values.tolist() if isinstance(values, torch.Tensor) else values)]
    bad = [x for x in out if x < 0]
    if bad:
        raise ValueError(f"AttentionMetadata: {name} holds {bad[0]}; expected lengths >= 0")
    return out


def _cumsum(lengths: list[int], device: torch.device | str | None) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _slots(query_lens: list[int], context_lens: list[int], block_tables: torch.Tensor,
           block_size: int) -> torch.Tensor:
    """int64 [T]: the cache slot of each new token (positions ``context - query .. context - 1``)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"AttentionMetadata: block_size = {block_size!r}; expected an int >= 1 (the KV cache's "
                         f"block size, KVCache.block_size)")
    table = block_tables.to("cpu", torch.int64)
    slots = []
    for b, (q, c) in enumerate(zip(query_lens, context_lens)):
        if q > c:
            raise ValueError(f"AttentionMetadata: sequence {b} has {q} new tokens but a context of {c}; the "
                             f"context length counts the new tokens too, so it must be >= the query length")
        need = -(-c // block_size)
        if need > table.shape[1]:
            raise ValueError(f"AttentionMetadata: sequence {b} has {c} tokens = {need} blocks of {block_size} but "
                             f"block_tables has {table.shape[1]} columns; widen block_tables")
        pos = torch.arange(c - q, c, dtype=torch.int64)
        slots.append(table[b, pos // block_size] * block_size + pos % block_size)
    return torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)


@dataclass(frozen=True)
class AttentionMetadata:
    """Batch description for one forward of :class:`~rlkernel.model.qwen3.Qwen3ForCausalLM`.

    Build it with :meth:`packed`, :meth:`prefill`, :meth:`paged` or :meth:`decode` (or fill the
    fields directly, e.g. from device buffers that a CUDA graph replays).

    Attributes
    ----------
    cu_seqlens_q : Tensor, int32/int64, [B + 1]
        Offsets of each sequence's new tokens in the packed rows: ``0 = c_0 <= ... <= c_B = T``.
    context_lens : Tensor, int32/int64, [B], optional
        Paged mode: keys of each sequence after this step (cached + new).
    block_tables : Tensor, int32/int64, [B, max_blocks], optional
        Paged mode: physical KV block of each logical block (unused entries: any value, e.g. -1).
        None selects packed mode (every segment a whole sequence from position 0).
    slot_mapping : Tensor, int64, [T], optional
        KV cache slot that each new token's key and value are written to (``block * block_size
        + offset``). Required in paged mode; in packed mode it turns on the cache write.
    """

    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    slot_mapping: torch.Tensor | None = None

    # ------------------------------------------------------------------ constructors
    @classmethod
    def packed(cls, seq_lens: Lengths, device: torch.device | str | None = None) -> AttentionMetadata:
        """Whole sequences, attention over the batch's own tokens, no KV cache (the trainer).

        Parameters
        ----------
        seq_lens : sequence of int or Tensor [B]
            Length of each packed sequence, in packing order.
        device : torch.device or str, optional
        """
        return cls(cu_seqlens_q=_cumsum(_lengths("seq_lens", seq_lens), device))

    @classmethod
    def prefill(cls, seq_lens: Lengths, block_tables: torch.Tensor, block_size: int,
                device: torch.device | str | None = None) -> AttentionMetadata:
        """Whole prompts (no cached prefix): attention over the new tokens, keys written to the cache.

        Parameters
        ----------
        seq_lens : sequence of int or Tensor [B]
            Prompt lengths.
        block_tables : Tensor, int, [B, max_blocks]
            Blocks allocated to each sequence (at least ``ceil(seq_len / block_size)``).
        block_size : int
            The cache's block size.
        device : torch.device or str, optional
        """
        lens = _lengths("seq_lens", seq_lens)
        slots = _slots(lens, lens, block_tables, block_size)
        return cls(cu_seqlens_q=_cumsum(lens, device), slot_mapping=slots.to(device))

    @classmethod
    def paged(cls, query_lens: Lengths, context_lens: Lengths, block_tables: torch.Tensor, block_size: int,
              device: torch.device | str | None = None) -> AttentionMetadata:
        """New tokens of sequences whose keys live in the paged cache (chunked prefill, decode, mixed).

        Parameters
        ----------
        query_lens : sequence of int or Tensor [B]
            New tokens of each sequence in this step: a prefill chunk's length, 1 for decode.
        context_lens : sequence of int or Tensor [B]
            Tokens of each sequence after this step (cached + new); the new tokens take positions
            ``context_len - query_len .. context_len - 1``.
        block_tables : Tensor, int, [B, max_blocks]
            Each sequence's blocks, covering ``ceil(context_len / block_size)`` entries.
        block_size : int
        device : torch.device or str, optional
        """
        q = _lengths("query_lens", query_lens)
        c = _lengths("context_lens", context_lens)
        if len(q) != len(c) or len(q) != block_tables.shape[0]:
            raise ValueError(f"AttentionMetadata.paged: {len(q)} query lengths, {len(c)} context lengths and "
                             f"{block_tables.shape[0]} block table rows; expected one of each per sequence")
        slots = _slots(q, c, block_tables, block_size)
        return cls(cu_seqlens_q=_cumsum(q, device), context_lens=torch.tensor(c, dtype=torch.int32, device=device),
                   block_tables=block_tables.to(device), slot_mapping=slots.to(device))

    @classmethod
    def decode(cls, context_lens: Lengths, block_tables: torch.Tensor, block_size: int,
               device: torch.device | str | None = None) -> AttentionMetadata:
        """One new token per sequence (a decode step): :meth:`paged` with every query length 1.

        Parameters
        ----------
        context_lens : sequence of int or Tensor [B]
            Tokens of each sequence including the one being fed (its position is ``context_len - 1``).
        block_tables : Tensor, int, [B, max_blocks]
        block_size : int
        device : torch.device or str, optional
        """
        c = _lengths("context_lens", context_lens)
        return cls.paged([1] * len(c), c, block_tables, block_size, device)

    # ------------------------------------------------------------------ facts
    @property
    def reads_cache(self) -> bool:
        """Paged mode: attention reads the KV cache (``block_tables`` is set)."""
        return self.block_tables is not None

    @property
    def num_seqs(self) -> int:
        return int(self.cu_seqlens_q.shape[0]) - 1

    def query_lens(self) -> list[int]:
        c = [int(x) for x in self.cu_seqlens_q.tolist()]
        return [c[i + 1] - c[i] for i in range(len(c) - 1)]

    def positions(self) -> torch.Tensor:
        """int64 [T]: the position of each new token in its sequence (the model's ``positions``).

        Packed mode: ``0 .. len - 1`` per sequence; paged mode: ``context_len - query_len + i``.
        """
        q = self.query_lens()
        k = q if self.context_lens is None else [int(x) for x in self.context_lens.tolist()]
        parts = [torch.arange(kl - ql, kl, dtype=torch.int64) for ql, kl in zip(q, k)]
        out = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        return out.to(self.cu_seqlens_q.device)

    # ------------------------------------------------------------------ validation
    def validate(self, num_tokens: int, kv_cache: KVCache | None) -> None:
        """Check the fields against each other, the packed rows and the cache (host-side).

        Raises
        ------
        TypeError
            A field has a wrong dtype.
        ValueError
            Offsets that do not end at ``num_tokens``, a paged batch without a cache or without
            a slot mapping, slots out of range or repeated, or slots that are not the block-table
            slots of the new tokens' positions.
        """
        name = "AttentionMetadata"
        cu = self.cu_seqlens_q
        _int_tensor(name, "cu_seqlens_q", cu, 1)
        c = [int(x) for x in cu.tolist()]
        if not c or c[0] != 0 or any(b < a for a, b in zip(c, c[1:])) or c[-1] != num_tokens:
            raise ValueError(f"{name}: cu_seqlens_q = {c}; expected non-decreasing offsets from 0 to the number "
                             f"of packed tokens T = {num_tokens} (input_ids.shape[0])")
        if (self.block_tables is None) != (self.context_lens is None):
            raise ValueError(f"{name}: block_tables and context_lens must be given together (paged mode) or both "
                             f"be None (packed mode)")
        if self.reads_cache:
            if kv_cache is None:
                raise ValueError(f"{name}: paged mode (block_tables set) needs the KV cache; pass kv_cache=...")
            if self.slot_mapping is None:
                raise ValueError(f"{name}: paged mode needs slot_mapping: the new tokens' keys must be written to "
                                 f"the cache before attention reads it (AttentionMetadata.paged computes it)")
            _int_tensor(name, "block_tables", self.block_tables, 2)  # type: ignore[arg-type]
            _int_tensor(name, "context_lens", self.context_lens, 1)  # type: ignore[arg-type]
        if self.slot_mapping is None:
            return
        if kv_cache is None:
            raise ValueError(f"{name}: slot_mapping is set but no kv_cache was passed; pass the cache the slots "
                             f"refer to, or drop slot_mapping")
        slots = self.slot_mapping
        _int_tensor(name, "slot_mapping", slots, 1)
        if slots.shape[0] != num_tokens:
            raise ValueError(f"{name}: slot_mapping has {slots.shape[0]} entries; expected one per packed token "
                             f"(T = {num_tokens})")
        host = slots.to("cpu", torch.int64)
        if host.numel():
            lo, hi = int(host.min()), int(host.max())
            if lo < 0 or hi >= kv_cache.num_slots:
                raise ValueError(f"{name}: slot_mapping spans [{lo}, {hi}]; expected slots in [0, "
                                 f"{kv_cache.num_slots}) = num_blocks * block_size of the KV cache")
            if torch.unique(host).numel() != host.numel():
                raise ValueError(f"{name}: slot_mapping repeats a slot; every new token needs its own slot "
                                 f"(two writes to one slot would keep an arbitrary one)")
        if self.reads_cache:
            expected = _slots(self.query_lens(), [int(x) for x in self.context_lens.tolist()],  # type: ignore[union-attr]
                              self.block_tables, kv_cache.block_size)  # type: ignore[arg-type]
            if not torch.equal(expected, host):
                i = int((expected != host).nonzero()[0, 0])
                raise ValueError(f"{name}: slot_mapping[{i}] = {int(host[i])} but the block table puts that token "
                                 f"(its position is context_len - query_len + offset) in slot {int(expected[i])}; "
                                 f"attention would read keys that were never written")


def _int_tensor(op: str, name: str, t: torch.Tensor, dims: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in _INTS or t.dim() != dims:
        got = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise TypeError(f"{op}: {name} is {got}; expected an int32/int64 tensor with {dims} dimension(s)")
