"""Dispatch: pick the backend for the op and the inputs' device, run its kernel, record what ran.

The backend is chosen per op (:func:`rlkernel.registry.select`: the best usable backend of the
device that has the op, or the forced one, which never falls through).
``rlkernel.trace()`` collects ``(op, kernel)`` records of every call inside it, and
``rlkernel.last_kernel()`` names the kernel of the most recent call in this thread, so a
user can always see which backend and kernel produced a result.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
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


def call(op: str, device: torch.device, /, **kwargs: Any) -> Any:
    """Run ``op`` on the backend serving ``device`` with keyword arguments ``kwargs``."""
    backend = select(op, device)
    fn = backend.kernel(op)
    name = backend.kernel_name(op)
    state = _state()
    state.last = name
    for records in state.traces:
        records.append((op, name))
    logger.debug("rlkernel: %s -> %s", op, name)
    return fn(**kwargs)
