"""Reference exact superaccumulator (docs/numerics.md P10): fp32 sums that are exact in any split.

A max-grid sum (P4) places terms on a grid chosen from the largest term of the set, so two
micro-batches with different maxima quantise the same term differently: splitting the set
changes the bits. The superaccumulator needs no grid choice. Every finite fp32 value is an
integer multiple of 2**-149 below 2**128, so a sum of fp32 values is an integer
``V = sum_i t_i * 2**149`` held exactly, and the result is ``V * 2**-149`` rounded once.

Definition (P10)
----------------
Decomposition of a term. A finite fp32 ``t = (-1)**sign * m * 2**(b - 150)`` with ``m`` its
24-bit significand (the hidden bit included for normals) and ``b = max(biased exponent, 1)``
(so subnormals use b = 1). Its limb index is ``L = (b - 1) >> 4`` in [0, 15] and its shift
``s = (b - 1) & 15``; the term adds ``±(m << s)`` (< 2**39) to limb ``L``, whose weight is
``2**(16 L - 149)``. So ``t * 2**149 = ±(m << s) * 2**(16 L)`` exactly.

State. An int64 vector of :data:`STATE_SLOTS` = 20 slots per sum:

======== ==================================================================================
slot     meaning
======== ==================================================================================
0 .. 15  limbs 0..15, weight ``2**(16 i - 149)``
16       carry limb, weight ``2**(256 - 149)`` (receives carries only; never a term)
17       number of NaN terms
18       number of +inf terms
19       number of -inf terms
======== ==================================================================================

Canonical (normalised) state: limbs 0..15 in [0, 2**16) and the carry limb signed, that is
``limb_i = (V >> 16 i) & 0xFFFF`` and ``carry = V >> 256`` (floor shifts). Each value has
exactly one canonical state, so a canonical partial does not depend on how its terms were
split, ordered or merged. Every op that returns a partial returns it canonical.

Accumulation. Terms are summed limb-wise in int64: exact for up to 2**23 terms per block
(2**23 * 2**39 < 2**63); a longer reduction is cut into blocks whose normalised partials are
added. Normalising (propagating ``limb_i >> 16`` upward, floor division) never changes V.

Merge. Partials of disjoint term sets (micro-batches, ranks, tiles) merge by adding their
state vectors slot by slot, in any order and grouping: exact, so a ``SUM`` all-reduce works.
The sum of canonical partials is not canonical; normalise (or finish) it. Safe bounds: fewer
than 2**46 partials and fewer than 2**41 terms in all (the carry limb then stays below 2**62).

Finalisation. If any NaN term, or both a +inf and a -inf term: NaN. Else if an infinity
occurred: that infinity. Else ``RN32(V * 2**-149)``: the exact value rounded once, to
nearest, ties to even, including subnormal results (exact: the subnormal quantum is the
accumulator's unit, so they never round) and overflow (``|V * 2**-149| >= 2**128 - 2**103``
gives ±inf). A zero total is +0 (also when every term is -0), an empty sum is +0.

This reference holds V as a Python integer (built from ``t * 2**149``, exact in float64) and
rounds it with integer arithmetic: clear and obviously right, not fast. The device-generic
implementation (``rlkernel.backends.generic._exact.superacc``) works on the limbs.
"""

from __future__ import annotations

import math

import torch

#: Number of term limbs, their width in bits, and the exponent of limb 0's unit.
NUM_LIMBS = 16
LIMB_BITS = 16
LSB_EXP = -149
#: Slots of a state vector: 16 limbs, the carry limb, #NaN, #+inf, #-inf.
STATE_SLOTS = 20
CARRY, NAN, POS_INF, NEG_INF = 16, 17, 18, 19
#: Terms per int64 block of raw limb sums (each contribution < 2**39).
BLOCK_TERMS = 1 << 23
#: Documented safe bounds for merges (see module docstring).
MAX_TERMS = 1 << 41


