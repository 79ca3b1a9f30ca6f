"""The thing under test: a backend on a device, or the reference on the CPU.

A target calls an op by name with CPU inputs and returns its outputs on the CPU. A backend
target resolves the op with :func:`rlkernel.public.public_op` (``rlkernel.ops.<op>``), moves
every input tensor to the device (recursively in lists, tuples and dicts) and calls it inside
:func:`rlkernel.dispatch.use_backend`, recording which kernels ran.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from rlkernel.conformance.cases import reference_of
from rlkernel.dispatch import trace, use_backend
from rlkernel.public import public_op

#: ``resolve(op) -> callable``; replaceable for tests.
OpResolver = Callable[[str], Callable[..., Any]]


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` with every tensor (recursively in lists, tuples and dict values) moved to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def to_cpu(obj: Any) -> Any:
    """``obj`` with every tensor detached and moved to the CPU, structure kept."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu")
    return to_device(obj, torch.device("cpu"))


class BackendTarget:
    """Backend ``name`` on ``device``: the subject of a conformance run."""

    is_reference = False

    def __init__(self, name: str, device: torch.device, architecture: str, resolve: OpResolver | None = None):
        self.name = name
        self.device = device
        self.architecture = architecture
        self._resolve = resolve or public_op
        #: kernels (``backend:module.function``) that ran during the latest call
        self.last_kernels: list[str] = []

    def call(self, module: ModuleType, op: str, inputs: dict[str, Any]) -> Any:
        """Run ``op`` on the backend with ``inputs`` moved to the device; outputs on the CPU."""
        fn = self._resolve(op)
        moved = to_device(inputs, self.device)
        with use_backend(self.name), trace() as calls:
            out = fn(**moved)
        self.last_kernels = sorted({kernel for _, kernel in calls})
        return to_cpu(out)


class ReferenceTarget:
    """The contracts' reference implementations on the CPU (checked against the manifest)."""

    is_reference = True
    name = "reference"

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.architecture = platform.machine() or "unknown"
        self.last_kernels: list[str] = []

    def call(self, module: ModuleType, op: str, inputs: dict[str, Any]) -> Any:
        self.last_kernels = [f"reference:{module.__name__.rsplit('.', 1)[-1]}.{op}"]
        return to_cpu(reference_of(module, op)(**inputs))


Target = BackendTarget | ReferenceTarget
