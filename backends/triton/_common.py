"""Host-side helpers shared by the Triton op modules (CUDA and ROCm): dtype codes, launch options, bit constants."""

from __future__ import annotations

import functools
import struct

import torch

#: output dtype -> ``OUT`` code of ``_tl_exact.cast_out``
OUT_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

#: every launch passes these (R1: no contraction; Triton 3.10 changes the default, so explicit)
LAUNCH = {"enable_fp_fusion": False}


@functools.lru_cache(maxsize=None)
def _sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (CUs on ROCm builds of torch, which present AMD GPUs as "cuda" devices);
    cached per device index."""
    return _sms_of(device.index if device.index is not None else torch.cuda.current_device())


def f32_bits(value: float) -> int:
    """The binary32 encoding of ``value`` rounded once (RNE) to fp32, as a signed int32."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous 2-D ``[rows, last]`` view (a copy only if x is not contiguous)."""
    return x.contiguous().reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)


def pow2_block(n: int, lo: int = 16, hi: int = 1 << 16) -> int:
    """The power of two >= n, clamped to [lo, hi] (plain Python: ``triton.next_power_of_2`` costs ~3 us a call)."""
    return max(lo, min(hi, 1 << (max(1, n) - 1).bit_length()))


def warps_for(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 8192 else 16


def next_pow2(n: int) -> int:
    """The power of two >= n (0 for 0), as ``triton.next_power_of_2``, in plain Python (that one costs ~3 us a
    host call: it is a ``constexpr_function``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for positive ints, in plain Python (``triton.cdiv`` costs ~3 us a host call)."""
    return -(-a // b)


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` contiguous on ``device``: the public attention ops take their offsets, lengths and block
    tables on q's device or on the CPU (read on the host), and a kernel can only read device memory."""
    return (t if t.device == device else t.to(device)).contiguous()

