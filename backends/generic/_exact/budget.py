"""Temporaries budgets of the chunked generic kernels, per device.

The generic kernels (``token_logprobs``, its backward, ``token_entropy``) walk the vocabulary
and the tokens in blocks whose temporaries stay under a budget in bytes. Their sums are exact,
so the block sizes change no bit; they change only the memory held and the number of torch
operations. On the CPU the module constants are the budgets. On an accelerator every torch
operation costs about the same host time (10-20 us of dispatch and launch) whatever its size,
so a budget made for the CPU leaves the device idle between small launches (the H200 trainer
profile at a78ccc7: ``token_logprobs_backward`` of 128 tokens ran 124 k torch operations,
1.8 s of host time for 0.65 s of kernels). There the budgets are multiplied by
:func:`budget_scale`: one per :data:`MEMORY_UNIT` of device memory, at most :data:`MAX_SCALE`.
"""

from __future__ import annotations

import functools

import torch

#: device memory per unit of the scale factor
MEMORY_UNIT = 8 << 30
#: largest factor (an H200's 141 GB gives 16: token_logprobs_backward's extra memory
#: ``LOGITS_BYTES + 4 * WORK_BYTES`` becomes 4.5 GiB instead of 288 MiB)
MAX_SCALE = 16


@functools.cache
def _device_memory(device_type: str, index: int) -> int | None:
    """Total memory of device ``index`` in bytes, from ``torch.<type>.get_device_properties``
    (CUDA, ROCm, torch_npu and torch_musa all have it); None where the device module lacks it."""
    properties = getattr(getattr(torch, device_type, None), "get_device_properties", None)
    total = getattr(properties(index), "total_memory", None) if properties is not None else None
    return int(total) if total is not None else None


def budget_scale(device: torch.device) -> int:
    """The factor of the budgets on ``device``: 1 on the CPU (and where the memory is unknown),
    else ``clamp(memory // MEMORY_UNIT, 1, MAX_SCALE)``."""
    if device.type == "cpu":
        return 1
    index = device.index
    if index is None:
        current = getattr(getattr(torch, device.type, None), "current_device", None)
        if current is None:
            return 1
        index = int(current())
    total = _device_memory(device.type, index)
    return 1 if total is None else max(1, min(MAX_SCALE, total // MEMORY_UNIT))
