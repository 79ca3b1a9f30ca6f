"""The CUDA backend on a real NVIDIA GPU: every case of every contract it implements, bitwise.

Marked ``gpu``; skipped where torch sees no CUDA device. Run on the H200 by
``tools/device_run.sh`` (``pytest -m gpu tests -q``). The conformance run
(``rlkernel conformance --backend cuda --device cuda --full``) is the authoritative record;
these tests add the cross-path checks a conformance case cannot see: the decode and prefill
paths of ``linear`` agree, ``token_logprobs`` never allocates the [T, V] logits, and every
kernel that ran was a CUDA one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None,
                       reason="needs an NVIDIA CUDA device"),
]


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    res: list[torch.Tensor] = []
    for o in out:
        res.extend(_flat(o))
    return res


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    if t.is_floating_point():
        return t.view({4: torch.int32, 2: torch.int16, 8: torch.int64}[t.element_size()])
    return t


def _assert_bitwise(expected: Any, actual: Any, what: str) -> None:
    for i, (e, a) in enumerate(zip(_flat(expected), _flat(actual), strict=True)):
        assert e.shape == a.shape and e.dtype == a.dtype, f"{what} output {i}: {e.dtype}{tuple(e.shape)} vs " \
                                                          f"{a.dtype}{tuple(a.shape)}"
        be, ba = _bits(e).reshape(-1), _bits(a).reshape(-1)
        diff = (be != ba).nonzero()
        if diff.numel():
            j = int(diff[0])
            raise AssertionError(f"{what} output {i}: {diff.numel()} of {be.numel()} differ; first at {j}: expected "
                                 f"{int(be[j]) & 0xFFFFFFFF:#x}, got {int(ba[j]) & 0xFFFFFFFF:#x}")


def _to(obj: Any, device: str) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _cuda_modules() -> list[str]:
    import importlib.util

    from rlkernel.backends.cuda import KERNELS
    from rlkernel.contracts import CONTRACT_MODULES

    return [m for m in CONTRACT_MODULES if importlib.util.find_spec(f"rlkernel.contracts.{m}") is not None
            and (m in KERNELS or any(op.startswith(m) for op in KERNELS))]


def _run(op: str, **inputs: Any) -> Any:
    from rlkernel.dispatch import trace, use_backend
    from rlkernel.public import public_op

    with use_backend("cuda"), trace() as calls:
        out = public_op(op)(**_to(inputs, "cuda"))
    torch.cuda.synchronize()
    kernels = {k for _, k in calls}
    assert kernels and all(k.startswith("cuda:") for k in kernels), f"{op}: kernels {kernels}"
    return _to(out, "cpu")


@pytest.mark.parametrize("module", _cuda_modules())
def test_cuda_cases_bitwise_vs_reference(module: str) -> None:
    import importlib

    from rlkernel.backends.cuda import KERNELS
    from rlkernel.conformance.cases import bit_cases, invariance_cases, op_of, reference_of

    mod = importlib.import_module(f"rlkernel.contracts.{module}")
    ran = 0
    for case in bit_cases(mod, full=True):
        op = op_of(mod, case)
        if op not in KERNELS:
            continue
        _assert_bitwise(reference_of(mod, op)(**case.make()), _run(op, **case.make()), f"{module}/{case.name}")
        ran += 1
    for inv in invariance_cases(mod, full=True):
        if op_of(mod, inv) not in KERNELS:
            continue
        expected, actual = inv.check(lambda name, /, **kw: _run(name, **kw))
        _assert_bitwise(expected, actual, f"{module}/{inv.name}")
        ran += 1
    assert ran, f"{module}: no case ran"


def test_linear_decode_and_prefill_paths_agree() -> None:
    from rlkernel.backends.cuda import linear as L

    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(4096, 4096, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn(256, 4096, generator=g, device="cuda").to(torch.bfloat16)
    x[:, 7] *= 300.0  # an outlier channel
    whole = L.linear(x, w)  # prefill path (M > 64)
    for m in (1, 3, 16, 64):
        part = L.linear(x[:m], w)  # decode path
        _assert_bitwise(whole[:m], part, f"linear M={m} (decode) vs M=256 (prefill)")


def test_token_logprobs_memory_is_bounded() -> None:
    from rlkernel.backends.cuda.token_logprobs import token_logprobs

    g = torch.Generator(device="cuda").manual_seed(1)
    t, h, v = 2048, 1024, 151936
    hidden = torch.randn(t, h, generator=g, device="cuda").to(torch.bfloat16)
    weight = (torch.randn(v, h, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, v, (t,), generator=g, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = token_logprobs(hidden, weight, targets)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    logits_bytes = t * v * 4
    assert extra < logits_bytes // 8, f"extra memory {extra} bytes vs fp32 logits {logits_bytes}"
    assert torch.isfinite(out).all()
