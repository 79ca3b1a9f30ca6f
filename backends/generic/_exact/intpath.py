"""Which integer primitives the generic path's sums run on a device: int64 (default) or int32 limbs.

The exact sums of the generic path (the P10 superaccumulator of :mod:`superacc`, the fixed-point
sum of :mod:`fixed`, the scatter of ``exact_sum_partial``) are written twice: on int64
(:mod:`superacc`, :mod:`fixed`) and on int32 limbs (:mod:`superacc32`, :mod:`fixed32`, over the
primitive layer :mod:`limbs32`), with the same bits. Their entry points ask :func:`int32` which
one to run for the tensors' device. The choice, first match wins:

1. :func:`use_width` (a context, for tests and callers that force one path);
2. the environment variable ``RLKERNEL_GENERIC_INT`` = ``int32`` or ``int64`` (every device);
3. the width a backend declared for the device type (:func:`set_device_width`; the ``ascend``
   backend declares ``auto``): ``auto`` runs :data:`INT64_PROBES` once on the device against
   the CPU and picks int32 limbs if any of them is wrong or unsupported there;
4. int64.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

ENV = "RLKERNEL_GENERIC_INT"
WIDTHS = ("int64", "int32")
_forced: ContextVar[str | None] = ContextVar("rlkernel_generic_int", default=None)
#: device type -> "int64" | "int32" | "auto" (declared by backends)
_declared: dict[str, str] = {}
#: device type -> the width ``auto`` resolved to, and why
_resolved: dict[str, tuple[str, str]] = {}


def _check(width: str, where: str) -> str:
    if width not in WIDTHS:
        raise ValueError(f"{where} = {width!r}; expected one of {WIDTHS} (int32: the int32-limb sums for devices "
                         f"whose int64 arithmetic is not exact)")
    return width


@contextmanager
def use_width(width: str) -> Iterator[None]:
    """Run the generic path's sums with ``width`` (``int64`` / ``int32``) on every device inside the block."""
    token = _forced.set(_check(width, "use_width"))
    try:
        yield
    finally:
        _forced.reset(token)


def set_device_width(device_type: str, width: str) -> None:
    """Declare the width for ``device_type`` tensors: ``int64``, ``int32`` or ``auto`` (probe on first use)."""
    if width != "auto":
        _check(width, f"set_device_width({device_type!r})")
    _declared[device_type] = width
    _resolved.pop(device_type, None)


def width(device: torch.device | str) -> str:
    """The width the generic sums use for tensors on ``device``."""
    forced = _forced.get()
    if forced is not None:
        return forced
    env = os.environ.get(ENV, "").strip()
    if env:
        return _check(env, ENV)
    device = torch.device(device)
    declared = _declared.get(device.type, "int64")
    if declared != "auto":
        return declared
    if device.type not in _resolved:
        failures = int64_probe_failures(device)
        _resolved[device.type] = ("int32", "; ".join(failures)) if failures else ("int64", "int64 probes pass")
    return _resolved[device.type][0]


def int32(device: torch.device | str) -> bool:
    """Whether the generic sums run on int32 limbs for tensors on ``device``."""
    return width(device) == "int32"


#: Ops whose generic kernels still run int64 arithmetic when the sums take int32 limbs (the list
#: docs/generic-primitives.md generates from a trace; tests/test_int32_limbs.py keeps the two equal).
#: On a device whose int64 probes failed they are refused (:func:`int64_unreliable`), not run.
INT64_OPS = frozenset({
    "attention", "attention_backward", "attention_paged", "embedding", "exact_sum_partial", "linear",
    "linear_exponents", "linear_finish", "linear_partial", "linear_weight_digits", "rope", "rope_backward", "sample",
    "token_entropy", "token_entropy_backward", "token_logprobs", "token_logprobs_backward",
    "token_logprobs_backward_finish", "token_logprobs_backward_partial", "token_logprobs_finish",
    "token_logprobs_partial",
})


