"""``sample`` on Triton (contract ``sample`` v1): fused Philox Gumbel-max with exact top-k / top-p.

Four launches (two with the hint ``filtered`` False), no host reads of device values (CUDA-graph capturable):

- ``_sample_split_kernel``, grid (B, S): program (b, s) takes chunk s of row b's vocabulary
  (S from the shape only, so that B x S fills the GPU: B = 1 runs ~150 programs). Per token it
  forms the packed int64 ``(class << 50) | (order(score) << 18) | (2**18 - 1 - j)``: class 3 for
  a NaN z (the first NaN wins), 2 for +inf (the first +inf wins), 1 otherwise, with
  ``order`` the monotone 32-bit key of the fp32 score (-0 and +0 share one). The integer max
  is then the R5 argmax with ties to the lowest index, and an all -inf row gives token 0. The
  score is ``x`` (greedy rows), ``z + g`` (plain rows: Philox4x32-10 once per block of four
  tokens on a [BLOCK/4, 4] tile, ``g = -log_c(-log_c(u))``) or ``z`` (filtered rows: the pass
  gives the top-ranked token, the max and the special cases). Each program writes its winner
  to a [B, S] buffer (no atomics) and clears its share of the row's gather histogram (no memset).
- ``_sample_hist_kernel`` and ``_sample_gather_kernel``, grid (B, S), for the finite sampled rows
  with top-k ``k <= COMPACT`` or top-p alone (the others' programs return after three loads): a
  histogram of ``d = fl(m - z)`` (bins monotone in z, 8 a binade of d; int32 atomics, order-free)
  picks the leading bins holding at most COMPACT keys (a top-k row: only up to the bin reaching k),
  and the gather stores exactly those keys, the row's n largest, in any order. For top-p alone the
  hist kernel also writes each chunk's exact int64 sum of ``q`` (the row's total is their sum).
- ``_sample_finish_kernel``, grid (B,): the max of the row's S partials is the token of greedy,
  plain and special rows. A filtered row (0 < k < V or p < 1, finite max) has unique 50-bit rank
  keys ``(order(z) << 18) | (2**18 - 1 - j)``. It finishes in one register tile when the gathered
  keys hold its kept set: a top-k row with ``k <= n``, a top-p-alone row whose n keys' q sum reaches
  P (every key past them then has a q prefix >= P). The tile (SMALL_TILE or COMPACT keys, the
  smallest that holds n): keys sorted descending, the first k
  are the top-k survivors, the top-p cut is the first key whose inclusive prefix sum of ``q``
  (``q_j = RNE(exp_c(z_j - m) * 2**40)``) reaches P, Gumbel-max over the kept entries with Philox
  per entry. A top-k row with ``n < k <= COMPACT`` runs count passes (4 bits a pass, exact integer
  counts) until at most COMPACT keys lie at or above the window start, stores them and finishes in
  the same tile. Any other filtered row finds the top-k threshold (the k-th largest key) and the
  top-p threshold (the largest key c with ``sum q_j over survivors with key_j >= c >= P``) 4 bits a
  pass from exact counts / int64 sums (order-free), then draws the Gumbel-max over the kept keys
  in one more pass (Philox only in tiles holding a kept token). The same keys, sums and noise on
  every path, so the same token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, cdiv
from .targets import TritonTarget

MAX_VOCAB = 1 << 18
#: tokens per tile of the split kernel (a multiple of 4: one Philox block serves four tokens)
SPLIT_BLOCK = 1024
#: the split kernel aims at about this many programs in all (B x S): many short programs (a few
#: tiles each) keep the last wave on 132 SMs short
PROGRAMS = 4096
#: most programs per row (the finish kernel reads the row's partials as one tile of this size)
MAX_SPLITS = 256
#: tokens per tile of the filtered passes of the finish kernel
FILTER_BLOCK = 512
#: digit bits per selection pass, and the passes that cover the 50-bit rank key
DIGIT_BITS = 4
SELECT_PASSES = 13
#: most keys a filtered row finishes in one register tile (a power of two): top-k rows with a larger k
#: and rows whose gathered keys do not hold their top-k / top-p set run the selection passes
COMPACT = 4096
#: the smaller tile the finish sorts when at most this many keys were gathered (a top-k row gathers only
#: the leading bins that reach k): on an H100 a 4096-key sort took 118 us of a B 64 call, this one 12 us
SMALL_TILE = 1024
#: bins of the gather histogram (the last one, far from the row max, is never gathered) and their
#: edges: bin = (fp32 bits of d - bits of 2**-6) >> HIST_SHIFT, d = m - z, clamped to [0, NB - 1],
#: so 2**(23 - HIST_SHIFT) bins a binade of d (8: ~9 % of d wide; d >= 2**10 falls in the last bin), bin
#: 0 = d < 2**-6. Triton 3.6's tl.histogram costs ~log2(NB) + NB / 32 * log2(NB) instructions an element
#: (a ballot per bit, then each lane's NB / 32 bins): hist kernel 72 -> 35 us at 512 -> 128 bins (H100, B 64)
HIST_BINS = 128
HIST_SHIFT = 20
_HIST_BASE = tl.constexpr(121 << 23)  # fp32 bits of 2**-6

_M0 = tl.constexpr(0xD2511F53)
_M1 = tl.constexpr(0xCD9E8D57)
_W0 = tl.constexpr(0x9E3779B9)
_W1 = tl.constexpr(0xBB67AE85)
_IDX_BITS = tl.constexpr(18)
_IDX_MASK = tl.constexpr((1 << 18) - 1)
_CLASS_SHIFT = tl.constexpr(50)
_INF_KEY = tl.constexpr(0x7F800000)
_TWO_M24 = tl.constexpr(5.9604644775390625e-08)  # 2**-24, exact in fp32


@triton.jit
def _philox(ctr0, c1, c2, k0, k1):
    """Philox4x32-10 of counters ``(ctr0, c1, c2, 0)`` (uint32 tensor, scalars), key ``(k0, k1)``."""
    x0 = ctr0
    x1 = tl.zeros_like(ctr0) + c1
    x2 = tl.zeros_like(ctr0) + c2
    x3 = tl.zeros_like(ctr0)
    for i in tl.static_range(10):
        # (high, low) words of x0 * M0 and x2 * M1 from exact 64-bit products (inlined: the
        # interpreter pays per nested call)
        pa = x0.to(tl.uint64) * _M0
        pb = x2.to(tl.uint64) * _M1
        x0, x1, x2, x3 = ((pb >> 32).to(tl.uint32) ^ x1) ^ k0, pb.to(tl.uint32), ((pa >> 32).to(tl.uint32) ^ x3) ^ k1, \
            pa.to(tl.uint32)
        k0 = k0 + _W0
        k1 = k1 + _W1
    return x0, x1, x2, x3


@triton.jit
def _gumbel_tile(blk0, R: tl.constexpr, seed, pos):
    """Noise of the tokens ``4 * blk0 .. 4 * blk0 + 4R - 1`` as an fp32 [R, 4] tile (row-major)."""
    rr = tl.arange(0, R)
    cc = tl.arange(0, 4)[None, :]
    w0, w1, w2, w3 = _philox((blk0 + rr).to(tl.uint32), pos.to(tl.uint32), (pos >> 32).to(tl.uint32),
                             seed.to(tl.uint32), (seed >> 32).to(tl.uint32))
    r = tl.where(cc == 0, w0[:, None], tl.where(cc == 1, w1[:, None], tl.where(cc == 2, w2[:, None], w3[:, None])))
    return _noise_of(r)


@triton.jit
def _gumbel_at(j, seed, pos):
    """Noise of the tokens ``j`` (int64 tensor, any order): one Philox block per token, word ``j & 3``."""
    w0, w1, w2, w3 = _philox((j >> 2).to(tl.uint32), pos.to(tl.uint32), (pos >> 32).to(tl.uint32),
                             seed.to(tl.uint32), (seed >> 32).to(tl.uint32))
    c = j & 3
    return _noise_of(tl.where(c == 0, w0, tl.where(c == 1, w1, tl.where(c == 2, w2, w3))))


@triton.jit
def _noise_of(r):
    """``g = -log_c(-log_c(u))`` of the Philox words ``r`` (uint32), ``u = (2 * (r >> 9) + 1) * 2**-24``."""
    u = ((r >> 9) * 2 + 1).to(tl.int32).to(tl.float32) * _TWO_M24  # exact: an integer < 2**24 times 2**-24
    return -E.log_c(-E.log_c(u))


@triton.jit
def _order(s):
    """Monotone non-negative int64 key of non-NaN fp32 ``s`` (-0 == +0; -inf -> 0), < 2**32:
    ``max_key(s) + 0x7F800000`` (written out flat: the interpreter pays per nested call)."""
    b = s.to(tl.int32, bitcast=True)
    a = b & 0x7FFFFFFF
    return tl.where(b < 0, -a, a).to(tl.int64) + _INF_KEY


@triton.jit
def _rank_key(z, j):
    """The unique rank key ``(order(z) << 18) | (2**18 - 1 - j)``: larger = ranked earlier."""
    b = z.to(tl.int32, bitcast=True)
    a = b & 0x7FFFFFFF
    return ((tl.where(b < 0, -a, a).to(tl.int64) + _INF_KEY) << _IDX_BITS) | (_IDX_MASK - j.to(tl.int64))


@triton.jit
def _z_of_key(key):
    """The fp32 ``z`` of a rank key (up to the sign of a zero, which no later step sees: the rank key and
    ``exp_c(z - m)`` are the same for -0 and +0)."""
    o = (key >> _IDX_BITS) - _INF_KEY
    return tl.where(o < 0, 2147483648 - o, o).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _cut(total, pnum):
    """The top-p cut ``P = floor(total * pnum / 2**24)``, exact in int64 (total <= 2**58, pnum <= 2**24)."""
    return (total >> 24) * pnum + (((total & 0xFFFFFF) * pnum) >> 24)


@triton.jit
def _sample_split_kernel(x_ptr, stride_x, tau_ptr, k_ptr, p_ptr, seed_ptr, pos_ptr, part_ptr, hist_ptr, V, CHUNK, S,
                         BLOCK: tl.constexpr, NB: tl.constexpr, HZ: tl.constexpr):
    row = tl.program_id(0)
    sp = tl.program_id(1)
    # the row's gather histogram and count (NB + 1 int32) start at zero: program s clears entries s,
    # s + S, ... (HZ >= NB + 1 lanes cover them at S = 1); the hist kernel runs after this launch
    hz = sp + S * tl.arange(0, HZ)
    tl.store(hist_ptr + row.to(tl.int64) * (NB + 1) + hz, tl.zeros([HZ], tl.int32), mask=hz <= NB)
    tau = tl.load(tau_ptr + row)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    seed = tl.load(seed_ptr + row)
    pos = tl.load(pos_ptr + row)
    greedy = tau == 0.0
    filtered = ((k > 0) & (k < V)) | (p < 1.0)
    noise = (~greedy) & (~filtered)
    tau_safe = tl.where(greedy, 1.0, tau)
    x_row = x_ptr + row.to(tl.int64) * stride_x
    R: tl.constexpr = BLOCK // 4
    jt = tl.arange(0, R)[:, None] * 4 + tl.arange(0, 4)[None, :]
    best = tl.zeros([R, 4], tl.int64)
    start = sp * CHUNK
    end = tl.minimum(start + CHUNK, V)
    for off in range(start, end, BLOCK):
        j = off + jt
        mask = j < end
        x = E.upcast(tl.load(x_row + j, mask=mask, other=0.0))
        z = tl.where(greedy, x, tl.math.div_rn(x, tau_safe))
        if noise:
            s = z + _gumbel_tile(off // 4, R, seed, pos)
        else:
            s = z
        cls = tl.where(E.is_nan(z), 3, tl.where(E.f32_bits(z) == 0x7F800000, 2, 1)).to(tl.int64)
        packed = (cls << _CLASS_SHIFT) | tl.where(cls == 1, _order(s) << _IDX_BITS, 0) | (_IDX_MASK - j.to(tl.int64))
        best = tl.maximum(best, tl.where(mask, packed, 0))
    tl.store(part_ptr + row.to(tl.int64) * S + sp, tl.max(tl.max(best, axis=1), axis=0))


@triton.jit
def _digit_pass(x_row, V, tau, m, lo_key, L, shift, base, USE_Q: tl.constexpr, BLOCK: tl.constexpr,
                NC: tl.constexpr):
    """For the candidates ``c_d = L + (d << shift)``, d < NC: ``f(c_d)``, the count (USE_Q false)
    or the exact int64 sum of ``q = RNE(exp_c(z - m) * 2**40)`` (USE_Q) of the live tokens
    (``key >= lo_key``) with ``key >= c_d``; int64 [NC].

    Only the window ``L <= key < L + (NC << shift)`` is visited: the live tokens above it add
    ``base`` to every candidate (the caller knows it from the previous pass), those below add
    nothing, so a tile without a window token skips exp_c and the candidate compares.
    """
    cols = tl.arange(0, BLOCK)
    dd = tl.arange(0, NC).to(tl.int64)
    cand = L + (dd << shift)
    top = L + (tl.full([], NC, tl.int64) << shift)
    acc = tl.zeros([NC], tl.int64) + base
    for off in range(0, V, BLOCK):
        j = off + cols
        mask = j < V
        z = tl.math.div_rn(E.upcast(tl.load(x_row + j, mask=mask, other=0.0)), tau)
        key = _rank_key(z, j)
        win = mask & (key >= lo_key) & (key >= L) & (key < top)
        if tl.max(win.to(tl.int32), axis=0) != 0:
            if USE_Q:
                w = tl.where(win, E.to_fixed_abs(E.exp_c(z - m), 40), 0)  # z <= m: the top z
            else:
                w = win.to(tl.int64)
            acc += tl.sum(tl.where(key[:, None] >= cand[None, :], w[:, None], 0), axis=0)
    return acc


@triton.jit
def _select(x_row, V, tau, m, lo_key, target, pnum, USE_Q: tl.constexpr, BLOCK: tl.constexpr,
            DIGIT: tl.constexpr, PASSES: tl.constexpr):
    """The largest key c with ``f(c) >= target`` (f: count or q-sum of the live keys >= c; f is
    non-increasing and f(0) >= target), found DIGIT bits per pass, most significant first.
    With USE_Q the target is the top-p cut ``floor(total * pnum / 2**24)`` (exact in int64),
    total = f(0) from the first pass."""
    NC: tl.constexpr = 1 << DIGIT
    d = tl.arange(0, NC).to(tl.int64)
    L = tl.zeros([], tl.int64)
    base = tl.zeros([], tl.int64)
    tgt = tl.zeros([], tl.int64) + target
    for ps in range(PASSES):
        shift = (PASSES - 1 - ps) * DIGIT
        acc = _digit_pass(x_row, V, tau, m, lo_key, L, shift, base, USE_Q, BLOCK, NC)
        if USE_Q:
            if ps == 0:
                total = tl.sum(tl.where(d == 0, acc, 0), axis=0)
                tgt = _cut(total, pnum)
        pick = tl.max(tl.where(acc >= tgt, d, 0), axis=0)
        # the live tokens above the next window: f at the next candidate (or the same base)
        base = tl.where(pick == NC - 1, base, tl.sum(tl.where(d == pick + 1, acc, 0), axis=0))
        L = L + (pick << shift)
    return L


@triton.jit
def _top_window(x_row, V, tau, k, MOST: tl.constexpr, BLOCK: tl.constexpr, DIGIT: tl.constexpr,
                PASSES: tl.constexpr):
    """``_select``'s count passes for the k-th largest key (0 < k < V), stopped as soon as at most MOST
    keys are >= the window start L (no pass when V <= MOST; after the last pass exactly k are).
    Returns (L, the count of keys >= L)."""
    NC: tl.constexpr = 1 << DIGIT
    d = tl.arange(0, NC).to(tl.int64)
    L = tl.zeros([], tl.int64)
    base = tl.zeros([], tl.int64)
    cnt = tl.zeros([], tl.int64) + V
    ps = tl.zeros([], tl.int32)
    while (cnt > MOST) & (ps < PASSES):
        shift = (PASSES - 1 - ps) * DIGIT
        acc = _digit_pass(x_row, V, tau, 0.0, 0, L, shift, base, False, BLOCK, NC)
        pick = tl.max(tl.where(acc >= k, d, 0), axis=0)
        cnt = tl.sum(tl.where(d == pick, acc, 0), axis=0)
        base = tl.where(pick == NC - 1, base, tl.sum(tl.where(d == pick + 1, acc, 0), axis=0))
        L = L + (pick << shift)
        ps += 1
    return L, cnt


@triton.jit
def _store_keys(x_row, V, tau, L, keys_row, BLOCK: tl.constexpr):
    """Store the rank keys >= L of the row to ``keys_row`` (in index order; the caller sorts them)."""
    cols = tl.arange(0, BLOCK)
    n = tl.zeros([], tl.int32)
    for off in range(0, V, BLOCK):
        j = off + cols
        mask = j < V
        key = _rank_key(tl.math.div_rn(E.upcast(tl.load(x_row + j, mask=mask, other=0.0)), tau), j)
        keep = (mask & (key >= L)).to(tl.int32)
        c = tl.sum(keep, axis=0)
        if c != 0:
            tl.store(keys_row + (n + tl.cumsum(keep, axis=0) - 1), key, mask=keep != 0)
            n += c


@triton.jit
def _finish_tile(keys_row, cnt, k, m, top_p, total, pnum, seed, pos, C: tl.constexpr):
    """The token of a filtered row from its ``cnt`` (k <= cnt <= C) stored keys, the row's largest:
    sorted descending, the first k survive (top-k, or k = cnt); with top-p the kept ones end at the
    first whose inclusive prefix sum of ``q`` reaches P, cut from ``total`` (< 0: the sum over the k);
    Gumbel-max over the kept. Returns the token, or -1 when the k keys' q sum stays under P (then the
    row's top-p set reaches past the stored keys)."""
    ci = tl.arange(0, C)
    # .cg: read from L2, where the stores went (this program's, made visible to it by the barrier, or
    # the gather kernel's)
    keys = tl.sort(tl.load(keys_row + ci, mask=ci < cnt, other=-1, cache_modifier=".cg"), descending=True)
    kept = ci < k
    z = _z_of_key(keys)
    ok = cnt >= 0
    if top_p:
        q = tl.where(kept, E.to_fixed_abs(E.exp_c(z - m), 40), 0)
        cum = tl.cumsum(q, axis=0)
        s = tl.sum(q, axis=0)
        p_cut = _cut(tl.where(total < 0, s, total), pnum)
        ok = s >= p_cut
        kept = kept & (keys >= tl.max(tl.where(kept & (cum >= p_cut), keys, -1), axis=0))
    j = _IDX_MASK - (keys & _IDX_MASK)
    best = tl.max(tl.where(kept, _rank_key(z + _gumbel_at(j, seed, pos), j), -1), axis=0)
    return tl.where(ok, _IDX_MASK - (best & _IDX_MASK), -1)


