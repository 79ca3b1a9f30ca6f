"""Backend discovery and per-op selection: built-ins plus the entry-point group ``rlkernel.backends``.

At first use every backend class is instantiated and probed cheaply; the result, and which
backend serves which op on each device type, is logged at INFO once.

Selection is per op. For tensors on device type ``d``, op ``op`` runs on the usable backend
that serves ``d``, declares ``op`` and has the lowest ``priority`` (ties: the order of
discovery, built-ins first); backends with a negative priority are used only when forced. A
plugin that implements a few ops for the CPU therefore takes those ops, and every other op
still runs on the built-in ``cpu`` backend.

A forced backend (``RLKERNEL_BACKEND=name``, :func:`rlkernel.use_backend`, ``--backend``)
runs every op or raises: it never falls through to another backend. A missing op raises
:class:`~rlkernel.backend.KernelNotFound` naming the backends that do have it.
"""

from __future__ import annotations

import importlib
import logging
import os
from importlib.metadata import entry_points

import torch

from rlkernel.backend import Backend, KernelNotFound

logger = logging.getLogger(__name__)

_BUILTINS = (
    "rlkernel.backends.cpu:CpuBackend",
    "rlkernel.backends.generic:GenericBackend",
    "rlkernel.backends.cuda:CudaBackend",
    "rlkernel.backends.rocm:RocmBackend",
    "rlkernel.backends.ascend:AscendBackend",
    "rlkernel.backends.musa:MusaBackend",
)

#: The environment variable that forces a backend for every call.
ENV = "RLKERNEL_BACKEND"

_backends: dict[str, Backend] | None = None
_probes: dict[str, tuple[bool, str]] = {}
#: (op, device type) -> backend chosen by default, valid while _facts() is unchanged
_chosen: dict[tuple[str, str], Backend] = {}
_chosen_for: tuple[object, ...] = ()


def _load(target: str) -> type[Backend]:
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)  # type: ignore[no-any-return]


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
    for device_type, ops in serving_table().items():
        logger.info("rlkernel: %s ops: %s", device_type, describe_serving(ops))
    return found


def probe_results() -> dict[str, tuple[bool, str]]:
    """``name -> (usable, reason)`` for every backend and failed plugin."""
    all_backends()
    return dict(_probes)


def _usable(backend: Backend) -> bool:
    return _probes.get(backend.name, (False, ""))[0]


def get_backend(name: str) -> Backend:
    """The backend called ``name``; a clear error lists the known names."""
    backends = all_backends()
    if name not in backends:
        raise ValueError(f"unknown backend {name!r}; known backends: {sorted(backends)}")
    return backends[name]


def backends_with(op: str) -> list[str]:
    """Names of the backends that implement ``op`` (on any device type)."""
    return [name for name, b in all_backends().items() if b.has(op)]


def default_backends(device_type: str) -> list[Backend]:
    """The usable backends chosen by default for ``device_type`` tensors, best first.

    Forced-only backends (``priority < 0``) are left out; ties keep the order of discovery.
    """
    serving = [b for b in all_backends().values() if b.priority >= 0 and _serves(b, device_type) and _usable(b)]
    return sorted(serving, key=lambda b: b.priority)  # stable: discovery order breaks ties


def _serves(backend: Backend, device_type: str) -> bool:
    try:
        device = torch.device(device_type)
    except RuntimeError:  # a vendor type (npu, musa) torch does not know until the vendor's module renames
        return device_type in backend.device_types  # PrivateUse1; the info listing must not fail on it
    return backend.serves(device)


def serving_table() -> dict[str, dict[str, str]]:
    """``device_type -> {op: backend name}``: who runs each op by default, per device type."""
    device_types: list[str] = []
    for b in all_backends().values():
        if b.priority >= 0 and _usable(b):
            device_types += [d for d in b.device_types if d not in device_types]
    table: dict[str, dict[str, str]] = {}
    for device_type in device_types:
        ops: dict[str, str] = {}
        for backend in default_backends(device_type):
            for op in backend.kernels:
                ops.setdefault(op, backend.name)
        table[device_type] = dict(sorted(ops.items()))
    return table


def describe_serving(ops: dict[str, str]) -> str:
    """One line: each backend with the ops it serves (``acme: linear, rms_norm; cpu: 19 other ops``)."""
    by_backend: dict[str, list[str]] = {}
    for op, name in ops.items():
        by_backend.setdefault(name, []).append(op)
    if len(by_backend) == 1:
        name, names = next(iter(by_backend.items()))
        return f"{name} (all {len(names)} ops)"
    parts = []
    for name, names in by_backend.items():
        parts.append(f"{name}: {', '.join(names)}" if len(names) <= 8 else f"{name}: {len(names)} ops")
    return "; ".join(parts)


# --------------------------------------------------------------------------- forcing


def forced_text(name: str, source: str | None) -> str:
    """How the user forced ``name``, in their words: ``--backend cuda``, ``RLKERNEL_BACKEND='cuda'``."""
    if source == "--backend":
        return f"--backend {name}"
    if source == ENV:
        return f"{ENV}={name!r}"
    if source == "use_backend":
        return f"rlkernel.use_backend({name!r})"
    return f"forced backend {name!r}"


