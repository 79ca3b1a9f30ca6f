"""``exact_sum_partial`` / ``exact_sum_merge`` / ``exact_sum_finish`` on Triton (contract ``exact_sum`` v1, P10).

The trainer's weight gradients live in these states (int64 ``[*E, 20]`` per parameter element,
160 bytes each: 25 GB for a 152k x 1024 LM head), so their speed is the speed of every exact
accumulation. Each kernel is elementwise over the output elements: a program holds ``R``
elements' states in registers as int64 ``[R, 32]`` (the slot layout of ``_tl_superacc``: limbs
0..15, the carry limb 16, the NaN / +inf / -inf counts 17..19), so each state is read and
written once.

- ``_partial_kernel``: the terms ``[S, n]`` of ``R`` elements, ``S_STEP`` terms at a time, decomposed
  into raw int64 limb sums (exact for ``CHUNK`` = 2**22 terms, contributions < 2**39), folded into
  the state and made canonical once per chunk; the specials counted.
- ``_merge_kernel``: the ``K`` states of each element, each made canonical, added slot by slot,
  made canonical (the canonical form is unique per value, so this is the generic code's state).
- ``_finish_kernel``: ``RN32`` of each state (``_tl_superacc.round_state``: top three 16-bit limbs
  and a sticky bit, ties to even, the P10 special rules).

Every sum is an integer sum and every element is independent, so the tiling cannot change a
bit. The scatter form of ``exact_sum_partial`` (``index``: embedding gradients) runs the
device-generic code and is reported as ``[torch-exact]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch
from rlkernel.backends.generic import exact_sum as _generic

from . import _tl_superacc as S
from ._common import LAUNCH, cdiv

#: state slots in memory (contract ``exact_sum``: 16 limbs, the carry limb, three special counts)
SLOTS = 20
#: terms folded into the state per normalisation (raw limb sums stay below 2**61)
CHUNK = 1 << 22
#: elements per program, terms per step, warps
ROWS, S_STEP, WARPS = 64, 4, 4
#: the variant reported where the device-generic torch code runs (the scatter form)
GENERIC_VARIANT = "torch-exact"
#: test hook: 4 elements per program, 2 terms per step and normalisation every 4 terms, so the
#: chunk loop, the masks and several programs run at small sizes
SMALL_TILES = False


@triton.jit
def _load_state(ptr, e, ok):
    """States of elements ``e [R]`` (int64 ``[n, 20]`` at ``ptr``) as ``[R, 32]`` (slots 20..31 zero)."""
    idx = tl.arange(0, 32)[None, :]
    return tl.load(ptr + e[:, None] * 20 + idx, mask=ok[:, None] & (idx < 20), other=0)


@triton.jit
def _store_state(ptr, e, ok, x):
    idx = tl.arange(0, 32)[None, :]
    tl.store(ptr + e[:, None] * 20 + idx, x, mask=ok[:, None] & (idx < 20))


@triton.jit
def _partial_kernel(t_ptr, out_ptr, S_TERMS, n, CHUNK_TERMS: tl.constexpr, R: tl.constexpr, S_STEP: tl.constexpr):
    """States of ``R`` elements of the terms ``[S_TERMS, n]`` (fp32) summed over axis 0."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    js = tl.arange(0, S_STEP)
    idx = tl.arange(0, 32)[None, :]
    x = tl.zeros([R, 32], tl.int64)
    nan = tl.zeros([R], tl.int64)
    pinf = tl.zeros([R], tl.int64)
    ninf = tl.zeros([R], tl.int64)
    for c0 in range(0, S_TERMS, CHUNK_TERMS):
        c1 = tl.minimum(c0 + CHUNK_TERMS, S_TERMS)
        r16 = tl.zeros([R, 16], tl.int64)
        for s0 in range(c0, c1, S_STEP):
            s = s0 + js
            valid = ok[:, None] & (s < c1)[None, :]
            t = tl.load(t_ptr + s[None, :].to(tl.int64) * n + e[:, None], mask=valid, other=0.0)
            r16 += S.raw_limbs(t, valid)
            a, b, c = S.special_counts(t, valid)
            nan += a
            pinf += b
            ninf += c
        x = S.normalize(x + S.widen(r16))
    x = tl.where(idx == 17, nan[:, None], x)
    x = tl.where(idx == 18, pinf[:, None], x)
    x = tl.where(idx == 19, ninf[:, None], x)
    _store_state(out_ptr, e, ok, x)


