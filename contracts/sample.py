"""Contract ``sample``: next-token sampling with temperature, top-k and top-p, bit-exact everywhere.

The same logits, parameters, seed and position give the same token on every backend, in any
batch. Randomness is Philox4x32-10 with a pinned counter layout (R7, P9); the Gumbel noise uses
the contract log (P6); the top-p cut is decided on exact integers; every comparison follows R5.

The algorithm (the definition; ``reference`` below executes it), per row b
---------------------------------------------------------------------------
Inputs: logits ``x`` [V] (fp32; bf16/fp16 upcast exactly), ``tau`` (fp32), ``k`` (int64,
0 = off), ``p`` (fp32, >= 1 = off), ``seed`` (int64, read as a uint64 bit pattern),
``pos`` (int64 >= 0).

1. ``tau == 0``: greedy. token = ``argmax_j x_j`` (R5: the first NaN if any, else the lowest
   index among the maxima). k and p are ignored.
2. Otherwise ``z_j = x_j / tau`` (one IEEE fp32 division).
3. Special rows (decided before any filtering): if some ``z_j`` is NaN, token = the first NaN
   index; else if some ``z_j`` is +inf, token = the first +inf index; else if every ``z_j`` is
   -inf, token = 0. (These are exactly what steps 4-8 would give if NaN ranked above every
   number and ``z_j - m`` were not needed.)
4. Rank: order the tokens by the key ``(-z_j, j)`` (largest z first, ties to the lower index;
   -0 and +0 are equal). ``rank_j`` in [0, V).
5. top-k: survivors are ``rank_j < k`` (all tokens when k = 0 or k >= V).
6. top-p (only when p < 1): ``m = max_j z_j``; ``q_j = RNE(exp_c(z_j - m) * 2**40)`` (an int64
   in [0, 2**40]); over the survivors in rank order, ``cum_before_j`` = the exact sum of ``q``
   of the survivors ranked before j and ``total`` = the sum over all survivors;
   ``pnum = RNE(p * 2**24)`` (an integer in [0, 2**24], exact from the fp32 p);
   ``P = (total >> 24) * pnum + (((total & (2**24 - 1)) * pnum) >> 24)``, which equals
   ``floor(total * pnum / 2**24)`` exactly in int64 (total <= V * 2**40 <= 2**58). A survivor
   is kept iff it is ranked first or ``cum_before_j < P``.
7. Gumbel noise for every kept j: Philox4x32-10 with key ``(seed & 0xFFFFFFFF,
   (seed >> 32) & 0xFFFFFFFF)`` and counter ``(j >> 2, pos & 0xFFFFFFFF,
   (pos >> 32) & 0xFFFFFFFF, 0)``; ``r`` = output word ``j & 3``;
   ``u_j = (2 * (r >> 9) + 1) * 2**-24`` (exact, in (0, 1));
   ``g_j = -log_c(-log_c(u_j))`` (fp32; negation is exact).
8. ``score_j = z_j + g_j`` (one fp32 addition) for kept j, -inf otherwise;
   token = ``argmax_j score_j`` (R5, ties to the lower index).

V <= 2**18 (so ``total`` and P stay exact in int64). The noise of token j at position pos
depends only on (seed, pos, j), so a request draws the same token alone or in any batch, and
the sampled distribution is softmax(z) restricted to the kept set (up to the 2**-24 grid of u
and the accuracy of log_c).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ._contract import BenchCase, Case, Contract, InvarianceCase, Runner
from ._exact.fixed import F_SUM, quantize
from ._exact.fp32 import argmax_r5
from ._exact.philox import philox4x32, uniform_from_u32
from ._exact.transcendental import exp_c, log_c
from ._gen import from_bits, integers, normal, seed_of, special_values
from .softmax import argument_below, grid_position, tie_argument

CONTRACT = Contract(
    name="sample",
    version=1,
    summary="token = argmax_j over kept j of (x_j / tau + g_j), g_j = -log_c(-log_c(u_j)), u from Philox(seed, pos, j)",
    invariances=("batch", "permutation", "repeat"),
    dtypes={"logits": (torch.float32, torch.bfloat16, torch.float16), "temperature": (torch.float32,),
            "top_k": (torch.int64,), "top_p": (torch.float32,), "seed": (torch.int64,),
            "position": (torch.int64,)},
    parameters={
        "philox_rounds": "Philox4x32 with 10 rounds, the key bumped between rounds",
        "philox_m0": "multiplier M0 = 0xD2511F53 (applied to counter word 0)",
        "philox_m1": "multiplier M1 = 0xCD9E8D57 (applied to counter word 2)",
        "philox_w0": "Weyl constant W0 = 0x9E3779B9 (bumps key word 0)",
        "philox_w1": "Weyl constant W1 = 0xBB67AE85 (bumps key word 1)",
        "philox_key_schedule": "round i (0-based) uses the key k + i * W: no bump before the first round",
        "counter_block": "counter word 0 = j >> 2 (four token ids per Philox block)",
        "counter_position": "counter words 1, 2 = position & 0xFFFFFFFF, position >> 32",
        "counter_word3": "counter word 3 = 0",
        "counter_output_word": "token j takes output word j & 3 of its block",
        "key_layout": "key = (seed & 0xFFFFFFFF, seed >> 32)",
        "uniform_bits": "u keeps the top 23 bits of the word: r >> 9",
        "uniform_offset": "u = (2 * (r >> 9) + 1) * 2**-24: the midpoints of a 2**-23 grid, never 0 or 1",
        "log_c": "g = -log_c(-log_c(u)), the contract logarithm (P6; every constant is pinned by log_softmax)",
        "exp_c": "q_j = RNE(exp_c(z_j - m) * 2**40), the contract exponential (P6; pinned by softmax)",
        "temperature_division": "z = x ÷ tau, one IEEE division (not x * RN(1 / tau))",
        "top_k_rule": "top-k survivors are the ranks 0 .. k - 1 (all when k = 0 or k >= V)",
        "top_p_frac_bits": "q_j on the absolute grid 2**-40 (F = 40)",
        "top_p_q_rounding": "q_j rounded half to even to the grid",
        "top_p_p_bits": "pnum = RNE(p * 2**24): 24 fraction bits of top_p",
        "top_p_p_rounding": "pnum rounded half to even",
        "top_p_cut": "P = floor(total * pnum / 2**24), exact in int64",
        "top_p_compare": "a survivor is kept iff the q of those ranked before it sum below P (strict)",
        "top_p_first_kept": "the first-ranked survivor is always kept",
        "argmax_ties": "greedy argmax and the Gumbel max: ties (and NaNs) go to the lowest index (R5)",
        "rank_ties": "ranking by (-z_j, j): equal z ranked by lower index first",
        "special_rows": "a row with NaN (else +inf) takes its first NaN (+inf) index",
    },
)

#: Largest vocabulary: the top-p total (<= V * 2**40) times pnum (<= 2**24) / 2**24 stays in int64.
MAX_VOCAB = 1 << 18
#: Fraction bits of top_p: pnum = RNE(top_p * 2**24).
P_BITS = 24
_MASK32 = 0xFFFFFFFF


def uniforms(seed: int, position: int, index: torch.Tensor) -> torch.Tensor:
    """``u_j = (2 * (r_j >> 9) + 1) * 2**-24`` for token ids ``index`` (int64 [n]); fp32 [n].

    ``r_j`` is word ``j & 3`` of Philox4x32-10 with key ``(seed lo, seed hi)`` and counter
    ``(j >> 2, pos lo, pos hi, 0)``; seed and position are read as 64-bit patterns.
    """
    n = index.shape[0]
    key = torch.tensor([seed & _MASK32, (seed >> 32) & _MASK32], dtype=torch.int64)
    counter = torch.stack([index >> 2, torch.full((n,), position & _MASK32, dtype=torch.int64),
                           torch.full((n,), (position >> 32) & _MASK32, dtype=torch.int64),
                           torch.zeros(n, dtype=torch.int64)], dim=-1)
    words = philox4x32(counter, key)  # [n, 4], values in [0, 2**32)
    r = words.gather(1, (index & 3).view(-1, 1)).view(-1)
    return uniform_from_u32(r)


def gumbel(seed: int, position: int, index: torch.Tensor) -> torch.Tensor:
    """``g_j = -log_c(-log_c(u_j))`` for token ids ``index``; fp32 [n]."""
    return -log_c(-log_c(uniforms(seed, position, index)))


def _top_p_keep(z_ranked: torch.Tensor, p: float) -> torch.Tensor:
    """Step 6 on the survivors in rank order (z_ranked[0] is the max): bool keep mask."""
    q = quantize(exp_c(z_ranked - z_ranked[0]), torch.zeros((), dtype=torch.int64), F_SUM)
    cum_before = torch.cumsum(q, dim=0) - q
    total = int(q.sum())
    pnum = int(torch.round(torch.tensor(p, dtype=torch.float64) * 2.0**P_BITS))  # exact: fp32 p
    cut = (total >> P_BITS) * pnum + (((total & ((1 << P_BITS) - 1)) * pnum) >> P_BITS)
    assert cut == (total * pnum) >> P_BITS  # the int64 formula is the exact floor
    first = torch.arange(z_ranked.shape[0]) == 0
    return first | (cum_before < cut)


def _row(x: torch.Tensor, tau: torch.Tensor, k: int, p: float, seed: int, position: int) -> int:
    """One row, steps 1-8."""
    v = x.shape[0]
    if float(tau) == 0.0:
        return int(argmax_r5(x))
    z = x / tau
    for special in (torch.isnan(z), z == float("inf")):
        if bool(special.any()):
            return int(special.nonzero()[0])
    if bool((z == float("-inf")).all()):
        return 0
    order = torch.sort(z + 0.0, descending=True, stable=True).indices  # (-z, j); +0.0 makes -0 equal to +0
    survivors = order[: v if k == 0 else min(k, v)]
    if p < 1.0:
        survivors = survivors[_top_p_keep(z[survivors], p)]
    score = torch.full((v,), float("-inf"), dtype=torch.float32)
    score[survivors] = z[survivors] + gumbel(seed, position, survivors)
    return int(argmax_r5(score))


def _per_row(value: Any, b: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to("cpu")
    return torch.full((b,), value, dtype=dtype)


def reference(logits: torch.Tensor, temperature: Any, top_k: Any, top_p: Any, seed: torch.Tensor,
              position: torch.Tensor) -> torch.Tensor:
    """Sample one token per row: Gumbel-max over the top-k/top-p kept set of ``logits / temperature``.

    Parameters
    ----------
    logits : Tensor, float32 (bfloat16/float16 upcast exactly), [B, V], V <= 2**18
    temperature : Tensor float32 [B], or a Python float (broadcast); >= 0, 0 = greedy
    top_k : Tensor int64 [B], or a Python int; >= 0, 0 = off
    top_p : Tensor float32 [B], or a Python float; >= 0, >= 1 = off
    seed : Tensor, int64, [B] (a uint64 bit pattern)
    position : Tensor, int64, [B], >= 0

    Returns
    -------
    Tensor, int64, [B]

    Bitwise semantics
    -----------------
    Steps 1-8 of the module docstring. Each row depends only on its own inputs (batch and
    permutation invariant). Contract ``sample`` version 1.
    """
    x = logits.to(torch.float32)
    b = x.shape[0]
    tau = _per_row(temperature, b, torch.float32)
    k = _per_row(top_k, b, torch.int64)
    p = _per_row(top_p, b, torch.float32)
    out = torch.empty(b, dtype=torch.int64)
    for i in range(b):
        out[i] = _row(x[i], tau[i], int(k[i]), float(p[i]), int(seed[i]), int(position[i]))
    return out


# --- conformance cases ------------------------------------------------------------------------

def _logits(name: str, b: int, v: int, std: float = 2.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return normal(seed_of("sample", name, "logits"), (b, v), std=std, dtype=dtype)


def _params(name: str, b: int, v: int, temperature: Any = 1.0, top_k: Any = 0, top_p: Any = 1.0,
            dtype: torch.dtype = torch.float32, std: float = 2.0) -> dict[str, Any]:
    s = seed_of("sample", name)
    return {"logits": _logits(name, b, v, std, dtype), "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "seed": integers(s, (b,), -(2**62), 2**62) * 2 + 1, "position": integers(s + 1, (b,), 0, 1 << 20)}


def _mixed(name: str, b: int, v: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Per-row parameters: greedy rows, top-k only, top-p only, both, neither."""
    s = seed_of("sample", name, "params")
    inputs = _params(name, b, v, dtype=dtype)
    temps = torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.5, 2.0, 1.0], dtype=torch.float32)
    ks = torch.tensor([5, 0, 20, 0, 50, 1, 0, v + 3], dtype=torch.int64)
    ps = torch.tensor([0.5, 1.0, 1.0, 0.9, 0.8, 1.0, 0.3, 1.5], dtype=torch.float32)
    pick = integers(s, (b,), 0, 8)
    inputs.update(temperature=temps[pick], top_k=ks[pick], top_p=ps[pick])
    return inputs


