"""Bytes that ``token_logprobs_backward``'s torch operations move, per function, on this machine.

Without a GPU at hand this says where the cuda backend's LM-head backward spends its memory
traffic outside its Triton kernels: the cuda kernel (``backends/triton/token_logprobs_backward.py``)
runs the generic passes with its matrix products (and d_weight's finish) on Triton, and every
other pass as torch operations, which are memory-bound. This script runs those same passes on
the CPU with the chunk budgets of a 141 GB device (``budget_scale`` 16) and counts, for each
torch operation, the bytes of its tensor arguments and results, grouped by the three innermost
rlkernel functions on the call stack. The steps the cuda backend runs as kernels are not counted
(the exact products return zeros: the bytes of the other passes do not depend on their values).

Usage: ``python tools/tlb_bytes.py --tokens 128`` (``--torch-steps all``: count the column exponents,
the row sums, the coefficients, their digits and d_weight's finish as torch operations too, as the cuda backend
ran them before it had kernels for them).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rlkernel.backends.generic.token_logprobs_backward as G
from rlkernel.backends.generic.linear import _digits_f32

COUNTING = [True]


class _NotCounted:
    """Operations inside run as one Triton kernel on the device: not counted."""

    def __enter__(self) -> None:
        COUNTING[0] = False

    def __exit__(self, *exc: object) -> None:
        COUNTING[0] = True


#: the steps the cuda backend runs as Triton kernels (``backends/triton/token_logprobs_backward.py``)
STEPS = ("columns", "rows", "coefficients", "digits", "finish")


class _Stand(G.Steps):
    """The cuda backend's steps: those in ``torch_steps`` as the generic torch operations (counted),
    the others as stand-ins for its kernels (not counted): logits by an fp32 matmul, exact products
    as zeros, the rest by the generic code run uncounted."""

    def __init__(self, torch_steps: set[str]) -> None:
        self.torch_steps = torch_steps

    def _run(self, step: str, fn, *args):  # type: ignore[no-untyped-def]
        if step in self.torch_steps:
            return fn(*args)
        with _NotCounted():
            return fn(*args)

    def logits(self, hidden, weight, vc, tau):  # type: ignore[no-untyped-def]
        for v0 in range(0, weight.shape[0], vc):
            v1 = min(v0 + vc, weight.shape[0])
            with _NotCounted():
                z = hidden.float() @ weight[v0:v1].float().T
            yield v0, v1, z if tau is None else z / tau

    def column_exponents(self, t):  # type: ignore[no-untyped-def]
        return self._run("columns", super().column_exponents, t)

    def row_stats(self, z, vs):  # type: ignore[no-untyped-def]
        return self._run("rows", super().row_stats, z, vs)

    def coefficients(self, *args):  # type: ignore[no-untyped-def]
        return self._run("coefficients", super().coefficients, *args)

    def exact(self, x, w, ex, ew):  # type: ignore[no-untyped-def]
        self._run("digits", _digits_f32, x, ex, G.C_BITS, G.C_DIGITS)
        with _NotCounted():
            return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64)

    def finish(self, acc, ex, ew):  # type: ignore[no-untyped-def]
        return self._run("finish", super().finish, acc, ex, ew)


#: operations that move no data (allocations; views are told by ``OpOverload.is_view``)
_NO_TRAFFIC = {"empty", "empty_like", "empty_strided"}


class _Count(TorchDispatchMode):
    def __init__(self, by_op: bool) -> None:
        super().__init__()
        self.by_op = by_op
        self.bytes: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if COUNTING[0] and not func.is_view and func.overloadpacket.__name__ not in _NO_TRAFFIC:
            results = out if isinstance(out, (tuple, list)) else [out]
            moved = sum(_nbytes(a) for a in list(args) + list(results))
            names = []
            frame = sys._getframe(1)
            while frame is not None and len(names) < 3:
                if "rlkernel" in frame.f_code.co_filename or "/backends/" in frame.f_code.co_filename:
                    names.append(frame.f_code.co_name)
                frame = frame.f_back
            key = " < ".join(names) + (f" : {func.__name__}" if self.by_op else "")
            self.bytes[key] += moved
            self.calls[key] += 1
        return out


def _nbytes(x: Any) -> int:
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--torch-steps", default="",
                        help=f"comma-separated steps counted as torch operations, of {','.join(STEPS)} "
                             "(the cuda backend before it ran them as kernels; 'all' for every one)")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--by-op", action="store_true", help="one row per function and torch operation")
    args = parser.parse_args()
    G.budget_scale = lambda device: 16  # type: ignore[assignment]
    gen = torch.Generator().manual_seed(0)
    t, v, h = args.tokens, args.vocab, args.hidden
    hidden = (torch.randn(t, h, generator=gen) * 0.5).bfloat16()
    weight = (torch.randn(v, h, generator=gen) * 0.02).bfloat16()
    grad = torch.randn(t, generator=gen)
    targets = torch.randint(0, v, (t,), generator=gen)
    steps = set(STEPS) if args.torch_steps == "all" else {x for x in args.torch_steps.split(",") if x}
    if steps - set(STEPS):
        parser.error(f"--torch-steps: unknown {sorted(steps - set(STEPS))}; expected some of {', '.join(STEPS)}")
    count = _Count(args.by_op)
    start = time.time()
    with count:
        G.backward_with(_Stand(steps), grad, hidden, weight, targets)
    total = sum(count.bytes.values())
    in_torch = ", ".join(sorted(steps)) or "no step of " + "/".join(STEPS)
    print(f"token_logprobs_backward T={t} V={v} H={h}: {total / 1e9:.1f} GB moved by torch operations "
          f"(in torch: {in_torch}; {time.time() - start:.0f} s on CPU)")
    print("| GB | ops | innermost functions |\n|---:|---:|---|")
    for key, moved in count.bytes.most_common(args.top):
        print(f"| {moved / 1e9:.2f} | {count.calls[key]} | `{key}` |")


if __name__ == "__main__":
    main()
