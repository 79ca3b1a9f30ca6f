"""GRPO group-relative advantages: ``(r - mean) / (std + eps)`` within each group, bit-exact.

Each row of ``rewards`` is one group (the n responses sampled for one prompt). The mean and the
variance are exact superaccumulator sums (docs/numerics.md P10) rounded once, so the result
does not depend on the order of the responses in a group, on which other groups share the
batch, or on the backend.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact import superacc
from rlkernel.contracts._exact.fp32 import canonicalize, sqrt_rn
from rlkernel.contracts._gen import integers, normal, seed_of, special_values

CONTRACT = Contract(
    name="group_advantages",
    version=1,
    summary="adv = d ÷ (sqrt(RN32(sum d*d) ÷ (n-1)) + eps), d = r - RN32(sum r) ÷ n, per group (row)",
    invariances=("permutation", "reduction_order", "batch", "repeat"),
    dtypes={"rewards": (torch.float32,)},
    parameters={
        "sum_rounding": "sum r and sum d*d are exact P10 sums rounded once to fp32, to nearest, ties to even",
        "mean_division": "mean = RN32(sum r) ÷ fp32(n): one IEEE fp32 division (no reciprocal)",
        "var_squares": "each square RN32(d_i * d_i) is rounded before the exact sum",
        "var_divisor": "var = RN32(sum d*d) ÷ fp32(n - 1) (unbiased, Bessel's n - 1)",
        "sqrt": "std = sqrt(var), the IEEE square root, correctly rounded (to nearest even)",
        "eps": "adv = d ÷ RN32(std + fp32(eps)): eps (host-rounded to fp32, default 1e-6) added to std",
        "singleton": "a group of n = 1 has std = +0 (adv = 0 ÷ eps = +0)",
    },
)


def reference(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Group-normalised advantages (the definition of ``group_advantages``' bits).

    ``adv = (r - mean) / (std + eps)`` per group, ``std`` the unbiased (n - 1) standard deviation.

    Parameters
    ----------
    rewards : Tensor, float32, [G, n]
        One row per group (prompt), one column per sampled response. Zero groups allowed.
    eps : float
        Added to the standard deviation; rounded once to fp32 on the host (default 1e-6).
        Finite and >= 0.
    scale : bool
        True: divide by ``std + eps`` (GRPO). False: return ``r - mean`` only (Dr. GRPO).

    Returns
    -------
    Tensor, float32, [G, n]

    Bitwise semantics
    -----------------
    Per group, every fp32 operation one IEEE round-to-nearest-even rounding:

    1. ``mean = RN32(sum_i r_i) ÷ fp32(n)`` (exact P10 sum, rounded once)
    2. ``d_i = RN32(r_i - mean)``
    3. ``var = RN32(sum_i RN32(d_i * d_i)) ÷ fp32(n - 1)`` (each square rounded, the sum exact);
       ``std = sqrt(var)`` (IEEE); for ``n == 1``: ``std = +0``
    4. ``adv_i = d_i ÷ RN32(std + fp32(eps))`` if ``scale``, else ``adv_i = d_i``

    NaN canonical. Special values follow from the steps: a NaN reward (or +inf and -inf in one
    group) makes the whole group NaN; an infinite reward makes the mean infinite and the group
    NaN; squares that overflow make ``std = inf`` and the advantages ±0 (NaN where d is
    infinite); a constant group gives +0 with ``eps > 0`` and NaN (0 ÷ 0) with ``eps = 0``;
    ``n == 1`` gives ``0 ÷ eps = +0`` (verl instead uses mean 0, std 1 for singleton groups).

    Invariances: permutation (of groups), reduction_order (permuting the responses of a group
    permutes its advantages), batch (a group alone or among others), repeat.

    Contract ``group_advantages`` version 1.
    """
    r = rewards.to(torch.float32)
    g, n = r.shape
    if r.numel() == 0:
        return torch.empty((g, n), dtype=torch.float32)
    n32 = torch.tensor(float(n), dtype=torch.float32)
    mean = superacc.exact_sum(r, dim=1) / n32
    d = r - mean.unsqueeze(1)
    if not scale:
        return canonicalize(d)
    if n > 1:
        var = superacc.exact_sum(d * d, dim=1) / torch.tensor(float(n - 1), dtype=torch.float32)
        std = sqrt_rn(var)
    else:
        std = torch.zeros(g, dtype=torch.float32)
    eps32 = torch.tensor(float(eps), dtype=torch.float64).to(torch.float32)
    return canonicalize(d / (std + eps32).unsqueeze(1))


# --------------------------------------------------------------------------- cases


def _binary(case: str, groups: int, n: int) -> torch.Tensor:
    """Verifier rewards: 0/1 correctness per response."""
    return integers(seed_of("group_advantages", case, "bin"), (groups, n), 0, 2).to(torch.float32)


def _scored(case: str, groups: int, n: int, std: float = 1.0) -> torch.Tensor:
    """Reward-model scores."""
    return normal(seed_of("group_advantages", case, "rm"), (groups, n), std=std, dtype=torch.float32)