def golden_cases() -> list[Case]:
    """Vocabularies of realistic size with per-row parameter mixes; scalar-parameter forms."""
    return [
        Case("mixed_b16_v1000", "golden", lambda: _mixed("mixed_b16_v1000", 16, 1000)),
        Case("mixed_b8_v32000_bf16", "golden", lambda: _mixed("mixed_b8_v32000_bf16", 8, 32000, torch.bfloat16)),
        Case("scalars_b4_v5000_topk50_topp0.95", "golden",
             lambda: _params("scalars_b4_v5000_topk50_topp0.95", 4, 5000, 0.8, 50, 0.95)),
        Case("plain_b6_v777_fp16", "golden", lambda: _params("plain_b6_v777_fp16", 6, 777, dtype=torch.float16)),
        Case("top_p_only_b6_v4096", "golden", lambda: _params("top_p_only_b6_v4096", 6, 4096, 1.0, 0, 0.6, std=4.0)),
        Case("mixed_b64_v151936", "golden", lambda: _mixed("mixed_b64_v151936", 64, 151936), full_only=True),
    ]


def _specials(name: str) -> dict[str, Any]:
    """Rows holding NaN, +inf, -inf (some, all), -0/+0 maxima, subnormals, and greedy rows with them."""
    v = 12
    rows = []
    sv = special_values(torch.float32)  # +0 -0 +inf -inf nan sub sub normal max -max 1+ 1-
    base = _logits(name, 1, v)[0]
    for i in range(len(sv)):
        r = base.clone()
        r[(3 * i + 1) % v] = sv[i]
        rows.append(r)
    rows.append(torch.full((v,), float("-inf")))  # every logit -inf -> token 0
    r = torch.full((v,), float("-inf"))
    r[7] = -(2.0**-149)
    rows.append(r)  # one finite logit
    rows.append(torch.tensor([-0.0, 0.0, -0.0] + [-1.0] * (v - 3)))  # max ties at zero, both signs
    r = base.clone()
    r[2] = float("nan")
    r[9] = float("nan")
    rows.append(r)  # first NaN wins
    logits = torch.stack(rows)
    b = logits.shape[0]
    s = seed_of("sample", name)
    temps = torch.ones(b, dtype=torch.float32)
    temps[::3] = 0.0  # greedy rows see the specials too
    return {"logits": logits, "temperature": temps, "top_k": integers(s, (b,), 0, 4),
            "top_p": torch.where(torch.arange(b) % 2 == 0, 0.5, 1.0).to(torch.float32),
            "seed": integers(s + 1, (b,), 0, 2**62), "position": integers(s + 2, (b,), 0, 1000)}


