"""A/B of ``sample``'s host-side value checks on a CUDA host.

Variants: the six-op check of the public op before ``51fd6d3`` ("old"; it reads no values, so inside
the op the kernel gets ``filtered=True`` and launches all four kernels, as before ``9a0c842``), the
product's byte cat and pageable read ("new"), and a read into a pinned buffer ("pinned"); each alone
and inside the public op, B 1 and 64, three interleaved rounds. Run from the repository root with
rlkernel importable (``tools/device_run.sh`` stages it)::

    python3 tools/sample_checks_ab.py
"""
import sys
import time

import numpy as np
import torch

import rlkernel.ops.sample  # noqa: F401

M = sys.modules["rlkernel.ops.sample"]
new = M._check_tensors


def old(op, tensors):
    parts = [t.detach().float() for t in tensors.values()]
    if "temperature" in tensors:
        temp = tensors["temperature"].detach()
        parts.append(temp - temp)
    if float(torch.cat(parts).min()) >= 0:
        return {}  # nothing read: the public op then tells the kernel every row may be filtered (four launches)
    raise ValueError("bad")


def pinned(op, tensors):
    order = sorted(tensors, key=lambda name: tensors[name].dtype != torch.float32)
    raw = torch.cat([tensors[name].view(torch.uint8) for name in order])
    host = torch.empty(raw.shape, dtype=torch.uint8, pin_memory=True)
    host.copy_(raw, non_blocking=True)
    torch.cuda.current_stream().synchronize()
    raw = host.numpy()
    floats = 4 * sum(tensors[name].numel() for name in order if tensors[name].dtype == torch.float32)
    fv, iv = raw[:floats].view(np.float32), raw[floats:].view(np.int64)
    b = next(iter(tensors.values())).numel()
    if fv.min() >= 0 and iv.min() >= 0 and fv[:b].max() < np.inf:
        host, at = {}, 0
        for name in order:
            size = tensors[name].numel() * tensors[name].element_size()
            host[name] = raw[at:at + size].view(np.float32 if tensors[name].dtype == torch.float32 else np.int64)
            at += size
        return host
    raise ValueError("bad")


def tm(f, n=2000):
    for _ in range(100):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def rounds(b: int) -> None:
    d = torch.device("cuda")
    t = {"temperature": torch.full((b,), 0.8, device=d), "top_k": torch.zeros(b, dtype=torch.int64, device=d),
         "top_p": torch.ones(b, device=d), "position": torch.full((b,), 100, dtype=torch.int64, device=d)}
    x = torch.randn(b, 151936, device=d) * 3
    seed = torch.arange(b, device=d)

    def op() -> None:
        M.sample(x, t["temperature"], t["top_k"], t["top_p"], seed, t["position"])

    for rnd in range(3):
        row = {}
        for name, f in (("old", old), ("new", new), ("pinned", pinned)):
            row[name] = tm(lambda f=f: f("sample", t))
            M._check_tensors = f
            row["op+" + name] = tm(op, 1000)
            M._check_tensors = new
        print(f"B {b} round {rnd}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items()), flush=True)


for b in (1, 64):
    rounds(b)
