"""Reference Philox4x32-10 and its uint32 -> fp32 map (R7, docs/numerics.md P9).

The living definition, written for clarity: Python-int-sized steps on int64 tensors, the
32 x 32 -> 64-bit products done schoolbook-style on 16-bit halves so that every intermediate
stays below 2**34 (torch has no portable uint32 arithmetic and int64 cannot hold a full
64-bit product). The device-generic implementation in
``rlkernel.backends.generic._exact.philox`` is written independently; both reproduce the
Random123 known-answer vectors (``tests/test_philox.py``).

Philox4x32-10 (Salmon et al., SC'11; Random123 ``philox4x32_R`` with R = 10)
-----------------------------------------------------------------------------
Words are unsigned 32-bit. Counter ``(c0, c1, c2, c3)``, key ``(k0, k1)``. Ten rounds; the
key is bumped between rounds (before rounds 2..10), never before the first::

    round:  (hi0, lo0) = mulhilo(M0, c0)     # the 64-bit product split into two words
            (hi1, lo1) = mulhilo(M1, c2)
            (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
    bump:   k0 = (k0 + W0) mod 2**32,  k1 = (k1 + W1) mod 2**32

with ``M0 = 0xD2511F53``, ``M1 = 0xCD9E8D57``, ``W0 = 0x9E3779B9``, ``W1 = 0xBB67AE85``.
The output is the counter after the tenth round.

uint32 -> fp32
--------------
``u = (2 * (r >> 9) + 1) * 2**-24``: the top 23 bits of r select one of 2**23 midpoints of
an even grid on (0, 1); exact in fp32, never 0 or 1, symmetric (``u(r) + u(~r) = 1``).
"""

from __future__ import annotations

import torch

#: Bumped whenever any output bit changes (R10).
VERSION = 1

PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF


def _as_words(name: str, t: torch.Tensor, width: int) -> torch.Tensor:
    """Validate a ``[..., width]`` tensor of 32-bit words and return it as int64 in [0, 2**32)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"philox4x32: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() == 0 or t.shape[-1] != width:
        raise ValueError(f"philox4x32: {name} must have shape [..., {width}], got {list(t.shape)}")
    if t.dtype == torch.int32:  # a uint32 bit pattern stored in int32
        return t.to(torch.int64) & MASK32
    if t.dtype == torch.uint32:
        return t.to(torch.int64)
    if t.dtype != torch.int64:
        raise TypeError(f"philox4x32: {name} must be int64 (values in [0, 2**32)), int32 or uint32, got {t.dtype}")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) > MASK32):
        raise ValueError(
            f"philox4x32: {name} holds values outside [0, 2**32) (min {int(t.min())}, max {int(t.max())}); "
            "reduce them modulo 2**32 first"
        )
    return t


def mulhilo32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of the 64-bit product ``a * b`` (a: constant, b: int64 words).

    Schoolbook on 16-bit halves: ``a = a1 2**16 + a0``, ``b = b1 2**16 + b0``; the four partial
    products are below 2**32 and every sum below 2**34, so int64 holds them all exactly.
    """
    a0, a1 = a & 0xFFFF, a >> 16
    b0, b1 = b & 0xFFFF, b >> 16
    p00 = b0 * a0
    p01 = b1 * a0
    p10 = b0 * a1
    p11 = b1 * a1
    mid = p01 + p10  # weight 2**16
    low = p00 + ((mid & 0xFFFF) << 16)  # weight 1, below 2**33
    lo = low & MASK32
    hi = (p11 + (mid >> 16) + (low >> 32)) & MASK32
    return hi, lo


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 block: ``out = philox4x32_10(counter, key)`` (Random123), the reference.

    Parameters
    ----------
    counter : Tensor, int64 [..., 4] with values in [0, 2**32) (also int32 or uint32 words:
        int32 is read as the bit pattern of a uint32)
    key : Tensor, int64 [..., 2], likewise; leading dims broadcast against ``counter``'s

    Returns
    -------
    Tensor, int64 [broadcast(...), 4], values in [0, 2**32): the four output words

    Bitwise semantics
    -----------------
    Pure integer arithmetic modulo 2**32 (module docstring): identical on every device and
    independent of batching, shapes and layout; each block depends only on its own counter
    and key. Ops pin their counter/key layout in their own contracts. Contract primitive
    ``philox4x32``, version :data:`VERSION`.
    """
    ctr = _as_words("counter", counter, 4)
    k = _as_words("key", key, 2)
    shape = torch.broadcast_shapes(ctr.shape[:-1], k.shape[:-1])
    ctr = ctr.expand(*shape, 4)
    k = k.expand(*shape, 2)
    c0, c1, c2, c3 = ctr.unbind(-1)
    k0, k1 = k.unbind(-1)
    for rnd in range(ROUNDS):
        if rnd > 0:  # bump the key between rounds
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack([c0, c1, c2, c3], dim=-1)


def uniform_from_u32(r: torch.Tensor) -> torch.Tensor:
    """Exact map of a uint32 word to (0, 1): ``u = (2 * (r >> 9) + 1) * 2**-24``.

    Parameters
    ----------
    r : Tensor, int64 [...] with values in [0, 2**32) (or int32 holding uint32 bit patterns)

    Returns
    -------
    Tensor, float32 [...], values ``(2j + 1) / 2**24`` for j in [0, 2**23)

    Bitwise semantics
    -----------------
    Exact: the odd integer ``2 (r >> 9) + 1 < 2**24`` converts to fp32 without rounding and the
    product with 2**-24 is exact. Never 0 or 1; ``min = 2**-24``, ``max = 1 - 2**-24``.
    Contract primitive ``uniform_from_u32``, version :data:`VERSION`.
    """
    if not isinstance(r, torch.Tensor):
        raise TypeError(f"uniform_from_u32: expected a torch.Tensor, got {type(r).__name__}")
    if r.dtype == torch.int32:
        r = r.to(torch.int64) & MASK32
    elif r.dtype == torch.uint32:
        r = r.to(torch.int64)
    elif r.dtype != torch.int64:
        raise TypeError(f"uniform_from_u32: expected int64 words in [0, 2**32) (or int32/uint32), got {r.dtype}")
    elif r.numel() and (int(r.min()) < 0 or int(r.max()) > MASK32):
        raise ValueError("uniform_from_u32: values outside [0, 2**32); reduce them modulo 2**32 first")
    odd = 2 * (r >> 9) + 1  # < 2**24: exact in fp32
    scale = torch.tensor(2.0**-24, dtype=torch.float32, device=r.device)
    return odd.to(torch.float32) * scale
