"""softmax / log_softmax on Triton (contracts ``softmax`` v1, ``log_softmax`` v1).

Per row: R5 max (integer keys, NaN flag), ``d = x - m``, ``p = exp_c(d)``, ``L`` the exact
int64 sum of ``RNE(p * 2**40)`` (absolute grid: p <= 1), then ``p ÷ L`` or ``d - log_c(L)``.

Rows up to ``MAX_BLOCK`` stay in the registers of one program per row (one launch). Longer rows
(vocabularies) are split over ``S`` programs of ``chunk`` columns each, grid ``(rows, S)``, in
three launches (the sum needs the exact row max, the output needs ``L``):

1. ``_split_max_kernel``: each chunk's max as an int32 order key (``NAN_KEY`` if it holds a NaN,
   above every real key) to ``keys[row, s]``;
2. ``_split_sum_kernel``: the row max from the ``S`` keys (integer max: order-free), the
   chunk's int64 sum of ``RNE(exp_c(x - m) * 2**40)`` to ``sums[row, s]`` and its non-finite
   flags to ``flags[row, s]``;
3. ``_split_out_kernel``: ``L`` from the ``S`` sums (exact int64 addition, any order) and
   flags, then the chunk's outputs.

The partials are written, not accumulated: every buffer is ``torch.empty`` (no fill launch, no
atomics), the launches read nothing on the host, so the op captures in CUDA graphs. The bits
are the contract's whatever ``S`` and the chunk: the max and the sum are exact integer
reductions.

``_split_fused_kernel`` takes the three steps in one launch: the same partials, written by ordered
work items over batches of rows so that a row's later reads of x come from L2; it zeroes one int32
word per row and step plus a ticket counter (one fill launch), and captures in CUDA graphs too. It
runs with ``FUSED_SPLIT`` (off: it was nowhere faster on an H100).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _tl_exact as E
from ._common import LAUNCH, OUT_CODE, cdiv, pow2_block, sm_count, warps_for

MAX_N = 1 << 22
#: rows up to this length run one program per row, in registers
MAX_BLOCK = 4096
#: split rows: columns a program handles per loop step, and its warps
SPLIT_TILE = 2048
SPLIT_WARPS = 8
#: split rows: aim at this many programs in all (several per SM of a 132-SM H200); the chunk of a
#: program is a whole number of tiles, so short batches get many programs per row and long
#: batches few
SPLIT_PROGRAMS = 1024
#: split rows: tiles a program may add (a lane's fp64 sum of integers <= 2**40 stays below 2**52)
PROGRAM_TILES = 2048
#: partials (keys / sums / flags of a row) are reduced this many at a time
PART_BLOCK = 128
#: key of a chunk holding a NaN: above every real key (+inf is 0x7F800000)
NAN_KEY = 0x7FFFFFFF
#: split rows in one launch (``_split_fused_kernel``: the three steps as ordered work items, a batch of
#: rows at a time, so a row's second and third reads of x come from L2). Off: its bits passed on an H100
#: (c349312: conformance and the GPU test), but it was nowhere faster there, at T 256 / 2048 (4f3e37c)
#: nor at T 1-64 (c349312, tools/exp_softmax_rows.py: softmax T 1 0.0160 ms against 0.0145 in three
#: launches, T 64 0.093 against 0.079); its T 1 win of the twenty-eighth round was that run's host
FUSED_SPLIT = False
#: fused: tiles of SPLIT_TILE columns per work item, x bytes of a batch of rows, programs per SM (the
#: kernel takes 64 registers a thread at 8 warps on sm_90, so four programs fill a SM's registers and
#: keep ~32 KB of loads in flight there)
FUSED_ITEM_TILES = 4
FUSED_BATCH_BYTES = 16 << 20
FUSED_PROGRAMS_PER_SM = 4


@triton.jit
def _softmax_row_kernel(x_ptr, y_ptr, n, x_row_stride, y_row_stride,
                        LOG: tl.constexpr, OUT: tl.constexpr, BLOCK: tl.constexpr):
    """One row of at most BLOCK columns, in registers."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * y_row_stride
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = E.upcast(tl.load(x_row + cols, mask=mask, other=0.0))
    keys = tl.where(mask, E.max_key(x), -2147483647)
    nan = (E.is_nan(x) & mask).to(tl.int32)
    keys = tl.where(nan != 0, -2147483647, keys)
    m = E.key_to_f32(tl.max(keys, axis=0))
    m = tl.where(tl.max(nan, axis=0) != 0, E.canonical_nan_f32(m), m)
    d = x - m
    p = E.exp_c(d)
    total = tl.sum(tl.where(mask, E.to_fixed_abs(p, 40), 0), axis=0)
    big_l = E.apply_special(E.from_fixed(total, 0, 40), _sum_code(m))
    if LOG:
        y = d - E.log_c(big_l)
    else:
        y = tl.math.div_rn(p, big_l)
    tl.store(y_row + cols, E.cast_out(y, OUT), mask=mask)


