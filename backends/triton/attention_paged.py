"""``attention_paged`` on Triton with the keys split over programs (contract ``attention`` v2).

The arithmetic per query row is ``attention.py``'s (its module docstring); what changes is who does
it. Every quantity that crosses keys is an integer maximum or an integer sum, so the context of a
sequence is cut into ``n_split`` ranges of whole key tiles, one program each, merged exactly:

1. ``_stats_kernel`` (pass 1 over one range): the R5 row max as an int32 order key, the max key over
   allowed keys with a non-zero V row, the max V row exponent, the NaN-score and non-finite-V flags,
   written to this split's own int64 slots of the accumulator (offset so that 0, the zero-fill, is
   neutral); the readers take the integer maxima over the splits' slots; the fp32
   scores of the live rows go to a scratch (``STORE_S``) so pass 2 need not remake K's digits.
2. ``_sums_kernel`` (pass 2 over the same range): ``ref``, ``e_l``, ``E`` from the merged maxima;
   ``L``, ``O_hi``, ``O_lo`` as exact int64 sums, merged with ``atomic_add``; the NaN-p flag as a
   count, also by ``atomic_add``. No integer ``atomic_max``: it is a compare-and-swap loop on gfx90a.
   Within a split, ``O_hi``/``O_lo`` are int32 digit-product levels (int8 path) or fp64 sums of at
   most ``F64_KEYS`` keys (fp64 path, attention.py's docstring), both exact, folded once.
3. ``_finish_kernel``: ``RN32(O 2**(E - 60)) ÷ RN32(L 2**(e_l - 40))``, NaN flags, cast.

On targets with ``attention_rows_max`` (CUDA: 4), blocks of at most that many packed rows (decode)
run attention_rows.py's CUDA-core versions of the first two kernels instead: the same integers into
the same slots (attention_split.py), the same ``_finish_kernel``.

Integer maxima and integer sums do not depend on the order or grouping of their terms, so the
split count, the key tiling, the paging and the batch position cannot change a bit. The split count
comes from shapes only (block-table columns x block size, query blocks x sequences x KV heads, the
SM count), so the launch is CUDA-graph capturable: no host read of ``seq_lens_k``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, cdiv, f32_bits, next_pow2, on_device
from .attention import (
    F64_KEYS,
    _dot9_levels,
    _fold5,
    _key_rows,
    _p_grids,
    _p_grids_f64,
    _p_tile,
    _pv_f64,
    _q_rows,
    _row_ref,
    _score_tile,
    _tiles,
    _v_row_stats,
    _v_tile_digits,
    check_head_dim,
)
from .attention_rows import _rows_stats_kernel, _rows_sums_kernel
from .attention_split import (
    _C_L,
    _C_PBAD,
    _EXTRA_N,
    _STATS_N,
    _add_sums,
    _merged_stats,
    _split_range,
    _store_stats,
)
from .targets import TritonTarget

#: interpreter tests: one key tile per split (many splits at small contexts)
SMALL_SPLITS = False
#: pass 1 stores the scores for pass 2 when the scratch (Tq * Hq * max_keys fp32) is at most this
STORE_S_MAX_BYTES = 512 << 20
#: the key step of attention_rows.py's kernels: 8 keys over 2 lanes x 4 warps, one key row (8
#: head-dim elements a thread) each
ROWS_BLOCK_N = 8
#: interpreter tests of the matrix-unit kernels at decode shapes turn the rows kernels off
ROWS_OFF = False

@triton.jit
def _stats_kernel(q_ptr, k_ptr, v_ptr, s_ptr, acc_ptr, cu_q_ptr, lens_k_ptr, table_ptr,
                  sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, table_stride, block_size, D, group, hq, scale_bits,
                  n_split, keys_per_split, s_stride, acc_stride,
                  STORE_S: tl.constexpr, CAUSAL: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, F64: tl.constexpr):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    g = tl.program_id(2) // n_split  # KV head; its `group` query heads share the program (GQA packing)
    split = tl.program_id(2) % n_split
    q0, lq, lk, j_lo, j_hi = _split_range(b, mb, split, cu_q_ptr, lens_k_ptr, keys_per_split, group,
                                          CAUSAL, BLOCK_M)
    if j_lo < j_hi:
        scale = scale_bits.to(tl.float32, bitcast=True)
        qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad = _q_rows(
            q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M, BLOCK_D, F64)
        if CAUSAL:
            limit = lk - lq + qi
        else:
            limit = qi * 0 + lk - 1
        grow = (q0 + qi) * hq + hh
        rn = tl.arange(0, BLOCK_N)
        best = tl.full([BLOCK_M], -2147483647, tl.int32)
        best_c = tl.full([BLOCK_M], -2147483647, tl.int32)
        nanf = tl.zeros([BLOCK_M], tl.int32)
        e_big = tl.full([BLOCK_M], -1073741824, tl.int32)
        vbad_any = tl.zeros([BLOCK_M], tl.int32)
        for j0 in range(j_lo, j_hi, BLOCK_N):
            pos = j0 + rn
            pos_ok = pos < lk
            rows = _key_rows(b, pos, pos_ok, 0, table_ptr, table_stride, block_size, True)
            s = _score_tile(k_ptr, rows, pos_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale,
                            BLOCK_M, BLOCK_N, F64)
            if STORE_S:
                tl.store(s_ptr + grow[:, None] * s_stride + pos[None, :], s, mask=q_ok[:, None] & pos_ok[None, :])
            allowed = q_ok[:, None] & pos_ok[None, :] & (pos[None, :] <= limit[:, None])
            nan = E.is_nan(s)
            best = tl.maximum(best, tl.max(tl.where(allowed & ~nan, E.max_key(s), -2147483647), axis=1))
            nanf = tl.maximum(nanf, tl.max((allowed & nan).to(tl.int32), axis=1))
            vtop, vbad, ev = _v_row_stats(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok)
            contrib = allowed & (vtop != 0)[None, :]
            best_c = tl.maximum(best_c, tl.max(tl.where(contrib & ~nan, E.max_key(s), -2147483647), axis=1))
            e_big = tl.maximum(e_big, tl.max(tl.where(contrib, ev[None, :], -1073741824), axis=1))
            vbad_any = tl.maximum(vbad_any, tl.max((allowed & vbad[None, :]).to(tl.int32), axis=1))
        _store_stats(acc_ptr, grow, q_ok, acc_stride, split, best, best_c, nanf, e_big, vbad_any, BLOCK_D)


@triton.jit
def _sums_kernel(q_ptr, k_ptr, v_ptr, s_ptr, acc_ptr, cu_q_ptr, lens_k_ptr, table_ptr,
                 sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, table_stride, block_size, D, group, hq, scale_bits,
                 n_split, keys_per_split, s_stride, acc_stride,
                 STORE_S: tl.constexpr, CAUSAL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, F64: tl.constexpr):
    mb = tl.program_id(0)
    b = tl.program_id(1)
    g = tl.program_id(2) // n_split
    split = tl.program_id(2) % n_split
    q0, lq, lk, j_lo, j_hi = _split_range(b, mb, split, cu_q_ptr, lens_k_ptr, keys_per_split, group,
                                          CAUSAL, BLOCK_M)
    if j_lo < j_hi:
        scale = scale_bits.to(tl.float32, bitcast=True)
        if STORE_S:
            row = mb * BLOCK_M + tl.arange(0, BLOCK_M)
            qi = row // group
            hh = g * group + row % group
            q_ok = qi < lq
            rd = tl.arange(0, BLOCK_D)
            d_ok = rd < D
        else:
            qi, hh, q_ok, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad = _q_rows(
                q_ptr, q0, lq, mb, g, group, sq_t, sq_h, D, BLOCK_M, BLOCK_D, F64)
        if CAUSAL:
            limit = lk - lq + qi
        else:
            limit = qi * 0 + lk - 1
        grow = (q0 + qi) * hq + hh
        best, best_c, nanf, e_big, vbad_any = _merged_stats(acc_ptr, grow, q_ok, acc_stride, n_split, BLOCK_D)
        ref, e_l, e_row = _row_ref(best, best_c, nanf, e_big)
        rn = tl.arange(0, BLOCK_N)
        big_l = tl.zeros([BLOCK_M], tl.int64)
        pbad = tl.zeros([BLOCK_M], tl.int32)
        # O_hi and O_lo as five int32 digit-product levels each, or (F64) as one fp64 accumulator each,
        # folded once after the range (_splits keeps a split's keys within the exact range of both)
        h0 = tl.zeros([BLOCK_M, BLOCK_D], tl.int32)
        h1, h2, h3, h4 = h0, h0, h0, h0
        l0, l1, l2, l3, l4 = h0, h0, h0, h0, h0
        f_hi = tl.zeros([BLOCK_M, BLOCK_D], tl.float64)
        f_lo = f_hi
        for j0 in range(j_lo, j_hi, BLOCK_N):
            pos = j0 + rn
            pos_ok = pos < lk
            rows = _key_rows(b, pos, pos_ok, 0, table_ptr, table_stride, block_size, True)
            if STORE_S:
                s = tl.load(s_ptr + grow[:, None] * s_stride + pos[None, :], mask=q_ok[:, None] & pos_ok[None, :],
                            other=0.0)
            else:
                s = _score_tile(k_ptr, rows, pos_ok, g, sk_t, sk_h, rd, d_ok, qd0, qd1, qd2, eq_safe, q_bad, scale,
                                BLOCK_M, BLOCK_N, F64)
            allowed = q_ok[:, None] & pos_ok[None, :] & (pos[None, :] <= limit[:, None])
            p, dbad = _p_tile(s, allowed, ref)
            ev, v_bad, v_zero, vd0, vd1, vd2 = _v_tile_digits(v_ptr, rows, pos_ok, g, sv_t, sv_h, rd, d_ok, F64)
            pbad = tl.maximum(pbad, dbad)
            if F64:
                dl, r_hi, r_lo = _p_grids_f64(p, allowed, e_l, e_row, ev, v_zero)
                f_hi, f_lo = _pv_f64(r_hi, r_lo, vd0, f_hi, f_lo)
            else:
                dl, r = _p_grids(p, allowed, e_l, e_row, ev, v_zero)
                hd0, hd1, hd2 = E.split3((r >> 20).to(tl.int32))
                h0, h1, h2, h3, h4 = _dot9_levels(hd0, hd1, hd2, vd0, vd1, vd2, h0, h1, h2, h3, h4)
                ld0, ld1, ld2 = E.split3((r & 1048575).to(tl.int32))
                l0, l1, l2, l3, l4 = _dot9_levels(ld0, ld1, ld2, vd0, vd1, vd2, l0, l1, l2, l3, l4)
            big_l += dl
        if F64:
            o_hi = f_hi.to(tl.int64)
            o_lo = f_lo.to(tl.int64)
        else:
            o_hi = _fold5(h0, h1, h2, h3, h4)
            o_lo = _fold5(l0, l1, l2, l3, l4)
        _add_sums(acc_ptr, grow, q_ok, rd, d_ok, acc_stride, o_hi, o_lo, big_l, pbad, BLOCK_D)


@triton.jit
def _finish_kernel(acc_ptr, o_ptr, n_rows, hq, so_t, so_h, D, acc_stride, n_split,
                   OUT: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    grow = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
    ok = grow < n_rows
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    best, best_c, nanf, e_big, vbad_any = _merged_stats(acc_ptr, grow, ok, acc_stride, n_split, BLOCK_D)
    ref, e_l, e_row = _row_ref(best, best_c, nanf, e_big)
    base = acc_ptr + grow * acc_stride
    od = ok[:, None] & d_ok[None, :]
    o_hi = tl.load(base[:, None] + rd[None, :], mask=od, other=0)
    o_lo = tl.load(base[:, None] + BLOCK_D + rd[None, :], mask=od, other=0)
    big_l = tl.load(base + 2 * BLOCK_D + _C_L, mask=ok, other=0)
    pbad = tl.load(base + 2 * BLOCK_D + _C_PBAD, mask=ok, other=0)
    num = E.int2_to_out(o_hi, o_lo, 20, (e_row - 60)[:, None], 0)
    den = E.int64_to_out(big_l, e_l - 40, 0)
    out = tl.math.div_rn(num, den[:, None])
    bad = (pbad != 0) | (vbad_any != 0)
    out = tl.where(bad[:, None], E.canonical_nan_f32(out), out)
    t = grow // hq
    h = grow % hq
    tl.store(o_ptr + t[:, None] * so_t + h[:, None] * so_h + rd[None, :], E.cast_out(out, OUT), mask=od)


def _splits(n_tiles: int, bn: int, programs: int, device: torch.device, target: TritonTarget) -> tuple[int, int]:
    """(n_split, key tiles per split) from shapes: about ``split_k_waves`` programs per SM, and at
    most as many tiles per split as its accumulators hold exactly: int32 digit-product levels
    (``_dot9_levels``: one tile's level is at most ``3 * bn * 64**2``) or fp64 sums of at most
    ``F64_KEYS`` keys (``_pv_f64``)."""
    if SMALL_SPLITS:
        return n_tiles, 1
    max_tiles = F64_KEYS // bn if target.attention_f64 else (2**31 - 1) // (3 * bn * 64 * 64)
    # ROCm builds of torch present AMD GPUs as "cuda" devices; multi_processor_count is then the CU count
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2
    want = max(1, min(n_tiles, cdiv(target.split_k_waves * sms, max(1, programs))),
               cdiv(n_tiles, max_tiles))
    per = cdiv(n_tiles, want)
    return cdiv(n_tiles, per), per


def attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens_k: torch.Tensor, cu_seqlens_q: torch.Tensor, scale: float | None = None,
                    causal: bool = True, *, target: TritonTarget) -> torch.Tensor:
    """Kernel ``attention_paged``: k/v cache [num_blocks, block_size, Hkv, D] read through ``block_table``.

    q [Tq, Hq, D] (bf16/fp16, last axis contiguous); ``block_table`` [B, max_blocks] (int32/int64),
    ``seq_lens_k`` [B], ``cu_seqlens_q`` [B + 1]. Returns [Tq, Hq, D] in q's dtype.

    Bitwise semantics
    -----------------
    The contract's (``attention`` v2): every cross-key quantity is an integer maximum or an exact
    integer sum, merged across the key splits (sums by integer atomics, maxima over each split's
    written slots), so the split count (shapes
    only) cannot change a bit.
    """
    q = q if q.stride(-1) == 1 else q.contiguous()
    nb, bs, hkv, d = k_cache.shape
    check_head_dim("attention_paged", d, target)
    if nb * bs > 2**32 - 1:
        raise ValueError(f"attention_paged: the cache holds {nb} blocks x {bs} slots = {nb * bs} token slots; the "
                         f"kernels index at most 2**32 - 1 (32-bit block-table arithmetic); use a smaller cache")
    kc = k_cache.contiguous().view(nb * bs, hkv, d)  # rows = block * block_size + slot
    vc = v_cache.contiguous().view(nb * bs, hkv, d)
    cu_q, lens, table = (on_device(t, q.device) for t in (cu_seqlens_q, seq_lens_k, block_table))
    dispatch.note_kernel("triton-paged")
    tq, hq, _ = q.shape
    out = torch.empty((tq, hq, d), dtype=q.dtype, device=q.device)
    n_seq = cu_q.shape[0] - 1
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # (the device test first: a CPU-only torch, as under the Triton interpreter, raises here)
        # a capture cannot read cu_q on the host; the caller promises non-empty segments
        # (rlkernel.ops.attention_paged's docstring), so the longest is <= Tq - B + 1
        max_lq = tq - n_seq + 1
    else:
        cq = [int(x) for x in cu_q.tolist()]
        max_lq = max((cq[i + 1] - cq[i] for i in range(n_seq)), default=0)
    if tq == 0 or n_seq == 0 or max_lq == 0:
        return out
    if scale is None:
        from rlkernel.backends.generic.attention import default_scale

        scale = default_scale(d)
    group = hq // hkv
    bm, bn, bd, warps = _tiles(d, max_lq * group, target)
    rows_path = target.attention_f64 and max_lq * group <= target.attention_rows_max and not ROWS_OFF
    if rows_path:  # decode: the few packed rows of a block on the fp64 CUDA cores (_rows_stats_kernel)
        bm, bn, warps = next_pow2(max_lq * group), ROWS_BLOCK_N, target.attention_warps
    max_keys = table.shape[1] * bs
    n_tiles = max(1, cdiv(max_keys, bn))
    m_blocks = cdiv(max_lq * group, bm)
    n_split, per = _splits(n_tiles, bn, m_blocks * n_seq * hkv, q.device, target)
    s_width = n_tiles * bn
    store_s = tq * hq * s_width * 4 <= STORE_S_MAX_BYTES
    acc_w = 2 * bd + _EXTRA_N + n_split * _STATS_N
    acc = torch.zeros((tq * hq, acc_w), dtype=torch.int64, device=q.device)
    scores = torch.empty((tq * hq, s_width) if store_s else (1,), dtype=torch.float32, device=q.device)
    args = (q, kc, vc, scores, acc, cu_q, lens, table,
            q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
            table.stride(0), bs, d, group, hq, f32_bits(scale), n_split, per * bn, s_width, acc_w)
    consts = {"STORE_S": store_s, "CAUSAL": causal, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": bd}
    grid = (m_blocks, n_seq, hkv * n_split)
    if rows_path:
        _rows_stats_kernel[grid](*args, **consts, num_warps=warps, num_stages=target.attention_paged_stages,
                                 **LAUNCH)
        _rows_sums_kernel[grid](*args, **consts, num_warps=warps, num_stages=target.attention_paged_stages,
                                **LAUNCH)
    else:
        consts["F64"] = target.attention_f64
        _stats_kernel[grid](*args, **consts, num_warps=warps, num_stages=target.attention_paged_stages, **LAUNCH)
        _sums_kernel[grid](*args, **consts, num_warps=max(warps, target.attention_sums_warps),
                           num_stages=target.attention_paged_stages, **LAUNCH)
    br = 16
    _finish_kernel[(cdiv(tq * hq, br),)](acc, out, tq * hq, hq, out.stride(0), out.stride(1), d, acc_w, n_split,
                                               OUT=OUT_CODE[q.dtype], BLOCK_R=br, BLOCK_D=bd,
                                               num_warps=4, **LAUNCH)
    return out


def static_specs(target: TritonTarget):
    options = {"num_warps": target.attention_warps, "num_stages": target.attention_paged_stages}
    sums_options = dict(options, num_warps=max(target.attention_warps, target.attention_sums_warps))
    specs = []
    for dt in ("bf16", "fp16"):
        sig = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "s_ptr": "*fp32", "acc_ptr": "*i64",
               "cu_q_ptr": "*i32", "lens_k_ptr": "*i32", "table_ptr": "*i32",
               "sq_t": "i64", "sq_h": "i64", "sk_t": "i64", "sk_h": "i64", "sv_t": "i64", "sv_h": "i64",
               "table_stride": "i64", "block_size": "i32", "D": "i32", "group": "i32", "hq": "i32",
               "scale_bits": "i32", "n_split": "i32", "keys_per_split": "i32", "s_stride": "i32",
               "acc_stride": "i32", "STORE_S": "constexpr", "CAUSAL": "constexpr", "BLOCK_M": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_D": "constexpr", "F64": "constexpr"}
        for store_s in (True, False):
            for bm in (16, _tiles(128, 64, target)[0]):  # decode blocks, and chunked prefill through the cache
                consts = {"STORE_S": store_s, "CAUSAL": True, "BLOCK_M": bm, "BLOCK_N": 32, "BLOCK_D": 128,
                          "F64": target.attention_f64}
                tag = f"{dt}_d128_m{bm}" + ("" if store_s else "_recompute")
                specs.append(("attention_paged", f"stats_{tag}", _stats_kernel, sig, consts, options))
                specs.append(("attention_paged", f"sums_{tag}", _sums_kernel, sig, consts, sums_options))
        rows_sig = {k: v for k, v in sig.items() if k != "F64"}
        for store_s in (True, False):
            for bm in (2, 4):  # decode of GQA groups of 2 (Qwen3-0.6B) and 4 (Qwen3-8B)
                consts = {"STORE_S": store_s, "CAUSAL": True, "BLOCK_M": bm, "BLOCK_N": ROWS_BLOCK_N, "BLOCK_D": 128}
                tag = f"{dt}_d128_r{bm}" + ("" if store_s else "_recompute")
                if target.attention_f64 and bm <= target.attention_rows_max:
                    specs.append(("attention_paged", f"rows_stats_{tag}", _rows_stats_kernel, rows_sig, consts,
                                  options))
                    specs.append(("attention_paged", f"rows_sums_{tag}", _rows_sums_kernel, rows_sig, consts,
                                  options))
        specs.append(("attention_paged", f"finish_{dt}_d128", _finish_kernel,
                      {"acc_ptr": "*i64", "o_ptr": f"*{dt}", "n_rows": "i32", "hq": "i32", "so_t": "i64",
                       "so_h": "i64", "D": "i32", "acc_stride": "i32", "n_split": "i32", "OUT": "constexpr",
                       "BLOCK_R": "constexpr",
                       "BLOCK_D": "constexpr"},
                      {"OUT": 1 if dt == "bf16" else 2, "BLOCK_R": 16, "BLOCK_D": 128}, {"num_warps": 4}))
    return specs
