"""The P10 superaccumulator in int32 limbs: the same states and results as :mod:`superacc`, no int64 arithmetic.

For devices whose int64 arithmetic is not exact or not supported (docs/generic-primitives.md,
"int32 limbs"). The value of a state is one wide integer: 23 limbs of 16 bits in int32
(:mod:`limbs32`), limb ``i`` weighing ``2**(16 i - 149)``; slots 0..16 of an int64 state are
read as 64-bit integers placed at limbs ``i .. i + 3`` (bit reinterpretation, then int32 sums),
the three special counts as 64-bit integers of four limbs each. A term ``±m * 2**(b - 150)``
adds three 16-bit pieces of ``m << ((b - 1) & 15)`` at limbs ``(b - 1) >> 4 ..`` (int32
``scatter_add_``). The canonical int64 state (limbs 0..15 in [0, 2**16), the rest of the value in
slot 16) is unique per value, so it equals :mod:`superacc`'s bit for bit, and so does the fp32
rounding, done here from the top three limbs in int32 pieces.

This module does not call :mod:`superacc`: it is an independent implementation of the same
definition (docs/numerics.md P10), selected through :mod:`intpath`.
"""

from __future__ import annotations

import torch

from . import limbs32 as L

NUM_LIMBS = 16
LSB_EXP = -149
STATE_SLOTS = 20
CARRY, NAN, POS_INF, NEG_INF = 16, 17, 18, 19
#: limbs of the wide value: 16 state limbs, the carry slot's 64 bits, three limbs of headroom
WIDE = NUM_LIMBS + 4 + 3
#: Elements handled per step (bounds the temporaries)
STEP_ELEMENTS = 1 << 22
I32 = torch.int32