@triton.jit
def _sum_code(m):
    """``special_sum_code`` of the terms ``exp_c(x - m)``, OR-reduced over the row, from the row max alone:
    with m finite every ``x - m`` is in [-inf, 0] and every term in [0, 1] (code 0); with m NaN every
    term is NaN, with m = +inf the +inf entries give NaN, with m = -inf every entry is -inf and gives
    NaN (code 1: NaN, never +-inf). One test a row instead of one an element."""
    return tl.where(E.is_finite(m), 0, 1)


@triton.jit
def _chunk_max_key(x_row, start, chunk, n, TILE: tl.constexpr):
    """The R5 max key of columns [start, start + chunk) of a row, NAN_KEY if a NaN is there."""
    cols = tl.arange(0, TILE)
    keys = tl.full([TILE], -2147483647, tl.int32)
    nan = tl.zeros([TILE], tl.int32)
    for t in range(0, chunk, TILE):
        idx = start + t + cols
        mask = idx < n
        x = E.upcast(tl.load(x_row + idx, mask=mask, other=0.0))
        keys = tl.maximum(keys, tl.where(mask & ~E.is_nan(x), E.max_key(x), -2147483647))
        nan = nan | (E.is_nan(x) & mask).to(tl.int32)
    key = tl.max(keys, axis=0)
    return tl.where(tl.max(nan, axis=0) != 0, 0x7FFFFFFF, key)


