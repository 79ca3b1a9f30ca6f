"""Input checks shared by the optimizer ops (``adamw``, ``sgd``): errors that name the value and the fix."""

from __future__ import annotations

import math

import torch

from rlkernel import _validate as v

__all__ = ["hyper", "state_tensors"]


def state_tensors(op: str, tensors: dict[str, torch.Tensor]) -> torch.device:
    """Tensors, float32 (``grad`` may be bf16/fp16), all of the first one's shape and on one device: that device."""
    (first, ref), *_ = tensors.items()
    for name, t in tensors.items():
        v.tensor(op, name, t)
        v.dtype(op, name, t, v.FLOATS if name == "grad" else (torch.float32,))
        if t.shape != ref.shape:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected {first}'s shape {tuple(ref.shape)}")
    return v.same_device(op, list(tensors.items()))


def hyper(name: str, value: object, low: float, high: float | None, low_open: bool, fix: str,
           op: str = "adamw") -> float:
    """A finite float in [low, high) (or (low, high) with ``low_open``), else an error naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{op}: {name} = {value!r}; expected a finite number ({fix})")
    value = float(value)
    if value < low or (low_open and value == low) or (high is not None and value >= high):
        bound = f"{'>' if low_open else '>='} {low:g}" + (f" and < {high:g}" if high is not None else "")
        raise ValueError(f"{op}: {name} = {value!r}; expected {bound} ({fix})")
    return value