def _decompose(t: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Limb index and signed pieces of each fp32 term (non-finite -> 0)."""
    b = t.contiguous().view(I32)
    biased = (b >> 23) & 0xFF
    finite = biased != 0xFF
    m = (b & 0x7FFFFF) | torch.where(biased > 0, 1 << 23, 0).to(I32)
    m = torch.where(finite, m, 0)
    return L.place24(m, biased.clamp(min=1) - 1, b < 0)  # t = m * 2**(e - 149), e = max(b, 1) - 1


def _specials(rows: torch.Tensor) -> torch.Tensor:
    """[R, 3] int32 counts of NaN, +inf, -inf per row."""
    b = rows.contiguous().view(I32)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    pos = b == 0x7F800000
    neg = b == -0x800000  # 0xFF800000
    return torch.stack([nan.sum(-1, dtype=I32), pos.sum(-1, dtype=I32), neg.sum(-1, dtype=I32)], dim=-1)


def _count_limbs(c: torch.Tensor) -> torch.Tensor:
    """Non-negative int32 counts ``[...]`` as normalised four-limb numbers ``[..., 4]``."""
    z = torch.zeros_like(c)
    return torch.stack([c & L.MASK, c >> L.BITS, z, z], dim=-1)


def _to_wide(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 states ``[N, 20]`` -> normalised wide value ``[N, 23]`` and counts ``[N, 3, 4]``."""
    split = L.from_int64(states)  # [N, 20, 4], each slot normalised
    wide = torch.zeros((states.shape[0], WIDE), dtype=I32, device=states.device)
    for j in range(4):  # slot i's limb j lands on wide limb i + j
        wide[:, j:j + NUM_LIMBS + 1] += split[:, :NUM_LIMBS + 1, j]
    return L.normalize(wide), split[:, NAN:]


def _to_states(wide: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Normalised wide values ``[N, 23]`` and counts ``[N, 3, 4]`` -> canonical int64 states ``[N, 20]``."""
    low = L.to_int64(wide[:, :NUM_LIMBS].unsqueeze(-1))  # limbs in [0, 2**16): one limb each
    carry = L.to_int64(wide[:, NUM_LIMBS:])  # the rest of the value (its low 64 bits: the int64 slot)
    return torch.cat([low, carry.unsqueeze(1), L.to_int64(counts)], dim=1)


def accumulate(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Canonical states of fp32 ``t`` summed along ``dim``: int64, ``dim`` removed, + [20].

    Parameters
    ----------
    t : Tensor, float32, any shape with at least one axis; any device

    Returns
    -------
    Tensor, int64, ``t.shape`` without ``dim`` plus a last axis of 20 slots (superacc.accumulate's bits)
    """
    if t.dtype != torch.float32:
        raise TypeError(f"superacc32.accumulate: expected float32 terms, got {t.dtype}")
    moved = t.movedim(dim, -1)
    lead = tuple(moved.shape[:-1])
    n = moved.shape[-1]
    rows = moved.reshape(-1, n)
    r = rows.shape[0]
    out = torch.zeros((r, STATE_SLOTS), dtype=torch.int64, device=t.device)
    if r == 0 or n == 0:
        return out.reshape(*lead, STATE_SLOTS)
    r_step = max(1, STEP_ELEMENTS // n)
    for r0 in range(0, r, r_step):
        block = rows[r0:r0 + r_step]
        limb, pieces = _decompose(block)
        wide = L.row_sums(limb, pieces, WIDE)
        out[r0:r0 + r_step] = _to_states(wide, _count_limbs(_specials(block)))
    return out.reshape(*lead, STATE_SLOTS)


def normalize(states: torch.Tensor) -> torch.Tensor:
    """Canonical form of states ``[..., 20]`` (same value and counts)."""
    flat = states.reshape(-1, STATE_SLOTS)
    return _to_states(*_to_wide(flat)).reshape(states.shape)


def merge(states: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Merge states along ``dim`` (the exact sum of their values and counts): canonical result."""
    if dim % states.dim() == states.dim() - 1:
        raise ValueError("superacc.merge: dim must not be the slot axis")
    k = states.shape[dim]
    if k >= 1 << 46:
        raise ValueError(f"superacc.merge: {k} partials exceed the bound 2**46; merge them in groups")
    moved = states.movedim(dim, 0)
    rest = tuple(moved.shape[1:-1])
    wide, counts = _to_wide(moved.reshape(-1, STATE_SLOTS))
    wide = L.total(wide.reshape(k, -1, WIDE), dim=0)
    counts = L.total(counts.reshape(k, -1, 3, 4), dim=0)
    return _to_states(wide, counts).reshape(*rest, STATE_SLOTS)


def finish(states: torch.Tensor) -> torch.Tensor:
    """fp32 ``RN32(V * 2**-149)`` of each state (specials by the P10 rules); shape ``[...]``.

    Parameters
    ----------
    states : Tensor, int64, [..., 20], canonical or not

    Returns
    -------
    Tensor, float32, ``states.shape[:-1]`` (superacc.finish's bits)
    """
    lead = states.shape[:-1]
    s = states.reshape(-1, STATE_SLOTS)
    wide, _ = _to_wide(s)
    neg = wide[:, -1] < 0
    mag = torch.where(neg.unsqueeze(1), L.negate(wide), wide)
    q, scale, zero = L.round_to_24(mag)
    scale = scale + LSB_EXP  # value = q * 2**scale
    overflow = L.bit_length(q) + scale > 128
    scale = torch.where(overflow, 0, scale)
    a = scale >> 1  # floor(scale / 2): both halves normal powers of two
    out = (q.to(torch.float32) * L.pow2_f32(a)) * L.pow2_f32(scale - a)
    inf = torch.full_like(out, float("inf"))
    out = torch.where(overflow, inf, out)
    out = torch.where(zero, torch.zeros_like(out), out)
    out = torch.where(neg, -out, out)
    nan = L.is_positive_int64(s[:, NAN])
    pos = L.is_positive_int64(s[:, POS_INF])
    ninf = L.is_positive_int64(s[:, NEG_INF])
    out = torch.where(pos, inf, out)
    out = torch.where(ninf, -inf, out)
    out = torch.where(nan | (pos & ninf), torch.full_like(out, float("nan")), out)
    return out.reshape(lead)


def exact_sum(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``RN32(exact sum of t along dim)`` (P10): fp32, ``dim`` removed."""
    return finish(accumulate(t, dim))


def scatter(terms: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Canonical states ``[num_rows * E, 20]`` of the terms ``[S, E]`` added to rows ``index`` ``[S]``.

    int32 ``scatter_add_`` of each term's pieces into the wide limbs of its cell, in blocks of at
    most :data:`limbs32.CHUNK` source rows (a limb receives at most one piece per term), each
    block followed by a normalisation.
    """
    s, e = terms.shape
    dev = terms.device
    cells = num_rows * e
    if cells * WIDE >= 1 << 31:
        raise ValueError(f"exact_sum_partial: {num_rows} rows x {e} elements exceed the int32-limb path's "
                         f"bound of {(1 << 31) // WIDE} cells; split the elements into column blocks")
    wide = torch.zeros((cells, WIDE), dtype=I32, device=dev)
    counts = torch.zeros((cells, 3, 4), dtype=I32, device=dev)
    step = max(1, min(L.CHUNK, STEP_ELEMENTS // max(e, 1)))
    elem = torch.arange(e, device=dev, dtype=I32)
    for s0 in range(0, s, step):
        chunk = terms[s0:s0 + step]
        cell = index[s0:s0 + step].to(I32).unsqueeze(1) * e + elem  # [c, E]
        limb, pieces = _decompose(chunk)
        flat = wide.reshape(-1)
        for j, p in enumerate(pieces):
            flat.scatter_add_(0, (cell * WIDE + limb + j).reshape(-1).to(torch.int64), p.reshape(-1))
        spec = torch.zeros((cells, 3), dtype=I32, device=dev)
        spec.scatter_add_(0, cell.reshape(-1, 1).expand(-1, 3).to(torch.int64), _specials(chunk.reshape(-1, 1)))
        counts[..., 0] += spec
        counts = L.normalize(counts)
        wide = L.normalize(wide)
    return _to_states(wide, counts)
