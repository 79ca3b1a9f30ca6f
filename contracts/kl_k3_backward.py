"""The gradient of ``kl_k3`` (v1) in logp, bit-exact.

``k3 = exp(d) - d - 1`` with ``d = ref_logp - logp``, so ``d k3 / d logp = 1 - exp(d)``.
``dlogp = kl_k3_backward(grad, logp, ref_logp)`` evaluates it with the forward's ``d`` and the
contract exponential ``exp_c`` (P6), so a token whose two log-probs are equal gets exactly
``g * 0``. The reference policy is never trained: there is no gradient for ``ref_logp``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import from_bits, normal, seed_of, special_values
from rlkernel.contracts.kl_k3 import _EXP_PROBES

CONTRACT = Contract(
    name="kl_k3_backward",
    version=1,
    summary="dlogp = RN32(g * RN32(1 - exp_c(d))), d = RN32(ref_logp - logp), elementwise",
    invariances=("batch", "permutation", "repeat"),
    dtypes={"grad": (torch.float32,), "logp": (torch.float32,), "ref_logp": (torch.float32,)},
    parameters={
        "exp_c": "e = exp_c(d), d = RN32(ref_logp - logp): the forward's d and the contract exponential (P6)",
        "exp_overflow_rule": "exp_c(x) = +inf for x > 89: 1 - e = -inf, dlogp = -inf * g (NaN for g = 0)",
        "exp_underflow_rule": "exp_c(x) = +0 for x < -104: 1 - e = 1, dlogp = g",
        "grad_rounding": "dlogp = RN32(g * RN32(1 - e)): 1 - e rounded first, then the product (not g - g*e)",
    },
)


def reference(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Gradient of ``k3 = kl_k3(logp, ref_logp)`` in logp (the definition of ``kl_k3_backward``'s bits).

    ``dlogp = grad * (1 - exp(ref_logp - logp))``

    Parameters
    ----------
    grad : Tensor, float32, [*] (logp's shape)
        ``g``, the gradient of the forward's output.
    logp : Tensor, float32, [*]
        The forward's current-policy log-probs.
    ref_logp : Tensor, float32, [*]
        The forward's reference log-probs.

    Returns
    -------
    Tensor, float32, [*]

    Bitwise semantics
    -----------------
    Elementwise, each step one IEEE fp32 round-to-nearest-even operation:
    ``d = RN32(ref_logp - logp)``; ``e = exp_c(d)``; ``dlogp = RN32(g * RN32(1 - e))``.
    ``logp == ref_logp`` gives ``g * +0``. Special values follow IEEE: d > 89 gives
    ``1 - e = -inf``, so ``g = 0`` there gives NaN (as PyTorch's ``0 * inf``): a position whose
    gradient is zero (masked out) must still hold log-probs with ``ref_logp - logp <= 89``, or be
    masked before the KL; NaN inputs give the canonical NaN.

    Invariances: batch, permutation, repeat (elementwise).

    Contract ``kl_k3_backward`` version 1.
    """
    d = ref_logp.to(torch.float32) - logp.to(torch.float32)
    one = torch.ones((), dtype=torch.float32)
    return canonicalize(grad.to(torch.float32) * (one - exp_c(d)))


# --------------------------------------------------------------------------- cases


def _inputs(case: str, shape: tuple[int, ...], spread: float = 0.1) -> dict[str, Any]:
    s = seed_of("kl_k3_backward", case)
    z = normal(seed_of(s, "logp"), shape, dtype=torch.float64)
    logp = (-(z.abs() * 2.0)).to(torch.float32)
    ref = logp.to(torch.float64) + normal(seed_of(s, "d"), shape, std=spread, dtype=torch.float64)
    grad = normal(seed_of(s, "grad"), shape, std=1e-3, dtype=torch.float32)
    return {"grad": grad, "logp": logp, "ref_logp": ref.to(torch.float32)}


def golden_cases() -> list[Case]:
    """Token log-prob shapes [B, T]; 1-D and 3-D inputs; narrow and wide differences."""
    cases = [Case(f"B{b}_T{t}", "golden", lambda b=b, t=t: _inputs(f"B{b}_T{t}", (b, t)))
             for b in (1, 4, 16) for t in (1, 17, 256)]
    cases += [
        Case("flat_4096", "golden", lambda: _inputs("flat_4096", (4096,))),
        Case("B4_T256_wide", "golden", lambda: _inputs("wide", (4, 256), spread=3.0)),
        Case("B2_H3_T33", "golden", lambda: _inputs("3d", (2, 3, 33))),
        Case("B64_T4096", "golden", lambda: _inputs("B64_T4096", (64, 4096)), full_only=True),
    ]
    return cases