@triton.jit
def _split_max_kernel(x_ptr, keys_ptr, n, x_row_stride, chunk, S, TILE: tl.constexpr):
    """keys[row, s] = the R5 max key of columns [s * chunk, (s + 1) * chunk), NAN_KEY if a NaN is there."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    tl.store(keys_ptr + row * S + s, _chunk_max_key(x_ptr + row * x_row_stride, s * chunk, chunk, n, TILE))


@triton.jit
def _row_max_of_keys(keys_row, S, PART: tl.constexpr, CACHE: tl.constexpr):
    """The row max (fp32; canonical NaN if any chunk held a NaN) from its S chunk keys (``CACHE``: the
    loads' cache modifier)."""
    ps = tl.arange(0, PART)
    best = tl.full([PART], -2147483647, tl.int32)
    for s0 in range(0, S, PART):
        best = tl.maximum(best, tl.load(keys_row + s0 + ps, mask=s0 + ps < S, other=-2147483647,
                                        cache_modifier=CACHE))
    key = tl.max(best, axis=0)
    m = E.key_to_f32(key)
    return tl.where(key == 0x7FFFFFFF, E.canonical_nan_f32(m), m)


@triton.jit
def _chunk_sum(x_row, m, start, chunk, n, TILE: tl.constexpr):
    """(the int64 sum of RNE(exp_c(x - m) * 2**40) over columns [start, start + chunk), its non-finite
    code); a row whose max is not finite is NaN whatever its sum, so its terms are not read.

    The terms (integers <= 2**40: ``exp_c(x - m)`` is in [0, 1]) add per lane in fp64, exactly: a lane
    adds at most ``chunk / TILE <= PROGRAM_TILES`` of them, below 2**52; the lanes' integers add in int64."""
    code = _sum_code(m)
    cols = tl.arange(0, TILE)
    acc = tl.zeros([TILE], tl.float64)  # each lane adds at most PROGRAM_TILES integers <= 2**40: exact
    for t in range(0, tl.where(code == 0, chunk, 0), TILE):
        idx = start + t + cols
        mask = idx < n
        x = E.upcast(tl.load(x_row + idx, mask=mask, other=float("-inf")))  # a masked lane's term is exp(-inf) = 0
        acc += E.to_grid_unit(E.exp_c_nonpos(x - m), 40).to(tl.float64)
    return tl.sum(E.f64_count_to_i64(acc), axis=0), code


@triton.jit
def _split_sum_kernel(x_ptr, keys_ptr, sums_ptr, flags_ptr, n, x_row_stride, chunk, S,
                      TILE: tl.constexpr, PART: tl.constexpr):
    """sums[row, s] = the chunk's int64 sum of RNE(exp_c(x - m) * 2**40); flags[row, s] its non-finite
    bookkeeping (``_sum_code``: from the row max)."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    m = _row_max_of_keys(keys_ptr + row * S, S, PART, "")
    total, code = _chunk_sum(x_ptr + row * x_row_stride, m, s * chunk, chunk, n, TILE)
    tl.store(sums_ptr + row * S + s, total)
    tl.store(flags_ptr + row * S + s, code)


@triton.jit
def _row_sum(sums_row, flags_row, S, PART: tl.constexpr, CACHE: tl.constexpr):
    """``L`` of a row from its S partial sums (exact int64 addition) and flags."""
    ps = tl.arange(0, PART)
    tot = tl.zeros([PART], tl.int64)
    fl = tl.zeros([PART], tl.int32)
    for s0 in range(0, S, PART):
        pmask = s0 + ps < S
        tot += tl.load(sums_row + s0 + ps, mask=pmask, other=0, cache_modifier=CACHE)
        fl = fl | tl.load(flags_row + s0 + ps, mask=pmask, other=0, cache_modifier=CACHE)
    return E.apply_special(E.from_fixed(tl.sum(tot, axis=0), 0, 40), E.or_reduce_flags(fl))


@triton.jit
def _chunk_out(x_row, y_row, m, big_l, start, chunk, n, LOG: tl.constexpr, OUT: tl.constexpr,
               TILE: tl.constexpr, EVICT: tl.constexpr):
    """The outputs of columns [start, start + chunk) of a row from its max and ``L`` (``EVICT``: the
    eviction policy of the last read of x and of the stores)."""
    log_l = E.log_c(big_l)
    cols = tl.arange(0, TILE)
    for t in range(0, chunk, TILE):
        idx = start + t + cols
        mask = idx < n
        x = E.upcast(tl.load(x_row + idx, mask=mask, other=0.0, eviction_policy=EVICT))
        d = x - m
        if LOG:
            y = d - log_l
        else:
            # exp_c_nonpos: d <= 0 where m is finite; elsewhere L is NaN, and so is every output
            y = tl.math.div_rn(E.exp_c_nonpos(d), big_l)
        tl.store(y_row + idx, E.cast_out(y, OUT), mask=mask, eviction_policy=EVICT)


@triton.jit
def _split_out_kernel(x_ptr, y_ptr, keys_ptr, sums_ptr, flags_ptr, n, x_row_stride, y_row_stride, chunk, S,
                      LOG: tl.constexpr, OUT: tl.constexpr, TILE: tl.constexpr, PART: tl.constexpr):
    """The chunk's outputs, ``L`` from the row's S partial sums (exact) and flags."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    m = _row_max_of_keys(keys_ptr + row * S, S, PART, "")
    big_l = _row_sum(sums_ptr + row * S, flags_ptr + row * S, S, PART, "")
    _chunk_out(x_ptr + row * x_row_stride, y_ptr + row * y_row_stride, m, big_l, s * chunk, chunk, n, LOG, OUT,
               TILE, "")


@triton.jit
def _wait_count(count_ptr, target):
    """Spin until the int32 at ``count_ptr`` reaches ``target`` (acquire), then a CTA barrier: every
    thread's later loads are ordered after the writes the count publishes."""
    seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    while seen < target:
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    tl.debug_barrier()


@triton.jit
def _publish(count_ptr):
    """Count one finished work item at ``count_ptr`` after every thread's stores (CTA barrier, then a
    release add: the pattern of a grid barrier's arrival)."""
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="release")


