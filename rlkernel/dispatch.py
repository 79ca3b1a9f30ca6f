"""Dispatch: pick the backend for the op and the inputs' device, run its kernel, record what ran.

The backend is chosen per op (:func:`rlkernel.registry.select`: the best usable backend of the
device that has the op, or the forced one, which never falls through).
``rlkernel.trace()`` collects ``(op, kernel)`` records of every call inside it, and
``rlkernel.last_kernel()`` names the kernel of the most recent call in this thread, so a
user can always see which backend and kernel produced a result.

Autograd: :func:`call` is the one place every public op passes through, so it is where an op
without a backward refuses inputs that require grad (grad mode on): it raises
:class:`BackwardNotDefined` at the call, instead of letting the kernel's internal tensor ops
record a graph whose gradients are wrong. Ops with a backward run their kernels inside an
``autograd.Function`` (grad mode is off there); ops whose outputs are integers that end a
computation (sampled tokens, row exponents, exact loss partials) call it under ``no_grad``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlkernel import registry
from rlkernel.backend import Backend

logger = logging.getLogger(__name__)

_local = threading.local()


def _state() -> threading.local:
    if not hasattr(_local, "forced"):
        _local.forced = None
        _local.last = None
        _local.traces = []
    return _local


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Force backend ``name`` for calls in this thread (like ``RLKERNEL_BACKEND``; it wins over it).

    Every op inside the block runs on ``name`` or raises: an op it lacks raises
    :class:`~rlkernel.backend.KernelNotFound` naming the backends that have it. ``None`` lifts
    an outer forcing (``RLKERNEL_BACKEND`` still applies).
    """
    state = _state()
    previous = state.forced
    state.forced = name
    try:
        yield
    finally:
        state.forced = previous


@contextlib.contextmanager
def trace() -> Iterator[list[tuple[str, str]]]:
    """Collect ``(op, kernel)`` for every rlkernel op called inside the block."""
    state = _state()
    records: list[tuple[str, str]] = []
    state.traces.append(records)
    try:
        yield records
    finally:
        state.traces.remove(records)


def last_kernel() -> str | None:
    """The qualified kernel name of the latest op call in this thread (``cpu:rms_norm.rms_norm``)."""
    return _state().last


def note_kernel(path: str) -> None:
    """Called by a kernel that picks among several paths, to report the path it took.

    The latest record becomes ``backend:module.function[path]``.
    """
    state = _state()
    base = (state.last or "?").split("[")[0]
    state.last = f"{base}[{path}]"
    for records in state.traces:
        if records:
            records[-1] = (records[-1][0], state.last)


def select(op: str, device: torch.device) -> Backend:
    """The backend that will run ``op`` for tensors on ``device`` (raises if none can)."""
    forced = _state().forced
    return registry.select(op, device.type, forced, "use_backend" if forced else None)


class BackwardNotDefined(RuntimeError):
    """An op without a backward was called on inputs that require grad, with grad mode on."""


def _needing_grad(name: str, value: Any) -> list[str]:
    if isinstance(value, torch.Tensor):
        return [name] if value.requires_grad else []
    if isinstance(value, (list, tuple)):
        return [n for i, item in enumerate(value) for n in _needing_grad(f"{name}[{i}]", item)]
    return []


def refuse_grad(op: str, inputs: Mapping[str, Any]) -> None:
    """Raise :class:`BackwardNotDefined` if grad mode is on and a tensor in ``inputs`` requires grad.

    Tensors inside lists and tuples are checked too (``partials[1]``). :func:`call` runs this for
    every op; a public op calls it itself where it computes on its inputs before dispatching.
    """
    if not torch.is_grad_enabled():
        return
    names = [n for name, value in inputs.items() for n in _needing_grad(name, value)]
    if not names:
        return
    which = ", ".join(names)
    verb = "requires" if len(names) == 1 else "require"
    raise BackwardNotDefined(
        f"rlkernel.ops.{op}: backward is not defined yet, and {which} {verb} grad (grad mode is on). An "
        f"autograd graph through this op would give wrong gradients, so it is refused here (exact backward "
        f"contracts come in a later release). To run the forward only, pass detached inputs "
        f"({names[0].split('[')[0]}.detach()), or call it under torch.no_grad() or torch.inference_mode()"
    )


def call(op: str, device: torch.device, /, **kwargs: Any) -> Any:
    """Run ``op`` on the backend serving ``device`` with keyword arguments ``kwargs``.

    Raises
    ------
    BackwardNotDefined
        Grad mode is on and a tensor argument requires grad (see the module docstring).
    """
    refuse_grad(op, kwargs)
    backend = select(op, device)
    fn = backend.kernel(op)
    name = backend.kernel_name(op)
    state = _state()
    state.last = name
    for records in state.traces:
        records.append((op, name))
    logger.debug("rlkernel: %s -> %s", op, name)
    return fn(**kwargs)
