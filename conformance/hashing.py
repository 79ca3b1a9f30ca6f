"""Canonical bytes and SHA-256 of op outputs: the only equality conformance knows.

Bitwise means bitwise (docs/design.md, "Conformance"): two outputs are equal when their dtypes, shapes and bytes
are equal after NaN canonicalisation (R6). Bytes are little-endian, row-major, contiguous.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch

from rlkernel.contracts._contract import as_tensors

#: The canonical NaN bit pattern per float dtype (R6), as a signed integer of the same width.
CANONICAL_NAN_BITS: dict[torch.dtype, int] = {
    torch.float32: 0x7FC00000,
    torch.bfloat16: 0x7FC0,
    torch.float16: 0x7E00,
    torch.float64: 0x7FF8000000000000,
}

#: Integer dtype of the same width, used to read a tensor's raw bits.
_INT_VIEW: dict[int, torch.dtype] = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` (CPU, contiguous) reinterpreted as an integer tensor of the same element width."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_complex():
        raise TypeError(f"conformance hashing: complex outputs are not supported (got {t.dtype})")
    return t.view(_INT_VIEW[t.element_size()])


def canonical(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, contiguous, every NaN replaced by the canonical NaN of its dtype.

    Floating-point dtypes outside :data:`CANONICAL_NAN_BITS` (float8 variants) are passed
    through unchanged: their NaN encodings are unique or absent.
    """
    t = t.detach().to("cpu").contiguous()
    if t.is_floating_point() and t.dtype in CANONICAL_NAN_BITS:
        nan = torch.isnan(t)
        if bool(nan.any()):
            bits = bits_view(t).clone()
            bits[nan] = CANONICAL_NAN_BITS[t.dtype]  # positive, so it fits the signed view
            t = bits.view(t.dtype)
    return t


def canonical_bytes(t: torch.Tensor) -> bytes:
    """The raw little-endian bytes of ``canonical(t)``, read through an integer view."""
    c = canonical(t)
    if c.numel() == 0:
        return b""
    arr = bits_view(c).numpy()
    return arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()


def flatten(outputs: Any) -> Sequence[torch.Tensor]:
    """An op output (tensor or nested tuple/list of tensors) as a flat list of tensors."""
    return as_tensors(outputs)


def sha256_of(outputs: Any) -> str:
    """SHA-256 over ``f"{dtype}|{list(shape)}|"`` + canonical bytes of each output tensor, in order."""
    h = hashlib.sha256()
    for t in flatten(outputs):
        h.update(f"{t.dtype}|{list(t.shape)}|".encode())
        h.update(canonical_bytes(t))
    return h.hexdigest()


def first_difference(expected: Any, actual: Any) -> str | None:
    """Where two outputs first differ, for a failure message; ``None`` if they are equal.

    Returns a one-line description: the output index, and either the dtype/shape mismatch or
    the first differing flat index with both values and their bits in hex.
    """
    exp, act = flatten(expected), flatten(actual)
    if len(exp) != len(act):
        return f"expected {len(exp)} output tensor(s), got {len(act)}"
    for i, (e, a) in enumerate(zip(exp, act)):
        where = f"output {i}: " if len(exp) > 1 else ""
        if e.dtype != a.dtype or tuple(e.shape) != tuple(a.shape):
            return f"{where}expected {e.dtype}{list(e.shape)}, got {a.dtype}{list(a.shape)}"
        eb, ab = bits_view(canonical(e)).reshape(-1), bits_view(canonical(a)).reshape(-1)
        diff = (eb != ab).nonzero()
        if diff.numel():
            k = int(diff[0])
            ev, av = canonical(e).reshape(-1)[k], canonical(a).reshape(-1)[k]
            width = 2 * e.element_size()
            mask = (1 << (8 * e.element_size())) - 1
            return (
                f"{where}first difference at flat index {k} of {eb.numel()} ({int(diff.numel())} differ): "
                f"expected {_value(ev)} (0x{int(eb[k]) & mask:0{width}x}), "
                f"got {_value(av)} (0x{int(ab[k]) & mask:0{width}x})"
            )
    return None


def _value(v: torch.Tensor) -> str:
    if v.is_floating_point():
        return repr(float(v))
    return repr(int(v)) if v.dtype != torch.bool else repr(bool(v))
