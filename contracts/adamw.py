"""One AdamW step on fp32 master weights (torch.optim.AdamW's algorithm), bit-exact.

Elementwise: every device step is one IEEE fp32 operation rounded to nearest-even, in a named
order with no fused multiply-add, the square root correctly rounded; the hyper-parameter
scalars (bias corrections included) are the correctly rounded fp32 values of exact real
expressions of the fp64 hyper-parameters. So every backend, batch layout and sharding of the
parameters gives the same new weights and moments.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize, sqrt_rn
from rlkernel.contracts._gen import from_bits, normal, seed_of, special_values, uniform

CONTRACT = Contract(
    name="adamw",
    version=1,
    summary="m = RN(RN(b1*m) + RN(c1*g)); v = RN(RN(b2*v) + RN(RN(c2*g)*g)); "
            "p = RN(RN(p*decay) - RN(step_size * RN(m / RN(RN(sqrt_rn(v) / bc2_sqrt) + eps))))",
    invariances=("batch", "permutation", "repeat"),
    dtypes={"param": (torch.float32,), "grad": (torch.float32, torch.bfloat16, torch.float16),
            "exp_avg": (torch.float32,), "exp_avg_sq": (torch.float32,)},
    parameters={
        "host_scalars": "b1 = RN32(beta1), c1 = RN32(1 - beta1), b2 = RN32(beta2), c2 = RN32(1 - beta2), "
                        "eps32 = RN32(eps): each the correctly rounded fp32 of the exact real (fp64 inputs)",
        "decay_scalar": "decay = RN32(1 - lr * weight_decay), exact real product and difference, one rounding",
        "step_size": "step_size = RN32(lr / (1 - beta1**step)), exact real, one rounding",
        "bc2_sqrt": "bc2_sqrt = RN32(sqrt(1 - beta2**step)), exact real, one rounding",
        "grad_widening": "g = fp32(grad): bf16/fp16 gradients widened exactly",
        "exp_avg_update": "m' = RN(RN(b1 * m) + RN(c1 * g)) (not torch's lerp m + c1 * (g - m))",
        "exp_avg_sq_update": "v' = RN(RN(b2 * v) + RN(RN(c2 * g) * g)): c2 * g first, then * g",
        "sqrt_rounding": "sqrt_rn(v'): IEEE fp32 square root, correctly rounded",
        "denominator": "d = RN(RN(sqrt_rn(v') / bc2_sqrt) + eps32): eps added after the bias correction",
        "division_rounding": "u = RN(m' / d), one correctly rounded division",
        "param_update": "p' = RN(RN(p * decay) - RN(step_size * u)): decay first (decoupled, torch's order)",
        "no_contraction": "every product rounded before the sum it feeds (no fused multiply-add)",
    },
)

#: the overflow threshold: reals at or past max_fp32 + half an ulp round to +inf
_OVERFLOW = Fraction(2**128 - 2**103)


def _even(a: float) -> bool:
    return int(np.float32(a).view(np.int32)) % 2 == 0


def _nearest(candidate: float, nearer_low: Any) -> float:
    """The nearest fp32 to an exact real, given a candidate at most one step from it.

    ``nearer_low(a, b)`` says (exactly) whether the real is below the midpoint of the adjacent
    fp32 values ``a < b``: True, False, or None for exactly at it (then the even one wins).
    """
    f = np.float32(candidate)
    down, up = float(np.nextafter(f, np.float32(0))), float(np.nextafter(f, np.float32(np.inf)))
    for a, b in ((down, float(f)), (float(f), up)):
        if a == b or math.isinf(b):
            continue
        side = nearer_low(Fraction(a), Fraction(b))
        if b == float(f) and (side is True or (side is None and _even(a))):
            return a  # the real lies below the lower midpoint
        if a == float(f) and (side is False or (side is None and _even(b))):
            return b  # the real lies above the upper midpoint
    return float(f)


def _rn32_fraction(x: Fraction) -> float:
    """The fp32 value nearest to the rational ``x`` (ties to even; +-inf past the range)."""
    if x < 0:
        return -_rn32_fraction(-x)
    if x >= _OVERFLOW:
        return math.inf
    if x == 0:
        return 0.0

    def below(a: Fraction, b: Fraction) -> bool | None:
        mid = (a + b) / 2
        return None if x == mid else x < mid

    return _nearest(float(np.float32(min(float(x), 3.4028234663852886e38))), below)


def _rn32_sqrt_fraction(x: Fraction) -> float:
    """The fp32 value nearest to sqrt(x) for rational ``0 < x < 2**100`` (exact comparisons of squares)."""

    def below(a: Fraction, b: Fraction) -> bool | None:
        mid2 = ((a + b) / 2) ** 2  # sqrt(x) < (a + b) / 2  <=>  x < ((a + b) / 2)**2
        return None if x == mid2 else x < mid2

    return _nearest(float(np.float32(math.sqrt(float(x)))), below)


def host_scalars(step: int, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> dict[str, float]:
    """The contract's fp32 scalars of one step, from exact rational arithmetic (the definition)."""
    f_lr, f_b1, f_b2, f_wd = Fraction(lr), Fraction(beta1), Fraction(beta2), Fraction(weight_decay)
    return {
        "b1": _rn32_fraction(f_b1), "c1": _rn32_fraction(1 - f_b1),
        "b2": _rn32_fraction(f_b2), "c2": _rn32_fraction(1 - f_b2),
        "eps": _rn32_fraction(Fraction(eps)),
        "decay": _rn32_fraction(1 - f_lr * f_wd),
        "step_size": _rn32_fraction(f_lr / (1 - f_b1**step)),
        "bc2_sqrt": _rn32_sqrt_fraction(1 - f_b2**step),
    }