def _ties(name: str) -> dict[str, Any]:
    """Many equal logits: top-k and top-p cuts fall inside a tie block (lower index wins)."""
    v = 64
    logits = torch.zeros((6, v), dtype=torch.float32)
    logits[:, ::2] = 1.0
    logits[:, 5] = 3.0
    s = seed_of("sample", name)
    return {"logits": logits, "temperature": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.25, 1.0]),
            "top_k": torch.tensor([3, 17, 0, 0, 2, 33]), "top_p": torch.tensor([1.0, 1.0, 1.0, 0.4, 1.0, 0.05]),
            "seed": integers(s, (6,), 0, 2**62), "position": torch.arange(6, dtype=torch.int64)}


def _extremes(name: str) -> dict[str, Any]:
    """Temperatures that overflow (1e-40) or flatten (3e38) the logits; top_p = 0 and just below 1;
    top_k = 1 and > V; the largest seeds and positions (all 64 bits)."""
    v = 50
    b = 8
    inputs = _params(name, b, v)
    inputs["temperature"] = torch.tensor([1e-40, 3e38, 1.0, 1.0, 1.0, 1.0, 0.9, 1e-3], dtype=torch.float32)
    inputs["top_k"] = torch.tensor([0, 0, 1, 1000, 0, 0, 2, 0])
    inputs["top_p"] = from_bits([0x3F800000, 0x3F7FFFFF, 0x3F7FFFFF, 0x00000000, 0x00000001, 0x3F000000,
                                 0x7F800000, 0x3DCCCCCD], torch.float32)
    inputs["seed"] = torch.tensor([-1, 0, 2**63 - 1, -(2**63), 1, 0x0123456789ABCDEF, -2, 12345])
    inputs["position"] = torch.tensor([0, 2**63 - 1, 2**32, 2**32 - 1, 7, 1, 2**40 + 3, 99])
    return inputs


