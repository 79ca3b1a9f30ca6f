"""One SGD step with momentum, dampening, Nesterov and weight decay (torch.optim.SGD's algorithm), bit-exact.

Elementwise IEEE fp32 with every rounding named and no fused multiply-add; the hyper-parameter
scalars are the correctly rounded fp32 values of the fp64 arguments (``1 - dampening`` an exact
real rounded once). Every backend and every layout of the parameters gives the same bits.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize
from rlkernel.contracts._gen import normal, seed_of, special_values
from rlkernel.contracts.adamw import _rn32_fraction

CONTRACT = Contract(
    name="sgd",
    version=1,
    summary="g = RN(g + RN(wd*p)); buf = g (first step) or RN(RN(mu*buf) + RN(damp*g)); "
            "d = RN(g + RN(mu*buf)) (nesterov) or buf; p = RN(p - RN(lr*d))",
    invariances=("batch", "permutation", "repeat"),
    dtypes={"param": (torch.float32,), "grad": (torch.float32, torch.bfloat16, torch.float16),
            "momentum_buffer": (torch.float32,)},
    parameters={
        "host_scalars": "lr32 = RN32(lr), mu = RN32(momentum), wd32 = RN32(weight_decay), "
                        "damp = RN32(1 - dampening) (exact real, one rounding)",
        "grad_widening": "g = fp32(grad): bf16/fp16 gradients widened exactly",
        "weight_decay": "g = RN(g + RN(wd32 * p)) when weight_decay != 0 (coupled L2, torch's SGD)",
        "first_step_buffer": "step 1: buf = g (the given buffer is ignored), as torch's clone",
        "momentum_update": "buf = RN(RN(mu * buf) + RN(damp * g)) on later steps",
        "nesterov": "direction RN(g + RN(mu * buf)) with nesterov, else buf (or g when momentum = 0)",
        "param_update": "p' = RN(p - RN(lr32 * d))",
    },
)


def host_scalars(lr: float, momentum: float, dampening: float, weight_decay: float) -> dict[str, float]:
    """``lr32, mu, wd32, damp``: the correctly rounded fp32 of the exact reals."""
    return {"lr": _rn32_fraction(Fraction(lr)), "mu": _rn32_fraction(Fraction(momentum)),
            "wd": _rn32_fraction(Fraction(weight_decay)), "damp": _rn32_fraction(1 - Fraction(dampening))}


def reference(param: torch.Tensor, grad: torch.Tensor, momentum_buffer: torch.Tensor, step: int, lr: float,
              momentum: float = 0.0, dampening: float = 0.0, weight_decay: float = 0.0,
              nesterov: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step (the definition of ``sgd``'s bits).

    Parameters
    ----------
    param, momentum_buffer : Tensor, float32, [*] (one shape)
        The buffer is read only when ``momentum != 0`` and ``step > 1``.
    grad : Tensor, float32, bfloat16 or float16, [*]
    step : int
        >= 1; 1 starts the momentum buffer from the gradient.
    lr, momentum, dampening, weight_decay : float
    nesterov : bool
        Needs momentum > 0 and dampening == 0 (torch's rule).

    Returns
    -------
    (param', momentum_buffer') : float32 tensors of param's shape; the buffer is the new one
    (``g`` itself when momentum is 0: torch keeps none; here it is returned for a uniform API).

    Bitwise semantics
    -----------------
    Scalars: ``lr32 = RN32(lr)``, ``mu = RN32(momentum)``, ``wd32 = RN32(weight_decay)``,
    ``damp = RN32(1 - dampening)`` (exact real). Elementwise, one IEEE fp32 rounding each,
    no fused multiply-add::

        g   = fp32(grad);  g = RN(g + RN(wd32 * p))            if weight_decay != 0
        buf = g  (step 1)  or  RN(RN(mu * buf) + RN(damp * g))  if momentum != 0
        d   = RN(g + RN(mu * buf)) if nesterov else buf          (d = g if momentum == 0)
        p'  = RN(p - RN(lr32 * d))

    NaN outputs canonical. Invariances: batch, permutation, repeat. Contract ``sgd`` v1.
    """
    s = host_scalars(lr, momentum, dampening, weight_decay)
    f64 = torch.float64

    def rn(x: torch.Tensor) -> torch.Tensor:  # one fp64 operation on fp32 values, rounded: correctly rounded
        return x.to(torch.float32).to(f64)

    p = param.to(f64)
    g = grad.to(torch.float32).to(f64)
    if weight_decay != 0:
        g = rn(g + rn(p * s["wd"]))
    if momentum != 0:
        buf = g if step == 1 else rn(rn(momentum_buffer.to(f64) * s["mu"]) + rn(g * s["damp"]))
        d = rn(g + rn(buf * s["mu"])) if nesterov else buf
    else:
        buf, d = g, g
    return canonicalize(rn(p - rn(d * s["lr"])).to(torch.float32)), canonicalize(buf.to(torch.float32))


# --------------------------------------------------------------------------- cases


def _case(case: str, shape: tuple[int, ...], step: int, grad_dtype: torch.dtype = torch.float32,
          **kw: Any) -> dict[str, Any]:
    s = seed_of("sgd", case)
    hyper = {"lr": 1e-2, "momentum": 0.9, "dampening": 0.0, "weight_decay": 1e-4, "nesterov": False, **kw}
    return {"param": normal(seed_of(s, "p"), shape, std=0.05, dtype=torch.float32),
            "grad": normal(seed_of(s, "g"), shape, std=1e-2, dtype=torch.float64).to(grad_dtype),
            "momentum_buffer": normal(seed_of(s, "b"), shape, std=1e-2, dtype=torch.float32),
            "step": step, **hyper}


