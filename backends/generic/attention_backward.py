"""Device-generic exact ``attention_backward`` (contract ``attention_backward`` v1).

Independent of the contract reference. Per sequence and KV head the [G, lq, lk] block of the
G query heads is materialised (O(lq * lk) memory per KV head). The KV heads of a sequence, and
sequences sorted by length and zero-padded to the longest of their batch, run as one batch while
its blocks hold at most ``BLOCK_ELEMENTS`` elements (times ``budget_scale`` on an accelerator) and
at most ``PAD_WASTE`` times their own, so the number of torch operations grows with the batches,
not with the sequences:

* the forward's scores are recomputed with the forward kernel's own digit GEMM helpers, and its
  probabilities as the forward builds them (row max, reference max, ``exp_c``, the integers ``P``
  on the 2**-40 grid and their sum ``L``), normalised as the forward's output is:
  ``pn = p / fp32(L)`` (``p`` the fp32 ``exp_c`` value, ``fp32(L)`` the forward's denominator);
* ``D`` and ``dP`` are exact integer dot products on 28-bit (dO) and 21-bit (O, V) grids, each
  rounded once to fp32; ``dS = pn * (dP - D)`` in two fp32 roundings, then cast to the dtype;
* dQ, dK and dV are exact digit products (the dS / pn operand on 28-bit grids in four balanced
  base-128 digits, the K / Q / dO operand per feature on 21-bit grids in three), fp32 digit
  GEMMs over reductions of at most 4096 (every partial sum an integer below 2**24), combined
  in int64 and rounded once straight to the dtype; for dQ and dK the scale's 24-bit significand
  multiplies the int64 sum exactly (two limbs) inside that rounding.

Every sum is exact, so the bits depend on nothing but the values: not on the pack, the order of
the sequences, the split of the heads, or the device.
"""

from __future__ import annotations

import math

import torch

from rlkernel.backends.generic._exact.budget import budget_scale
from rlkernel.backends.generic._exact.digits import K_CHUNK, digit_planes, grid_rows, row_exponents, split_digits
from rlkernel.backends.generic._exact.fixed import to_fixed
from rlkernel.backends.generic._exact.fp32 import (
    cast_out,
    exponent,
    int64_pair_to_float,
    int64_to_f32,
    int64_to_float,
    scale_pow2,
)
from rlkernel.backends.generic._exact.transcendental import exp_c
from rlkernel.backends.generic.attention import _level_matmul, default_scale

#: Grids of the forward's scores (q, k rows: 21 bits) and probabilities (2**-40).
QK_GRID = 20
P_BITS = 40
MAX_GAP = 64.0
#: Magnitude bits of the row products' grids: dO rows (28 bits), O and V rows (21 bits).
DO_BITS = 27
OV_BITS = 20
#: Magnitude bits of the gradient products' grids: dS / pn rows (28 bits), K, Q, dO columns (21 bits).
GX_BITS = 27
GW_BITS = 20
X_DIGITS, W_DIGITS = 4, 3
#: Longest exact reduction of one product: |C| <= n * 2**47 < 2**63.
MAX_REDUCTION = (1 << 16) - 1
#: Limb split of C when the scale's significand multiplies it: |C_hi * M|, |C_lo * M| < 2**56.
SCALE_SPLIT = 32
#: sequences (padded to the longest of their batch) and KV heads run together while their
#: [n, H, G, LQ, LK] block holds at most this many elements, times ``budget_scale`` on an accelerator
#: (the temporaries are a few int64 / fp32 copies of it and of the digit planes)
BLOCK_ELEMENTS = 1 << 22
#: a batch's padded blocks hold at most this many times the elements of its sequences' own blocks
PAD_WASTE = 2


def _scale_parts(scale: float) -> tuple[int, int]:
    """``scale = M * 2**ks`` with ``|M| < 2**24`` an integer (a binary32 value splits exactly)."""
    if scale == 0.0:
        return 0, 0
    mant, e = math.frexp(scale)
    return int(mant * 2.0**24), e - 24


def _causal_allowed(lq: int, lk: int, causal: bool, device: torch.device) -> torch.Tensor:
    """[lq, lk] bool: bottom-right causal (query i sees keys <= lk - lq + i) or all keys."""
    i = torch.arange(lq, device=device).unsqueeze(1)
    j = torch.arange(lk, device=device).unsqueeze(0)
    if not causal:
        return (i >= 0) & (j >= 0)
    return j <= lk - lq + i