def _large_k(name: str) -> dict[str, Any]:
    """top-k with k in the thousands (a backend may finish small k in one tile and large k otherwise),
    alone and with top-p, next to a small k."""
    inputs = _params(name, 6, 3000, std=3.0)
    inputs["temperature"] = torch.tensor([1.0, 0.8, 1.0, 1.2, 1.0, 1.0], dtype=torch.float32)
    inputs["top_k"] = torch.tensor([1025, 2000, 2999, 1500, 40, 1024])
    inputs["top_p"] = torch.tensor([1.0, 0.9, 0.5, 0.99, 0.9, 0.95], dtype=torch.float32)
    return inputs


def _non_contiguous(name: str) -> dict[str, Any]:
    inputs = _mixed(name, 5, 300)
    wide = torch.zeros((300, 10), dtype=torch.float32)
    wide[:, ::2] = inputs["logits"].t()
    inputs["logits"] = wide[:, ::2].t()
    big = torch.zeros(10, dtype=torch.int64)
    big[::2] = inputs["position"]
    inputs["position"] = big[::2]
    return inputs


# --- pinning cases ----------------------------------------------------------------------------
# Rows on a knife-edge, so that a one-step change of a parameter (CONTRACT.parameters) changes
# the sampled token; tests/test_mutations.py proves it on the generic backend. Every input is
# solved with the contract's own Philox, log_c, exp_c and grid rounding: the same everywhere.