def golden_cases() -> list[Case]:
    """Plain, momentum, dampening, Nesterov, weight decay; first and later steps; grad dtypes."""
    return [
        Case("plain", "golden", lambda: _case("plain", (1000,), 3, momentum=0.0, weight_decay=0.0)),
        Case("momentum_first", "golden", lambda: _case("mfirst", (64, 33), 1)),
        Case("momentum", "golden", lambda: _case("m", (64, 33), 7)),
        Case("dampening", "golden", lambda: _case("damp", (513,), 4, dampening=0.1)),
        Case("nesterov", "golden", lambda: _case("nest", (513,), 4, nesterov=True)),
        Case("nesterov_first", "golden", lambda: _case("nestf", (129,), 1, nesterov=True)),
        Case("bf16_grad", "golden", lambda: _case("bf16", (300,), 5, grad_dtype=torch.bfloat16)),
        Case("fp16_grad_decay", "golden", lambda: _case("fp16", (300,), 5, grad_dtype=torch.float16,
                                                         weight_decay=0.1)),
        Case("B1M", "golden", lambda: _case("big", (1 << 20,), 9), full_only=True),
    ]


def _specials() -> dict[str, Any]:
    sv = special_values(torch.float32)
    n = len(sv)
    d = _case("specials", (3 * n,), 2)
    d["param"][:n] = sv
    d["grad"][n:2 * n] = sv
    d["momentum_buffer"][2 * n:] = sv
    return d


def adversarial_cases() -> list[Case]:
    return [
        Case("specials", "adversarial", _specials),
        Case("odd_scalars", "adversarial", lambda: _case("odd", (257,), 3, lr=0.1 + 2**-30, momentum=0.95 + 2**-35,
                                                          dampening=0.3, weight_decay=0.0123)),
        # 1 - dampening lies just below the midpoint of 1 - 2**-24 and 1: RN32(1 - RN32(d)) would tie to 1
        Case("damp_exact_real", "adversarial",
             lambda: _case("dampx", (257,), 3, dampening=2**-25 + 2**-60, momentum=0.5)),
        Case("decay_only", "adversarial", lambda: _case("decay", (257,), 2, momentum=0.0, weight_decay=0.3)),
        Case("tiny_grads", "adversarial", lambda: (lambda d: {**d, "grad": d["grad"] * 1e-38})(
            _case("tiny", (129,), 2))),
        Case("noncontiguous", "adversarial", lambda: (lambda d: {**d, **{k: d[k].T for k in
                                                                        ("param", "grad", "momentum_buffer")}})(
            _case("nc", (17, 9), 3))),
        Case("empty", "adversarial", lambda: _case("empty", (0, 4), 1)),
    ]


def invariance_cases() -> list[InvarianceCase]:
    keys = ("param", "grad", "momentum_buffer")

    def sub(d: dict[str, Any], idx: Any) -> dict[str, Any]:
        return {**d, **{k: d[k][idx] for k in keys}}

    def batch(run: Any) -> tuple[Any, Any]:
        d = _case("inv_batch", (3001,), 6, nesterov=True)
        alone = run("sgd", **sub(d, slice(700, 800)))
        inside = [tuple(t[700 - a:800 - a] for t in run("sgd", **sub(d, slice(a, b))))
                  for a, b in ((0, 3001), (699, 801), (300, 2048))]
        return [alone] * len(inside), inside

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _case("inv_perm", (777,), 3)
        perm = torch.arange(776, -1, -1)
        return tuple(t[perm] for t in run("sgd", **d)), run("sgd", **sub(d, perm))

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _case("inv_repeat", (1025,), 2)
        first = run("sgd", **d)
        return [first, first], [run("sgd", **d) for _ in range(2)]

    return [
        InvarianceCase("slice_inside_buffers", "batch", batch),
        InvarianceCase("permuted", "permutation", permutation),
        InvarianceCase("repeat", "repeat", repeat),
    ]


def torch_sgd(param: torch.Tensor, grad: torch.Tensor, momentum_buffer: torch.Tensor, step: int, lr: float,
              momentum: float, dampening: float, weight_decay: float,
              nesterov: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.optim.SGD's single-tensor step (functional): the native baseline."""
    p, g = param.clone(), grad.float()
    if weight_decay:
        g = g.add(p, alpha=weight_decay)
    buf = g.clone() if step == 1 else momentum_buffer.mul(momentum).add_(g, alpha=1 - dampening)
    d = g.add(buf, alpha=momentum) if nesterov else buf
    return p.add_(d, alpha=-lr), buf


def bench_cases() -> list[BenchCase]:
    def make(device: torch.device) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(0)
        t = [torch.randn(1 << 22, generator=g, device=device) for _ in range(3)]
        return {"param": t[0], "grad": t[1] * 1e-2, "momentum_buffer": t[2] * 1e-2, "step": 5, "lr": 1e-2,
                "momentum": 0.9, "dampening": 0.0, "weight_decay": 1e-4, "nesterov": True}

    n = 1 << 22
    return [BenchCase(name="n4M_nesterov", make=make, native=torch_sgd, flops=8.0 * n, bytes=20.0 * n,
                      sizes=("small", "large"))]