@triton.jit
def _row_max(part_row, S, S_BLOCK: tl.constexpr):
    """The largest packed partial of a row (the split kernel's winners): its token is the row's answer
    for greedy, plain and special rows, and the top-ranked token of a filtered one."""
    si = tl.arange(0, S_BLOCK)
    return tl.max(tl.load(part_row + si, mask=si < S, other=0), axis=0)


@triton.jit
def _top_z(x_row, v, tau):
    """The row's top-ranked z, ``fl(x[tok] / tau)`` of the packed maximum ``v``'s token (its sign of zero
    too): the reference point m of the histogram bins and of ``q = exp(z - m)``."""
    return tl.math.div_rn(E.upcast(tl.load(x_row + (_IDX_MASK - (v & _IDX_MASK)))), tau)


@triton.jit
def _finite(v):
    """Whether the row of packed maximum ``v`` has no NaN, no +inf and a z above -inf."""
    return ((v >> _CLASS_SHIFT) == 1) & (((v - (tl.full([], 1, tl.int64) << _CLASS_SHIFT)) >> _IDX_BITS) != 0)


@triton.jit
def _gathers(tau, k, p, V, C: tl.constexpr):
    """The rows the gather kernels serve: sampled (tau != 0) with a top-k k <= C, or top-p alone."""
    top_k = (k > 0) & (k < V)
    return (tau != 0.0) & ((top_k & (k <= C)) | ((~top_k) & (p < 1.0)))


