"""Attention over packed (varlen) sequences with a KV cache, and over a paged KV cache, bit-exact.

``out_i = sum_j softmax_j(scale * q_i . k_j) v_j`` over the keys query ``i`` may see, with the
construction of docs/numerics.md R4a made exact: scores are exact digit dot products rounded once,
softmax numerator and denominator are integer sums on fixed grids, and the only divisions
are one IEEE fp32 division per output element. Every quantity of a query row depends only on
that row and the keys it may attend, so prefill, chunked prefill, decode, packing, KV block
size and split-KV cannot change a bit.

Two ops share this module: ``attention`` (keys contiguous per sequence, ``cu_seqlens``) and
``attention_paged`` (keys in a block-paged cache, ``block_table``). ``attention_paged`` gives the
bits of ``attention`` on the gathered keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.digits import digit_matmul, int_matmul, nonfinite_rows, row_exponent, to_grid
from rlkernel.contracts._exact.fixed import quantize
from rlkernel.contracts._exact.fp32 import expo, int2_to_float, int_to_float, max_r5, round_to
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import integers, normal, seed_of, special_values, with_outlier_channels

#: Fraction bits of the probability grid: ``L`` counts ``p`` in units of 2**-40; ``R <= 2**40``.
P_BITS = 40
#: ``R = R_hi * 2**R_SPLIT + R_lo`` with ``0 <= R_lo < 2**20``, ``R_hi <= 2**20``: two limbs of O.
R_SPLIT = 20
#: Magnitude bits of a V row on its own grid (P5): ``|Vint| <= 2**20``.
V_BITS = 20
#: Most keys one query may attend: ``L <= lk * 2**40`` and each limb ``|O_x| <= lk * 2**40`` stay
#: below 2**63.
MAX_KEYS = 1 << 22
#: The reference max is at most this many nats below the row max (keeps exp_c(m - ref) finite).
MAX_GAP = 64.0

CONTRACT = Contract(
    name="attention",
    version=2,
    summary=("out_i = RN(RN32(sum_j R_ij Vint_j 2**(E_i - 60)) / RN32(sum_j RNE(p_ij 2**40) 2**-40)), "
             "p_ij = exp_c(s_ij - max_j s_ij), s_ij = RN32(digit_dot(q_i, k_j) * scale); causal bottom-right"),
    invariances=("batch", "permutation", "chunking", "prefill_decode", "kv_split", "repeat"),
    dtypes={
        "q": (torch.bfloat16, torch.float16),
        "k": (torch.bfloat16, torch.float16),
        "v": (torch.bfloat16, torch.float16),
        "k_cache": (torch.bfloat16, torch.float16),
        "v_cache": (torch.bfloat16, torch.float16),
        "cu_seqlens_q": (torch.int32, torch.int64),
        "cu_seqlens_k": (torch.int32, torch.int64),
        "block_table": (torch.int32, torch.int64),
        "seq_lens_k": (torch.int32, torch.int64),
    },
    parameters={
        "qk_grid_bits": "scores by P5: q and k rows on 21-bit grids RNE(x * 2**(20 - e)), the exact integer dot "
                        "product rounded once to fp32 and scaled by 2**(e_q + e_k - 40)",
        "grid_rounding": "placing q, k and V values on their row grids rounds to nearest, ties to even",
        "row_exponent": "e = expo(max finite |x|) of each q, k and V row (P1)",
        "qk_nonfinite": "a q row or an allowed k row holding NaN or +-inf makes its scores, hence the output, NaN",
        "score_scale": "s = RN32(y * scale_f): scale_f = RN32(scale), default RN32(1 / sqrt(D)) correctly "
                       "rounded (host constant, R8)",
        "score_rounding": "two roundings: y = RN32 of the scaled dot product, then RN32(y * scale_f)",
        "causal_mask": "bottom-right causal: query i (0-based in its segment) sees keys 0 .. lk - lq + i",
        "reference_max": "p is taken from ref = max(c, RN32(m - 64)), c the max score over allowed keys whose V "
                         "row is not all zero (MAX_GAP = 64 nats)",
        "exp_c": "p = exp_c(RN32(s - ref)): the contract exp (P6; coefficients pinned by the softmax contract)",
        "p_bits": "L = sum RNE(p * 2**(40 - e_l)), e_l = expo(exp_c(m - ref)), and R = RNE(p * 2**(40 + e_j - E_i)): "
                  "probabilities on 2**-40 grids",
        "p_rounding": "p is placed on its grids to nearest, ties to even",
        "v_bits": "V rows on their own 21-bit grids Vint = RNE(v * 2**(20 - e_j)), |Vint| <= 2**20",
        "v_exponent_rule": "E_i = max e_j over the allowed V rows that are not all zero (0 if none)",
        "v_nonfinite": "an allowed V row holding NaN or +-inf makes the output row NaN",
        "qk_int_to_fp32": "the exact q.k integer -> fp32 in one rounding, to nearest, ties to even (P3)",
        "int_to_fp32": "O * 2**(E_i - 60) and L * 2**(e_l - 40) -> fp32 in one rounding each, to nearest, ties "
                       "to even (P3')",
        "subnormal_results": "the numerator and the output keep subnormal values (no flush to zero)",
        "output_division": "out = RN32(O 2**(E_i - 60)) ÷ RN32(L 2**(e_l - 40)): one IEEE fp32 division",
        "output_cast": "fp32 -> q.dtype to nearest, ties to even (R6)",
    },
)


# --------------------------------------------------------------------------- host constants (R8)


def default_scale(head_dim: int) -> float:
    """``RN32(1 / sqrt(head_dim))``, correctly rounded, computed exactly in integers.

    With ``k = 80``, ``n = floor(2**(2k) / D)`` and ``q = isqrt(n) = floor(2**k / sqrt(D))``
    (``floor(sqrt(floor(x))) = floor(sqrt(x))``); ``q`` has at least 41 bits for ``D < 2**78``.
    ``q`` is cut to 24 bits and rounded half-to-even, the discarded part of ``2**k / sqrt(D)``
    being ``rem + frac`` with ``frac = 0`` exactly when ``q**2 * D == 2**(2k)``. The float64 route
    ``float32(1 / math.sqrt(D))`` agrees for every D tested (tests/test_attention.py), but that
    route rounds three times; this one rounds once.

    Parameters
    ----------
    head_dim : int
        D >= 1.

    Returns
    -------
    float
        A binary32 value (exactly representable in fp32).
    """
    if head_dim < 1:
        raise ValueError(f"attention: head_dim must be >= 1, got {head_dim}")
    k = 80
    n = (1 << (2 * k)) // head_dim
    q = math.isqrt(n)
    exact = q * q * head_dim == 1 << (2 * k)
    shift = q.bit_length() - 24
    mant, rem = q >> shift, q & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (not exact or mant & 1)):
        mant += 1
    return math.ldexp(float(mant), shift - k)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """The fp32 score scale as a Python float: ``RN32(scale)`` or :func:`default_scale`."""
    if scale is None:
        return default_scale(head_dim)
    return float(torch.tensor(float(scale), dtype=torch.float32).item())


# --------------------------------------------------------------------------- reference


def _rows_attention(s: torch.Tensor, allowed: torch.Tensor, ev: torch.Tensor, vzero: torch.Tensor,
                    vint: torch.Tensor, vbad: torch.Tensor) -> torch.Tensor:
    """Softmax-weighted sum of V rows for one head of one sequence, fp32 [lq, D].

    s [lq, lk] fp32 scores; allowed [lq, lk] bool; ev [lk] int64 V row exponents; vzero [lk]
    bool (zero V rows); vint [lk, D] int64 V rows on their grids; vbad [lk] bool (non-finite).
    """
    lq, lk = s.shape
    d = vint.shape[1]
    if lk == 0:  # nothing to attend (non-causal with lk = 0): 0 / 0
        return torch.full((lq, d), float("nan"), dtype=torch.float32)
    neg_inf = torch.full_like(s, float("-inf"))
    m = max_r5(torch.where(allowed, s, neg_inf), dim=1)  # R5 over the allowed keys
    # The reference max: the max over the allowed keys whose V row is not all zero (keys with a
    # zero value add nothing to the numerator, e.g. an attention sink with a zero value vector),
    # but at most 64 nats below m. Probabilities are taken relative to it.
    contrib = allowed & ~vzero.unsqueeze(0)
    c = max_r5(torch.where(contrib, s, neg_inf), dim=1)
    ref = torch.maximum(c, m - MAX_GAP)  # fp32 subtraction; NaN propagates
    p = exp_c(s - ref.unsqueeze(1))  # fp32 subtraction, contract exp
    p = torch.where(allowed, p, torch.zeros_like(p))
    bad = (torch.isnan(p) & allowed).any(dim=1) | (vbad.unsqueeze(0) & allowed).any(dim=1)
    p = torch.where(torch.isnan(p), torch.zeros_like(p), p)
    # Denominator grid: 2**(e_l - 40), e_l = expo(exp_c(m - ref)) (1 when ref = m): every p <= 2**e_l.
    top = exp_c(m - ref)
    e_l = torch.where(torch.isfinite(top), expo(torch.where(torch.isfinite(top), top, torch.ones_like(top))),
                      torch.ones_like(m, dtype=torch.int64))

    # E_i: max V row exponent over the allowed rows that are not all zero (0 if there are none).
    floor = torch.full((lq, lk), -(1 << 30), dtype=torch.int64)
    e_big = torch.where(contrib, ev.unsqueeze(0).expand(lq, lk), floor).amax(dim=1)
    e_row = torch.where(contrib.any(dim=1), e_big, torch.zeros_like(e_big))

    # R_ij = RNE(p_ij * 2**(40 + e_j - E_i)) (p_ij <= 1 on these rows); zero rows get R = 0.
    e_safe = torch.where(contrib, e_row.unsqueeze(1) - ev.unsqueeze(0), torch.zeros((lq, lk), dtype=torch.int64))
    r = torch.where(contrib, quantize(p, e_safe, P_BITS), torch.zeros((lq, lk), dtype=torch.int64))
    total = quantize(p, e_l.unsqueeze(1).expand(lq, lk), P_BITS).sum(dim=1)  # L_i, int64
    # O_i = sum_j R_ij Vint_j, exact, as two int64 limbs: O = O_hi * 2**20 + O_lo
    o_hi = int_matmul(r >> R_SPLIT, vint.T)
    o_lo = int_matmul(r & ((1 << R_SPLIT) - 1), vint.T)

    num = int2_to_float(o_hi, o_lo, R_SPLIT, (e_row - V_BITS - P_BITS).unsqueeze(1), torch.float32)
    den = int_to_float(total, e_l - P_BITS, torch.float32)
    out = num / den.unsqueeze(1)  # IEEE fp32 division
    return torch.where(bad.unsqueeze(1), torch.full_like(out, float("nan")), out)


def _lengths(cu: torch.Tensor) -> list[int]:
    c = [int(x) for x in cu.tolist()]
    return [c[i + 1] - c[i] for i in range(len(c) - 1)]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """Attention over packed sequences with a KV cache (the definition of ``attention``'s bits).

    ``out_i = sum_{j in A_i} p_ij v_j / sum_{j in A_i} p_ij`` with
    ``p_ij = exp_c(s_ij - max_{j in A_i} s_ij)`` and ``s_ij = RN32(digit_dot(q_i, k_j) * scale)``,
    numerator and denominator exact integer sums on fixed grids.

    Parameters
    ----------
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
        Queries of all sequences, packed (any strides).
    k : Tensor, q's dtype, [Tk, Hkv, D]
        Keys of all sequences (the whole KV cache of each: cached keys then the new ones).
    v : Tensor, q's dtype, [Tk, Hkv, D]
        Values, laid out like ``k``.
    cu_seqlens_q : Tensor, int32/int64, [B + 1]
        Sequence b owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` (``lq_b`` rows; 0 is
        allowed). ``cu_seqlens_q[0] = 0``, ``cu_seqlens_q[B] = Tq``, non-decreasing.
    cu_seqlens_k : Tensor, int32/int64, [B + 1]
        Sequence b owns key rows ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]`` (``lk_b`` rows).
    scale : float, optional
        Score scale, rounded once to fp32; default ``RN32(1 / sqrt(D))`` (:func:`default_scale`).
    causal : bool
        Bottom-right aligned causal mask (default). Needs ``lk_b >= lq_b``.

    Returns
    -------
    Tensor, q's dtype, [Tq, Hq, D]

    Bitwise semantics
    -----------------
    Hq must be a multiple of Hkv; query head h reads KV head ``h // (Hq // Hkv)`` (GQA). For
    query i of sequence b (0-based in its segment) the allowed keys ``A_i`` are, 0-based in the
    segment, ``0 .. lk - lq + i`` when causal (its absolute position is ``lk - lq + i``: prefill
    ``lq = lk``, decode ``lq = 1``, chunked prefill ``lq < lk``) and ``0 .. lk - 1`` otherwise.
    Per query row and head, every fp32 operation one IEEE round-to-nearest-even:

    1. ``scale_f = RN32(scale)``, or ``RN32(1 / sqrt(D))`` correctly rounded (host, R8).
    2. ``s_ij = RN32(y_ij * scale_f)`` where ``y_ij`` is the P5 digit dot product of q row i and
       k row j (each on its own 21-bit grid from its own max exponent over D; the integer dot
       product exact; ``ldexp_c(int_to_fp32(C), eq + ek - 40)``). A q or k row holding NaN or
       inf gives NaN scores.
    3. ``m_i = max_{j in A_i} s_ij`` (R5: NaN propagates); ``c_i`` = the R5 max over the allowed
       keys whose V row is not all zero (-inf if none); the reference max
       ``ref_i = max(c_i, RN32(m_i - 64))``. (A key with a zero value vector, such as an
       attention sink with a zero value, adds nothing to the numerator, so the probabilities are
       measured from the largest key that does.)
    4. ``p_ij = exp_c(RN32(s_ij - ref_i))`` (contract exp, P6): in [0, 1] on the keys with a
       non-zero V row, up to ``e**64`` on zero-value keys above them.
    5. V row j (per KV head): ``e_j = expo(max_d |v_jd|)`` (P1) and
       ``Vint_j = RNE(v_j * 2**(20 - e_j))`` (P5 grid, ``|Vint| <= 2**20``).
       ``E_i = max e_j`` over the allowed rows that are not all zero; 0 if every allowed row is
       zero. (A zero row has ``Vint = 0``, adds nothing to ``O`` and takes no part in ``E_i``, so
       zero padding rows cost no precision.)
    6. ``R_ij = RNE(p_ij * 2**(40 + e_j - E_i))`` (exact scaling, round half to even; 0 for zero
       rows), ``0 <= R_ij <= 2**40``.
    7. ``e_l = expo(exp_c(RN32(m_i - ref_i)))`` (1 when ``ref_i = m_i``), so every ``p_ij <= 2**e_l``;
       ``L_i = sum_{j in A_i} RNE(p_ij * 2**(40 - e_l))`` (exact int64) and ``O_i = sum_{j in A_i} R_ij *
       Vint_j``, the exact integer (up to 2**82: held as two int64 limbs, ``O_hi = sum (R >> 20)
       Vint`` and ``O_lo = sum (R mod 2**20) Vint``); the order of the additions, blocks and splits
       of the keys cannot matter.
    8. ``out_i = RN_dtype(RN32(O_i * 2**(E_i - 60)) ÷ RN32(L_i * 2**(e_l - 40)))``: each of numerator and
       denominator rounded once from the exact integer (P3'), one IEEE fp32 division per
       element, then the cast (P8).

    Accuracy (version 2): the 2**-40 probability grid keeps keys up to ~27.7 nats below the
    reference max with relative precision, and the reference max ignores keys whose value is
    zero, so an attention sink (one key 10-30 nats above the rest, with a small or a zero value
    vector) leaves the small-weight mixture of the other keys intact. Keys more than ~27.7 nats
    below the largest key with a non-zero value round to 0 (version 1's 2**-20 grid, relative to
    the overall max, dropped them beyond ~14.6 nats). ``rlkernel accuracy --op attention``
    measures it next to SDPA.

    Special values: ``out_i`` is NaN (canonical) when any ``p_ij`` (j in A_i) is NaN -- a q row
    or an allowed k row holding NaN/inf, or scores that overflow to +inf -- or when an allowed
    V row holds NaN/inf; also when A_i is empty (non-causal with ``lk = 0``: 0 ÷ 0). Keys outside
    ``A_i`` (later positions, other sequences) never influence row i, whatever they hold. The
    numerator is formed in fp32, so it overflows to ±inf only when |v| is within a factor
    ``lk`` of the fp32 maximum (bf16 values near 3e38). Bound: ``lk <= 2**22`` per sequence.

    Invariances: batch (a sequence alone or packed anywhere among others), permutation of the
    sequences, chunking (chunked prefill against the KV cache), prefill_decode (token-by-token
    decode gives the prefill rows), kv_split (any block size, paging, split-KV: integer
    partials add), repeat.

    Contract ``attention`` version 2.
    """
    tq, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale_f = torch.tensor(resolve_scale(scale, d), dtype=torch.float32)
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    out = torch.zeros((tq, hq, d), dtype=torch.float32)

    vf = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
    ev = row_exponent(v)  # [Tk, Hkv]
    vzero = vf.abs().amax(dim=-1) == 0  # [Tk, Hkv]
    vint = to_grid(v, ev)  # [Tk, Hkv, D] int64
    vbad = nonfinite_rows(v)  # [Tk, Hkv]

    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        if lk > MAX_KEYS:
            raise ValueError(f"attention: sequence {b} has {lk} keys; the exact sums allow at most {MAX_KEYS}")
        if causal and lk < lq:
            raise ValueError(f"attention: causal sequence {b} has {lq} queries but only {lk} keys; need lk >= lq")
        i = torch.arange(lq).unsqueeze(1)
        j = torch.arange(lk).unsqueeze(0)
        allowed = j <= lk - lq + i if causal else torch.ones((lq, lk), dtype=torch.bool)
        for h in range(hq):
            g = h // group
            if lk:
                s = digit_matmul(q[q0:q1, h], k[k0:k1, g]) * scale_f
            else:
                s = torch.zeros((lq, 0), dtype=torch.float32)
            out[q0:q1, h] = _rows_attention(s, allowed, ev[k0:k1, g], vzero[k0:k1, g], vint[k0:k1, g],
                                            vbad[k0:k1, g])
    return round_to(out, q.dtype)


def gather_paged(cache: torch.Tensor, block_table: torch.Tensor, seq_lens_k: torch.Tensor) -> torch.Tensor:
    """The keys (or values) of every sequence from a paged cache, packed in sequence order.

    Position ``pos`` of sequence b lives in block ``block_table[b, pos // block_size]``, slot
    ``pos % block_size``. Returns ``[sum(seq_lens_k), H, D]``.
    """
    bs = cache.shape[1]
    rows = []
    for b, n in enumerate(int(x) for x in seq_lens_k.tolist()):
        pos = torch.arange(n)
        blocks = block_table[b].to(torch.int64)[pos // bs]
        rows.append(cache[blocks, pos % bs])
    if not rows:
        return cache.new_zeros((0, *cache.shape[2:]))
    return torch.cat(rows)


def reference_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens_k: torch.Tensor, cu_seqlens_q: torch.Tensor, scale: float | None = None,
                    causal: bool = True) -> torch.Tensor:
    """Attention over a block-paged KV cache (the definition of ``attention_paged``'s bits).

    ``attention_paged(...) = attention(q, gather(k_cache), gather(v_cache), cu_seqlens_q,
    cumsum(seq_lens_k), scale, causal)``.

    Parameters
    ----------
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
        Queries, packed by ``cu_seqlens_q``.
    k_cache : Tensor, q's dtype, [num_blocks, block_size, Hkv, D]
        Paged keys (vLLM layout).
    v_cache : Tensor, q's dtype, [num_blocks, block_size, Hkv, D]
        Paged values.
    block_table : Tensor, int32/int64, [B, max_blocks]
        Physical block of each logical block of each sequence; entries past
        ``ceil(seq_lens_k[b] / block_size)`` are not read.
    seq_lens_k : Tensor, int32/int64, [B]
        Keys of sequence b: positions ``0 .. seq_lens_k[b] - 1``.
    cu_seqlens_q : Tensor, int32/int64, [B + 1]
        Query segments, as in :func:`reference`.
    scale : float, optional
        As in :func:`reference`.
    causal : bool
        As in :func:`reference`.

    Returns
    -------
    Tensor, q's dtype, [Tq, Hq, D]

    Bitwise semantics
    -----------------
    Exactly the bits of :func:`reference` on the gathered contiguous keys: key ``pos`` of
    sequence b is ``k_cache[block_table[b, pos // block_size], pos % block_size]``. Slots not
    referenced (other sequences' blocks, unused slots, table padding) never influence a bit.
    Contract ``attention`` version 2 (op ``attention_paged``).
    """
    k = gather_paged(k_cache, block_table, seq_lens_k)
    v = gather_paged(v_cache, block_table, seq_lens_k)
    lens = torch.as_tensor([int(x) for x in seq_lens_k.tolist()], dtype=torch.int64)
    cu_k = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lens, 0)])
    return reference(q, k, v, cu_seqlens_q, cu_k, scale=scale, causal=causal)


REFERENCES = {"attention": reference, "attention_paged": reference_paged}


# --------------------------------------------------------------------------- input builders


def cu_of(lengths: Sequence[int]) -> torch.Tensor:
    """``[0, l0, l0 + l1, ...]`` as int32 (the usual varlen layout)."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return torch.tensor(out, dtype=torch.int32)


def make_pack(tag: str, lens: Sequence[tuple[int, int]], hq: int, hkv: int, d: int, dtype: torch.dtype,
              q_std: float = 1.0, k_std: float = 1.0, v_std: float = 1.0) -> dict[str, Any]:
    """Deterministic ``attention`` inputs for sequences with ``(lq, lk)`` lengths (causal default)."""
    tq = sum(a for a, _ in lens)
    tk = sum(b for _, b in lens)
    q = normal(seed_of("attention", tag, "q"), (tq, hq, d), std=q_std, dtype=dtype)
    k = normal(seed_of("attention", tag, "k"), (tk, hkv, d), std=k_std, dtype=dtype)
    v = normal(seed_of("attention", tag, "v"), (tk, hkv, d), std=v_std, dtype=dtype)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_of([a for a, _ in lens]),
            "cu_seqlens_k": cu_of([b for _, b in lens]), "scale": None, "causal": True}


def to_paged(inputs: dict[str, Any], block_size: int, tag: str, spare_blocks: int = 3,
             table_pad: int = 2, fill: float = float("nan")) -> dict[str, Any]:
    """The same problem as ``attention`` inputs, with the keys in a shuffled paged cache.

    Physical blocks are a deterministic permutation (``tag``); ``spare_blocks`` extra blocks and
    the unused slots of the last block of each sequence hold ``fill`` (NaN by default: never
    read), and each table row has ``table_pad`` extra entries of -1 (never read).
    """
    k, v = inputs["k"], inputs["v"]
    cu_k = [int(x) for x in inputs["cu_seqlens_k"].tolist()]
    lens = [cu_k[i + 1] - cu_k[i] for i in range(len(cu_k) - 1)]
    nblk = [-(-n // block_size) for n in lens]
    total = sum(nblk) + spare_blocks
    keys = integers(seed_of("attention", tag, "perm", block_size), (max(total, 1),), 0, 1 << 62)[:total]
    perm = torch.argsort(keys, stable=True)  # a deterministic permutation of the physical blocks
    hkv, d = k.shape[1], k.shape[2]
    k_cache = torch.full((total, block_size, hkv, d), fill, dtype=k.dtype)
    v_cache = torch.full((total, block_size, hkv, d), fill, dtype=v.dtype)
    width = max(nblk, default=0) + table_pad
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    nxt = 0
    for b, n in enumerate(lens):
        for blk in range(nblk[b]):
            phys = int(perm[nxt])
            nxt += 1
            table[b, blk] = phys
            lo = blk * block_size
            hi = min(lo + block_size, n)
            k_cache[phys, : hi - lo] = k[cu_k[b] + lo: cu_k[b] + hi]
            v_cache[phys, : hi - lo] = v[cu_k[b] + lo: cu_k[b] + hi]
    return {"q": inputs["q"], "k_cache": k_cache, "v_cache": v_cache, "block_table": table,
            "seq_lens_k": torch.tensor(lens, dtype=torch.int32), "cu_seqlens_q": inputs["cu_seqlens_q"],
            "scale": inputs.get("scale"), "causal": inputs.get("causal", True)}


# --------------------------------------------------------------------------- golden cases


_CONFIGS = {"h4_2_d64": (4, 2, 64), "h8_2_d128": (8, 2, 128), "h32_8_d128": (32, 8, 128)}


def golden_cases() -> list[Case]:
    """Small GQA configs (4/2/64, 8/2/128, 32/8/128): prefill, decode, chunked, non-causal, paged."""
    bf16, fp16 = torch.bfloat16, torch.float16
    specs: list[tuple[str, str, list[tuple[int, int]], torch.dtype, bool]] = [
        ("prefill", "h4_2_d64", [(5, 5), (17, 17), (33, 33)], bf16, True),
        ("prefill", "h8_2_d128", [(9, 9), (40, 40)], fp16, True),
        ("prefill", "h32_8_d128", [(12, 12), (3, 3)], bf16, True),
        ("decode", "h8_2_d128", [(1, 1), (1, 77), (1, 300)], bf16, True),
        ("decode", "h32_8_d128", [(1, 129), (1, 2), (1, 300)], fp16, True),
        ("chunked", "h32_8_d128", [(5, 20), (16, 40), (1, 3)], bf16, True),
        ("chunked", "h4_2_d64", [(7, 64), (2, 9)], fp16, True),
        ("noncausal", "h4_2_d64", [(6, 11), (9, 4), (1, 1)], bf16, False),
        ("noncausal", "h8_2_d128", [(12, 12), (3, 25)], fp16, False),
    ]
    cases = []
    for kind, cfg, lens, dt, causal in specs:
        tag = f"{kind}_{cfg}_{'bf16' if dt == bf16 else 'fp16'}"
        hq, hkv, d = _CONFIGS[cfg]

        def make(t: str = tag, ls: list[tuple[int, int]] = lens, h: int = hq, kv: int = hkv, dd: int = d,
                 dtype: torch.dtype = dt, c: bool = causal) -> dict[str, Any]:
            return {**make_pack(t, ls, h, kv, dd, dtype), "causal": c}

        cases.append(Case(tag, "golden", make))
    for tag, cfg, lens, dt, bs, causal in [
        ("paged_decode_h8_2_d128_bf16_bs16", "h8_2_d128", [(1, 33), (1, 1), (1, 150)], bf16, 16, True),
        ("paged_chunked_h32_8_d128_fp16_bs16", "h32_8_d128", [(4, 40), (9, 9)], fp16, 16, True),
        ("paged_prefill_h4_2_d64_bf16_bs1", "h4_2_d64", [(10, 10), (3, 3)], bf16, 1, True),
        ("paged_noncausal_h4_2_d64_fp16_bs64", "h4_2_d64", [(5, 70), (2, 3)], fp16, 64, False),
    ]:
        hq, hkv, d = _CONFIGS[cfg]

        def make_paged(t: str = tag, ls: list[tuple[int, int]] = lens, h: int = hq, kv: int = hkv, dd: int = d,
                       dtype: torch.dtype = dt, b: int = bs, c: bool = causal) -> dict[str, Any]:
            return to_paged({**make_pack(t, ls, h, kv, dd, dtype), "causal": c}, b, t)

        cases.append(Case(tag, "golden", make_paged, op="attention_paged"))
    return cases


# --------------------------------------------------------------------------- adversarial cases


def _adv_outlier_keys(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """A few keys with huge scores: every other p underflows (to subnormal or 0)."""
    inp = make_pack(f"outlier_keys_{tag}", [(6, 6), (1, 40), (3, 21)], 4, 2, 64, dtype)
    k = inp["k"].to(torch.float64)
    k[[2, 10, 30]] *= 60.0 if dtype == torch.float16 else 300.0  # scores of several hundred
    inp["k"] = k.to(dtype)
    return inp


def _adv_equal_scores(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """Identical keys: all scores equal, p = 1 everywhere, out = mean of V (ties of every kind)."""
    inp = make_pack(f"equal_scores_{tag}", [(5, 5), (1, 64), (2, 9)], 4, 2, 64, dtype)
    inp["k"] = inp["k"][:1].expand_as(inp["k"]).contiguous()
    return inp


def _adv_zero_v_rows(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """Zero V rows (padding) among small ones, and a sequence whose V rows are all zero."""
    inp = make_pack(f"zero_v_{tag}", [(4, 4), (1, 20), (3, 3)], 4, 2, 64, dtype, v_std=2.0**-8)
    v = inp["v"].clone()
    v[[0, 2, 7, 11, 12, 13]] = 0
    v[24:27] = 0  # the third sequence: every V row zero -> out = +0
    v[5, 1] = -0.0
    inp["v"] = v
    return inp


def _adv_v_dynamic_range(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """V rows spread over many binades (e_j from tiny to huge): R_ij on very different grids."""
    lens = [(8, 8), (1, 33)]
    inp = make_pack(f"v_range_{tag}", lens, 4, 2, 64, dtype)
    tk = inp["v"].shape[0]
    if dtype == torch.bfloat16:
        exps = integers(seed_of("attention", "v_range_exp", tag), (tk, 2, 1), -120, 120)
    else:
        exps = integers(seed_of("attention", "v_range_exp", tag), (tk, 2, 1), -14, 14)
    scale = torch.ldexp(torch.ones((), dtype=torch.float64), exps.to(torch.float64))  # exact powers of two
    inp["v"] = (inp["v"].to(torch.float64) * scale).to(dtype)
    return inp


def _adv_nan_k_row(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """NaN in one key row (and +inf in another head's key, -inf in a V row): only the query rows
    that may attend them are NaN."""
    inp = make_pack(f"nan_k_{tag}", [(6, 6), (2, 12)], 4, 2, 64, dtype)
    k, v = inp["k"].clone(), inp["v"].clone()
    k[3, 0, 5] = float("nan")  # seq 0, key 3, kv head 0: queries 3.. of heads 0-1 are NaN
    k[10, 1, 0] = float("inf")  # seq 1, key 4, kv head 1: both queries of heads 2-3 (they see key 4)
    v[17, 0, 7] = float("-inf")  # seq 1, key 11, kv head 0: the last query of heads 0-1 only
    inp["k"], inp["v"] = k, v
    return inp


def _adv_decode_nonfinite(dtype: torch.dtype) -> dict[str, Any]:
    """Decode (one query a sequence, 4 query heads on 2 KV heads): a NaN key element, an +inf key
    element, a -inf value element and a zero value row, each in one sequence and KV head."""
    inp = make_pack("decode_nonfinite", [(1, 6), (1, 12), (1, 9), (1, 3)], 4, 2, 64, dtype)
    k, v = inp["k"].clone(), inp["v"].clone()
    k[3, 0, 5] = float("nan")  # seq 0, KV head 0: its two query heads are NaN
    k[10, 1, 0] = float("inf")  # seq 1, KV head 1
    v[20, 0, 7] = float("-inf")  # seq 2, KV head 0
    v[28, 1] = 0.0  # seq 3, KV head 1: a zero value row (not the reference max's row)
    inp["k"], inp["v"] = k, v
    return inp


def _adv_decode_specials(dtype: torch.dtype) -> dict[str, Any]:
    """Decode with the finite special values (±0, subnormals, extremes, 1 ± 1 ulp) in the k and v rows
    of the last sequence (a non-finite one would make its one query NaN: ``_adv_decode_nonfinite``)
    and a q row of the smallest subnormals in the first (4 query heads on 1 KV head)."""
    inp = make_pack("decode_specials", [(1, 4), (1, 16)], 4, 1, 16, dtype)
    sv = special_values(dtype)
    q, k, v = inp["q"].clone(), inp["k"].clone(), inp["v"].clone()
    for j, i in enumerate((0, 1, 5, 6, 7, 8, 9, 10, 11)):
        k[4 + (j + 5) % 16, 0, (j * 3) % 16] = sv[i]
        v[4 + (j + 7) % 16, 0, (j * 5) % 16] = sv[i]
    q[0, 1] = sv[5]
    inp["q"], inp["k"], inp["v"] = q, k, v
    return inp


def _adv_specials(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """Special values (±0, ±inf, NaN, subnormals, extremes) placed in q, k and v rows."""
    inp = make_pack(f"specials_{tag}", [(12, 12)], 2, 1, 16, dtype)
    sv = special_values(dtype)
    q, k, v = inp["q"].clone(), inp["k"].clone(), inp["v"].clone()
    for i in range(sv.numel()):
        q[i, i % 2, i % 16] = sv[i]
        k[(i + 5) % 12, 0, (i * 3) % 16] = sv[i]
        v[(i + 7) % 12, 0, (i * 5) % 16] = sv[i]
    q[0, 1] = sv[5]  # a q row of smallest subnormals: tiny scores (ldexp far below 2**-126)
    k[1, 0] = sv[6]  # a k row of largest-magnitude subnormals
    v[2, 0] = sv[5]  # a V row of smallest subnormals (e_j = its binade)
    v[3, 0] = sv[8]  # a V row of the largest finite value: the numerator may overflow
    inp.update(q=q, k=k, v=v)
    return inp


def _adv_huge_scores(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """Scores that overflow fp32 (scale 2**125): +inf scores give NaN rows, -inf ones p = 0."""
    inp = make_pack(f"huge_scores_{tag}", [(5, 5), (1, 7)], 4, 2, 64, dtype)
    inp["scale"] = 2.0**125
    return inp


def _adv_noncontiguous() -> dict[str, Any]:
    """q, k, v as slices of one fused qkv projection output [T, (Hq + 2 Hkv) * D] (strided)."""
    lens = [(7, 7), (3, 3), (1, 1)]
    hq, hkv, d = 4, 2, 64
    t = sum(a for a, _ in lens)
    qkv = normal(seed_of("attention", "noncontiguous", "qkv"), (t, (hq + 2 * hkv) * d), dtype=torch.bfloat16)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(t, hkv, d)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_of([a for a, _ in lens]),
            "cu_seqlens_k": cu_of([b for _, b in lens]), "scale": None, "causal": True}


def _adv_transposed() -> dict[str, Any]:
    """q, k, v with the token axis innermost (transposed storage)."""
    inp = make_pack("transposed", [(9, 9), (2, 5)], 4, 2, 32, torch.float16)
    for name in ("q", "k", "v"):
        x = inp[name]
        inp[name] = x.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    return inp


def _adv_empty_segments() -> dict[str, Any]:
    """A pack with lq = 0 sequences (KV only, no query), between and at the ends."""
    inp = make_pack("empty_segments", [(0, 5), (3, 3), (0, 0), (1, 9), (0, 2)], 4, 2, 64, torch.bfloat16)
    return inp


def _adv_int64_explicit_scale() -> dict[str, Any]:
    """int64 cu_seqlens and an explicit, non-representable scale (rounded once to fp32)."""
    inp = make_pack("int64_scale", [(4, 4), (1, 10)], 8, 2, 128, torch.float16)
    inp["cu_seqlens_q"] = inp["cu_seqlens_q"].to(torch.int64)
    inp["cu_seqlens_k"] = inp["cu_seqlens_k"].to(torch.int64)
    inp["scale"] = 0.1
    return inp


def _adv_sink(gap: float, value: float, dtype: torch.dtype, tag: str, decode: bool = False) -> dict[str, Any]:
    """Key 0 of each sequence scores about ``gap`` nats above every other key for every query, and
    its value row is ``value`` times the others (0: a zero value vector, the case where the
    reference max is not the row max). ``decode``: one query a sequence (contexts of 20 and 40 keys)."""
    lens = [(1, 20), (1, 40)] if decode else [(20, 20), (3, 40)]
    inputs = make_pack(f"decode_sink_{gap}_{value}" if decode else f"sink_{tag}", lens, 4, 2, 32, torch.float32)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    scale = 1.0 / math.sqrt(q.shape[2])
    q[..., 0] = 2.0
    k[..., 0] = 0.0
    for start in (0, 20):
        k[start] = 0.0
        k[start, :, 0] = (gap + 3.0) / (2.0 * scale)
        v[start] = v[start] * value
    return {**inputs, "q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}


def _adv_grid_half(scale: float) -> dict[str, Any]:
    """One decode query, two keys with scores 0 and -scale (q = [1, 0], k = [0, 0] and [-1, 0], the
    explicit fp32 scale): p = exp_c(-scale) lies within a hair of a half-point of the 2**-20 grid, so
    R = RNE(p * 2**20) (in the hundreds) depends on the last bit of exp_c and of the scale, and one
    unit of R moves the fp16 output by several ulps (the zero-score key has a zero V row)."""
    f16 = torch.float16
    return {"q": torch.tensor([[[1.0, 0.0]]], dtype=f16),
            "k": torch.tensor([[[0.0, 0.0]], [[-1.0, 0.0]]], dtype=f16),
            "v": torch.tensor([[[0.0, 0.0]], [[1.5, 1.25]]], dtype=f16),
            "cu_seqlens_q": cu_of([1]), "cu_seqlens_k": cu_of([2]), "scale": scale, "causal": True}


def _adv_output_tie() -> dict[str, Any]:
    """32 keys with equal scores (p = 1, L = 2**25, the division exact) and V rows on one exponent
    whose second column sums to 2**24 + 2**16 + 1: O = 2**20 * that is a tie of the int64 -> fp32
    rounding, and after it the output 1 + 2**-8 is a tie of the bf16 cast. Both round to even."""
    v = torch.zeros((32, 1, 2), dtype=torch.float64)
    v[:, 0, 0] = 1.5  # every row's exponent is 1
    v[:16, 0, 1] = 255 / 128  # grid value 2**20 - 2**12
    v[16, 0, 1] = 0.25  # 2**17
    v[17, 0, 1] = 2.0**-19  # 1
    bf16 = torch.bfloat16
    return {"q": torch.tensor([[[1.0, -2.0]]], dtype=bf16), "k": torch.zeros((32, 1, 2), dtype=bf16),
            "v": v.to(bf16), "cu_seqlens_q": cu_of([1]), "cu_seqlens_k": cu_of([32]), "scale": None, "causal": True}


def _adv_p_rounding(scale_exp: int) -> dict[str, Any]:
    """One decode query and three keys with explicit scale 1: scores 0, -0.4700036 and -0.1335314
    (bf16 dot products ``a + b 2**-8 + c 2**-16`` found by search) give ``p = 1, 0.625, 0.875``
    exactly. V rows: key 0 sets E (value ``2**scale_exp`` in column 0); keys 1 and 2 carry a value
    38 binades lower, each in its own column, so ``R = RNE(p * 2**(40 + e_j - E)) = RNE(2.5)`` and
    ``RNE(3.5)``: a tie to even down and a tie to even up, each alone in its output column; key 3
    (key 1's score, a value 37 binades lower, column 3) gives ``R = 5``, exact on this grid and not on
    one a bit coarser.
    ``scale_exp = -91`` puts the numerators in the fp32 subnormal range (outputs bf16 subnormals)."""
    bf = torch.bfloat16
    q = torch.tensor([[[1.0, 2.0**-8, 2.0**-16, 0.0]]], dtype=bf)
    k = torch.tensor([[[0.0, 0.0, 0.0, 0.0]], [[-0.470703125, 0.1787109375, 0.09375, 0.0]],
                      [[-0.1337890625, 0.06591796875, 0.013671875, 0.0]],
                      [[-0.470703125, 0.1787109375, 0.09375, 0.0]]], dtype=bf)
    big, small, less_small = 2.0**scale_exp, 2.0 ** (scale_exp - 38), 2.0 ** (scale_exp - 37)
    v = torch.tensor([[[big, 0.0, 0.0, 0.0]], [[0.0, small, 0.0, 0.0]], [[0.0, 0.0, small, 0.0]],
                      [[0.0, 0.0, 0.0, less_small]]], dtype=torch.float64).to(bf)
    return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_of([1]), "cu_seqlens_k": cu_of([4]), "scale": 1.0,
            "causal": True}


def adversarial_cases() -> list[Case]:
    """Outlier keys, equal scores, zero and wide-range V rows, non-finite rows, specials,
    overflowing scores, length 1, odd head dims, strided inputs, empty segments and batches,
    non-causal lk = 0, paged caches with NaN in every unreferenced slot; first the designed cases
    that pin one parameter each (probabilities at grid half-points, a double tie at the output,
    subnormal values)."""
    bf16, fp16 = torch.bfloat16, torch.float16
    cases = [
        # exp_c(-7.3898249) * 2**20 = 647.49994 (one ulp of exp_c from 647.5); exp_c(-8.1574955) *
        # 2**20 = 300.50009, and 300.49982 for the next fp32 scale up
        Case("probability_at_grid_half_point_fp16", "adversarial", lambda: _adv_grid_half(7.389824867248535)),
        Case("score_scale_last_bit_fp16", "adversarial", lambda: _adv_grid_half(8.157495498657227)),
        Case("output_double_tie_bf16", "adversarial", _adv_output_tie),
        Case("subnormal_values_bf16", "adversarial",
             lambda: make_pack("subnormal_values", [(5, 5), (1, 9)], 4, 2, 64, bf16, v_std=2.0**-130)),
    ]
    for tag, dt in (("bf16", bf16), ("fp16", fp16)):
        cases += [
            Case(f"outlier_keys_{tag}", "adversarial", lambda d=dt, t=tag: _adv_outlier_keys(d, t)),
            Case(f"equal_scores_{tag}", "adversarial", lambda d=dt, t=tag: _adv_equal_scores(d, t)),
            Case(f"zero_v_rows_{tag}", "adversarial", lambda d=dt, t=tag: _adv_zero_v_rows(d, t)),
            Case(f"v_dynamic_range_{tag}", "adversarial", lambda d=dt, t=tag: _adv_v_dynamic_range(d, t)),
            Case(f"nonfinite_kv_rows_{tag}", "adversarial", lambda d=dt, t=tag: _adv_nan_k_row(d, t)),
            Case(f"specials_{tag}", "adversarial", lambda d=dt, t=tag: _adv_specials(d, t)),
            Case(f"huge_scores_{tag}", "adversarial", lambda d=dt, t=tag: _adv_huge_scores(d, t)),
        ]

    def outlier_channels() -> dict[str, Any]:
        inp = make_pack("outlier_channels", [(8, 8), (1, 30)], 4, 2, 64, bf16)
        inp["q"] = with_outlier_channels(inp["q"], seed_of("attention", "outlier_channels", "q"), 3, 30.0)
        inp["k"] = with_outlier_channels(inp["k"], seed_of("attention", "outlier_channels", "k"), 3, 30.0)
        inp["v"] = with_outlier_channels(inp["v"], seed_of("attention", "outlier_channels", "v"), 3, 1000.0)
        return inp

    cases += [
        Case("outlier_channels_bf16", "adversarial", outlier_channels),
        Case("p_grid_ties_bf16", "adversarial", lambda: _adv_p_rounding(0)),
        Case("p_grid_ties_subnormal_bf16", "adversarial", lambda: _adv_p_rounding(-91)),
        # attention sinks (v2): a zero-value sink 20 and 30 nats up, a small-value one 14 nats up
        Case("sink_gap20_zero_value_bf16", "adversarial", lambda: _adv_sink(20.0, 0.0, bf16, "g20z")),
        Case("sink_gap30_zero_value_bf16", "adversarial", lambda: _adv_sink(30.0, 0.0, bf16, "g30z")),
        Case("sink_gap10_zero_value_fp16", "adversarial", lambda: _adv_sink(10.0, 0.0, fp16, "g10z")),
        Case("sink_gap14_small_value_bf16", "adversarial", lambda: _adv_sink(14.0, 1e-3, bf16, "g14s")),
        Case("sink_gap70_zero_value_bf16", "adversarial", lambda: _adv_sink(70.0, 0.0, bf16, "g70z")),
        Case("sink_gap90_zero_value_bf16", "adversarial", lambda: _adv_sink(90.0, 0.0, bf16, "g90z")),
        Case("paged_sink_gap20_zero_value_bf16_bs8", "adversarial",
             lambda: to_paged(_adv_sink(20.0, 0.0, bf16, "pg20z"), 8, "pg20z"), op="attention_paged"),
        Case("length1_bf16", "adversarial", lambda: make_pack("length1", [(1, 1)], 4, 2, 64, bf16)),
        Case("length1_pack_fp16", "adversarial",
             lambda: make_pack("length1_pack", [(1, 1), (1, 1), (1, 1)], 8, 2, 128, fp16)),
        Case("head_dim_odd_bf16", "adversarial", lambda: make_pack("head_dim_odd", [(5, 5), (1, 3)], 3, 1, 17, bf16)),
        Case("mha_hkv_eq_hq_fp16", "adversarial", lambda: make_pack("mha", [(6, 6), (2, 10)], 4, 4, 8, fp16)),
        Case("noncontiguous_qkv_bf16", "adversarial", _adv_noncontiguous),
        Case("transposed_fp16", "adversarial", _adv_transposed),
        Case("empty_segments_bf16", "adversarial", _adv_empty_segments),
        Case("empty_batch_bf16", "adversarial",
             lambda: make_pack("empty_batch", [], 4, 2, 64, bf16)),
        Case("noncausal_lk0_bf16", "adversarial",
             lambda: {**make_pack("noncausal_lk0", [(2, 0), (3, 4)], 4, 2, 64, bf16), "causal": False}),
        Case("int64_cu_explicit_scale_fp16", "adversarial", _adv_int64_explicit_scale),
        Case("tiny_values_bf16", "adversarial",
             lambda: make_pack("tiny_values", [(5, 5), (1, 9)], 4, 2, 64, bf16, q_std=2.0**-60, k_std=2.0**-60,
                               v_std=2.0**-100)),
        Case("large_values_fp16", "adversarial",
             lambda: make_pack("large_values", [(5, 5), (1, 9)], 4, 2, 64, fp16, q_std=8.0, k_std=8.0,
                               v_std=1.0e4)),
        Case("paged_nonfinite_bf16_bs4", "adversarial",
             lambda: to_paged(_adv_nan_k_row(bf16, "paged"), 4, "paged_nonfinite"), op="attention_paged"),
        Case("paged_fill_inf_fp16_bs5", "adversarial",
             lambda: to_paged(make_pack("paged_inf", [(3, 11), (1, 5)], 4, 2, 64, fp16), 5, "paged_inf",
                              fill=float("inf")), op="attention_paged"),
        # decode through the cache (one query token a sequence, 2 and 4 query heads a KV head): the
        # blocks backends run on their decode kernels, with the specials of the cases above
        Case("paged_decode_nonfinite_bf16_bs4", "adversarial",
             lambda: to_paged(_adv_decode_nonfinite(bf16), 4, "paged_decode_nonfinite"), op="attention_paged"),
        Case("paged_decode_specials_fp16_bs8", "adversarial",
             lambda: to_paged(_adv_decode_specials(fp16), 8, "paged_decode_specials"), op="attention_paged"),
        Case("paged_decode_sink_gap20_zero_value_bf16_bs16", "adversarial",
             lambda: to_paged(_adv_sink(20.0, 0.0, bf16, "", decode=True), 16, "pdg20z"), op="attention_paged"),
        Case("paged_decode_sink_gap70_zero_value_bf16_bs16", "adversarial",
             lambda: to_paged(_adv_sink(70.0, 0.0, bf16, "", decode=True), 16, "pdg70z"), op="attention_paged"),
        Case("paged_decode_large_values_fp16_bs16", "adversarial",
             lambda: to_paged(make_pack("pd_large", [(1, 9), (1, 33)], 8, 2, 128, fp16, q_std=8.0, k_std=8.0,
                                        v_std=1.0e4), 16, "pd_large"), op="attention_paged"),
        Case("paged_decode_tiny_values_bf16_bs16", "adversarial",
             lambda: to_paged(make_pack("pd_tiny", [(1, 5), (1, 40)], 4, 2, 64, bf16, q_std=2.0**-60, k_std=2.0**-60,
                                        v_std=2.0**-100), 16, "pd_tiny"), op="attention_paged"),
        Case("paged_empty_seqs_bf16_bs16", "adversarial",
             lambda: to_paged(make_pack("paged_empty", [(0, 0), (2, 2), (0, 17)], 4, 2, 64, bf16), 16,
                              "paged_empty"), op="attention_paged"),
    ]
    return cases


# --------------------------------------------------------------------------- invariance cases


def _split_rows(out: torch.Tensor, cu: torch.Tensor) -> list[torch.Tensor]:
    c = [int(x) for x in cu.tolist()]
    return [out[c[i]: c[i + 1]] for i in range(len(c) - 1)]


def _seq(tag: str, lq: int, lk: int, hq: int = 8, hkv: int = 2, d: int = 64,
         dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q [lq, Hq, D], k [lk, Hkv, D], v [lk, Hkv, D]) of one sequence."""
    p = make_pack(tag, [(lq, lk)], hq, hkv, d, dtype)
    return p["q"], p["k"], p["v"]


def _pack_seqs(seqs: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    return {"q": torch.cat([s[0] for s in seqs]), "k": torch.cat([s[1] for s in seqs]),
            "v": torch.cat([s[2] for s in seqs]), "cu_seqlens_q": cu_of([s[0].shape[0] for s in seqs]),
            "cu_seqlens_k": cu_of([s[1].shape[0] for s in seqs]), "scale": None, "causal": True}


def invariance_cases() -> list[InvarianceCase]:
    """Packing, permutation, chunked prefill, prefill + decode, paging/KV split, repeat."""

    def batch(run: Any) -> tuple[Any, Any]:
        target = _seq("inv_batch_target", 21, 30)
        others = [_seq(f"inv_batch_other{i}", lq, lk) for i, (lq, lk) in enumerate([(1, 300), (40, 40), (3, 9),
                                                                                    (0, 6), (1, 1)])]
        alone = run("attention", **_pack_seqs([target]))
        expected, actual = [], []
        for pos, mates in ((0, others[:2]), (1, others[2:3]), (2, others[1:5]), (4, others[:4])):
            seqs = list(mates)
            seqs.insert(pos, target)
            pack = _pack_seqs(seqs)
            out = run("attention", **pack)
            expected.append(alone)
            actual.append(_split_rows(out, pack["cu_seqlens_q"])[pos])
        return expected, actual

    def permutation(run: Any) -> tuple[Any, Any]:
        seqs = [_seq(f"inv_perm{i}", lq, lk) for i, (lq, lk) in enumerate([(4, 4), (1, 50), (9, 20), (0, 3),
                                                                          (2, 2)])]
        perm = [3, 0, 4, 2, 1]
        base = _pack_seqs(seqs)
        rows = _split_rows(run("attention", **base), base["cu_seqlens_q"])
        permuted = _pack_seqs([seqs[i] for i in perm])
        got = _split_rows(run("attention", **permuted), permuted["cu_seqlens_q"])
        return [rows[i] for i in perm], got

    def chunking(run: Any) -> tuple[Any, Any]:
        q, k, v = _seq("inv_chunk", 37, 37)
        whole = run("attention", q=q, k=k, v=v, cu_seqlens_q=cu_of([37]), cu_seqlens_k=cu_of([37]))
        expected, actual = [], []
        for chunk in (1, 5, 16):
            parts = []
            for c0 in range(0, 37, chunk):
                c1 = min(c0 + chunk, 37)
                parts.append(run("attention", q=q[c0:c1], k=k[:c1], v=v[:c1], cu_seqlens_q=cu_of([c1 - c0]),
                                 cu_seqlens_k=cu_of([c1])))
            expected.append(whole)
            actual.append(torch.cat(parts))
        # two sequences chunked together in one pack (continuous batching of prefills)
        q2, k2, v2 = _seq("inv_chunk_b", 20, 20)
        whole2 = run("attention", **_pack_seqs([(q, k, v), (q2, k2, v2)]))
        parts_a, parts_b = [], []
        for c0 in range(0, 37, 8):
            a1, b0, b1 = min(c0 + 8, 37), min(c0, 20), min(c0 + 8, 20)
            out = run("attention", **_pack_seqs([(q[c0:a1], k[:a1], v[:a1]), (q2[b0:b1], k2[:b1], v2[:b1])]))
            parts_a.append(out[: a1 - c0])
            parts_b.append(out[a1 - c0:])
        expected.append(whole2)
        actual.append(torch.cat(parts_a + parts_b))
        return expected, actual

    def prefill_decode(run: Any) -> tuple[Any, Any]:
        lens, prompts = [30, 3, 12], [20, 1, 12]
        seqs = [_seq(f"inv_pd{i}", n, n) for i, n in enumerate(lens)]
        full = _pack_seqs(seqs)
        whole = _split_rows(run("attention", **full), full["cu_seqlens_q"])
        pre = _pack_seqs([(s[0][:p], s[1][:p], s[2][:p]) for s, p in zip(seqs, prompts)])
        pre_rows = _split_rows(run("attention", **pre), pre["cu_seqlens_q"])
        steps: list[list[torch.Tensor]] = [[] for _ in seqs]
        for t in range(max(n - p for n, p in zip(lens, prompts))):
            live = [b for b in range(len(seqs)) if prompts[b] + t < lens[b]]  # requests leave the batch
            pos = [prompts[b] + t for b in live]
            step = _pack_seqs([(seqs[b][0][p: p + 1], seqs[b][1][: p + 1], seqs[b][2][: p + 1])
                               for b, p in zip(live, pos)])
            out = run("attention", **step)
            for i, b in enumerate(live):
                steps[b].append(out[i: i + 1])
        actual = [torch.cat([pre_rows[b], *steps[b]]) for b in range(len(seqs))]
        return whole, actual

    def kv_split(run: Any) -> tuple[Any, Any]:
        inp = make_pack("inv_kv_split", [(1, 130), (6, 70), (1, 1), (12, 12)], 8, 2, 64, torch.bfloat16)
        contiguous = run("attention", **inp)
        expected, actual = [], []
        for bs in (1, 16, 64):
            expected.append(contiguous)
            actual.append(run("attention_paged", **to_paged(inp, bs, f"inv_kv_split_{bs}")))
        return expected, actual

    def repeat(run: Any) -> tuple[Any, Any]:
        inp = make_pack("inv_repeat", [(16, 16), (1, 100), (3, 8)], 8, 2, 64, torch.float16)
        first = run("attention", **inp)
        return [first, first], [run("attention", **inp) for _ in range(2)]

    return [
        InvarianceCase("sequence_in_packs", "batch", batch),
        InvarianceCase("permuted_sequences", "permutation", permutation),
        InvarianceCase("chunked_prefill_1_5_16", "chunking", chunking),
        InvarianceCase("prefill_then_decode", "prefill_decode", prefill_decode),
        InvarianceCase("paged_block_sizes_1_16_64", "kv_split", kv_split),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def _sdpa_varlen_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """Native baseline for one packed sequence: SDPA (is_causal, enable_gqa) on [1, H, T, D] views."""
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        is_causal=causal, scale=scale, enable_gqa=True)
    return out.squeeze(0).transpose(0, 1)


def _sdpa_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                       seq_lens_k: torch.Tensor, cu_seqlens_q: torch.Tensor, scale: float | None = None,
                       causal: bool = True) -> torch.Tensor:
    """Native baseline for decode: SDPA on the contiguous cache (the bench lays the blocks of
    sequence b out in order, so ``k_cache.view(B, ctx, Hkv, D)`` is that cache, no copy)."""
    b = q.shape[0]
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    k = k_cache.view(b, -1, hkv, d).transpose(1, 2)
    v = v_cache.view(b, -1, hkv, d).transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, scale=scale, enable_gqa=True)
    return out.squeeze(2)


def bench_cases() -> list[BenchCase]:
    """Attention in bf16 with head_dim 128 and 8 KV heads, paged decode (block 16) and causal prefill.

    large: Qwen3-8B (32 q heads), decode at batch 8/64 and context 1024/4096/8192, batch 256 at
    context 4096 and batch 8 at context 32768, Qwen3-0.6B (16 q heads) at batch 256 and context 128
    (a decode step of the end-to-end rollout), prefill of 2048 and 8192 tokens. small: Qwen3-0.6B
    (16 q heads), decode at batch 1 (context 512) and 4 (context 128), prefill of 64 tokens.
    """
    hkv, d, bs = 8, 128, 16
    decode = [("qwen3_8b", 32, "large", batch, ctx) for batch in (8, 64) for ctx in (1024, 4096, 8192)]
    decode += [("qwen3_8b", 32, "large", 256, 4096), ("qwen3_8b", 32, "large", 8, 32768)]
    decode += [("qwen3_0.6b", 16, "small", 1, 512), ("qwen3_0.6b", 16, "small", 4, 128)]
    # a decode step of tools/e2e_bench.py's rollout (256 sequences, 64-token prompts, 64 new tokens)
    decode += [("qwen3_0.6b", 16, "large", 256, 128)]
    prefill = [("qwen3_8b", 32, "large", 2048), ("qwen3_8b", 32, "large", 8192), ("qwen3_0.6b", 16, "small", 64)]
    cases = []
    for model, hq, size, batch, ctx in decode:

        def make(device: torch.device, b: int = batch, n: int = ctx, hq: int = hq) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(b * 100003 + n)
            blocks = b * n // bs
            q = torch.randn(b, hq, d, generator=g, device=device).to(torch.bfloat16)
            kc = torch.randn(blocks, bs, hkv, d, generator=g, device=device).to(torch.bfloat16)
            vc = torch.randn(blocks, bs, hkv, d, generator=g, device=device).to(torch.bfloat16)
            table = torch.arange(blocks, device=device, dtype=torch.int32).view(b, n // bs)
            lens = torch.full((b,), n, device=device, dtype=torch.int32)
            cu = torch.arange(b + 1, device=device, dtype=torch.int32)
            return {"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "seq_lens_k": lens,
                    "cu_seqlens_q": cu, "scale": None, "causal": True}

        cases.append(BenchCase(
            name=f"{model}_decode_B{batch}_ctx{ctx}_bs{bs}_bf16",
            make=make,
            native=_sdpa_paged_decode,
            flops=4.0 * batch * ctx * hq * d,  # QK^T and PV, 2 flops per multiply-add
            bytes=2.0 * (2 * batch * ctx * hkv * d + 2 * batch * hq * d),  # read K, V, q; write out
            op="attention_paged",
            sizes=(size,),
            graph=True,
        ))
    for model, hq, size, tokens in prefill:

        def make_prefill(device: torch.device, t: int = tokens, hq: int = hq) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(t)
            q = torch.randn(t, hq, d, generator=g, device=device).to(torch.bfloat16)
            k = torch.randn(t, hkv, d, generator=g, device=device).to(torch.bfloat16)
            v = torch.randn(t, hkv, d, generator=g, device=device).to(torch.bfloat16)
            cu = torch.tensor([0, t], device=device, dtype=torch.int32)
            return {"q": q, "k": k, "v": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "scale": None, "causal": True}

        cases.append(BenchCase(
            name=f"{model}_prefill_T{tokens}_causal_bf16",
            make=make_prefill,
            native=_sdpa_varlen_prefill,
            flops=4.0 * tokens * tokens * hq * d / 2,  # causal: half of the score and PV products
            bytes=2.0 * (2 * tokens * hq * d + 2 * tokens * hkv * d),  # read q, K, V; write out
            sizes=(size,),
        ))
    return cases
