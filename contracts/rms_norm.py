"""RMSNorm: ``y = weight * (x / sqrt(mean(x**2) + eps))`` over the last axis, bit-exact.

The order of operations follows Hugging Face's Qwen3 ``Qwen3RMSNorm`` (normalise in fp32,
round to the input dtype, then multiply by the weight), so users see the values they know;
the one reduction is an exact fixed-point sum (R3), so the bits do not depend on how a
backend tiles, splits or orders the hidden axis.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fixed import F_SUM, fixed_sum
from rlkernel.contracts._exact.fp32 import canonicalize, round_to, sqrt_rn
from rlkernel.contracts._gen import normal, seed_of, special_values, with_outlier_channels

#: Largest hidden size: H terms of magnitude <= 2**40 must sum below 2**63 (P4, F = 40).
MAX_HIDDEN = 1 << 22

CONTRACT = Contract(
    name="rms_norm",
    version=1,
    summary="y = RN(fp32(w) * RN(fp32(x) * (1 / sqrt(fixed_sum(x*x) / H + eps)))) over the last axis",
    invariances=("batch", "permutation", "reduction_order", "repeat"),
    dtypes={
        "x": (torch.bfloat16, torch.float16, torch.float32),
        "weight": (torch.bfloat16, torch.float16, torch.float32),
    },
    parameters={
        "sum_frac_bits": "F = 40: fraction bits of the max grid of S (2**(E - 40)); H * 2**40 < 2**63",
        "sum_grid_exponent": "max grid: E = expo(max_i sq_i) per row (a zero row sums to +0 on any grid)",
        "sum_term_rounding": "each sq_i rounded half to even to a multiple of 2**(E - 40)",
        "sum_total_rounding": "the exact int64 total rounded once to fp32, half to even (P3), then scaled",
        "sum_specials": "an infinite (overflowed) square makes S = inf, a NaN makes S NaN (IEEE sum of the "
                        "non-finite terms)",
        "mean_division": "mean = RN32(S ÷ fp32(H)), one IEEE division",
        "rsqrt": "r = RN32(1 ÷ sqrt_rn(mean + eps)): correctly rounded sqrt, then one IEEE division",
        "eps_rounding": "eps rounded once to fp32, to nearest even, and added to the fp32 mean",
        "h_rounding": "h = RN32(xf * r) rounded to x's dtype (nearest even) before the gain",
        "output_rounding": "y = RN(fp32(w) * h) to x's dtype, nearest even (overflow to inf)",
    },
)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMS normalisation over the last axis (the definition of ``rms_norm``'s bits).

    ``y = RN_dtype(fp32(weight) * RN_dtype(fp32(x) * (1 / sqrt(S / H + eps))))`` with
    ``S = fixed_sum(fp32(x) * fp32(x))``.

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [*, H]
        Rows to normalise (``*`` may be empty or hold zero rows). For Qwen3's QK-norm pass
        ``[T, heads, D]``: each head is a row.
    weight : Tensor, x's dtype or float32, [H]
        Per-channel gain.
    eps : float
        Added to the mean square; rounded once to fp32 (default 1e-6). Finite and >= 0.

    Returns
    -------
    Tensor, x's dtype, [*, H]

    Bitwise semantics
    -----------------
    Per row, with ``xf = fp32(x)`` and every fp32 operation one IEEE round-to-nearest-even:

    1. ``sq_i = RN32(xf_i * xf_i)``.
    2. ``S = fixed_sum(sq)`` on the max grid with F = 40 fraction bits (P4): each term is
       rounded half-to-even to ``2**(expo(max sq) - 40)``, the integers are summed exactly,
       the total rounded once to fp32. Any order of the hidden axis gives the same ``S``.
    3. ``mean = S ÷ fp32(H)``; ``r = 1 ÷ sqrt(mean + fp32(eps))`` (IEEE division and sqrt,
       no rsqrt approximation).
    4. ``h = RN32(xf * r)``, then rounded to x's dtype (for fp32 x: no second rounding).
    5. ``y = RN_dtype(fp32(weight) * fp32(h))``; NaN canonical.

    Special values follow from the formula: a NaN in the row makes the row NaN; an inf makes
    ``S = inf``, ``r = 0``, so inf entries give NaN and finite entries ±0 (as in PyTorch);
    squares that overflow fp32 (|x| > ~1.8e19) behave as inf; a zero row gives zeros (with
    eps > 0). ``H = 0`` or zero rows give an empty output. H <= 2**22 (bound of the exact sum).

    Invariances: batch, permutation (rows are independent), reduction_order (permuting the
    hidden axis of x and weight together permutes y the same way), repeat.

    Contract ``rms_norm`` version 1.
    """
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(f"rms_norm: hidden size {hidden} exceeds the exact-sum bound {MAX_HIDDEN}")
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype)
    xf = x.to(torch.float32)
    sq = xf * xf
    s = fixed_sum(sq, dim=-1, frac_bits=F_SUM, op="rms_norm")
    mean = s / torch.tensor(float(hidden), dtype=torch.float32)
    eps32 = torch.tensor(eps, dtype=torch.float32)
    r = torch.tensor(1.0, dtype=torch.float32) / sqrt_rn(mean + eps32)
    h = (xf * r.unsqueeze(-1)).to(x.dtype).to(torch.float32)
    y = weight.to(torch.float32) * h
    return round_to(y, x.dtype) if x.dtype != torch.float32 else canonicalize(y)


