"""Backend discovery: built-ins plus the entry-point group ``rlkernel.backends``.

At first use every backend class is instantiated and probed cheaply; the result is logged at
INFO once. ``RLKERNEL_BACKEND=name`` forces one backend for every device it serves; if it
cannot serve the device of a call, that call raises — nothing falls back.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points

from rlkernel.backend import Backend

logger = logging.getLogger(__name__)

_BUILTINS = (
    "rlkernel.backends.cpu:CpuBackend",
    "rlkernel.backends.generic:GenericBackend",
    "rlkernel.backends.cuda:CudaBackend",
)

_backends: dict[str, Backend] | None = None
_probes: dict[str, tuple[bool, str]] = {}


def _load(target: str) -> type[Backend]:
    import importlib

    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)


def all_backends() -> dict[str, Backend]:
    """Every known backend by name, probed once (built-ins first, then plugins)."""
    global _backends
    if _backends is not None:
        return _backends
    found: dict[str, Backend] = {}
    classes: list[type[Backend]] = [_load(t) for t in _BUILTINS]
    for ep in entry_points(group="rlkernel.backends"):
        try:
            classes.append(ep.load())
        except Exception as exc:  # a broken plugin is reported, never silently dropped
            _probes[f"plugin:{ep.name}"] = (False, f"failed to load: {exc!r}")
            logger.warning("rlkernel: backend plugin %s failed to load: %r", ep.name, exc)
    for cls in classes:
        backend = cls()
        if backend.name in found:
            raise RuntimeError(f"two backends are named {backend.name!r}; rename the plugin")
        found[backend.name] = backend
        _probes[backend.name] = backend.probe()
        logger.info("rlkernel: backend %s (%s): %s", backend.name, ",".join(backend.device_types),
                    _probes[backend.name][1])
    _backends = found
    return found


def probe_results() -> dict[str, tuple[bool, str]]:
    """``name -> (usable, reason)`` for every backend and failed plugin."""
    all_backends()
    return dict(_probes)


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a clear error lists the known names."""
    backends = all_backends()
    if name not in backends:
        raise ValueError(f"unknown backend {name!r}; known backends: {sorted(backends)}")
    return backends[name]


def backends_with(op: str) -> list[str]:
    """Names of the backends that implement ``op``."""
    return [name for name, b in all_backends().items() if b.has(op)]


def backend_for(device_type: str, forced: str | None = None) -> Backend:
    """The backend serving ``device_type``: the forced one, else the best usable one.

    ``forced`` defaults to ``RLKERNEL_BACKEND``. A forced backend that does not serve the
    device, or a device nobody serves, raises ``RuntimeError``.
    """
    import torch

    device = torch.device(device_type)
    forced = forced or os.environ.get("RLKERNEL_BACKEND") or None
    if forced:
        backend = get_backend(forced)
        ok, reason = probe_results()[backend.name]
        if not ok:
            raise RuntimeError(f"RLKERNEL_BACKEND={forced!r} is not usable here: {reason}")
        if not backend.serves(device):
            raise RuntimeError(
                f"backend {forced!r} serves {backend.device_types}, not {device.type!r} tensors; "
                f"move the tensors or unset RLKERNEL_BACKEND"
            )
        return backend
    candidates = [
        b for b in all_backends().values() if b.serves(device) and probe_results()[b.name][0] and b.priority >= 0
    ]
    if not candidates:
        raise RuntimeError(
            f"no usable rlkernel backend serves {device.type!r} tensors; probes: {probe_results()}. "
            f"Install the vendor extra (pip install 'rlkernel[cuda]' ...) or move the tensors to the CPU"
        )
    return min(candidates, key=lambda b: b.priority)