def _undo_hint(source: str | None) -> str:
    if source == "--backend":
        return "Pass another --backend or leave it out (rlkernel info lists the usable backends)"
    if source == ENV:
        return f"Unset {ENV} or set it to another backend (rlkernel info lists the usable backends)"
    if source == "use_backend":
        return "Choose another backend in rlkernel.use_backend(...) or call outside the block"
    return "Force another backend, or none"


def resolve_forced(forced: str | None, source: str | None = None) -> tuple[str | None, str | None]:
    """The forced backend and where it came from: ``forced`` (with ``source``), else ``$RLKERNEL_BACKEND``."""
    if forced:
        return forced, source
    env = os.environ.get(ENV) or None
    return (env, ENV) if env else (None, None)


def forced_backend(device_type: str, forced: str, source: str | None = None) -> Backend:
    """The forced backend ``forced``, checked usable here and serving ``device_type``.

    Raises
    ------
    ValueError
        Unknown backend name.
    RuntimeError
        It is not usable here, or does not serve ``device_type`` tensors.
    """
    backend = get_backend(forced)
    ok, reason = probe_results()[backend.name]
    text = forced_text(forced, source)
    if not ok:
        raise RuntimeError(f"{text}: backend {forced!r} is not usable here: {reason}. {_undo_hint(source)}")
    if not backend.serves(torch.device(device_type)):
        raise RuntimeError(f"{text}: backend {forced!r} serves {backend.device_types}, not {device_type!r} tensors. "
                           f"Move the tensors to a device it serves. {_undo_hint(source)}")
    return backend


# --------------------------------------------------------------------------- selection


def _nobody_serves(device_type: str) -> RuntimeError:
    reasons = [f"{b.name}: {_probes.get(b.name, (False, 'not probed'))[1]}"
               for b in all_backends().values() if _serves(b, device_type) and b.priority >= 0]
    why = "; ".join(reasons) if reasons else "no installed backend declares this device type"
    return RuntimeError(
        f"no usable rlkernel backend serves {device_type!r} tensors ({why}). Fix what the probe reports, "
        f"install a backend plugin for this device, or move the tensors to the CPU"
    )


def backend_for(device_type: str, forced: str | None = None, source: str | None = None) -> Backend:
    """The backend chosen for ``device_type`` as a whole: the forced one, else the best usable one.

    Used where one backend stands for a device (the conformance target). Ops are dispatched
    with :func:`select`, which may pick a different backend per op.

    Raises
    ------
    RuntimeError
        A forced backend that is not usable or does not serve the device, or a device nobody serves.
    """
    forced, source = resolve_forced(forced, source)
    if forced:
        return forced_backend(device_type, forced, source)
    candidates = default_backends(device_type)
    if not candidates:
        raise _nobody_serves(device_type)
    return candidates[0]


def _facts() -> tuple[object, ...]:
    """What a default choice depends on: the backends, their probes, device types and priorities."""
    backends = all_backends()
    return (id(backends), tuple(_probes.items()),
            tuple((b.name, b.device_types, b.priority, len(b.kernels)) for b in backends.values()))


def select(op: str, device_type: str, forced: str | None = None, source: str | None = None) -> Backend:
    """The backend that runs ``op`` on ``device_type`` tensors (module docstring: the rule).

    Parameters
    ----------
    op : str
        The op name (``rms_norm``).
    device_type : str
        ``cpu``, ``cuda``, ...
    forced : str, optional
        A backend name that must run the op; default ``$RLKERNEL_BACKEND``.
    source : str, optional
        Where ``forced`` came from, for messages: ``"--backend"``, ``"use_backend"`` or
        ``"RLKERNEL_BACKEND"``.

    Raises
    ------
    KernelNotFound
        The forced backend, or every usable backend of the device, lacks ``op``; the message
        names the backends that have it.
    RuntimeError
        A forced backend that cannot serve here, or a device no usable backend serves.
    """
    forced, source = resolve_forced(forced, source)
    if forced:
        backend = forced_backend(device_type, forced, source)
        if not backend.has(op):
            others = [b for b in backends_with(op) if b != backend.name]
            raise KernelNotFound(
                f"{forced_text(forced, source)}: backend {forced!r} has no kernel for {op!r}; backends that do: "
                f"{others or 'none'}. A forced backend never falls through to another. {_undo_hint(source)}"
            )
        return backend
    global _chosen_for
    facts = _facts()
    if facts != _chosen_for:  # a backend, probe, device type or priority changed (tests patch them)
        _chosen.clear()
        _chosen_for = facts
    cached = _chosen.get((op, device_type))
    if cached is not None:
        return cached
    candidates = default_backends(device_type)
    if not candidates:
        raise _nobody_serves(device_type)
    for backend in candidates:
        if backend.has(op):
            _chosen[(op, device_type)] = backend
            return backend
    others = backends_with(op)
    raise KernelNotFound(
        f"no usable backend for {device_type!r} tensors has a kernel for {op!r} (usable here: "
        f"{[b.name for b in candidates]}); backends that do: {others or 'none'}. Run on a device those backends "
        f"serve, or install a backend that implements {op!r} for {device_type!r}"
    )
