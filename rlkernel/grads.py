"""Exact weight gradients: per-unit terms summed once, whatever the batching.

A weight gradient is a sum over tokens. rlkernel's backward ops never add those terms in
floating point: each op computes fp32 *terms* (one per token, or one per sequence for the
matmul weight gradients, see below) and hands them to :func:`weight_grad`, which sums them
exactly (contract ``exact_sum``, the P10 superaccumulator). Where the terms come from one
sequence at a time, the gradient is the correctly rounded sum of per-sequence terms, so it
does not depend on how the global batch is packed, ordered or cut into micro-batches.

Two ways to receive the gradient:

- Plain autograd (no accumulator on the parameter): ``weight_grad`` returns the finished sum,
  rounded once to fp32 and then to the parameter's dtype, and autograd stores it in ``.grad``
  as usual. A second ``backward()`` adds to ``.grad`` in that dtype (PyTorch's accumulation):
  fine for one batch, not micro-batch invariant.
- :class:`ExactGradients` (the trainer's): every parameter carries an exact accumulator
  ``param.exact_grad``: :data:`EMPTY`, then what its deposits need and no more (a first dense deposit
  of at most :data:`PENDING_TERMS` terms kept as fp32 terms, scattered rows as the states of those
  rows, else an int64 state [*shape, 20]); ``weight_grad`` adds its terms and returns None,
  so any number of ``backward()`` calls (micro-batches, tied weights used twice) add exactly;
  :meth:`ExactGradients.finish` rounds each state once into ``param.main_grad`` (fp32, the name
  Megatron uses for its fp32 gradient buffer), which :class:`rlkernel.rl.AdamW`/``SGD`` read
  before ``.grad``.

Sequence units: the matmul weight gradients (``linear``'s dW, the LM head's) are exact digit
products over the tokens of one *unit*, rounded once; units are the sequences when the forward
runs inside :func:`sequence_units` (the model's packed training forward does this from its
``cu_seqlens``), else the whole call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch

from rlkernel.ops.exact_sum import (
    exact_sum_accumulate,
    exact_sum_finish,
    exact_sum_merge,
    exact_sum_partial,
    exact_sum_total,
)

__all__ = ["EMPTY", "ExactGradients", "UnitStates", "current_units", "deposit", "merge_into", "sequence_units",
           "units_per_group", "weight_grad"]


class _Empty:
    """The type of :data:`EMPTY`."""

    def __repr__(self) -> str:
        return "rlkernel.grads.EMPTY"


#: ``param.exact_grad`` of an :class:`ExactGradients` parameter before its first deposit: the state of
#: an empty sum, not yet in memory. The first deposit keeps its few terms or rows (``_Pending``) or
#: writes the state (``exact_sum_partial`` of its terms, or the deposited state itself), the canonical
#: state that zero fill + accumulate would leave (contract ``exact_sum``: one canonical state per
#: exact sum), without the 160 bytes a parameter of zero fill and the read of them.
EMPTY = _Empty()

_UNITS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar("rlkernel_units", default=None)


def _offsets(cu_seqlens: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    values = cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor) else list(cu_seqlens)
    out = tuple(int(x) for x in values)
    if not out or out[0] != 0 or any(b < a for a, b in zip(out, out[1:])):
        raise ValueError(f"sequence_units: cu_seqlens {list(out)[:8]}...; expected non-decreasing token offsets "
                         f"starting at 0 ([0, len_0, len_0 + len_1, ...])")
    return out


@contextmanager
def sequence_units(cu_seqlens: Sequence[int] | torch.Tensor) -> Iterator[None]:
    """Inside this block, forwards record ``cu_seqlens`` as the units of their weight gradients.

    Parameters
    ----------
    cu_seqlens : sequence of int or Tensor, [B + 1]
        Token offsets of the packed sequences (``0 = c_0 <= ... <= c_B = T``).
    """
    token = _UNITS.set(_offsets(cu_seqlens))
    try:
        yield
    finally:
        _UNITS.reset(token)


def current_units(num_tokens: int) -> list[int]:
    """Unit offsets for a forward over ``num_tokens`` rows: the sequences, or ``[0, num_tokens]``.

    Raises
    ------
    ValueError
        Inside :func:`sequence_units` whose offsets do not end at ``num_tokens`` (the op was
        not called on the packed tokens the units describe).
    """
    units = _UNITS.get()
    if units is None:
        return [0, num_tokens]
    if units[-1] != num_tokens:
        raise ValueError(f"rlkernel.grads: the sequence units end at {units[-1]} tokens but this op has "
                         f"{num_tokens} rows; call ops on the packed [T, ...] tokens inside sequence_units, or "
                         f"leave the block for ops that are not per token")
    return list(units)


def weight_grad(param: torch.Tensor, terms: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor | None:
    """Sum ``terms`` exactly into ``param``'s gradient.

    Parameters
    ----------
    param : Tensor
        The parameter (as given to the op's forward).
    terms : Tensor, float32, [S, *param.shape] (or [S, *param.shape[1:]] with index)
        S terms per element (per token or per sequence).
    index : Tensor, int64, [S], optional
        Row of ``param`` each term belongs to (embedding gradients).

    Returns
    -------
    Tensor or None
        The gradient for autograd: ``RN_dtype(RN32(exact sum))`` in param's dtype, or None when
        the parameter has an exact accumulator (:class:`ExactGradients`) that took the terms.

    Bitwise semantics
    -----------------
    The exact sum of all terms, rounded once to fp32 (contract ``exact_sum``); with an
    accumulator the rounding waits until :meth:`ExactGradients.finish`, so every micro-batch
    and every use of a tied weight adds exactly.
    """
    if index is None:
        if getattr(param, "exact_grad", None) is None:
            return exact_sum_total(terms).to(param.dtype)
        _accumulate_terms(param, terms)
        return None
    rows, local = torch.unique(index, return_inverse=True)  # only the rows some term names
    part = exact_sum_partial(terms, local, int(rows.shape[0]))
    if getattr(param, "exact_grad", None) is None:
        full = torch.zeros(param.shape, dtype=torch.float32, device=part.device)
        full[rows] = exact_sum_finish(part)
        return full.to(param.dtype)
    acc = param.exact_grad  # type: ignore[attr-defined]
    if acc is EMPTY:
        acc = param.exact_grad = _Pending()  # type: ignore[attr-defined]
    if isinstance(acc, _Pending) and len(acc.rows) < _Pending.MAX_ROW_PARTS:
        acc.rows.append((rows.to(param.device), part.to(param.device)))  # the touched rows' states only
        return None
    _merge_rows(_state(param), rows, part)
    return None


def _merge_rows(acc: torch.Tensor, rows: torch.Tensor, part: torch.Tensor) -> None:
    """``acc[rows] <- merge(acc[rows], part)`` (rows unique), a slice of rows at a time."""
    for r0 in range(0, rows.shape[0], _rows_per_step(acc)):
        r = rows[r0:r0 + _rows_per_step(acc)]
        acc[r] = exact_sum_merge(torch.stack([acc[r], part[r0:r0 + r.shape[0]].to(acc.device)]))


#: Elements merged per step (bounds the temporaries of a merge: a few int64 copies of the slice).
_MERGE_ELEMENTS = 1 << 22


def _rows_per_step(acc: torch.Tensor) -> int:
    per_row = max(1, acc[0].numel() // 20) if acc.shape[0] else 1
    return max(1, _MERGE_ELEMENTS // per_row)


def merge_into(state: torch.Tensor, part: torch.Tensor) -> None:
    """``state <- merge(state, part)`` in place (contract ``exact_sum``), a slice of rows at a time.

    Both int64 ``[*E, 20]``; the temporaries are a few copies of one slice, never of the whole.
    """
    if state.dim() == 1:  # one state
        state.copy_(exact_sum_merge(torch.stack([state, part.to(state.device)])))
        return
    step = _rows_per_step(state)
    for r0 in range(0, state.shape[0], step):
        state[r0:r0 + step] = exact_sum_merge(torch.stack([state[r0:r0 + step], part[r0:r0 + step].to(state.device)]))


def deposit(param: torch.Tensor, state: torch.Tensor) -> torch.Tensor | None:
    """:func:`weight_grad` for terms already summed into an exact state (int64 [*param.shape, 20]).

    With an accumulator the state is merged into it, or becomes it when the accumulator is still
    :data:`EMPTY` (the caller gives the state up: it must not write to it afterwards).
    """
    if getattr(param, "exact_grad", None) is None:
        return exact_sum_finish(state).to(param.dtype)
    _merge_state(param, state)
    return None


class _Pending:
    """An accumulator whose state is not in memory yet: the fp32 terms of its one dense deposit
    (``[S, *shape]``, kept when they are smaller than the 160-byte-an-element state: S <= 40) and the
    states of the rows that scattered deposits touched (a tied embedding's rows). :meth:`ExactGradients.finish`
    rounds it without ever forming the whole state (``exact_sum_total``, and ``exact_sum_finish`` of the
    touched rows); anything else makes the state first (:func:`_state`)."""

    #: scattered deposits kept as row states before the whole state is made
    MAX_ROW_PARTS = 8

    def __init__(self) -> None:
        self.terms: torch.Tensor | None = None
        self.rows: list[tuple[torch.Tensor, torch.Tensor]] = []

    def state(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """The canonical state ``[*shape, 20]`` of everything deposited (the dense terms' partial, the rows merged)."""
        if self.terms is not None:
            state = exact_sum_partial(self.terms)
        else:
            state = torch.zeros((*shape, 20), dtype=torch.int64, device=device)
        for rows, part in self.rows:
            _merge_rows(state, rows, part)
        return state

    def finish(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """fp32 ``[*shape]``: ``RN32`` of each element's exact sum (the bits of ``exact_sum_finish(self.state())``)."""
        if self.terms is not None:
            out = exact_sum_total(self.terms)
        else:
            out = torch.zeros(shape, dtype=torch.float32, device=device)
        if self.rows:  # the touched rows: the dense terms' partial of those rows, merged with every row part
            touched = torch.unique(torch.cat([rows for rows, _ in self.rows]))
            if self.terms is not None:
                local = exact_sum_partial(self.terms[:, touched])
            else:
                local = torch.zeros((touched.shape[0], *shape[1:], 20), dtype=torch.int64, device=device)
            for rows, part in self.rows:
                _merge_rows(local, torch.searchsorted(touched, rows), part)
            out[touched] = exact_sum_finish(local)
        return out


#: Dense terms an accumulator keeps before its state exists: S terms of 4 bytes against the 160-byte state
PENDING_TERMS = 40


def _accumulate_terms(param: torch.Tensor, terms: torch.Tensor) -> None:
    """``param.exact_grad += terms`` exactly. An :data:`EMPTY` (or rows-only pending) accumulator keeps
    a few terms as they are (the caller gives them up: it must not write to them afterwards), else
    makes the terms' state; a state takes them in place."""
    acc = param.exact_grad  # type: ignore[attr-defined]
    if acc is EMPTY or (isinstance(acc, _Pending) and acc.terms is None):
        terms = terms.to(param.device)
        if terms.shape[0] <= PENDING_TERMS:
            pending = acc if isinstance(acc, _Pending) else _Pending()
            pending.terms = terms
            param.exact_grad = pending  # type: ignore[attr-defined]
            return
        if acc is EMPTY:
            param.exact_grad = exact_sum_partial(terms)  # type: ignore[attr-defined]
            return
    exact_sum_accumulate(_state(param), terms.to(param.device))  # in place: no second state in memory


def _merge_state(param: torch.Tensor, part: torch.Tensor) -> None:
    """``param.exact_grad = merge(param.exact_grad, part)``; an :data:`EMPTY` accumulator takes ``part``."""
    if param.exact_grad is EMPTY:  # type: ignore[attr-defined]
        param.exact_grad = part.to(param.device)  # type: ignore[attr-defined]
    else:
        merge_into(_state(param), part)


def _state(param: torch.Tensor) -> torch.Tensor:
    """``param.exact_grad`` as a tensor: an :data:`EMPTY` one becomes the zero-filled empty state, a
    pending one the state of what it holds."""
    acc = param.exact_grad  # type: ignore[attr-defined]
    if acc is EMPTY:
        acc = param.exact_grad = torch.zeros((*param.shape, 20), dtype=torch.int64,  # type: ignore[attr-defined]
                                             device=param.device)
    elif isinstance(acc, _Pending):
        acc = param.exact_grad = acc.state(param.shape, param.device)  # type: ignore[attr-defined]
    return acc


#: Elements of per-unit fp32 terms held at once before they are accumulated (small weights) ...
TERMS_BUDGET = 1 << 24
#: ... and at least this many units' terms (large weights): 32 bytes an element, a fifth of the
#: 160-byte exact state the gradient holds anyway, so the state is read and written once per 8
#: units instead of once per unit (the LM head's 25 GB state: ~50 ms a pass on the H200)
TERMS_PER_STATE = 8


def units_per_group(param: torch.Tensor) -> int:
    """How many units' fp32 terms ``[k, *param.shape]`` a backward holds before one
    :meth:`UnitStates.add_terms`: ``max(TERMS_BUDGET // numel, TERMS_PER_STATE)``."""
    return max(TERMS_BUDGET // max(param.numel(), 1), TERMS_PER_STATE)


class UnitStates:
    """The exact sum of a parameter's per-unit states (one per sequence) within one backward call.

    With an accumulator on the parameter (:class:`ExactGradients`) each unit's state goes straight
    into it; otherwise they are merged into one local state, finished by :meth:`gradient`. Either
    way the memory is one state plus a slice, whatever the number of units.
    """

    def __init__(self, param: torch.Tensor) -> None:
        self.param = param
        self.state: torch.Tensor | None = None

    def add_terms(self, terms: torch.Tensor) -> None:
        """Add fp32 terms ``[S, *param.shape]`` (one per unit) exactly: :func:`exact_sum_accumulate` into
        the accumulator (or the local state) in place, so no second state is formed."""
        if getattr(self.param, "exact_grad", None) is not None:
            _accumulate_terms(self.param, terms)
        elif self.state is None:
            self.state = exact_sum_partial(terms)
        else:
            exact_sum_accumulate(self.state, terms)

    def add(self, part: torch.Tensor) -> None:
        """Add one unit's state (int64 ``[*param.shape, 20]``)."""
        if getattr(self.param, "exact_grad", None) is not None:
            _merge_state(self.param, part)
        elif self.state is None:
            self.state = part
        else:
            merge_into(self.state, part)

    def gradient(self) -> torch.Tensor | None:
        """The value for autograd: None with an accumulator, else ``RN_dtype(RN32(sum))``."""
        if getattr(self.param, "exact_grad", None) is not None:
            return None
        if self.state is None:
            return torch.zeros_like(self.param)
        return exact_sum_finish(self.state).to(self.param.dtype)


class ExactGradients:
    """Exact gradient accumulation for a set of parameters (micro-batches, tied weights).

    Parameters
    ----------
    params : iterable of Tensor
        Parameters that require grad. Each gets ``exact_grad`` (:data:`EMPTY`; after deposits, the
        few terms or rows they brought, or an int64 [*shape, 20] state) and, after :meth:`finish`,
        ``main_grad`` (fp32).

    Notes
    -----
    Memory: at most 160 bytes per parameter element (the P10 state), on the parameter's device;
    a weight whose terms arrive in one deposit (one micro-batch: the units' terms of a linear or the
    LM head, a norm's token terms) holds only those fp32 terms, 4 bytes a term, and is rounded from
    them by ``exact_sum_total``. As with Megatron's ``main_grad`` fusion, a weight's gradient is
    deposited whenever the op's backward runs: ``torch.autograd.grad`` with respect to
    activations only still adds to the accumulators of the weights on the way. Every parameter
    must be reached only through rlkernel ops whose backward calls :func:`weight_grad`; a
    gradient that reaches ``.grad`` through plain autograd is refused by :meth:`finish` (it
    would have been added in floating point).
    """

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.zero()

    def zero(self) -> None:
        """Empty every accumulator (the start of a global batch): :data:`EMPTY`, no memory until a deposit."""
        for p in self.params:
            p.exact_grad = EMPTY  # type: ignore[attr-defined]
            p.main_grad = None  # type: ignore[attr-defined]
            p.grad = None

    def finish(self) -> None:
        """Round each accumulated gradient once: ``param.main_grad = RN32(exact sum)`` (fp32).

        A parameter with a ``grad_reduce_group`` attribute (a replicated weight whose uses are
        split over tensor-parallel ranks, e.g. the q/k norm gains of sharded heads) first has
        its state summed over that group: an int64 all-reduce, exact in any order.
        """
        from rlkernel.distributed import all_reduce_exact

        for p in self.params:
            if p.grad is not None:
                raise RuntimeError(f"ExactGradients: a parameter of shape {tuple(p.shape)} received a .grad through "
                                   f"plain autograd (an op without an exact weight gradient used it); its sum "
                                   f"would not be exact. Use rlkernel ops for every use of the parameter")
            group = getattr(p, "grad_reduce_group", None)
            acc = p.exact_grad  # type: ignore[attr-defined]
            if group is not None:  # every rank joins the all-reduce, with an empty state if it has no deposit
                state = all_reduce_exact(_state(p).clone(), "sum", group)  # canonical limbs < 2**16: no overflow
                p.main_grad = exact_sum_finish(state)  # type: ignore[attr-defined]
            elif acc is EMPTY:  # RN32 of the empty sum: +0.0 (contract exact_sum)
                p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)  # type: ignore[attr-defined]
            elif isinstance(acc, _Pending):  # no whole state formed (exact_sum_total)
                p.main_grad = acc.finish(p.shape, p.device)  # type: ignore[attr-defined]
            else:
                p.main_grad = exact_sum_finish(acc)  # type: ignore[attr-defined]

    def remove(self) -> None:
        """Detach the accumulators (plain autograd again)."""
        for p in self.params:
            for name in ("exact_grad", "main_grad"):
                if hasattr(p, name):
                    delattr(p, name)