def term_limbs(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The P10 decomposition of each finite fp32 term: limb index L and signed contribution.

    Parameters
    ----------
    t : Tensor, float32, any shape

    Returns
    -------
    limb : Tensor, int64, shape of t
        ``L = (b - 1) >> 4`` (0 for non-finite terms).
    contribution : Tensor, int64, shape of t
        ``±(m << s)`` with ``s = (b - 1) & 15``, so ``t = contribution * 2**(16 L - 149)``
        (0 for non-finite terms).
    """
    finite = torch.isfinite(t)
    tf = torch.where(finite, t, torch.zeros_like(t)).to(torch.float64)
    mant, e = torch.frexp(tf)  # tf = mant * 2**e, mant in [0.5, 1) (or 0)
    e = e.to(torch.int64)
    # biased exponent of a normal fp32 is e + 126; subnormals (e <= -126) use b = 1
    b = torch.where(tf == 0, torch.ones_like(e), (e + 126).clamp(min=1))  # zeros: biased exponent 0 -> 1
    m = torch.ldexp(tf.abs(), 150 - b).to(torch.int64)  # |t| * 2**(150 - b): the 24-bit significand
    limb = torch.where(finite, (b - 1) >> 4, torch.zeros_like(b))
    contrib = torch.where(tf < 0, -(m << ((b - 1) & 15)), m << ((b - 1) & 15))
    return limb, torch.where(finite, contrib, torch.zeros_like(contrib))


def exact_value(t: torch.Tensor) -> int:
    """``V = sum_i t_i * 2**149`` over the finite terms of ``t`` (any shape), a Python int."""
    scaled = (t[torch.isfinite(t)].to(torch.float64) * 2.0**149).tolist()  # exact: 2**277 max
    return sum(int(v) for v in scaled)


def special_counts(t: torch.Tensor) -> tuple[int, int, int]:
    """(#NaN, #+inf, #-inf) among the terms of ``t`` (any shape)."""
    return (int(torch.isnan(t).sum()), int((t == float("inf")).sum()), int((t == float("-inf")).sum()))


def state_of(value: int, nan: int = 0, pos_inf: int = 0, neg_inf: int = 0) -> list[int]:
    """The canonical state vector (list of 20 ints) of exact value V and the special counts."""
    limbs = [(value >> (LIMB_BITS * i)) & 0xFFFF for i in range(NUM_LIMBS)]
    return limbs + [value >> (LIMB_BITS * NUM_LIMBS), nan, pos_inf, neg_inf]


def value_of(state: torch.Tensor | list[int]) -> tuple[int, int, int, int]:
    """``(V, #NaN, #+inf, #-inf)`` of one state vector (canonical or not)."""
    s = [int(v) for v in (state.tolist() if isinstance(state, torch.Tensor) else state)]
    if len(s) != STATE_SLOTS:
        raise ValueError(f"superacc: a state has {STATE_SLOTS} slots, got {len(s)}")
    value = sum(s[i] << (LIMB_BITS * i) for i in range(NUM_LIMBS)) + (s[CARRY] << (LIMB_BITS * NUM_LIMBS))
    return value, s[NAN], s[POS_INF], s[NEG_INF]


def round_value(value: int, nan: int = 0, pos_inf: int = 0, neg_inf: int = 0) -> float:
    """``RN32(V * 2**-149)`` (ties to even, overflow to ±inf) as a Python float, or the special.

    The result is a float64 holding an fp32 value exactly.
    """
    if nan or (pos_inf and neg_inf):
        return math.nan
    if pos_inf:
        return math.inf
    if neg_inf:
        return -math.inf
    if value == 0:
        return 0.0
    a = abs(value)
    drop = max(a.bit_length() - 24, 0)
    q, rem = a >> drop, a & ((1 << drop) - 1)
    if drop and (rem > 1 << (drop - 1) or (rem == 1 << (drop - 1) and q & 1)):
        q += 1
    if q.bit_length() + drop + LSB_EXP > 128:  # q * 2**(drop - 149) >= 2**128
        mag = math.inf
    else:
        mag = math.ldexp(q, drop + LSB_EXP)  # exact: q <= 2**24
    return -mag if value < 0 else mag


def _rows(t: torch.Tensor, dim: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    dim = dim % t.dim()
    moved = t.movedim(dim, -1)
    lead = tuple(moved.shape[:-1])
    return moved.reshape(math.prod(lead), moved.shape[-1]), lead


def accumulate(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Canonical superaccumulator states of fp32 terms summed along ``dim``.

    Parameters
    ----------
    t : Tensor, float32, any shape with at least one axis
    dim : int
        Reduction axis.

    Returns
    -------
    Tensor, int64, shape of ``t`` without ``dim`` plus a last axis of 20 slots
    """
    if t.dtype != torch.float32:
        raise TypeError(f"superacc.accumulate: expected float32 terms, got {t.dtype}")
    rows, lead = _rows(t, dim)
    states = [state_of(exact_value(r), *special_counts(r)) for r in rows]
    out = torch.tensor(states, dtype=torch.int64).reshape(-1, STATE_SLOTS)
    return out.reshape(*lead, STATE_SLOTS)


def merge(states: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Merge partial states along ``dim`` (the union of their term sets); canonical result.

    Parameters
    ----------
    states : Tensor, int64, [..., 20] with ``dim`` not the last axis

    Returns
    -------
    Tensor, int64, shape of ``states`` without ``dim``
    """
    dim = dim % states.dim()
    if dim == states.dim() - 1:
        raise ValueError("superacc.merge: dim must not be the slot axis")
    moved = states.movedim(dim, -2)
    lead = tuple(moved.shape[:-2])
    flat = moved.reshape(-1, moved.shape[-2], STATE_SLOTS)
    out = []
    for group in flat:
        value = nan = pos = neg = 0
        for s in group:
            v, a, b, c = value_of(s)
            value, nan, pos, neg = value + v, nan + a, pos + b, neg + c
        out.append(state_of(value, nan, pos, neg))
    return torch.tensor(out, dtype=torch.int64).reshape(*lead, STATE_SLOTS)


def normalize(states: torch.Tensor) -> torch.Tensor:
    """The canonical form of states ``[..., 20]`` (same values and counts)."""
    flat = states.reshape(-1, STATE_SLOTS)
    out = [state_of(*value_of(s)) for s in flat]
    return torch.tensor(out, dtype=torch.int64).reshape(states.shape)


def finish(states: torch.Tensor) -> torch.Tensor:
    """``RN32`` of each state's exact value (with the special rules), fp32 ``states.shape[:-1]``."""
    flat = states.reshape(-1, STATE_SLOTS)
    vals = [round_value(*value_of(s)) for s in flat]
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(states.shape[:-1])


def exact_sum(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``RN32(exact sum of t along dim)`` with the P10 special rules; fp32, ``dim`` removed.

    Bitwise semantics
    -----------------
    The exact real sum of the finite terms, rounded once to fp32 (RNE, subnormals kept,
    overflow to ±inf); NaN if a term is NaN or both infinities occur, else the infinity;
    +0 for a zero or empty sum. Independent of the order, blocking and split of the terms.
    """
    if t.dtype != torch.float32:
        raise TypeError(f"superacc.exact_sum: expected float32 terms, got {t.dtype}")
    rows, lead = _rows(t, dim)
    vals = [round_value(exact_value(r), *special_counts(r)) for r in rows]
    return torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(lead)
