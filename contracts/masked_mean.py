"""Masked means of per-token values (RL loss aggregation), exact in any micro-batch split.

``masked_mean`` is the loss aggregation of PPO/GRPO trainers (verl's ``agg_loss``): a mean of
per-token values over the tokens a mask keeps, by token or by sequence. Its sums are exact
superaccumulator sums (docs/numerics.md P10), so the result does not depend on the order of
the tokens, on the batch layout, or on how the batch is cut into micro-batches: a micro-batch
returns its exact *partial* (``partial=True``), partials merge by integer addition (in any
order, or through a ``SUM`` all-reduce), and finishing the merged partial gives the bits of the
full batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact import superacc
from rlkernel.contracts._exact.fp32 import canonicalize, int_to_fp32
from rlkernel.contracts._gen import integers, normal, seed_of, special_values

#: Aggregation modes (verl's ``loss_agg_mode`` names).
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: Slots of a partial: the 20 superaccumulator slots (P10) and the count.
PARTIAL_SLOTS = superacc.STATE_SLOTS + 1
COUNT = superacc.STATE_SLOTS

CONTRACT = Contract(
    name="masked_mean",
    version=1,
    summary="mean = RN32(exact sum of the kept values) ÷ fp32(denominator or count), by token or by sequence",
    invariances=("permutation", "reduction_order", "micro_batch", "repeat"),
    dtypes={"x": (torch.float32,), "mask": (torch.bool,), "partials": (torch.int64,)},
    parameters={
        "limb_bits": "P10 limbs of 16 bits: a term +-m * 2**(b - 150) adds +-(m << ((b - 1) mod 16)) to limb "
                     "(b - 1) // 16 (b = max(biased exponent, 1), m the 24-bit significand)",
        "num_limbs": "16 term limbs (limb i weighs 2**(16 i - 149)) and one carry limb (weight 2**107): "
                     "20 state slots, 21 with the count",
        "lsb_exponent": "limb 0's unit is 2**-149, the fp32 subnormal quantum",
        "slot_layout": "slots 0-15 limbs, 16 carry, 17/18/19 the counts of NaN, +inf and -inf terms, 20 the "
                       "count of tokens or sequences",
        "canonical_form": "canonical partial: limbs 0-15 in [0, 2**16) (floor carries), the carry limb signed",
        "rounding": "the exact sum is rounded once to fp32: to nearest, ties to even, a sticky bit for every "
                    "nonzero bit below the kept ones, subnormals exact",
        "overflow": "an exact sum of magnitude >= 2**128 - 2**103 rounds to +-inf",
        "specials": "any NaN term, or both a +inf and a -inf term: NaN; else an infinite term gives that infinity",
        "zero_sign": "a zero exact sum (also of -0 terms only) and the empty sum are +0",
        "seq_mean_rounding": "seq-mean-token-mean: m_b = RN32(exact sum) ÷ fp32(c_b), two roundings per "
                             "sequence, then the exact sum of the m_b",
        "division": "the result is S ÷ fp32(denominator or count): one IEEE fp32 division",
    },
)


def fp32_denominator(denominator: float | int) -> torch.Tensor:
    """``RN32(denominator)`` as a 0-d fp32 tensor (the host-side rounding of the argument)."""
    return torch.tensor(float(denominator), dtype=torch.float64).to(torch.float32)


def partial_of(x: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The exact partial (int64 [21]) of ``x`` [B, T] under ``mask`` [B, T] for ``mode``."""
    if mode not in MODES:
        raise ValueError(f"masked_mean: mode {mode!r}; expected one of {MODES}")
    x = x.to(torch.float32)
    counts = mask.sum(dim=1)  # tokens kept per sequence
    nonempty = counts > 0
    if mode == "seq-mean-token-mean":
        kept = torch.where(mask, x, torch.zeros_like(x))
        seq_sum = superacc.exact_sum(kept, dim=1) if x.shape[1] else torch.zeros(x.shape[0])
        seq_mean = seq_sum / int_to_fp32(counts)  # IEEE division; 0 ÷ 0 rows are excluded below
        terms = seq_mean[nonempty]
        count = int(nonempty.sum())
    else:
        terms = x[mask]
        count = int(mask.sum()) if mode == "token-mean" else int(nonempty.sum())
    state = superacc.state_of(superacc.exact_value(terms), *superacc.special_counts(terms))
    return torch.tensor(state + [count], dtype=torch.int64)


