"""Device-generic exact superaccumulator (docs/numerics.md P10): int64 limbs, no float64.

A finite fp32 ``t = ±m * 2**(b - 150)`` (m the 24-bit significand, b = max(biased exponent,
1)) adds ``±(m << ((b - 1) & 15))`` to limb ``(b - 1) >> 4`` of 16 int64 limbs of 16-bit
weight steps (limb i weighs ``2**(16 i - 149)``). A state is int64 ``[..., 20]``: limbs
0..15, a carry limb (weight ``2**107``), and the counts of NaN, +inf and -inf terms. The
limb sums are integer sums, so any order, tiling, split, atomic or all-reduce gives the same
state; canonical states (limbs 0..15 in [0, 2**16)) are unique per value. Finalisation
rounds the exact value once to fp32 in integer arithmetic (top three 16-bit limbs + sticky),
then builds the float from a 24-bit integer and two exact power-of-two multiplies.

Everything here is int64 arithmetic, comparisons, ``scatter_add`` of int64 (exact in any
order, so also with atomics), and fp32 multiplies by powers of two that are exact. Where the
device's int64 is not exact (:mod:`intpath`), the public functions below hand the work to
:mod:`superacc32`, the same states and results computed on int32 limbs.
"""

from __future__ import annotations

import torch

from . import intpath, superacc32
from .fp32 import bit_length, bits_of, pow2_f32

NUM_LIMBS = 16
#: Bits per limb (limb i weighs ``2**(LIMB_BITS * i + LSB_EXP)``) and the exponent of limb 0's unit.
LIMB_BITS = 16
LSB_EXP = -149
STATE_SLOTS = 20
CARRY, NAN, POS_INF, NEG_INF = 16, 17, 18, 19
#: Raw int64 limb sums stay exact for this many terms per block (contributions < 2**39).
BLOCK_TERMS = 1 << 23
#: Elements handled per step (bounds the int64 temporaries: 8 bytes each, a few alive).
STEP_ELEMENTS = 1 << 22