_NEG_INF = float("-inf")
#: Token ids whose Gumbel noise at (seed of "pin_gumbel", position 0) changes when log_c's R0
#: moves one ulp up (61) or down (4): found by evaluating the noise of ids 0 .. 2**16 - 1.
_LOG_PROBE_IDS = (61, 4)
#: z_b for the top-p rows: exp_c(z_b) changes when exp_c's Q4 moves one ulp up (search of
#: [-11.8, 0]); p_b = 0.71 gives q_b a multiple of 2**16 units, exact on every grid.
_TOP_P_PROBE = 0xBEAEC5C4


def _pin_seed(name: str) -> int:
    return seed_of("sample", name) & ((1 << 62) - 1)


def _solve_score(target: float, g: float) -> float:
    """fp32 z with RN32(z + g) == target (fp32 target and g), stepping z by ulps from t - g."""
    t = torch.tensor(target, dtype=torch.float32)
    gt = torch.tensor(g, dtype=torch.float32)
    z = torch.tensor(target - g, dtype=torch.float32)
    for _ in range(256):
        s = z + gt
        if bool(s == t):
            return float(z)
        z = torch.nextafter(z, torch.tensor(float("inf") if bool(s < t) else _NEG_INF))
    raise RuntimeError("sample pinning rows: no logit gives the wanted score")


