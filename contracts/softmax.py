"""Softmax over the last axis with the contract exponential and an exact probability sum.

``softmax(x) = exp_c(x - max x) ÷ L`` where ``L`` is the exact fixed-point sum of the
numerators on the absolute grid 2**-40 (R3: probabilities lie in [0, 1]), so the bits do not
depend on how a backend splits or orders the reduced axis (vocabulary shards, tiles).
The sibling contract :mod:`rlkernel.contracts.log_softmax` shares every step up to ``L``.
"""

from __future__ import annotations

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

CONTRACT = Contract(
    name="softmax",
    version=1,
    summary="y = RN_out(p ÷ L), p = exp_c(x - max x), L = fixed_sum(p; E = 0, F = 40), last axis",
    invariances=("batch", "permutation", "reduction_order", "repeat"),
    dtypes={"x": (torch.float32, torch.bfloat16, torch.float16)},
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


def make_adversarial_cases(op: str) -> list[Case]:
    """Specials per dtype, ties, grid edges, outliers, odd lengths, strided, empty."""
    cases = [
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
