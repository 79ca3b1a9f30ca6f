"""``attention_backward`` on Triton: the generic backward with its dS / pn step and products as kernels.

Contract ``attention_backward`` v1. The batching of sequences and KV heads (zero-padded, sorted by
length) is the device-generic implementation's (``backends/generic/attention_backward.py``); its
:class:`Steps` hooks run here as two kernels. ``ds_and_p``, the largest tensors of the backward
(``[n H, G, LQ, LK]``: the scores, probabilities, dP and dS of a batch), is ``_abw_ds_kernel``, one
program per (block of packed query rows, sequence, KV head) as ``attention``'s forward kernel,
whose tile pieces it calls:

- the scores of passes 1-3 are the forward's ``_score_tile`` (fp64 products on targets with
  ``attention_f64``, int8 digit products elsewhere; the same bits, attention.py's docstring);
- pass 1 over the allowed keys: the forward's maxima (``_pass_maxima``: the R5 row max, the
  reference max over keys with a non-zero V row, the non-finite V flag) -> ``ref``, ``e_l``;
- pass 2: ``p = exp_c(s - ref)`` again and ``L = sum RNE(p * 2**(40 - e_l))`` (int64), the forward's
  denominator ``l = RN32(L * 2**(e_l - 40))``; NaN-p flags;
- per row: ``D = RN32(dO . O)``, dO on its 28-bit grid, O on its 21-bit grid, the exact int64 dot;
- pass 3 per key tile: ``pn = p ÷ l`` (IEEE division), ``dP = RN32(dO . V)`` as twelve int8
  digit products (four balanced base-128 digits of dO, three of V; every level below 2**22 in
  int32) folded into int64 and rounded once; ``dS = RN32(pn * RN32(dP - D))``; both cast to q's
  dtype (NaN at the allowed pairs of a bad row) and stored into the batch's zeroed buffers.

``grad_q`` and ``grad_kv`` (dQ = scale dS K, dK = scale dS^T Q, dV = pn^T dO) are
``_abw_product_kernel``, one launch per product over every KV head of the batch: the row exponents
of both operands over all of K, then twelve int8 digit products per K tile (the dS / pn operand's
28-bit grid in four digits, the K / Q / dO operand's 21-bit grid in three, made in registers from
the bf16/fp16 tensors through any strides) into six int32 levels (exact over the contract's
65 535-term reductions), one int64 fold and one rounding with the scale's significand.

Every sum is an integer sum and every step is per row or per pair, so the bits are those of the
generic steps (the conformance suite checks both against the golden hashes). Why: the generic
backward is ~2.3 k torch operations a batch (``tools/attention_backward_ops.py``), each ~10 us of
host time on the H200 (profile at e028916, 1 layer, 2 x 64 tokens: 85 ms of host time in this
backward against 2.5 ms of kernels; 25 ms with the dS kernel alone at f89c4f6).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel.backends.generic import attention_backward as _generic

from . import _tl_exact as E
from . import attention as _attention
from ._common import LAUNCH, OUT_CODE, cdiv, f32_bits
from .attention import _key_scores, _p_tile, _pass_maxima, _q_block, _row_digits, _tiles, check_head_dim
from .targets import TritonTarget

#: (BLOCK_M, BLOCK_N, BLOCK_K, warps) of the gradient products (six int32 level tiles live in registers)
PRODUCT_TILE = (32, 64, 32, 4)
#: under the interpreter's small tiles: several tiles of M, N and K
PRODUCT_SMALL_TILE = (16, 16, 32, 1)


@triton.jit
def _dot12(a0, a1, a2, a3, b0, b1, b2, BM: tl.constexpr, BN: tl.constexpr):
    """Exact int64 ``A @ B`` from four int8 digits of A ``[BM, K]`` and three of B ``[K, BN]``."""
    z = tl.zeros([BM, BN], tl.int32)
    l0, l1, l2, l3, l4, l5 = E.levels12(a0, a1, a2, a3, b0, b1, b2, z, z, z, z, z, z)
    return E.fold6(l0, l1, l2, l3, l4, l5)


@triton.jit
def _row_grid(x_ptr, t, hh, q_ok, s_t, s_h, rd, d_ok, BITS: tl.constexpr):
    """Rows ``(t, hh)`` of a [T, H, D] tensor on their grids of ``BITS + 1`` signed bits: (int32 grid
    values [M, D], exponents [M] (P1 of the largest finite magnitude, 0 for a zero row), non-finite flags [M])."""
    x = E.upcast(tl.load(x_ptr + t[:, None] * s_t + hh[:, None] * s_h + rd[None, :],
                         mask=q_ok[:, None] & d_ok[None, :], other=0.0))
    fin = E.is_finite(x)
    e = E.expo_from_abs_bits(tl.max(tl.where(fin, E.abs_bits(x), 0), axis=1))
    bad = tl.max((~fin).to(tl.int32), axis=1) != 0
    return E.grid_int_bits(x, e[:, None], BITS), e, bad


@triton.jit
def _key_tile(k_ptr, j0, rn, k0, lk, limit, q_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, ref,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, F64: tl.constexpr):
    """The key tile at ``j0`` of the q rows: (positions, in-sequence mask, key rows, allowed pairs,
    ``p = exp_c(s - ref)`` (0 where not allowed or NaN), NaN-p row flags)."""
    # keys contiguous per sequence: the forward's key tile with no block table (b, table unused)
    pos_ok, rows, s, allowed = _key_scores(k_ptr, 0, j0, rn, k0, lk, limit, q_ok, k_ptr, 0, 1, g, sk_t, sk_h, rd,
                                           d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, False, BLOCK_M, BLOCK_N, F64)
    p, pbad = _p_tile(s, allowed, ref)
    return j0 + rn, pos_ok, rows, allowed, p, pbad


# the per-batch sizes are never specialised: each value (divisible by 16 or not, equal to 1 or not)
# would be a compile of its own (~15-20 s each on the H200: a cold conformance run timed out on them)
@triton.jit(do_not_specialize=["g0", "n_heads", "LQ", "LK"])
def _abw_ds_kernel(q_ptr, k_ptr, v_ptr, do_ptr, o_ptr, seq_ptr, ds_ptr, p_ptr, bad_ptr,
                   sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sdo_t, sdo_h, so_t, so_h,
                   g0, n_heads, LQ, LK, D, group, scale_bits,
                   CAUSAL: tl.constexpr, OUT: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, F64: tl.constexpr):
    mb = tl.program_id(0)
    i = tl.program_id(1)  # sequence of the batch
    gl = tl.program_id(2)  # KV head of the batch; its `group` query heads share the program
    g = g0 + gl
    q0 = tl.load(seq_ptr + 4 * i)
    lq = tl.load(seq_ptr + 4 * i + 1) - q0
    k0 = tl.load(seq_ptr + 4 * i + 2)
    lk = tl.load(seq_ptr + 4 * i + 3) - k0
    if mb * BLOCK_M < lq * group:
        scale = scale_bits.to(tl.float32, bitcast=True)
        qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, limit, kv_end = _q_block(
            q_ptr, q0, lq, lk, mb, g, group, sq_t, sq_h, D, CAUSAL, BLOCK_M, BLOCK_D, F64)
        rn = tl.arange(0, BLOCK_N)
        dummy = seq_ptr

        # ---- pass 1: the forward's maxima -> ref, e_l -------------------------------------------
        ref, e_l, e_row, vbad_any = _pass_maxima(
            k_ptr, v_ptr, i, k0, lk, kv_end, limit, q_ok, rn, dummy, 0, 1, g, sk_t, sk_h,
            sv_t, sv_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, False, BLOCK_M, BLOCK_N, F64)

        # ---- pass 2: the forward's denominator l = RN32(L 2**(e_l - 40)) --------------------------
        big_l = tl.zeros([BLOCK_M], tl.int64)
        pbad = tl.zeros([BLOCK_M], tl.int32)
        for j0 in range(0, kv_end, BLOCK_N):
            pos, pos_ok, rows, allowed, p, tbad = _key_tile(
                k_ptr, j0, rn, k0, lk, limit, q_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, ref,
                BLOCK_M, BLOCK_N, F64)
            big_l += tl.sum(tl.where(allowed, E.to_fixed(p, e_l[:, None], 40), 0), axis=1)
            pbad = tl.maximum(pbad, tbad)
        den = E.int64_to_out(big_l, e_l - 40, 0)

        # ---- D = RN32(dO . O): dO rows on 28-bit grids, O rows on 21-bit grids, one exact dot ----
        t = (q0 + qi).to(tl.int64)
        gdo, e_do, do_bad = _row_grid(do_ptr, t, hh, q_ok, sdo_t, sdo_h, rd, d_ok, 27)
        go, e_o, o_bad = _row_grid(o_ptr, t, hh, q_ok, so_t, so_h, rd, d_ok, 20)
        c_d = tl.sum(gdo.to(tl.int64) * go.to(tl.int64), axis=1)
        delta = E.int64_to_out(c_d, e_do + e_o - 47, 0)
        bad = (pbad != 0) | (vbad_any != 0) | do_bad | o_bad
        a0, a1, a2, a3 = E.split4(gdo)

        # ---- pass 3: pn, dP, dS per key tile, stored in q's dtype ---------------------------------
        row_out = ((i * n_heads + gl) * group + hh % group).to(tl.int64) * LQ + qi  # [M] rows of [n H G, LQ]
        for j0 in range(0, kv_end, BLOCK_N):
            pos, pos_ok, rows, allowed, p, _ = _key_tile(
                k_ptr, j0, rn, k0, lk, limit, q_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale, ref,
                BLOCK_M, BLOCK_N, F64)
            pn = tl.math.div_rn(p, den[:, None])
            vt = E.upcast(tl.load(v_ptr + rows[None, :] * sv_t + g * sv_h + rd[:, None],
                                  mask=pos_ok[None, :] & d_ok[:, None], other=0.0))  # [D, N]
            ev, v_bad, v_zero, b0, b1, b2 = _row_digits(vt, 0)
            c = _dot12(a0, a1, a2, a3, b0, b1, b2, BLOCK_M, BLOCK_N)
            dp = E.int64_to_out(c, e_do[:, None] + ev[None, :] - 47, 0)
            ds = pn * (dp - delta[:, None])
            keep = allowed & ~bad[:, None]
            nan = E.canonical_nan_f32(ds)
            ds = tl.where(keep, ds, tl.where(allowed, nan, 0.0))
            pn = tl.where(keep, pn, tl.where(allowed, nan, 0.0))
            offs = row_out[:, None] * LK + pos[None, :]
            mask = q_ok[:, None] & pos_ok[None, :]
            tl.store(ds_ptr + offs, E.cast_out(ds, OUT), mask=mask)
            tl.store(p_ptr + offs, E.cast_out(pn, OUT), mask=mask)
        tl.store(bad_ptr + row_out, bad.to(tl.int8), mask=q_ok)


# sizes, strides and the scale are never specialised (see _abw_ds_kernel): a compile per dtype
@triton.jit(do_not_specialize=["sx_b", "sx_m", "sx_k", "sw_b", "sw_n", "sw_k", "M", "N", "K", "m_scale", "k_scale"])
def _abw_product_kernel(x_ptr, w_ptr, y_ptr, sx_b, sx_m, sx_k, sw_b, sw_n, sw_k, M, N, K, m_scale, k_scale,
                        OUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One ``[BLOCK_M, BLOCK_N]`` tile of ``y[b] = RN_OUT(m 2**ks X[b] @ W[b].T)``: X rows on 28-bit grids
    (four int8 digits), W rows on 21-bit grids (three), both made in registers from the bf16/fp16
    operands (any strides); y ``[B, M, N]`` contiguous, NaN rows where an X row holds NaN/inf."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    xp = x_ptr + b * sx_b + rm.to(tl.int64)[:, None] * sx_m
    wp = w_ptr + b * sw_b + rn.to(tl.int64)[:, None] * sw_n
    # the row exponents (P1 of the largest finite magnitude over all of K) and X's non-finite rows
    xtop = tl.zeros([BLOCK_M], tl.int32)
    xbad = tl.zeros([BLOCK_M], tl.int32)
    wtop = tl.zeros([BLOCK_N], tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = (k0 + rk).to(tl.int64)
        k_ok = kk < K
        x = E.upcast(tl.load(xp + kk[None, :] * sx_k, mask=m_ok[:, None] & k_ok[None, :], other=0.0))
        w = E.upcast(tl.load(wp + kk[None, :] * sw_k, mask=n_ok[:, None] & k_ok[None, :], other=0.0))
        xfin = E.is_finite(x)
        xtop = tl.maximum(xtop, tl.max(tl.where(xfin, E.abs_bits(x), 0), axis=1))
        xbad = tl.maximum(xbad, tl.max((~xfin).to(tl.int32), axis=1))
        wtop = tl.maximum(wtop, tl.max(tl.where(E.is_finite(w), E.abs_bits(w), 0), axis=1))
    ex = E.expo_from_abs_bits(xtop)
    ew = E.expo_from_abs_bits(wtop)
    # the exact product: 12 int8 digit products into six int32 levels (each below 3 * 64**2 * K < 2**31
    # for K <= 65535), folded into int64 once
    z = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    l0, l1, l2, l3, l4, l5 = z, z, z, z, z, z
    for k0 in range(0, K, BLOCK_K):
        kk = (k0 + rk).to(tl.int64)
        k_ok = kk < K
        x = E.upcast(tl.load(xp + kk[None, :] * sx_k, mask=m_ok[:, None] & k_ok[None, :], other=0.0))
        w = E.upcast(tl.load(wp + kk[None, :] * sw_k, mask=n_ok[:, None] & k_ok[None, :], other=0.0))
        a0, a1, a2, a3 = E.split4(E.grid_int_bits(x, ex[:, None], 27))
        b0, b1, b2 = E.split3(E.grid_int_bits(w, ew[:, None], 20))
        l0, l1, l2, l3, l4, l5 = E.levels12(a0, a1, a2, a3, tl.trans(b0), tl.trans(b1), tl.trans(b2),
                                            l0, l1, l2, l3, l4, l5)
    c = E.fold6(l0, l1, l2, l3, l4, l5)
    # RN_OUT(m c 2**(ex + ew - 47 + ks)): c = hi 2**32 + lo, each limb times m exactly, one rounding
    hi = (c >> 32) * m_scale
    lo = (c & 4294967295) * m_scale
    y = E.int2_to_out(hi, lo, 32, ex[:, None] + ew[None, :] - 47 + k_scale, OUT)
    y = tl.where((xbad != 0)[:, None], E.canonical_nan_f32(y), y)
    yp = y_ptr + (b * M + rm.to(tl.int64))[:, None] * N + rn[None, :]
    tl.store(yp, E.cast_out(y, OUT), mask=m_ok[:, None] & n_ok[None, :])


class TritonSteps(_generic.Steps):
    """The generic backward's steps on this module's kernels (``_abw_ds_kernel``,
    ``_abw_product_kernel``), for one target."""

    def __init__(self, target: TritonTarget) -> None:
        super().__init__()
        self.target = target

    def ds_and_p(self, seqs: list[tuple[int, int, int, int]], g0: int, g1: int, group: int, causal: bool,
                 q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor, out: torch.Tensor,
                 scale_value: float, big_q: int, big_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n, h, d = len(seqs), g1 - g0, q.shape[-1]
        check_head_dim("attention_backward", d, self.target)
        dev = q.device
        q, k, v, grad_out, out = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, grad_out, out))
        dsr = torch.zeros((n * h, group, big_q, big_k), dtype=q.dtype, device=dev)
        pr = torch.zeros_like(dsr)
        bad = torch.zeros((n * h, group, big_q), dtype=torch.int8, device=dev)
        # the spans as a device table without a stream wait: a pinned host copy, sent asynchronously
        table = torch.tensor([x for s in seqs for x in s], dtype=torch.int64, pin_memory=dev.type == "cuda")
        table = table.to(dev, non_blocking=True)
        bm, bn, bd, warps = _tiles(d, big_q * group, self.target)
        grid = (cdiv(big_q * group, bm), n, h)
        _abw_ds_kernel[grid](
            q, k, v, grad_out, out, table, dsr, pr, bad,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            grad_out.stride(0), grad_out.stride(1), out.stride(0), out.stride(1),
            g0, h, big_q, big_k, d, group, f32_bits(scale_value),
            CAUSAL=causal, OUT=OUT_CODE[q.dtype], BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd,
            F64=self.target.attention_f64, num_warps=warps, num_stages=self.target.attention_stages, **LAUNCH)
        return dsr, pr, bad.view(torch.bool)

    def _product(self, x: torch.Tensor, w: torch.Tensor, dtype: torch.dtype, scale: tuple[int, int]) -> torch.Tensor:
        """``RN_dtype(m 2**ks x @ w.T)`` per batch entry of x ``[B, M, K]`` and w ``[B, N, K]`` (any strides):
        ``[B, M, N]`` in dtype, NaN rows where an x row holds NaN/inf (the generic ``_grad_product``)."""
        nb, m, k = x.shape
        n = w.shape[1]
        y = torch.empty((nb, m, n), dtype=dtype, device=x.device)
        if y.numel() == 0:
            return y
        bm, bn, bk, warps = PRODUCT_SMALL_TILE if _attention.SMALL_TILES else PRODUCT_TILE
        grid = (cdiv(m, bm), cdiv(n, bn), nb)
        _abw_product_kernel[grid](x, w, y, x.stride(0), x.stride(1), x.stride(2), w.stride(0), w.stride(1),
                                  w.stride(2), m, n, k, scale[0], scale[1], OUT=OUT_CODE[dtype], BLOCK_M=bm,
                                  BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, **LAUNCH)
        return y

    def grad_q(self, ds: torch.Tensor, kk: torch.Tensor, dtype: torch.dtype,
               parts: tuple[int, int]) -> torch.Tensor:
        return self._product(ds, kk.transpose(1, 2), dtype, parts)

    def grad_kv(self, ds: torch.Tensor, pr: torch.Tensor, qg: torch.Tensor, do: torch.Tensor, dtype: torch.dtype,
                parts: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        nh, g, lq, lk = ds.shape
        d = qg.shape[-1]

        def rows(t: torch.Tensor, cols: int) -> torch.Tensor:  # [nH, G, LQ, C] -> [nH, C, G LQ] (a view)
            return t.reshape(nh, g * lq, cols).transpose(1, 2)

        return (self._product(rows(ds, lk), rows(qg, d), dtype, parts),
                self._product(rows(pr, lk), rows(do, d), dtype, (1, 0)))


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
                       causal: bool = True, *, target: TritonTarget) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel ``attention_backward``: the generic backward with :class:`TritonSteps` (arguments and
    results as :func:`rlkernel.backends.generic.attention_backward.attention_backward`)."""
    return _generic.backward_with(TritonSteps(target), grad_out, q, k, v, out, cu_seqlens_q, cu_seqlens_k, scale,
                                  causal)


