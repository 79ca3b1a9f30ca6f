"""The digit products' combine and the int64 -> float rounding on int32 limbs (no int64 arithmetic).

:func:`int_product` is :func:`digits.int_product`'s exact ``X @ W.T``: each digit GEMM's K-chunk
is an integer below 2**24 (exact in fp32, so exact in int32), placed at bit ``7 (a + b)`` as
three 16-bit pieces on five int32 limbs and normalised every 2**12 placements. The product
comes back as int64 (a bit view of the limbs). :func:`int64_to_float` is
:func:`fp32.int64_to_float`'s rounding of ``s * 2**k`` to fp32/bf16/fp16 (nearest, ties to even,
the subnormal quantum) read from the limbs of ``s``.
"""

from __future__ import annotations

import torch

from . import limbs32 as L

I32 = torch.int32
K_CHUNK = 4096
LIMBS = 5  # 80 bits: products below 2**63 with room for the signed top
_FORMATS = {torch.float32: (24, -149), torch.bfloat16: (8, -133), torch.float16: (11, -24)}


def int_product(xd: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``X @ W.T`` from digit planes xd [A, M, K], wd [B, N, K] (digits.int_product's bits)."""
    na, m, k = xd.shape
    nb, n = wd.shape[0], wd.shape[1]
    acc = torch.zeros((m, n, LIMBS), dtype=I32, device=xd.device)
    w_all = wd.reshape(nb * n, k)
    placed = 0
    for start in range(0, k, K_CHUNK):
        stop = min(start + K_CHUNK, k)
        w_chunk = w_all[:, start:stop]
        for a in range(na):
            part = (xd[a, :, start:stop] @ w_chunk.T).to(I32).reshape(m, nb, n)  # |part| < 2**24: exact
            for b in range(nb):
                pos = 7 * (a + b)
                limb, s = pos >> 4, pos & 15
                v = part[:, b, :]
                lo = (v & L.MASK) << s  # < 2**31
                hi = (v >> L.BITS) << s  # signed, |hi| < 2**23
                acc[..., limb] += lo & L.MASK
                acc[..., limb + 1] += (lo >> L.BITS) + (hi & L.MASK)
                acc[..., limb + 2] += hi >> L.BITS
                placed += 1
                if placed % (1 << 12) == 0:
                    acc = L.normalize(acc)
    return L.to_int64(L.normalize(acc))


def _bit(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Bit ``pos`` (int32, >= 0) of normalised non-negative limbs ``[R, 4]``, as int32 0/1."""
    limb = (pos >> 4).clamp(max=x.shape[1] - 1)
    word = x.gather(1, limb.to(torch.int64).unsqueeze(1)).squeeze(1)
    return (word >> (pos & 15)) & 1


def _below(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Whether any bit of the limbs ``[R, 4]`` below bit ``pos`` (int32 >= 0) is set."""
    idx = torch.arange(x.shape[1], device=x.device, dtype=I32)
    whole = (x != 0) & (idx < (pos >> 4).unsqueeze(1))  # limbs entirely below pos
    limb = (pos >> 4).clamp(max=x.shape[1] - 1)
    word = x.gather(1, limb.to(torch.int64).unsqueeze(1)).squeeze(1)
    part = (word & ((torch.ones_like(pos) << (pos & 15)) - 1)) != 0
    part = part & ((pos >> 4) < x.shape[1])
    return whole.any(dim=1) | part


def _shift_right(x: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """``floor(value / 2**drop)`` of non-negative limbs ``[R, 4]`` when it is below 2**26 (int32)."""
    padded = torch.cat([x, torch.zeros_like(x[:, :3])], dim=1)
    j = (drop >> 4).to(torch.int64).unsqueeze(1)
    t = drop & 15
    w0 = padded.gather(1, j).squeeze(1)
    w1 = padded.gather(1, j + 1).squeeze(1)
    w2 = padded.gather(1, j + 2).squeeze(1)
    # w2's bits land at 32 - t and above: only t >= 7 keeps them below 2**26 (else they are 0)
    return (w0 >> t) | (w1 << (16 - t)) | torch.where(t >= 7, w2 << (32 - t).clamp(max=30), 0)


def int64_to_float(s: torch.Tensor, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``s * 2**k`` rounded once (nearest, ties to even) to ``dtype``: fp32.int64_to_float's bits.

    ``s``: int64 with ``|s| < 2**63``; ``k``: integer tensor broadcastable to ``s`` (small values).
    """
    bits, quantum = _FORMATS[dtype]
    shape = torch.broadcast_shapes(s.shape, k.shape)
    s = s.expand(shape)
    kk = k.expand(shape).reshape(-1).to(I32)
    x = L.from_int64(s).reshape(-1, 4)
    neg = x[:, 3] < 0
    mag = torch.where(neg.unsqueeze(1), L.negate(x), x)
    idx = torch.arange(4, device=s.device, dtype=I32)
    top = torch.where(mag != 0, idx, -1).amax(dim=1)
    top_word = mag.gather(1, top.clamp(min=0).to(torch.int64).unsqueeze(1)).squeeze(1)
    length = torch.where(top < 0, 0, 16 * top + L.bit_length(top_word))
    drop = torch.maximum(length - bits, quantum - kk).clamp(min=0, max=63)
    q = _shift_right(mag, drop)
    rb_pos = (drop - 1).clamp(min=0)
    round_bit = (drop > 0) & (_bit(mag, rb_pos) == 1)
    sticky = _below(mag, rb_pos)
    up = round_bit & (sticky | ((q & 1) == 1))
    q = q + up.to(I32)  # <= 2**bits: exact in fp32
    out = L.scale_pow2(q.to(torch.float32), drop + kk).to(dtype)
    out = torch.where(neg, -out, out)
    return out.reshape(shape)
