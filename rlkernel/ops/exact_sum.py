"""``rlkernel.ops.exact_sum_*``: exact per-element sums of fp32 terms (contract ``exact_sum`` v1).

The accumulator of weight gradients (:mod:`rlkernel.grads`): terms become exact P10
superaccumulator states (``exact_sum_partial``), states merge by integer addition in any order
(``exact_sum_merge``; across ranks a SUM all-reduce of the int64 slots), an accumulator takes new
terms in place (``exact_sum_accumulate``), and each exact sum is rounded once to fp32
(``exact_sum_finish``, or ``exact_sum_total`` straight from the terms).
"""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch

__all__ = ["STATE_SLOTS", "exact_sum_accumulate", "exact_sum_finish", "exact_sum_merge", "exact_sum_partial",
           "exact_sum_total"]

#: Slots of one P10 state: 16 limbs, the carry limb, the NaN/+inf/-inf counts.
STATE_SLOTS = 20
#: Exact while fewer states are merged at once (raw limb sums stay below 2**62).
MAX_MERGE = (1 << 46) - 1


def exact_sum_partial(terms: torch.Tensor, index: torch.Tensor | None = None,
                      num_rows: int | None = None) -> torch.Tensor:
    """Exact sums of ``terms`` over axis 0, as mergeable P10 states (one per output element).

    ``state[e] = P10(sum_s terms[s, e])``; with ``index``: ``state[r, e] = P10(sum_{index[s] = r} terms[s, e])``

    Parameters
    ----------
    terms : Tensor, float32, [S, *E]
        S terms per output element; S may be 0. Any strides.
    index : Tensor, int64/int32, [S], optional
        Output row of each term (an exact scatter-add, as an embedding's gradient), values in
        ``[0, num_rows)``; on terms' device.
    num_rows : int, optional
        Rows of the output; required with ``index``, not allowed without.

    Returns
    -------
    Tensor, int64, [*E, 20] (or [num_rows, *E, 20] with index), canonical

    Raises
    ------
    TypeError
        terms is not float32, index not an integer tensor, num_rows not an int.
    ValueError
        terms has no axis, index has the wrong length or values out of range, num_rows given
        without index (or the reverse), devices differ.

    Bitwise semantics
    -----------------
    Each term adds its exact value to its element's superaccumulator (P10): integer additions,
    so the state depends only on the multiset of terms per element, not on their order, their
    split into calls (merge the states) or the device. NaN/inf terms are counted in the special
    slots. Contract ``exact_sum`` v1 (``rlkernel.contracts.exact_sum``).
    """
    op = "exact_sum_partial"
    terms = v.tensor(op, "terms", terms)
    v.dtype(op, "terms", terms, (torch.float32,))
    if terms.dim() < 1:
        raise ValueError(f"{op}: terms has shape {tuple(terms.shape)}; expected [S, *E] with the terms on axis 0 "
                         f"(a single term: terms.unsqueeze(0))")
    if (index is None) != (num_rows is None):
        raise ValueError(f"{op}: index and num_rows go together (index={'given' if index is not None else None}, "
                         f"num_rows={num_rows!r}); pass both for a scatter-add, neither for a plain sum")
    if index is None:
        device = v.same_device(op, [("terms", terms)])
        return dispatch.call(op, device, terms=terms, index=None, num_rows=None)
    index = v.tensor(op, "index", index)
    v.dtype(op, "index", index, (torch.int64, torch.int32))
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 0:
        raise TypeError(f"{op}: num_rows must be an int >= 0, got {num_rows!r}")
    if tuple(index.shape) != (terms.shape[0],):
        raise ValueError(f"{op}: index has shape {tuple(index.shape)}; expected [{terms.shape[0]}] (one output row "
                         f"per term of terms [S, *E])")
    device = v.same_device(op, [("terms", terms), ("index", index)])
    if index.numel():
        lo, hi = v.int_range(index)
        if lo < 0 or hi >= num_rows:
            raise ValueError(f"{op}: index values lie in [{lo}, {hi}]; expected [0, num_rows = {num_rows})")
    return dispatch.call(op, device, terms=terms, index=index.to(torch.int64), num_rows=num_rows)


def _states(op: str, states: object, lead: int) -> torch.Tensor:
    states = v.tensor(op, "states", states)
    v.dtype(op, "states", states, (torch.int64,))
    if states.dim() < lead + 1 or states.shape[-1] != STATE_SLOTS:
        axes = "[K, *E, 20]" if lead else "[*E, 20]"
        raise ValueError(f"{op}: states has shape {tuple(states.shape)}; expected {axes} as exact_sum_partial returns")
    return states


def exact_sum_merge(states: torch.Tensor) -> torch.Tensor:
    """The exact state of the union of K partials' terms: ``merge(states[0], ..., states[K-1])``.

    Parameters
    ----------
    states : Tensor, int64, [K, *E, 20]
        States from :func:`exact_sum_partial` (or merged ones, or a SUM all-reduce of them).

    Returns
    -------
    Tensor, int64, [*E, 20], canonical

    Raises
    ------
    TypeError
        states is not int64.
    ValueError
        The last axis is not 20, or K >= 2**46 (merge in groups).

    Bitwise semantics
    -----------------
    Slot-wise integer sums over axis 0, then the canonical carry form: exact and order-free.
    Contract ``exact_sum`` v1.
    """
    op = "exact_sum_merge"
    states = _states(op, states, 1)
    if states.shape[0] > MAX_MERGE:
        raise ValueError(f"{op}: {states.shape[0]} states exceed the exact merge bound 2**46 - 1; merge in groups")
    device = v.same_device(op, [("states", states)])
    return dispatch.call(op, device, states=states)


