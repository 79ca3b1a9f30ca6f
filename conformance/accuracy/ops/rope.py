"""``rope`` against float64, next to Hugging Face's rotary embedding (fp32 cos/sin cast to bf16).

Native: ``inv_freq = 1 / theta**(arange(0, D, 2) / D)`` and the angles in fp32, cos/sin cast to
the input dtype, ``x * cos + rotate_half(x) * sin`` in that dtype (``Qwen3RotaryEmbedding`` +
``apply_rotary_pos_emb``). Truth: float64 angles and float64 rotation of the bf16 inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

THETA = 1e6
SHAPES = {"small": (256, 4, 128), "full": (4096, 32, 128)}


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def _angles(positions: torch.Tensor, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.int64, device=positions.device).to(dtype) / d))
    freqs = positions.to(dtype)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None, :], emb.sin()[:, None, :]


def _run(max_position: int) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        t, h, d = SHAPES[size]
        name = f"rope/{max_position}/{size}"
        x = data.randn(f"{name}/x", (t, h, d)).to(device)
        pos = data.randint(f"{name}/p", (t,), 0, max_position).to(device)
        cos, sin = _angles(pos, d, torch.float64)
        truth = x.double() * cos + _rotate_half(x.double()) * sin
        with torch.no_grad():
            ours = rlkernel.ops.rope(x, pos, theta=THETA)
            c32, s32 = _angles(pos, d, torch.float32)
            native = x * c32.to(x.dtype) + _rotate_half(x) * s32.to(x.dtype)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("HF rotary (fp32 angles, bf16 cos/sin)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    sets = [("positions_4k", "positions < 4096, x ~ N(0,1) bf16", _run(4096)),
            ("positions_32k", "positions < 32768 (long context)", _run(32768))]
    return [Measurement("rope", name, desc, "rel_l2", run, shape=lambda size: "T x H x D = {} x {} x {}".format(
        *SHAPES[size])) for name, desc, run in sets]
