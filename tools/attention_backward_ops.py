"""How many torch operations the generic ``attention_backward`` launches for one pack, on this machine.

The cuda backend runs ``attention_backward`` as the generic torch code with its dS / pn step as a
Triton kernel (``backends/triton/attention_backward.py``), so on the GPU its time is mostly the
host's: ~10 us of dispatch and launch per torch operation (the H200 trainer profile at 34eee00:
170 ms of host time a layer for 2 x 64 tokens, 6 ms of kernels). This script runs the backward on
the CPU for a pack of equal or mixed sequences and counts the torch operations it dispatches (views
and allocations included: each costs host time), with the batching budget of a 141 GB device
(``budget_scale`` 16): the generic steps, or with ``--steps triton`` (under ``TRITON_INTERPRET=1``)
the cuda backend's, whose kernel launches are not torch operations.

Usage: ``python tools/attention_backward_ops.py --lens 256,256,256,256`` (Qwen3-0.6B's heads:
16 query heads, 8 KV heads, head dim 128).

With ``--device cuda`` (on the GPU machine) it times one call instead: the median wall time of
``--repeat`` calls after a warm-up (host and device: the GPU is synchronised after each call), the
GPU kernels' device time of one call (``torch.profiler``) and, for scale, the same pack's backward
through torch's SDPA (one causal call per sequence, bf16).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rlkernel.backends.generic.attention_backward as AB


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lens", default="256,256,256,256", help="query (= key) count of each sequence, causal")
    parser.add_argument("--hq", type=int, default=16)
    parser.add_argument("--hkv", type=int, default=8)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--steps", choices=("generic", "triton"), default="generic",
                        help="the dS / pn step: generic torch, or the cuda backend's kernel (TRITON_INTERPRET=1)")
    parser.add_argument("--device", default="cpu", help="cuda: time the call instead of counting operations")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls with --device cuda")
    args = parser.parse_args()
    if args.device != "cpu":
        _time_on_device(args)
        return
    AB.budget_scale = lambda device: 16  # type: ignore[assignment]
    lens = [int(x) for x in args.lens.split(",")]
    t = sum(lens)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16)

    q, k, v = rand(t, args.hq, args.d), rand(t, args.hkv, args.d), rand(t, args.hkv, args.d)
    out, grad = rand(t, args.hq, args.d), rand(t, args.hq, args.d)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    count = _Count()
    start = time.time()
    if args.steps == "triton":
        from rlkernel.backends.triton.attention_backward import TritonSteps
        from rlkernel.backends.triton.targets import CUDA

        steps: AB.Steps = TritonSteps(CUDA)
    else:
        steps = AB.Steps()
    with count:
        AB.backward_with(steps, grad, q, k, v, out, cu, cu, None, True)
    print(f"attention_backward ({args.steps} steps), sequences {lens}, {args.hq}/{args.hkv} heads, d {args.d}: "
          f"{count.ops} torch operations ({count.ops / len(lens):.0f} a sequence; "
          f"{time.time() - start:.1f} s on this CPU)")


def _time_on_device(args: argparse.Namespace) -> None:
    """Median wall time, kernel device time and torch SDPA's backward for one pack on ``args.device``."""
    import statistics

    from rlkernel.backends.triton.attention_backward import TritonSteps
    from rlkernel.backends.triton.targets import CUDA

    device = torch.device(args.device)
    lens = [int(x) for x in args.lens.split(",")]
    t = sum(lens)
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(torch.bfloat16).to(device)

    q, k, v = rand(t, args.hq, args.d), rand(t, args.hkv, args.d), rand(t, args.hkv, args.d)
    out, grad = rand(t, args.hq, args.d), rand(t, args.hq, args.d)
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32, device=device)
    steps = TritonSteps(CUDA) if args.steps == "triton" else AB.Steps()

    def ours() -> None:
        AB.backward_with(steps, grad, q, k, v, out, cu, cu, None, True)

    def sdpa() -> None:
        rep = args.hq // args.hkv
        for i, n in enumerate(lens):
            s0 = sum(lens[:i])
            qs = q[s0:s0 + n].transpose(0, 1).detach().requires_grad_()
            ks = k[s0:s0 + n].transpose(0, 1).repeat_interleave(rep, 0).detach().requires_grad_()
            vs = v[s0:s0 + n].transpose(0, 1).repeat_interleave(rep, 0).detach().requires_grad_()
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
            o.backward(grad[s0:s0 + n].transpose(0, 1))

    for name, fn in (("rlkernel " + args.steps, ours), ("torch sdpa (forward + backward)", sdpa)):
        fn()
        torch.cuda.synchronize(device)
        walls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            walls.append(time.perf_counter() - start)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize(device)
        kernels: dict[str, float] = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                kernels[e.name] = kernels.get(e.name, 0.0) + e.device_time / 1e3
        launches = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"{name}, sequences {lens}, {args.hq}/{args.hkv} heads, d {args.d}: wall median "
              f"{statistics.median(walls) * 1e3:.2f} ms of {args.repeat}, GPU kernels {sum(kernels.values()):.2f} ms "
              f"in {launches} launches")
        for kname, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:12]:
            print(f"    {ms:8.3f} ms  {kname[:110]}")


if __name__ == "__main__":
    main()
