"""Exact sums of fp32 terms per element: the accumulator of weight gradients.

A weight gradient is a sum over tokens (or sequences) of per-token terms. Summed in floating
point, its bits depend on the order of the tokens, on the micro-batch split and on the
tensor-parallel layout. ``exact_sum_partial`` turns terms into exact P10 superaccumulator
states (docs/numerics.md P10, the same state as ``masked_mean``'s partials), one per output
element; states merge by integer addition (``exact_sum_merge``, or a SUM all-reduce of the
limbs), and ``exact_sum_finish`` rounds each exact sum once to fp32. The gradient is then the
correctly rounded sum of its terms, whatever the order, the grouping and the number of
micro-batches or ranks the terms came from.

Five ops share this contract:

- ``exact_sum_partial(terms, index=None, num_rows=None)``: terms fp32 ``[S, *E]`` summed over
  axis 0 -> int64 ``[*E, 20]``; with ``index`` int64 ``[S]`` (values in ``[0, num_rows)``),
  term ``s`` goes to row ``index[s]`` -> int64 ``[num_rows, *E, 20]`` (an exact scatter-add:
  embedding gradients).
- ``exact_sum_merge(states)``: int64 ``[K, *E, 20]`` -> the canonical state of the union,
  ``[*E, 20]``.
- ``exact_sum_finish(states)``: int64 ``[*E, 20]`` -> fp32 ``[*E]``.
- ``exact_sum_accumulate(state, terms)``: int64 ``[*E, 20]`` and fp32 ``[S, *E]`` -> the canonical
  state of the union, ``merge([state, partial(terms)])``, written into ``state`` (in place: the
  trainer's accumulator of a weight gradient takes a unit's terms with no second state in memory).
- ``exact_sum_total(terms)``: fp32 ``[S, *E]`` -> fp32 ``[*E]``, ``finish(partial(terms))`` (the
  gradient of a weight whose terms all arrive at once, without its 160-byte-an-element state in
  memory).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact import superacc
from rlkernel.contracts._gen import from_bits, integers, normal, seed_of

STATE_SLOTS = superacc.STATE_SLOTS

CONTRACT = Contract(
    name="exact_sum",
    version=1,
    summary="state = exact P10 sum of fp32 terms over axis 0 (or scattered by row index); finish = RN32(state)",
    invariances=("permutation", "reduction_order", "micro_batch", "repeat"),
    dtypes={"terms": (torch.float32,), "index": (torch.int64,), "states": (torch.int64,), "state": (torch.int64,)},
    parameters={
        "terms": "each term is the exact value of its fp32 bits (subnormals exact, -0 adds nothing)",
        "sum_axis": "exact_sum_partial sums over axis 0 of terms; every other axis is an output element",
        "scatter": "with index, term s adds to output row index[s] (and to no other row); rows no term names "
                   "hold the empty state (all slots 0)",
        "state": "the P10 state of masked_mean (16 limbs of 16 bits from 2**-149, a carry limb, the NaN/+inf/-inf "
                 "counts), canonical: limbs 0-15 in [0, 2**16)",
        "merge": "exact_sum_merge adds states slot-wise over axis 0 and returns the canonical form",
        "rounding": "exact_sum_finish rounds the exact sum once to fp32: nearest, ties to even, a sticky bit "
                    "for every nonzero bit below the kept ones, subnormals exact, |sum| >= 2**128 - 2**103 to +-inf",
        "specials": "a NaN term, or a +inf and a -inf term, finish to NaN; else an infinite term gives that infinity",
        "zero_sign": "a zero exact sum and the empty sum finish to +0 (also for -0 terms only)",
        "accumulate": "exact_sum_accumulate(state, terms) = exact_sum_merge([state, exact_sum_partial(terms)]): the "
                      "given state (canonical or not) and the terms' exact sum added slot-wise, returned canonical "
                      "and written into state",
        "total": "exact_sum_total(terms) = exact_sum_finish(exact_sum_partial(terms)): each element's terms summed "
                 "exactly over axis 0 and rounded once to fp32",
    },
)


def partial_reference(terms: torch.Tensor, index: torch.Tensor | None = None,
                      num_rows: int | None = None) -> torch.Tensor:
    """The canonical states of ``terms`` summed over axis 0 (scattered by ``index``)."""
    t = terms.to(torch.float32)
    if index is None:
        if t.shape[0] == 0:
            return torch.zeros((*t.shape[1:], STATE_SLOTS), dtype=torch.int64)
        return superacc.accumulate(t, dim=0)
    assert num_rows is not None
    rows = []
    for r in range(num_rows):
        picked = t[index == r]
        if picked.shape[0] == 0:
            rows.append(torch.zeros((*t.shape[1:], STATE_SLOTS), dtype=torch.int64))
        else:
            rows.append(superacc.accumulate(picked, dim=0))
    if not rows:
        return torch.zeros((0, *t.shape[1:], STATE_SLOTS), dtype=torch.int64)
    return torch.stack(rows)


def reference(terms: torch.Tensor, index: torch.Tensor | None = None, num_rows: int | None = None) -> torch.Tensor:
    """Exact per-element sums of fp32 terms as P10 states (the definition of ``exact_sum_partial``).

    ``state[e] = P10(sum_s terms[s, e])``; with ``index``: ``state[r, e] = P10(sum_{index[s]=r} terms[s, e])``.

    Parameters
    ----------
    terms : Tensor, float32, [S, *E]
        S terms per output element (S may be 0).
    index : Tensor, int64, [S], optional
        Output row of each term, in ``[0, num_rows)``.
    num_rows : int, optional
        Rows of the output; required with ``index``.

    Returns
    -------
    Tensor, int64, [*E, 20] (or [num_rows, *E, 20] with index)

    Bitwise semantics
    -----------------
    Each term adds its exact value to its element's superaccumulator (P10, as ``masked_mean``):
    integer additions, so the state does not depend on the order of the terms, on how they are
    split into calls (merge the states) or on where they were computed. The state is canonical
    (limbs 0-15 in [0, 2**16)), so equal sums have equal states. NaN/inf terms are counted in
    the special slots. Invariances: permutation, reduction order, micro-batch, repeat.

    Contract ``exact_sum`` version 1.
    """
    return partial_reference(terms, index, num_rows)


def merge_reference(states: torch.Tensor) -> torch.Tensor:
    """``exact_sum_merge``: the canonical state of the union of the term sets of ``states`` [K, *E, 20].

    Slot-wise integer sum over axis 0 (exact for K < 2**46), then the canonical form.
    """
    if states.shape[0] == 0:
        return torch.zeros(states.shape[1:], dtype=torch.int64)
    return superacc.merge(states, dim=0)


def finish_reference(states: torch.Tensor) -> torch.Tensor:
    """``exact_sum_finish``: ``RN32`` of each state's exact sum (P10 rules), fp32 ``states.shape[:-1]``."""
    if states.numel() == 0:
        return torch.zeros(states.shape[:-1], dtype=torch.float32)
    return superacc.finish(states)


