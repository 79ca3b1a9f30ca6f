"""Integers wider than 32 bits as vectors of 16-bit limbs held in int32 tensors (no int64 arithmetic).

The int32-limb alternative of the generic path (docs/generic-primitives.md, "int32 limbs") is
built on this layer. A number is an int32 tensor ``[..., L]``: limb ``j`` weighs ``2**(16 j)``.
*Normalised*, limbs ``0 .. L-2`` lie in ``[0, 2**16)`` and the top limb is signed (two's
complement of the whole number); every number has exactly one normalised form. Callers give
enough limbs that the top limb of a normalised number stays small (0 or -1 for the values the
contracts bound), and add at most :data:`CHUNK` normalised numbers before normalising again, so
no int32 limb ever wraps.

The only operations used are int32 ``+ - & | >> <<`` (shifts never move a bit out of range),
comparisons, ``sum(dtype=int32)``, ``scatter_add_`` of int32 values (exact in any order, so also
with atomics) and bit reinterpretation (``view``) between int64 and int32 pairs, which moves
bits and does no arithmetic. Carries ripple limb by limb in ``L - 1`` elementwise steps: no host
read of device values.
"""

from __future__ import annotations

import sys

import torch

BITS = 16
MASK = (1 << BITS) - 1
#: normalised numbers added before the next normalisation: 2**13 limbs below 2**17 stay below 2**30
CHUNK = 1 << 13
I32 = torch.int32
#: position of the low 32-bit word of an int64 in memory (every torch device here is little-endian)
_LO, _HI = (0, 1) if sys.byteorder == "little" else (1, 0)


def sign_extend16(x: torch.Tensor) -> torch.Tensor:
    """The low 16 bits of int32 ``x`` read as a signed 16-bit number, in [-2**15, 2**15)."""
    return ((x & MASK) ^ 0x8000) - 0x8000


def normalize(x: torch.Tensor) -> torch.Tensor:
    """Normalised form of limbs ``[..., L]`` (same value): a ripple from limb 0 up, floor carries.

    Exact while every limb and the carries it receives stay inside int32 (callers bound this).
    """
    x = x.clone()
    for j in range(x.shape[-1] - 1):
        carry = x[..., j] >> BITS  # arithmetic shift: floor(x / 2**16)
        x[..., j] = x[..., j] & MASK
        x[..., j + 1] += carry
    return x


def negate(x: torch.Tensor) -> torch.Tensor:
    """Normalised ``-x`` of normalised limbs."""
    return normalize(-x)


