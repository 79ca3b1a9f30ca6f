"""``token_logprobs_backward`` against float64, next to torch's bf16 autograd of the same function.

Truth: float64 ``c = grad (onehot(y) - softmax(h W^T / tau))``, ``d_hidden = c W``, ``d_weight =
c^T h`` (the analytical gradient, a few rows of float64 logits at a time). Native: torch
autograd of ``log_softmax(F.linear(h, W).float() / tau).gather(y)`` with bf16 ``h`` and ``W`` --
what an ordinary bf16 trainer computes (bf16 logits and bf16 ``grad_logits``, cuBLAS/CPU bf16
GEMMs with fp32 accumulation, gradients in bf16). rlkernel: the op's ``d_hidden`` (bf16) and
``d_weight`` (fp32, one rounding per unit; a yardstick row shows it rounded to bf16 as plain
autograd stores it in ``weight.grad``). Metric: relative L2 error.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.metrics import round_to, tensor_errors
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

#: (T, H, V) per size: full is Qwen3-8B's hidden size and the Qwen3 vocabulary
SHAPES = {"small": (16, 256, 2048), "full": (64, 4096, 151936)}

Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def truth(grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
          chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(d_hidden, d_weight)`` of ``grad . log_softmax(h W^T / tau)[y]``."""
    w64 = w.double()
    dh, dw = [], torch.zeros(w.shape, dtype=torch.float64, device=w.device)
    for s in range(0, h.shape[0], chunk):
        h64 = h[s:s + chunk].double()
        p = torch.softmax(h64 @ w64.T / temperature, dim=-1)
        c = -p
        c[torch.arange(c.shape[0]), targets[s:s + chunk]] += 1.0
        c = c * (grad[s:s + chunk].double() / temperature).unsqueeze(1)
        dh.append(c @ w64)
        dw += c.T @ h64
    return torch.cat(dh), dw


def native(grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor, targets: torch.Tensor,
           temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """torch autograd of the bf16 function: bf16 logits -> float -> / tau -> log_softmax -> gather."""
    with torch.enable_grad():
        hl, wl = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
        out = torch.log_softmax(F.linear(hl, wl).float() / temperature, dim=-1).gather(1, targets[:, None])[:, 0]
        dh, dw = torch.autograd.grad(out, (hl, wl), grad)
    return dh, dw


def _operands(kind: str, factor: float = 0.0) -> Callable[[str], Operands]:
    def make(size: str) -> Operands:
        t, hd, v = SHAPES[size]
        name = f"token_logprobs_backward/{kind}/{factor}/{size}"
        h = data.randn(f"{name}/h", (t, hd))
        w = data.randn(f"{name}/w", (v, hd), std=0.05)
        if kind == "outliers":
            h = data.outlier_channels(h, name, factor)
        elif kind == "massive":
            h = data.massive_tokens(h, name, factor)
        elif kind == "peaked":
            h = data.randn(f"{name}/h", (t, hd), std=4.0)  # confident predictions: logit spread ~ 20 nats
        g = data.randn(f"{name}/grad", (t,), dtype=torch.float32)
        return g, h, w, data.randint(f"{name}/targets", (t,), 0, v)
    return make


#: one backward per (data set, size, device): the d_hidden and d_weight rows share it
_CACHE: dict[tuple[str, str, str], dict[str, list[Result]]] = {}


def _results(key: str, make: Callable[[str], Operands], size: str, device: torch.device) -> dict[str, list[Result]]:
    k = (key, size, str(device))
    if k not in _CACHE:
        _CACHE.clear()  # one data set at a time: the full-size tensors are large
        g, h, w, y = (t.to(device) for t in make(size))
        t_dh, t_dw = truth(g, h, w, y)
        with torch.no_grad():
            o_dh, o_dw = rlkernel.ops.token_logprobs_backward(g, h, w, y)
        n_dh, n_dw = native(g, h, w, y)
        assert o_dh is not None and o_dw is not None
        _CACHE[k] = {
            "d_hidden": [Result(RLKERNEL, tensor_errors(o_dh, t_dh)),
                         Result("torch bf16 autograd", tensor_errors(n_dh, t_dh), native=True),
                         Result("float64 truth rounded to bf16", tensor_errors(round_to(t_dh, torch.bfloat16), t_dh))],
            "d_weight": [Result(RLKERNEL, tensor_errors(o_dw, t_dw), note="fp32 (one rounding per unit)"),
                         Result("torch bf16 autograd", tensor_errors(n_dw, t_dw), native=True),
                         Result("rlkernel rounded to bf16 (plain autograd's weight.grad)",
                                tensor_errors(o_dw.to(torch.bfloat16), t_dw))],
        }
    return _CACHE[k]


def _run(key: str, make: Callable[[str], Operands], which: str) -> Callable[[str, torch.device], list[Result]]:
    return lambda size, device: _results(key, make, size, device)[which]


def measurements() -> list[Measurement]:
    sets = [
        ("normal", "hidden ~ N(0,1), head ~ N(0,0.05^2), grad ~ N(0,1), bf16", _operands("normal")),
        ("peaked", "hidden ~ N(0,4^2): confident, wide logit range", _operands("peaked")),
        *[(f"outliers_x{int(f)}", f"hidden with {data.OUTLIER_COUNT} channels x{int(f)}", _operands("outliers", f))
          for f in data.OUTLIER_FACTORS],
        ("massive_x1000", "two tokens 1000x the others in every channel", _operands("massive", 1000.0)),
    ]
    return [Measurement(op="token_logprobs_backward", dataset=f"{name}/{which}", description=f"{desc}; {which}",
                        metric="rel_l2", run=_run(name, make, which),
                        shape=lambda size: "T x H x V = {} x {} x {}".format(*SHAPES[size]))
            for name, desc, make in sets for which in ("d_hidden", "d_weight")]