def merge_partials(partials: torch.Tensor) -> torch.Tensor:
    """Canonical merge of partials [K, 21]: exact values and counts added."""
    value = nan = pos = neg = count = 0
    for p in partials.reshape(-1, PARTIAL_SLOTS):
        v, a, b, c = superacc.value_of(p[:COUNT])
        value, nan, pos, neg, count = value + v, nan + a, pos + b, neg + c, count + int(p[COUNT])
    return torch.tensor(superacc.state_of(value, nan, pos, neg) + [count], dtype=torch.int64)


def finish_partial(partial: torch.Tensor, denominator: float | int | None = None) -> torch.Tensor:
    """``RN32(exact sum) ÷ fp32(denominator or count)``: fp32 [] (NaN canonical)."""
    s = torch.tensor(superacc.round_value(*superacc.value_of(partial[:COUNT])), dtype=torch.float64)
    s = s.to(torch.float32)
    d = fp32_denominator(denominator) if denominator is not None else int_to_fp32(partial[COUNT])
    return canonicalize(s / d)


def as_partials(partials: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
    """Partials given as one int64 tensor [..., 21] or a sequence of them, as [K, 21]."""
    if isinstance(partials, torch.Tensor):
        return partials.reshape(-1, PARTIAL_SLOTS)
    if len(partials) == 0:
        return torch.zeros((0, PARTIAL_SLOTS), dtype=torch.int64)
    return torch.cat([p.reshape(-1, PARTIAL_SLOTS) for p in partials])


def reference(x: torch.Tensor | None = None, mask: torch.Tensor | None = None, mode: str = "token-mean",
              denominator: float | int | None = None, partial: bool = False,
              partials: torch.Tensor | Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """Masked mean of per-token values (the definition of ``masked_mean``'s bits).

    ``token-mean``: ``RN32(sum_{mask} x) ÷ fp32(denominator or #tokens)``.

    Parameters
    ----------
    x : Tensor, float32, [B, T], optional
        Per-token values (losses, KL terms, entropies). Values at masked-out positions are
        ignored, whatever they are (NaN and inf included).
    mask : Tensor, bool, [B, T], optional
        True for the tokens that count (response tokens).
    mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}
        How tokens and sequences are weighted (verl's ``loss_agg_mode``); see below.
    denominator : float or int, optional
        Replaces the count in the final division (global normalisation: the token or sequence
        count of the whole global batch, so every micro-batch and rank divides by the same
        number). Rounded once to fp32 on the host; must be finite and > 0.
    partial : bool
        Return the exact partial (int64 [21]) instead of the mean (micro-batching).
    partials : Tensor int64 [K, 21] or [21], or a sequence of them, optional
        Partials of disjoint micro-batches, given instead of ``x`` and ``mask``: they are
        merged (exactly) and finished (``partial=False``) or returned merged (``partial=True``).

    Returns
    -------
    Tensor, float32, [] (the mean) or int64 [21] (the canonical partial)

    Bitwise semantics
    -----------------
    Every sum is an exact superaccumulator sum (P10) of fp32 terms, rounded once to fp32;
    ``fp32(n)`` of a count is its correctly rounded fp32 value; ``÷`` is IEEE fp32 division.
    With ``c_b`` the number of kept tokens of sequence b and ``K = {b : c_b >= 1}``:

    - ``token-mean``: ``S = RN32(sum_{b,t: mask} x_bt)``; ``count = sum_b c_b``.
    - ``seq-mean-token-mean``: ``m_b = RN32(sum_{t: mask} x_bt) ÷ fp32(c_b)`` for b in K
      (two roundings per sequence); ``S = RN32(sum_{b in K} m_b)``; ``count = |K|``.
      Sequences without kept tokens are left out (not 0 ÷ 0).
    - ``seq-mean-token-sum``: ``S = RN32(sum_{b,t: mask} x_bt)`` (the exact sum of the exact
      per-sequence sums); ``count = |K|``.
    - result: ``S ÷ fp32(denominator)`` if a denominator is given, else ``S ÷ fp32(count)``.
      No kept token (all masked, or B = 0) and no denominator: ``+0 ÷ 0 = NaN``, as in
      PyTorch. NaN canonical.

    Special values: a kept NaN, or kept +inf and -inf, make S NaN; a kept infinity makes S
    that infinity; a sum beyond the fp32 range rounds to ±inf. In ``seq-mean-token-mean`` the
    rules apply to the per-sequence sums and then to the sum of the means.

    Partial (int64 [21]): slots 0..19 the canonical P10 state of the terms summed into S
    (tokens, or the sequence means m_b), slot 20 the count. Partials of disjoint sets of
    sequences merge by slot-wise integer addition in any order (``merge`` is that sum,
    normalised), so ``masked_mean(partials=[masked_mean(mb, partial=True) for mb in split])``
    equals ``masked_mean(batch)`` bit for bit for any split of the batch into micro-batches of
    whole sequences (for ``token-mean`` any split of the tokens). The canonical partial of a
    batch equals the merged canonical partials of its micro-batches.

    Invariances: permutation (of sequences), reduction_order (of tokens within a sequence),
    micro_batch, repeat.

    Contract ``masked_mean`` version 1.
    """
    if partials is not None:
        merged = merge_partials(as_partials(partials))
        return merged if partial else finish_partial(merged, denominator)
    if x is None or mask is None:
        raise ValueError("masked_mean: give x and mask, or partials")
    p = partial_of(x, mask, mode)
    return p if partial else finish_partial(p, denominator)


# --------------------------------------------------------------------------- cases


def ragged_mask(seed: int, batch: int, length: int, min_len: int = 1) -> torch.Tensor:
    """A response mask [B, T]: sequence b keeps its first ``len_b`` tokens, len_b in [min_len, T]."""
    lens = integers(seed, (batch,), min_len, length + 1) if batch else torch.zeros(0, dtype=torch.int64)
    return torch.arange(length).unsqueeze(0) < lens.unsqueeze(1)


def _inputs(case: str, batch: int, length: int, mode: str = "token-mean", std: float = 1.0,
            denominator: float | None = None, min_len: int = 1) -> dict[str, Any]:
    x = normal(seed_of("masked_mean", case, "x"), (batch, length), std=std, dtype=torch.float32)
    mask = ragged_mask(seed_of("masked_mean", case, "mask"), batch, length, min_len)
    return {"x": x, "mask": mask, "mode": mode, "denominator": denominator}


def golden_cases() -> list[Case]:
    """RL shapes B in {1, 4, 16}, T in {1, 17, 256}, every mode, with and without a denominator."""
    cases = []
    for b in (1, 4, 16):
        for t in (1, 17, 256):
            for mode in MODES:
                name = f"B{b}_T{t}_{mode}"
                cases.append(Case(name, "golden", lambda n=name, bb=b, tt=t, m=mode: _inputs(n, bb, tt, m)))
    for mode in MODES:
        name = f"B16_T256_{mode}_denominator"
        cases.append(Case(name, "golden", lambda n=name, m=mode: _inputs(n, 16, 256, m, denominator=8192.0)))
        name = f"B16_T256_{mode}_partial"
        cases.append(Case(name, "golden", lambda n=name, m=mode: {**_inputs(n, 16, 256, m), "partial": True}))
    cases.append(Case("B64_T4096_token-mean", "golden", lambda: _inputs("B64_T4096", 64, 4096), full_only=True))
    return cases


def _specials_parts() -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """Rows with one special value kept, and rows with it on a masked-out position (ignored)."""
    sv = special_values(torch.float32)
    kept_x, kept_m, out_x, out_m = [], [], [], []
    for i in range(sv.numel()):
        base = normal(seed_of("masked_mean", "specials", i), (9,), dtype=torch.float32)
        row = base.clone()
        row[i % 9] = sv[i]
        kept_x.append(row)
        kept_m.append(torch.ones(9, dtype=torch.bool))
        masked = base.clone()
        masked[(i + 4) % 9] = sv[i]
        m = torch.ones(9, dtype=torch.bool)
        m[(i + 4) % 9] = False
        out_x.append(masked)
        out_m.append(m)
    out_x.append(torch.full((9,), float("nan")))
    out_m.append(torch.zeros(9, dtype=torch.bool))  # an all-masked row holding NaNs
    return kept_x, kept_m, out_x, out_m


def _specials_rows() -> dict[str, Any]:
    """Specials at kept and at masked-out positions, an all-masked row of NaNs."""
    kx, km, ox, om = _specials_parts()
    return {"x": torch.stack(kx + ox), "mask": torch.stack(km + om)}


def _specials_masked_out() -> dict[str, Any]:
    """Every special value, but only at masked-out positions: the mean is finite."""
    _, _, ox, om = _specials_parts()
    return {"x": torch.stack(ox), "mask": torch.stack(om)}


def _kept_infinities(pos: bool, neg: bool) -> dict[str, Any]:
    """A kept +inf and/or -inf among ordinary values (result ±inf, or NaN with both)."""
    x = normal(seed_of("masked_mean", "kept_inf"), (3, 7), dtype=torch.float32)
    if pos:
        x[0, 2] = float("inf")
    if neg:
        x[2, 6] = float("-inf")
    x[1, 5] = float("nan")  # masked out below: ignored
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 5] = False
    return {"x": x, "mask": mask}


def _cancellation() -> dict[str, Any]:
    """Huge values that cancel exactly, leaving tiny ones (naive fp32 sums lose them)."""
    big = torch.tensor([3.0e38, -3.0e38, 1.0e30, 2.0**-149, -1.0e30, 1.5, 2.0**-126, 7.0e-45], dtype=torch.float32)
    x = torch.stack([big, big.flip(0), big * 0.5, -big])
    return {"x": x, "mask": torch.ones_like(x, dtype=torch.bool)}


def _overflow() -> dict[str, Any]:
    """Kept sums beyond fp32's range (exact sum overflows to +inf, then ÷ count)."""
    x = torch.full((2, 4), 3.0e38, dtype=torch.float32)
    x[1] = -x[1]
    return {"x": x, "mask": torch.tensor([[True] * 4, [True, False, False, False]])}


def _tie_rounding() -> dict[str, Any]:
    """Sums that land exactly halfway between fp32 neighbours (RNE decides), and 1 ulp off."""
    one = 1.0
    half_ulp = 2.0**-24
    x = torch.tensor([[one, half_ulp, 0.0], [one + 2.0**-23, half_ulp, 0.0], [one, half_ulp, 2.0**-149],
                      [one, half_ulp, -(2.0**-149)]], dtype=torch.float32)
    return {"x": x, "mask": torch.ones_like(x, dtype=torch.bool), "denominator": 1.0}


def _kept_specials_partial() -> dict[str, Any]:
    """A partial holding 3 NaN, 2 +inf and 1 -inf kept terms (slots 17, 18, 19) among finite ones."""
    x = normal(seed_of("masked_mean", "kept_specials"), (3, 6), dtype=torch.float32)
    x[0, 1] = x[1, 4] = x[2, 2] = float("nan")
    x[0, 3] = x[2, 5] = float("inf")
    x[1, 0] = float("-inf")
    x[2, 0] = float("-inf")  # masked out below: not counted
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[2, 0] = False
    return {"x": x, "mask": mask, "partial": True}


def _kept_nan() -> dict[str, Any]:
    """One kept NaN among finite values (and a masked-out infinity): the mean is NaN."""
    x = normal(seed_of("masked_mean", "kept_nan"), (3, 7), dtype=torch.float32)
    x[1, 2] = float("nan")
    x[0, 6] = float("inf")
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[0, 6] = False
    return {"x": x, "mask": mask}


def _zero_sums() -> dict[str, Any]:
    """Kept values that cancel exactly, and rows of -0 only: every exact sum is zero, hence +0."""
    t = 2.0**-149
    x = torch.tensor([[1.5, -1.5, -0.0, t, -t], [-0.0, -0.0, -0.0, -0.0, -0.0], [3.0e38, -0.0, -3.0e38, 0.0, -0.0]],
                     dtype=torch.float32)
    return {"x": x, "mask": torch.ones_like(x, dtype=torch.bool), "denominator": 7.0}


def _ties_partial() -> dict[str, Any]:
    """Per-sequence sums at and near fp32 ties (1 + 2**-24 exactly, and + or - 2**-149 from it):
    the partial of the sequence means exposes each rounding (ties to even, the sticky bit)."""
    d = _tie_rounding()
    return {"x": d["x"], "mask": d["mask"], "mode": "seq-mean-token-mean", "partial": True}


def adversarial_cases() -> list[Case]:
    """Specials, masked NaN, all-masked rows and batches, ties, cancellation, subnormals, empty."""
    cases: list[Case] = []
    for mode in MODES:
        cases += [
            Case(f"specials_{mode}", "adversarial", lambda m=mode: {**_specials_rows(), "mode": m}),
            Case(f"specials_masked_out_{mode}", "adversarial", lambda m=mode: {**_specials_masked_out(), "mode": m}),
            Case(f"kept_pos_inf_{mode}", "adversarial", lambda m=mode: {**_kept_infinities(True, False), "mode": m}),
            Case(f"kept_neg_inf_{mode}", "adversarial", lambda m=mode: {**_kept_infinities(False, True), "mode": m}),
            Case(f"kept_both_inf_{mode}", "adversarial", lambda m=mode: {**_kept_infinities(True, True), "mode": m}),
            Case(f"cancellation_{mode}", "adversarial", lambda m=mode: {**_cancellation(), "mode": m}),
            Case(f"overflow_{mode}", "adversarial", lambda m=mode: {**_overflow(), "mode": m}),
            Case(f"all_masked_batch_{mode}", "adversarial",
                 lambda m=mode: {"x": normal(seed_of("masked_mean", "allmasked"), (3, 5), dtype=torch.float32),
                                 "mask": torch.zeros(3, 5, dtype=torch.bool), "mode": m}),
            Case(f"all_masked_rows_{mode}", "adversarial",
                 lambda m=mode: _inputs("all_masked_rows", 6, 17, m, min_len=0)),
            Case(f"empty_batch_{mode}", "adversarial",
                 lambda m=mode: {"x": torch.zeros(0, 8), "mask": torch.zeros(0, 8, dtype=torch.bool), "mode": m}),
            Case(f"subnormals_{mode}", "adversarial", lambda m=mode: _inputs("subnormals", 4, 33, m, std=2.0**-140)),
            Case(f"huge_{mode}", "adversarial", lambda m=mode: _inputs("huge", 4, 33, m, std=1.0e37)),
        ]
    cases += [
        Case("ties_token-mean", "adversarial", _tie_rounding),
        Case("B1_T1_huge_token-mean", "adversarial", lambda: _inputs("B1_T1_huge", 1, 1, std=3.0e38)),
        Case("noncontiguous_token-mean", "adversarial", _noncontiguous),
        Case("denominator_subnormal", "adversarial", lambda: _inputs("den_sub", 4, 17, denominator=1.0e-40)),
        Case("denominator_int", "adversarial", lambda: _inputs("den_int", 4, 17, "seq-mean-token-sum", denominator=7)),
        Case("partials_merge_finish", "adversarial", _partials_case(False)),
        Case("partials_merge", "adversarial", _partials_case(True)),
        Case("kept_specials_partial", "adversarial", _kept_specials_partial),
        Case("kept_nan_token-mean", "adversarial", _kept_nan),
        Case("zero_sums_token-mean", "adversarial", _zero_sums),
        Case("zero_sums_seq-mean-token-mean", "adversarial", lambda: {**_zero_sums(), "mode": "seq-mean-token-mean"}),
        Case("ties_partial_seq-mean-token-mean", "adversarial", _ties_partial),
    ]
    return cases


def _noncontiguous() -> dict[str, Any]:
    x = normal(seed_of("masked_mean", "noncontig"), (33, 6), dtype=torch.float32).T
    mask = ragged_mask(seed_of("masked_mean", "noncontig_mask"), 33, 6).T  # [6, 33], strides (1, 6)
    return {"x": x, "mask": mask}


def _partials_case(partial: bool) -> Any:
    def make() -> dict[str, Any]:
        inp = _inputs("partials", 10, 65, "seq-mean-token-mean")
        parts = [reference(x=inp["x"][a:b], mask=inp["mask"][a:b], mode=inp["mode"], partial=True)
                 for a, b in ((0, 3), (3, 4), (4, 10))]
        return {"partials": torch.stack(parts), "partial": partial}
    return make


def _micro_batches(batch: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Cut [0, batch) into consecutive slices of the given sizes (cycled)."""
    out, start, i = [], 0, 0
    while start < batch:
        stop = min(batch, start + sizes[i % len(sizes)])
        out.append((start, stop))
        start, i = stop, i + 1
    return out


def invariance_cases() -> list[InvarianceCase]:
    """Permuted sequences and tokens, micro-batches of 1/3/mixed sizes in shuffled order, repeat."""
    b, t = 16, 129

    def data(tag: str, mode: str) -> dict[str, Any]:
        inp = _inputs(f"inv_{tag}", b, t, mode, min_len=0)
        inp["x"][2, 5] = 1.0e30  # a huge value that the others cannot absorb in a naive sum
        inp["x"][9, 0] = -1.0e30
        return inp

    def permutation(run: Any) -> tuple[Any, Any]:
        perm = torch.tensor([5, 11, 0, 15, 3, 8, 1, 14, 6, 2, 13, 9, 4, 12, 7, 10])
        exp, act = [], []
        for mode in MODES:
            inp = data("perm", mode)
            exp.append(run("masked_mean", **inp))
            act.append(run("masked_mean", **{**inp, "x": inp["x"][perm], "mask": inp["mask"][perm]}))
        return exp, act

    def reduction_order(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        for mode in MODES:
            inp = data("order", mode)
            for perm in (torch.arange(t - 1, -1, -1), torch.roll(torch.arange(t), 50)):
                exp.append(run("masked_mean", **inp))
                act.append(run("masked_mean", **{**inp, "x": inp["x"][:, perm].contiguous(),
                                                 "mask": inp["mask"][:, perm].contiguous()}))
        return exp, act

    def micro_batch(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        for mode in MODES:
            inp = data("mb", mode)
            full = run("masked_mean", **inp)
            full_partial = run("masked_mean", **inp, partial=True)
            for sizes, order in (((1,), None), ((3,), [5, 0, 3, 1, 4, 2]), ((5, 2, 9), [2, 0, 1])):
                slices = _micro_batches(b, sizes)
                if order is not None:
                    slices = [slices[i] for i in order]
                parts = [run("masked_mean", x=inp["x"][lo:hi], mask=inp["mask"][lo:hi], mode=mode, partial=True)
                         for lo, hi in slices]
                exp += [full, full_partial]
                act += [run("masked_mean", partials=parts), run("masked_mean", partials=parts, partial=True)]
        return exp, act

    def repeat(run: Any) -> tuple[Any, Any]:
        inp = data("repeat", "seq-mean-token-mean")
        first = run("masked_mean", **inp)
        return [first, first], [run("masked_mean", **inp) for _ in range(2)]

    return [
        InvarianceCase("permuted_sequences", "permutation", permutation),
        InvarianceCase("permuted_tokens", "reduction_order", reduction_order),
        InvarianceCase("micro_batches_1_3_mixed", "micro_batch", micro_batch),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def _torch_masked_mean(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                       denominator: float | None = None) -> torch.Tensor:
    """verl-style ``agg_loss``: the native baseline (fp32 sums, order left to the library)."""
    m = mask.to(x.dtype)
    if mode == "token-mean":
        return (x * m).sum() / (denominator or m.sum())
    seq_tokens = m.sum(-1)
    seq = (x * m).sum(-1)
    if mode == "seq-mean-token-mean":
        seq = seq / (seq_tokens + 1e-8)
    keep = (seq_tokens > 0).to(x.dtype)
    return (seq * keep).sum() / (denominator or keep.sum())


def bench_cases() -> list[BenchCase]:
    """token-mean and seq-mean-token-mean over B = 64, T = 4096 (a PPO micro-batch); milliseconds on a
    CPU too, so the same shapes serve both sets."""
    cases = []
    for mode in ("token-mean", "seq-mean-token-mean"):
        def make(device: torch.device, m: str = mode) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(0)
            x = torch.randn(64, 4096, generator=g, device=device)
            lens = torch.randint(1, 4097, (64, 1), generator=g, device=device)
            mask = torch.arange(4096, device=device).unsqueeze(0) < lens
            return {"x": x, "mask": mask, "mode": m}

        cases.append(BenchCase(name=f"B64_T4096_{mode}", make=make, native=_torch_masked_mean,
                               flops=2.0 * 64 * 4096, bytes=5.0 * 64 * 4096, sizes=("small", "large")))
    return cases
