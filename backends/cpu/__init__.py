"""The ``cpu`` backend: the device-generic kernels serving CPU tensors (the default there)."""

from __future__ import annotations

import platform
from typing import ClassVar

import torch

from rlkernel.backends.generic import KERNELS, GenericBackend


class CpuBackend(GenericBackend):
    """Default backend for ``cpu`` tensors: vectorised, float32/int64 digit GEMMs, chunked."""

    name = "cpu"
    device_types = ("cpu",)
    kernels = KERNELS
    # Levels per architecture; "verified" only with a committed report in conformance/results/.
    verification: ClassVar[dict[str, str]] = {"x86_64": "verified"}
    priority = 100

    def architecture(self, device: torch.device) -> str:
        return platform.machine()