def _rn(x64: torch.Tensor) -> torch.Tensor:
    """fp64 -> fp32: one fp64 operation on fp32 operands then this rounding is the correctly
    rounded fp32 result for + - * / (53 >= 2 * 24 + 2)."""
    return x64.to(torch.float32)


def reference(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
              step: int, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
              weight_decay: float = 0.01) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step (the definition of ``adamw``'s bits).

    Parameters
    ----------
    param, exp_avg, exp_avg_sq : Tensor, float32, [*] (one shape)
        fp32 master weights and the two moments before the step.
    grad : Tensor, float32, bfloat16 or float16, [*] (same shape)
    step : int
        The step number after this update (1 for the first step), >= 1.
    lr, beta1, beta2, eps, weight_decay : float
        As torch.optim.AdamW (fp64 values): 0 <= beta < 1, eps > 0, lr >= 0, weight_decay >= 0.

    Returns
    -------
    (param', exp_avg', exp_avg_sq') : three float32 tensors of param's shape

    Bitwise semantics
    -----------------
    Scalars (exact real arithmetic on the fp64 inputs, one rounding each): ``b1 = RN32(beta1)``,
    ``c1 = RN32(1 - beta1)``, ``b2``, ``c2`` likewise, ``eps32 = RN32(eps)``,
    ``decay = RN32(1 - lr * weight_decay)``, ``step_size = RN32(lr / (1 - beta1**step))``,
    ``bc2_sqrt = RN32(sqrt(1 - beta2**step))``. Elementwise, every operation one IEEE fp32
    rounding to nearest-even, no fused multiply-add::

        g  = fp32(grad)                                   (exact)
        m' = RN(RN(b1 * m) + RN(c1 * g))
        v' = RN(RN(b2 * v) + RN(RN(c2 * g) * g))
        d  = RN(RN(sqrt_rn(v') / bc2_sqrt) + eps32)
        p' = RN(RN(p * decay) - RN(step_size * RN(m' / d)))

    Non-finite values follow IEEE through these steps; NaN outputs are canonical (P8).
    Invariances: batch, permutation, repeat (elementwise). Contract ``adamw`` version 1.
    """
    s = host_scalars(step, lr, beta1, beta2, eps, weight_decay)
    f64 = torch.float64
    p, m, v = param.to(f64), exp_avg.to(f64), exp_avg_sq.to(f64)
    g = grad.to(torch.float32).to(f64)
    m_new = _rn(_rn(s["b1"] * m).to(f64) + _rn(s["c1"] * g).to(f64))
    v_new = _rn(_rn(s["b2"] * v).to(f64) + _rn(_rn(s["c2"] * g).to(f64) * g).to(f64))
    root = sqrt_rn(v_new).to(f64)
    d = _rn(_rn(root / s["bc2_sqrt"]).to(f64) + s["eps"])
    u = _rn(m_new.to(f64) / d.to(f64))
    p_new = _rn(_rn(p * s["decay"]).to(f64) - _rn(s["step_size"] * u.to(f64)).to(f64))
    return canonicalize(p_new), canonicalize(m_new), canonicalize(v_new)


# --------------------------------------------------------------------------- cases


def _state(case: str, shape: tuple[int, ...], grad_dtype: torch.dtype = torch.float32,
           grad_std: float = 1e-3) -> dict[str, torch.Tensor]:
    """Weights ~ N(0, 0.02), gradients ~ N(0, grad_std), moments of a few earlier steps."""
    s = seed_of("adamw", case)
    param = normal(seed_of(s, "p"), shape, std=0.02, dtype=torch.float32)
    grad = normal(seed_of(s, "g"), shape, std=grad_std, dtype=torch.float64).to(grad_dtype)
    m = normal(seed_of(s, "m"), shape, std=grad_std / 3, dtype=torch.float32)
    v = (normal(seed_of(s, "v"), shape, std=grad_std, dtype=torch.float64) ** 2).to(torch.float32)
    return {"param": param, "grad": grad, "exp_avg": m, "exp_avg_sq": v}


_HYPER = {"lr": 1e-6, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def _case(case: str, shape: tuple[int, ...], step: int, **kw: Any) -> dict[str, Any]:
    grad_dtype = kw.pop("grad_dtype", torch.float32)
    grad_std = kw.pop("grad_std", 1e-3)
    state = _state(case, shape, grad_dtype, grad_std)
    if step == 1:  # the first update starts from zero moments
        state["exp_avg"], state["exp_avg_sq"] = torch.zeros(shape), torch.zeros(shape)
    return {**state, "step": step, **{**_HYPER, **kw}}


def _hyper_sweep() -> dict[str, Any]:
    """Other betas, eps and decay than the defaults, with a larger learning rate."""
    return _case("sweep", (257,), step=7, lr=3.0e-4, beta1=0.95, beta2=0.98, eps=1e-6, weight_decay=0.1)


def golden_cases() -> list[Case]:
    """Typical RL fine-tuning steps: lr 1e-6 .. 3e-4, steps 1 .. 5000, several shapes and grad dtypes."""
    cases = [
        Case("first_step_1024", "golden", lambda: _case("first", (1024,), step=1)),
        Case("step10_64x48", "golden", lambda: _case("s10", (64, 48), step=10, lr=1e-5)),
        Case("step200_bf16_grad", "golden", lambda: _case("bf16", (33, 65), step=200, grad_dtype=torch.bfloat16)),
        Case("step5000_fp16_grad", "golden", lambda: _case("fp16", (4097,), step=5000, grad_dtype=torch.float16)),
        Case("betas_0.95_0.98", "golden", _hyper_sweep),
        Case("no_decay_lr3e-4", "golden", lambda: _case("nodecay", (511,), step=3, lr=3e-4, weight_decay=0.0)),
        Case("large_grads", "golden", lambda: _case("large", (300,), step=2, grad_std=10.0, lr=1e-3)),
        Case("B1M", "golden", lambda: _case("big", (1 << 20,), step=50), full_only=True),
    ]
    return cases


def _pin_scalars() -> list[Case]:
    """Scalars whose exact value lies within a hair of an fp32 rounding boundary, so a scalar
    computed with an extra rounding (fp32 arithmetic, fp64 pow then division) lands on the
    other side; and steps where beta**step is far below an fp32 ulp of 1."""
    out = []
    for name, step, kw in (
        ("lr_over_bc1", 3, {"lr": 2.0**-10 * 1.0000001, "beta1": 0.5}),
        ("bc2_sqrt_step2", 2, {"beta2": 0.75}),
        ("decay_tie", 1, {"lr": 2.0**-12, "weight_decay": 2.0**-13 + 2.0**-40}),
        ("beta2_0.999_step1", 1, {"beta2": 0.999, "lr": 1e-3}),
        ("beta_pow_tiny", 3000, {"beta1": 0.9, "beta2": 0.99}),
        ("eps_1e-12", 4, {"eps": 1e-12}),
        ("c1_c2_odd", 5, {"beta1": 0.8999999761581421, "beta2": 0.9990000128746033}),
    ):
        out.append(Case(f"scalars_{name}", "adversarial", lambda name=name, step=step, kw=kw:
                        _case(f"pin_{name}", (129,), step=step, **kw)))
    return out


def _specials() -> dict[str, Any]:
    """Special values in every operand slot: zeros of both signs, subnormals, inf, NaN, extremes."""
    sv = special_values(torch.float32)
    n = len(sv)
    base = _state("specials", (n * 4,))
    base["param"][:n] = sv
    base["grad"][n:2 * n] = sv
    base["exp_avg"][2 * n:3 * n] = sv
    base["exp_avg_sq"][3 * n:] = sv.abs()
    return {**base, "step": 3, **_HYPER}


def _subnormal_moments() -> dict[str, Any]:
    """Tiny gradients: c2 * g * g underflows to subnormals and zero, v' and sqrt(v') subnormal."""
    d = _case("subn", (513,), step=2, grad_std=1e-20)
    d["exp_avg_sq"] = (d["exp_avg_sq"] * 1e-30).to(torch.float32)
    return d


def _ties() -> dict[str, Any]:
    """Gradients and moments on coarse binary grids so that products and sums meet halfway points."""
    s = seed_of("adamw", "ties")
    k = torch.from_numpy((uniform(seed_of(s, "k"), (4, 1024)) * 2**12).astype(np.int64))
    g = ((k[0] - 2**11).to(torch.float32) * 2.0**-14)
    m = ((k[1] - 2**11).to(torch.float32) * 2.0**-16)
    v = (k[2].to(torch.float32) * 2.0**-28)
    p = ((k[3] - 2**11).to(torch.float32) * 2.0**-10)
    return {"param": p, "grad": g, "exp_avg": m, "exp_avg_sq": v, "step": 2, "lr": 0.25, "beta1": 0.5,
            "beta2": 0.75, "eps": 2.0**-20, "weight_decay": 0.5}


def _pin_elementwise() -> dict[str, Any]:
    """Bit patterns spread over every binade a moment or weight takes, with hyper-parameters that
    make every product inexact: the order of the two products in v', eps before or after the
    bias correction, the reciprocal instead of the division, lerp instead of the two products."""
    s = seed_of("adamw", "pin_elementwise")
    raw = torch.from_numpy((uniform(seed_of(s, "bits"), (4, 4096)) * 2**31).astype(np.int64))
    expo = torch.from_numpy((uniform(seed_of(s, "e"), (4, 4096)) * 24).astype(np.int64))
    mant = (raw & 0x7FFFFF) | 0x3F800000
    vals = from_bits(mant.reshape(-1).tolist(), torch.float32).reshape(4, 4096) * torch.pow(2.0, -expo.float())
    sign = torch.where(raw[:, :1].expand(4, 4096) % 2 == 0, 1.0, -1.0)
    return {"param": vals[0] * sign[0] * 0.05, "grad": vals[1] * 1e-3 * sign[1], "exp_avg": vals[2] * 1e-3,
            "exp_avg_sq": vals[3] * 1e-6, "step": 13, "lr": 7.3e-4, "beta1": 0.91, "beta2": 0.997,
            "eps": 3.3e-7, "weight_decay": 0.037}


def adversarial_cases() -> list[Case]:
    return [
        *_pin_scalars(),
        Case("specials", "adversarial", _specials),
        Case("subnormal_moments", "adversarial", _subnormal_moments),
        Case("ties", "adversarial", _ties),
        Case("pin_elementwise", "adversarial", _pin_elementwise),
        Case("zero_grad", "adversarial", lambda: (lambda d: {**d, "grad": torch.zeros_like(d["grad"])})(
            _case("zero_grad", (65,), step=4))),
        Case("lr_zero", "adversarial", lambda: _case("lr0", (65,), step=4, lr=0.0)),
        Case("noncontiguous", "adversarial", lambda: (lambda d: {**d, **{k: d[k].T for k in
                                                                       ("param", "grad", "exp_avg", "exp_avg_sq")}})(
            _case("nc", (17, 9), step=3))),
        Case("empty", "adversarial", lambda: _case("empty", (0, 5), step=1)),
        Case("scalar_param", "adversarial", lambda: _case("scalar", (), step=1)),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """A slice alone vs inside larger tensors (how a flat buffer or a TP shard holds it), a
    permuted tensor, repeated runs."""
    keys = ("param", "grad", "exp_avg", "exp_avg_sq")

    def sub(d: dict[str, Any], idx: Any) -> dict[str, Any]:
        return {**d, **{k: d[k][idx] for k in keys}}

    def batch(run: Any) -> tuple[Any, Any]:
        d = _case("inv_batch", (4099,), step=9, lr=1e-4)
        alone = run("adamw", **sub(d, slice(1000, 1100)))
        inside = [tuple(t[1000 - a:1100 - a] for t in run("adamw", **sub(d, slice(a, b))))
                  for a, b in ((0, 4099), (999, 1101), (500, 2048))]
        return [alone] * len(inside), inside

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _case("inv_perm", (777,), step=5)
        perm = torch.from_numpy(np.argsort(uniform(seed_of("adamw", "perm"), (777,))))
        return tuple(t[perm] for t in run("adamw", **d)), run("adamw", **sub(d, perm))

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _case("inv_repeat", (1025,), step=2)
        first = run("adamw", **d)
        return [first, first], [run("adamw", **d) for _ in range(2)]

    return [
        InvarianceCase("slice_inside_buffers", "batch", batch),
        InvarianceCase("permuted", "permutation", permutation),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_adamw(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                step: int, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.optim.AdamW's single-tensor step (functional, out of place): the native baseline."""
    p, m, v = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    g = grad.float()
    p.mul_(1 - lr * weight_decay)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    denom = (v.sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    p.addcdiv_(m, denom, value=-lr / (1 - beta1**step))
    return p, m, v


def bench_cases() -> list[BenchCase]:
    def make(n: int) -> Any:
        def build(device: torch.device) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(0)
            t = [torch.randn(n, generator=g, device=device) for _ in range(4)]
            return {"param": t[0] * 0.02, "grad": t[1] * 1e-3, "exp_avg": t[2] * 1e-4,
                    "exp_avg_sq": (t[3] * 1e-3) ** 2, "step": 10, **_HYPER}
        return build

    # reads 4 and writes 3 fp32 tensors; ~20 flops per element
    return [BenchCase(name=f"n{n}", make=make(n), native=torch_adamw, flops=20.0 * n, bytes=28.0 * n,
                      sizes=sizes) for n, sizes in ((1 << 20, ("small", "large")), (1 << 26, ("large",)))]