def accumulate_reference(state: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """``exact_sum_accumulate``: ``merge([state, partial(terms)])``, the canonical state [*E, 20].

    The reference returns a new tensor; backends write the same bits into ``state`` and return it.
    """
    return merge_reference(torch.stack([state, partial_reference(terms)]))


def total_reference(terms: torch.Tensor) -> torch.Tensor:
    """``exact_sum_total``: ``finish(partial(terms))``, fp32 ``terms.shape[1:]``."""
    return finish_reference(partial_reference(terms))


REFERENCES = {"exact_sum_partial": reference, "exact_sum_merge": merge_reference,
              "exact_sum_finish": finish_reference, "exact_sum_accumulate": accumulate_reference,
              "exact_sum_total": total_reference}


# --------------------------------------------------------------------------- cases


def _terms(case: str, shape: tuple[int, ...], std: float = 1.0) -> torch.Tensor:
    return normal(seed_of("exact_sum", case), shape, std=std, dtype=torch.float32)


def _spread(case: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Terms whose magnitudes span 2**-140 .. 2**100: a float sum loses most of them."""
    t = _terms(case, shape)
    expo = integers(seed_of("exact_sum", case, "e"), shape, -140, 100).to(torch.float32)
    return (t * torch.pow(torch.tensor(2.0), expo)).to(torch.float32)


def _states(case: str, k: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.stack([partial_reference(_spread(f"{case}_{i}", (5, *shape))) for i in range(k)])


def golden_cases() -> list[Case]:
    """Weight-gradient shapes (terms over tokens) for partial, scatter, merge and finish."""
    cases = [
        Case("S64_E8x16", "golden", lambda: {"terms": _terms("S64_E8x16", (64, 8, 16))}, op="exact_sum_partial"),
        Case("S1_E33", "golden", lambda: {"terms": _terms("S1_E33", (1, 33))}, op="exact_sum_partial"),
        Case("S300_E7_spread", "golden", lambda: {"terms": _spread("S300_E7", (300, 7))}, op="exact_sum_partial"),
        Case("scatter_S50_V9_D6", "golden",
             lambda: {"terms": _terms("scatter", (50, 6)),
                      "index": integers(seed_of("exact_sum", "scatter_idx"), (50,), 0, 9), "num_rows": 9},
             op="exact_sum_partial"),
        Case("merge_K4_E5x3", "golden", lambda: {"states": _states("merge", 4, (5, 3))}, op="exact_sum_merge"),
        Case("finish_E40", "golden", lambda: {"states": _states("finish", 1, (40,))[0]}, op="exact_sum_finish"),
        Case("accumulate_S3_E6x5", "golden",
             lambda: {"state": _states("acc", 1, (6, 5))[0], "terms": _spread("acc_terms", (3, 6, 5))},
             op="exact_sum_accumulate"),
        Case("accumulate_S1_E130", "golden",
             lambda: {"state": _states("acc1", 1, (130,))[0], "terms": _terms("acc1_terms", (1, 130), std=1e3)},
             op="exact_sum_accumulate"),
        Case("total_S64_E8x16", "golden", lambda: {"terms": _terms("total_S64", (64, 8, 16))}, op="exact_sum_total"),
        Case("total_S300_E7_spread", "golden", lambda: {"terms": _spread("total_S300", (300, 7))},
             op="exact_sum_total"),
        Case("total_S2_E1000", "golden", lambda: {"terms": _terms("total_S2", (2, 1000), std=1e-3)},
             op="exact_sum_total"),
    ]
    return cases


def _ties() -> dict[str, Any]:
    """Sums exactly half-way between fp32 neighbours (even and odd), and one a sticky bit above."""
    one = 1.0
    half_ulp = 2.0 ** -24
    rows = [[one, half_ulp, 0.0], [one + 2.0 ** -23, half_ulp, 0.0], [one, half_ulp, 2.0 ** -140],
            [-one, -half_ulp, 0.0], [one, half_ulp, -(2.0 ** -140)]]
    return {"terms": torch.tensor(rows, dtype=torch.float32).T.contiguous()}


def _specials() -> dict[str, Any]:
    inf, nan = float("inf"), float("nan")
    cols = [[1.0, inf, 2.0], [1.0, -inf, 2.0], [inf, -inf, 0.0], [nan, 1.0, 2.0], [-0.0, -0.0, -0.0],
            [3.0e38, 3.0e38, 0.0], [-3.0e38, -3.0e38, 0.0], [3.0e38, 3.0e38, -3.0e38], [1.0, -1.0, 0.0],
            [1.0e-45, 1.0e-45, 1.0e-45]]
    return {"terms": torch.tensor(cols, dtype=torch.float32).T.contiguous()}


def _subnormals() -> dict[str, Any]:
    bits = [0x00000001, 0x00000003, 0x007FFFFF, 0x80000002, 0x00400000, 0x00000005]
    t = from_bits(bits, torch.float32).reshape(6, 1).repeat(1, 3)
    t[:, 1] = -t[:, 1]
    return {"terms": t}


def _few_terms() -> dict[str, Any]:
    """Four terms an element (a trainer's per-unit weight gradients), in runs of 32 alike elements (a
    kernel's block): sums that fp64 holds exactly and whose one rounding is a tie (to even, both
    ways), a tie decided by a term 2**26 below it, -0 and cancellations (+0), the edges of the normal
    range (2**-126, just under and at 2**127) and of the subnormal one, a sticky bit fp64 cannot hold,
    random terms within 2**20 of each other, and a run with one such inexact element among exact ones."""
    e = 2.0 ** -24
    rows = [[1.0, e, 0.0, 0.0], [1.0 + 2 * e, e, 0.0, 0.0], [-1.0, -e, 0.0, 0.0], [0.5, 0.5, e, 0.0],
            [-0.0, -0.0, -0.0, -0.0], [3.5, -3.5, 1e-3, -1e-3], [2.0 ** 126, 2.0 ** 125, 2.0 ** 124, 0.0],
            [2.0 ** 126, 2.0 ** 126, 0.0, 0.0], [2.0 ** -126, 0.0, 0.0, 0.0], [2.0 ** -127, 2.0 ** -127, 0.0, 0.0],
            [2.0 ** -127, 0.0, 0.0, 0.0], [1.0, e, e * 2.0 ** -26, 0.0], [1.0, e, -e * 2.0 ** -26, 0.0],
            [1.0, e, 2.0 ** -60, 0.0]]
    runs = [torch.tensor(r, dtype=torch.float64).to(torch.float32).reshape(4, 1).repeat(1, 32) for r in rows]
    close = _terms("total_few_close", (4, 32)) * torch.pow(
        torch.tensor(2.0), integers(seed_of("exact_sum", "total_few_close", "e"), (4, 32), -10, 10).to(torch.float32))
    mixed = _terms("total_few_mixed", (4, 32))
    mixed[:, 17] = torch.tensor([1.0, e, 2.0 ** -60, 0.0])
    return {"terms": torch.cat([*runs, close.to(torch.float32), mixed], dim=1).contiguous()}


def _scatter_edges() -> dict[str, Any]:
    """Repeated rows, untouched rows, the first and last row, terms that cancel within a row."""
    terms = _spread("scatter_edges", (24, 5))
    index = torch.tensor([0, 7, 7, 7, 3, 0, 7, 3, 3, 0, 7, 7, 0, 0, 3, 7, 7, 3, 0, 0, 7, 3, 7, 0])
    terms[1] = -terms[2]
    return {"terms": terms, "index": index, "num_rows": 8}


def _overflow_merge() -> dict[str, Any]:
    big = partial_reference(torch.full((1, 4), 3.0e38))
    return {"states": torch.stack([big, big, partial_reference(torch.full((1, 4), -3.0e38))])}


def _accumulate_specials() -> dict[str, Any]:
    """Special terms into states that already count specials, and sums that cancel the state exactly."""
    terms = _specials()["terms"]
    state = partial_reference(torch.cat([terms[:, [3, 2, 0, 1, 8, 9, 4, 6, 5, 7]], -terms[:1]]))
    return {"state": state, "terms": terms}


def _accumulate_carries() -> dict[str, Any]:
    """A state of limbs 0xFFFF (one more unit carries through all sixteen), a negative carry limb, and
    terms that borrow from the top: every limb of the ripple moves."""
    state = partial_reference(torch.tensor([[2.0 ** 127 - 2.0 ** 103, -(2.0 ** 127), 1.0e-45, -1.0e-45]]))
    state[..., :16] = 0xFFFF
    state[1, 16] = -3
    terms = torch.tensor([[1.0e-45, 1.0e-45, -1.0e-45, 2.0 ** 100], [0.0, -(2.0 ** 127), 0.0, -(2.0 ** 100)]])
    return {"state": state, "terms": terms}


def adversarial_cases() -> list[Case]:
    """Ties, specials, subnormals, empty inputs, scatter edges, merges that overflow only in floats."""
    p = "exact_sum_partial"
    return [
        Case("ties", "adversarial", _ties, op=p),
        Case("specials", "adversarial", _specials, op=p),
        Case("subnormals", "adversarial", _subnormals, op=p),
        Case("empty_terms", "adversarial", lambda: {"terms": torch.zeros((0, 4, 3))}, op=p),
        Case("empty_elements", "adversarial", lambda: {"terms": torch.zeros((5, 0))}, op=p),
        Case("scatter_edges", "adversarial", _scatter_edges, op=p),
        Case("scatter_empty", "adversarial",
             lambda: {"terms": torch.zeros((0, 4)), "index": torch.zeros(0, dtype=torch.int64), "num_rows": 3}, op=p),
        Case("noncontiguous", "adversarial", lambda: {"terms": _spread("nc", (9, 12)).T.contiguous().T}, op=p),
        Case("merge_overflow", "adversarial", _overflow_merge, op="exact_sum_merge"),
        Case("merge_single", "adversarial", lambda: {"states": _states("single", 1, (6,))}, op="exact_sum_merge"),
        Case("finish_specials", "adversarial", lambda: {"states": partial_reference(_specials()["terms"])},
             op="exact_sum_finish"),
        Case("finish_ties", "adversarial", lambda: {"states": partial_reference(_ties()["terms"])},
             op="exact_sum_finish"),
        Case("finish_subnormals", "adversarial", lambda: {"states": partial_reference(_subnormals()["terms"])},
             op="exact_sum_finish"),
        Case("finish_noncanonical", "adversarial",
             lambda: {"states": _states("nonc", 3, (4,)).sum(dim=0)}, op="exact_sum_finish"),
        Case("accumulate_specials", "adversarial", _accumulate_specials, op="exact_sum_accumulate"),
        Case("accumulate_carries", "adversarial", _accumulate_carries, op="exact_sum_accumulate"),
        Case("accumulate_noncanonical", "adversarial",
             lambda: {"state": _states("acc_nonc", 3, (4, 2)).sum(dim=0), "terms": _spread("acc_nonc_t", (7, 4, 2))},
             op="exact_sum_accumulate"),
        Case("accumulate_empty_terms", "adversarial",
             lambda: {"state": _states("acc_e", 2, (5,)).sum(dim=0), "terms": torch.zeros((0, 5))},
             op="exact_sum_accumulate"),
        Case("accumulate_empty_elements", "adversarial",
             lambda: {"state": torch.zeros((3, 0, 20), dtype=torch.int64), "terms": torch.zeros((2, 3, 0))},
             op="exact_sum_accumulate"),
        Case("accumulate_noncontiguous", "adversarial",
             lambda: {"state": _states("acc_ncs", 1, (9, 4))[0].transpose(0, 1),
                      "terms": _spread("acc_nct", (9, 4, 3)).permute(2, 1, 0)},
             op="exact_sum_accumulate"),
        Case("total_ties", "adversarial", _ties, op="exact_sum_total"),
        Case("total_few_terms_fp64_edges", "adversarial", _few_terms, op="exact_sum_total"),
        Case("total_specials", "adversarial", _specials, op="exact_sum_total"),
        Case("total_subnormals", "adversarial", _subnormals, op="exact_sum_total"),
        Case("total_empty_terms", "adversarial", lambda: {"terms": torch.zeros((0, 4, 3))}, op="exact_sum_total"),
        Case("total_empty_elements", "adversarial", lambda: {"terms": torch.zeros((5, 0))}, op="exact_sum_total"),
        Case("total_noncontiguous", "adversarial", lambda: {"terms": _spread("total_nc", (9, 12)).T.contiguous().T},
             op="exact_sum_total"),
        Case("total_many_terms_few_elements", "adversarial", lambda: {"terms": _spread("total_tall", (500, 3))},
             op="exact_sum_total"),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """Permuted terms, micro-batches merged in any order or accumulated in steps, scatter of permuted
    (term, row) pairs, repeat."""
    terms = _spread("inv", (96, 4, 5))
    index = integers(seed_of("exact_sum", "inv_idx"), (96,), 0, 6)

    def finished(run: Any, states: Any) -> Any:
        return run("exact_sum_finish", states=states)

    def permutation(run: Any) -> tuple[Any, Any]:
        perm = torch.randperm(96, generator=torch.Generator().manual_seed(7))
        whole = run("exact_sum_partial", terms=terms)
        scat = run("exact_sum_partial", terms=terms[:, 0], index=index, num_rows=6)
        return ([whole, scat],
                [run("exact_sum_partial", terms=terms[perm]),
                 run("exact_sum_partial", terms=terms[perm, 0], index=index[perm], num_rows=6)])

    def reduction_order(run: Any) -> tuple[Any, Any]:
        rev = torch.arange(95, -1, -1)
        return (finished(run, run("exact_sum_partial", terms=terms)),
                finished(run, run("exact_sum_partial", terms=terms[rev])))

    def micro_batch(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        whole = run("exact_sum_partial", terms=terms)
        for cuts in ((1, 95), (32, 64), (7, 50, 81)):
            bounds = [0, *cuts, 96]
            parts = [run("exact_sum_partial", terms=terms[a:b]) for a, b in zip(bounds, bounds[1:])]
            merged = run("exact_sum_merge", states=torch.stack(list(reversed(parts))))
            exp += [whole, finished(run, whole)]
            act += [merged, finished(run, merged)]
        return exp, act

    def repeat(run: Any) -> tuple[Any, Any]:
        first = run("exact_sum_partial", terms=terms)
        return [first, first], [run("exact_sum_partial", terms=terms) for _ in range(2)]

    def accumulated(run: Any) -> tuple[Any, Any]:
        """Terms accumulated in steps (a trainer's micro-batches into one accumulator), in two orders."""
        exp, act = [], []
        whole = run("exact_sum_partial", terms=terms)
        for cuts in ((1, 95), (40, 41, 70)):
            bounds = [0, *cuts, 96]
            spans = list(zip(bounds, bounds[1:]))
            for order in (spans, spans[::-1]):
                state = torch.zeros((4, 5, STATE_SLOTS), dtype=torch.int64)
                for a, b in order:
                    state = run("exact_sum_accumulate", state=state.clone(), terms=terms[a:b])
                exp += [whole, finished(run, whole)]
                act += [state, finished(run, state)]
        return exp, act

    def total_permuted(run: Any) -> tuple[Any, Any]:
        """The total of the terms in any order is the finished partial."""
        perm = torch.randperm(96, generator=torch.Generator().manual_seed(8))
        whole = finished(run, run("exact_sum_partial", terms=terms))
        return [whole, whole], [run("exact_sum_total", terms=terms), run("exact_sum_total", terms=terms[perm])]

    def total_few_permuted(run: Any) -> tuple[Any, Any]:
        """Four terms an element (a kernel's fp64-first path), added in other orders: where a block's
        additions are exact depends on the order, the bits do not."""
        few = _few_terms()["terms"]
        whole = finished(run, run("exact_sum_partial", terms=few))
        orders = (torch.tensor([3, 2, 1, 0]), torch.tensor([2, 0, 3, 1]))
        return [whole] * 3, [run("exact_sum_total", terms=few)] + [run("exact_sum_total", terms=few[o]) for o in orders]

    return [
        InvarianceCase("permuted_terms", "permutation", permutation, op="exact_sum_partial"),
        InvarianceCase("total_permuted", "permutation", total_permuted, op="exact_sum_total"),
        InvarianceCase("total_few_terms_permuted", "permutation", total_few_permuted, op="exact_sum_total"),
        InvarianceCase("reversed_terms", "reduction_order", reduction_order, op="exact_sum_partial"),
        InvarianceCase("micro_batches_merged", "micro_batch", micro_batch, op="exact_sum_partial"),
        InvarianceCase("repeat", "repeat", repeat, op="exact_sum_partial"),
        InvarianceCase("accumulated_in_steps", "micro_batch", accumulated, op="exact_sum_accumulate"),
    ]


# --------------------------------------------------------------------------- bench


def _native_sum(terms: torch.Tensor) -> torch.Tensor:
    return terms.sum(dim=0)


def one_term_states(t: torch.Tensor) -> torch.Tensor:
    """The canonical P10 state of each element of ``t`` as a one-term sum: ``partial_reference(t[None])``.

    Vectorised for bench inputs (the reference's Python integers take ~100 us an element): each
    finite term's contribution goes to its limb, then one carry pass over the 16 limbs (floor
    shifts, so a negative value's limbs are its two's complement and the carry limb is -1).

    Parameters
    ----------
    t : Tensor, float32, any shape (any device)

    Returns
    -------
    Tensor, int64, ``t.shape + (20,)``, on ``t``'s device
    """
    limb, contrib = superacc.term_limbs(t)
    slots = torch.zeros((*t.shape, STATE_SLOTS), dtype=torch.int64, device=t.device)
    slots.scatter_(-1, limb.unsqueeze(-1), contrib.unsqueeze(-1))
    for i in range(superacc.NUM_LIMBS):
        slots[..., i + 1] += slots[..., i] >> superacc.LIMB_BITS
        slots[..., i] &= (1 << superacc.LIMB_BITS) - 1
    slots[..., superacc.NAN] = torch.isnan(t).to(torch.int64)
    slots[..., superacc.POS_INF] = (t == float("inf")).to(torch.int64)
    slots[..., superacc.NEG_INF] = (t == float("-inf")).to(torch.int64)
    return slots


def _native_merge(states: torch.Tensor) -> torch.Tensor:
    return states.sum(dim=0)


def _native_accumulate(state: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """The native trainer's reduction of a unit's terms in fp32 (its add into ``.grad`` is one more
    pass over 4 bytes an element); the state has no native counterpart."""
    return terms.sum(dim=0)


def bench_cases() -> list[BenchCase]:
    """A micro-batch's weight-gradient terms: 64 sequence partials of a 1024 x 1024 weight (large),
    of a 256 x 256 weight (small); the merge of two states of such weights; one sequence's
    terms accumulated into such a weight's state (the trainer's step per sequence unit); and the
    total of four units' terms of such a weight."""
    cases = []
    for name, s, n, sizes in (("S64_1024x1024", 64, 1 << 20, ("large",)), ("S64_256x256", 64, 1 << 16, ("small",))):
        def make(device: torch.device, s: int = s, n: int = n) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(0)
            return {"terms": torch.randn(s, n, generator=g, device=device)}

        cases.append(BenchCase(name=name, make=make, native=_native_sum, flops=float(s * n),
                               bytes=4.0 * s * n + 160.0 * n, op="exact_sum_partial", sizes=sizes))
    # the trainer's accumulation: a unit's state merged into the accumulator of a weight (one
    # step of ExactGradients), against the integer sum of the same int64 slots
    for name, n, sizes in (("K2_1024x1024", 1 << 20, ("large",)), ("K2_256x256", 1 << 16, ("small",))):
        def make_states(device: torch.device, n: int = n) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(1)
            t = torch.randn(2, n, generator=g, device=device)
            return {"states": torch.stack([one_term_states(t[0]), one_term_states(t[1] * 3.0)])}

        cases.append(BenchCase(name=name, make=make_states, native=_native_merge, flops=float(2 * n),
                               bytes=3 * 160.0 * n, op="exact_sum_merge", sizes=sizes))
    for name, n, sizes in (("S1_1024x1024", 1 << 20, ("large",)), ("S1_256x256", 1 << 16, ("small",))):
        def make_acc(device: torch.device, n: int = n) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(2)
            t = torch.randn(2, n, generator=g, device=device)
            return {"state": one_term_states(t[0]), "terms": t[1:]}

        cases.append(BenchCase(name=name, make=make_acc, native=_native_accumulate, flops=float(n),
                               bytes=4.0 * n + 2 * 160.0 * n, op="exact_sum_accumulate", sizes=sizes))
    # a weight's gradient from all its units' terms at once (4 units), against torch's fp32 sum
    for name, n, sizes in (("total_S4_1024x1024", 1 << 20, ("large",)), ("total_S4_256x256", 1 << 16, ("small",))):
        def make_total(device: torch.device, n: int = n) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(3)
            return {"terms": torch.randn(4, n, generator=g, device=device)}

        cases.append(BenchCase(name=name, make=make_total, native=_native_sum, flops=float(4 * n),
                               bytes=4.0 * 4 * n + 4.0 * n, op="exact_sum_total", sizes=sizes))
    return cases