@triton.jit
def _bin_of(z, m, mask, NB: tl.constexpr, SHIFT: tl.constexpr):
    """Gather-histogram bin of the tokens ``z <= m`` (masked lanes: the last bin, never gathered). With
    ``d = fl(m - z)`` (monotone in z) the bin is the clamped ``(bits(d) - bits(2**-6)) >> SHIFT``: it
    never falls as z falls and equal z share a bin, so the keys of the first bins are the row's largest."""
    d = (m - z).to(tl.int32, bitcast=True) & 0x7FFFFFFF  # d >= 0; -0 (m = -0, z = +0) reads as 0
    b = tl.minimum(tl.maximum((d - _HIST_BASE) >> SHIFT, 0), NB - 1)
    return tl.where(mask, b, NB - 1)


@triton.jit
def _sample_hist_kernel(x_ptr, stride_x, tau_ptr, k_ptr, p_ptr, part_ptr, hist_ptr, qpart_ptr, V, CHUNK, S,
                        S_BLOCK: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr, SHIFT: tl.constexpr,
                        C: tl.constexpr):
    """Program (b, s): chunk s of row b (a row the gather serves, finite) adds its tokens' bin counts to
    the row's histogram (int32 atomics, order-free; the last bin is not counted) and, for top-p without
    top-k, writes the chunk's exact int64 sum of ``q`` to ``qpart[b, s]``. Other rows return at once."""
    row = tl.program_id(0)
    sp = tl.program_id(1)
    tau = tl.load(tau_ptr + row)
    k = tl.load(k_ptr + row)
    if _gathers(tau, k, tl.load(p_ptr + row), V, C):
        v = _row_max(part_ptr + row.to(tl.int64) * S, S, S_BLOCK)
        if _finite(v):
            x_row = x_ptr + row.to(tl.int64) * stride_x
            m = _top_z(x_row, v, tau)
            need_q = (k <= 0) | (k >= V)
            cols = tl.arange(0, BLOCK)
            h = tl.zeros([NB], tl.int32)
            qs = tl.zeros([], tl.int64)
            start = sp * CHUNK
            end = tl.minimum(start + CHUNK, V)
            for off in range(start, end, BLOCK):
                j = off + cols
                mask = j < end
                z = tl.math.div_rn(E.upcast(tl.load(x_row + j, mask=mask, other=0.0)), tau)
                h += tl.histogram(_bin_of(z, m, mask, NB, SHIFT), NB)
                if need_q:
                    qs += tl.sum(tl.where(mask, E.to_fixed_abs(E.exp_c(z - m), 40), 0), axis=0)
            bins = tl.arange(0, NB)
            tl.atomic_add(hist_ptr + row.to(tl.int64) * (NB + 1) + bins, h, mask=(h != 0) & (bins < NB - 1),
                          sem="relaxed")
            if need_q:
                tl.store(qpart_ptr + row.to(tl.int64) * S + sp, qs)


