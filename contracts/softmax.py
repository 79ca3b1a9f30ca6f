"""Softmax over the last axis with the contract exponential and an exact probability sum.

``softmax(x) = exp_c(x - max x) ÷ L`` where ``L`` is the exact fixed-point sum of the
numerators on the absolute grid 2**-40 (R3: probabilities lie in [0, 1]), so the bits do not
depend on how a backend splits or orders the reduced axis (vocabulary shards, tiles).
The sibling contract :mod:`rlkernel.contracts.log_softmax` shares every step up to ``L``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fixed import F_SUM, fixed_sum
from rlkernel.contracts._exact.fp32 import max_r5, round_to
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import from_bits, normal, seed_of, special_values, with_outlier_channels

#: Largest reduced length: N terms of at most 2**40 on the grid must sum below 2**63 (P4).
MAX_N = 1 << 22

#: The probability sum L, shared with log_softmax. (Its rule for non-finite terms is not a
#: parameter here: a NaN p occurs only in rows whose max is NaN or +inf, and every output of
#: such a row is NaN whatever L is.)
SUM_PARAMETERS = {
    "sum_frac_bits": "F = 40: fraction bits of the grid of L (2**-40); count * 2**40 < 2**63",
    "sum_grid_exponent": "absolute grid, E = 0 (p <= 1), not the max grid expo(max p)",
    "sum_term_rounding": "each p_i rounded half to even to a multiple of 2**-40",
    "sum_total_rounding": "the exact int64 total rounded once to fp32, half to even (P3), then scaled by 2**-40",
}

#: exp_c (P6, contracts/_exact/transcendental.py), every constant of the sequence that reaches
#: softmax's bits. Its cut-offs are not listed: any x_max in [88.73, 127] and any x_min in
#: [-126, -103.98] give the same bits (the sequence itself overflows or underflows there), so
#: no one-ulp change of 89 or -104 is observable; softmax never calls exp_c above 0.
EXP_PARAMETERS = {
    "exp_log2e": "LOG2E = 0x3FB8AA3B: t = RN(x * LOG2E)",
    "exp_k_rounding": "k = t rounded to the nearest integer, ties to even (t + 1.5 * 2**23)",
    "ln2_hi": "LN2_HI = 0x3F317200 (ln 2 to 15 bits): r1 = x - k * LN2_HI, exact",
    "ln2_lo": "LN2_LO = 0x35BFBE8E: r = r1 - k * LN2_LO",
    "exp_q0": "Q0 = 0x3EFFFFFE, coefficient of the degree-4 polynomial for (e**r - 1 - r) / r**2",
    "exp_q1": "Q1 = 0x3E2AAA49",
    "exp_q2": "Q2 = 0x3D2AAC79",
    "exp_q3": "Q3 = 0x3C091D01",
    "exp_q4": "Q4 = 0x3AB511F8",
    "exp_underflow_rule": "x < -104 (and -inf) -> +0",
    "exp_nan_rule": "NaN -> NaN",
}

CONTRACT = Contract(
    name="softmax",
    version=1,
    summary="y = RN_out(p ÷ L), p = exp_c(x - max x), L = fixed_sum(p; E = 0, F = 40), last axis",
    invariances=("batch", "permutation", "reduction_order", "repeat"),
    dtypes={"x": (torch.float32, torch.bfloat16, torch.float16)},
    parameters={
        **SUM_PARAMETERS,
        **EXP_PARAMETERS,
        "division": "y = RN32(p ÷ L), one IEEE division (not p * RN(1 / L))",
        "output_rounding": "fp32 -> bf16/fp16 output rounded to nearest, ties to even (overflow to inf)",
    },
)


def out_dtype(x: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The output dtype: ``dtype`` if given (x's dtype or float32), else x's dtype."""
    return x.dtype if dtype is None else dtype


