"""Shared by the RL ops (``masked_mean``, ``ppo_loss``, ``kl_k3``, ``group_advantages``): modes,
partial layout, host constants and input checks. Private: the public names are in the op modules
and :mod:`rlkernel.rl`."""

from __future__ import annotations

import math

import torch

from rlkernel import _validate as v

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: int64 slots of a masked-mean partial: 20 superaccumulator slots (P10) + the count.
PARTIAL_SLOTS = 21
#: Partials merge exactly while the total number of terms stays below this (P10 carry limb).
MAX_TERMS = 1 << 41


def fp32_of(value: float) -> float:
    """RN32 of a Python number, via float64 (host constant, R8): the float64 holding the fp32 value."""
    return float(torch.tensor(float(value), dtype=torch.float64).to(torch.float32))


def number(op: str, name: str, value: object, example: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a Python float, got {type(value).__name__}; pass e.g. {example}")
    if isinstance(value, int) and abs(value) >= 1 << 53:
        raise ValueError(f"{op}: {name} = {value} is too large to be rounded exactly once to fp32 "
                         f"(|value| < 2**53 expected); pass it as a float")
    return float(value)


def denominator_of(op: str, denominator: object) -> float | None:
    """The denominator rounded once to fp32 (as a Python float), validated: finite and > 0."""
    if denominator is None:
        return None
    d = number(op, "denominator", denominator, "denominator=global_token_count")
    d32 = fp32_of(d) if math.isfinite(d) else d  # beyond fp32's range: inf, refused below
    if not math.isfinite(d32) or d32 <= 0:
        raise ValueError(f"{op}: denominator = {denominator!r} rounds to {d32!r} in fp32; expected a finite value "
                         f"> 0 (the global token or sequence count), or None to divide by this batch's count")
    return d32


def mode_of(op: str, mode: object) -> str:
    if mode not in MODES:
        raise ValueError(f"{op}: mode = {mode!r}; expected one of {', '.join(MODES)} "
                         f"(verl's loss_agg_mode names)")
    return str(mode)


def fp32_tensor(op: str, name: str, t: object) -> torch.Tensor:
    t = v.tensor(op, name, t)
    v.dtype(op, name, t, (torch.float32,))
    return t


def mask_of(op: str, mask: object, shape: torch.Size) -> torch.Tensor:
    m = v.tensor(op, "mask", mask)
    if m.dtype != torch.bool:
        raise TypeError(f"{op}: mask has dtype {str(m.dtype).replace('torch.', '')}; expected bool "
                        f"(True for the tokens that count). Convert it with mask.bool() or mask > 0")
    if m.shape != shape:
        raise ValueError(f"{op}: mask has shape {tuple(m.shape)}; expected the shape of the values "
                         f"{tuple(shape)} ([B, T])")
    return m


def check_terms(op: str, count: int) -> None:
    if count >= MAX_TERMS:
        raise ValueError(f"{op}: {count} terms exceed the superaccumulator bound 2**41 of one reduction; "
                         f"split the batch and merge partials (rlkernel.rl.merge_partials)")