@triton.jit
def _split_fused_kernel(x_ptr, y_ptr, keys_ptr, sums_ptr, flags_ptr, state_ptr, n, x_row_stride, y_row_stride,
                        chunk, S, rows, BATCH, LOG: tl.constexpr, OUT: tl.constexpr, TILE: tl.constexpr,
                        PART: tl.constexpr):
    """The three steps of the split rows in one launch of a few programs a SM, so that a row's later
    reads of x hit L2 (``FUSED_SPLIT``; the bits are the three-launch form's: the same partials).

    Work items are tickets ``0 .. 3 * rows * S``, taken in order from the counter ``state[0]``; per
    batch of ``BATCH`` rows: every (row, chunk)'s max, then their sums, then their outputs. A sum
    item waits (spins) until its row's S max items are counted in ``state[1 + row]``, an output item
    until its S sum items are counted in ``state[1 + rows + row]``. An item waits only for items of
    smaller tickets, which programs already running hold, so the smallest unfinished ticket can
    always run: no deadlock whatever the grid and whichever programs are resident (the interpreter,
    running programs one after another, takes every ticket in the first program). ``state`` is
    zeroed by the launcher.
    """
    per_batch = 3 * BATCH * S
    total = 3 * rows * S
    ticket = tl.atomic_add(state_ptr, 1, sem="relaxed")
    while ticket < total:
        following = tl.atomic_add(state_ptr, 1, sem="relaxed")  # taken now: its latency hides behind this item
        b = ticket // per_batch
        batch_items = tl.minimum(BATCH, rows - b * BATCH) * S
        phase = (ticket - b * per_batch) // batch_items
        k = ticket - b * per_batch - phase * batch_items
        row = (b * BATCH + k // S).to(tl.int64)
        s = k % S
        x_row = x_ptr + row * x_row_stride
        if phase == 0:
            tl.store(keys_ptr + row * S + s, _chunk_max_key(x_row, s * chunk, chunk, n, TILE))
            _publish(state_ptr + 1 + row)
        elif phase == 1:
            _wait_count(state_ptr + 1 + row, S)
            m = _row_max_of_keys(keys_ptr + row * S, S, PART, ".cg")
            part, code = _chunk_sum(x_row, m, s * chunk, chunk, n, TILE)
            tl.store(sums_ptr + row * S + s, part)
            tl.store(flags_ptr + row * S + s, code)
            _publish(state_ptr + 1 + rows + row)
        else:
            _wait_count(state_ptr + 1 + rows + row, S)
            m = _row_max_of_keys(keys_ptr + row * S, S, PART, ".cg")
            big_l = _row_sum(sums_ptr + row * S, flags_ptr + row * S, S, PART, ".cg")
            _chunk_out(x_row, y_ptr + row * y_row_stride, m, big_l, s * chunk, chunk, n, LOG, OUT, TILE,
                       "evict_first")
        ticket = following


def split_plan(rows: int, n: int) -> tuple[int, int, int]:
    """``(tile, chunk, S)`` of a split row: chunk a multiple of tile (at most PROGRAM_TILES tiles), S =
    cdiv(n, chunk) programs per row."""
    tile = min(SPLIT_TILE, MAX_BLOCK)
    tiles = cdiv(n, tile)
    per_row = max(1, cdiv(SPLIT_PROGRAMS, rows))
    chunk = tile * min(cdiv(tiles, min(tiles, per_row)), PROGRAM_TILES)
    return tile, chunk, cdiv(n, chunk)


def _partials(rows: int, parts: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The split's per-(row, chunk) partials, written before they are read (no fill): max keys (int32),
    int64 sums, non-finite flags (int32)."""
    return (torch.empty((rows, parts), dtype=torch.int32, device=device),
            torch.empty((rows, parts), dtype=torch.int64, device=device),
            torch.empty((rows, parts), dtype=torch.int32, device=device))


def _launch(x: torch.Tensor, dtype: torch.dtype | None, log: bool) -> torch.Tensor:
    op = "log_softmax" if log else "softmax"
    out_dtype = x.dtype if dtype is None else dtype
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n = x.shape[-1] if x.dim() else 1
    if n > MAX_N:
        raise ValueError(f"{op}: N = {n} exceeds the exact-sum bound {MAX_N}")
    if x.numel() == 0:
        return out
    x2 = x.contiguous().reshape(-1, n)
    y2 = out.view(-1, n)
    rows = x2.shape[0]
    if n <= MAX_BLOCK:
        block = pow2_block(n, 16, MAX_BLOCK)
        _softmax_row_kernel[(rows,)](x2, y2, n, x2.stride(0), y2.stride(0), LOG=log, OUT=OUT_CODE[out_dtype],
                                     BLOCK=block, num_warps=warps_for(block), **LAUNCH)
        return out
    if FUSED_SPLIT and _launch_fused(x2, y2, n, log, out_dtype):
        return out
    tile, chunk, parts = split_plan(rows, n)
    grid = (rows, parts)
    keys, sums, flags = _partials(rows, parts, x.device)
    warps = SPLIT_WARPS if tile == SPLIT_TILE else 1
    _split_max_kernel[grid](x2, keys, n, x2.stride(0), chunk, parts, TILE=tile, num_warps=warps, **LAUNCH)
    _split_sum_kernel[grid](x2, keys, sums, flags, n, x2.stride(0), chunk, parts, TILE=tile, PART=PART_BLOCK,
                            num_warps=warps, **LAUNCH)
    _split_out_kernel[grid](x2, y2, keys, sums, flags, n, x2.stride(0), y2.stride(0), chunk, parts, LOG=log,
                            OUT=OUT_CODE[out_dtype], TILE=tile, PART=PART_BLOCK, num_warps=warps, **LAUNCH)
    return out


def fused_plan(rows: int, n: int, itemsize: int, sms: int) -> tuple[int, int, int, int]:
    """``(chunk, S, batch, programs)`` of the fused split: ``S`` items of ``chunk`` columns a row,
    ``batch`` rows (about FUSED_BATCH_BYTES of x) a batch, ``programs`` persistent programs. An item
    is FUSED_ITEM_TILES tiles, fewer when a step would not give every program one (one token: 75
    one-tile items, not 19 of four)."""
    tile = min(SPLIT_TILE, MAX_BLOCK)
    wanted = sms * FUSED_PROGRAMS_PER_SM
    chunk = tile * max(1, min(FUSED_ITEM_TILES, PROGRAM_TILES, rows * cdiv(n, tile) // wanted))
    parts = cdiv(n, chunk)
    batch = max(1, min(rows, FUSED_BATCH_BYTES // (n * itemsize)))
    return chunk, parts, batch, max(1, min(rows * parts, wanted))


def _launch_fused(x2: torch.Tensor, y2: torch.Tensor, n: int, log: bool, out_dtype: torch.dtype) -> bool:
    """Launch the fused split; False (nothing launched) when its int32 ticket counter could overflow
    (the tickets, and two more a program past the last, from ``3 * rows * S`` on)."""
    rows = x2.shape[0]
    device = x2.device
    # the interpreter (CPU tensors) runs one program after another: a few programs are enough
    sms = sm_count(device) if device.type == "cuda" else 2
    chunk, parts, batch, programs = fused_plan(rows, n, x2.element_size(), sms)
    if 3 * rows * parts + 2 * programs >= 1 << 31:
        return False
    tile = min(SPLIT_TILE, MAX_BLOCK)
    keys, sums, flags = _partials(rows, parts, device)
    state = torch.zeros(1 + 2 * rows, dtype=torch.int32, device=device)  # ticket, then the per-row counts
    _split_fused_kernel[(programs,)](x2, y2, keys, sums, flags, state, n, x2.stride(0), y2.stride(0), chunk, parts,
                                     rows, batch, LOG=log, OUT=OUT_CODE[out_dtype], TILE=tile, PART=PART_BLOCK,
                                     num_warps=SPLIT_WARPS if tile == SPLIT_TILE else 1, **LAUNCH)
    return True


def softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``RN_out(exp_c(x - max x) ÷ L)`` over the last axis; x [*, N] fp32/bf16/fp16 on CUDA."""
    return _launch(x, dtype, log=False)


def log_softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``RN_out((x - max x) - log_c(L))`` over the last axis; x [*, N] fp32/bf16/fp16 on CUDA."""
    return _launch(x, dtype, log=True)


def static_specs(target):
    specs = []
    split = {"n": "i32", "x_row_stride": "i64", "chunk": "i32", "S": "i32", "TILE": "constexpr"}
    for dt, code in (("bf16", 1), ("fp16", 2), ("fp32", 0)):
        specs.append(("softmax", f"{dt}_split_max", _split_max_kernel,
                      {"x_ptr": f"*{dt}", "keys_ptr": "*i32", **split}, {"TILE": SPLIT_TILE},
                      {"num_warps": SPLIT_WARPS}))
        specs.append(("softmax", f"{dt}_split_sum", _split_sum_kernel,
                      {"x_ptr": f"*{dt}", "keys_ptr": "*i32", "sums_ptr": "*i64", "flags_ptr": "*i32", **split,
                       "PART": "constexpr"}, {"TILE": SPLIT_TILE, "PART": PART_BLOCK}, {"num_warps": SPLIT_WARPS}))
        for log in (False, True):
            name = "log_softmax" if log else "softmax"
            specs.append((name, f"{dt}_row", _softmax_row_kernel,
                          {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "n": "i32", "x_row_stride": "i64",
                           "y_row_stride": "i64", "LOG": "constexpr", "OUT": "constexpr", "BLOCK": "constexpr"},
                          {"LOG": log, "OUT": code, "BLOCK": MAX_BLOCK}, {"num_warps": warps_for(MAX_BLOCK)}))
            specs.append((name, f"{dt}_split_fused", _split_fused_kernel,
                          {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "keys_ptr": "*i32", "sums_ptr": "*i64",
                           "flags_ptr": "*i32", "state_ptr": "*i32", "y_row_stride": "i64", **split,
                           "rows": "i32", "BATCH": "i32", "LOG": "constexpr", "OUT": "constexpr",
                           "PART": "constexpr"},
                          {"LOG": log, "OUT": code, "TILE": SPLIT_TILE, "PART": PART_BLOCK},
                          {"num_warps": SPLIT_WARPS}))
            specs.append((name, f"{dt}_split_out", _split_out_kernel,
                          {"x_ptr": f"*{dt}", "y_ptr": f"*{dt}", "keys_ptr": "*i32", "sums_ptr": "*i64",
                           "flags_ptr": "*i32", "y_row_stride": "i64", **split, "LOG": "constexpr",
                           "OUT": "constexpr", "PART": "constexpr"},
                          {"LOG": log, "OUT": code, "TILE": SPLIT_TILE, "PART": PART_BLOCK},
                          {"num_warps": SPLIT_WARPS}))
    return specs