def _specials() -> dict[str, Any]:
    """Every pair of special values in (logp, ref_logp), then in grad; the exp_c range edges."""
    sv = special_values(torch.float32)
    n = sv.numel()
    diffs = torch.tensor([88.9, 89.0, 89.5, -103.9, -104.0, -104.5, 80.0, -80.0, 1e-7, -1e-7, 1e-30],
                         dtype=torch.float32)
    logp = torch.cat([sv.repeat_interleave(n), torch.zeros(n), torch.zeros(len(diffs))])
    ref = torch.cat([sv.repeat(n), torch.full((n,), -0.5), diffs])
    grad = torch.cat([torch.ones(n * n), sv, torch.ones(len(diffs))])
    return {"grad": grad, "logp": logp, "ref_logp": ref}


def _pin_exp() -> dict[str, Any]:
    """The forward's exp_c probes (a one-ulp change of a constant changes exp_c there), g = 1."""
    d = from_bits(list(_EXP_PROBES), torch.float32)
    return {"grad": torch.ones_like(d), "logp": torch.zeros_like(d), "ref_logp": d}


def _sweep() -> dict[str, Any]:
    """d on a fine grid over [-6, 6] with gradients of varied magnitude: both roundings show."""
    d = torch.linspace(-6.0, 6.0, 4097, dtype=torch.float64).to(torch.float32)
    g = normal(seed_of("kl_k3_backward", "sweep_g"), (4097,), dtype=torch.float32)
    return {"grad": g, "logp": torch.zeros_like(d), "ref_logp": d}


def adversarial_cases() -> list[Case]:
    return [
        Case("pin_exp", "adversarial", _pin_exp),
        Case("d_sweep", "adversarial", _sweep),
        Case("specials", "adversarial", _specials),
        Case("equal_logps", "adversarial",
             lambda: (lambda d: {**d, "ref_logp": d["logp"].clone()})(_inputs("equal", (4, 33)))),
        Case("tiny_differences", "adversarial", lambda: _inputs("tiny", (4, 65), spread=1e-6)),
        Case("huge_differences", "adversarial", lambda: _inputs("huge", (4, 65), spread=60.0)),
        Case("noncontiguous", "adversarial",
             lambda: (lambda d: {k: t.T for k, t in d.items()})(_inputs("nc", (33, 5)))),
        Case("empty", "adversarial",
             lambda: {"grad": torch.zeros(0, 7), "logp": torch.zeros(0, 7), "ref_logp": torch.zeros(0, 7)}),
        Case("scalar", "adversarial",
             lambda: {"grad": torch.tensor(0.75), "logp": torch.tensor(-1.5), "ref_logp": torch.tensor(-2.25)}),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """A row alone vs inside batches, a permuted batch, repeated runs."""
    op = "kl_k3_backward"

    def batch(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_batch", (20, 257), spread=1.0)
        alone = run(op, **{k: t[3:4] for k, t in d.items()})
        inside = [run(op, **{k: t[3 - p:3 - p + n] for k, t in d.items()})[p:p + 1]
                  for n, p in ((2, 1), (7, 3), (13, 0), (20, 3))]
        return [alone] * len(inside), inside

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_perm", (9, 129), spread=1.0)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run(op, **d)[perm], run(op, **{k: t[perm] for k, t in d.items()})

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_repeat", (8, 513), spread=1.0)
        first = run(op, **d)
        return [first, first], [run(op, **d) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch),
        InvarianceCase("permuted_batch", "permutation", permutation),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_autograd(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """torch autograd of verl's ``low_var_kl`` (without the clamp): the native baseline."""
    with torch.enable_grad():
        lp = logp.detach().requires_grad_(True)
        d = ref_logp - lp
        (dlogp,) = torch.autograd.grad(torch.exp(d) - d - 1, (lp,), grad)
    return dlogp


def bench_cases() -> list[BenchCase]:
    def make(device: torch.device) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(0)
        logp = -torch.rand(64, 4096, generator=gen, device=device) * 8.0
        ref = logp + 0.1 * torch.randn(64, 4096, generator=gen, device=device)
        return {"grad": torch.randn(64, 4096, generator=gen, device=device) * 1e-4, "logp": logp, "ref_logp": ref}

    n = 64 * 4096
    return [BenchCase(name="B64_T4096", make=make, native=torch_autograd, flops=25.0 * n, bytes=16.0 * n,
                      sizes=("small", "large"))]
