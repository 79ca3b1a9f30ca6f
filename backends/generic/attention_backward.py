"""Device-generic exact ``attention_backward`` (contract ``attention_backward`` v1).

Independent of the contract reference. Per sequence and KV head the [G, lq, lk] block of the
G query heads is materialised (O(lq * lk) memory per KV head; blocks are visited one at a time):

* the forward's scores are recomputed with the forward kernel's own digit GEMM helpers, and its
  probabilities as the forward builds them (row max, reference max, ``exp_c``, the integer ``P``
  on the 2**-40 grid, the denominator ``L``), normalised ``pn = fp32(P) / fp32(L)``;
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

from rlkernel.backends.generic._exact.digits import digit_planes, grid_rows, int_product, row_exponents, split_digits
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
#: Magnitude bits of the 28-bit operand (dO; dS / pn rows) and of the 21-bit one (O, V; K, Q, dO columns).
X_BITS = 27
W_BITS = 20
X_DIGITS, W_DIGITS = 4, 3
#: Longest exact reduction of one product: |C| <= n * 2**47 < 2**63.
MAX_REDUCTION = (1 << 16) - 1
#: Limb split of C when the scale's significand multiplies it: |C_hi * M|, |C_lo * M| < 2**56.
SCALE_SPLIT = 32


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


def _round_once(c: torch.Tensor, k: torch.Tensor, dtype: torch.dtype, scale: tuple[int, int] | None) -> torch.Tensor:
    """``RN_dtype((M *) c * 2**k)`` in one rounding; with the scale: ``c = hi 2**32 + lo`` times M, two limbs."""
    if scale is None:
        return int64_to_float(c, k, dtype)
    m, ks = scale
    hi = (c >> SCALE_SPLIT) * m
    lo = (c & ((1 << SCALE_SPLIT) - 1)) * m
    return int64_pair_to_float(hi, lo, SCALE_SPLIT, k + ks, dtype)


def _product(x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype,
             scale: tuple[int, int] | None = None) -> torch.Tensor:
    """``RN_dtype(scale * x @ w.T)``: x [M, K] on 28-bit row grids, w [N, K] on 21-bit row grids.

    Non-finite entries read as 0; an x row holding NaN/inf gives a NaN output row.
    """
    ex, ew = row_exponents(x), row_exponents(w)
    c = int_product(digit_planes(x, ex, X_BITS, X_DIGITS), digit_planes(w, ew, W_BITS, W_DIGITS))
    y = _round_once(c, ex.unsqueeze(1) + ew.unsqueeze(0) - X_BITS - W_BITS, dtype, scale)
    bad = (~torch.isfinite(x)).any(dim=-1)
    return torch.where(bad.unsqueeze(1), float("nan"), y)


def _row_dot(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 ``RN32(sum_d X_d W_d)`` per row: x on 28-bit, w on 21-bit grids (int64, exact)."""
    ex, ew = row_exponents(x), row_exponents(w)
    c = (grid_rows(x, ex, X_BITS) * grid_rows(w, ew, W_BITS)).sum(dim=-1)
    return int64_to_float(c, ex + ew - X_BITS - W_BITS, torch.float32)


