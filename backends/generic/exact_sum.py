"""Exact per-element sums of fp32 terms (contract ``exact_sum`` v1) on the P10 superaccumulator.

Dense sums reuse :func:`superacc.accumulate` over axis 0; ``exact_sum_accumulate`` merges a
slice of the accumulator with the partial of the same slice's terms, one slice at a time, and
``exact_sum_total`` finishes the partial of one slice at a time. The
scatter form decomposes every term into its limb index and signed limb contribution and adds them with an int64
``scatter_add_`` into the raw limbs of its row: integer additions, so any order (atomics
included) gives the same limbs; blocks of at most ``BLOCK_TERMS`` terms per row keep the raw
limbs below 2**62 before they are normalised.
"""

from __future__ import annotations

import torch

from ._exact import intpath, superacc, superacc32


def _scatter(terms: torch.Tensor, index: torch.Tensor, num_rows: int) -> torch.Tensor:
    """States [num_rows, E, 20] of the terms [S, E] added to rows ``index`` [S]."""
    if intpath.int32(terms.device):
        return superacc32.scatter(terms, index, num_rows)
    s, e = terms.shape
    dev = terms.device
    nl = superacc.NUM_LIMBS + 1
    limbs = torch.zeros((num_rows * e * nl,), dtype=torch.int64, device=dev)
    spec = torch.zeros((num_rows * e, 3), dtype=torch.int64, device=dev)
    step = max(1, min(superacc.BLOCK_TERMS, superacc.STEP_ELEMENTS // max(e, 1)))
    elem = torch.arange(e, device=dev, dtype=torch.int64)
    for s0 in range(0, s, step):
        chunk = terms[s0:s0 + step]
        rows = index[s0:s0 + step].to(torch.int64)
        limb, v = superacc._decompose(chunk)  # [c, E] each
        slot = ((rows.unsqueeze(1) * e + elem) * nl + limb).reshape(-1)
        limbs.scatter_add_(0, slot, v.reshape(-1))
        cell = (rows.unsqueeze(1) * e + elem).reshape(-1)
        spec.scatter_add_(0, cell.unsqueeze(1).expand(-1, 3), superacc._specials(chunk.reshape(-1, 1)))
        normed = superacc.normalize_limbs(limbs.reshape(-1, nl))  # keeps every raw limb < 2**62
        limbs = normed.reshape(-1)
    out = torch.zeros((num_rows * e, superacc.STATE_SLOTS), dtype=torch.int64, device=dev)
    out[:, :nl] = superacc.normalize_limbs(limbs.reshape(-1, nl))
    out[:, superacc.NAN:] = spec
    return out


def exact_sum_partial(terms: torch.Tensor, index: torch.Tensor | None = None,
                      num_rows: int | None = None) -> torch.Tensor:
    """Canonical P10 states of ``terms`` [S, *E] summed over axis 0 (scattered by ``index``)."""
    rest = tuple(terms.shape[1:])
    if index is None:
        if terms.shape[0] == 0:
            return torch.zeros((*rest, superacc.STATE_SLOTS), dtype=torch.int64, device=terms.device)
        return superacc.accumulate(terms, dim=0)
    assert num_rows is not None
    e = 1
    for size in rest:
        e *= size
    flat = terms.reshape(terms.shape[0], e)
    return _scatter(flat, index, num_rows).reshape(num_rows, *rest, superacc.STATE_SLOTS)


def exact_sum_merge(states: torch.Tensor) -> torch.Tensor:
    """The canonical state of the union of ``states`` [K, *E, 20] (slot-wise integer sum)."""
    if states.shape[0] == 0:
        return torch.zeros(states.shape[1:], dtype=torch.int64, device=states.device)
    return superacc.merge(states, dim=0)


def exact_sum_finish(states: torch.Tensor) -> torch.Tensor:
    """``RN32`` of each state's exact sum, fp32 ``states.shape[:-1]``."""
    if states.numel() == 0:
        return torch.zeros(states.shape[:-1], dtype=torch.float32, device=states.device)
    flat = states.reshape(-1, superacc.STATE_SLOTS)
    step = superacc.STEP_ELEMENTS  # bounds finish's int64 temporaries (a weight's state can be tens of GB)
    out = torch.cat([superacc.finish(flat[r0:r0 + step]) for r0 in range(0, flat.shape[0], step)])
    return out.reshape(states.shape[:-1])


def exact_sum_accumulate(state: torch.Tensor, terms: torch.Tensor) -> torch.Tensor:
    """``merge([state, partial(terms)])`` for ``state`` [*E, 20] and ``terms`` [S, *E], written into
    ``state`` a slice of elements at a time (the temporaries are a few copies of one slice, never of
    a whole weight's state); a strided ``state`` gets a new tensor, which the public op copies in."""
    n = state.numel() // superacc.STATE_SLOTS
    in_place = state.is_contiguous()
    flat = state.view(n, superacc.STATE_SLOTS) if in_place else state.reshape(n, superacc.STATE_SLOTS).clone()
    t = terms.reshape(terms.shape[0], n)
    step = superacc.STEP_ELEMENTS
    for e0 in range(0, n, step):
        part = exact_sum_partial(t[:, e0:e0 + step])
        flat[e0:e0 + step] = superacc.merge(torch.stack([flat[e0:e0 + step], part]), dim=0)
    return state if in_place else flat.view(state.shape)


def exact_sum_total(terms: torch.Tensor) -> torch.Tensor:
    """``finish(partial(terms))``, fp32 ``terms.shape[1:]``, a slice of elements at a time (the states
    in memory are those of one slice, never of a whole weight)."""
    rest = tuple(terms.shape[1:])
    n = 1
    for size in rest:
        n *= size
    out = torch.empty((n,), dtype=torch.float32, device=terms.device)
    t = terms.reshape(terms.shape[0], n)
    step = superacc.STEP_ELEMENTS
    for e0 in range(0, n, step):
        out[e0:e0 + step] = exact_sum_finish(exact_sum_partial(t[:, e0:e0 + step]))
    return out.reshape(rest)
