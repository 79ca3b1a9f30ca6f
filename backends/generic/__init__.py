"""The device-generic backend: plain tensor ops that are exact on any IEEE device.

Digit GEMMs run on the device's own matmul (exact per R4), sums are integer sums, and
elementwise math is R1 operations and the contract exp/log built from them. It never calls a
contract's reference. As ``cpu`` it serves CPU tensors by default; as ``generic`` it can be
forced (``RLKERNEL_BACKEND=generic``) onto any device, e.g. CUDA, Ascend NPU or MUSA.
"""

from __future__ import annotations

import platform
from typing import ClassVar

import torch

from rlkernel.backend import Backend

#: op -> "module:function" inside this package; the same table serves ``cpu`` and ``generic``.
KERNELS = {
    "embedding": "embedding:embedding",
    "linear": "linear:linear",
    "linear_exponents": "linear:linear_exponents",
    "linear_partial": "linear:linear_partial",
    "linear_finish": "linear:linear_finish",
    "rms_norm": "rms_norm:rms_norm",
    "rope": "rope:rope",
    "silu_mul": "silu_mul:silu_mul",
    "softmax": "softmax:softmax",
    "log_softmax": "softmax:log_softmax",
    "token_logprobs": "token_logprobs:token_logprobs",
    "token_logprobs_partial": "token_logprobs:token_logprobs_partial",
    "token_logprobs_finish": "token_logprobs:token_logprobs_finish",
    "attention": "attention:attention",
    "attention_paged": "attention:attention_paged",
    "all_reduce": "all_reduce:all_reduce",
    "sample": "sample:sample",
    "group_advantages": "rl:group_advantages",
    "ppo_loss": "rl:ppo_loss",
    "kl_k3": "rl:kl_k3",
    "masked_mean": "rl:masked_mean",
}


class GenericBackend(Backend):
    """Device-generic exact kernels on any device type (forced only)."""

    name = "generic"
    device_types = ("cpu", "cuda", "npu", "musa", "xpu")
    package = "rlkernel.backends.generic"
    kernels = KERNELS
    #: sm_90: the full suite passed on an H200 (conformance/results/generic-cuda-sm_90-H200.json);
    #: on the CPU the same kernels serve the ``cpu`` backend, whose level is its own
    verification: ClassVar[dict[str, str]] = {"sm_90": "verified"}
    priority = -1  # never chosen by default: it must be asked for

    def architecture(self, device: torch.device) -> str:
        if device.type == "cuda" and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return f"sm_{major}{minor}"
        if device.type == "cpu":
            return platform.machine()
        return device.type