def total(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Normalised sum of normalised numbers ``x`` along ``dim`` (not the limb axis): chunked int32 sums."""
    if dim % x.dim() == x.dim() - 1:
        raise ValueError("limbs32.total: dim must not be the limb axis")
    x = x.movedim(dim, 0)
    if x.shape[0] == 0:
        return torch.zeros(x.shape[1:], dtype=I32, device=x.device)
    while x.shape[0] > 1:
        parts = [normalize(x[i:i + CHUNK].sum(dim=0, dtype=I32)) for i in range(0, x.shape[0], CHUNK)]
        x = torch.stack(parts)
    return normalize(x[0])


def words(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Low and high int32 words of int64 ``x`` (a bit view of a dense copy: no arithmetic)."""
    flat = x.reshape(-1)  # 1-d: a 0-d tensor has no axis to split
    dense = flat.clone(memory_format=torch.contiguous_format) if flat.stride(-1) != 1 else flat.contiguous()
    words = dense.view(I32).reshape(*x.shape, 2)
    return words[..., _LO], words[..., _HI]


def from_words(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """int64 whose low and high 32-bit words are int32 ``lo`` and ``hi`` (a bit view)."""
    pair = [lo, hi] if _LO == 0 else [hi, lo]
    return torch.stack(pair, dim=-1).contiguous().view(torch.int64).squeeze(-1)


def from_int64(x: torch.Tensor) -> torch.Tensor:
    """int64 ``x`` as four normalised limbs ``[..., 4]`` (bit reinterpretation, no int64 arithmetic)."""
    lo, hi = words(x)
    return torch.stack([lo & MASK, (lo >> BITS) & MASK, hi & MASK, hi >> BITS], dim=-1)


def to_int64(limbs: torch.Tensor) -> torch.Tensor:
    """int64 of the low 64 bits of normalised limbs ``[..., L]`` (two's complement; L >= 1).

    Each 32-bit word is ``low | (signed high half << 16)``: the shift never leaves int32's range.
    """
    pad = max(0, 4 - limbs.shape[-1])
    if pad:
        fill = torch.where(limbs[..., -1:] < 0, -1, 0).to(I32).expand(*limbs.shape[:-1], pad)
        limbs = torch.cat([limbs, fill], dim=-1)
    lo = (limbs[..., 0] & MASK) | (sign_extend16(limbs[..., 1]) << BITS)
    hi = (limbs[..., 2] & MASK) | (sign_extend16(limbs[..., 3]) << BITS)
    return from_words(lo, hi)


def is_positive_int64(x: torch.Tensor) -> torch.Tensor:
    """``x > 0`` for int64 ``x``, from its two 32-bit words (int32 comparisons only)."""
    lo, hi = words(x)
    return (hi > 0) | ((hi == 0) & (lo != 0))


def bit_length(a: torch.Tensor) -> torch.Tensor:
    """Bit length of non-negative int32 values (0 for 0), by a five-step binary search."""
    length = torch.zeros_like(a)
    v = a
    for step in (16, 8, 4, 2, 1):
        big = (v >> step) > 0
        length = length + big.to(I32) * step
        v = torch.where(big, v >> step, v)
    return length + (v > 0).to(I32)


def pow2_f32(k: torch.Tensor) -> torch.Tensor:
    """fp32 ``2**k`` for int32 k in [-126, 127], built from the exponent bits."""
    return ((k.to(I32) + 127) << 23).view(torch.float32)


def scale_pow2(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``(y * 2**a) * 2**(k - a)``, ``a = floor(k / 2)``, k clamped to [-252, 254]: two fp32 multiplies."""
    k = k.to(I32).clamp(min=-252, max=254)
    a = k >> 1  # floor(k / 2)
    return (y * pow2_f32(a)) * pow2_f32(k - a)


def place24(sig: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Limb index and three signed pieces of ``±sig * 2**pos`` (int32 ``0 <= sig < 2**24``, ``pos >= 0``).

    Returns ``(limb, [p0, p1, p2])``: the value is ``p0 * 2**(16 limb) + p1 * 2**(16 (limb + 1)) +
    p2 * 2**(16 (limb + 2))``, each piece below 2**17 in magnitude (negated where ``neg``). ``sig`` is
    split in 16 + 8 bits first so no shift leaves int32's range.
    """
    limb = pos >> 4
    s = pos & 15
    lo = (sig & MASK) << s  # < 2**31
    hi = (sig >> BITS) << s  # < 2**23
    pieces = [lo & MASK, (lo >> BITS) + (hi & MASK), hi >> BITS]
    return limb, [torch.where(neg, -p, p) for p in pieces]


def row_sums(limb: torch.Tensor, pieces: list[torch.Tensor], width: int) -> torch.Tensor:
    """Normalised ``[R, width]`` sums of the placed terms of rows ``[R, n]`` (:func:`place24`'s output).

    Each block of :data:`CHUNK` columns is added with an int32 ``scatter_add_`` (a limb receives at
    most one piece per term, below 2**17: the block's limbs stay below 2**30), normalised, and
    added to the running sum.
    """
    r_, n = limb.shape
    out = torch.zeros((r_, width), dtype=I32, device=limb.device)
    for c0 in range(0, n, CHUNK):
        block = torch.zeros((r_, width), dtype=I32, device=limb.device)
        lb = limb[:, c0:c0 + CHUNK]
        for j, p in enumerate(pieces):
            block.scatter_add_(1, (lb + j).to(torch.int64), p[:, c0:c0 + CHUNK])
        out = normalize(out + normalize(block))
    return out


def round_to_24(mag: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round a normalised non-negative number ``[R, L]`` to 24 bits, nearest, ties to even.

    Returns ``(q, scale, zero)``: int32 ``q <= 2**24`` and int32 ``scale`` with
    ``RN24(value) = q * 2**scale`` (limb 0's unit is 2**0), and whether the value is 0 (then q and
    scale are a harmless stand-in). The head is the top nonzero limb ``k`` and the two below it;
    limbs under ``k - 2`` only decide the sticky bit.
    """
    r_, nlimbs = mag.shape
    dev = mag.device
    idx = torch.arange(nlimbs, device=dev, dtype=I32)
    nz = mag != 0
    k = torch.where(nz, idx, -1).amax(dim=1)  # top nonzero limb, -1 for 0
    zero = k < 0
    kk = k.clamp(min=0)
    padded = torch.cat([torch.zeros((r_, 2), dtype=I32, device=dev), mag], dim=1)
    h2 = padded.gather(1, (kk + 2).to(torch.int64).unsqueeze(1)).squeeze(1)
    h1 = padded.gather(1, (kk + 1).to(torch.int64).unsqueeze(1)).squeeze(1)
    h0 = padded.gather(1, kk.to(torch.int64).unsqueeze(1)).squeeze(1)
    sticky = (nz & (idx < (kk - 2).unsqueeze(1))).any(dim=1)
    h2 = torch.where(zero, 1, h2)  # stand-in for 0
    # head = h2 * 2**32 + low32, low32 = h1 * 2**16 + h0; keep 24 bits: drop r = bit_length(h2) + 8 in [9, 24]
    r = bit_length(h2) + 8
    hi_part = h2 << (32 - r)  # < 2**24
    low_q = torch.where(r >= 16, h1 >> (r - 16).clamp(min=0), (h1 << (16 - r).clamp(min=0)) | (h0 >> r.clamp(max=15)))
    q = hi_part + low_q
    rb_pos = r - 1  # the round bit's position in low32, in [8, 23]
    round_bit = torch.where(rb_pos >= 16, (h1 >> (rb_pos - 16).clamp(min=0)) & 1, (h0 >> rb_pos.clamp(max=15)) & 1)
    low_mask_h0 = (torch.ones_like(r) << rb_pos.clamp(max=16)) - 1  # bits of h0 below the round bit
    below = torch.where(rb_pos >= 16,
                        (h0 != 0) | ((h1 & ((torch.ones_like(r) << (rb_pos - 16).clamp(min=0)) - 1)) != 0),
                        (h0 & low_mask_h0) != 0)
    up = (round_bit == 1) & (below | sticky | ((q & 1) == 1))
    q = q + up.to(I32)
    scale = r + BITS * (kk - 2)
    return q, scale, zero


def to_f32(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``RN24`` of normalised numbers ``[R, L]`` (nearest, ties to even): the exact float ``q * 2**scale``.

    The value is built from the 24-bit ``q`` by two multiplies by normal powers of two (exact for
    ``L <= 7``: ``|scale| <= 16 L``).
    """
    neg = x[:, -1] < 0
    q, scale, zero = round_to_24(torch.where(neg.unsqueeze(1), negate(x), x))
    a = scale >> 1
    out = (q.to(torch.float32) * pow2_f32(a)) * pow2_f32(scale - a)
    out = torch.where(zero, torch.zeros_like(out), out)
    return torch.where(neg, -out, out)


def int64_sum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Exact int64 sum of int64 ``x`` (all of it, or along ``dim``) from int32 limb sums; int64 result."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    dim = dim % x.dim()
    out = to_int64(total(from_int64(x), dim=dim))
    return out.unsqueeze(dim) if keepdim else out
