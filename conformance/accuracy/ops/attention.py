"""``attention`` against float64, next to PyTorch SDPA (FlashAttention on the H200) on the same device.

Native: ``F.scaled_dot_product_attention`` in the input dtype, causal, ``enable_gqa=True``,
one call per sequence. Truth: float64 softmax attention of the same bf16 inputs. Data:
ordinary and peaked scores, outlier q/k channels, long context, and attention sinks — key 0
of every sequence scores ``gap`` nats above the largest other key for every query, with a
value vector 1e-3 of the others or exactly 0 (trained LLMs put a sink on the first token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result


@dataclass(frozen=True)
class Shape:
    hq: int
    hkv: int
    d: int
    #: (query length, key length) per sequence; causal, bottom-right aligned
    seqs: tuple[tuple[int, int], ...]

    def describe(self) -> str:
        return f"Hq={self.hq} Hkv={self.hkv} D={self.d}, (lq, lk) = {list(self.seqs)}"


SHAPES = {"small": Shape(4, 2, 64, ((384, 384), (200, 200))), "full": Shape(32, 8, 128, ((2048, 2048), (1000, 1000)))}
LONG = {"small": Shape(4, 2, 64, ((32, 4096),)), "full": Shape(32, 8, 128, ((64, 32768),))}


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: Shape, double: bool) -> torch.Tensor:
    """Per-sequence causal attention of packed [T, H, D] tensors by SDPA (float64 for the truth)."""
    outs, qs, ks = [], 0, 0
    for lq, lk in shape.seqs:
        qi, ki, vi = (t.transpose(0, 1) for t in (q[qs:qs + lq], k[ks:ks + lk], v[ks:ks + lk]))
        if double:
            qi, ki, vi = qi.double(), ki.double(), vi.double()
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        o = F.scaled_dot_product_attention(qi[None], ki[None], vi[None], attn_mask=None if lq == lk else mask,
                                           is_causal=lq == lk, enable_gqa=True)[0]
        outs.append(o.transpose(0, 1))
        qs, ks = qs + lq, ks + lk
    return torch.cat(outs)


def _inputs(name: str, shape: Shape, std: float = 1.0, sink: tuple[float, float] | None = None,
            outliers: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    tq, tk = sum(s[0] for s in shape.seqs), sum(s[1] for s in shape.seqs)
    q = data.randn(f"{name}/q", (tq, shape.hq, shape.d), std=std, dtype=torch.float64)
    k = data.randn(f"{name}/k", (tk, shape.hkv, shape.d), std=std, dtype=torch.float64)
    v = data.randn(f"{name}/v", (tk, shape.hkv, shape.d), dtype=torch.float64)
    if outliers:
        q = data.outlier_channels(q, f"{name}/qo", outliers, count=2)
        k = data.outlier_channels(k, f"{name}/ko", outliers, count=2)
    if sink is not None:
        gap, value = sink
        scale = 1.0 / math.sqrt(shape.d)
        a = 2.0
        q[..., 0] = a
        k[..., 0] = 0.0
        starts = [0]
        for _, lk in shape.seqs[:-1]:
            starts.append(starts[-1] + lk)
        for s in starts:  # key 0 of each sequence: channel 0 only, scoring gap + ~4 nats
            k[s] = 0.0
            k[s, :, 0] = (gap + 4.0) / (a * scale)
            v[s] = v[s] * value
    return q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)


def _run(make: Callable[[str], tuple[torch.Tensor, torch.Tensor, torch.Tensor]], shapes: dict[str, Shape]) -> Callable[
        [str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        shape = shapes[size]
        q, k, v = (t.to(device) for t in make(size))
        cu_q = torch.tensor([0] + [sum(s[0] for s in shape.seqs[:i + 1]) for i in range(len(shape.seqs))])
        cu_k = torch.tensor([0] + [sum(s[1] for s in shape.seqs[:i + 1]) for i in range(len(shape.seqs))])
        truth = _sdpa(q, k, v, shape, double=True)
        with torch.no_grad():
            ours = rlkernel.ops.attention(q, k, v, cu_q.to(device), cu_k.to(device))
            native = _sdpa(q, k, v, shape, double=False)
        return [Result(RLKERNEL, tensor_errors(ours, truth)),
                Result("torch SDPA (bf16)", tensor_errors(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    def inputs(name: str, shapes: dict[str, Shape], **kw: object) -> Callable[[str], tuple[torch.Tensor, ...]]:
        return lambda size: _inputs(f"attention/{name}/{size}", shapes[size], **kw)  # type: ignore[arg-type]

    sets: list[tuple[str, str, dict[str, Shape], Callable[[str], tuple[torch.Tensor, ...]]]] = [
        ("normal", "q, k, v ~ N(0,1)", SHAPES, inputs("normal", SHAPES)),
        ("peaked", "q, k ~ N(0,2^2): sharp attention", SHAPES, inputs("peaked", SHAPES, std=2.0)),
        ("qk_outliers", "2 channels of q and k x10", SHAPES, inputs("qk_outliers", SHAPES, outliers=10.0)),
        ("long_context", "few queries over a long causal context", LONG, inputs("long", LONG)),
    ]
    for gap in (10, 20, 30):
        for value, tag in ((1e-3, "value_1e-3"), (0.0, "value_0")):
            sets.append((f"sink_gap{gap}/{tag}",
                         f"key 0 about {gap} nats above every other key; its value {tag[6:]} x the others",
                         SHAPES, inputs(f"sink{gap}_{tag}", SHAPES, sink=(float(gap), value))))
    return [Measurement(op="attention", dataset=name, description=desc, metric="rel_l2", run=_run(make, shapes),
                        shape=lambda size, s=shapes: s[size].describe())  # type: ignore[misc]
            for name, desc, shapes, make in sets]