def golden_cases() -> list[Case]:
    """GRPO shapes: G groups of n in {1, 4, 8, 16, 64}; 0/1 rewards and reward-model scores."""
    cases = []
    for g, n in ((1, 16), (4, 8), (16, 16), (32, 4), (8, 64), (5, 1)):
        cases.append(Case(f"binary_G{g}_n{n}", "golden", lambda g=g, n=n: {"rewards": _binary(f"{g}_{n}", g, n)}))
        cases.append(Case(f"scored_G{g}_n{n}", "golden", lambda g=g, n=n: {"rewards": _scored(f"{g}_{n}", g, n)}))
    cases += [
        Case("scored_G16_n16_unscaled", "golden",
             lambda: {"rewards": _scored("unscaled", 16, 16), "scale": False}),
        Case("scored_G16_n16_eps1e-4", "golden", lambda: {"rewards": _scored("eps", 16, 16), "eps": 1e-4}),
        Case("scored_G512_n16", "golden", lambda: {"rewards": _scored("G512", 512, 16)}, full_only=True),
    ]
    # group sizes that are not powers of two: fp32(n) has no exact reciprocal, so the division counts
    for g, n in ((4, 7), (4, 12)):
        cases.append(Case(f"binary_G{g}_n{n}", "golden", lambda g=g, n=n: {"rewards": _binary(f"{g}_{n}", g, n)}))
        cases.append(Case(f"scored_G{g}_n{n}", "golden", lambda g=g, n=n: {"rewards": _scored(f"{g}_{n}", g, n)}))
    return cases


def _specials() -> dict[str, Any]:
    sv = special_values(torch.float32)
    rows = []
    for i in range(len(sv)):
        row = _scored(f"sp{i}", 1, 8)[0]
        row[i % 8] = sv[i]
        rows.append(row)
    return {"rewards": torch.stack(rows)}


def adversarial_cases() -> list[Case]:
    const = torch.tensor([[1.0] * 8, [0.0] * 8, [-0.0] * 8, [3.0e38] * 8])
    return [
        Case("specials", "adversarial", _specials),
        Case("constant_groups", "adversarial", lambda: {"rewards": const.clone()}),
        Case("constant_groups_eps0", "adversarial", lambda: {"rewards": const.clone(), "eps": 0.0}),
        Case("squares_overflow", "adversarial", lambda: {"rewards": _scored("ovf", 3, 8, std=1.0e25)}),
        Case("huge_mean_overflow", "adversarial",
             lambda: {"rewards": torch.tensor([[3.0e38, 3.0e38, 3.0e38, -1.0], [3.0e38, -3.0e38, 1.0, 2.0]])}),
        Case("subnormal_rewards", "adversarial", lambda: {"rewards": _scored("sub", 4, 8, std=2.0**-140)}),
        Case("large_offset", "adversarial",
             lambda: {"rewards": (_scored("off", 4, 16).to(torch.float64) * 1e-3 + 1.0e4).to(torch.float32)}),
        Case("singleton_groups", "adversarial", lambda: {"rewards": _scored("single", 6, 1)}),
        Case("two_responses", "adversarial", lambda: {"rewards": _binary("two", 8, 2)}),
        Case("odd_sizes", "adversarial", lambda: {"rewards": _scored("odd", 3, 17)}),
        Case("noncontiguous", "adversarial", lambda: {"rewards": _scored("nc", 16, 5).T}),
        Case("zero_groups", "adversarial", lambda: {"rewards": torch.zeros(0, 16)}),
        Case("empty_groups", "adversarial", lambda: {"rewards": torch.zeros(3, 0)}),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """Permuted groups, permuted responses, a group alone vs in batches, repeat."""

    def permutation(run: Any) -> tuple[Any, Any]:
        r = _scored("inv_perm", 9, 16)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run("group_advantages", rewards=r)[perm], run("group_advantages", rewards=r[perm])

    def reduction_order(run: Any) -> tuple[Any, Any]:
        r = _scored("inv_order", 6, 16)
        r[1, 3] = 1.0e6  # an outlier: a naive sum's rounding would depend on the order
        exp, act = [], []
        for perm in (torch.arange(15, -1, -1), torch.roll(torch.arange(16), 5)):
            exp.append(run("group_advantages", rewards=r)[:, perm])
            act.append(run("group_advantages", rewards=r[:, perm].contiguous()))
        return exp, act

    def batch(run: Any) -> tuple[Any, Any]:
        r = _scored("inv_batch", 40, 16)
        alone = run("group_advantages", rewards=r[7:8])
        inside = [run("group_advantages", rewards=r[7 - p:7 - p + n])[p:p + 1]
                  for n, p in ((2, 1), (8, 7), (33, 0), (40, 7))]
        return [alone] * len(inside), inside

    def repeat(run: Any) -> tuple[Any, Any]:
        r = _binary("inv_repeat", 64, 8)
        first = run("group_advantages", rewards=r)
        return [first, first], [run("group_advantages", rewards=r) for _ in range(2)]

    return [
        InvarianceCase("permuted_groups", "permutation", permutation),
        InvarianceCase("permuted_responses", "reduction_order", reduction_order),
        InvarianceCase("group_alone_vs_in_batch", "batch", batch),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """verl's GRPO outcome advantage (mean/std per group) in plain PyTorch: the native baseline."""
    mean = rewards.mean(dim=1, keepdim=True)
    d = rewards - mean
    return d / (rewards.std(dim=1, keepdim=True) + eps) if scale else d


def bench_cases() -> list[BenchCase]:
    def make(device: torch.device) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(0)
        return {"rewards": torch.randn(512, 16, generator=g, device=device)}

    n = 512 * 16
    # milliseconds on a CPU too: the same shape serves both sets
    return [BenchCase(name="G512_n16", make=make, native=torch_group_advantages, flops=8.0 * n, bytes=8.0 * n,
                      sizes=("small", "large"))]
