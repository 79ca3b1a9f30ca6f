"""Contract ``attention_backward``: the gradients of ``attention`` (v2) in q, k and v, bit-exact.

``dq, dk, dv = attention_backward(grad_out, q, k, v, out, cu_seqlens_q, cu_seqlens_k, scale, causal)``
for packed (varlen) sequences, grouped-query heads and the bottom-right causal mask of the
forward. The construction is FlashAttention-2's backward with every step pinned:

1. the forward's probabilities are recomputed exactly as ``attention`` v2 builds them (scores,
   reference max, ``p = exp_c(s - ref)``, the integers ``P`` on the 2**-40 grid and their sum
   ``L``), and normalised by the forward's denominator: ``pn = RN32(p ÷ RN32(L 2**(e_l - 40)))``;
2. ``D_i = dO_i . O_i`` and ``dP_ij = dO_i . V_j`` are exact digit products (linear v2's grids:
   dO rows on 28 bits, O and V rows on 21 bits), each rounded once to fp32;
3. ``dS_ij = RN32(pn_ij * RN32(dP_ij - D_i))``, rounded to the input dtype (as FlashAttention
   keeps it in bf16/fp16), and ``pn`` rounded to the input dtype;
4. ``dQ = scale dS K``, ``dK = scale dS^T Q`` (over every query head of the KV head and every
   query, one exact sum) and ``dV = pn^T dO`` (likewise) are exact digit products (the
   dS / pn operand on 28-bit grids, the K / Q / dO operand per feature on 21-bit grids), each
   rounded once, straight to the input dtype, the scale inside that one rounding.

Every reduction is an exact integer sum, so the bits do not depend on the other sequences of the
pack, their order, the split of the heads over tensor-parallel ranks (whole KV groups), the
backend, or repeats. ``out`` is the forward's output as given (saved by autograd), not recomputed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.digits import digit_matmul, int_matmul, nonfinite_rows, row_exponent, to_grid
from rlkernel.contracts._exact.fixed import quantize
from rlkernel.contracts._exact.fp32 import expo, int2_to_float, int_to_float, max_r5, round_to
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import integers, normal, seed_of, special_values, with_outlier_channels
from rlkernel.contracts.attention import MAX_GAP, P_BITS, cu_of, resolve_scale
from rlkernel.contracts.attention import make_pack as _forward_pack
from rlkernel.contracts.attention import reference as attention_reference

#: Magnitude bits of the "activation" operand grids (linear v2's x rows): dO in D and dP, the
#: dS / pn rows in the gradient products. ``|X| <= 2**27``.
X_BITS = 27
#: Magnitude bits of the other operand (linear v2's weight rows): O and V rows in D and dP, the
#: feature columns of K, Q and dO in the gradient products. ``|W| <= 2**20``.
W_BITS = 20
#: Longest reduction of one product: ``|C| <= n * 2**47 < 2**63``. Keys of a sequence for dQ,
#: (query heads per KV head) x (queries of a sequence) for dK and dV.
MAX_REDUCTION = (1 << 16) - 1
#: ``C = C_hi * 2**SCALE_SPLIT + C_lo`` when the scale's 24-bit significand multiplies C exactly.
SCALE_SPLIT = 32

CONTRACT = Contract(
    name="attention_backward",
    version=1,
    summary=("dQ = RN(scale dS K), dK = RN(scale sum_heads dS^T Q), dV = RN(sum_heads pn^T dO), "
             "dS = RN32(pn RN32(dP - D)) -> dtype, dP = RN32(dO.V), D = RN32(dO.O), pn = p / l of attention v2; "
             "every product an exact digit sum rounded once"),
    invariances=("batch", "permutation", "tp_degree", "repeat"),
    dtypes={
        "grad_out": (torch.bfloat16, torch.float16),
        "q": (torch.bfloat16, torch.float16),
        "k": (torch.bfloat16, torch.float16),
        "v": (torch.bfloat16, torch.float16),
        "out": (torch.bfloat16, torch.float16),
        "cu_seqlens_q": (torch.int32, torch.int64),
        "cu_seqlens_k": (torch.int32, torch.int64),
    },
    parameters={
        "forward_scores": "s = RN32(y * scale_f), y the attention v2 score (q and k rows on 21-bit grids, the exact "
                          "integer dot rounded once to fp32 and scaled by 2**(e_q + e_k - 40)); scale_f = RN32(scale) "
                          "or the correctly rounded RN32(1/sqrt(D))",
        "causal_mask": "bottom-right causal as in attention: query i (0-based in its segment) sees keys 0 .. lk - lq + "
                       "i; pairs outside the mask (and keys of other sequences) contribute exact zeros",
        "reference_max": "ref = max(c, RN32(m - 64)) of attention v2 (c: max score over allowed keys with a non-zero "
                         "V row)",
        "exp_c": "p = exp_c(RN32(s - ref)): the contract exp of attention v2",
        "p_bits": "P = RNE(p * 2**(40 - e_l)), e_l = expo(exp_c(RN32(m - ref))); L = sum_j P (exact int64): the "
                  "integers of attention v2's denominator",
        "p_rounding": "P is placed on its grid to nearest, ties to even",
        "normalisation": "pn = RN32(p ÷ l): p the fp32 exp_c value, l = RN32(L * 2**(e_l - 40)) the forward's "
                         "denominator (the exact integer rounded once, P3'); one IEEE fp32 division",
        "do_grid_bits": "dO rows (over D) on 28-bit grids RNE(dO * 2**(27 - e)) in D and dP (X_BITS = 27)",
        "ov_grid_bits": "O rows and V rows (over D) on 21-bit grids RNE(x * 2**(20 - e)) in D and dP (W_BITS = 20)",
        "row_products": "D_i = RN32(sum_d dO_id O_id) and dP_ij = RN32(sum_d dO_id V_jd) on those grids: exact "
                        "integers rounded once to fp32 (P3')",
        "ds_formula": "dS = RN32(pn * RN32(dP - D)): one fp32 subtraction, one fp32 multiplication",
        "ds_cast": "dS -> q.dtype to nearest, ties to even (kept subnormals) before the dQ and dK products",
        "p_cast": "pn -> q.dtype to nearest, ties to even before the dV product",
        "grad_x_bits": "the dS / pn operand on 28-bit grids (X_BITS): a row per query over the keys for dQ, a row per "
                       "key over (query head, query) of the KV group for dK and dV",
        "grad_w_bits": "the K, Q, dO operand per feature column on 21-bit grids (W_BITS): K over the sequence's keys, "
                       "Q and dO over (query head, query) of the KV group",
        "grid_rounding": "placing a value on its grid rounds to nearest, ties to even",
        "row_exponent": "every grid's exponent is expo(max finite |x|) of its row or column (P1); 0 if all zero",
        "gqa_sum": "dK and dV of a KV head: ONE exact sum over all its query heads and queries (not head by head)",
        "scale_rounding": "dQ = RN_dtype(scale_f * C * 2**(ex + ew - 47)) and likewise dK: the scale's significand "
                          "multiplies C exactly, then one rounding straight to q.dtype",
        "output_rounding": "dQ, dK, dV: the exact value rounded once, to nearest, ties to even, straight to q.dtype "
                           "(P3': subnormals kept, overflow to +-inf)",
        "nonfinite_rule": "a row (query, head) is bad when the forward's row is NaN (NaN/inf in q or an allowed k, an "
                          "allowed non-finite V row, +inf scores, no allowed key) or its dO or out row holds NaN/inf; "
                          "its allowed dS and pn are NaN; dQ row i is NaN when row i is bad or one of its dS is "
                          "non-finite after the cast, dK/dV row j when a dS/pn of key j is; other non-finite entries "
                          "of K, Q, dO read as 0 on their grids",
    },
)


# --------------------------------------------------------------------------- helpers


def scale_parts(scale_f: float) -> tuple[int, int]:
    """``scale_f = M * 2**ks`` with M a signed integer below 2**24 in magnitude (exact)."""
    if scale_f == 0:
        return 0, 0
    mant, e = math.frexp(scale_f)
    return int(mant * (1 << 24)), e - 24


def _product(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype,
             scale: tuple[int, int] | None = None) -> torch.Tensor:
    """``RN_out(scale * x @ w.T)`` by linear v2's grids: x rows 28 bits, w rows 21 bits, exact C, one rounding.

    x [M, K], w [N, K] (bf16/fp16). Non-finite entries read as 0; rows of x holding NaN/inf give
    NaN output rows (the NaN rule of the gradient products; w's are covered by x's, see the module).
    """
    ex, ew = row_exponent(x), row_exponent(w)
    c = int_matmul(to_grid(x, ex, X_BITS), to_grid(w, ew, W_BITS))
    k = ex.unsqueeze(1) + ew.unsqueeze(0) - X_BITS - W_BITS
    if scale is None:
        y = int_to_float(c, k, out_dtype)
    else:
        m, ks = scale
        c_hi, c_lo = c >> SCALE_SPLIT, c & ((1 << SCALE_SPLIT) - 1)
        y = int2_to_float(c_hi * m, c_lo * m, SCALE_SPLIT, k + ks, out_dtype)
    return torch.where(nonfinite_rows(x).unsqueeze(1), torch.full_like(y, float("nan")), y)


def _row_dot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``RN32(sum_d X_id W_id)`` per row: x [M, D] on 28-bit, w [M, D] on 21-bit grids; fp32 [M]."""
    ex, ew = row_exponent(x), row_exponent(w)
    c = (to_grid(x, ex, X_BITS) * to_grid(w, ew, W_BITS)).sum(dim=-1)  # exact: |C| <= D 2**47
    return int_to_float(c, ex + ew - X_BITS - W_BITS, torch.float32)


