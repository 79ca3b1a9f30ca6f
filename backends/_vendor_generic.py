"""A device-generic backend for a vendor's torch plugin (Ascend ``torch_npu``, Moore Threads ``torch_musa``).

These vendors' GPUs/NPUs run the device-generic exact kernels (``backends/generic/``): integer and
IEEE-elementwise torch operations only, whose results are the contract's bits on any device that
implements them exactly (the primitive set: docs/generic-primitives.md). What a vendor backend
adds is only the facts: which plugin module makes the device type exist, how to see a device
without initialising it, what to call its architecture.

A vendor backend also declares which integer primitives the generic sums use on its device
(``int_width``): ``int64`` (the default), ``int32`` (the int32-limb formulation, same bits, for
a device whose int64 arithmetic is not exact) or ``auto`` (the int64 primitive probes decide on
first use; backends/generic/_exact/intpath.py). ``RLKERNEL_GENERIC_INT=int32`` forces the int32
limbs everywhere.

The probe imports the plugin (that is what registers ``torch.npu`` / ``torch.musa`` and the
device type) and asks the plugin's device module whether a device is present; it never
allocates on the device.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from rlkernel.backends.generic import GenericBackend
from rlkernel.backends.generic._exact import intpath


class VendorGenericBackend(GenericBackend):
    """The generic kernels on the device type of a vendor's torch plugin (default for that type)."""

    #: the plugin module (``torch_npu``) and the torch attribute it installs (``torch.npu``)
    plugin: ClassVar[str] = ""
    #: install hint for the probe's message
    install: ClassVar[str] = ""
    priority = 100
    #: no conformance report from this vendor's hardware exists: unverified everywhere
    verification: ClassVar[dict[str, str]] = {"*": "unverified"}
    #: integer primitives of the generic sums on this device: "int64", "int32" (limbs) or "auto" (probed)
    int_width: ClassVar[str] = "int64"

    def import_plugin(self) -> None:
        """Import the vendor plugin (it registers the device type and ``torch.<device type>``)."""
        importlib.import_module(self.plugin)

    def device_module(self) -> Any:
        """``torch.<device type>`` as the plugin installs it (None when absent)."""
        return getattr(torch, self.device_types[0], None)

    def probe(self) -> tuple[bool, str]:
        if importlib.util.find_spec(self.plugin) is None:
            return False, f"{self.plugin} is not installed ({self.install})"
        try:
            self.import_plugin()
        except Exception as exc:  # a plugin that fails to import is reported, never ignored
            return False, f"{self.plugin} failed to import: {type(exc).__name__}: {exc}"
        module = self.device_module()
        if module is None or not hasattr(module, "is_available"):
            return False, f"{self.plugin} imported but torch.{self.device_types[0]} is missing"
        if not module.is_available():
            return False, f"{self.plugin} is installed but no {self.device_types[0]} device is present"
        count = module.device_count() if hasattr(module, "device_count") else "?"
        for device_type in self.device_types:
            if device_type != "cpu":
                intpath.set_device_width(device_type, self.int_width)
        return True, (f"{self.plugin} with {count} {self.device_types[0]} device(s); device-generic exact kernels "
                      f"(integer sums: {self.int_width})")

    def kernel(self, op: str) -> Callable[..., Any]:
        """The generic kernel; for an op that still needs exact int64 arithmetic
        (:data:`intpath.INT64_OPS`), one that refuses to run on a device whose int64 probes failed."""
        fn = super().kernel(op)
        if op not in intpath.INT64_OPS or getattr(fn, "_int64_guarded", False):
            return fn

        @functools.wraps(fn)
        def guarded(**kwargs: Any) -> Any:
            device = next((v.device for v in kwargs.values() if isinstance(v, torch.Tensor)), None)
            why = intpath.int64_unreliable(device) if device is not None else None
            if why:
                raise RuntimeError(
                    f"{self.name}: {op} needs exact int64 arithmetic, which the probes found wrong on {device} "
                    f"({why}); its generic kernel has no int32-limb formulation yet "
                    f"(docs/generic-primitives.md lists the ops that have one). Its bits would be wrong here, so "
                    f"it does not run: run this op on another device, or report the failing probe to the "
                    f"plugin's vendor")
            return fn(**kwargs)

        guarded._int64_guarded = True  # type: ignore[attr-defined]
        self._cache[op] = guarded
        return guarded

    def architecture(self, device: torch.device) -> str:
        module = self.device_module()
        if module is not None and hasattr(module, "get_device_name"):
            return str(module.get_device_name(device)).replace(" ", "_")
        return device.type