def _limb_split(e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(e // LIMB_BITS, e % LIMB_BITS)`` for e >= 0, as shifts (LIMB_BITS = 16)."""
    return e >> 4, e & 15


def _decompose(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Limb index and signed contribution of each fp32 term (non-finite -> 0 in limb 0)."""
    b = bits_of(t)
    biased = (b >> 23) & 0xFF
    finite = biased != 0xFF
    m = (b & 0x7FFFFF) | ((biased > 0).to(torch.int64) << 23)
    e = biased.clamp(min=1) - 150 - LSB_EXP  # t = m * 2**(e + LSB_EXP), e >= 0
    limb, shift = _limb_split(e)
    v = m << shift
    v = torch.where((b >> 31) == 1, -v, v)
    zero = torch.zeros_like(v)
    return torch.where(finite, limb, zero), torch.where(finite, v, zero)


def _raw_limbs(rows: torch.Tensor) -> torch.Tensor:
    """Raw int64 limb sums [R, 17] (carry 0) of fp32 rows [R, n] with n <= BLOCK_TERMS."""
    limb, v = _decompose(rows)
    out = torch.zeros((rows.shape[0], NUM_LIMBS + 1), dtype=torch.int64, device=rows.device)
    out.scatter_add_(1, limb, v)
    return out


def normalize_limbs(x: torch.Tensor) -> torch.Tensor:
    """Carry-propagate limbs ``[..., 17]``: limbs 0..15 into [0, 2**16), the rest into limb 16.

    Exact (floor shifts) as long as no limb exceeds 2**62 in magnitude. Every limb passes its
    carry up at once, repeated until no limb below the top carries (a few passes for sums of
    normalised states; a carry ripples one limb per pass): the canonical form is unique, so this equals a ripple from
    limb 0 up.
    """
    x = x.clone()
    while True:  # ends: each pass leaves limbs 0..15 below 2**16 plus the carry they received
        c = x[..., :NUM_LIMBS] >> LIMB_BITS
        if not bool((c != 0).any()):
            break
        x[..., :NUM_LIMBS] -= c << LIMB_BITS  # floor carry: the low 16 bits stay
        x[..., 1:NUM_LIMBS + 1] += c
    return x


def _specials(rows: torch.Tensor) -> torch.Tensor:
    """[R, 3] int64 counts of NaN, +inf, -inf per row."""
    b = bits_of(rows)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    pos = b == 0x7F800000
    neg = b == 0xFF800000
    return torch.stack([nan.sum(-1), pos.sum(-1), neg.sum(-1)], dim=-1)


def accumulate(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Canonical states of fp32 ``t`` summed along ``dim``: int64, ``dim`` removed, + [20].

    Parameters
    ----------
    t : Tensor, float32, any shape with at least one axis; any device

    Returns
    -------
    Tensor, int64, ``t.shape`` without ``dim`` plus a last axis of 20 slots, on t's device
    """
    if intpath.int32(t.device):
        return superacc32.accumulate(t, dim)
    if t.dtype != torch.float32:
        raise TypeError(f"superacc.accumulate: expected float32 terms, got {t.dtype}")
    moved = t.movedim(dim, -1)
    lead = tuple(moved.shape[:-1])
    n = moved.shape[-1]
    r = 1
    for size in lead:
        r *= size
    rows = moved.reshape(r, n)
    out = torch.zeros((r, STATE_SLOTS), dtype=torch.int64, device=t.device)
    if r == 0 or n == 0:
        return out.reshape(*lead, STATE_SLOTS)
    n_step = min(n, BLOCK_TERMS, STEP_ELEMENTS)
    r_step = max(1, STEP_ELEMENTS // n_step)
    for r0 in range(0, r, r_step):
        block_rows = rows[r0:r0 + r_step]
        limbs = torch.zeros((block_rows.shape[0], NUM_LIMBS + 1), dtype=torch.int64, device=t.device)
        spec = torch.zeros((block_rows.shape[0], 3), dtype=torch.int64, device=t.device)
        for n0 in range(0, n, n_step):
            chunk = block_rows[:, n0:n0 + n_step]
            limbs = limbs + normalize_limbs(_raw_limbs(chunk))  # sum of normalised chunks: exact
            spec = spec + _specials(chunk)
        out[r0:r0 + r_step, :NUM_LIMBS + 1] = normalize_limbs(limbs)
        out[r0:r0 + r_step, NAN:] = spec
    return out.reshape(*lead, STATE_SLOTS)


def normalize(states: torch.Tensor) -> torch.Tensor:
    """Canonical form of states ``[..., 20]`` (same value and counts)."""
    if intpath.int32(states.device):
        return superacc32.normalize(states)
    out = states.clone()
    out[..., :NUM_LIMBS + 1] = normalize_limbs(states[..., :NUM_LIMBS + 1])
    return out


def merge(states: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Merge states along ``dim`` (slot-wise integer sum, then normalise): canonical result."""
    if intpath.int32(states.device):
        return superacc32.merge(states, dim)
    if dim % states.dim() == states.dim() - 1:
        raise ValueError("superacc.merge: dim must not be the slot axis")
    k = states.shape[dim]
    if k >= 1 << 46:
        raise ValueError(f"superacc.merge: {k} partials exceed the bound 2**46; merge them in groups")
    return normalize(normalize(states).sum(dim=dim))


def _round_up(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor, sticky: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties to even: does the kept ``q`` (dropped bits ``rem``, their half-way
    point ``half``, any nonzero bit below them ``sticky``) round up?"""
    return (rem > half) | ((rem == half) & (sticky | ((q & 1) == 1)))


def finish(states: torch.Tensor) -> torch.Tensor:
    """fp32 ``RN32(V * 2**-149)`` of each state (specials by the P10 rules); shape ``[...]``.

    Parameters
    ----------
    states : Tensor, int64, [..., 20], canonical or not (any value with |V| < 2**318)

    Returns
    -------
    Tensor, float32, ``states.shape[:-1]``, on the states' device
    """
    if intpath.int32(states.device):
        return superacc32.finish(states)
    lead = states.shape[:-1]
    s = states.reshape(-1, STATE_SLOTS)
    dev = s.device
    x = normalize_limbs(s[:, :NUM_LIMBS + 1])
    neg = x[:, NUM_LIMBS] < 0
    x = torch.where(neg.unsqueeze(1), normalize_limbs(-x), x)  # magnitude, canonical
    # split the carry limb (< 2**62) into four more 16-bit limbs: 20 limbs, all in [0, 2**16)
    top = x[:, NUM_LIMBS]
    width, mask = LIMB_BITS, (1 << LIMB_BITS) - 1
    ext = torch.stack([(top >> (width * j)) & mask for j in range(-(-64 // width))], dim=1)
    limbs = torch.cat([x[:, :NUM_LIMBS], ext], dim=1)  # [R, 20]
    nlimbs = limbs.shape[1]
    idx = torch.arange(nlimbs, device=dev)
    nz = limbs != 0
    k = torch.where(nz, idx, torch.full_like(idx, -1)).amax(dim=1)  # top nonzero limb, -1 for V = 0
    zero = k < 0
    kk = k.clamp(min=0)
    padded = torch.cat([torch.zeros((limbs.shape[0], 2), dtype=torch.int64, device=dev), limbs], dim=1)
    h2 = padded.gather(1, (kk + 2).unsqueeze(1)).squeeze(1)
    h1 = padded.gather(1, (kk + 1).unsqueeze(1)).squeeze(1)
    h0 = padded.gather(1, kk.unsqueeze(1)).squeeze(1)
    head = (h2 << (2 * width)) | (h1 << width) | h0  # V = head * 2**(16 (k - 2)) + (limbs below k - 2)
    below = torch.cumsum(nz.to(torch.int64), dim=1)  # nonzero limbs at index <= j
    below = torch.cat([torch.zeros((limbs.shape[0], 1), dtype=torch.int64, device=dev), below], dim=1)
    sticky = below.gather(1, (kk - 2).clamp(min=0).unsqueeze(1)).squeeze(1) > 0  # limbs < k - 2
    head = torch.where(zero, torch.ones_like(head) << (2 * width), head)  # harmless stand-in for V = 0
    drop = bit_length(head) - 24  # >= 9: head >= 2**32
    q = head >> drop
    rem = head - (q << drop)
    half = torch.ones_like(drop) << (drop - 1)
    q = q + _round_up(q, rem, half, sticky).to(torch.int64)  # <= 2**24: exact in fp32
    scale = drop + width * (kk - 2) + LSB_EXP  # value = q * 2**scale
    overflow = bit_length(q) + scale > 128
    scale = torch.where(overflow, torch.zeros_like(scale), scale)
    a = torch.div(scale, 2, rounding_mode="floor")  # both halves in [-86, 52]: normal powers of two
    mag = (q.to(torch.float32) * pow2_f32(a)) * pow2_f32(scale - a)  # exact: the value is representable
    inf = torch.full_like(mag, float("inf"))
    mag = torch.where(overflow, inf, mag)
    mag = torch.where(zero, torch.zeros_like(mag), mag)
    out = torch.where(neg, -mag, mag)
    nan = s[:, NAN] > 0
    pos = s[:, POS_INF] > 0
    ninf = s[:, NEG_INF] > 0
    out = torch.where(pos, inf, out)
    out = torch.where(ninf, -inf, out)
    out = torch.where(nan | (pos & ninf), torch.full_like(out, float("nan")), out)
    return out.reshape(lead)


def exact_sum(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``RN32(exact sum of t along dim)`` (P10): fp32, ``dim`` removed."""
    return finish(accumulate(t, dim))
