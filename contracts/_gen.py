"""Deterministic input generation for conformance cases and tests.

Golden hashes are only meaningful if every machine builds the same inputs, so nothing here
uses torch's or NumPy's distribution code (whose algorithms may change between versions).
Random bits come from SplitMix64 over a counter, in NumPy ``uint64`` arithmetic (wrapping,
exact everywhere); floats are made from those bits with exact dyadic float64 arithmetic and
rounded once to the target dtype by an IEEE round-to-nearest-even cast.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def seed_of(*parts: object) -> int:
    """A 64-bit seed from any printable parts (op name, case name, a salt)."""
    text = "/".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def random_bits(seed: int, n: int) -> np.ndarray:
    """``n`` pseudo-random ``uint64`` words: SplitMix64 of ``seed + (i + 1) * golden``."""
    with np.errstate(over="ignore"):
        x = np.uint64(seed % 2**64) + (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def uniform(seed: int, shape: Sequence[int]) -> np.ndarray:
    """Float64 uniforms on [0, 1) with 53 random bits (exact: k * 2**-53)."""
    n = int(np.prod(shape)) if len(shape) else 1
    bits = random_bits(seed, n) >> np.uint64(11)
    return (bits.astype(np.float64) * 2.0**-53).reshape(tuple(shape))


def normal(
    seed: int, shape: Sequence[int], std: float = 1.0, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Approximately standard-normal values (Irwin-Hall of four uniforms), scaled and cast.

    Every step before the final cast is exact or a single correctly rounded float64
    operation, so the result is identical on every platform.
    """
    n = int(np.prod(shape)) if len(shape) else 1
    u = uniform(seed, (4, n))
    z = (u[0] + u[1] + u[2] + u[3] - 2.0) * (3.0**0.5) * float(std)
    return torch.from_numpy(z.reshape(tuple(shape))).to(dtype)


def integers(seed: int, shape: Sequence[int], low: int, high: int) -> torch.Tensor:
    """Int64 values in ``[low, high)`` (modulo reduction; the small bias is irrelevant here)."""
    if high <= low:
        raise ValueError(f"integers: need high > low, got low={low}, high={high}")
    n = int(np.prod(shape)) if len(shape) else 1
    bits = random_bits(seed, n) >> np.uint64(1)
    vals = (bits % np.uint64(high - low)).astype(np.int64) + low
    return torch.from_numpy(vals.reshape(tuple(shape)))


def with_outlier_channels(x: torch.Tensor, seed: int, count: int = 4, factor: float = 1000.0) -> torch.Tensor:
    """Scale ``count`` channels of the last axis by ``factor`` (LLM activation outliers)."""
    channels = integers(seed, (count,), 0, x.shape[-1])
    y = x.to(torch.float64).clone()
    y[..., channels] *= factor
    return y.to(x.dtype)


def from_bits(bits: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of ``dtype`` whose elements have exactly the given bit patterns."""
    int_dtype = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    width = torch.finfo(dtype).bits
    signed = [b - (1 << width) if b >= 1 << (width - 1) else b for b in bits]
    return torch.tensor(signed, dtype=int_dtype).view(dtype)


def special_values(dtype: torch.dtype) -> torch.Tensor:
    """±0, ±inf, NaN, the smallest subnormal, the largest subnormal, the smallest normal, the
    largest finite value, and 1 ± 1 ulp — in ``dtype``."""
    if dtype == torch.float32:
        bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x00000001, 0x807FFFFF,
                0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800001, 0x3F7FFFFF]
    elif dtype == torch.bfloat16:
        bits = [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x3F81, 0x3F7F]
    elif dtype == torch.float16:
        bits = [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C01, 0x3BFF]
    else:
        raise TypeError(f"special_values: unsupported dtype {dtype}; expected float32, bfloat16 or float16")
    return from_bits(bits, dtype)