def exact_sum_finish(states: torch.Tensor) -> torch.Tensor:
    """Each exact sum rounded once to fp32.

    Parameters
    ----------
    states : Tensor, int64, [*E, 20]
        States from :func:`exact_sum_partial` or :func:`exact_sum_merge` (canonical or not).

    Returns
    -------
    Tensor, float32, [*E]

    Raises
    ------
    TypeError
        states is not int64.
    ValueError
        The last axis is not 20.

    Bitwise semantics
    -----------------
    ``RN32`` of the exact sum: nearest, ties to even, subnormals exact, overflow to ±inf; NaN
    for a NaN term or both infinities, else an infinite term's infinity; a zero or empty sum
    is +0. Contract ``exact_sum`` v1.
    """
    op = "exact_sum_finish"
    states = _states(op, states, 0)
    device = v.same_device(op, [("states", states)])
    return dispatch.call(op, device, states=states)


def exact_sum_accumulate(state: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """Add ``terms`` exactly into the accumulator ``state``, in place: ``state <- merge(state, partial(terms))``.

    What a trainer's exact gradient accumulator does per sequence unit (:mod:`rlkernel.grads`):
    the same bits as :func:`exact_sum_merge` of ``state`` and :func:`exact_sum_partial` of
    ``terms``, without a second state in memory (a 152k x 1024 LM head's state is 25 GB).

    Parameters
    ----------
    state : Tensor, int64, [*E, 20]
        The accumulator (canonical or not: a partial, a merge, a SUM all-reduce of states);
        updated in place. Any strides.
    terms : Tensor, float32, [S, *E]
        S terms per element; S may be 0 (the state is then made canonical). Any strides.

    Returns
    -------
    Tensor
        ``state`` itself (as ``torch.Tensor.add_`` returns self), canonical.

    Raises
    ------
    TypeError
        state is not int64 or terms not float32.
    ValueError
        The state's last axis is not 20, the shapes do not match (terms [S, *E] for a state
        [*E, 20]), or the devices differ.

    Bitwise semantics
    -----------------
    The canonical state of the union of the state's terms and ``terms``: integer additions,
    so any split of a set of terms into accumulated chunks, in any order, gives the bits of
    one ``exact_sum_partial`` of the whole set. Contract ``exact_sum`` v1.
    """
    op = "exact_sum_accumulate"
    state = _states(op, state, 0)
    terms = v.tensor(op, "terms", terms)
    v.dtype(op, "terms", terms, (torch.float32,))
    if terms.dim() != state.dim() or tuple(terms.shape[1:]) != tuple(state.shape[:-1]):
        want = ", ".join(["S", *(str(d) for d in state.shape[:-1])])
        raise ValueError(f"{op}: terms has shape {tuple(terms.shape)} for a state of shape {tuple(state.shape)}; "
                         f"expected [{want}] (S terms per element of the state [*E, 20]; a single term: "
                         f"terms.unsqueeze(0))")
    device = v.same_device(op, [("state", state), ("terms", terms)])
    out = dispatch.call(op, device, state=state, terms=terms)
    if out is not state:  # kernels return state updated in place, or a new tensor (e.g. for a strided state)
        state.copy_(out)
    return state


def exact_sum_total(terms: torch.Tensor) -> torch.Tensor:
    """The exact sums of ``terms`` over axis 0, each rounded once to fp32: ``finish(partial(terms))``.

    ``out[e] = RN32(sum_s terms[s, e])``, the sum exact. A weight's gradient when all its terms
    arrive in one call (:mod:`rlkernel.grads`): no 160-byte-an-element state in memory.

    Parameters
    ----------
    terms : Tensor, float32, [S, *E]
        S terms per output element; S may be 0 (every element is then +0). Any strides.

    Returns
    -------
    Tensor, float32, [*E]

    Raises
    ------
    TypeError
        terms is not float32.
    ValueError
        terms has no axis.

    Bitwise semantics
    -----------------
    The bits of :func:`exact_sum_finish` of :func:`exact_sum_partial` of the same terms: each
    element's exact sum (independent of the order of its terms and of the device) rounded once,
    to nearest with ties to even (P10's special rules for NaN/inf terms; a zero sum is +0).
    Contract ``exact_sum`` v1.
    """
    op = "exact_sum_total"
    terms = v.tensor(op, "terms", terms)
    v.dtype(op, "terms", terms, (torch.float32,))
    if terms.dim() < 1:
        raise ValueError(f"{op}: terms has shape {tuple(terms.shape)}; expected [S, *E] with the terms on axis 0 "
                         f"(a single term: terms.unsqueeze(0))")
    device = v.same_device(op, [("terms", terms)])
    return dispatch.call(op, device, terms=terms)