def row_terms(x: torch.Tensor, op: str = "softmax") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The shared steps of softmax and log_softmax over the last axis.

    Returns ``(d, p, L)``: ``d = RN32(fp32(x) - m)`` with ``m`` the R5 max of the row,
    ``p = exp_c(d)`` and ``L = fixed_sum(p)`` on the absolute grid E = 0, F = 40, shaped
    ``[*, 1]`` for broadcasting.
    """
    n = x.shape[-1]
    if n > MAX_N:
        raise ValueError(f"{op}: N = {n} exceeds the exact-sum bound {MAX_N}")
    xf = x.to(torch.float32)
    m = max_r5(xf, dim=-1).unsqueeze(-1)
    d = xf - m
    p = exp_c(d)
    e0 = torch.zeros(p.shape[:-1], dtype=torch.int64)
    big_l = fixed_sum(p, dim=-1, e=e0, frac_bits=F_SUM, op=op).unsqueeze(-1)
    return d, p, big_l


def reference(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Softmax over the last axis (the definition of ``softmax``'s bits).

    ``y = RN_out(p ÷ L)``, ``p = exp_c(fp32(x) - max x)``, ``L = fixed_sum(p)`` (E = 0, F = 40).

    Parameters
    ----------
    x : Tensor, float32/bfloat16/float16, [*, N]
        Logits. N may be 0 (empty output); N <= 2**22.
    dtype : torch.dtype, optional
        Output dtype: x's dtype (default, as ``torch.softmax``) or float32.

    Returns
    -------
    Tensor, ``dtype`` or x's dtype, [*, N]

    Bitwise semantics
    -----------------
    Per row, every fp32 operation one IEEE round-to-nearest-even rounding, no FMA:

    1. ``xf = fp32(x)``; ``m = max(xf)`` (P7: NaN propagates, a zero max is +0).
    2. ``d_i = RN32(xf_i - m)``; ``p_i = exp_c(d_i)`` (the contract exponential, P6), so
       ``p_i`` in [0, 1] and ``p = 1`` at the max.
    3. ``L = fixed_sum(p)`` on the absolute grid ``2**-40`` (P4, E = 0, F = 40): each
       ``p_i`` rounded half-to-even to a multiple of ``2**-40``, the integers summed exactly,
       the total rounded once to fp32. ``L`` in [1, N]. Any order, split or tiling of the
       reduced axis gives the same ``L``.
    4. ``y_i = RN_out(RN32(p_i ÷ L))`` (IEEE division; one more rounding when the output is
       bf16/fp16); NaN canonical.

    Special values: a row holding NaN or +inf is all NaN (``inf - inf``); a row of only
    ``-inf`` is all NaN (``-inf - -inf``), as in PyTorch; ``-inf`` entries of any other row
    give 0. N = 1: ``y = 1`` for finite x. Logits below ``m - 104`` give exactly 0.

    Invariances: batch, permutation (rows are independent), reduction_order (permuting the
    last axis permutes y the same way), repeat.

    Contract ``softmax`` version 1.
    """
    odt = out_dtype(x, dtype)
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=odt)
    _, p, big_l = row_terms(x)
    return round_to(p / big_l, odt)


# --------------------------------------------------------------------------- cases
# Shared with contracts/log_softmax.py: the cases are built for a given op name.


def _logits(op: str, case: str, shape: tuple[int, ...], dtype: torch.dtype, std: float = 3.0) -> torch.Tensor:
    return normal(seed_of(op, case, "x"), shape, std=std, dtype=dtype)


def make_golden_cases(op: str) -> list[Case]:
    """Vocabulary-like rows and small lengths 1, 7, 129, 1000 in fp32/bf16/fp16."""
    specs: list[tuple[str, tuple[int, ...], torch.dtype, float, torch.dtype | None, bool]] = [
        ("n1_fp32", (5, 1), torch.float32, 3.0, None, False),
        ("n7_bf16", (6, 7), torch.bfloat16, 3.0, None, False),
        ("n129_fp16", (4, 129), torch.float16, 3.0, None, False),
        ("n1000_fp32", (4, 1000), torch.float32, 3.0, None, False),
        ("n1000_bf16", (4, 1000), torch.bfloat16, 3.0, None, False),
        ("n1000_bf16_out_fp32", (3, 1000), torch.bfloat16, 3.0, torch.float32, False),
        ("n1000_fp16_out_fp32", (3, 1000), torch.float16, 3.0, torch.float32, False),
        ("attention_like_3d_fp32", (2, 4, 257), torch.float32, 1.0, None, False),
        ("vocab4096_fp32", (2, 4096), torch.float32, 4.0, None, False),
        ("vocab32000_fp32", (4, 32000), torch.float32, 4.0, None, True),
        ("vocab32000_bf16", (4, 32000), torch.bfloat16, 4.0, None, True),
    ]
    cases = []
    for name, shape, dt, std, odt, full in specs:

        def make(n: str = name, s: tuple[int, ...] = shape, d: torch.dtype = dt, sd: float = std,
                 o: torch.dtype | None = odt) -> dict[str, Any]:
            out: dict[str, Any] = {"x": _logits(op, n, s, d, sd)}
            if o is not None:
                out["dtype"] = o
            return out

        cases.append(Case(name, "golden", make, op=op, full_only=full))
    return cases


