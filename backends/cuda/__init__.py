"""The ``cuda`` backend: the shared Triton kernels (``backends/triton/``) on NVIDIA GPUs.

Facts only: the kernels and their launchers are ``rlkernel.backends.triton``'s, run with the
``CUDA`` target (``backends/triton/targets.py``: tiles, warps of 32, sm_90 static checks). The
probe is cheap: it checks that torch was built for CUDA (not ROCm, which also presents ``cuda``
devices) and that Triton is importable, without initialising a device.
"""

from __future__ import annotations

import importlib.util
from typing import ClassVar

import torch

from rlkernel.backends.triton import KERNELS, TritonBackend
from rlkernel.backends.triton.targets import CUDA

__all__ = ["KERNELS", "CudaBackend"]

class CudaBackend(TritonBackend):
    """The shared Triton kernels on NVIDIA GPUs."""

    name = "cuda"
    device_types = ("cuda",)
    target = CUDA
    #: sm_90: the full conformance suite ran on an H200 with 0 failures
    #: (conformance/results/cuda-sm_90-H200/report.json: 727 passed, commit 5b07cf8)
    verification: ClassVar[dict[str, str]] = {"sm_90": "verified"}
    priority = 10

    def probe(self) -> tuple[bool, str]:
        # when using hip devices, the device string in pytorch is "cuda": that is the rocm backend
        if getattr(torch.version, "hip", None):
            return False, "torch is a ROCm build; the rocm backend serves its cuda devices"
        if torch.version.cuda is None:  # an rlkernel extra cannot fix this: torch itself must change
            return False, (f"the installed torch {torch.__version__} was built without CUDA; install a CUDA build "
                           f"of torch (https://pytorch.org/get-started/locally/)")
        if importlib.util.find_spec("triton") is None:
            return False, "triton is not installed (pip install 'rlkernel[cuda]')"
        return True, f"torch CUDA {torch.version.cuda}, triton available"

    def architecture(self, device: torch.device) -> str:
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"

    def static_checks(self, ops: list[str] | None = None) -> list[tuple[str, str, bool, str]]:
        """Compile the kernels of ``ops`` (default: every kernel) for sm_90 without a GPU and scan
        the PTX (``static_checks.py``)."""
        from .static_checks import static_checks

        return static_checks(ops)
