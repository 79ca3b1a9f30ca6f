"""The ``ascend`` backend: the device-generic exact kernels on Huawei Ascend NPUs (``torch_npu``, device ``npu``).

Selected by device: when ``torch_npu`` is installed and an NPU is present, ``npu`` tensors run
here by default. Level ``unverified``: no Ascend hardware was available to this project, so no
conformance report exists. The kernels are the generic ones, verified on the CPU (the ``cpu``
backend) and on an H200 (the ``generic`` backend forced onto CUDA); whether torch_npu implements
each primitive exactly (docs/generic-primitives.md; int64 arithmetic on the AI Core is the known
risk) is what ``rlkernel conformance --backend ascend`` checks first (the primitive probes).

Integer sums: ``int_width = "auto"``. On first use the int64 primitive probes run on the NPU; if
any is wrong or unsupported there, the generic path's wide integer work (P10 superaccumulator,
fixed-point sums, ``exact_sum``, ``sqrt_rn``, counts, the digit products' combine, all_reduce)
runs on int32 limbs instead: the same bits from int32 ``+ - & >> <<`` and int32 ``scatter_add``,
which the Ascend operator lists support (docs/generic-primitives.md cites them, and lists what
still takes int64 there).
``RLKERNEL_GENERIC_INT=int32`` forces the int32 limbs without probing.
"""

from __future__ import annotations

from rlkernel.backends._vendor_generic import VendorGenericBackend

__all__ = ["AscendBackend"]


class AscendBackend(VendorGenericBackend):
    """The generic kernels on ``npu`` tensors (torch_npu)."""

    name = "ascend"
    device_types = ("npu",)
    plugin = "torch_npu"
    install = "install CANN first, then pip install 'rlkernel[ascend]'"
    #: int64 on the AI Core is the known risk (AI CPU fallbacks, no INT64 in some scatter-add operators)
    int_width = "auto"

    def import_plugin(self) -> None:
        import torch_npu  # noqa: F401  (registers the device type and torch.npu)