def int64_unreliable(device: torch.device | str) -> str | None:
    """Why int64 arithmetic is not exact on ``device`` (the failed probes), or None.

    Only a device whose backend declared ``auto`` and whose probes failed is unreliable; forcing
    int32 (``use_width``, ``RLKERNEL_GENERIC_INT``) changes the sums, not what the device can do.
    """
    device = torch.device(device)
    if _declared.get(device.type) != "auto":
        return None
    width(device)  # resolves ``auto`` on first use
    chosen, why = _resolved.get(device.type, ("int64", ""))
    return why if chosen == "int32" else None


def resolved() -> dict[str, tuple[str, str]]:
    """What ``auto`` chose per device type so far, and why (for reports)."""
    return dict(_resolved)


# ------------------------------------------------------------------------------- int64 probes
# The int64 primitives the int64 sums rely on, run on the device and on the CPU (exact integers)
# and compared bit for bit. rlkernel.conformance.primitives reports them with the other probes.


def int64_probe_inputs() -> dict[str, torch.Tensor]:
    """CPU inputs of :data:`INT64_PROBES`: values near 2**61 and past 2**53 (where float detours lose bits)."""
    g = torch.Generator().manual_seed(20240613)
    big = torch.tensor([2**62 - 1, -(2**62), 2**53 + 1, 3, -(2**40) - 7], dtype=torch.int64)
    return {"big": big, "i64": torch.randint(-(2**61), 2**61, (4096,), generator=g, dtype=torch.int64)}


#: name -> (what it checks, function of the inputs on one device); each returns tensors compared on bits
INT64_PROBES: dict[str, tuple[str, Callable[[dict[str, Any]], tuple[torch.Tensor, ...]]]] = {
    "int64_add_mul_shift": ("int64 +, *, <<, >> without wrap-around or float detours",
                            lambda t: ((t["i64"] >> 3) + (t["i64"] >> 5) * 3, t["big"] << 1, t["big"] >> 7)),
    "int64_sum": ("an int64 sum of values near 2**61 is exact (no float accumulation)",
                  lambda t: (t["i64"].sum(), (t["i64"] >> 2).cumsum(0))),
    "int64_compare_max": ("int64 comparisons and max beyond 2**53",
                          lambda t: (t["big"].amax(), t["big"] > 2**53, torch.maximum(t["big"], t["big"].flip(0)))),
    "scatter_gather_int64": ("scatter_add / gather on int64 keep every bit",
                             lambda t: (torch.zeros(8, dtype=torch.int64, device=t["i64"].device).scatter_add_(
                                 0, (t["i64"] & 7).abs(), t["i64"] >> 4), t["i64"].gather(0, (t["big"] & 15).abs()))),
}


def run_probes(probes: dict[str, tuple[Any, ...]], inputs: dict[str, torch.Tensor],
               device: torch.device | str) -> list[dict[str, Any]]:
    """Each probe on ``device`` against the CPU: ``[{name, checks, status, detail}]`` (pass|fail|error).

    A probe is ``(checks, fn)``, the expected bits being ``fn`` on the CPU, or ``(checks, fn,
    expected)`` where the CPU's own torch op is not the IEEE result (``expected(inputs)`` computes it
    exactly on the CPU).
    """
    device = torch.device(device)
    results = []
    for name, (checks, fn, *exact) in probes.items():
        try:
            expected = (exact[0] if exact else fn)(inputs)
            actual = fn({k: v.to(device) for k, v in inputs.items()})
            bad = [i for i, (e, a) in enumerate(zip(expected, actual)) if not torch.equal(_bits(e), _bits(a))]
            detail = f"output {bad[0]} differs from the CPU's IEEE/exact result" if bad else ""
            results.append({"name": name, "checks": checks, "status": "fail" if bad else "pass", "detail": detail})
        except Exception as exc:  # an unsupported op on the device is a finding, not a crash
            results.append({"name": name, "checks": checks, "status": "error",
                            "detail": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return results


def int64_probe_failures(device: torch.device | str) -> list[str]:
    """``name: detail`` of each int64 probe that fails or errors on ``device`` (empty: int64 is exact there)."""
    results = run_probes(INT64_PROBES, int64_probe_inputs(), device)
    return [f"{r['name']}: {r['status']} {r['detail']}".strip() for r in results if r["status"] != "pass"]


def _bits(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bool:
        return x.to(torch.int8)
    return x.view({8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[x.element_size()])
