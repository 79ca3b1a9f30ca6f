"""The k3 estimator of KL(pi || pi_ref) per token (Schulman's "low-variance" KL), bit-exact.

``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1``, the KL penalty / KL loss of PPO and
GRPO trainers (verl ``kl_penalty="low_var_kl"`` without its clamp). Elementwise, with the
contract exponential ``exp_c`` (P6), so every backend gives the same bits and a token whose
two log-probs are equal gets exactly 0.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import from_bits, normal, seed_of, special_values

CONTRACT = Contract(
    name="kl_k3",
    version=1,
    summary="k3 = RN32(RN32(exp_c(d) - d) - 1) with d = RN32(ref_logp - logp), elementwise",
    invariances=("batch", "permutation", "repeat"),
    dtypes={"logp": (torch.float32,), "ref_logp": (torch.float32,)},
    parameters={
        "exp_c": "e = exp_c(d), the contract exponential (P6; every constant is pinned by softmax)",
        "exp_overflow_rule": "exp_c(x) = +inf for x > 89, so k3 = +inf for d > 89",
        "exp_underflow_rule": "exp_c(x) = +0 for x < -104, so k3 = -d - 1 rounded for d < -104",
        "k3_rounding": "k3 = RN32(RN32(e - d) - 1): e - d first, each step one fp32 rounding",
    },
)


def reference(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 KL estimate (the definition of ``kl_k3``'s bits).

    ``k3 = (exp_c(ref_logp - logp) - (ref_logp - logp)) - 1``

    Parameters
    ----------
    logp : Tensor, float32, [*]
        Log-probabilities of the sampled tokens under the current policy.
    ref_logp : Tensor, float32, [*] (same shape)
        Log-probabilities under the reference policy.

    Returns
    -------
    Tensor, float32, [*]

    Bitwise semantics
    -----------------
    Elementwise, each step one IEEE fp32 round-to-nearest-even operation:
    ``d = RN32(ref_logp - logp)``; ``e = exp_c(d)`` (P6); ``k3 = RN32(RN32(e - d) - 1)``.
    So ``logp == ref_logp`` gives exactly +0. Special values follow from the steps: d > 89
    gives e = +inf and k3 = +inf; d = -inf gives e = 0 and k3 = +inf; NaN inputs, or both
    log-probs infinite with the same sign (d = NaN), give NaN (canonical). No clamp is applied
    (verl clamps k3 to [-10, 10]; apply ``torch.clamp`` afterwards if wanted: it is exact).

    Invariances: batch, permutation, repeat (elementwise: an element depends only on its inputs).

    Contract ``kl_k3`` version 1.
    """
    d = ref_logp.to(torch.float32) - logp.to(torch.float32)
    one = torch.ones((), dtype=torch.float32)
    return canonicalize((exp_c(d) - d) - one)


# --------------------------------------------------------------------------- cases


def _inputs(case: str, shape: tuple[int, ...], spread: float = 0.1) -> dict[str, Any]:
    s = seed_of("kl_k3", case)
    z = normal(seed_of(s, "logp"), shape, dtype=torch.float64)
    logp = (-(z.abs() * 2.0)).to(torch.float32)
    ref = (logp.to(torch.float64) + normal(seed_of(s, "d"), shape, std=spread, dtype=torch.float64))
    return {"logp": logp, "ref_logp": ref.to(torch.float32)}


def golden_cases() -> list[Case]:
    """Token log-prob shapes [B, T] with B in {1, 4, 16}, T in {1, 17, 256}; 1-D and 3-D inputs."""
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
    """Every pair of special values, plus differences at and beyond exp_c's range limits."""
    sv = special_values(torch.float32)
    a = sv.repeat_interleave(len(sv))
    b = sv.repeat(len(sv))
    diffs = torch.tensor([88.9, 89.0, 89.5, -103.9, -104.0, -104.5, 80.0, -80.0, 1e-7, -1e-7, 1e-30],
                         dtype=torch.float32)
    logp = torch.cat([a, torch.zeros(len(diffs))])
    ref = torch.cat([b, diffs])
    return {"logp": logp, "ref_logp": ref}


#: Differences d at which a one-ulp change of an exp_c constant (Q4 either way, Q3, log2e,
#: ln2_lo) changes exp_c(d), found by a search around |r| = ln2 / 2; near 0, k3 ~ d**2 / 2
#: cancels, so a one-ulp change of e shows in k3.
_EXP_PROBES = (0xBEAEC5C4, 0xBEAD36B8, 0xC0FF1401, 0xC0D2B77B, 0x3EB0330F, 0x3FDEA691, 0x3F83C3F2, 0x40A7BA0A,
               0x3EB0B381, 0x4073FCE0, 0x414214C9, 0x4201F689)


def _pin_exp() -> dict[str, Any]:
    """exp_c pinned through k3: logp = 0 and ref_logp = the probe d."""
    d = from_bits(list(_EXP_PROBES), torch.float32)
    return {"logp": torch.zeros_like(d), "ref_logp": d}


def adversarial_cases() -> list[Case]:
    return [
        Case("pin_exp", "adversarial", _pin_exp),
        Case("specials", "adversarial", _specials),
        Case("equal_logps", "adversarial",
             lambda: (lambda d: {"logp": d["logp"], "ref_logp": d["logp"].clone()})(_inputs("equal", (4, 33)))),
        Case("tiny_differences", "adversarial", lambda: _inputs("tiny", (4, 65), spread=1e-6)),
        Case("huge_differences", "adversarial", lambda: _inputs("huge", (4, 65), spread=60.0)),
        Case("noncontiguous", "adversarial",
             lambda: (lambda d: {"logp": d["logp"].T, "ref_logp": d["ref_logp"].T})(_inputs("nc", (33, 5)))),
        Case("empty", "adversarial", lambda: {"logp": torch.zeros(0, 7), "ref_logp": torch.zeros(0, 7)}),
        Case("scalar", "adversarial", lambda: {"logp": torch.tensor(-1.5), "ref_logp": torch.tensor(-2.25)}),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """A row alone vs inside batches, a permuted batch, repeated runs."""

    def batch(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_batch", (20, 257), spread=1.0)
        alone = run("kl_k3", logp=d["logp"][3:4], ref_logp=d["ref_logp"][3:4])
        inside = [run("kl_k3", logp=d["logp"][3 - p:3 - p + n], ref_logp=d["ref_logp"][3 - p:3 - p + n])[p:p + 1]
                  for n, p in ((2, 1), (7, 3), (13, 0), (20, 3))]
        return [alone] * len(inside), inside

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_perm", (9, 129), spread=1.0)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run("kl_k3", **d)[perm], run("kl_k3", logp=d["logp"][perm], ref_logp=d["ref_logp"][perm])

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_repeat", (8, 513), spread=1.0)
        first = run("kl_k3", **d)
        return [first, first], [run("kl_k3", **d) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch),
        InvarianceCase("permuted_batch", "permutation", permutation),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's ``low_var_kl`` without the clamp: the native baseline."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def bench_cases() -> list[BenchCase]:
    def make(device: torch.device) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(0)
        logp = -torch.rand(64, 4096, generator=g, device=device) * 8.0
        return {"logp": logp, "ref_logp": logp + 0.1 * torch.randn(64, 4096, generator=g, device=device)}

    n = 64 * 4096
    # milliseconds on a CPU too: the same shape serves both sets
    return [BenchCase(name="B64_T4096", make=make, native=torch_kl_k3, flops=25.0 * n, bytes=12.0 * n,
                      sizes=("small", "large"))]
