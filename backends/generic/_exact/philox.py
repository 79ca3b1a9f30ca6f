"""Device-generic Philox4x32-10 and the exact uint32 -> fp32 map (R7, docs/numerics.md P9).

Plain int64 tensor arithmetic (multiply by a constant, add, and, xor, shifts) that every
device computes identically; written independently of the contract reference, which it must
not import. A 32-bit word times a 32-bit multiplier is done as two 32 x 16-bit products
(each below 2**48, so int64 never overflows), recombined into the high and low words.
"""

from __future__ import annotations

import torch

_M0 = 0xD2511F53
_M1 = 0xCD9E8D57
_W0 = 0x9E3779B9
_W1 = 0xBB67AE85
_ROUNDS = 10
_LOW32 = 0xFFFFFFFF
_ONE_BITS = 0x3F800000  # 1.0f
_HALF_ULP_BITS = 0x33800000  # 2**-24
_U_SHIFT = 9  # u keeps the top 32 - 9 = 23 bits of r


def _words(name: str, t: torch.Tensor, n: int, check: bool) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"philox4x32: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() == 0 or t.shape[-1] != n:
        raise ValueError(f"philox4x32: {name} must have shape [..., {n}], got {list(t.shape)}")
    if t.dtype in (torch.int32, torch.uint32):
        return t.to(torch.int64) & _LOW32  # int32: the uint32 bit pattern
    if t.dtype != torch.int64:
        raise TypeError(f"philox4x32: {name} must be int64 (values in [0, 2**32)), int32 or uint32, got {t.dtype}")
    if check and bool(((t >> 32) != 0).any()):
        raise ValueError(f"philox4x32: {name} holds values outside [0, 2**32); reduce them modulo 2**32 first")
    return t


def _mul_hi_lo(word: torch.Tensor, mult: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``word * mult``; word in [0, 2**32), mult a 32-bit constant."""
    by_low = word * (mult & 0xFFFF)  # < 2**48
    by_high = word * (mult >> 16)  # < 2**48, weight 2**16
    low = (by_low + ((by_high & 0xFFFF) << 16)) & _LOW32
    high = (by_high + (by_low >> 16)) >> 16  # floor(word * mult / 2**32) < 2**32
    return high, low


def philox4x32(counter: torch.Tensor, key: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Philox4x32-10 (Random123): ``out = philox4x32_10(counter, key)``, device-generic.

    Parameters
    ----------
    counter : Tensor, int64 [..., 4], values in [0, 2**32) (int32/uint32 words also accepted)
    key : Tensor, int64 [..., 2], likewise; leading dims broadcast against ``counter``'s
    check : bool
        Verify that int64 words lie in [0, 2**32) (one device-to-host sync); callers that
        build counters themselves may pass False.

    Returns
    -------
    Tensor, int64 [broadcast(...), 4], values in [0, 2**32), on the inputs' device

    Bitwise semantics
    -----------------
    Integer arithmetic modulo 2**32 only; identical bits to the contract ``philox4x32``
    (version 1) on every device. Rounds: ``(c0, c1, c2, c3) <- (hi(M1 c2) ^ c1 ^ k0,
    lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0))``, key bumped by the Weyl constants between
    rounds. Elementwise over the leading dims.
    """
    ctr = _words("counter", counter, 4, check)
    k = _words("key", key, 2, check)
    lead = torch.broadcast_shapes(ctr.shape[:-1], k.shape[:-1])
    x0, x1, x2, x3 = (w for w in ctr.expand(*lead, 4).unbind(-1))
    key0, key1 = (w for w in k.expand(*lead, 2).unbind(-1))
    for i in range(_ROUNDS):
        hi_a, lo_a = _mul_hi_lo(x0, _M0)
        hi_b, lo_b = _mul_hi_lo(x2, _M1)
        x0, x1, x2, x3 = (hi_b ^ x1) ^ key0, lo_b, (hi_a ^ x3) ^ key1, lo_a
        if i < _ROUNDS - 1:
            key0 = (key0 + _W0) & _LOW32
            key1 = (key1 + _W1) & _LOW32
    return torch.stack((x0, x1, x2, x3), dim=-1)


def uniform_from_u32(r: torch.Tensor, check: bool = True) -> torch.Tensor:
    """uint32 word -> fp32 in (0, 1): ``u = (2 * (r >> 9) + 1) * 2**-24``, device-generic.

    Parameters
    ----------
    r : Tensor, int64 [...] with values in [0, 2**32) (int32/uint32 words also accepted)
    check : bool
        Verify that int64 words lie in [0, 2**32) (one device-to-host sync).

    Returns
    -------
    Tensor, float32 [...], on ``r.device``

    Bitwise semantics
    -----------------
    Exact, identical bits to the contract ``uniform_from_u32`` (version 1). Built from the
    bits: ``1 + (r >> 9) 2**-23`` is the fp32 with significand ``r >> 9``; subtracting 1 and
    adding 2**-24 are both exact.
    """
    if not isinstance(r, torch.Tensor):
        raise TypeError(f"uniform_from_u32: expected a torch.Tensor, got {type(r).__name__}")
    if r.dtype not in (torch.int64, torch.int32, torch.uint32):
        raise TypeError(f"uniform_from_u32: expected int64 words in [0, 2**32) (or int32/uint32), got {r.dtype}")
    if r.dtype == torch.int64 and check and bool(((r >> 32) != 0).any()):
        raise ValueError("uniform_from_u32: values outside [0, 2**32); reduce them modulo 2**32 first")
    top23 = (r.to(torch.int64) & _LOW32) >> _U_SHIFT
    one_plus = (top23 | _ONE_BITS).to(torch.int32).view(torch.float32)  # 1 + top23 * 2**-23
    one = torch.full((), _ONE_BITS, dtype=torch.int32, device=r.device).view(torch.float32)
    half_ulp = torch.full((), _HALF_ULP_BITS, dtype=torch.int32, device=r.device).view(torch.float32)
    return (one_plus - one) + half_ulp
