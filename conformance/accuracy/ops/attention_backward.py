"""``attention``'s gradients (``attention_backward``) against float64 autograd, next to PyTorch SDPA's backward.

Native: autograd of ``F.scaled_dot_product_attention`` in the input dtype (bf16), causal,
``enable_gqa=True``, one call per sequence. Truth: float64 autograd of softmax attention of the
same bf16 inputs and the same bf16 ``grad_out``. Ours: ``rlkernel.ops.attention`` with inputs that
require grad, then ``backward`` (which runs ``attention_backward`` on the saved bf16 output). The
metric is the worst relative L2 error of dq, dk and dv. Data: the forward's sets (ordinary, peaked,
outlier q/k channels, attention sinks with a 1e-3 or a zero value vector).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import tensor_errors
from rlkernel.conformance.accuracy.ops.attention import Shape, _inputs, _sdpa
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SHAPES = {"small": Shape(4, 2, 64, ((160, 160), (96, 96))), "full": Shape(32, 8, 128, ((1024, 1024), (500, 500)))}


def _worst(grads: tuple[torch.Tensor, ...], truth: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """Relative L2 per gradient and their max (the metric the rule compares)."""
    errs = {f"rel_l2_d{n}": float(tensor_errors(g, t)["rel_l2"]) for n, g, t in zip("qkv", grads, truth)}
    return {"rel_l2_max": max(errs.values()), **errs}


def _run(name: str, shape: Shape, **kw: object) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        shape_s = SHAPES[size] if size in SHAPES else shape
        q, k, v = (t.to(device) for t in _inputs(f"attention_backward/{name}/{size}", shape_s, **kw))  # type: ignore[arg-type]
        go = data.randn(f"attention_backward/{name}/{size}/go", tuple(q.shape), dtype=torch.float64)
        go = go.to(device=device, dtype=q.dtype)
        cu_q = torch.tensor([0] + [sum(s[0] for s in shape_s.seqs[:i + 1]) for i in range(len(shape_s.seqs))])
        cu_k = torch.tensor([0] + [sum(s[1] for s in shape_s.seqs[:i + 1]) for i in range(len(shape_s.seqs))])

        def grads(fn: Callable[..., torch.Tensor], dtype: torch.dtype | None) -> tuple[torch.Tensor, ...]:
            leaves = [(t.to(dtype) if dtype else t).detach().requires_grad_(True) for t in (q, k, v)]
            out = fn(*leaves)
            out.backward(go.to(out.dtype))
            return tuple(t.grad for t in leaves)  # type: ignore[misc]

        truth = grads(lambda a, b, c: _sdpa(a, b, c, shape_s, double=True), torch.float64)
        native = grads(lambda a, b, c: _sdpa(a, b, c, shape_s, double=False), None)
        ours = grads(lambda a, b, c: rlkernel.ops.attention(a, b, c, cu_q.to(device), cu_k.to(device)), None)
        return [Result(RLKERNEL, _worst(ours, truth)),
                Result("torch SDPA backward (bf16)", _worst(native, truth), native=True)]
    return run


def measurements() -> list[Measurement]:
    sets: list[tuple[str, str, dict[str, object]]] = [
        ("normal", "q, k, v ~ N(0,1), dO ~ N(0,1)", {}),
        ("peaked", "q, k ~ N(0,2^2): sharp attention", {"std": 2.0}),
        ("qk_outliers", "2 channels of q and k x10", {"outliers": 10.0}),
    ]
    for gap in (10, 30):
        for value, tag in ((1e-3, "value_1e-3"), (0.0, "value_0")):
            sets.append((f"sink_gap{gap}/{tag}", f"key 0 about {gap} nats above every other key; its value "
                         f"{tag[6:]} x the others", {"sink": (float(gap), value)}))
    return [Measurement(op="attention_backward", dataset=name, description=desc, metric="rel_l2_max",
                        run=_run(name, SHAPES["small"], **kw), shape=lambda size: SHAPES[size].describe())
            for name, desc, kw in sets]
