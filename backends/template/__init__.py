"""A template backend: copy this package to start a new vendor backend. It is never registered.

A backend is a small class of facts plus an op table (docs/design.md, "Dispatch and backends"). Kernels live
in per-op modules beside this file (``rms_norm.py`` defining ``rms_norm(**inputs)``) and are
imported on first use. Copy the package (in-tree as ``backends/<vendor>/`` and add it to
``rlkernel.registry._BUILTINS``, or out of tree as your own package registered through the
entry-point group ``rlkernel.backends``), rename the class, fill in the hooks, then run
``rlkernel conformance --backend <name>`` on the hardware. See ``docs/adding-a-backend.md``.

Rules every kernel follows (``docs/numerics.md``): no ``rlkernel.contracts`` import (import-linter
fails the build), no fallback to another backend, NaN-canonical outputs, exact integer sums.
"""

from __future__ import annotations

import importlib.util
from typing import ClassVar

import torch

from rlkernel.backend import Backend

#: op name -> "module:function", the module relative to this package. Leave an op out rather
#: than point it at a slow or inexact path: a missing op raises KernelNotFound, naming the
#: backends that have it, and conformance reports it as not_supported.
KERNELS: dict[str, str] = {
    # "rms_norm": "rms_norm:rms_norm",
    # "linear": "linear:linear",
}


class TemplateBackend(Backend):
    """Example vendor backend: ``<Vendor>Backend`` serving ``<device>`` tensors."""

    #: unique name, used by RLKERNEL_BACKEND, --backend and reports
    name = "template"
    #: torch device types served (``"npu"``, ``"musa"``; ROCm presents itself as ``"cuda"``)
    device_types = ("template",)
    #: the package that holds the kernel modules of ``kernels``
    package = "rlkernel.backends.template"
    kernels = KERNELS
    #: architecture -> "verified" | "compiled" | "unverified"; "verified" only once a conformance
    #: report for that architecture is committed under conformance/results/
    verification: ClassVar[dict[str, str]] = {"*": "unverified"}
    #: lower wins when several usable backends serve one device type; < 0 means "only if forced"
    priority = 50

    def probe(self) -> tuple[bool, str]:
        """Cheap availability check: is the vendor runtime importable? Never initialise a device here,
        and never import the vendor's torch extension at module import time (it may break ``import
        torch`` when its driver stack is absent)."""
        if importlib.util.find_spec("vendor_torch_extension") is None:
            return False, "vendor_torch_extension is not installed (pip install 'rlkernel[vendor]')"
        return True, "vendor runtime importable"

    def architecture(self, device: torch.device) -> str:
        """Short architecture name keyed by ``verification`` and written into conformance reports
        (``sm_90``, ``gfx942``, ``ascend910b``)."""
        return device.type

    def static_checks(self, ops: list[str] | None = None) -> list[tuple[str, str, bool, str]]:
        """Optional: compile the kernels for each target without the hardware and scan the code for
        forbidden instructions (approximate exp/log/div/rsqrt, flush-to-zero, contracted fma, float
        atomics in reductions). Each result is ``(op, case, passed, detail)``; conformance records
        them as kind ``static``. ``ops`` is the ``--op`` filter of ``rlkernel conformance`` (None:
        every op): compile only those ops' kernels. Delete the method if there is nothing to check
        statically."""
        return []
