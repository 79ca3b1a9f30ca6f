"""The ``rocm`` backend: the shared Triton kernels (``backends/triton/``) on AMD Instinct GPUs.

Facts only: kernels and launchers are ``rlkernel.backends.triton``'s, run with the ``ROCM`` target
(``backends/triton/targets.py``: wavefronts of 64, tiles that fit 64 KiB of LDS, int8 MFMA).

Selection: ROCm builds of torch present AMD GPUs as device type ``cuda`` (as Triton notes: "when
using hip devices, the device string in pytorch is 'cuda'"). The two builds are told apart by
``torch.version.hip``: set, this backend is usable and the ``cuda`` backend is not; unset, the
reverse. The architecture is the device's ``gcnArchName`` without its feature flags
(``gfx942:sramecc+:xnack-`` -> ``gfx942``).

Levels: ``compiled`` for gfx942 (MI300X/MI325X), gfx90a (MI250X) and gfx950 (MI350X): every kernel
compiles for them with Triton on a CPU machine and passes the AMD static checks
(``static_checks.py``; report in ``conformance/results/rocm-static/``). No conformance run on AMD
hardware exists yet, so none is ``verified``.
"""

from __future__ import annotations

import importlib.util
from typing import ClassVar

import torch

from rlkernel.backends.triton import KERNELS, TritonBackend
from rlkernel.backends.triton.targets import ROCM

__all__ = ["KERNELS", "RocmBackend"]


class RocmBackend(TritonBackend):
    """The shared Triton kernels on AMD Instinct GPUs (torch ROCm builds)."""

    name = "rocm"
    device_types = ("cuda",)  # a ROCm build of torch calls its AMD GPUs "cuda"
    target = ROCM
    #: every kernel compiles for these and passes the AMD static checks (conformance/results/rocm-static/);
    #: no conformance run on AMD hardware yet
    verification: ClassVar[dict[str, str]] = {"gfx942": "compiled", "gfx90a": "compiled", "gfx950": "compiled"}
    priority = 10

    def probe(self) -> tuple[bool, str]:
        hip = getattr(torch.version, "hip", None)
        if not hip:  # an rlkernel extra cannot fix this: torch itself must change
            return False, (f"the installed torch {torch.__version__} is not a ROCm build (torch.version.hip is "
                           f"unset); install a ROCm build of torch (https://pytorch.org/get-started/locally/)")
        if importlib.util.find_spec("triton") is None:
            return False, ("triton is not installed; ROCm builds of torch bring it (pytorch-triton-rocm): reinstall "
                           "torch from the ROCm index")
        return True, f"torch ROCm (HIP {hip}), triton available"

    def architecture(self, device: torch.device) -> str:
        props = torch.cuda.get_device_properties(device)
        return str(getattr(props, "gcnArchName", "gfx?")).split(":")[0]

    def static_checks(self, ops: list[str] | None = None) -> list[tuple[str, str, bool, str]]:
        """Compile the kernels of ``ops`` (default: every kernel) for each architecture of the ROCm
        target without a GPU and scan the AMDGCN (``static_checks.py``)."""
        from .static_checks import static_checks

        return static_checks(ops)

    def static_report(self, ops: list[str] | None = None, archs: list[str] | None = None) -> dict:
        """The static checks with every kernel's code hash, for ``rlkernel static`` (the committed report)."""
        from .static_checks import report

        return report(ops, archs)
