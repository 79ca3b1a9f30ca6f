"""``sample``: how far the sampled distribution is from the exact softmax, next to ``torch.multinomial``.

A sampler has no per-element error; its accuracy is the distance of its draws from the target
distribution. S draws of one row (seeds 0 .. S-1 for rlkernel, one ``torch.Generator`` for
torch) give empirical frequencies; the metric is the total-variation distance to the exact
(float64) softmax. Even exact sampling leaves the noise ``E[TV] ~ sum_j sqrt(p_j (1 - p_j) / (2 pi S))``,
so the rule's bound is three times that expected noise; torch's own draws are shown beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (draws S, vocabulary V) per size
SHAPES = {"small": (20000, 64), "full": (200000, 4096)}


def _tv(tokens: torch.Tensor, p: torch.Tensor) -> float:
    freq = torch.bincount(tokens.cpu(), minlength=p.numel()).double() / tokens.numel()
    return 0.5 * float((freq - p).abs().sum())


def _run(temperature: float, top_k: int, std: float) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        s, v = SHAPES[size]
        logits = data.randn(f"sample/{std}/{size}", (v,), std=std, dtype=torch.float32)
        scaled = logits.double() / temperature
        if top_k:
            keep = torch.topk(scaled, top_k).indices
            masked = torch.full_like(scaled, float("-inf"))
            masked[keep] = scaled[keep]
            scaled = masked
        p = torch.softmax(scaled, dim=-1)
        rows = logits.to(device).expand(s, v).contiguous()
        with torch.no_grad():
            ours = rlkernel.ops.sample(rows, temperature, top_k, 1.0, torch.arange(s, device=device),
                                       torch.zeros(s, dtype=torch.int64, device=device))
            g = torch.Generator(device=device).manual_seed(0)
            probs = torch.softmax(torch.where(torch.isfinite(scaled), scaled, -1e30).float().to(device), dim=-1)
            native = torch.multinomial(probs, s, replacement=True, generator=g)
        noise = sum(math.sqrt(float(pj) * (1 - float(pj)) / (2 * math.pi * s)) for pj in p)
        return [Result(RLKERNEL, {"tv": _tv(ours, p)}),
                Result("3 x expected TV of exact sampling", {"tv": 3 * noise}, native=True,
                       note="the bound a correct sampler stays under"),
                Result("torch.multinomial", {"tv": _tv(native, p)})]
    return run


def measurements() -> list[Measurement]:
    sets = [("t1", "temperature 1, logits ~ N(0,2^2)", _run(1.0, 0, 2.0)),
            ("t0.7_topk20", "temperature 0.7, top-k 20", _run(0.7, 20, 2.0))]
    return [Measurement("sample", name, desc, "tv", run, shape=lambda size: "S draws x V = {} x {}".format(
        *SHAPES[size])) for name, desc, run in sets]