@triton.jit
def _sample_gather_kernel(x_ptr, stride_x, tau_ptr, k_ptr, p_ptr, part_ptr, hist_ptr, keys_ptr, V, CHUNK, S,
                          S_BLOCK: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr, SHIFT: tl.constexpr,
                          C: tl.constexpr):
    """Program (b, s): from row b's histogram, the most leading bins whose count is <= C (a top-k row:
    at most up to the first bin whose cumulative count reaches k, so its tile stays small); the chunk's
    keys in them go to ``keys[b]`` at positions taken with one int32 atomic a tile (the order of the
    stores is free: the finish sorts). The row's count of stored keys ends in ``hist[b, NB]``."""
    row = tl.program_id(0)
    sp = tl.program_id(1)
    tau = tl.load(tau_ptr + row)
    k = tl.load(k_ptr + row)
    if _gathers(tau, k, tl.load(p_ptr + row), V, C):
        v = _row_max(part_ptr + row.to(tl.int64) * S, S, S_BLOCK)
        if _finite(v):
            h_row = hist_ptr + row.to(tl.int64) * (NB + 1)
            bins = tl.arange(0, NB)
            cum = tl.cumsum(tl.load(h_row + bins), axis=0)
            nb = tl.sum(((cum <= C) & (bins < NB - 1)).to(tl.int32), axis=0)
            if (k > 0) & (k < V):  # top-k: the bins up to the first whose cumulative count reaches k suffice
                nb = tl.minimum(nb, tl.sum((cum < k).to(tl.int32), axis=0) + 1)
            if nb > 0:
                x_row = x_ptr + row.to(tl.int64) * stride_x
                m = _top_z(x_row, v, tau)
                keys_row = keys_ptr + row.to(tl.int64) * C
                cols = tl.arange(0, BLOCK)
                start = sp * CHUNK
                end = tl.minimum(start + CHUNK, V)
                for off in range(start, end, BLOCK):
                    j = off + cols
                    mask = j < end
                    z = tl.math.div_rn(E.upcast(tl.load(x_row + j, mask=mask, other=0.0)), tau)
                    keep = (_bin_of(z, m, mask, NB, SHIFT) < nb).to(tl.int32)
                    c = tl.sum(keep, axis=0)
                    if c != 0:
                        at = tl.atomic_add(h_row + NB, c, sem="relaxed")
                        at_j = at + tl.cumsum(keep, axis=0) - 1
                        tl.store(keys_row + at_j, _rank_key(z, j), mask=(keep != 0) & (at_j < C))