def _specials(op: str, dtype: torch.dtype) -> dict[str, Any]:
    """Rows with one special value each, all -inf, all NaN, mixed -inf, +inf, ties and zeros."""
    n = 19
    sv = special_values(dtype)
    rows = []
    for i in range(sv.numel()):
        row = _logits(op, f"specials_{dtype}_{i}", (n,), dtype)
        row[(3 * i) % n] = sv[i]
        rows.append(row)
    ninf = from_bits([0xFF800000 if dtype == torch.float32 else (0xFF80 if dtype == torch.bfloat16 else 0xFC00)],
                     dtype)
    rows.append(ninf.repeat(n))  # all -inf: NaN (as torch)
    half_ninf = _logits(op, f"specials_{dtype}_half", (n,), dtype)
    half_ninf[::2] = ninf  # masked logits
    rows.append(half_ninf)
    one_finite = ninf.repeat(n)
    one_finite[7] = 2.5  # a single finite logit: y = 1 there, 0 elsewhere
    rows.append(one_finite)
    rows.append(torch.zeros(n, dtype=dtype))  # ties everywhere: 1/N
    rows.append(sv[:2].repeat(n)[:n])  # +0 and -0 only
    rows.append(sv[5:8].repeat(n)[:n])  # subnormals and the smallest normal
    rows.append(torch.cat([sv[8:9], sv[9:10].repeat(n - 1)]))  # largest finite vs most negative
    return {"x": torch.stack(rows)}


