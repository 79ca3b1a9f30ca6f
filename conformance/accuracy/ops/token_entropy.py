"""``token_entropy`` and ``token_entropy_backward`` against float64, next to torch's usual computation.

Forward. Truth: float64 logits, ``H = -sum p log p`` in float64. Native: verl's
``entropy_from_logits`` on bf16 LM-head logits cast to fp32 (``logsumexp(z) - sum softmax(z) z``);
an fp32-LM-head yardstick beside it. Metric: the absolute entropy error (nats).

Backward. Truth: float64 ``c = -grad q (z/tau - E[z/tau]) / tau``, ``d_hidden = c W``, ``d_weight =
c^T h``. Native: torch autograd of the same bf16-logits entropy (bf16 ``h`` and ``W``, gradients in
bf16). rlkernel: the op's ``d_hidden`` (bf16) and ``d_weight`` (fp32, one rounding per unit).
Metric: relative L2 error.
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

Operands = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def entropy_of_logits(z: torch.Tensor) -> torch.Tensor:
    """verl's ``entropy_from_logits``: ``logsumexp(z) - sum softmax(z) z`` in z's dtype."""
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def truth_forward(h: torch.Tensor, w: torch.Tensor, temperature: float = 1.0, chunk: int = 16) -> torch.Tensor:
    """float64 entropy, a few rows of logits at a time."""
    out = []
    for s in range(0, h.shape[0], chunk):
        z = h[s:s + chunk].double() @ w.double().T / temperature
        lp = torch.log_softmax(z, dim=-1)
        out.append(-(lp.exp() * lp).sum(dim=-1))
    return torch.cat(out)


def truth_backward(grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor, temperature: float = 1.0,
                   chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 ``(d_hidden, d_weight)`` of ``grad . H(h W^T / tau)``."""
    w64 = w.double()
    dh, dw = [], torch.zeros(w.shape, dtype=torch.float64, device=w.device)
    for s in range(0, h.shape[0], chunk):
        h64 = h[s:s + chunk].double()
        zt = h64 @ w64.T / temperature
        q = torch.softmax(zt, dim=-1)
        c = -q * (zt - (q * zt).sum(dim=-1, keepdim=True)) * (grad[s:s + chunk].double() / temperature)[:, None]
        dh.append(c @ w64)
        dw += c.T @ h64
    return torch.cat(dh), dw


def native_backward(grad: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                    temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """torch autograd of the bf16 function: bf16 logits -> float -> / tau -> entropy."""
    with torch.enable_grad():
        hl, wl = h.detach().requires_grad_(True), w.detach().requires_grad_(True)
        out = entropy_of_logits(F.linear(hl, wl).float() / temperature)
        dh, dw = torch.autograd.grad(out, (hl, wl), grad)
    return dh, dw


def _operands(kind: str, factor: float = 0.0) -> Callable[[str], Operands]:
    def make(size: str) -> Operands:
        t, hd, v = SHAPES[size]
        name = f"token_entropy/{kind}/{factor}/{size}"
        h = data.randn(f"{name}/h", (t, hd))
        w = data.randn(f"{name}/w", (v, hd), std=0.05)
        if kind == "outliers":
            h = data.outlier_channels(h, name, factor)
        elif kind == "peaked":
            h = data.randn(f"{name}/h", (t, hd), std=4.0)  # confident predictions: logit spread ~ 20 nats
        g = data.randn(f"{name}/grad", (t,), dtype=torch.float32)
        return g, h, w
    return make


def _forward(make: Callable[[str], Operands]) -> Callable[[str, torch.device], list[Result]]:
    def run(size: str, device: torch.device) -> list[Result]:
        _, h, w = (x.to(device) for x in make(size))
        t = truth_forward(h, w)
        with torch.no_grad():
            ours = rlkernel.ops.token_entropy(h, w)
            bf16 = entropy_of_logits(F.linear(h, w).float())
            fp32 = entropy_of_logits(F.linear(h.float(), w.float()))
        return [Result(RLKERNEL, tensor_errors(ours, t)),
                Result("bf16 LM head + fp32 entropy (verl)", tensor_errors(bf16, t), native=True),
                Result("fp32 LM head + fp32 entropy", tensor_errors(fp32, t))]
    return run


#: one backward per (data set, size, device): the d_hidden and d_weight rows share it
_CACHE: dict[tuple[str, str, str], dict[str, list[Result]]] = {}


def _results(key: str, make: Callable[[str], Operands], size: str, device: torch.device) -> dict[str, list[Result]]:
    k = (key, size, str(device))
    if k not in _CACHE:
        _CACHE.clear()
        g, h, w = (x.to(device) for x in make(size))
        t_dh, t_dw = truth_backward(g, h, w)
        with torch.no_grad():
            o_dh, o_dw = rlkernel.ops.token_entropy_backward(g, h, w)
        n_dh, n_dw = native_backward(g, h, w)
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


def _backward(key: str, make: Callable[[str], Operands], which: str) -> Callable[[str, torch.device], list[Result]]:
    return lambda size, device: _results(key, make, size, device)[which]


def _sets() -> list[tuple[str, str, Callable[[str], Operands]]]:
    return [
        ("normal", "hidden ~ N(0,1), head ~ N(0,0.05^2), grad ~ N(0,1), bf16", _operands("normal")),
        ("peaked", "hidden ~ N(0,4^2): confident, wide logit range", _operands("peaked")),
        *[(f"outliers_x{int(f)}", f"hidden with {data.OUTLIER_COUNT} channels x{int(f)}", _operands("outliers", f))
          for f in data.OUTLIER_FACTORS],
    ]


def _shape(size: str) -> str:
    return "T x H x V = {} x {} x {}".format(*SHAPES[size])


def measurements() -> list[Measurement]:
    forward = [Measurement(op="token_entropy", dataset=name, description=desc, metric="max_abs", run=_forward(make),
                           shape=_shape) for name, desc, make in _sets()]
    backward = [Measurement(op="token_entropy_backward", dataset=f"{name}/{which}", description=f"{desc}; {which}",
                            metric="rel_l2", run=_backward(name, make, which), shape=_shape)
                for name, desc, make in _sets() for which in ("d_hidden", "d_weight")]
    return forward + backward
