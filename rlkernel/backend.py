"""The backend interface: a small class of facts plus an op table.

A backend is found by the device of the input tensors (docs/design.md, "Dispatch and backends"). Its class states which
torch device types it serves, how to probe cheaply that it can run (no device
initialisation), which kernels it has, and its verification level per architecture. Kernels
live in per-op modules and are imported lazily on first use.

This module imports nothing else of rlkernel: :mod:`rlkernel.registry` finds and selects
backends and imports it, never the other way round.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

#: Verification levels, honest by construction (README backend table).
LEVELS = ("verified", "compiled", "unverified")


class KernelNotFound(RuntimeError):
    """No backend that may run the op has a kernel for it; the message names those that do."""


class Backend:
    """Base class of every backend.

    Subclasses set the class attributes and may override :meth:`probe` and
    :meth:`architecture`. ``kernels`` maps an op name to ``"module:function"``, the module
    relative to the backend's package (``"rms_norm:rms_norm"``).
    """

    name: ClassVar[str] = ""
    device_types: ClassVar[tuple[str, ...]] = ()
    package: ClassVar[str] = ""
    kernels: ClassVar[Mapping[str, str]] = {}
    #: architecture -> level, e.g. {"sm_90": "verified"}; "*" covers any architecture
    verification: ClassVar[Mapping[str, str]] = {}
    #: per op, the usable backend with the lowest priority that declares the op runs it (plugins
    #: may undercut the built-ins for the ops they have); < 0: used only when forced
    priority: ClassVar[int] = 100

    def __init__(self) -> None:
        self._cache: dict[str, Callable[..., Any]] = {}

    def probe(self) -> tuple[bool, str]:
        """Cheap availability check: ``(usable, reason)``. Never initialises a device."""
        return True, "always available"

    def serves(self, device: torch.device) -> bool:
        """Whether this backend runs kernels on ``device``."""
        return device.type in self.device_types

    def architecture(self, device: torch.device) -> str:
        """A short architecture name for ``device`` (``"x86_64"``, ``"sm_90"``)."""
        return device.type

    def level(self, device: torch.device) -> str:
        """The verification level of this backend on ``device``'s architecture."""
        arch = self.architecture(device)
        return self.verification.get(arch, self.verification.get("*", "unverified"))

    def has(self, op: str) -> bool:
        return op in self.kernels

    def kernel(self, op: str) -> Callable[..., Any]:
        """The kernel function for ``op``; :class:`KernelNotFound` if there is none."""
        fn = self._cache.get(op)
        if fn is not None:
            return fn
        target = self.kernels.get(op)
        if target is None:
            # which other backends have it is the registry's to say (rlkernel.registry.select)
            raise KernelNotFound(f"backend {self.name!r} has no kernel for {op!r}; `rlkernel info` lists which "
                                 f"backend serves which op")
        module_name, func_name = target.split(":")
        module = importlib.import_module(f"{self.package}.{module_name}")
        fn = getattr(module, func_name)
        self._cache[op] = fn
        return fn

    def kernel_name(self, op: str) -> str:
        """The qualified name reported for ``op`` (``cpu:rms_norm.rms_norm``)."""
        return f"{self.name}:{self.kernels.get(op, '?').replace(':', '.')}"
