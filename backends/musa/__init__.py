"""The ``musa`` backend: the device-generic exact kernels on Moore Threads GPUs (``torch_musa``, device ``musa``).

Selected by device: when ``torch_musa`` is installed and a MUSA device is present, ``musa``
tensors run here by default. Level ``unverified``: no MUSA hardware was available to this
project, so no conformance report exists. The kernels are the generic ones, verified on the CPU
and on an H200; whether torch_musa implements each primitive exactly
(docs/generic-primitives.md) is what ``rlkernel conformance --backend musa`` checks first.
"""

from __future__ import annotations

from rlkernel.backends._vendor_generic import VendorGenericBackend

__all__ = ["MusaBackend"]


class MusaBackend(VendorGenericBackend):
    """The generic kernels on ``musa`` tensors (torch_musa)."""

    name = "musa"
    device_types = ("musa",)
    plugin = "torch_musa"
    install = "torch_musa comes from Moore Threads' wheels for your MUSA SDK, not from PyPI"

    def import_plugin(self) -> None:
        import torch_musa  # noqa: F401  (registers the device type and torch.musa)