@triton.jit(do_not_specialize=["V"])
def _sample_finish_kernel(x_ptr, stride_x, tau_ptr, k_ptr, p_ptr, seed_ptr, pos_ptr, part_ptr, hist_ptr, qpart_ptr,
                          keys_ptr, out_ptr, V, S, S_BLOCK: tl.constexpr, BLOCK: tl.constexpr, DIGIT: tl.constexpr,
                          PASSES: tl.constexpr, NB: tl.constexpr, C: tl.constexpr, SMALL: tl.constexpr):
    row = tl.program_id(0)
    si = tl.arange(0, S_BLOCK)
    v = _row_max(part_ptr + row.to(tl.int64) * S, S, S_BLOCK)
    tok = _IDX_MASK - (v & _IDX_MASK)
    tau = tl.load(tau_ptr + row)
    k = tl.load(k_ptr + row)
    p = tl.load(p_ptr + row)
    top_k = (k > 0) & (k < V)
    top_p = p < 1.0
    top_key = v - (tl.full([], 1, tl.int64) << _CLASS_SHIFT)  # class 1: the rank key of the top z
    if (tau != 0.0) & (top_k | top_p) & _finite(v):
        seed = tl.load(seed_ptr + row)
        pos = tl.load(pos_ptr + row)
        x_row = x_ptr + row.to(tl.int64) * stride_x
        m = _top_z(x_row, v, tau)
        pnum = E.to_fixed(p, 0, 24)
        keys_row = keys_ptr + row.to(tl.int64) * C
        # the gather kernels' keys: the row's n largest (0 where they did not run or gathered none)
        n = tl.minimum(tl.load(hist_ptr + row.to(tl.int64) * (NB + 1) + NB), C).to(tl.int64)
        tile = (top_k & (k <= n)) | ((~top_k) & (n > 0))
        if (~tile) & top_k & (k <= C):  # the k-th key from count passes, then the keys >= the window start
            L, n = _top_window(x_row, V, tau, k, C, BLOCK, DIGIT, PASSES)
            _store_keys(x_row, V, tau, L, keys_row, BLOCK)
            tl.debug_barrier()
            tile = n >= 0
        ok = n < 0
        if tile:
            total = tl.zeros([], tl.int64) - 1  # top-k: P is cut from the k survivors' sum
            if ~top_k:  # top-p alone: from the row's, the exact sum of the hist kernel's chunk sums
                total = tl.sum(tl.load(qpart_ptr + row.to(tl.int64) * S + si, mask=si < S, other=0), axis=0)
            if n <= SMALL:
                t = _finish_tile(keys_row, n, tl.where(top_k, k, n), m, top_p, total, pnum, seed, pos, SMALL)
            else:
                t = _finish_tile(keys_row, n, tl.where(top_k, k, n), m, top_p, total, pnum, seed, pos, C)
            ok = t >= 0
            tok = tl.where(ok, t, tok)
        if ~ok:  # top-k beyond C, or a top-p set reaching past the gathered keys: the selection passes
            lo = tl.zeros([], tl.int64)
            if top_k:
                lo = _select(x_row, V, tau, m, lo, k, 0, False, BLOCK, DIGIT, PASSES)
            thr = lo
            if top_p:
                thr = tl.minimum(_select(x_row, V, tau, m, lo, 0, pnum, True, BLOCK, DIGIT, PASSES), top_key)
            R: tl.constexpr = BLOCK // 4
            jt = tl.arange(0, R)[:, None] * 4 + tl.arange(0, 4)[None, :]
            best = tl.full([R, 4], -1, tl.int64)
            for off in range(0, V, BLOCK):
                j = off + jt
                mask = j < V
                z = tl.math.div_rn(E.upcast(tl.load(x_row + j, mask=mask, other=0.0)), tau)
                kept = mask & (_rank_key(z, j) >= thr)
                if tl.max(tl.max(kept.to(tl.int32), axis=1), axis=0) != 0:
                    s = z + _gumbel_tile(off // 4, R, seed, pos)
                    best = tl.maximum(best, tl.where(kept, _rank_key(s, j), -1))
            tok = _IDX_MASK - (tl.max(tl.max(best, axis=1), axis=0) & _IDX_MASK)
    tl.store(out_ptr + row, tok)


def _chunking(b: int, v: int) -> tuple[int, int]:
    """(S programs per row, tokens per program): shape-only, about PROGRAMS programs in all."""
    blocks = cdiv(v, SPLIT_BLOCK)
    s = max(1, min(blocks, MAX_SPLITS, cdiv(PROGRAMS, max(b, 1))))
    per = cdiv(blocks, s)
    return cdiv(blocks, per), per * SPLIT_BLOCK


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seed: torch.Tensor, position: torch.Tensor, filtered: bool = True,
           target: TritonTarget | None = None) -> torch.Tensor:
    """One token per row: greedy where temperature is 0, else Gumbel-max over the top-k/top-p set.

    Parameters
    ----------
    logits : Tensor, float32/bfloat16/float16, [B, V], V <= 2**18, unit stride along V
    temperature : Tensor, float32, [B]
    top_k : Tensor, int64, [B]
    top_p : Tensor, float32, [B]
    seed : Tensor, int64, [B]
    position : Tensor, int64, [B]
        Validated and broadcast by the public op (``rlkernel.ops.sample``).
    filtered : bool, default True
        False (the public op read every parameter and no row has top-k or top-p on) skips the
        hist and gather launches (B 1 eager is host-bound: ~11 us of host time a launch). A
        filtered row under False still gets its exact token: the split kernel cleared its
        gathered count, so the finish runs the selection passes.
    target : TritonTarget, optional
        Bound by the backend; the launch does not depend on it.

    Returns
    -------
    Tensor, int64, [B]

    Bitwise semantics
    -----------------
    Contract ``sample`` v1, steps 1-8: the argmax is an integer max of packed (class, monotone
    score key, inverted index), so ties go to the lowest index and NaN / +inf rows take their
    first such index; the top-k and top-p thresholds come from exact integer counts and int64
    sums of ``q``, independent of the order in which tokens are visited. Four launches (two when
    ``filtered`` is False), no host synchronisation (capturable in a CUDA graph).
    """
    b, v = logits.shape
    if v > MAX_VOCAB:
        raise ValueError(f"sample: V = {v} exceeds {MAX_VOCAB} (2**18, the exact top-p bound); "
                         f"sample from a vocabulary shard's candidates")
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    x = logits if logits.stride(1) == 1 else logits.contiguous()
    params = [t.contiguous() for t in (temperature, top_k, top_p, seed, position)]
    s, chunk = _chunking(b, v)
    dev = logits.device
    # one allocation for the split winners, the chunk q sums, the gathered keys and the int32 histogram
    # (bin counts, then the gathered count; cleared by the split kernel): B 1 eager is host-bound
    words = 2 * b * s + b * COMPACT
    ints = torch.empty(words + cdiv(b * (HIST_BINS + 1), 2), dtype=torch.int64, device=dev)
    part, qpart = ints[:b * s].view(b, s), ints[b * s:2 * b * s].view(b, s)
    keys = ints[2 * b * s:words].view(b, COMPACT)
    hist = ints[words:].view(torch.int32)[:b * (HIST_BINS + 1)].view(b, HIST_BINS + 1)
    rows = (x, x.stride(0), *params[:3])
    _sample_split_kernel[(b, s)](x, x.stride(0), *params, part, hist, v, chunk, s, BLOCK=SPLIT_BLOCK, NB=HIST_BINS,
                                 HZ=1 << HIST_BINS.bit_length(), num_warps=4, **LAUNCH)
    gather = dict(S_BLOCK=MAX_SPLITS, BLOCK=SPLIT_BLOCK, NB=HIST_BINS, SHIFT=HIST_SHIFT, C=COMPACT, num_warps=4,
                  **LAUNCH)
    if filtered:
        _sample_hist_kernel[(b, s)](*rows, part, hist, qpart, v, chunk, s, **gather)
        _sample_gather_kernel[(b, s)](*rows, part, hist, keys, v, chunk, s, **gather)
    _sample_finish_kernel[(b,)](x, x.stride(0), *params, part, hist, qpart, keys, out, v, s, S_BLOCK=MAX_SPLITS,
                                BLOCK=FILTER_BLOCK, DIGIT=DIGIT_BITS, PASSES=SELECT_PASSES, NB=HIST_BINS, C=COMPACT,
                                SMALL=SMALL_TILE, num_warps=16, **LAUNCH)
    return out


