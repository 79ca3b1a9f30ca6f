"""An example out-of-tree rlkernel backend: ``rms_norm`` and ``silu_mul`` for CPU tensors.

It shows the whole of what a vendor writes: this class of facts, one module per op, and the
entry point in ``pyproject.toml``. The kernels are plain PyTorch written from the contracts'
documented bits (docs/numerics.md and each contract's ``Bitwise semantics``), independently
of rlkernel's own backends; ``rlkernel conformance --backend example`` checks them bit for bit.

The built-in ``cpu`` backend already serves CPU tensors, so this one is *forced only*
(``priority < 0``): installing it changes nobody's results. Use it with
``RLKERNEL_BACKEND=example``, ``rlkernel.use_backend("example")`` or ``--backend example``. A
backend for a new device type would take a priority ``>= 0`` to be chosen by default.
"""

from __future__ import annotations

import platform
from typing import ClassVar

import torch

from rlkernel.backend import Backend


class ExampleBackend(Backend):
    """Two ops on CPU tensors, forced only."""

    name = "example"
    device_types = ("cpu",)
    package = "rlkernel_example_backend"
    #: every other op raises KernelNotFound (conformance: not_supported), naming the backends that have it
    kernels: ClassVar[dict[str, str]] = {
        "rms_norm": "rms_norm:rms_norm",
        "silu_mul": "silu_mul:silu_mul",
    }
    #: "verified" only once a conformance report for the architecture is committed
    verification: ClassVar[dict[str, str]] = {"*": "unverified"}
    priority = -1  # forced only: never replaces the default cpu backend

    def probe(self) -> tuple[bool, str]:
        """Nothing to probe: plain PyTorch on the CPU."""
        return True, "plain PyTorch on the CPU"

    def architecture(self, device: torch.device) -> str:
        return platform.machine()