@triton.jit
def _merge_kernel(s_ptr, out_ptr, K, n, R: tl.constexpr):
    """The canonical state of the ``K`` states ``[K, n, 20]`` of each of ``R`` elements."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    x = tl.zeros([R, 32], tl.int64)
    for k in range(0, K):
        x += S.normalize(_load_state(s_ptr + k * (n * 20), e, ok))
    _store_state(out_ptr, e, ok, S.normalize(x))


@triton.jit
def _finish_kernel(s_ptr, out_ptr, n, R: tl.constexpr):
    """``RN32`` of the states ``[n, 20]`` of ``R`` elements (fp32)."""
    e = tl.program_id(0).to(tl.int64) * R + tl.arange(0, R)
    ok = e < n
    x = _load_state(s_ptr, e, ok)
    y = S.round_state(x, S.col(x, 17), S.col(x, 18), S.col(x, 19))
    tl.store(out_ptr + e, y, mask=ok)


# ----------------------------------------------------------------------------- host side


def _tiles() -> tuple[int, int, int]:
    """(elements per program, terms per step, terms per normalisation)."""
    return (4, 2, 4) if SMALL_TILES else (ROWS, S_STEP, CHUNK)


def exact_sum_partial(terms: torch.Tensor, index: torch.Tensor | None = None,
                      num_rows: int | None = None) -> torch.Tensor:
    """Kernel ``exact_sum_partial``: canonical int64 states ``[*E, 20]`` of the fp32 terms ``[S, *E]``
    summed over axis 0 (with ``index``: the device-generic scatter, ``[num_rows, *E, 20]``)."""
    if index is not None:
        dispatch.note_kernel(GENERIC_VARIANT)
        return _generic.exact_sum_partial(terms, index, num_rows)
    rest = tuple(terms.shape[1:])
    out = torch.empty((*rest, SLOTS), dtype=torch.int64, device=terms.device)
    n = out.numel() // SLOTS
    if n == 0:
        return out
    t = terms.to(torch.float32).contiguous()
    r, step, chunk = _tiles()
    _partial_kernel[(cdiv(n, r),)](t, out, t.shape[0], n, CHUNK_TERMS=chunk, R=r, S_STEP=step, num_warps=WARPS,
                                   **LAUNCH)
    return out


def exact_sum_merge(states: torch.Tensor) -> torch.Tensor:
    """Kernel ``exact_sum_merge``: the canonical state ``[*E, 20]`` of the union of ``states [K, *E, 20]``."""
    out = torch.empty(states.shape[1:], dtype=torch.int64, device=states.device)
    n = out.numel() // SLOTS
    if n == 0:
        return out
    if states.shape[0] == 0:
        return out.zero_()
    s = states.contiguous()
    r = _tiles()[0]
    _merge_kernel[(cdiv(n, r),)](s, out, s.shape[0], n, R=r, num_warps=WARPS, **LAUNCH)
    return out


def exact_sum_finish(states: torch.Tensor) -> torch.Tensor:
    """Kernel ``exact_sum_finish``: fp32 ``states.shape[:-1]``, ``RN32`` of each state's exact sum."""
    out = torch.empty(states.shape[:-1], dtype=torch.float32, device=states.device)
    n = out.numel()
    if n == 0:
        return out
    s = states.contiguous()
    r = _tiles()[0]
    _finish_kernel[(cdiv(n, r),)](s, out, n, R=r, num_warps=WARPS, **LAUNCH)
    return out


def static_specs(target):
    return [
        ("exact_sum_partial", "fp32_terms", _partial_kernel,
         {"t_ptr": "*fp32", "out_ptr": "*i64", "S_TERMS": "i32", "n": "i64", "CHUNK_TERMS": "constexpr",
          "R": "constexpr", "S_STEP": "constexpr"},
         {"CHUNK_TERMS": CHUNK, "R": ROWS, "S_STEP": S_STEP}, {"num_warps": WARPS}),
        ("exact_sum_merge", "states", _merge_kernel,
         {"s_ptr": "*i64", "out_ptr": "*i64", "K": "i32", "n": "i64", "R": "constexpr"},
         {"R": ROWS}, {"num_warps": WARPS}),
        ("exact_sum_finish", "states", _finish_kernel,
         {"s_ptr": "*i64", "out_ptr": "*fp32", "n": "i64", "R": "constexpr"},
         {"R": ROWS}, {"num_warps": WARPS}),
    ]