def _probabilities(s: torch.Tensor, allowed: torch.Tensor, vzero: torch.Tensor,
                   vbad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """attention v2's probabilities of one head, normalised: (pn fp32 [lq, lk], bad rows [lq])."""
    lq, lk = s.shape
    if lk == 0:
        return torch.zeros((lq, 0), dtype=torch.float32), torch.ones(lq, dtype=torch.bool)
    neg_inf = torch.full_like(s, float("-inf"))
    m = max_r5(torch.where(allowed, s, neg_inf), dim=1)
    contrib = allowed & ~vzero.unsqueeze(0)
    c = max_r5(torch.where(contrib, s, neg_inf), dim=1)
    ref = torch.maximum(c, m - MAX_GAP)
    p = exp_c(s - ref.unsqueeze(1))
    p = torch.where(allowed, p, torch.zeros_like(p))
    bad = (torch.isnan(p) & allowed).any(dim=1) | (vbad.unsqueeze(0) & allowed).any(dim=1)
    p = torch.where(torch.isnan(p), torch.zeros_like(p), p)
    top = exp_c(m - ref)
    e_l = torch.where(torch.isfinite(top), expo(torch.where(torch.isfinite(top), top, torch.ones_like(top))),
                      torch.ones_like(m, dtype=torch.int64))
    total = quantize(p, e_l.unsqueeze(1).expand(lq, lk), P_BITS).sum(dim=1)  # the forward's L
    den = int_to_float(total, e_l - P_BITS, torch.float32)  # the forward's denominator, RN32(L 2**(e_l - 40))
    return p / den.unsqueeze(1), bad  # IEEE fp32 division


def check_bounds(op: str, q_lens: Sequence[int], k_lens: Sequence[int], group: int) -> None:
    """The exact-sum bounds of the gradient products (int64: ``n * 2**47 < 2**63``)."""
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
        if lq and lk > MAX_REDUCTION:
            raise ValueError(f"{op}: sequence {b} has {lk} keys; dQ sums over them exactly in int64, which allows at "
                             f"most {MAX_REDUCTION} (2**16 - 1)")
        if group * lq > MAX_REDUCTION:
            raise ValueError(f"{op}: sequence {b} has {lq} queries x {group} query heads per KV head = {group * lq} "
                             f"terms in each dK/dV sum; the exact int64 sum allows at most {MAX_REDUCTION} (2**16 - 1)")


# --------------------------------------------------------------------------- reference


def reference(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
              cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
              causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of ``attention`` in q, k and v (the definition of ``attention_backward``'s bits).

    ``dV = p^T dO``, ``dS = p * (dO V^T - rowsum(dO * O))``, ``dQ = scale dS K``, ``dK = scale dS^T Q``

    Parameters
    ----------
    grad_out : Tensor, q's dtype, [Tq, Hq, D]
        Gradient of the loss with respect to ``out``.
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
    k : Tensor, q's dtype, [Tk, Hkv, D]
    v : Tensor, q's dtype, [Tk, Hkv, D]
    out : Tensor, q's dtype, [Tq, Hq, D]
        The forward's output (``attention(q, k, v, ...)``), used as given.
    cu_seqlens_q, cu_seqlens_k : Tensor, int32/int64, [B + 1]
        As in ``attention``.
    scale : float, optional
        As in ``attention``: ``RN32(scale)``, default ``RN32(1 / sqrt(D))`` correctly rounded.
    causal : bool
        Bottom-right aligned causal mask (default), as in ``attention``.

    Returns
    -------
    dq : Tensor, q's dtype, [Tq, Hq, D]
    dk : Tensor, q's dtype, [Tk, Hkv, D]
    dv : Tensor, q's dtype, [Tk, Hkv, D]

    Bitwise semantics
    -----------------
    Per sequence b and KV head g (query heads ``h`` with ``h // (Hq // Hkv) = g``), for allowed
    pairs (i, j) (the forward's mask); every fp32 operation one IEEE round-to-nearest-even:

    1. ``s_ij``, ``m_i``, ``ref_i``, ``p_ij = exp_c(RN32(s_ij - ref_i))`` and ``e_l`` exactly as
       ``attention`` v2; ``L_i = sum_j RNE(p_ij 2**(40 - e_l))`` (the forward's denominator
       integer) and ``l_i = RN32(L_i 2**(e_l - 40))``; ``pn_ij = RN32(p_ij ÷ l_i)``. (``p_ij`` itself,
       not its 2**-40 grid value: behind an attention sink 30 nats up, the grid keeps no bit of the
       other keys' p, and dK lost 70 % of its norm; the forward's numerator keeps them too.)
    2. ``D_i = RN32(sum_d Xo_id Wo_id 2**(e_do + e_o - 47))`` with ``Xo = RNE(dO_i 2**(27 - e_do))``
       (28-bit grid of the dO row) and ``Wo = RNE(O_i 2**(20 - e_o))`` (21-bit grid of the out row);
       ``dP_ij = RN32(sum_d Xo_id Vint_jd 2**(e_do + e_j - 47))`` (``Vint`` the forward's 21-bit V grid).
    3. ``dS_ij = RN32(pn_ij * RN32(dP_ij - D_i))``; ``dSr = RN_dtype(dS)``, ``pr = RN_dtype(pn)``.
       Pairs outside the mask: ``dSr = pr = +0`` exactly.
    4. Gradient products, each ``RN_dtype(f * C * 2**(ex + ew - 47))`` with ``C`` the exact integer
       sum of products of a 28-bit grid (the x operand, per row) and a 21-bit grid (the w
       operand, per row), rounded once straight to the dtype (P3'); ``f = scale_f`` for dQ and
       dK (its 24-bit significand multiplies ``C`` exactly, inside the one rounding), 1 for dV:

       - ``dQ_i`` (head h): x = row i of ``dSr`` (over the sequence's lk keys), w = the feature
         columns of K (over the same keys): reduction over keys.
       - ``dK_j`` (KV head g): x = key j's ``dSr`` over all ``(h, i)`` of the group (G * lq
         terms), w = the feature columns of Q over the same ``(h, i)``: one exact sum over heads
         and queries.
       - ``dV_j``: x = key j's ``pr`` over ``(h, i)``, w = the feature columns of dO over ``(h, i)``.

    Special values: row (i, h) is *bad* when the forward's output row is NaN (q row or an
    allowed k row non-finite, an allowed V row non-finite, scores at +inf, no allowed key) or its
    dO or out row holds NaN/inf. Its allowed ``dS`` and ``pn`` are NaN. A gradient row is NaN
    (canonical) when its x operand row holds a non-finite value (dQ row i: also when row i is
    bad); non-finite entries of the w operand read as 0 (a NaN in Q, K or dO makes its own rows
    bad, which already reaches every gradient it would touch). Keys of a sequence without
    queries get +0 gradients. Overflow in the final rounding gives +-inf.

    Bounds: ``lk <= 2**16 - 1`` and ``(Hq / Hkv) * lq <= 2**16 - 1`` per sequence (ValueError).

    Invariances: batch (a sequence alone or anywhere in a pack), permutation of the sequences,
    tp_degree (computing any subset of whole KV groups gives their bits), repeat.

    Contract ``attention_backward`` version 1.
    """
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    dtype = q.dtype
    scale_v = resolve_scale(scale, d)
    scale_f = torch.tensor(scale_v, dtype=torch.float32)
    parts = scale_parts(scale_v)
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    q_lens = [cq[i + 1] - cq[i] for i in range(len(cq) - 1)]
    k_lens = [ck[i + 1] - ck[i] for i in range(len(ck) - 1)]
    check_bounds("attention_backward", q_lens, k_lens, group)
    dq = torch.zeros((tq, hq, d), dtype=dtype)
    dk = torch.zeros((tk, hkv, d), dtype=dtype)
    dv = torch.zeros((tk, hkv, d), dtype=dtype)
    vzero = torch.where(torch.isfinite(v), v, torch.zeros_like(v)).abs().amax(dim=-1) == 0
    vbad = nonfinite_rows(v)
    for b in range(len(q_lens)):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        lq, lk = q_lens[b], k_lens[b]
        if lq == 0:
            continue
        if causal and lk < lq:
            raise ValueError(f"attention_backward: causal sequence {b} has {lq} queries but only {lk} keys")
        i = torch.arange(lq).unsqueeze(1)
        j = torch.arange(lk).unsqueeze(0)
        allowed = j <= lk - lq + i if causal else torch.ones((lq, lk), dtype=torch.bool)
        for g in range(hkv):
            kk, vv = k[k0:k1, g], v[k0:k1, g]
            ds_rows, p_rows, q_rows, do_rows = [], [], [], []
            for h in range(g * group, (g + 1) * group):
                s = digit_matmul(q[q0:q1, h], kk) * scale_f if lk else torch.zeros((lq, 0))
                pn, bad = _probabilities(s, allowed, vzero[k0:k1, g], vbad[k0:k1, g])
                do, o = grad_out[q0:q1, h], out[q0:q1, h]
                bad = bad | nonfinite_rows(do) | nonfinite_rows(o)
                dp = _product(do, vv, torch.float32) if lk else torch.zeros((lq, 0))
                ds = pn * (dp - _row_dot(do, o).unsqueeze(1))  # RN32(pn * RN32(dP - D))
                nan = torch.full_like(ds, float("nan"))
                ds = torch.where(allowed, torch.where(bad.unsqueeze(1), nan, ds), torch.zeros_like(ds))
                pr = torch.where(allowed, torch.where(bad.unsqueeze(1), nan, pn), torch.zeros_like(pn))
                dsr, prr = round_to(ds, dtype), round_to(pr, dtype)
                gq = _product(dsr, kk.T, dtype, parts)
                dq[q0:q1, h] = torch.where(bad.unsqueeze(1), torch.full_like(gq, float("nan")), gq)
                ds_rows.append(dsr)
                p_rows.append(prr)
                q_rows.append(q[q0:q1, h])
                do_rows.append(do)
            if lk == 0:
                continue
            # one exact sum over (query head, query) of the group: rows [G * lq]
            x_ds, x_p = torch.cat(ds_rows).T, torch.cat(p_rows).T  # [lk, G * lq]
            dk[k0:k1, g] = _product(x_ds, torch.cat(q_rows).T, dtype, parts)
            dv[k0:k1, g] = _product(x_p, torch.cat(do_rows).T, dtype)
    return round_to(dq, dtype), round_to(dk, dtype), round_to(dv, dtype)


# --------------------------------------------------------------------------- input builders


def with_grads(inp: dict[str, Any], tag: str, go_std: float = 1.0) -> dict[str, Any]:
    """Forward inputs plus ``out`` (the attention v2 reference on them) and a deterministic ``grad_out``."""
    q = inp["q"]
    out = attention_reference(inp["q"], inp["k"], inp["v"], inp["cu_seqlens_q"], inp["cu_seqlens_k"],
                              scale=inp.get("scale"), causal=inp.get("causal", True))
    grad_out = normal(seed_of("attention_backward", tag, "grad_out"), tuple(q.shape), std=go_std, dtype=q.dtype)
    return {"grad_out": grad_out, "q": inp["q"], "k": inp["k"], "v": inp["v"], "out": out,
            "cu_seqlens_q": inp["cu_seqlens_q"], "cu_seqlens_k": inp["cu_seqlens_k"],
            "scale": inp.get("scale"), "causal": inp.get("causal", True)}


def make_case(tag: str, lens: Sequence[tuple[int, int]], hq: int, hkv: int, d: int, dtype: torch.dtype,
              causal: bool = True, **kw: Any) -> dict[str, Any]:
    """Deterministic inputs of sequences ``(lq, lk)`` (forward data of ``attention``'s generator); built
    once per argument set (the forward pass is the costly part), fresh copies on every call."""
    made = _make_case_once(tag, tuple(tuple(x) for x in lens), hq, hkv, d, dtype, causal, tuple(sorted(kw.items())))
    return {key: _copy(value) for key, value in made.items()}


@functools.cache
def _make_case_once(tag: str, lens: tuple[tuple[int, int], ...], hq: int, hkv: int, d: int, dtype: torch.dtype,
                    causal: bool, kw: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return with_grads({**_forward_pack(f"bwd_{tag}", list(lens), hq, hkv, d, dtype, **dict(kw)), "causal": causal},
                      tag)


# --------------------------------------------------------------------------- golden cases


def golden_cases() -> list[Case]:
    """GQA prefill (bf16, fp16), chunked prefill, decode rows, non-causal, MHA, explicit scale."""
    bf16, fp16 = torch.bfloat16, torch.float16
    specs: list[tuple[str, list[tuple[int, int]], int, int, int, torch.dtype, bool]] = [
        ("prefill_h4_2_d64_bf16", [(5, 5), (17, 17), (24, 24)], 4, 2, 64, bf16, True),
        ("prefill_h8_2_d128_fp16", [(9, 9), (20, 20)], 8, 2, 128, fp16, True),
        ("chunked_h4_2_d64_bf16", [(5, 20), (12, 30), (1, 3)], 4, 2, 64, bf16, True),
        ("decode_rows_h4_1_d32_fp16", [(1, 1), (1, 40), (1, 7)], 4, 1, 32, fp16, True),
        ("noncausal_h4_2_d64_bf16", [(6, 11), (9, 4), (1, 1)], 4, 2, 64, bf16, False),
        ("mha_h3_3_d16_bf16", [(7, 7), (2, 9)], 3, 3, 16, bf16, True),
    ]
    cases = []
    for tag, lens, hq, hkv, d, dt, causal in specs:
        make: Callable[[], dict[str, Any]] = functools.partial(make_case, tag, lens, hq, hkv, d, dt, causal)
        cases.append(Case(tag, "golden", _cached(tag, make)))

    def explicit_scale() -> dict[str, Any]:
        inp = _forward_pack("bwd_scale", [(6, 6), (1, 10)], 4, 2, 64, fp16)
        inp["cu_seqlens_q"] = inp["cu_seqlens_q"].to(torch.int64)
        inp["cu_seqlens_k"] = inp["cu_seqlens_k"].to(torch.int64)
        inp["scale"] = 0.1
        return with_grads(inp, "scale")

    name = "explicit_scale_int64_cu_fp16"
    cases.append(Case(name, "golden", _cached(name, explicit_scale)))
    return cases


# --------------------------------------------------------------------------- designed cases

#: ``q = dO = [1, 2**-8, 2**-16, 0]`` of the designed decode rows: with scale 1, ``dK_j = dS_j q`` and
#: ``dV_j = pn_j dO`` are exact, so a flip of one bf16 ``dS_j`` or ``pn_j`` reaches the output alone.
_STEP = (1.0, 2.0**-8, 2.0**-16, 0.0)


def _three_digits(x: float) -> list[float]:
    """bf16 a, b, c with ``a + b 2**-8 + c 2**-16 == x`` exactly (any fp32 score or dP of these cases)."""
    out, r = [], float(x)
    for w in (1.0, 2.0**-8, 2.0**-16):
        d = float(torch.tensor(r / w, dtype=torch.float64).to(torch.bfloat16))
        out.append(d)
        r -= d * w
    assert r == 0.0, x
    return out


def _decode_row(scores: Sequence[float], v: Sequence[Sequence[float]],
                grad_out: Sequence[float] = _STEP) -> dict[str, Any]:
    """One query (a decode row, causal), one head, D = 4, explicit scale 1: key j's score is exactly
    ``scores[j]`` (k_j = the three bf16 digits of it against q = [1, 2**-8, 2**-16, 0]); ``out`` is the
    forward's output. Inputs found by tools/find_attention_backward_cases.py."""
    bf16 = torch.bfloat16
    q = torch.tensor([[_STEP]], dtype=torch.float64).to(bf16)
    k = torch.tensor([_three_digits(s) + [0.0] for s in scores], dtype=torch.float64).unsqueeze(1).to(bf16)
    vt = torch.tensor([list(r) for r in v], dtype=torch.float64).unsqueeze(1).to(bf16)
    inp = {"q": q, "k": k, "v": vt, "cu_seqlens_q": cu_of([1]), "cu_seqlens_k": cu_of([len(scores)]),
           "scale": 1.0, "causal": True}
    out = attention_reference(q, k, vt, inp["cu_seqlens_q"], inp["cu_seqlens_k"], scale=1.0, causal=True)
    return {**inp, "grad_out": torch.tensor([[list(grad_out)]], dtype=torch.float64).to(bf16), "out": out}


#: dO with a fourth feature below dP's last bit (2**-24): D = dO . out is inexact in fp32.
_TAIL = (1.0, 2.0**-8, 2.0**-16, 2.0**-24)


def designed_cases() -> list[Case]:
    """Decode rows whose dS_j or pn_j sits on (or one fp32 ulp from) a bf16 rounding midpoint, each pinning
    a parameter that moves an fp32 intermediate by about an ulp (searched offline, baked exactly).

    The P-grid rows have a top key (p = 1, P = 2**39) and keys with P ~ 2**15 and ~2**23 so that the
    forward's ``L = 2**39 + ...`` sits at (or one unit beside) the fp32 midpoint of ``l = 1 + 2**-24``:
    ``P1 = 32768.9375`` rounds to 32769 (l rounds up; toward zero or the 2**-39 grid give the tie, which
    rounds to even, down) and ``P1 = 35664.5`` ties to 35664 (L exactly the tie, l down; ties away or
    the 2**-41 grid give one unit more, up). Then ``pn = p / l`` moves by an ulp and key 1's V row puts
    ``dS_1 = pn_1 (dP_1 - D)`` on the bf16 midpoint that separates the two."""
    rows: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("p_grid_round_up_bf16", lambda: _decode_row(
            [0.0, -16.6355037689209], [[1.0, 0.0, 0.0, 0.5], [1.5, 0.49609375, 0.0625, 0.0]])),
        ("p_grid_exact_tie_bf16", lambda: _decode_row(
            [0.0, -16.55082893371582, -10.749673843383789],
            [[1.0, 0.0, 0.0, 0.5], [1.5078125, -0.90625, -0.4375, 0.0], [-2.0, 0.0, 0.0, 0.25]])),
        # a zero-value sink 68-73 nats above the keys: ref = m - 64 (MAX_GAP); key 3's dS on a midpoint
        ("sink_gap_past_max_gap_bf16", lambda: _decode_row(
            [0.0, -70.0, -71.25, -69.5, -72.75, -68.25],
            [[0.0, 0.0, 0.0, 0.0], [3.0, 0.0, 0.0, -1.0], [-2.0, 0.0, 0.0, 0.25],
             [1.4921875, -0.47265625, 0.1171875, 0.0], [0.5, 0.0, 0.0, 0.0], [-1.0, 0.0, 0.0, 0.0]])),
        # exp_c's last bit at s = -2.9000258 (coefficient E0) moves pn_1 by an ulp
        ("exp_c_last_bit_bf16", lambda: _decode_row(
            [0.0, -2.9000258445739746],
            [[1.0, 0.0, 0.0, 0.5], [0.09423828125, -0.03564453125, -0.015625, 0.0]])),
        # dO[3] = 1.5 2**-27: one unit of dO's 28-bit grid (0 on a 27-bit grid), times out[3] ~ 64 in D
        ("do_grid_last_bit_bf16", lambda: _decode_row(
            [0.0, -1.0], [[1.0, 0.0, 0.0, 64.0], [1.5, 0.1630859375, -0.046875, 0.0]],
            (1.0, 2.0**-8, 2.0**-16, 1.5 * 2.0**-27))),
        # D = dO . out has bits below its fp32 ulp, more than half an ulp: RN32 rounds it up
        ("row_product_rounding_bf16", lambda: _decode_row(
            [0.0, -4.0], [[1.0, 0.0, 0.0, 3.140625], [1.5, 0.40625, 0.0, 0.0]], _TAIL)),
        # RN32(dP_1 - D) drops D's low bits; dS_1 = RN32(pn_1 x) then differs from pn_1 (dP_1 - D) in one rounding
        ("ds_two_roundings_bf16", lambda: _decode_row(
            [0.0, -4.0], [[1.0, 0.0, 0.0, 0.7109375], [5.3125, -3.375, 0.84375, 0.0]], _TAIL)),
        # dS_1 exactly a bf16 tie whose lower neighbour is even: RNE rounds down, ties away up
        ("ds_cast_tie_bf16", lambda: _decode_row(
            [0.0, -4.0], [[1.0, 0.0, 0.0, 0.0], [1.5078125, -0.74609375, 0.078125, 0.0]])),
    ]
    return [Case(name, "adversarial", _cached(name, make)) for name, make in rows]


# --------------------------------------------------------------------------- input cache

_MAKERS: dict[str, Callable[[], dict[str, Any]]] = {}


@functools.cache
def _inputs(name: str) -> dict[str, Any]:
    return _MAKERS[name]()


def _copy(t: Any) -> Any:
    """A private copy of a tensor with the same sizes and strides (non-contiguous views stay so)."""
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype)
    out.copy_(t)
    return out


def _cached(name: str, make: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """``make`` built once per case name (each case's forward pass runs once per process); every call
    returns fresh copies, so a backend writing into its inputs cannot change a later run."""
    _MAKERS.setdefault(name, make)

    def build() -> dict[str, Any]:
        return {key: _copy(value) for key, value in _inputs(name).items()}

    return build


# --------------------------------------------------------------------------- adversarial cases


def _sink(gap: float, value: float, tag: str) -> dict[str, Any]:
    """Key 0 of each sequence ``gap`` nats above the others, its value row ``value`` x the others."""
    inp = _forward_pack(f"bwd_sink_{tag}", [(12, 12), (3, 20)], 4, 2, 32, torch.float32)
    q, k, v = inp["q"], inp["k"], inp["v"]
    scale = 1.0 / math.sqrt(q.shape[2])
    q[..., 0] = 2.0
    k[..., 0] = 0.0
    for start in (0, 12):
        k[start] = 0.0
        k[start, :, 0] = (gap + 3.0) / (2.0 * scale)
        v[start] = v[start] * value
    bf16 = torch.bfloat16
    return with_grads({**inp, "q": q.to(bf16), "k": k.to(bf16), "v": v.to(bf16)}, f"sink_{tag}")


def _outliers() -> dict[str, Any]:
    inp = _forward_pack("bwd_outliers", [(10, 10), (2, 16)], 4, 2, 64, torch.bfloat16)
    inp["q"] = with_outlier_channels(inp["q"], seed_of("attention_backward", "outliers", "q"), 3, 30.0)
    inp["k"] = with_outlier_channels(inp["k"], seed_of("attention_backward", "outliers", "k"), 3, 30.0)
    inp["v"] = with_outlier_channels(inp["v"], seed_of("attention_backward", "outliers", "v"), 3, 1000.0)
    out = with_grads(inp, "outliers")
    out["grad_out"] = with_outlier_channels(out["grad_out"], seed_of("attention_backward", "outliers", "go"), 2, 300.0)
    return out


def _outlier_keys(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """A few keys with huge scores: most p underflow, dS concentrated on few keys, wide dS rows."""
    inp = _forward_pack(f"bwd_outlier_keys_{tag}", [(6, 6), (3, 21)], 4, 2, 32, dtype)
    kf = inp["k"].to(torch.float64)
    kf[[2, 10, 20]] *= 40.0 if dtype == torch.float16 else 100.0
    inp["k"] = kf.to(dtype)
    return with_grads(inp, f"outlier_keys_{tag}")


def _equal_scores() -> dict[str, Any]:
    """Identical keys: every p ties (pn = 1/n), dS sums cancel."""
    inp = _forward_pack("bwd_equal", [(5, 5), (2, 9)], 4, 2, 32, torch.bfloat16)
    inp["k"] = inp["k"][:1].expand_as(inp["k"]).contiguous()
    return with_grads(inp, "equal")


def _zero_v_rows() -> dict[str, Any]:
    """Zero V rows among small ones (the reference max skips them) and a sequence of zero V rows."""
    inp = _forward_pack("bwd_zero_v", [(4, 4), (1, 12), (3, 3)], 4, 2, 32, torch.float16, v_std=2.0**-8)
    v = inp["v"].clone()
    v[[0, 2, 7, 11]] = 0
    v[16:19] = 0
    inp["v"] = v
    return with_grads(inp, "zero_v")


def _specials(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """NaN/inf in a k row, a V row, a dO row, an out row and a q row; special values spread around."""
    inp = make_case(f"specials_{tag}", [(8, 8), (4, 10)], 4, 2, 16, dtype)
    q, k, v = inp["q"].clone(), inp["k"].clone(), inp["v"].clone()
    go, out = inp["grad_out"].clone(), inp["out"].clone()
    k[3, 0, 5] = float("nan")  # seq 0, key 3, kv head 0: rows 3.. of heads 0-1 bad
    v[12, 1, 2] = float("inf")  # seq 1, key 4, kv head 1: heads 2-3, rows that see key 4
    go[1, 2, 0] = float("-inf")  # seq 0, row 1, head 2
    out[9, 3, 7] = float("nan")  # seq 1, row 1, head 3
    q[10, 0, 1] = float("inf")  # seq 1, row 2, head 0
    sv = special_values(dtype)
    finite = sv[torch.isfinite(sv)]
    for n in range(finite.numel()):  # finite specials (zeros, subnormals, extremes) elsewhere
        go[(n * 5) % 12, 1, n % 16] = finite[n]
        q[(n * 7) % 12, 3, (n * 3) % 16] = finite[n] if abs(float(finite[n])) < 100 else 0.5
    inp.update(q=q, k=k, v=v, grad_out=go, out=out)
    return inp


def _tiny_grads() -> dict[str, Any]:
    """A tiny dO: dS and dV near and below the bf16 subnormal range (rounded, not flushed)."""
    inp = make_case("tiny_grads", [(6, 6), (1, 5)], 4, 2, 32, torch.bfloat16)
    inp["grad_out"] = normal(seed_of("attention_backward", "tiny", "go"), tuple(inp["q"].shape), std=2.0**-128,
                             dtype=torch.bfloat16)
    return inp


def _large_grads() -> dict[str, Any]:
    """A huge dO in fp16: some gradients overflow to +-inf in the final rounding."""
    inp = make_case("large_grads", [(6, 6), (2, 7)], 4, 2, 32, torch.float16, v_std=30.0)
    inp["grad_out"] = normal(seed_of("attention_backward", "large", "go"), tuple(inp["q"].shape), std=2000.0,
                             dtype=torch.float16)
    return inp


def _noncontiguous() -> dict[str, Any]:
    """q, k, v slices of one fused projection [T, (Hq + 2 Hkv) D]; grad_out and out transposed storage."""
    lens = [(7, 7), (3, 3)]
    hq, hkv, d, t = 4, 2, 32, 10
    qkv = normal(seed_of("attention_backward", "noncontig", "qkv"), (t, (hq + 2 * hkv) * d), dtype=torch.bfloat16)
    inp = {"q": qkv[:, : hq * d].view(t, hq, d), "k": qkv[:, hq * d: (hq + hkv) * d].view(t, hkv, d),
           "v": qkv[:, (hq + hkv) * d:].view(t, hkv, d), "cu_seqlens_q": cu_of([a for a, _ in lens]),
           "cu_seqlens_k": cu_of([b for _, b in lens]), "scale": None, "causal": True}
    out = with_grads(inp, "noncontig")
    for name in ("grad_out", "out"):
        out[name] = out[name].permute(2, 1, 0).contiguous().permute(2, 1, 0)
    return out


def _wide_rows() -> dict[str, Any]:
    """Every token's q, k, v and dO row scaled by its own power of two in [2**-24, 1]: the feature
    columns of K, Q and dO span 24 binades, so their 21-bit grids round (ties included)."""
    inp = _forward_pack("bwd_wide", [(10, 10), (3, 12)], 4, 2, 32, torch.bfloat16)

    def spread(x: torch.Tensor, name: str) -> torch.Tensor:
        e = integers(seed_of("attention_backward", "wide", name), (x.shape[0], 1, 1), -24, 1)
        return (x.to(torch.float64) * torch.ldexp(torch.ones((), dtype=torch.float64), e.to(torch.float64))).to(x.dtype)

    for name in ("q", "k", "v"):
        inp[name] = spread(inp[name], name)
    out = with_grads(inp, "wide")
    out["grad_out"] = spread(out["grad_out"], "grad_out")
    return out


def _single_key() -> dict[str, Any]:
    """lq = lk = 1: pn = 1 and out = v, so dP = D exactly and dQ = dK = 0; dV = dO."""
    inp = _forward_pack("bwd_single", [(1, 1), (1, 1)], 4, 2, 32, torch.bfloat16)
    return with_grads(inp, "single")


def _negative_scale() -> dict[str, Any]:
    """A negative, non-representable explicit scale: the sign and every bit of the significand in dQ, dK."""
    inp = _forward_pack("bwd_negscale", [(5, 5), (2, 6)], 4, 2, 16, torch.bfloat16)
    inp["scale"] = -0.3
    return with_grads(inp, "negscale")


def _huge_scores() -> dict[str, Any]:
    """Scale 2**125: +inf scores make rows bad (NaN), -inf scores give p = 0."""
    inp = _forward_pack("bwd_huge", [(4, 4), (1, 6)], 4, 2, 16, torch.bfloat16)
    inp["scale"] = 2.0**125
    return with_grads(inp, "huge")


def adversarial_cases() -> list[Case]:
    """The designed midpoint rows (:func:`designed_cases`), then sinks, outliers, ties, zero V rows,
    specials, tiny/huge gradients, strided inputs, empty segments."""
    bf16, fp16 = torch.bfloat16, torch.float16
    cases = [
        Case("single_key_bf16", "adversarial", _single_key),
        Case("outlier_channels_bf16", "adversarial", _outliers),
        Case("sink_gap20_zero_value_bf16", "adversarial", lambda: _sink(20.0, 0.0, "g20z")),
        Case("sink_gap14_small_value_bf16", "adversarial", lambda: _sink(14.0, 1e-3, "g14s")),
        Case("sink_gap70_zero_value_bf16", "adversarial", lambda: _sink(70.0, 0.0, "g70z")),
        Case("outlier_keys_bf16", "adversarial", lambda: _outlier_keys(bf16, "bf16")),
        Case("outlier_keys_fp16", "adversarial", lambda: _outlier_keys(fp16, "fp16")),
        Case("equal_scores_bf16", "adversarial", _equal_scores),
        Case("zero_v_rows_fp16", "adversarial", _zero_v_rows),
        Case("specials_bf16", "adversarial", lambda: _specials(bf16, "bf16")),
        Case("specials_fp16", "adversarial", lambda: _specials(fp16, "fp16")),
        Case("tiny_grads_bf16", "adversarial", _tiny_grads),
        Case("large_grads_fp16", "adversarial", _large_grads),
        Case("negative_scale_bf16", "adversarial", _negative_scale),
        Case("huge_scores_bf16", "adversarial", _huge_scores),
        Case("noncontiguous_bf16", "adversarial", _noncontiguous),
        Case("wide_rows_bf16", "adversarial", _wide_rows),
        Case("empty_segments_bf16", "adversarial",
             lambda: make_case("empty_segments", [(0, 5), (3, 3), (0, 0), (1, 9), (0, 2)], 4, 2, 32, bf16)),
        Case("empty_batch_bf16", "adversarial", lambda: make_case("empty_batch", [], 4, 2, 32, bf16)),
        Case("noncausal_lk0_bf16", "adversarial",
             lambda: make_case("noncausal_lk0", [(2, 0), (3, 4)], 4, 2, 32, bf16, causal=False)),
        Case("head_dim_odd_fp16", "adversarial",
             lambda: make_case("head_dim_odd", [(5, 5), (1, 3)], 6, 2, 17, fp16)),
    ]
    return designed_cases() + [dataclasses.replace(c, make=_cached(c.name, c.make)) for c in cases]


# --------------------------------------------------------------------------- invariance cases


def _seq(tag: str, lq: int, lk: int, hq: int = 4, hkv: int = 2, d: int = 32,
         dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """One sequence's tensors (q, k, v, out, grad_out) of the invariance cases."""
    return make_case(tag, [(lq, lk)], hq, hkv, d, dtype)


def _pack(seqs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    cat = {name: torch.cat([s[name] for s in seqs]) for name in ("grad_out", "q", "k", "v", "out")}
    return {**cat, "cu_seqlens_q": cu_of([s["q"].shape[0] for s in seqs]),
            "cu_seqlens_k": cu_of([s["k"].shape[0] for s in seqs]), "scale": None, "causal": True}


def _pieces(grads: Any, pack: dict[str, Any], b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequence b's rows of (dq, dk, dv)."""
    cq = [int(x) for x in pack["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in pack["cu_seqlens_k"].tolist()]
    dq, dk, dv = grads
    return dq[cq[b]: cq[b + 1]], dk[ck[b]: ck[b + 1]], dv[ck[b]: ck[b + 1]]


def invariance_cases() -> list[InvarianceCase]:
    """A sequence alone vs in packs, permuted sequences, a subset of KV groups (TP heads), repeat."""
    op = "attention_backward"

    def batch(run: Any) -> tuple[Any, Any]:
        target = _seq("inv_batch_target", 13, 18)
        others = [_seq(f"inv_batch_other{i}", lq, lk) for i, (lq, lk) in enumerate([(1, 40), (20, 20), (3, 9),
                                                                                    (0, 6)])]
        alone = run(op, **_pack([target]))
        expected, actual = [], []
        for pos, mates in ((0, others[:2]), (1, others[2:3]), (2, others[1:4])):
            seqs = list(mates)
            seqs.insert(pos, target)
            pack = _pack(seqs)
            expected.append(alone)
            actual.append(_pieces(run(op, **pack), pack, pos))
        return expected, actual

    def permutation(run: Any) -> tuple[Any, Any]:
        seqs = [_seq(f"inv_perm{i}", lq, lk) for i, (lq, lk) in enumerate([(4, 4), (1, 30), (9, 15), (0, 3),
                                                                          (2, 2)])]
        perm = [3, 0, 4, 2, 1]
        base = _pack(seqs)
        grads = run(op, **base)
        permuted = _pack([seqs[i] for i in perm])
        got = run(op, **permuted)
        return ([_pieces(grads, base, i) for i in perm], [_pieces(got, permuted, n) for n in range(len(perm))])

    def head_split(run: Any) -> tuple[Any, Any]:
        hq, hkv = 8, 4
        pack = make_case("inv_heads", [(9, 9), (2, 12), (5, 5)], hq, hkv, 32, torch.float16)
        full = run(op, **pack)
        expected, actual = [], []
        for groups in ([0, 1], [2, 3], [1], [3], [0, 2]):  # TP ranks own whole KV groups
            heads = [h for g in groups for h in range(g * hq // hkv, (g + 1) * hq // hkv)]
            sub = dict(pack)
            for name in ("grad_out", "q", "out"):
                sub[name] = pack[name][:, heads]
            for name in ("k", "v"):
                sub[name] = pack[name][:, groups]
            got = run(op, **sub)
            expected.append((full[0][:, heads], full[1][:, groups], full[2][:, groups]))
            actual.append(got)
        return expected, actual

    def repeat(run: Any) -> tuple[Any, Any]:
        pack = make_case("inv_repeat", [(10, 10), (1, 20), (3, 8)], 4, 2, 32, torch.bfloat16)
        first = run(op, **pack)
        return [first, first], [run(op, **pack) for _ in range(2)]

    return [
        InvarianceCase("sequence_in_packs", "batch", batch),
        InvarianceCase("permuted_sequences", "permutation", permutation),
        InvarianceCase("kv_group_subsets", "tp_degree", head_split),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def _native(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
            causal: bool = True) -> tuple[Any, ...]:
    """Native baseline for one packed sequence: autograd of SDPA (is_causal, enable_gqa) in the same dtype."""
    qs, ks, vs = (t.detach().transpose(0, 1).unsqueeze(0).requires_grad_(True) for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=True)
    return torch.autograd.grad(o, (qs, ks, vs), grad_out.transpose(0, 1).unsqueeze(0))


def bench_cases() -> list[BenchCase]:
    """Causal prefill backward in bf16, head_dim 128, 8 KV heads: Qwen3-0.6B (16 q heads) T=64 and
    Qwen3-8B (32 q heads) T=2048."""
    cases = []
    for model, hq, size, t in (("qwen3_0.6b", 16, "small", 64), ("qwen3_8b", 32, "large", 2048)):

        def make(device: torch.device, t: int = t, hq: int = hq) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(t + 7)
            q = torch.randn(t, hq, 128, generator=g, device=device).to(torch.bfloat16)
            k = torch.randn(t, 8, 128, generator=g, device=device).to(torch.bfloat16)
            v = torch.randn(t, 8, 128, generator=g, device=device).to(torch.bfloat16)
            go = torch.randn(t, hq, 128, generator=g, device=device).to(torch.bfloat16)
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                enable_gqa=True).transpose(0, 1)
            cu = torch.tensor([0, t], device=device, dtype=torch.int32)
            return {"grad_out": go, "q": q, "k": k, "v": v, "out": o.contiguous(), "cu_seqlens_q": cu,
                    "cu_seqlens_k": cu, "scale": None, "causal": True}

        cases.append(BenchCase(
            name=f"{model}_prefill_backward_T{t}_causal_bf16",
            make=make,
            native=_native,
            flops=2.5 * 4.0 * t * t * hq * 128 / 2,  # QK^T again, dP, dQ, dK, dV: 5 products, causal half
            bytes=2.0 * (4 * t * hq * 128 + 4 * t * 8 * 128),  # read q, out, dO, K, V; write dq, dk, dv
            sizes=(size,),
        ))
    return cases