def _scores(q: torch.Tensor, k: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The forward's fp32 scores [G, lq, lk] of q [G, lq, D] against k [lk, D]."""
    eq, ek = row_exponents(q), row_exponents(k)
    qd = split_digits(grid_rows(q, eq, QK_GRID))  # [3, G, lq, D]
    kd = split_digits(grid_rows(k, ek, QK_GRID)).transpose(-1, -2)  # [3, D, lk]
    c = _level_matmul(qd, kd)
    shift = (eq.unsqueeze(-1) + ek - 2 * QK_GRID).clamp(min=-252)
    s = scale_pow2(int64_to_f32(c), shift) * scale
    bad = (~torch.isfinite(q)).any(dim=-1).unsqueeze(-1) | (~torch.isfinite(k)).any(dim=-1)
    return torch.where(bad, float("nan"), s)


def _probabilities(s: torch.Tensor, allowed: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's probabilities, normalised: (pn fp32 [G, lq, lk], bad rows [G, lq])."""
    finite = torch.isfinite(v)
    vzero = torch.where(finite, v, 0.0).abs().amax(dim=-1) == 0  # [lk]
    vbad = (~finite).any(dim=-1)
    m = torch.where(allowed, s, float("-inf")).amax(dim=-1) + 0.0
    contrib = allowed & ~vzero
    c = torch.where(contrib, s, float("-inf")).amax(dim=-1) + 0.0
    ref = torch.maximum(c, m - MAX_GAP)
    p = torch.where(allowed, exp_c(s - ref.unsqueeze(-1)), 0.0)
    bad = torch.isnan(p).any(dim=-1) | (allowed & vbad).any(dim=-1)
    top = exp_c(m - ref)
    e_l = torch.where(torch.isfinite(top), exponent(torch.where(torch.isfinite(top), top, 1.0)), 1)
    big_p = to_fixed(p, e_l.unsqueeze(-1), P_BITS)  # non-finite -> 0
    den = int64_to_float(big_p.sum(dim=-1), e_l - P_BITS, torch.float32)
    num = int64_to_float(big_p, (e_l - P_BITS).unsqueeze(-1), torch.float32)
    return num / den.unsqueeze(-1), bad


def _host_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
                       causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact gradients of ``attention`` in q, k, v (contract ``attention_backward`` v1).

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
    dev, dtype = q.device, q.dtype
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    # RN32 of the given scale (the public op has rounded it already; rounding again changes nothing)
    scale_value = default_scale(d) if scale is None else float(torch.tensor(float(scale), dtype=torch.float32))
    scale_t = torch.tensor(scale_value, dtype=torch.float32, device=dev)
    parts = _scale_parts(scale_value)
    cq, ck = _host_list(cu_seqlens_q), _host_list(cu_seqlens_k)
    dq = torch.zeros((tq, hq, d), dtype=dtype, device=dev)
    dk = torch.zeros((tk, hkv, d), dtype=dtype, device=dev)
    dv = torch.zeros((tk, hkv, d), dtype=dtype, device=dev)
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
        allowed = _causal_allowed(lq, lk, causal, dev)
        for g in range(hkv):
            heads = slice(g * group, (g + 1) * group)
            kk, vv = k[k0:k1, g], v[k0:k1, g]
            qg = q[q0:q1, heads].transpose(0, 1)  # [G, lq, D]
            do = grad_out[q0:q1, heads].transpose(0, 1).reshape(group * lq, d)
            o = out[q0:q1, heads].transpose(0, 1).reshape(group * lq, d)
            row_bad = ((~torch.isfinite(do)).any(dim=-1) | (~torch.isfinite(o)).any(dim=-1)).view(group, lq)
            if lk == 0:  # non-causal with no keys: the forward's rows are NaN
                dq[q0:q1, heads] = float("nan")
                continue
            pn, bad = _probabilities(_scores(qg, kk, scale_t), allowed, vv)
            bad = bad | row_bad
            dp = _product(do, vv, torch.float32).view(group, lq, lk)
            delta = _row_dot(do, o).view(group, lq, 1)
            ds = pn * (dp - delta)
            keep = allowed & ~bad.unsqueeze(-1)
            dsr = cast_out(torch.where(keep, ds, torch.where(allowed, float("nan"), 0.0)), dtype)
            pr = cast_out(torch.where(keep, pn, torch.where(allowed, float("nan"), 0.0)), dtype)
            gq = _product(dsr.reshape(group * lq, lk), kk.T, dtype, parts).view(group, lq, d)
            gq = torch.where(bad.unsqueeze(-1), float("nan"), gq)
            dq[q0:q1, heads] = cast_out(gq, dtype).transpose(0, 1)
            # dK, dV: one exact sum over every (query head, query) of the KV group
            dk[k0:k1, g] = cast_out(_product(dsr.reshape(group * lq, lk).T, qg.reshape(group * lq, d).T, dtype,
                                             parts), dtype)
            dv[k0:k1, g] = cast_out(_product(pr.reshape(group * lq, lk).T, do.T, dtype), dtype)
    return cast_out(dq, dtype), dk, dv