def static_specs(target: TritonTarget):
    specs = []
    params = {"tau_ptr": "*fp32", "k_ptr": "*i64", "p_ptr": "*fp32", "seed_ptr": "*i64", "pos_ptr": "*i64",
              "part_ptr": "*i64"}
    for dt in ("fp32", "bf16", "fp16"):
        specs.append(("sample", f"split_{dt}", _sample_split_kernel,
                      {"x_ptr": f"*{dt}", "stride_x": "i64", **params, "hist_ptr": "*i32", "V": "i32", "CHUNK": "i32",
                       "S": "i32", "BLOCK": "constexpr", "NB": "constexpr", "HZ": "constexpr"},
                      {"BLOCK": SPLIT_BLOCK, "NB": HIST_BINS, "HZ": 1 << HIST_BINS.bit_length()}, {"num_warps": 4}))
        gather = {"S_BLOCK": MAX_SPLITS, "BLOCK": SPLIT_BLOCK, "NB": HIST_BINS, "SHIFT": HIST_SHIFT, "C": COMPACT}
        rows = {"x_ptr": f"*{dt}", "stride_x": "i64", "tau_ptr": "*fp32", "k_ptr": "*i64", "p_ptr": "*fp32",
                "part_ptr": "*i64", "hist_ptr": "*i32"}
        tail = {"V": "i32", "CHUNK": "i32", "S": "i32", **{name: "constexpr" for name in gather}}
        specs.append(("sample", f"hist_{dt}", _sample_hist_kernel, {**rows, "qpart_ptr": "*i64", **tail}, gather,
                      {"num_warps": 4}))
        specs.append(("sample", f"gather_{dt}", _sample_gather_kernel, {**rows, "keys_ptr": "*i64", **tail}, gather,
                      {"num_warps": 4}))
        specs.append(("sample", f"finish_{dt}", _sample_finish_kernel,
                      {"x_ptr": f"*{dt}", "stride_x": "i64", **params, "hist_ptr": "*i32", "qpart_ptr": "*i64",
                       "keys_ptr": "*i64", "out_ptr": "*i64", "V": "i32", "S": "i32", "S_BLOCK": "constexpr",
                       "BLOCK": "constexpr", "DIGIT": "constexpr", "PASSES": "constexpr", "NB": "constexpr",
                       "C": "constexpr", "SMALL": "constexpr"},
                      {"S_BLOCK": MAX_SPLITS, "BLOCK": FILTER_BLOCK, "DIGIT": DIGIT_BITS, "PASSES": SELECT_PASSES,
                       "NB": HIST_BINS, "C": COMPACT, "SMALL": SMALL_TILE},
                      {"num_warps": 16}))
    return specs
