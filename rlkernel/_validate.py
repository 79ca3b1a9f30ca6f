"""Input validation shared by the public ops: errors that say what was given and how to fix it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
HALF = (torch.bfloat16, torch.float16)


def tensor(op: str, name: str, t: object) -> torch.Tensor:
    """``t`` must be a tensor."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def dtype(op: str, name: str, t: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """``t.dtype`` must be one of ``allowed``."""
    if t.dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{op}: {name} has dtype {str(t.dtype).replace('torch.', '')}; expected one of {names}. "
                        f"Cast it with .to(...)")


def ndim(op: str, name: str, t: torch.Tensor, dims: int | Sequence[int], axes: str) -> None:
    """``t`` must have ``dims`` dimensions, named by ``axes`` in the message."""
    allowed = (dims,) if isinstance(dims, int) else tuple(dims)
    if t.dim() not in allowed:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected {axes}")


def same_device(op: str, tensors: Iterable[tuple[str, torch.Tensor | None]]) -> torch.device:
    """All given tensors share one device; returns it."""
    items = [(n, t) for n, t in tensors if t is not None]
    device = items[0][1].device
    for n, t in items[1:]:
        if t.device != device:
            raise ValueError(f"{op}: {n} is on {t.device} but {items[0][0]} is on {device}; "
                             f"move all inputs to one device")
    return device


def same_dtype(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {a_name} is {a.dtype} but {b_name} is {b.dtype}; cast one so they match")


def dim_size(op: str, name: str, t: torch.Tensor, axis: int, expected: int, what: str) -> None:
    if t.shape[axis] != expected:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; its axis {axis} must be {what} = {expected}")


def int_range(t: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer tensor in one host read (one sync: a decode step paid
    two with ``int(t.min()), int(t.max())``). ``min`` and ``max``, not ``aminmax``: the generic
    backend's primitives (docs/generic-primitives.md) are what every vendor's torch must have."""
    lo, hi = torch.stack((t.min(), t.max())).tolist()
    return int(lo), int(hi)


def capturing(device: torch.device) -> bool:
    """A CUDA graph is being captured on ``device``'s current stream.

    The host cannot read device values during a capture, so the ops skip the checks that read
    them (id and position ranges, offsets, block tables) and launch with what the shapes tell;
    the capturing caller vouches for the values (``rlkernel.rollout``'s decode graphs build them
    itself). Shape, dtype and device checks still run.
    """
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def contiguous(t: torch.Tensor) -> torch.Tensor:
    """Non-contiguous inputs are accepted and copied to a contiguous layout (documented per op)."""
    return t if t.is_contiguous() else t.contiguous()


class IdOutOfRange(ValueError):
    """Raised by a kernel that checks gathered ids itself (``embedding`` on Triton): ``index`` is
    the flat index of the first id outside ``[0, V)``; the public op turns it into its message."""

    def __init__(self, op: str, index: int) -> None:
        super().__init__(f"{op}: the id at flat index {index} is outside [0, V)")
        self.index = index