def _ties(op: str) -> dict[str, Any]:
    """Rows whose quotients land on bf16 rounding ties and grid half-way points: p = 2**-k."""
    n = 64
    # logits k * ln2 steps make p_i close to powers of two; repeated values create equal
    # numerators so L is a small multiple of a power of two.
    k = torch.arange(n, dtype=torch.float64) % 8
    rows = [(-k * 0.6931471805599453).to(torch.bfloat16), (-(k // 2)).to(torch.bfloat16),
            torch.full((n,), 1.0, dtype=torch.bfloat16), (-(k * 3.0)).to(torch.bfloat16)]
    return {"x": torch.stack(rows)}


def _grid_edges(op: str) -> dict[str, Any]:
    """Numerators around the 2**-40 quantum of L and the exp_c cut-off (d = -104)."""
    ds = torch.tensor([0.0, -27.0, -27.7, -27.72, -28.0, -28.4, -29.1, -30.0, -50.0, -87.0, -88.0,
                       -103.9, -104.0, -104.1, -150.0], dtype=torch.float32)
    rows = torch.stack([ds, ds + 1.0e3, ds - 17.0])
    rows[2, 0] = 0.0
    return {"x": rows, "dtype": torch.float32}


def _noncontiguous(op: str) -> dict[str, Any]:
    """Rows read with a stride: the transpose of a ``[N, rows]`` tensor."""
    base = _logits(op, "noncontiguous", (300, 6), torch.float32)
    return {"x": base.T}


# --------------------------------------------------------------------------- pinning cases
# Cases that make each numeric parameter (CONTRACT.parameters) observable: a one-step change
# of any of them changes some output bit (tests/test_mutations.py proves it on the generic
# backend). Every input is built from the contract's own exp_c and grid rounding (bisection
# over fp32 encodings), so the rows are the same on every machine.
#
# p reaches log_softmax only through L, which is the exact grid sum rounded once to fp32: a
# change of a few grid units in the sum shows only when the exact sum sits beside a rounding
# boundary of L. The "knife-edge" rows put it there. A row holds the max (p = 1), the terms
# under test, and up to three tuner terms whose numerators bring the exact integer sum S
# (units of 2**-40) to
#   "above_tie": one unit above the midpoint of two fp32 neighbours, the lower one even
#                (any decrease of S rounds L down);
#   "below_tie": one unit below a midpoint whose upper neighbour is even (any increase of S
#                rounds L up);
#   "tie":       exactly on a midpoint whose lower neighbour is even (half to even rounds
#                down, any other rounding up).

#: Arguments d in [-11.8, -0.3] and [-27.7, -11.8] at which a one-ulp change of an exp_c
#: constant (log2e, ln2 hi/lo, the polynomial coefficients) or k rounded down instead of to
#: nearest changes RNE(exp_c(d) * 2**40), found by an exhaustive search of those ranges
#: (the rarest: log2e, the degree-4 coefficient and ln2_lo, with 2 to 17 such arguments each).
_EXP_SUM_PROBES = (0xC0FF1401, 0xC0D2B77B, 0xC0BC893B, 0xC0E8E5C1, 0xC146D6F2, 0xC13C81CE, 0xBEAD36B8,
                   0xBEAEAF26, 0xBEAEC5C4, 0xBEAF9C66, 0xC13C9F79, 0xC13CE78B)
#: Arguments d in [-104, -28.4] (where p = exp_c(d) rounds to 0 on the grid, so L = 1 and the
#: softmax output is p itself) at which a one-ulp change of log2e, ln2_lo, the two highest
#: coefficients, or k rounded half away from zero, changes exp_c(d) (exhaustive search).
_EXP_DEEP_PROBES = (0xC1E3676C, 0xC1E8AA45, 0xC1E33F76, 0xC1E37CAE, 0xC1EBAB88, 0xC2067876, 0xC1F6C2AB,
                    0xC219E0F1, 0xC1E5B6F0, 0xC1E5E016, 0xC20682BD, 0xC22AD25C, 0xC1E55829, 0xC1E64663,
                    0xC1E55171)
#: Sums L at which a one-ulp change of a log_c constant (ln2 hi/lo, sqrt(1/2), each polynomial
#: coefficient) or a head of 11 or 13 bits for f changes log_c(L): the two smallest such L in
#: [1, 64) per change (exhaustive search).
_LOG_PROBES = (0x3F808DDF, 0x3F80B7CC, 0x3F80F7BF, 0x3F81812A, 0x3F8256A6, 0x3F82AA59, 0x3F8560D3, 0x3F85A268,
               0x3F861CAD, 0x3F886A53, 0x3F88BB6E, 0x3F8BF288, 0x3F8C69D9, 0x3F8D4BA7, 0x3F904527, 0x3F9390FA,
               0x3F93E762, 0x3F97356B, 0x3F97C8A2, 0x3F986556, 0x3F9868BE, 0x3F9E5951, 0x3F9E7B74, 0x3FA062B8,
               0x3FA0EAA1, 0x3FA30FD9, 0x3FA77434, 0x3FA78450, 0x3FAA4AC1, 0x3FAD6652, 0x3FB141DC, 0x3FB504F2,
               0x3FB504F3, 0x3FB504F4, 0x3FFEB781, 0x400130D4, 0x4175A0D7, 0x41E98AD9)

_GRID = 2.0**F_SUM
_NEG_INF = float("-inf")


def _f32_of(bits: int) -> float:
    return float(from_bits([bits], torch.float32)[0])


def encoding(magnitude: float) -> int:
    """The binary32 encoding of the positive float ``magnitude`` (rounded to fp32)."""
    return int(torch.tensor(magnitude, dtype=torch.float32).view(torch.int32))


def negative_of_encoding(a: torch.Tensor) -> torch.Tensor:
    """fp32 ``-x`` for the positive binary32 encodings ``a`` (int64)."""
    return -a.to(torch.int32).view(torch.float32)


def grid_position(d: torch.Tensor) -> torch.Tensor:
    """``exp_c(d) * 2**40`` exactly, in float64."""
    return exp_c(d).to(torch.float64) * _GRID


def argument_below(target: torch.Tensor, lo: float = -104.0, hi: float = -0.0) -> torch.Tensor:
    """fp32 d in [lo, hi]: the largest d with ``grid_position(d) <= target`` (float64 [n]).

    Bisection over the encodings of -d, on which exp_c is non-increasing.
    """
    a_lo = torch.full(target.shape, encoding(-hi), dtype=torch.int64)  # units above target (or d = hi)
    a_hi = torch.full(target.shape, encoding(-lo), dtype=torch.int64)  # units at or below target
    a_lo = torch.where(grid_position(negative_of_encoding(a_lo)) <= target, a_lo - 1, a_lo)
    while bool((a_hi - a_lo > 1).any()):
        mid = (a_lo + a_hi) // 2
        ok = grid_position(negative_of_encoding(mid)) <= target
        a_hi = torch.where(ok, mid, a_hi)
        a_lo = torch.where(ok, a_lo, mid)
    return negative_of_encoding(a_hi)


def _fill(rest: torch.Tensor) -> torch.Tensor:
    """Tuner arguments [n, 3] (fp32, -inf where unused) whose grid integers add up to ``rest``.

    A coarse term leaves 2**16 + 2**11 units or a little more, a medium one about 2**11 (its
    resolution is below a quarter unit), a fine one the exact remainder (resolution below 2**-7).
    """
    out = torch.full((rest.shape[0], 3), _NEG_INF, dtype=torch.float32)
    left = rest.clone()
    for col, (floor_units, keep) in enumerate(((1 << 17, (1 << 16) + (1 << 11)), (1 << 12, 1 << 11), (1, 0))):
        use = left >= floor_units
        target = (left - keep).to(torch.float64) + (0.25 if keep == 0 else 0.0)
        d = argument_below(target)
        q = torch.round(grid_position(d)).to(torch.int64)
        out[:, col] = torch.where(use, d, _NEG_INF)
        left = left - torch.where(use, q, 0)
    if bool((left != 0).any()):
        raise RuntimeError("softmax pinning cases: the tuner terms did not reach the exact sum")
    return out


def _edge_target(s0: int, kind: str) -> int:
    """The first knife-edge sum of the given kind at least 2**13 units above ``s0``."""
    s = s0 + (1 << 13)
    while True:
        ulp = 1 << max(s.bit_length() - 24, 0)
        j = -(-(s - ulp // 2) // ulp)  # the lower neighbour of the first midpoint >= s
        if (j % 2 == 1) == (kind != "below_tie"):
            j += 1
        if j + 1 >= 1 << 24:  # the upper neighbour leaves the binade: start in the next one
            s = 1 << (s.bit_length())
            continue
        return j * ulp + ulp // 2 + {"above_tie": 1, "below_tie": -1, "tie": 0}[kind]


def _rows(body: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([r + [_NEG_INF] * (width - len(r)) for r in body], dtype=torch.float32)


def _knife_edge(fixed: list[list[float]], kinds: list[str]) -> torch.Tensor:
    """Rows ``[0, *fixed[i], tuners]`` whose exact sum is the knife-edge of ``kinds[i]``."""
    x = [[0.0, *f] for f in fixed]
    width = max(len(r) for r in x)
    s0 = torch.round(grid_position(_rows(x, width))).sum(dim=1).tolist()
    targets = torch.tensor([_edge_target(int(s), k) - int(s) for s, k in zip(s0, kinds)], dtype=torch.int64)
    return torch.cat([_rows(x, width), _fill(targets)], dim=1)


def _near(units: list[float], mod2: float) -> list[float]:
    """fp32 d whose grid positions ``exp_c(d) * 2**40`` lie at or just below ``units`` rounded
    down to an even number plus ``mod2`` (to within 0.01 for units below 2**13)."""
    return argument_below(torch.tensor([u - (u % 2.0) + mod2 for u in units], dtype=torch.float64)).tolist()


@functools.cache
def tie_argument(units: float) -> float:
    """fp32 d near the grid position ``units`` (in [2**22, 2**23)) whose p is an exact grid tie
    ``2a + 1/2`` (half to even rounds it down to 2a)."""
    start = encoding(-float(argument_below(torch.tensor([units], dtype=torch.float64))[0]))
    cand = negative_of_encoding(torch.arange(start, start + 256, dtype=torch.int64))
    pos = grid_position(cand)
    return float(cand[(pos % 2.0 == 0.5).nonzero()[0, 0]])


@functools.cache
def _pin_sum_grid() -> torch.Tensor:
    """Knife-edge rows for the sum's grid: width, term rounding, and the rounding of L.

    ``above_tie`` rows hold two terms sitting at 0.62 of a grid unit above an even unit
    (modulo 2): half to even rounds each up, so truncation, a coarser grid (2**-39) and a finer
    one (2**-41) all lower S. ``below_tie`` rows hold two terms at 1.38 (modulo 2), which
    both grids raise, and one exact tie 2a + 1/2 that rounding half away from zero raises.
    ``tie`` rows put S on a midpoint (half to even rounds L down, half away up).
    """
    up = _near([4.0, 12.0, 600.0, 5000.0], 0.62)
    down = _near([4.0, 12.0, 600.0, 5000.0], 1.38)
    tie = tie_argument(5.9e6)
    fixed = [up[0:2], up[2:4], up[0:4], down[0:2] + [tie], down[2:4] + [tie], down[0:4] + [tie], [], [tie]]
    kinds = ["above_tie"] * 3 + ["below_tie"] * 3 + ["tie"] * 2
    return _knife_edge(fixed, kinds)


@functools.cache
def _pin_exp_sum() -> torch.Tensor:
    """Each probe of :data:`_EXP_SUM_PROBES` on an ``above_tie`` and on a ``below_tie`` row:
    a one-unit change of its numerator, either way, moves L by one ulp."""
    probes = [_f32_of(b) for b in _EXP_SUM_PROBES]
    return _knife_edge([[p] for p in probes for _ in range(2)], ["above_tie", "below_tie"] * len(probes))


@functools.cache
def _pin_exp_sweep() -> torch.Tensor:
    """exp_c read directly: d in [-104, -28.4] rounds to 0 on the grid, so L = 1 and softmax
    gives p = exp_c(d) itself. One row of the probes :data:`_EXP_DEEP_PROBES`, one of 4096
    evenly spaced encodings of that range (subnormal and normal results)."""
    lo, hi = encoding(28.4), encoding(104.0)
    sweep = negative_of_encoding(torch.linspace(lo, hi, 4096, dtype=torch.float64).round().to(torch.int64))
    probes = [_f32_of(b) for b in _EXP_DEEP_PROBES]
    return _rows([[0.0, *probes], [0.0, *sweep.tolist()]], 4097)


@functools.cache
def _pin_log() -> torch.Tensor:
    """Rows whose L is each value of :data:`_LOG_PROBES` exactly: floor(L) maxima (p = 1) and
    tuners for the fraction. A one-step change of a log_c parameter changes log_c(L)."""
    targets = [_f32_of(b) for b in _LOG_PROBES]
    ones = [int(t) for t in targets]
    rest = torch.tensor([round((t - n) * _GRID) for t, n in zip(targets, ones)], dtype=torch.int64)
    tuners = _fill(rest)
    width = max(ones)
    return torch.cat([_rows([[0.0] * n for n in ones], width), tuners], dim=1)


@functools.cache
def _pin_signed_zero() -> torch.Tensor:
    """A zero max of either sign is +0 (R5): rows whose only finite logits are -0, so L = 1
    and log_softmax gives ``d - log_c(1) = -0 - (+0) = -0`` there."""
    return _rows([[-0.0], [_NEG_INF, -0.0, -200.0], [-0.0, -0.0, -0.0, -0.0]], 4)


def make_pinning_cases(op: str) -> list[Case]:
    """Cases that pin every parameter of CONTRACT.parameters (fp32 in and out, small)."""
    builders = (("pin_sum_grid_fp32", _pin_sum_grid), ("pin_exp_sum_fp32", _pin_exp_sum),
                ("pin_exp_sweep_fp32", _pin_exp_sweep), ("pin_log_fp32", _pin_log),
                ("pin_signed_zero_fp32", _pin_signed_zero))
    return [Case(name, "adversarial", lambda b=build: {"x": b().clone()}, op=op) for name, build in builders]


def make_adversarial_cases(op: str) -> list[Case]:
    """Specials per dtype, ties, grid edges, outliers, odd lengths, strided, empty; pinning cases."""
    cases = make_pinning_cases(op)
    cases += [
        Case(f"specials_{tag}", "adversarial", lambda d=dt: _specials(op, d), op=op)
        for tag, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16))
    ]

    def outliers(dtype: torch.dtype, tag: str) -> dict[str, Any]:
        x = _logits(op, f"outliers_{tag}", (4, 2048), dtype, std=2.0)
        return {"x": with_outlier_channels(x, seed_of(op, "outliers_ch", tag), count=3, factor=15.0)}

    cases += [
        Case("ties_bf16", "adversarial", lambda: _ties(op), op=op),
        Case("grid_edges_fp32", "adversarial", lambda: _grid_edges(op), op=op),
        Case("outliers_fp32", "adversarial", lambda: outliers(torch.float32, "fp32"), op=op),
        Case("outliers_bf16", "adversarial", lambda: outliers(torch.bfloat16, "bf16"), op=op),
        Case("huge_logits_fp16", "adversarial",
             lambda: {"x": _logits(op, "huge_logits_fp16", (3, 129), torch.float16, std=2.0e4)}, op=op),
        Case("tiny_spread_fp32", "adversarial",
             lambda: {"x": _logits(op, "tiny_spread_fp32", (3, 129), torch.float32, std=1e-30)}, op=op),
        Case("len3_fp16", "adversarial", lambda: {"x": _logits(op, "len3_fp16", (4, 3), torch.float16)}, op=op),
        Case("len17_bf16", "adversarial", lambda: {"x": _logits(op, "len17_bf16", (4, 17), torch.bfloat16)}, op=op),
        Case("noncontiguous_fp32", "adversarial", lambda: _noncontiguous(op), op=op),
        Case("empty_batch_bf16", "adversarial", lambda: {"x": torch.empty(0, 100, dtype=torch.bfloat16)}, op=op),
        Case("empty_row_fp32", "adversarial", lambda: {"x": torch.empty(3, 0, dtype=torch.float32)}, op=op),
        Case("vector_1d_fp32", "adversarial", lambda: {"x": _logits(op, "vector_1d_fp32", (77,), torch.float32)},
             op=op),
    ]
    return cases


def make_invariance_cases(op: str) -> list[InvarianceCase]:
    """Row alone vs in batches; permuted batch; permuted/reversed vocabulary; repeated runs."""
    n = 2048

    def batch(run: Any) -> tuple[Any, Any]:
        rows = _logits(op, "inv_batch", (20, n), torch.float32)
        alone = run(op, x=rows[3:4])
        got = [run(op, x=rows[3 - pos:3 - pos + size])[pos:pos + 1] for size, pos in ((2, 1), (7, 3), (13, 0), (4, 3))]
        return [alone] * len(got), got

    def permutation(run: Any) -> tuple[Any, Any]:
        x = _logits(op, "inv_perm", (9, n), torch.bfloat16)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run(op, x=x)[perm], run(op, x=x[perm])

    def reduction_order(run: Any) -> tuple[Any, Any]:
        x = _logits(op, "inv_red", (5, n), torch.float32, std=6.0)
        perms = [torch.arange(n - 1, -1, -1), torch.roll(torch.arange(n), 700),
                 torch.arange(n).reshape(32, 64).T.reshape(-1)]
        base = run(op, x=x)
        return [base[:, p] for p in perms], [run(op, x=x[:, p].contiguous()) for p in perms]

    def repeat(run: Any) -> tuple[Any, Any]:
        x = _logits(op, "inv_repeat", (17, n), torch.bfloat16)
        first = run(op, x=x, dtype=torch.float32)
        return [first, first], [run(op, x=x, dtype=torch.float32) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch, op=op),
        InvarianceCase("permuted_batch", "permutation", permutation, op=op),
        InvarianceCase("permuted_vocab", "reduction_order", reduction_order, op=op),
        InvarianceCase("repeat", "repeat", repeat, op=op),
    ]


#: Qwen3 vocabulary size.
QWEN3_VOCAB = 151936


def make_bench_cases(op: str, native: Callable[..., Any]) -> list[BenchCase]:
    """LM-head-shaped rows of the Qwen3 vocabulary (151936), fp32: T in 1, 64, 256, 2048 (large),
    T in 1, 4 (small)."""
    cases = []
    large, small, both = ("large",), ("small",), ("small", "large")
    for rows, sizes in ((1, both), (64, large), (256, large), (2048, large), (4, small)):

        def make(device: torch.device, t: int = rows) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(t)
            return {"x": 4.0 * torch.randn(t, QWEN3_VOCAB, generator=g, device=device)}

        cases.append(BenchCase(
            name=f"qwen3_vocab_T{rows}_fp32",
            make=make,
            native=native,
            flops=5.0 * rows * QWEN3_VOCAB,  # max, subtract, exp, sum, divide (or log-subtract)
            bytes=4.0 * 2 * rows * QWEN3_VOCAB,  # read x, write y (fp32)
            op=op,
            sizes=sizes,
        ))
    return cases


def golden_cases() -> list[Case]:
    return make_golden_cases("softmax")


def adversarial_cases() -> list[Case]:
    return make_adversarial_cases("softmax")


def invariance_cases() -> list[InvarianceCase]:
    return make_invariance_cases("softmax")


def _native(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.softmax(x, dim=-1, dtype=dtype)


def bench_cases() -> list[BenchCase]:
    return make_bench_cases("softmax", _native)
