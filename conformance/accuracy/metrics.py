"""Error metrics of an output against its float64 truth (accuracy, never bits).

Every metric compares ``out`` (any float dtype) with ``truth`` (float64, same shape). The ulp
histogram counts, per element, how many representable values of the output dtype lie between
``out`` and the truth rounded to that dtype: 0 means the output is the correctly rounded truth.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: ulp-distance buckets of the histogram: 0, 1, 2-3, 4-15, >= 16 (and non-finite mismatches)
ULP_BUCKETS = ("0", "1", "2-3", "4-15", ">=16")

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """Bit patterns of ``t`` mapped to integers that are monotone in the float value."""
    bits = t.contiguous().view(_INT_VIEW[t.dtype]).to(torch.int64)
    width = torch.finfo(t.dtype).bits
    sign = bits < 0
    magnitude = bits & ((1 << (width - 1)) - 1)
    return torch.where(sign, -magnitude, magnitude)


#: significand bits (with the implicit one) and the frexp exponent of the smallest normal
_FORMAT = {torch.float32: (24, -125), torch.bfloat16: (8, -125), torch.float16: (11, -13)}


def round_to(truth: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 ``truth`` correctly rounded (half to even) to ``dtype``, in one rounding.

    torch's float64 -> bfloat16/float16 casts go through float32 on some builds (two
    roundings), so the rounding is done here on the float64 value: the quantum at each
    element's exponent (subnormals included), ``round`` (half-even, exact in float64), then an
    exact cast; values beyond the format's range become +-inf.
    """
    bits, emin = _FORMAT[dtype]
    t = truth.to(torch.float64)
    _, e = torch.frexp(t)
    quantum = torch.ldexp(torch.ones_like(t), torch.clamp(e, min=emin) - bits)
    rounded = torch.where(torch.isfinite(t) & (t != 0), torch.round(t / quantum) * quantum, t)
    return rounded.to(dtype)


def ulp_distance(out: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Integer ulp distance between ``out`` and ``RN_dtype(truth)`` in ``out``'s dtype (int64)."""
    return (_ordered(out) - _ordered(round_to(truth, out.dtype))).abs()


def ulp_histogram(out: torch.Tensor, truth: torch.Tensor) -> dict[str, int]:
    """Counts per :data:`ULP_BUCKETS` (finite elements whose truth is finite in the output dtype)."""
    rounded = round_to(truth, out.dtype)
    ok = torch.isfinite(out) & torch.isfinite(rounded)
    d = ulp_distance(out[ok], truth[ok])
    edges = [(0, 0), (1, 1), (2, 3), (4, 15), (16, None)]
    counts = {}
    for name, (lo, hi) in zip(ULP_BUCKETS, edges):
        sel = d >= lo if hi is None else (d >= lo) & (d <= hi)
        counts[name] = int(sel.sum())
    return counts


def tensor_errors(out: torch.Tensor, truth: torch.Tensor, rel_floor: float = 1e-3) -> dict[str, Any]:
    """Relative errors of ``out`` against ``truth``.

    Returns ``rel_l2`` (``||out - t|| / ||t||``), ``max_rel`` and ``median_rel`` (``|out - t| / |t|``
    over elements with ``|t| >= rel_floor * max |t|``, so that outputs near zero from
    cancellation do not dominate), ``max_abs``, ``nonfinite`` (elements where exactly one of
    the two is non-finite) and the ulp histogram in ``out``'s dtype.
    """
    o = out.detach().to("cpu", torch.float64).reshape(-1)
    t = truth.detach().to("cpu", torch.float64).reshape(-1)
    finite = torch.isfinite(o) & torch.isfinite(t)
    nonfinite = int((torch.isfinite(o) != torch.isfinite(t)).sum())
    o, t = o[finite], t[finite]
    err = (o - t).abs()
    norm = float(t.norm())
    rel_l2 = float(err.norm()) / norm if norm > 0 else float(err.norm())
    big = t.abs() >= rel_floor * float(t.abs().max()) if t.numel() else t.abs() > 0
    rel = err[big] / t[big].abs()
    hist = ulp_histogram(out.detach().cpu().reshape(-1), truth.detach().cpu().reshape(-1)) \
        if out.dtype in _INT_VIEW else {}
    return {
        "rel_l2": rel_l2,
        "max_rel": float(rel.max()) if rel.numel() else 0.0,
        "median_rel": float(rel.median()) if rel.numel() else 0.0,
        "max_abs": float(err.max()) if err.numel() else 0.0,
        "nonfinite": nonfinite,
        "ulp": hist,
    }


def logprob_errors(out: torch.Tensor, truth: torch.Tensor) -> dict[str, Any]:
    """Token log-prob errors: ``max_abs``/``median_abs`` of ``out - t`` and the importance-ratio
    error ``max |exp(out - t) - 1|`` (what an unchanged policy's ratio would be off by)."""
    o = out.detach().to("cpu", torch.float64).reshape(-1)
    t = truth.detach().to("cpu", torch.float64).reshape(-1)
    d = o - t
    finite = torch.isfinite(d)
    d = d[finite]
    base = tensor_errors(out, truth)
    base.update({
        "max_abs": float(d.abs().max()) if d.numel() else 0.0,
        "median_abs": float(d.abs().median()) if d.numel() else 0.0,
        "max_ratio_err": float(torch.expm1(d).abs().max()) if d.numel() else 0.0,
        "nonfinite": int((~finite).sum()),
    })
    return base


def fmt(value: float) -> str:
    """A metric for a Markdown table: 3 significant digits, 0 as ``0``."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    return f"{value:.2e}"
