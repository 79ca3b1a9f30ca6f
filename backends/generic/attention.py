"""Device-generic exact attention: packed (varlen) sequences with a KV cache, and paged caches.

Independent of the contract reference. Memory is bounded: query rows are cut into tiles of at
most :data:`Q_TILE` rows, tiles of several sequences are batched (up to :data:`ROW_BUDGET`
padded rows), and keys are visited in blocks of :data:`KEY_BLOCK`, twice:

* pass 1: scores of the block (exact digit GEMMs), running max ``m`` of the allowed scores
  (NaN propagates), running max ``c`` of the scores of keys with a non-zero V row, running max
  ``E`` of the V row exponents, non-finite V rows seen;
* pass 2: the same scores again, ``p = exp_c(s - ref)`` with ``ref = max(c, m - 64)``, and
  integer partial sums ``L += sum RNE(p 2**(40 - e_l))`` and ``O += R @ Vint`` with ``R`` on the
  2**-40 grid, split in two 20-bit limbs (``O_hi``, ``O_lo``: digit GEMMs), added in int64.

Every partial is an exact integer (or an exact max), so the bits do not depend on the tile
and block sizes, the batching of sequences, or the order of the key blocks. Digit GEMMs run on
the device's fp32 matmul with base-128 digits in [-64, 64]: one level (the sum of the digit
products with equal weight) adds at most 3 * 1024 * 64 * 64 < 2**24, so with reductions cut to
<= 1024 terms every partial sum is an integer held exactly in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rlkernel.backends.generic._exact.digits import grid_rows, row_exponents, split_digits
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

#: Query rows per tile of one sequence.
Q_TILE = 64
#: Keys per block (any size: the digit GEMMs cut their reductions to RED_CHUNK).
KEY_BLOCK = 256
#: Padded query rows (tiles x tile rows) processed together.
ROW_BUDGET = 128
#: Key rows (tiles x keys per block) fetched at once; many decode tiles get shorter key blocks.
KEY_BUDGET = 8192
#: Longest reduction of one digit GEMM (keeps each level's partial sums below 2**24).
RED_CHUNK = 1024
#: Fraction bits of the probability grid (L and R), magnitude bits of the q/k grids and of the V grid.
P_BITS = 40
GRID = 20
V_BITS = 20
#: R (<= 2**40) is split as R_hi * 2**R_SPLIT + R_lo, both limbs <= 2**20 (three base-128 digits).
R_SPLIT = 20
#: The reference max is at most this many nats below the row max.
MAX_GAP = 64.0
MAX_KEYS = 1 << 22
#: Exponent stand-in of "no contributing V row" (below any real exponent).
_NO_ROW = -(1 << 20)

#: ``fetch(seq [n], pos [n, kb], valid [n, kb]) -> (k [n, kb, Hkv, D], v [n, kb, Hkv, D])``
Fetch = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def default_scale(head_dim: int) -> float:
    """``RN32(1 / sqrt(D))`` correctly rounded, in integer arithmetic (host)."""
    # floor(2**80 / sqrt(D)) has >= 41 bits; round it to 24 bits, half to even, with a sticky
    # bit for the irrational tail (zero exactly when the square root is exact).
    scaled = 1 << 160
    root = math.isqrt(scaled // head_dim)
    tail = root * root * head_dim != scaled
    drop = root.bit_length() - 24
    top = root >> drop
    low = root - (top << drop)
    halfway = 1 << (drop - 1)
    if low > halfway or (low == halfway and (tail or top & 1)):
        top += 1
    return math.ldexp(float(top), drop - 80)


def _level_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``A @ B`` from digit planes ``a [3, ..., M, K]``, ``b [3, ..., K, N]``.

    Digits of equal weight 2**(7 l) are multiplied and added in fp32 (exact: integers < 2**24
    per K-chunk of <= RED_CHUNK), then the five levels are combined in int64.
    """
    k = a.shape[-1]
    acc: torch.Tensor | None = None
    for start in range(0, k, RED_CHUNK):
        stop = min(start + RED_CHUNK, k)
        ac, bc = a[..., start:stop], b[..., start:stop, :]
        for level in range(5):
            part: torch.Tensor | None = None
            for i in range(max(0, level - 2), min(level, 2) + 1):
                prod = torch.matmul(ac[i], bc[level - i])
                part = prod if part is None else part + prod
            assert part is not None
            term = part.to(torch.int64) << (7 * level)
            acc = term if acc is None else acc + term
    assert acc is not None
    return acc