def static_specs(target: TritonTarget):
    options = {"num_warps": target.attention_warps, "num_stages": target.attention_stages}
    sig = {name: "i64" for name in ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sdo_t", "sdo_h", "so_t", "so_h",
                                    "LQ", "LK")}
    sig.update({"g0": "i32", "n_heads": "i32", "D": "i32", "group": "i32", "scale_bits": "i32",
                "seq_ptr": "*i64", "bad_ptr": "*i8", "CAUSAL": "constexpr", "OUT": "constexpr",
                "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_D": "constexpr", "F64": "constexpr"})
    specs = []
    for dt, out in (("bf16", 1), ("fp16", 2)):
        typed = dict(sig, **{name: f"*{dt}" for name in ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "o_ptr", "ds_ptr",
                                                          "p_ptr")})
        bm, bn, bd, _ = _tiles(128, 256, target)
        specs.append(("attention_backward", f"{dt}_d128", _abw_ds_kernel, typed,
                      {"CAUSAL": True, "OUT": out, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd,
                       "F64": target.attention_f64}, options))
    name, _, fn, typed, consts, _ = specs[0]
    specs.append((name, "bf16_d128_noncausal", fn, typed, dict(consts, CAUSAL=False), options))
    specs.append((name, "bf16_d8", fn, typed, dict(consts, BLOCK_D=_tiles(8, 256, target)[2]), options))
    bm, bn, bk, warps = PRODUCT_TILE
    product = {name: "i64" for name in ("sx_b", "sx_m", "sx_k", "sw_b", "sw_n", "sw_k")}
    product.update({"M": "i32", "N": "i32", "K": "i32", "m_scale": "i32", "k_scale": "i32", "OUT": "constexpr",
                    "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"})
    for dt, out in (("bf16", 1), ("fp16", 2)):
        specs.append(("attention_backward", f"{dt}_products", _abw_product_kernel,
                      dict(product, x_ptr=f"*{dt}", w_ptr=f"*{dt}", y_ptr=f"*{dt}"),
                      {"OUT": out, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, {"num_warps": warps}))
    return specs