def _round_once(c: torch.Tensor, k: torch.Tensor, dtype: torch.dtype,
                scale: tuple[int | torch.Tensor, int | torch.Tensor] | None) -> torch.Tensor:
    """``RN_dtype((M *) c * 2**k)`` in one rounding; with the scale: ``c = hi 2**32 + lo`` times M, two limbs
    (``M``, ``ks`` ints, or int64 tensors broadcasting against c: a scale per head; M = 1, ks = 0 is
    the unscaled rounding, the same value rounded once)."""
    if scale is None:
        return int64_to_float(c, k, dtype)
    m, ks = scale
    hi = (c >> SCALE_SPLIT) * m
    lo = (c & ((1 << SCALE_SPLIT) - 1)) * m
    return int64_pair_to_float(hi, lo, SCALE_SPLIT, k + ks, dtype)


def _batched_int_product(xd: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``X @ W.T`` per head from digit planes xd [A, H, M, K], wd [B, H, N, K]: [H, M, N].

    The fp32 digit GEMMs reduce over chunks of at most ``K_CHUNK`` (every partial sum an integer
    below 2**24, exact in any order), their results are combined in int64 (``int_product``'s
    steps, batched over the heads)."""
    na, h, m, k = xd.shape
    nb, n = wd.shape[0], wd.shape[2]
    acc = torch.zeros((h, m, n), dtype=torch.int64, device=xd.device)
    w_all = wd.permute(1, 0, 2, 3).reshape(h, nb * n, k)
    for start in range(0, k, K_CHUNK):
        stop = min(start + K_CHUNK, k)
        w_chunk = w_all[:, :, start:stop].transpose(1, 2)
        for a in range(na):
            part = torch.matmul(xd[a, :, :, start:stop], w_chunk).to(torch.int64).reshape(h, m, nb, n)
            for b in range(nb):
                acc += part[:, :, b, :] << (7 * (a + b))
    return acc


def _exact_product(x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, x_bits: int,
                   w_bits: int) -> torch.Tensor:
    """Exact int64 ``X @ W.T`` per head of x [H, M, K] and w [H, N, K] on their row grids (digit GEMMs): [H, M, N]."""
    return _batched_int_product(digit_planes(x, ex, x_bits, X_DIGITS), digit_planes(w, ew, w_bits, W_DIGITS))


def _grad_product(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype,
                  scale: tuple[int | torch.Tensor, int | torch.Tensor] | None = None) -> torch.Tensor:
    """``RN_dtype(scale * x @ w.T)`` per head: x [H, M, K] on 28-bit row grids, w [H, N, K] on 21-bit
    row grids -> [H, M, N].

    Non-finite entries read as 0; an x row holding NaN/inf gives a NaN output row.
    """
    ex, ew = row_exponents(x), row_exponents(w)
    c = _exact_product(x, w, ex, ew, GX_BITS, GW_BITS)
    y = _round_once(c, ex.unsqueeze(-1) + ew.unsqueeze(-2) - GX_BITS - GW_BITS, dtype, scale)
    bad = (~torch.isfinite(x)).any(dim=-1)
    return torch.where(bad.unsqueeze(-1), float("nan"), y)


def _kv_product(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype,
                scale: tuple[int | torch.Tensor, int | torch.Tensor] | None = None) -> torch.Tensor:
    """dK or dV of KV heads: x [H, G, lq, lk] (dS or pn), w [H, G, lq, D] (Q or dO): per KV head ONE
    exact sum over every (head, query) of its group, ``[H, lk, D]``."""
    h, g, lq, lk = x.shape
    return _grad_product(x.reshape(h, g * lq, lk).transpose(1, 2), w.reshape(h, g * lq, w.shape[-1]).transpose(1, 2),
                         dtype, scale)


def _to_fp32(c: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The exact integers of D and dP rounded once to fp32 (P3')."""
    return int64_to_float(c, k, torch.float32)


def _normalise(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``pn = p / RN32(L)``: one IEEE fp32 division (never a reciprocal multiply)."""
    return num / den


def _ds(pn: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """``dS = RN32(pn * RN32(dP - D))``."""
    return pn * (dp - delta)


def _cast_ds(ds: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """dS to the input dtype (nearest even) before the dQ and dK products."""
    return cast_out(ds, dtype)


def _cast_p(pn: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """pn to the input dtype (nearest even) before the dV product."""
    return cast_out(pn, dtype)


def _bad_inputs(do: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Rows whose dO or out holds NaN/inf (they are bad rows)."""
    return (~torch.isfinite(do)).any(dim=-1) | (~torch.isfinite(o)).any(dim=-1)


def _scores(q: torch.Tensor, k: torch.Tensor, eq: torch.Tensor, ek: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The forward's fp32 scores [H, G, lq, lk] of q [H, G, lq, D] against k [H, lk, D] (row exponents
    eq [H, G, lq], ek [H, lk])."""
    qd = split_digits(grid_rows(q, eq, QK_GRID))  # [3, H, G, lq, D]
    kd = split_digits(grid_rows(k, ek, QK_GRID)).transpose(-1, -2).unsqueeze(2)  # [3, H, 1, D, lk]
    c = _level_matmul(qd, kd)
    shift = (eq.unsqueeze(-1) + ek[:, None, None, :] - 2 * QK_GRID).clamp(min=-252)
    s = scale_pow2(int64_to_f32(c), shift) * scale
    bad = (~torch.isfinite(q)).any(dim=-1).unsqueeze(-1) | (~torch.isfinite(k)).any(dim=-1)[:, None, None, :]
    return torch.where(bad, float("nan"), s)


def _probabilities(s: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's probabilities, normalised: (pn fp32 [H, G, lq, lk], bad rows [H, G, lq]) of the
    scores s [H, G, lq, lk] and the values v [H, lk, D]."""
    finite = torch.isfinite(v)
    vzero = (torch.where(finite, v, 0.0).abs().amax(dim=-1) == 0)[:, None, None, :]  # [H, 1, 1, lk]
    vbad = (~finite).any(dim=-1)[:, None, None, :]
    m = torch.where(allowed, s, float("-inf")).amax(dim=-1) + 0.0
    contrib = allowed & ~vzero
    c = torch.where(contrib, s, float("-inf")).amax(dim=-1) + 0.0
    ref = torch.maximum(c, m - MAX_GAP)
    p = torch.where(allowed, exp_c(s - ref.unsqueeze(-1)), 0.0)
    bad = torch.isnan(p).any(dim=-1) | (allowed & vbad).any(dim=-1)
    top = exp_c(m - ref)
    e_l = torch.where(torch.isfinite(top), exponent(torch.where(torch.isfinite(top), top, 1.0)), 1)
    big_l = to_fixed(p, e_l.unsqueeze(-1), P_BITS).sum(dim=-1)  # the forward's L (non-finite p -> 0)
    den = int64_to_float(big_l, e_l - P_BITS, torch.float32)
    return _normalise(torch.where(torch.isnan(p), 0.0, p), den.unsqueeze(-1)), bad


def _padded(t: torch.Tensor, spans: list[tuple[int, int]], length: int, cols: slice) -> torch.Tensor:
    """``[n, length, len(cols), ...]``: the token rows ``a:b`` of each span (columns ``cols``) zero-padded
    to ``length`` (a view when there is one span of that length)."""
    if len(spans) == 1 and spans[0][1] - spans[0][0] == length:
        return t[spans[0][0]:spans[0][1], cols].unsqueeze(0)
    part = t[:0, cols]
    out = torch.zeros((len(spans), length) + tuple(part.shape[1:]), dtype=t.dtype, device=t.device)
    for i, (a, b) in enumerate(spans):
        out[i, :b - a] = t[a:b, cols]
    return out


def _padded_rows(t: torch.Tensor, spans: list[tuple[int, int]], length: int, first: int, count: int) -> torch.Tensor:
    """``[n * count, length, ...]``: the heads ``first:first + count`` of the token rows of each span of
    ``t [T, heads, ...]``, zero-padded to ``length``, head-major per span."""
    part = _padded(t, spans, length, slice(first, first + count))  # [n, length, count, ...]
    return part.transpose(1, 2).reshape((len(spans) * count, length) + tuple(part.shape[3:]))


class Steps:
    """The steps of the backward that a backend may run as kernels, per batch of sequences and KV
    heads: ``ds_and_p`` (the forward's probabilities recomputed, ``D``, ``dP`` and ``dS``: every one
    ``[n H, G, LQ, LK]``, the largest tensors of the backward) and the gradient products ``grad_q``
    and ``grad_kv``. These are the device-generic torch steps (the cuda/rocm backends' Triton ones:
    ``backends/triton/attention_backward.py``); the row exponents of the pack's five inputs are made
    once, on the first batch."""

    def __init__(self) -> None:
        self._exps: tuple[torch.Tensor, ...] | None = None

    def ds_and_p(self, seqs: list[tuple[int, int, int, int]], g0: int, g1: int, group: int, causal: bool,
                 q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, out: torch.Tensor,
                 scale_value: float, big_q: int, big_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(dS, pn, bad)`` of the sequences ``seqs`` (``(q0, q1, k0, k1)`` each, zero-padded to ``big_q``
        queries and ``big_k`` keys) for KV heads ``g0:g1``: dS and pn ``[n H, G, LQ, LK]`` in q's dtype
        (NaN at the allowed pairs of a bad row, 0 where no key is allowed), the bad rows ``[n H, G, LQ]``
        bool (contract ``attention_backward``, steps 1-3)."""
        if self._exps is None:  # each depends on its own row only: once for the pack
            self._exps = tuple(row_exponents(t) for t in (q, k, grad_out, out, v))
        eq, ek, edo, eo, ev = self._exps
        dtype, dev = q.dtype, q.device
        n, h, d = len(seqs), g1 - g0, q.shape[-1]
        qspans = [(q0, q1) for q0, q1, _, _ in seqs]
        kspans = [(k0, k1) for _, _, k0, k1 in seqs]

        def rows_q(t: torch.Tensor) -> torch.Tensor:  # [Tq, Hq, ...] -> [n H, G, LQ, ...]
            r = _padded_rows(t, qspans, big_q, g0 * group, h * group)  # [n H G, LQ, ...]
            return r.reshape((n * h, group, big_q) + tuple(r.shape[2:]))

        def rows_k(t: torch.Tensor) -> torch.Tensor:  # [Tk, Hkv, ...] -> [n H, LK, ...]
            return _padded_rows(t, kspans, big_k, g0, h)

        allowed = torch.zeros((n, big_q, big_k), dtype=torch.bool, device=dev)
        for i, (q0, q1, k0, k1) in enumerate(seqs):
            allowed[i, :q1 - q0, :k1 - k0] = _causal_allowed(q1 - q0, k1 - k0, causal, dev)
        allowed = allowed.unsqueeze(1).expand(n, h, big_q, big_k).reshape(n * h, 1, big_q, big_k)
        vv = rows_k(v)
        do = rows_q(grad_out).reshape(n * h, group * big_q, d)
        o = rows_q(out).reshape(n * h, group * big_q, d)
        e_do = rows_q(edo).reshape(n * h, group * big_q)
        e_o = rows_q(eo).reshape(n * h, group * big_q)
        row_bad = _bad_inputs(do, o).view(n * h, group, big_q)
        scale_t = torch.full((), scale_value, dtype=torch.float32, device=dev)
        s_g = _scores(rows_q(q), rows_k(k), rows_q(eq), rows_k(ek), scale_t)
        pn, bad = _probabilities(s_g, allowed, vv)
        bad = bad | row_bad
        # D_i and dP_ij: exact products of the dO rows (28 bits) with the out and V rows (21 bits)
        e_v = rows_k(ev)  # [n H, LK]
        dp = _to_fp32(_exact_product(do, vv, e_do, e_v, DO_BITS, OV_BITS),
                      e_do.unsqueeze(-1) + e_v.unsqueeze(-2) - DO_BITS - OV_BITS).view(n * h, group, big_q, big_k)
        c_d = (grid_rows(do, e_do, DO_BITS) * grid_rows(o, e_o, OV_BITS)).sum(dim=-1)
        delta = _to_fp32(c_d, e_do + e_o - DO_BITS - OV_BITS).view(n * h, group, big_q, 1)
        ds = _ds(pn, dp, delta)
        keep = allowed & ~bad.unsqueeze(-1)
        dsr = _cast_ds(torch.where(keep, ds, torch.where(allowed, float("nan"), 0.0)), dtype)
        pr = _cast_p(torch.where(keep, pn, torch.where(allowed, float("nan"), 0.0)), dtype)
        return dsr, pr, bad

    def grad_q(self, ds: torch.Tensor, kk: torch.Tensor, dtype: torch.dtype,
               parts: tuple[int, int]) -> torch.Tensor:
        """dQ before the bad-row NaNs: ``RN_dtype(scale dS K)`` of ds ``[n H, G LQ, LK]`` and the padded
        keys kk ``[n H, LK, D]`` -> ``[n H, G LQ, D]`` (NaN rows where a dS row holds NaN/inf)."""
        return _grad_product(ds, kk.transpose(1, 2), dtype, parts)

    def grad_kv(self, ds: torch.Tensor, pr: torch.Tensor, qg: torch.Tensor, do: torch.Tensor, dtype: torch.dtype,
                parts: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """dK = ``RN_dtype(scale sum dS^T Q)`` and dV = ``RN_dtype(sum pn^T dO)`` of ds, pr ``[n H, G, LQ, LK]``
        and qg, do ``[n H, G, LQ, D]``: each ``[n H, LK, D]``, one exact sum over the group's heads and
        queries. Both as one batch of 2 n H KV heads (half the torch operations): dV's scale is M = 1,
        ks = 0, filled on the device (a tensor from a host list would be a copy that waits for the stream)."""
        nh = ds.shape[0]
        m = torch.ones((2, nh, 1, 1), dtype=torch.int64, device=ds.device)
        ks = torch.zeros_like(m)
        m[0], ks[0] = parts
        gkv = _kv_product(torch.cat([ds, pr]), torch.cat([qg, do]), dtype, (m.view(-1, 1, 1), ks.view(-1, 1, 1)))
        return gkv[:nh], gkv[nh:]


def _kv_heads(steps: Steps, seqs: list[tuple[int, int, int, int]], g0: int, g1: int, group: int, causal: bool,
              q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, out: torch.Tensor,
              scale_value: float, parts: tuple[int, int], dq: torch.Tensor, dk: torch.Tensor,
              dv: torch.Tensor) -> None:
    """The gradients of the sequences ``seqs`` (``(q0, q1, k0, k1)`` each, every one with keys) for KV
    heads ``g0:g1``, written into dq, dk, dv.

    The sequences run as one batch of ``n * H`` KV heads, each zero-padded to the longest query and
    key counts ``LQ``, ``LK`` of the batch: a padded query row sees no key, a padded key is seen by
    no query, and their q / k / v / dO / out rows are zero. Every step is per (KV head, query head,
    row), or an exact sum in which a padded row adds zero (its ``dS`` and ``pn`` are masked to 0, its
    inputs are zero), so each sequence's bits are those of a batch of its own (and of one head at a
    time): the batch only divides the number of torch operations by the number of sequences.
    """
    dtype = q.dtype
    n, h, d = len(seqs), g1 - g0, q.shape[-1]
    big_q = max(q1 - q0 for q0, q1, _, _ in seqs)
    big_k = max(k1 - k0 for _, _, k0, k1 in seqs)
    dsr, pr, bad = steps.ds_and_p(seqs, g0, g1, group, causal, q, k, v, grad_out, out, scale_value, big_q, big_k)
    qspans = [(q0, q1) for q0, q1, _, _ in seqs]
    kk = _padded_rows(k, [(k0, k1) for _, _, k0, k1 in seqs], big_k, g0, h)  # [n H, LK, D]
    qg = _padded_rows(q, qspans, big_q, g0 * group, h * group).view(n * h, group, big_q, d)
    do = _padded_rows(grad_out, qspans, big_q, g0 * group, h * group).view(n * h, group, big_q, d)
    gq = steps.grad_q(dsr.reshape(n * h, group * big_q, big_k), kk, dtype, parts)
    gq = torch.where(bad.view(n * h, group * big_q).unsqueeze(-1), float("nan"), gq)
    gq = cast_out(gq, dtype).view(n, h * group, big_q, d)
    gk, gv = steps.grad_kv(dsr, pr, qg, do, dtype, parts)
    gk = cast_out(gk, dtype).view(n, h, big_k, d)
    gv = cast_out(gv, dtype).view(n, h, big_k, d)
    heads, kv = slice(g0 * group, g1 * group), slice(g0, g1)
    for i, (q0, q1, k0, k1) in enumerate(seqs):
        dq[q0:q1, heads] = gq[i, :, :q1 - q0].transpose(0, 1)
        dk[k0:k1, kv] = gk[i, :, :k1 - k0].transpose(0, 1)
        dv[k0:k1, kv] = gv[i, :, :k1 - k0].transpose(0, 1)


def _batches(seqs: list[tuple[int, int, int, int]], per_seq: int,
             budget: int) -> list[list[tuple[int, int, int, int]]]:
    """The sequences in batches whose padded ``[n, LQ, LK]`` blocks times ``per_seq`` (heads) hold at most
    ``budget`` elements and at most :data:`PAD_WASTE` times the elements of their sequences' own
    blocks; sorted by length so that neighbours pad little (neither the order nor the batches change
    a bit)."""
    batches: list[list[tuple[int, int, int, int]]] = []
    big_q = big_k = own = 0
    for seq in sorted(seqs, key=lambda s: (s[3] - s[2], s[1] - s[0])):
        lq, lk = seq[1] - seq[0], seq[3] - seq[2]
        padded = (len(batches[-1]) + 1) * max(big_q, lq) * max(big_k, lk) if batches else 0
        if batches and padded * per_seq <= budget and padded <= PAD_WASTE * (own + lq * lk):
            batches[-1].append(seq)
            big_q, big_k, own = max(big_q, lq), max(big_k, lk), own + lq * lk
        else:
            batches.append([seq])
            big_q, big_k, own = lq, lk, lq * lk
    return batches


def _host_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
                       causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact gradients of ``attention`` in q, k, v (contract ``attention_backward`` v1): :func:`backward_with`
    the device-generic :class:`Steps`.

    Parameters
    ----------
    grad_out, q, out : Tensor, bfloat16/float16, [Tq, Hq, D] (any strides)
    k, v : Tensor, q's dtype, [Tk, Hkv, D] (any strides)
    cu_seqlens_q, cu_seqlens_k : Tensor, int32/int64, [B + 1]
    scale : float, optional
        An fp32 value (the public op rounds it); default ``RN32(1 / sqrt(D))``.
    causal : bool

    Returns
    -------
    (dq [Tq, Hq, D], dk [Tk, Hkv, D], dv [Tk, Hkv, D]), q's dtype
    """
    return backward_with(Steps(), grad_out, q, k, v, out, cu_seqlens_q, cu_seqlens_k, scale, causal)


def backward_with(steps: Steps, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None,
                  causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`attention_backward` with the steps of ``steps`` (a backend's kernels, same bits): the
    batching, the checks and the scatter of each batch's gradients are this module's."""
    dev, dtype = q.device, q.dtype
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    # RN32 of the given scale (the public op has rounded it already; rounding again changes nothing)
    scale_value = default_scale(d) if scale is None else float(torch.tensor(float(scale), dtype=torch.float32))
    parts = _scale_parts(scale_value)
    cq, ck = _host_list(cu_seqlens_q), _host_list(cu_seqlens_k)
    dq = torch.zeros((tq, hq, d), dtype=dtype, device=dev)
    dk = torch.zeros((tk, hkv, d), dtype=dtype, device=dev)
    dv = torch.zeros((tk, hkv, d), dtype=dtype, device=dev)
    budget = BLOCK_ELEMENTS * budget_scale(dev)
    seqs = []
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        if lk > MAX_REDUCTION or group * lq > MAX_REDUCTION:
            raise ValueError(f"attention_backward: sequence {b} ({lq} queries x {group} heads per KV head, {lk} keys) "
                             f"exceeds the exact-sum bound {MAX_REDUCTION} of a gradient product")
        if causal and lk < lq:
            raise ValueError(f"attention_backward: causal sequence {b} has {lq} queries but {lk} keys; need lk >= lq")
        if lk == 0:  # non-causal with no keys: the forward's rows are NaN
            dq[q0:q1] = float("nan")
        else:
            seqs.append((q0, q1, k0, k1))
    alone = [s for s in seqs if hkv * group * (s[1] - s[0]) * (s[3] - s[2]) > budget]
    together = [s for s in seqs if s not in set(alone)]
    for seq in alone:  # too large with all its KV heads: its heads in batches
        per_batch = max(1, budget // (group * (seq[1] - seq[0]) * (seq[3] - seq[2])))
        for g0 in range(0, hkv, per_batch):
            _kv_heads(steps, [seq], g0, min(hkv, g0 + per_batch), group, causal, q, k, v, grad_out, out, scale_value,
                      parts, dq, dk, dv)
    for batch in _batches(together, hkv * group, budget):
        _kv_heads(steps, batch, 0, hkv, group, causal, q, k, v, grad_out, out, scale_value, parts, dq, dk, dv)
    return cast_out(dq, dtype), dk, dv