# --------------------------------------------------------------------------- cases


def _weight(seed: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    """Gains near 1 (as trained RMSNorm weights are): ``1 + 0.1 * z``, rounded once."""
    z = normal(seed, (hidden,), std=0.1, dtype=torch.float64)
    return (1.0 + z).to(dtype)


def _inputs(case: str, shape: tuple[int, ...], dtype: torch.dtype, w_dtype: torch.dtype | None = None,
            std: float = 1.0, eps: float = 1e-6) -> dict[str, Any]:
    x = normal(seed_of("rms_norm", case, "x"), shape, std=std, dtype=dtype)
    w = _weight(seed_of("rms_norm", case, "w"), shape[-1], w_dtype or dtype)
    return {"x": x, "weight": w, "eps": eps}


def golden_cases() -> list[Case]:
    """Qwen3 shapes: hidden 4096 (input/post-attention norm), QK-norm over head_dim 128."""
    specs: list[tuple[str, tuple[int, ...], torch.dtype, torch.dtype | None, bool]] = [
        ("hidden4096_bf16", (7, 4096), torch.bfloat16, None, False),
        ("hidden4096_fp16", (5, 4096), torch.float16, None, False),
        ("hidden4096_fp32", (3, 4096), torch.float32, None, False),
        ("hidden4096_bf16_fp32_weight", (4, 4096), torch.bfloat16, torch.float32, False),
        ("qknorm_q_bf16", (5, 32, 128), torch.bfloat16, None, False),
        ("qknorm_k_fp16", (5, 8, 128), torch.float16, None, False),
        ("h1_bf16", (6, 1), torch.bfloat16, None, False),
        ("h7_fp32", (4, 7), torch.float32, None, False),
        ("h129_fp16", (9, 129), torch.float16, None, False),
        ("h1000_bf16", (3, 1000), torch.bfloat16, None, False),
        ("prefill2048_bf16", (2048, 4096), torch.bfloat16, None, True),
    ]
    return [
        Case(name, "golden", lambda n=name, s=shape, d=dt, w=wdt: _inputs(n, s, d, w), full_only=full)
        for name, shape, dt, wdt, full in specs
    ]


def _adv_specials(dtype: torch.dtype) -> dict[str, Any]:
    """One special value per row (±0, ±inf, NaN, subnormals, extremes), a zero row, a tiny row."""
    hidden = 33
    sv = special_values(dtype)
    rows = []
    for i in range(sv.numel()):
        row = normal(seed_of("rms_norm", "specials", dtype, i), (hidden,), dtype=dtype)
        row[i % hidden] = sv[i]
        rows.append(row)
    rows.append(torch.zeros(hidden, dtype=dtype))  # all-zero row: y = 0
    rows.append(sv[5].repeat(hidden))  # every entry the smallest subnormal
    rows.append(sv[8].repeat(hidden))  # every entry the largest finite: squares overflow
    rows.append(torch.cat([sv[:2], sv[5:8]]).repeat(hidden // 5 + 1)[:hidden])  # zeros and subnormals
    x = torch.stack(rows)
    return {"x": x, "weight": _weight(seed_of("rms_norm", "specials_w", dtype), hidden, dtype), "eps": 1e-6}


def _adv_ties_bf16() -> dict[str, Any]:
    """Values whose normalised results sit on bf16 rounding ties: x = (1 + k/256), rows of 2**n."""
    hidden = 64
    # bf16 values 1 + k/128: the mean square of a row of equal values v is v*v, r = 1/v (up to
    # eps), so h lands near 1 and fp32(x * r) exercises the tie-breaking of the bf16 cast.
    ks = torch.arange(hidden, dtype=torch.float64)
    x = torch.stack([(1.0 + ks / 128.0) * 2.0**e for e in (-3, 0, 5)]).to(torch.bfloat16)
    w = (1.0 + torch.arange(hidden, dtype=torch.float64) / 256.0).to(torch.bfloat16)  # 1 + k/256: ties
    return {"x": x, "weight": w, "eps": 0.0}


# --------------------------------------------------------------------------- pinning cases
# Rows that make the parameters of the sum S observable (CONTRACT.parameters; the mutation
# test tests/test_mutations.py proves it). A change of a few grid units in S shows only when
# the exact sum sits beside a rounding boundary of S's fp32 value, and only when that ulp of S
# changes r. The "knife-edge" rows put it there: fp32 rows of H = 8 with x_0 = 1 (so E = 1, the
# grid is 2**-39 and S is in [1, 2)), the terms under test, two tuner terms that bring the exact
# integer sum to the chosen value, and zeros; eps = 0 and w = 1, so y_0 = r = 1 ÷ sqrt(S ÷ 8).
#   "above_tie": one unit above the midpoint of two fp32 neighbours, the lower one even
#   "below_tie": one unit below a midpoint whose upper neighbour is even
#   "tie":       exactly on a midpoint whose lower neighbour is even
# where the two neighbours give different r. Inputs are solved with the contract's own
# rounding (bisection over fp32 encodings): the same on every machine.

_PIN_H = 8
_UNITS = 2.0**39  # grid units per 1.0 when E = 1


def _sq_units(x: torch.Tensor) -> torch.Tensor:
    """``RN32(x * x) * 2**39`` exactly, in float64."""
    return (x * x).to(torch.float64) * _UNITS


def _solve_x(target: torch.Tensor) -> torch.Tensor:
    """The largest fp32 x in [0, 1] with ``_sq_units(x) <= target`` (bisection on encodings)."""
    lo = torch.zeros(target.shape, dtype=torch.int64)  # x = 0: 0 units
    hi = torch.full(target.shape, 0x3F800000, dtype=torch.int64)  # x = 1
    while bool((hi - lo > 1).any()):
        mid = (lo + hi) // 2
        ok = _sq_units(mid.to(torch.int32).view(torch.float32)) <= target
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    return lo.to(torch.int32).view(torch.float32)


def _r_of(s: torch.Tensor) -> torch.Tensor:
    """``r = 1 ÷ sqrt_rn(s ÷ 8)`` of the fp32 sums s (the contract's steps 3 with eps = 0)."""
    return torch.tensor(1.0) / sqrt_rn(s / torch.tensor(float(_PIN_H)))


def _edge_sum(s0: int, kind: str) -> int:
    """The first knife-edge sum (grid units) of ``kind`` at least 2**12 units above ``s0`` whose
    two fp32 neighbours give different r (S in [2**39, 2**40): neighbours 2**16 units apart)."""
    ulp = 1 << 16
    first = -(-(s0 + (1 << 12) - ulp // 2) // ulp)
    j = torch.arange(first, first + 64, dtype=torch.int64)
    lower = (j * ulp).to(torch.float64) / _UNITS
    r_lo, r_hi = _r_of(lower.to(torch.float32)), _r_of((lower + ulp / _UNITS).to(torch.float32))
    parity = 1 if kind == "below_tie" else 0
    ok = (r_lo != r_hi) & (j % 2 == parity)
    jj = int(j[ok.nonzero()[0, 0]])
    return jj * ulp + ulp // 2 + {"above_tie": 1, "below_tie": -1, "tie": 0}[kind]


@functools.cache
def _pin_sum_rows() -> torch.Tensor:
    """Knife-edge rows for the sum's grid width, term rounding and total rounding.

    ``above_tie`` rows hold two terms at 0.62 of a grid unit above an even unit (modulo 2):
    half to even rounds each up, so truncation, a grid of 2**-38 (F = 39) and one of 2**-40
    (F = 41) all lower S. ``below_tie`` rows hold two terms at 1.38 (modulo 2), which both grids
    raise, and an exact tie 1/2 (x = 2**-20) that rounding half away from zero raises.
    """
    def near(units: list[float], mod2: float) -> list[float]:
        return _solve_x(torch.tensor([u - (u % 2.0) + mod2 for u in units], dtype=torch.float64)).tolist()

    up, down, tie = near([4.0, 600.0, 12.0, 5000.0], 0.62), near([4.0, 600.0, 12.0, 5000.0], 1.38), 2.0**-20
    fixed = [up[0:2], up[2:4], down[0:2] + [tie], down[2:4] + [tie], [], [tie]]
    kinds = ["above_tie", "above_tie", "below_tie", "below_tie", "tie", "tie"]
    rows = []
    for terms, kind in zip(fixed, kinds):
        row = torch.tensor([1.0, *terms], dtype=torch.float32)
        s0 = int(torch.round(_sq_units(row)).sum())
        rest = _edge_sum(s0, kind) - s0
        coarse = _solve_x(torch.tensor([rest - 2048.0], dtype=torch.float64))
        fine = _solve_x(torch.tensor([rest - float(torch.round(_sq_units(coarse))[0]) + 0.25], dtype=torch.float64))
        row = torch.cat([row, coarse, fine])
        if int(torch.round(_sq_units(row)).sum()) - s0 != rest:
            raise RuntimeError("rms_norm pinning rows: the tuners did not reach the exact sum")
        rows.append(torch.cat([row, torch.zeros(_PIN_H - row.numel())]))
    return torch.stack(rows)


def _pin_sum() -> dict[str, Any]:
    x = _pin_sum_rows().clone()
    return {"x": x, "weight": torch.ones(_PIN_H, dtype=torch.float32), "eps": 0.0}


def _pin_eps() -> dict[str, Any]:
    """eps = 1e-7 (its fp32 value is rounded up) beside mean squares of the same size."""
    x = normal(seed_of("rms_norm", "pin_eps_1e-7_fp32", "x"), (16, 64), std=3.0e-4, dtype=torch.float32)
    return {"x": x, "weight": torch.ones(64, dtype=torch.float32), "eps": 1e-7}


def adversarial_cases() -> list[Case]:
    """Specials, outlier channels, ties, odd lengths, non-contiguous rows, empty batches; pinning cases."""
    cases = [
        Case("pin_sum_knife_edge_fp32", "adversarial", _pin_sum),
        Case("pin_eps_1e-7_fp32", "adversarial", _pin_eps),
    ]
    cases += [
        Case(f"specials_{tag}", "adversarial", lambda d=dt: _adv_specials(d))
        for tag, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32))
    ]

    def outliers(dtype: torch.dtype, tag: str) -> dict[str, Any]:
        x = normal(seed_of("rms_norm", "outliers", tag), (6, 4096), dtype=dtype)
        x = with_outlier_channels(x, seed_of("rms_norm", "outliers_ch", tag), count=4,
                                  factor=300.0 if dtype == torch.float16 else 3000.0)
        return {"x": x, "weight": _weight(seed_of("rms_norm", "outliers_w", tag), 4096, dtype), "eps": 1e-6}

    cases += [
        Case("outliers_bf16", "adversarial", lambda: outliers(torch.bfloat16, "bf16")),
        Case("outliers_fp16", "adversarial", lambda: outliers(torch.float16, "fp16")),
        Case("outliers_fp32", "adversarial", lambda: outliers(torch.float32, "fp32")),
        Case("ties_bf16", "adversarial", _adv_ties_bf16),
        Case("len1_fp32", "adversarial", lambda: _inputs("len1_fp32", (1, 1), torch.float32)),
        Case("len3_bf16", "adversarial", lambda: _inputs("len3_bf16", (5, 3), torch.bfloat16)),
        Case("len17_fp16", "adversarial", lambda: _inputs("len17_fp16", (3, 17), torch.float16)),
        Case("tiny_values_bf16", "adversarial",
             lambda: _inputs("tiny_values_bf16", (4, 129), torch.bfloat16, std=2.0**-70)),
        Case("tiny_values_fp16", "adversarial",
             lambda: _inputs("tiny_values_fp16", (4, 129), torch.float16, std=2.0**-12)),
        Case("huge_values_fp16", "adversarial",
             lambda: _inputs("huge_values_fp16", (4, 129), torch.float16, std=3.0e4)),
        Case("eps_zero_fp32", "adversarial",
             lambda: {**_inputs("eps_zero_fp32", (3, 65), torch.float32), "eps": 0.0}),
        Case("eps_large_bf16", "adversarial",
             lambda: {**_inputs("eps_large_bf16", (3, 65), torch.bfloat16), "eps": 0.5}),
        Case("zero_rows_eps0_bf16", "adversarial",
             lambda: {"x": torch.zeros(2, 16, dtype=torch.bfloat16),
                      "weight": torch.ones(16, dtype=torch.bfloat16), "eps": 0.0}),
        Case("noncontiguous_bf16", "adversarial", _adv_noncontiguous),
        Case("empty_batch_bf16", "adversarial",
             lambda: {"x": torch.empty(0, 128, dtype=torch.bfloat16),
                      "weight": torch.ones(128, dtype=torch.bfloat16), "eps": 1e-6}),
        Case("vector_1d_fp16", "adversarial", lambda: _inputs("vector_1d_fp16", (257,), torch.float16)),
    ]
    return cases


def _adv_noncontiguous() -> dict[str, Any]:
    """Rows taken from a transposed tensor (stride 1 along the batch, not the hidden axis)."""
    base = normal(seed_of("rms_norm", "noncontiguous"), (256, 9), dtype=torch.bfloat16)
    x = base.T  # [9, 256] with stride (1, 9)
    return {"x": x, "weight": _weight(seed_of("rms_norm", "noncontiguous_w"), 256, torch.bfloat16), "eps": 1e-6}


def invariance_cases() -> list[InvarianceCase]:
    """Row alone vs inside batches, permuted batch, permuted hidden axis, repeated runs."""
    hidden = 4096
    w = _weight(seed_of("rms_norm", "inv_w"), hidden, torch.bfloat16)

    def batch(run: Any) -> tuple[Any, Any]:
        rows = normal(seed_of("rms_norm", "inv_batch"), (20, hidden), dtype=torch.bfloat16)
        row = rows[3:4]
        alone = run("rms_norm", x=row, weight=w, eps=1e-6)
        in_batch = [run("rms_norm", x=rows[3 - pos:3 - pos + size], weight=w, eps=1e-6)[pos:pos + 1]
                    for size, pos in ((2, 1), (7, 3), (13, 0), (4, 3))]
        return [alone] * len(in_batch), in_batch

    def permutation(run: Any) -> tuple[Any, Any]:
        x = normal(seed_of("rms_norm", "inv_perm"), (9, hidden), dtype=torch.bfloat16)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run("rms_norm", x=x, weight=w, eps=1e-6)[perm], run("rms_norm", x=x[perm], weight=w, eps=1e-6)

    def reduction_order(run: Any) -> tuple[Any, Any]:
        x = normal(seed_of("rms_norm", "inv_red"), (5, hidden), dtype=torch.bfloat16)
        x = with_outlier_channels(x, seed_of("rms_norm", "inv_red_ch"))
        perms = [torch.arange(hidden - 1, -1, -1), torch.roll(torch.arange(hidden), 1000),
                 torch.arange(hidden).reshape(64, 64).T.reshape(-1)]
        base = run("rms_norm", x=x, weight=w, eps=1e-6)
        expected = [base[:, p] for p in perms]
        actual = [run("rms_norm", x=x[:, p].contiguous(), weight=w[p].contiguous(), eps=1e-6) for p in perms]
        return expected, actual

    def repeat(run: Any) -> tuple[Any, Any]:
        x = normal(seed_of("rms_norm", "inv_repeat"), (33, hidden), dtype=torch.bfloat16)
        first = run("rms_norm", x=x, weight=w, eps=1e-6)
        return [first, first], [run("rms_norm", x=x, weight=w, eps=1e-6) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch),
        InvarianceCase("permuted_batch", "permutation", permutation),
        InvarianceCase("permuted_hidden", "reduction_order", reduction_order),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def _hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Hugging Face ``Qwen3RMSNorm.forward``: the native baseline."""
    xf = x.float()
    var = xf.pow(2).mean(-1, keepdim=True)
    return weight * (xf * torch.rsqrt(var + eps)).to(x.dtype)


def bench_cases() -> list[BenchCase]:
    """Hidden norms, bf16. large: Qwen3-8B, T in 1, 64, 2048, 8192 rows of 4096; small: Qwen3-0.6B,
    T in 1, 64 rows of 1024."""
    cases = []
    shapes = [("qwen3_8b", 4096, "large", t) for t in (1, 64, 2048, 8192)]
    shapes += [("qwen3_0.6b", 1024, "small", t) for t in (1, 64)]
    for model, hidden, size, rows in shapes:

        def make(device: torch.device, t: int = rows, hidden: int = hidden) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(t)
            x = torch.randn(t, hidden, generator=g, device=device).to(torch.bfloat16)
            w = (1.0 + 0.1 * torch.randn(hidden, generator=g, device=device)).to(torch.bfloat16)
            return {"x": x, "weight": w, "eps": 1e-6}

        cases.append(BenchCase(
            name=f"{model}_T{rows}_bf16",
            make=make,
            native=_hf_rms_norm,
            flops=4.0 * rows * hidden,  # square, sum, scale, gain per element
            bytes=2.0 * (2 * rows * hidden + hidden),  # read x and weight, write y (bf16)
            sizes=(size,),
            graph=rows <= 64,
        ))
    return cases