@functools.cache
def _pin_gumbel_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of 1024 logits, all -inf but tokens a (z = 0) and b, whose scores z + g differ by one
    fp32 ulp, one row with a ahead and one with b ahead: any change of g_a or g_b (Philox, the
    uniform map, log_c) flips one of the two. Pairs: a = each of :data:`_LOG_PROBE_IDS` with b
    the token whose g is next below; and a = the token of largest g at position 1 with b about
    0.7 below (u far apart: the uniform map's offset moves their noise by different amounts)."""
    seed, v = _pin_seed("pin_gumbel"), 1024
    ids = torch.arange(v, dtype=torch.int64)
    rows, positions = [], []
    for position, a, gap in ((0, _LOG_PROBE_IDS[0], 0.0), (0, _LOG_PROBE_IDS[1], 0.0), (1, None, 0.7)):
        g = gumbel(seed, position, ids)
        a = int(torch.argmax(g)) if a is None else a
        below = torch.where(g < g[a] - gap, g, _NEG_INF)
        b = int(torch.argmax(below))
        for ahead in (_NEG_INF, float("inf")):
            target = float(torch.nextafter(g[a], torch.tensor(ahead)))
            row = torch.full((v,), _NEG_INF, dtype=torch.float32)
            row[a] = 0.0
            row[b] = _solve_score(target, float(g[b]))
            rows.append(row)
            positions.append(position)
    n = len(rows)
    return torch.stack(rows), torch.full((n,), seed, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64)


def _pin_gumbel() -> dict[str, Any]:
    logits, seed, position = (t.clone() for t in _pin_gumbel_rows())
    b = logits.shape[0]
    return {"logits": logits, "temperature": torch.ones(b), "top_k": torch.zeros(b, dtype=torch.int64),
            "top_p": torch.ones(b), "seed": seed, "position": position}


def _units(z: list[float]) -> int:
    """Exact sum of ``RNE(exp_c(z) * 2**40)`` (the top-p numerators when the max is 0)."""
    return int(torch.round(grid_position(torch.tensor(z, dtype=torch.float32))).sum())


@functools.cache
def _truncation_tuners() -> list[float]:
    """Two tail logits whose grid positions sit at 1.95 modulo 2 (half to even rounds them up)."""
    return argument_below(torch.tensor([2001.95, 3001.95], dtype=torch.float64)).tolist()


@functools.cache
def _pin_top_p_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-p knife-edge rows: ``(logits [6, 32], top_p [6], seed [6], position [6])``.

    Tokens: a = 3 (z = 0, ranked first), b = 7 (z = :data:`_TOP_P_PROBE`, p_b = 0.71), three
    more at p ~ 0.7 ranked after b, and tuners ranked last. A kept and a cut row for each of
    three top_p bit patterns (top_p ~ 0.2618 = 2**40 over the expected total): pnum =
    top_p * 2**24 odd (a 23-bit pnum must round it), 2m + 1/2 (half to even rounds it down,
    half away up, a 25-bit pnum keeps the half), 2m + 3/2 (half to even rounds it up,
    truncation down). The exact total puts ``total * pnum / 2**24`` less than one slope
    (pnum / 2**24) above 2**40 + 1 (kept: b survives by a fraction of a grid unit) or less than
    one slope below it (cut). Kept rows hold two tuners at 1.95 modulo 2 (rounding them toward
    zero lowers the total), cut rows two exact grid ties (half away from zero raises it); the
    other tuners are exact on the 2**-41 grid and move the total by at most two units on the
    2**-39 grid. So a grid of 2**-39 or 2**-41 for q, another rounding of q or pnum, a rounded
    cut or ``<=`` for ``<`` decides b differently, and so does one ulp of exp_c(z_b). Each seed
    is chosen so that b beats a in the Gumbel race: b's survival decides the token.
    """
    z_b = float(from_bits([_TOP_P_PROBE], torch.float32)[0])
    head = [0.0, z_b] + [float(torch.tensor(z_b - 0.01 * i, dtype=torch.float32)) for i in (1, 2, 3)]
    specs = [(pnum2, kept) for pnum2 in (2 * 4392221, 8784445, 8784443) for kept in (True, False)]
    fixed, totals = [], []
    for pnum2, kept in specs:
        fixed.append(head + (_truncation_tuners() if kept else [tie_argument(5.9e6), tie_argument(6.9e6)]))
        pnum = (pnum2 + 1) // 2 if pnum2 % 4 == 3 else pnum2 // 2  # RNE(pnum2 / 2)
        first_kept = -(-(((1 << 40) + 1) << P_BITS) // pnum)  # smallest total with floor(total * pnum / 2**24) > 2**40
        totals.append(first_kept if kept else first_kept - 1)
    rest = torch.tensor([t - _units(f) for t, f in zip(totals, fixed)], dtype=torch.int64)

    def units(d: torch.Tensor) -> torch.Tensor:
        return torch.round(grid_position(d)).to(torch.int64)

    # coarse (exact: p >= 2**-16), an exact-integer tuner in [2**23, 2**24) leaving about 6144
    # units, and a fine one 0.02 to 0.04 above the remaining integer
    coarse = argument_below((rest - 3 * (1 << 22)).to(torch.float64))
    rest = rest - units(coarse)
    mid = argument_below((rest - 6144).to(torch.float64))
    rest = rest - units(mid)
    fine = argument_below(rest.to(torch.float64) + 0.04)
    rows, seeds, positions = [], [], []
    for i, ((_, kept), f) in enumerate(zip(specs, fixed)):
        terms = f + [float(coarse[i]), float(mid[i]), float(fine[i])]
        if _units(terms) != totals[i]:
            raise RuntimeError("sample pinning rows: the tuners did not reach the exact total")
        row = torch.full((32,), _NEG_INF, dtype=torch.float32)
        row[[3, 7, 10, 11, 12]] = torch.tensor(terms[:5])
        row[20:20 + len(terms) - 5] = torch.tensor(terms[5:])
        seed = _pin_seed(f"pin_top_p_{2 * (i // 2) + int(kept)}")
        position = next((p for p in range(1000) if float(row[7] + gumbel(seed, p, torch.tensor([7]))[0])
                         > float(row[3] + gumbel(seed, p, torch.tensor([3]))[0])), None)
        if position is None:
            raise RuntimeError("sample pinning rows: no position where b wins")
        rows.append(row)
        seeds.append(seed)
        positions.append(position)
    top_p = torch.tensor([pnum2 / 2.0**25 for pnum2, _ in specs], dtype=torch.float32)
    return (torch.stack(rows), top_p, torch.tensor(seeds, dtype=torch.int64),
            torch.tensor(positions, dtype=torch.int64))


def _pin_top_p() -> dict[str, Any]:
    logits, top_p, seed, position = (t.clone() for t in _pin_top_p_rows())
    b = logits.shape[0]
    return {"logits": logits, "temperature": torch.ones(b), "top_k": torch.zeros(b, dtype=torch.int64),
            "top_p": top_p, "seed": seed, "position": position}


def adversarial_cases() -> list[Case]:
    """Pinning rows; specials, ties, extreme parameters, one-token vocabulary, empty batch, strided inputs,
    top-k in the thousands."""

    def case(name: str, make: Any) -> Case:
        return Case(name, "adversarial", make)

    return [
        case("pin_gumbel_knife_edge", _pin_gumbel),
        case("pin_top_p_knife_edge", _pin_top_p),
        case("specials", lambda: _specials("specials")),
        case("ties", lambda: _ties("ties")),
        case("extremes", lambda: _extremes("extremes")),
        case("v1", lambda: _params("v1", 3, 1, torch.tensor([0.0, 1.0, 1.0]), 0, torch.tensor([1.0, 0.5, 0.0]))),
        case("b1_v3_bf16", lambda: _params("b1_v3_bf16", 1, 3, 0.7, 2, 0.9, dtype=torch.bfloat16)),
        case("b0_empty", lambda: _params("b0_empty", 0, 17)),
        case("non_contiguous", lambda: _non_contiguous("non_contiguous")),
        case("large_top_k_b6_v3000", lambda: _large_k("large_top_k_b6_v3000")),
        case("flat_logits_b4_v257", lambda: _params("flat_logits_b4_v257", 4, 257, 1.0, 0, 0.5, std=1e-30)),
    ]


# --- invariance cases -------------------------------------------------------------------------

def _row_of(inputs: dict[str, Any], i: int) -> dict[str, Any]:
    return {k: (v[i:i + 1] if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _check_batch(run: Runner) -> tuple[Any, Any]:
    """Request 2 alone vs the same request at row 4 of a batch of 7 (other rows differ)."""
    a = _mixed("inv_batch", 7, 2000)
    other = _mixed("inv_batch_other", 7, 2000)
    for key, val in a.items():
        other[key] = other[key].clone()
        other[key][4] = val[2]
    alone = run("sample", **_row_of(a, 2))
    batch = run("sample", **other)
    return alone, batch[4:5]


def _check_every_row(run: Runner) -> tuple[Any, Any]:
    """Each of 7 requests alone vs all 7 together."""
    a = _mixed("inv_batch_all", 7, 1500)
    alone = torch.cat([run("sample", **_row_of(a, i)) for i in range(7)])
    return alone, run("sample", **a)


def _check_permutation(run: Runner) -> tuple[Any, Any]:
    a = _mixed("inv_permutation", 9, 1200)
    perm = torch.tensor([3, 8, 0, 5, 1, 7, 2, 6, 4])
    whole = run("sample", **a)
    permuted = run("sample", **{k: v[perm] for k, v in a.items()})
    return whole[perm], permuted


def _check_repeat(run: Runner) -> tuple[Any, Any]:
    a = _mixed("inv_repeat", 8, 3000)
    return run("sample", **a), run("sample", **a)


def invariance_cases() -> list[InvarianceCase]:
    return [
        InvarianceCase("batch_row_alone_vs_in_7", "batch", _check_batch),
        InvarianceCase("batch_each_row_alone", "batch", _check_every_row),
        InvarianceCase("permutation_batch", "permutation", _check_permutation),
        InvarianceCase("repeat", "repeat", _check_repeat),
    ]


# --- benchmarks -------------------------------------------------------------------------------

def _native(logits: torch.Tensor, temperature: Any, top_k: Any, top_p: Any, seed: torch.Tensor,
            position: torch.Tensor) -> torch.Tensor:
    """The plain PyTorch baseline: multinomial over softmax(logits / T) (no top-k/top-p)."""
    probs = torch.softmax(logits.float() / temperature.unsqueeze(-1), dim=-1)
    return torch.multinomial(probs, 1).view(-1)


def _native_filtered(logits: torch.Tensor, temperature: Any, top_k: Any, top_p: Any, seed: torch.Tensor,
                     position: torch.Tensor) -> torch.Tensor:
    """The plain PyTorch baseline with per-row top-k and top-p, as vLLM's torch sampler does it: one
    ascending sort of the row, the k-th largest as a threshold, the top-p cut on the cumulative
    softmax of the sorted row, then multinomial (every step on the device, graph-capturable)."""
    z = logits.float() / temperature.unsqueeze(-1)
    z_sorted, order = z.sort(dim=-1, descending=False)
    v = z.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=v), torch.full_like(top_k, v))
    kth = z_sorted.gather(-1, (v - k).unsqueeze(-1))
    z_sorted = z_sorted.masked_fill(z_sorted < kth, float("-inf"))
    cum = z_sorted.softmax(dim=-1).cumsum(dim=-1)
    cut = cum <= (1 - top_p).unsqueeze(-1)
    cut[:, -1] = False  # the most likely token always stays
    z_sorted = z_sorted.masked_fill(cut, float("-inf"))
    probs = torch.empty_like(z_sorted).scatter_(-1, order, z_sorted.softmax(dim=-1))
    return torch.multinomial(probs, 1).view(-1)


def _bench(b: int, v: int = 151936, sizes: tuple[str, ...] = ("large",), k: int = 0, p: float = 1.0) -> BenchCase:
    def make(device: torch.device) -> dict[str, Any]:
        # Timing inputs only: torch's RNG on the device is fine here.
        g = torch.Generator(device=device).manual_seed(b)
        return {"logits": torch.randn((b, v), generator=g, device=device) * 3.0,
                "temperature": torch.full((b,), 0.8, device=device),
                "top_k": torch.full((b,), k, dtype=torch.int64, device=device),
                "top_p": torch.full((b,), p, device=device),
                "seed": torch.arange(b, dtype=torch.int64, device=device),
                "position": torch.full((b,), 100, dtype=torch.int64, device=device)}

    name = f"qwen3_vocab_b{b}" + (f"_topk{k}" if k else "") + (f"_topp{p:g}" if p < 1 else "")
    native = _native_filtered if k or p < 1 else _native
    return BenchCase(name, make, native, flops=0.0, bytes=4.0 * b * v + 8.0 * b, sizes=sizes, graph=True)


def bench_cases() -> list[BenchCase]:
    """B = 1, 64, 256 (large), B = 1, 4 (small) at the Qwen3 vocabulary (151936), fp32 logits,
    temperature 0.8; with top-k 50 and top-p 0.9 at B = 64 (large) and 4 (small), and top-p 0.9
    alone at B = 64, against vLLM's torch sampler (sort, threshold, cumulative softmax, multinomial).

    bytes = logits (fp32) + output (int64); flops = 0 (memory- and RNG-bound).
    """
    return [_bench(1, sizes=("small", "large")), _bench(64), _bench(256), _bench(4, sizes=("small",)),
            _bench(64, k=50, p=0.9), _bench(4, sizes=("small",), k=50, p=0.9), _bench(64, p=0.9)]