def _causal_limit(lk: torch.Tensor, lq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Bottom-right causal mask: query ``pos`` (0-based in its segment) sees keys ``< lk - lq + pos + 1``."""
    return lk - lq + pos + 1


def _divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``: one IEEE fp32 division per element (never a reciprocal multiply)."""
    return num / den


class _Queries:
    """One batch of query tiles: digits, exponents and per-row key limits, heads grouped by KV head."""

    def __init__(self, q: torch.Tensor, tiles: list[tuple[int, int, int]], q_starts: list[int],
                 q_lens: list[int], k_lens: list[int], hkv: int, causal: bool):
        dev = q.device
        n = len(tiles)
        rows = max(t[2] - t[1] for t in tiles)
        tq, hq, d = q.shape
        group = hq // hkv
        seq = torch.tensor([t[0] for t in tiles], dtype=torch.int64, device=dev)
        first = torch.tensor([t[1] for t in tiles], dtype=torch.int64, device=dev)
        count = torch.tensor([t[2] - t[1] for t in tiles], dtype=torch.int64, device=dev)
        start = torch.tensor([q_starts[t[0]] for t in tiles], dtype=torch.int64, device=dev)
        lq = torch.tensor([q_lens[t[0]] for t in tiles], dtype=torch.int64, device=dev)
        lk = torch.tensor([k_lens[t[0]] for t in tiles], dtype=torch.int64, device=dev)
        r = torch.arange(rows, dtype=torch.int64, device=dev)
        self.valid = r.unsqueeze(0) < count.unsqueeze(1)  # [n, rows]
        pos = first.unsqueeze(1) + r.unsqueeze(0)  # 0-based position in the sequence's queries
        self.rows_idx = torch.where(self.valid, start.unsqueeze(1) + pos, torch.zeros_like(pos))
        # allowed keys: positions < limit (bottom-right causal, or all lk); padded rows: none
        limit = _causal_limit(lk.unsqueeze(1), lq.unsqueeze(1), pos) if causal else lk.unsqueeze(1).expand(n, rows)
        limit = torch.where(self.valid, limit, torch.zeros_like(limit))
        self.limit = limit.unsqueeze(1).expand(n, group, rows).reshape(n, 1, group * rows, 1)
        self.seq, self.lk = seq, lk
        self.n, self.rows, self.group, self.hkv, self.d = n, rows, group, hkv, d
        x = q.index_select(0, self.rows_idx.reshape(-1)).view(n, rows, hkv, group, d)
        x = x.permute(0, 2, 3, 1, 4).reshape(n, hkv, group * rows, d)  # [n, Hkv, G*rows, D]
        self.e = row_exponents(x)  # [n, Hkv, GR]
        self.digits = split_digits(grid_rows(x, self.e, GRID))  # [3, n, Hkv, GR, D]
        self.bad = (~torch.isfinite(x)).any(dim=-1)  # [n, Hkv, GR]

    def scatter(self, out: torch.Tensor, o: torch.Tensor) -> None:
        """Write tile outputs ``o [n, Hkv, G*rows, D]`` into ``out [Tq, Hq, D]`` (valid rows)."""
        n, rows, hkv, group, d = self.n, self.rows, self.hkv, self.group, self.d
        o = o.view(n, hkv, group, rows, d).permute(0, 3, 1, 2, 4).reshape(n * rows, hkv * group, d)
        keep = self.valid.reshape(-1)
        out.index_copy_(0, self.rows_idx.reshape(-1)[keep], o[keep])


def _scores(qs: _Queries, k: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 scores ``RN32(digit_dot(q, k) * scale)`` [n, Hkv, GR, kb] for a key block k [n, Hkv, kb, D]."""
    ek = row_exponents(k)  # [n, Hkv, kb]
    kd = split_digits(grid_rows(k, ek, GRID)).transpose(-1, -2)  # [3, n, Hkv, D, kb]
    c = _level_matmul(qs.digits, kd)
    shift = (qs.e.unsqueeze(-1) + ek.unsqueeze(-2) - 2 * GRID).clamp(min=-252)  # below: +-0 either way
    s = scale_pow2(int64_to_f32(c), shift) * scale
    bad = qs.bad.unsqueeze(-1) | (~torch.isfinite(k)).any(dim=-1).unsqueeze(-2)
    return torch.where(bad, float("nan"), s)


def _v_block(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """V block [n, Hkv, kb, D] -> (exponents, zero rows, non-finite rows, int64 grid rows)."""
    ev = row_exponents(v)
    finite = torch.isfinite(v)
    zero = torch.where(finite, v, 0.0).abs().amax(dim=-1) == 0
    return ev, zero, (~finite).any(dim=-1), grid_rows(v, ev, V_BITS)


def _attend(q: torch.Tensor, fetch: Fetch, q_starts: list[int], q_lens: list[int], k_lens: list[int],
            hkv: int, scale_value: float, causal: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """The two-pass blocked algorithm over every query row of the pack; ``[Tq, Hq, D]``."""
    tq, hq, d = q.shape
    dev = q.device
    out = torch.empty((tq, hq, d), dtype=out_dtype, device=dev)
    tiles = [(b, s, min(s + Q_TILE, q_lens[b])) for b in range(len(q_lens)) for s in range(0, q_lens[b], Q_TILE)]
    if not tiles:
        return out
    for b in range(len(q_lens)):
        if k_lens[b] > MAX_KEYS:
            raise ValueError(f"attention: sequence {b} has {k_lens[b]} keys; the exact sums allow at most {MAX_KEYS}")
        if causal and q_lens[b] and k_lens[b] < q_lens[b]:
            raise ValueError(f"attention: causal sequence {b} has {q_lens[b]} queries but {k_lens[b]} keys; "
                             f"need lk >= lq")

    def key_end(t: tuple[int, int, int]) -> int:
        b, _, stop = t
        return k_lens[b] - q_lens[b] + stop if causal else k_lens[b]

    # Tiles of similar size and key range go together (any grouping gives the same bits).
    tiles.sort(key=lambda t: (t[2] - t[1], key_end(t)))
    batches: list[list[tuple[int, int, int]]] = [[]]
    for t in tiles:
        cur = batches[-1]
        rows = max([t[2] - t[1]] + [u[2] - u[1] for u in cur])
        if cur and rows * (len(cur) + 1) > ROW_BUDGET:
            batches.append([t])
        else:
            cur.append(t)

    scale = torch.full((), scale_value, dtype=torch.float32, device=dev)
    neg_inf = torch.full((), float("-inf"), dtype=torch.float32, device=dev)
    no_row = torch.full((), _NO_ROW, dtype=torch.int64, device=dev)
    for batch in batches:
        qs = _Queries(q, batch, q_starts, q_lens, k_lens, hkv, causal)
        k_end = max(key_end(t) for t in batch)
        shape = (qs.n, hkv, qs.group * qs.rows)
        m = torch.full(shape, float("-inf"), dtype=torch.float32, device=dev)
        c = torch.full(shape, float("-inf"), dtype=torch.float32, device=dev)
        e_max = torch.full(shape, _NO_ROW, dtype=torch.int64, device=dev)
        v_bad = torch.zeros(shape, dtype=torch.bool, device=dev)

        step = max(16, min(KEY_BLOCK, KEY_BUDGET // qs.n))

        def block(start: int, qs: _Queries = qs, step: int = step, k_end: int = k_end) -> tuple[torch.Tensor, ...]:
            stop = min(start + step, k_end)
            pos = torch.arange(start, stop, dtype=torch.int64, device=dev).unsqueeze(0).expand(qs.n, -1)
            valid = pos < qs.lk.unsqueeze(1)
            kb, vb = fetch(qs.seq, pos, valid)  # [n, kb, Hkv, D]
            kb, vb = kb.transpose(1, 2), vb.transpose(1, 2)
            allowed = pos.unsqueeze(1).unsqueeze(1) < qs.limit  # [n, 1, GR, kb]
            return _scores(qs, kb, scale), allowed, vb

        for start in range(0, k_end, step):  # pass 1: maxima
            s, allowed, vb = block(start)
            m = torch.maximum(m, torch.where(allowed, s, neg_inf).amax(dim=-1))
            ev, vzero, vnan, _ = _v_block(vb)
            contrib = allowed & ~vzero.unsqueeze(2)
            c = torch.maximum(c, torch.where(contrib, s, neg_inf).amax(dim=-1))
            e_max = torch.maximum(e_max, torch.where(contrib, ev.unsqueeze(2), no_row).amax(dim=-1))
            v_bad |= (allowed & vnan.unsqueeze(2)).any(dim=-1)
        m = m + 0.0  # R5: a zero max is +0
        ref = torch.maximum(c + 0.0, m - MAX_GAP)  # the reference max (NaN propagates)
        top = exp_c(m - ref)  # in [1, e**64]; NaN on rows that end NaN anyway
        e_l = torch.where(torch.isfinite(top), exponent(torch.where(torch.isfinite(top), top, 1.0)), 1)
        e_row = torch.where(e_max == _NO_ROW, torch.zeros_like(e_max), e_max)

        total = torch.zeros(shape, dtype=torch.int64, device=dev)
        o_hi = torch.zeros((*shape, d), dtype=torch.int64, device=dev)
        o_lo = torch.zeros((*shape, d), dtype=torch.int64, device=dev)
        p_bad = torch.zeros(shape, dtype=torch.bool, device=dev)
        for start in range(0, k_end, step):  # pass 2: integer sums
            s, allowed, vb = block(start)
            p = exp_c(s - ref.unsqueeze(-1))
            p = torch.where(allowed, p, 0.0)
            p_bad |= torch.isnan(p).any(dim=-1)
            ev, vzero, _, vint = _v_block(vb)
            total += to_fixed(p, e_l.unsqueeze(-1), P_BITS).sum(dim=-1)
            contrib = allowed & ~vzero.unsqueeze(2)
            r = to_fixed(p, torch.where(contrib, e_row.unsqueeze(-1) - ev.unsqueeze(2), 0), P_BITS)
            r = torch.where(contrib, r, 0)
            vd = split_digits(vint)
            o_hi += _level_matmul(split_digits(r >> R_SPLIT), vd)
            o_lo += _level_matmul(split_digits(r & ((1 << R_SPLIT) - 1)), vd)

        num = int64_pair_to_float(o_hi, o_lo, R_SPLIT, (e_row - V_BITS - P_BITS).unsqueeze(-1), torch.float32)
        den = int64_to_float(total, e_l - P_BITS, torch.float32)
        o = _divide(num, den.unsqueeze(-1))
        o = torch.where((p_bad | v_bad).unsqueeze(-1), float("nan"), o)
        qs.scatter(out, cast_out(o, out_dtype))
    return out


def _resolve_scale(scale: float | None, head_dim: int) -> float:
    return default_scale(head_dim) if scale is None else float(scale)


def _host_list(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t.tolist()]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """Exact attention over packed sequences (contract ``attention`` v2).

    Parameters
    ----------
    q : Tensor, bfloat16/float16, [Tq, Hq, D] (any strides)
    k, v : Tensor, q's dtype, [Tk, Hkv, D] (any strides)
    cu_seqlens_q, cu_seqlens_k : Tensor, int32/int64, [B + 1]
    scale : float, optional
        An fp32 value (the public op rounds it); default ``RN32(1 / sqrt(D))``.
    causal : bool

    Returns
    -------
    Tensor, q's dtype, [Tq, Hq, D]
    """
    cq, ck = _host_list(cu_seqlens_q), _host_list(cu_seqlens_k)
    q_lens = [cq[i + 1] - cq[i] for i in range(len(cq) - 1)]
    k_lens = [ck[i + 1] - ck[i] for i in range(len(ck) - 1)]
    k_start = torch.tensor(ck[:-1] or [0], dtype=torch.int64, device=q.device)

    def fetch(seq: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.where(valid, k_start[seq].unsqueeze(1) + pos, 0).reshape(-1)
        n, kb = pos.shape
        return (k.index_select(0, idx).view(n, kb, *k.shape[1:]),
                v.index_select(0, idx).view(n, kb, *v.shape[1:]))

    return _attend(q, fetch, cq[:-1], q_lens, k_lens, k.shape[1], _resolve_scale(scale, q.shape[2]), causal,
                   q.dtype)


def attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens_k: torch.Tensor, cu_seqlens_q: torch.Tensor, scale: float | None = None,
                    causal: bool = True) -> torch.Tensor:
    """Exact attention over a block-paged KV cache: the bits of ``attention`` on the gathered keys.

    Parameters
    ----------
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
    k_cache, v_cache : Tensor, q's dtype, [num_blocks, block_size, Hkv, D]
    block_table : Tensor, int32/int64, [B, max_blocks]
    seq_lens_k : Tensor, int32/int64, [B]
    cu_seqlens_q : Tensor, int32/int64, [B + 1]
    scale : float, optional
    causal : bool

    Returns
    -------
    Tensor, q's dtype, [Tq, Hq, D]
    """
    cq = _host_list(cu_seqlens_q)
    q_lens = [cq[i + 1] - cq[i] for i in range(len(cq) - 1)]
    k_lens = _host_list(seq_lens_k)
    bs = k_cache.shape[1]
    table = block_table.to(device=q.device, dtype=torch.int64)

    def fetch(seq: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.where(valid, pos, 0)
        blk = table.index_select(0, seq).gather(1, pos // bs)
        blk = torch.where(valid, blk, 0)  # unused table entries are never dereferenced
        slot = torch.where(valid, pos % bs, 0)
        return k_cache[blk, slot], v_cache[blk, slot]

    return _attend(q, fetch, cq[:-1], q_lens, k_lens, k_cache.shape[2], _resolve_scale(scale, q.shape[2]),
                   causal, q.dtype)
