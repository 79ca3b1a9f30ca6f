"""``adamw`` and ``sgd`` against float64, next to ``torch.optim.AdamW`` / ``torch.optim.SGD`` on the same device.

One step from a mid-training state (moments of earlier steps) and the first step (zero
moments), with ordinary and outlier gradients. Truth: the same step in float64 from the same
fp32 inputs. Metric: relative L2 error of the weight update ``p' - p`` (the difference of
fp32 values, exact in float64), which includes the unavoidable rounding of ``p'`` to fp32;
the new moments' errors are reported next to it.
"""

from __future__ import annotations

import math

import torch

import rlkernel
from rlkernel.conformance.accuracy import data
from rlkernel.conformance.accuracy.suite import RLKERNEL, Measurement, Result

SIZES = {"small": 1 << 16, "full": 1 << 24}
HYPER = {"lr": 1e-5, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def _state(name: str, n: int, step: int, outliers: float) -> dict[str, torch.Tensor]:
    p = data.randn(f"{name}/p", (n,), std=0.02, dtype=torch.float32)
    g = data.randn(f"{name}/g", (n,), std=1e-3, dtype=torch.float32)
    if outliers:
        idx = data.randint(f"{name}/idx", (max(n // 1000, 1),), 0, n)
        g[idx] *= outliers
    if step == 1:
        m, v = torch.zeros(n), torch.zeros(n)
    else:
        m = data.randn(f"{name}/m", (n,), std=3e-4, dtype=torch.float32)
        v = data.randn(f"{name}/v", (n,), std=1e-3, dtype=torch.float32) ** 2
    return {"param": p, "grad": g, "exp_avg": m, "exp_avg_sq": v}


def _truth(s: dict[str, torch.Tensor], step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    h = HYPER
    p, g, m, v = (s[k].double() for k in ("param", "grad", "exp_avg", "exp_avg_sq"))
    m2 = h["beta1"] * m + (1 - h["beta1"]) * g
    v2 = h["beta2"] * v + (1 - h["beta2"]) * g * g
    denom = v2.sqrt() / math.sqrt(1 - h["beta2"] ** step) + h["eps"]
    p2 = p * (1 - h["lr"] * h["weight_decay"]) - h["lr"] / (1 - h["beta1"] ** step) * m2 / denom
    return p2, m2, v2


def _errors(p0: torch.Tensor, out: tuple[torch.Tensor, ...], truth: tuple[torch.Tensor, ...]) -> dict[str, float]:
    upd, t_upd = out[0].double() - p0.double(), truth[0] - p0.double()
    rel = lambda x, t: float((x.double() - t).norm() / t.norm())  # noqa: E731
    return {"update_rel_l2": rel(upd, t_upd), "exp_avg_rel_l2": rel(out[1], truth[1]),
            "exp_avg_sq_rel_l2": rel(out[2], truth[2])}


def _run(name: str, step: int, outliers: float):  # type: ignore[no-untyped-def]
    def run(size: str, device: torch.device) -> list[Result]:
        s = _state(f"adamw/{name}/{size}", SIZES[size], step, outliers)
        truth = _truth(s, step)
        d = {k: t.to(device) for k, t in s.items()}
        with torch.no_grad():
            ours = rlkernel.ops.adamw(**d, step=step, **HYPER)
            p = torch.nn.Parameter(d["param"].clone())
            opt = torch.optim.AdamW([p], lr=HYPER["lr"], betas=(HYPER["beta1"], HYPER["beta2"]), eps=HYPER["eps"],
                                    weight_decay=HYPER["weight_decay"])
            p.grad = d["grad"].clone()
            opt.state[p] = {"step": torch.tensor(float(step - 1)), "exp_avg": d["exp_avg"].clone(),
                            "exp_avg_sq": d["exp_avg_sq"].clone()}
            opt.step()
            st = opt.state[p]
            native = (p.detach(), st["exp_avg"], st["exp_avg_sq"])
        return [Result(RLKERNEL, _errors(s["param"], tuple(t.cpu() for t in ours), truth)),
                Result("torch.optim.AdamW (fp32, default implementation)",
                       _errors(s["param"], tuple(t.cpu() for t in native), truth), native=True)]
    return run


def _sgd(size: str, device: torch.device) -> list[Result]:
    """Nesterov momentum 0.9, weight decay 1e-4, lr 1e-2, step 10."""
    n = SIZES[size]
    name = f"sgd/{size}"
    p = data.randn(f"{name}/p", (n,), std=0.02, dtype=torch.float32)
    g = data.randn(f"{name}/g", (n,), std=1e-3, dtype=torch.float32)
    buf = data.randn(f"{name}/b", (n,), std=1e-3, dtype=torch.float32)
    lr, mu, wd = 1e-2, 0.9, 1e-4
    g64 = g.double() + wd * p.double()
    b64 = mu * buf.double() + g64
    t_p = p.double() - lr * (g64 + mu * b64)
    d = {"param": p.to(device), "grad": g.to(device), "momentum_buffer": buf.to(device)}
    with torch.no_grad():
        ours = rlkernel.ops.sgd(**d, step=10, lr=lr, momentum=mu, weight_decay=wd, nesterov=True)
        tp = torch.nn.Parameter(d["param"].clone())
        opt = torch.optim.SGD([tp], lr=lr, momentum=mu, weight_decay=wd, nesterov=True)
        tp.grad = d["grad"].clone()
        opt.state[tp] = {"momentum_buffer": d["momentum_buffer"].clone()}
        opt.step()
        native = (tp.detach(), opt.state[tp]["momentum_buffer"])

    def errors(out: tuple[torch.Tensor, ...]) -> dict[str, float]:
        upd, t_upd = out[0].cpu().double() - p.double(), t_p - p.double()
        return {"update_rel_l2": float((upd - t_upd).norm() / t_upd.norm()),
                "buffer_rel_l2": float((out[1].cpu().double() - b64).norm() / b64.norm())}

    return [Result(RLKERNEL, errors(ours)), Result("torch.optim.SGD (fp32, default implementation)", errors(native),
                                                   native=True)]


def measurements() -> list[Measurement]:
    shape = lambda size: f"n = {SIZES[size]}"  # noqa: E731
    desc = "w ~ N(0,0.02^2), g ~ N(0,1e-3^2), lr 1e-5, betas (0.9, 0.999), wd 0.01"
    return [
        Measurement("adamw", "first_step", desc + ", zero moments, step 1", "update_rel_l2", _run("first", 1, 0.0),
                    shape=shape),
        Measurement("adamw", "mid_training", desc + ", moments of earlier steps, step 100", "update_rel_l2",
                    _run("mid", 100, 0.0), shape=shape),
        Measurement("adamw", "outlier_grads", desc + ", 0.1% of gradients 1000x, step 100", "update_rel_l2",
                    _run("outliers", 100, 1000.0), shape=shape),
        Measurement("sgd", "nesterov", "w ~ N(0,0.02^2), g, buf ~ N(0,1e-3^2); lr 1e-2, momentum 0.9, wd 1e-4",
                    "update_rel_l2", _sgd, shape=shape),
    ]
