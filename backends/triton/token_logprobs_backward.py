"""``token_logprobs_backward`` on Triton: the generic passes, with their large steps as kernels.

Contract ``token_logprobs_backward`` v1. The passes and the chunking are the device-generic
implementation's (``backends/generic/token_logprobs_backward.py``: its ``Steps`` hooks); every
step over ``T x V`` or ``V x H`` elements runs here as a Triton kernel, and so do the per-token terms, the
exponents from maxima and d_hidden's finish (as torch chains they were ~20 ms of host time in an H100
trainer step); only allocations and a few O(V) maxima stay in torch:

* the logits recomputed per token chunk: ``linear``'s fp32 epilogue (:func:`.linear.logits`,
  the same contract ``linear`` v2 product rounded once), one launch for the whole vocabulary
  (more than 64 tokens on sm_90: the wgmma GEMM on the weight's planes made for the call), then
  the same IEEE division by tau;
* each chunk's row max and exact grid sum ``S``: ``token_logprobs``' per-token pass
  (``_tlp_rows_kernel``, PHASE 3) over the stored rows;
* the exponents of the columns of W and h (the rows of W.T and h.T that meet the coefficients):
  ``_tlb_column_max_kernel``, row tiles read contiguously, a maximum per tile and column, then the
  integer maximum over the tiles;
* the coefficients ``c = RN32(s * a)`` (``_tlb_coefficients_kernel``), with the maxima of the
  finite ``|c|`` per column (d_weight's grids) and per row (d_hidden's grids) and the non-finite
  flags, one slot per tile, merged as integer maxima of the fp32 bits (no atomics: an integer
  ``atomic_max`` is a compare-and-swap loop on gfx90a);
* ``d_hidden``'s ``c @ W`` over vocabulary chunks and ``d_weight``'s ``c.T @ h``: the exact int64
  ``C`` of ``linear``'s GEMM kernel (:func:`.linear.partial_from_planes`). The fp32 coefficient
  rows go on their 28-bit grids as four balanced base-128 int8 digits (``_tlb_digits_kernel``:
  ``linear``'s digit kernel rounds bf16/fp16 grids only, a 24-bit significand needs
  :func:`._tl_exact.grid_int_f32`); the other operand (W.T or h.T, bf16/fp16, strided views) gets
  its three digits from ``linear``'s digit kernel on the given exponents;
* each token chunk's ``finite``, ``m0``, ``L = RN32(S 2**-40)`` and the target's coefficient ``a_y``
  (``_tlb_tokens_kernel``), the grid exponents of rows or columns from their maxima
  (``_tlb_exponents_kernel``), and d_hidden from the two int64 words of its exact sums
  (``_tlb_finish_hidden_kernel``, ``int2_to_out``: one rounding);
* the one rounding of d_weight's exact sums, ``RN32(C 2**(ec + eh - 47))`` over ``V x H``
  elements: the grids are ``linear``'s (28 + 21 bits, and so is the sentinel), so where pass A
  kept every token's coefficients the product runs with ``linear``'s fp32 epilogue
  (:func:`.linear.output_from_planes`, the whole vocabulary in one block: no int64 ``C`` in
  memory), else ``linear``'s finish kernel rounds the summed ``C`` (:func:`.linear.linear_finish`).

Every step is exact or rounded once as the contract says, so the bits are those of the generic
backward (the conformance suite checks both against the golden hashes; the interpreter runs the
kernels with small tiles and several token chunks). Why: on the H200 (profile at 34eee00, 1 layer,
2 x 64 tokens) the torch steps of this backward were ~130 ms of int64 elementwise kernels per
call. ``tools/tlb_bytes.py`` counts the bytes they move at T = 128, V = 151 936, H = 1024: 278 GB,
of which d_weight's finish 227 GB, the row sums 22 GB, the coefficients and their maxima 12.5 GB,
the coefficient digits 11 GB and W's column exponents 5.6 GB; with these kernels 2.2 GB remain.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from rlkernel.backends.generic import token_logprobs_backward as _generic

from . import _tl_exact as E
from . import linear as L
from ._common import LAUNCH, OUT_CODE, cdiv, f32_bits
from .targets import TritonTarget
from .token_logprobs import ROW_TILE, _tlp_rows_kernel

#: (BLOCK_R, BLOCK_V, warps) of the coefficient kernel (16 token rows: one column-maxima slot each)
COEF_TILE = (16, 256, 4)
#: the same under the interpreter's small tiles (several programs per row and per column)
COEF_SMALL_TILE = (4, 32, 1)
#: (BLOCK_R, BLOCK_K) of the coefficient-digit kernel
DIGIT_TILE = (32, 64)
#: token rows per program of the per-token terms (finite, m0, L, a_y)
TOKEN_BLOCK = 128
#: rows or columns per program of the grid exponents from their maxima
EXPONENT_BLOCK = 512
#: (BLOCK_M, BLOCK_N) of d_hidden's finish from its two int64 words
FINISH_TILE = (16, 128)
#: (BLOCK_R, BLOCK_C) of the column maxima of W / h (64 rows a slot: 2374 slots of H for Qwen3's vocabulary)
COLUMN_TILE = (64, 128)


@triton.jit
def _tlb_coefficients_kernel(z_ptr, stride_z, c_ptr, m_ptr, total_ptr, ay_ptr, s_ptr, y_ptr, finite_ptr,
                             colmax_ptr, colbad_ptr, rowmax_ptr, rowbad_ptr, R, V,
                             COLUMNS: tl.constexpr, ROWS: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_V: tl.constexpr, ENTROPY: tl.constexpr):
    """A BLOCK_R x BLOCK_V tile of the coefficients of logits rows z (fp32, row stride ``stride_z``):
    ``c = RN32(s * a)``, ``a = -RN32(exp_c(z - m0) / L)`` off the row's target column ``y`` (local:
    outside [0, V) when it lies elsewhere) and ``a_y`` on it, NaN on rows whose max is not finite;
    stored to c [R, V] (contiguous).

    ENTROPY (contract ``token_entropy_backward``): ``ay_ptr`` holds each row's ``mean`` and ``y_ptr`` is
    unused; ``d = RN32(z - m0)``, ``q = RN32(exp_c(d) / L)``, ``a = RN32(q * RN32(d + mean))`` (0 where
    ``exp_c(d) = 0``) and ``c = RN32((-s) * a)``, the negation by the product's sign bit (the same bits).

    COLUMNS: the tile's max finite ``|c|`` per column (int32 bits: their integer order is the fp32
    order) and whether the column holds a non-finite c, stored to this row tile's slots
    ``[pid_r, V]``; ROWS: the same per row to this column tile's slots ``[pid_v, R]``. The host
    takes the integer maxima over the slots (no atomics: an integer ``atomic_max`` is a
    compare-and-swap loop on gfx90a).
    """
    pid_r = tl.program_id(0)
    pid_v = tl.program_id(1)
    rr = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rv = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    r_ok = rr < R
    v_ok = rv < V
    mask = r_ok[:, None] & v_ok[None, :]
    z = tl.load(z_ptr + rr[:, None].to(tl.int64) * stride_z + rv[None, :], mask=mask, other=0.0)
    m0 = tl.load(m_ptr + rr, mask=r_ok, other=0.0)
    total = tl.load(total_ptr + rr, mask=r_ok, other=1.0)
    a_y = tl.load(ay_ptr + rr, mask=r_ok, other=0.0)
    s = tl.load(s_ptr + rr, mask=r_ok, other=0.0)
    y = tl.load(y_ptr + rr, mask=r_ok, other=-1)
    finite = tl.load(finite_ptr + rr, mask=r_ok, other=0) != 0
    d = z - m0[:, None]
    p = E.exp_c(d)
    q = tl.math.div_rn(p, total[:, None])
    if ENTROPY:
        a = tl.where(p == 0.0, 0.0, q * (d + a_y[:, None]))
        c = E.f32_from_bits(E.f32_bits(s[:, None] * a) ^ -2147483648)  # (-s) a: the sign bit of s a
    else:
        a = E.f32_from_bits(E.f32_bits(q) ^ -2147483648)  # -q by its sign bit (a negation may compile to 0 - q)
        a = tl.where(rv[None, :] == y[:, None], a_y[:, None], a)
        c = s[:, None] * a
    c = tl.where(finite[:, None], c, E.canonical_nan_f32(c))
    tl.store(c_ptr + rr[:, None].to(tl.int64) * V + rv[None, :], c, mask=mask)
    live = E.is_finite(c)
    mag = tl.where(mask & live, E.abs_bits(c), 0)
    bad = (mask & ~live).to(tl.int32)
    if COLUMNS:
        col_slots = pid_r.to(tl.int64) * V + rv
        tl.store(colmax_ptr + col_slots, tl.max(mag, axis=0), mask=v_ok)
        tl.store(colbad_ptr + col_slots, tl.max(bad, axis=0), mask=v_ok)
    if ROWS:
        row_slots = pid_v.to(tl.int64) * R + rr
        tl.store(rowmax_ptr + row_slots, tl.max(mag, axis=1), mask=r_ok)
        tl.store(rowbad_ptr + row_slots, tl.max(bad, axis=1), mask=r_ok)


@triton.jit
def _tlb_tokens_kernel(z_ptr, stride_z, m_ptr, sint_ptr, y_ptr, finite_ptr, m0_ptr, total_ptr, ay_ptr, R, V,
                       BLOCK: tl.constexpr):
    """Per token row of logits z (fp32, row stride ``stride_z``): ``finite = isfinite(m)``, ``m0`` (m, or 0
    where not finite), ``total = L = RN32(S 2**-40)`` (1 where not finite) and the target's
    ``a_y = RN32(RN32((S - RNE(p_y 2**40)) 2**-40) / L)``, ``p_y = exp_c(RN32(z[y] - m0))``, the column
    ``y`` clamped to [0, V) (a target in another shard: a_y unused there). The generic
    ``Steps.token_terms``' torch operations (~150 launches a token chunk) in one launch."""
    rr = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rr < R
    m = tl.load(m_ptr + rr, mask=ok, other=0.0)
    s_int = tl.load(sint_ptr + rr, mask=ok, other=0)
    y = tl.load(y_ptr + rr, mask=ok, other=0)
    finite = E.is_finite(m)
    m0 = tl.where(finite, m, 0.0)
    total = tl.where(finite, E.from_fixed(s_int, 0, 40), 1.0)
    col = tl.minimum(tl.maximum(y, 0), V - 1)
    z_y = tl.load(z_ptr + rr.to(tl.int64) * stride_z + col, mask=ok, other=0.0)
    p_y = E.exp_c(z_y - m0)
    rest = s_int - E.to_fixed(p_y, 0, 40)
    a_y = tl.math.div_rn(E.from_fixed(rest, 0, 40), total)
    tl.store(finite_ptr + rr, finite.to(tl.int8), mask=ok)
    tl.store(m0_ptr + rr, m0, mask=ok)
    tl.store(total_ptr + rr, total, mask=ok)
    tl.store(ay_ptr + rr, a_y, mask=ok)


@triton.jit
def _tlb_exponents_kernel(max_ptr, bad_ptr, e_ptr, C, BLOCK: tl.constexpr):
    """The grid exponents of C rows or columns from their maxima: ``max_ptr`` the max finite ``|t|``
    (int32 bits), ``bad_ptr`` nonzero where one holds NaN/inf. ``e`` with ``2**(e-1) <= max < 2**e``,
    ``ZERO_EXP`` (-149) for a zero max, ``SENTINEL`` (2**20) for a non-finite one: the generic
    ``_column_exponents`` in one launch."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < C
    a = tl.load(max_ptr + cols, mask=ok, other=0)
    bad = tl.load(bad_ptr + cols, mask=ok, other=0)
    e = tl.where(a == 0, -149, E.expo_from_abs_bits(a))
    e = tl.where(bad != 0, 1048576, e)
    tl.store(e_ptr + cols, e.to(tl.int64), mask=ok)


@triton.jit
def _tlb_finish_hidden_kernel(hi_ptr, lo_ptr, ex_ptr, ew_ptr, y_ptr, M, N, OUT: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """d_hidden's rows from the two exact int64 words of their sums: ``y = RN_OUT((hi 2**32 + lo)
    2**(ex + ew - 47))`` in one rounding (``int2_to_out``), NaN where the row's ``ex`` or the column's
    ``ew`` is the sentinel; hi, lo [M, N] int64 and y [M, N] contiguous."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    mask = m_ok[:, None] & n_ok[None, :]
    offs = rm.to(tl.int64)[:, None] * N + rn[None, :]
    hi = tl.load(hi_ptr + offs, mask=mask, other=0)
    lo = tl.load(lo_ptr + offs, mask=mask, other=0)
    ex = tl.load(ex_ptr + rm, mask=m_ok, other=0)
    ew = tl.load(ew_ptr + rn, mask=n_ok, other=0)
    bad = (ex == 1048576)[:, None] | (ew == 1048576)[None, :]
    k = tl.where(ex == 1048576, 0, ex)[:, None] + tl.where(ew == 1048576, 0, ew)[None, :] - 47
    y = E.int2_to_out(hi, lo, 32, k, OUT)
    y = tl.where(bad, E.canonical_nan_f32(y), y)
    tl.store(y_ptr + offs, E.cast_out(y, OUT), mask=mask)


@triton.jit
def _tlb_digits_kernel(c_ptr, stride_r, stride_k, e_ptr, d_ptr, R, K, plane,
                       BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """The four balanced base-128 int8 digit planes [4, R, K] (contiguous, ``plane`` = R * K elements
    apart) of fp32 rows c [R, K] (any strides: a block of coefficient rows, or its transpose) on
    their 28-bit grids ``e`` [R] (SENTINEL rows give zeros)."""
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rk = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    r_ok = rr < R
    mask = r_ok[:, None] & (rk < K)[None, :]
    x = tl.load(c_ptr + rr[:, None].to(tl.int64) * stride_r + rk[None, :].to(tl.int64) * stride_k, mask=mask,
                other=0.0)
    e = tl.load(e_ptr + rr, mask=r_ok, other=0).to(tl.int32)
    live = e != 1048576
    g = tl.where(live[:, None], E.grid_int_f32(x, tl.where(live, e, 0)[:, None], 27), 0)
    d0, d1, d2, d3 = E.split4(g)
    out = d_ptr + rr[:, None].to(tl.int64) * K + rk[None, :]
    tl.store(out, d0, mask=mask)
    tl.store(out + plane, d1, mask=mask)
    tl.store(out + 2 * plane, d2, mask=mask)
    tl.store(out + 3 * plane, d3, mask=mask)


@triton.jit
def _tlb_column_max_kernel(t_ptr, R, C, colmax_ptr, colbad_ptr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per column of a row tile of t [R, C] (bf16/fp16/fp32, contiguous): the max finite ``|t|`` (int32
    bits) and whether it holds NaN/inf, stored to the tile's slots ``[pid_r, C]`` (the host takes the
    integer maxima over the row tiles)."""
    pid_r = tl.program_id(0)
    rr = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = rc < C
    mask = (rr < R)[:, None] & c_ok[None, :]
    x = E.upcast(tl.load(t_ptr + rr[:, None].to(tl.int64) * C + rc[None, :], mask=mask, other=0.0))
    live = E.is_finite(x)
    slots = pid_r.to(tl.int64) * C + rc
    tl.store(colmax_ptr + slots, tl.max(tl.where(mask & live, E.abs_bits(x), 0), axis=0), mask=c_ok)
    tl.store(colbad_ptr + slots, tl.max((mask & ~live).to(tl.int32), axis=0), mask=c_ok)


class TritonSteps(_generic.Steps):
    """The generic backward's products on ``linear``'s int8 Triton kernels, its large steps on this
    module's kernels, for one target."""

    #: pass B's product is one fused launch a block (no int64 ``C`` in memory): the whole vocabulary
    #: in one block on an 80 GB GPU (the coefficient planes of 256 tokens: 155 MB)
    weight_block_scale = 8

    def __init__(self, target: TritonTarget) -> None:
        self.target = target

    def fill_logits(self, z: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, vc: int,
                    tau: torch.Tensor | None) -> None:
        # one launch writes every vocabulary row's logits into z (the weight's digits made in registers;
        # or, where the wgmma GEMM takes these rows, the weight's planes made for this call: 3 bytes a
        # weight element, 467 MB for Qwen3's LM head), then the same IEEE division by tau in place
        L.logits(hidden, weight, L.weight_exponents(weight), target=self.target, out=z, planes=True)
        if tau is not None:
            z.div_(tau)

    def exact_finish(self, x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        # linear's GEMM with its fp32 epilogue: the grids are linear's (28 + 21 bits, the same sentinel),
        # so the epilogue is finish()'s rounding and the int64 C never goes through memory
        if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
            return self.finish(self.exact(x, w, ex, ew), ex, ew)
        planes = coefficient_digits(x, ex)
        return L.output_from_planes(planes, ex, w, ew, torch.float32, target=self.target)

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor, vc: int,
               tau: torch.Tensor | None) -> Iterator[tuple[int, int, torch.Tensor]]:
        ew = L.weight_exponents(weight)
        for v0 in range(0, weight.shape[0], vc):
            v1 = min(v0 + vc, weight.shape[0])
            z = L.logits(hidden, weight[v0:v1], ew[v0:v1], target=self.target)
            yield v0, v1, z if tau is None else z / tau  # one IEEE division, as the generic _divide

    def exact(self, x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
            return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
        return L.partial_from_planes(coefficient_digits(x, ex), ex, w, ew, target=self.target)

    def row_stats(self, z: torch.Tensor, vs: int) -> tuple[torch.Tensor, torch.Tensor]:
        # token_logprobs' per-token pass (PHASE 3) over the stored rows, at temperature 1: z / 1 == z
        r, v = z.shape
        m = torch.empty(r, dtype=torch.float32, device=z.device)
        s_int = torch.empty(r, dtype=torch.int64, device=z.device)
        if r == 0:
            return m, s_int
        flags = torch.empty(r, dtype=torch.int32, device=z.device)  # target logit bits, above-max flags: unused
        zeros = torch.zeros(r, dtype=torch.int64, device=z.device)  # target column 0 (its logit is unused)
        block, warps = (32, 1) if L.SMALL_TILES else ROW_TILE
        _tlp_rows_kernel[(r,)](z, z.stride(0), zeros, m, flags, flags, s_int, flags, flags, 0, v, 0, f32_bits(1.0),
                               PHASE=3, BLOCK=block, num_warps=warps, **LAUNCH)
        return m, s_int

    def token_terms(self, z: torch.Tensor, m: torch.Tensor, s_int: torch.Tensor,
                    local_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        r, v = z.shape
        dev = z.device
        finite = torch.empty(r, dtype=torch.bool, device=dev)
        m0, total, a_y = (torch.empty(r, dtype=torch.float32, device=dev) for _ in range(3))
        if r and v:
            _tlb_tokens_kernel[(cdiv(r, TOKEN_BLOCK),)](
                z, z.stride(0), m.contiguous(), s_int.contiguous(), local_y.contiguous(), finite.view(torch.int8),
                m0, total, a_y, r, v, BLOCK=TOKEN_BLOCK, num_warps=4, **LAUNCH)
        elif r:  # V = 0 (the public ops refuse an empty vocabulary): what the generic steps do with it
            return super().token_terms(z, m, s_int, local_y)
        return finite, m0, total, a_y

    def coefficients(self, z: torch.Tensor, m0: torch.Tensor, total: torch.Tensor, a_y: torch.Tensor,
                     s: torch.Tensor, local_y: torch.Tensor, finite: torch.Tensor, vs: int,
                     columns: tuple[torch.Tensor, torch.Tensor] | None,
                     row_exponents: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.launch_coefficients(z, m0, total, a_y, s, local_y, finite, columns, row_exponents, False)

    def launch_coefficients(self, z: torch.Tensor, m0: torch.Tensor, total: torch.Tensor, a_y: torch.Tensor,
                            s: torch.Tensor, local_y: torch.Tensor, finite: torch.Tensor,
                            columns: tuple[torch.Tensor, torch.Tensor] | None, row_exponents: bool,
                            entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`coefficients` by ``_tlb_coefficients_kernel``; ``entropy``: its ENTROPY mode (``a_y`` is
        then each row's mean, ``local_y`` any int64 [r])."""
        r, v = z.shape
        dev = z.device
        c = torch.empty((r, v), dtype=torch.float32, device=dev)
        if r == 0 or v == 0:
            return c, _generic._exponents(c) if row_exponents else None
        br, bv, warps = COEF_SMALL_TILE if L.SMALL_TILES else COEF_TILE
        grid = (cdiv(r, br), cdiv(v, bv))
        i32 = torch.int32
        colmax = torch.empty((grid[0], v) if columns is not None else (1,), dtype=i32, device=dev)
        colbad = torch.empty_like(colmax)
        rowmax = torch.empty((grid[1], r) if row_exponents else (1,), dtype=i32, device=dev)
        rowbad = torch.empty_like(rowmax)
        _tlb_coefficients_kernel[grid](
            z, z.stride(0), c, m0.contiguous(), total.contiguous(), a_y.contiguous(), s.contiguous(),
            local_y.contiguous(), finite.to(i32), colmax, colbad, rowmax, rowbad, r, v,
            COLUMNS=columns is not None, ROWS=row_exponents, BLOCK_R=br, BLOCK_V=bv, ENTROPY=entropy,
            num_warps=warps, **LAUNCH)
        if columns is not None:  # fp32 >= 0: the integer maximum of the bits is the fp32 maximum
            running = columns[0].view(i32)
            torch.maximum(running, colmax.amax(dim=0), out=running)
            columns[1].logical_or_(colbad.amax(dim=0) != 0)
        if not row_exponents:
            return c, None
        return c, grid_exponents(rowmax.amax(dim=0), rowbad.amax(dim=0))

    def column_exponents(self, t: torch.Tensor) -> torch.Tensor:
        r, c = t.shape
        if r == 0 or c == 0:
            return _generic._exponents(t.T)  # ZERO_EXP for every column (none when C = 0)
        t = t.contiguous()
        br, bc = COLUMN_TILE
        colmax = torch.empty((cdiv(r, br), c), dtype=torch.int32, device=t.device)
        colbad = torch.empty_like(colmax)
        _tlb_column_max_kernel[(cdiv(r, br), cdiv(c, bc))](t, r, c, colmax, colbad, BLOCK_R=br, BLOCK_C=bc,
                                                           num_warps=4, **LAUNCH)
        return grid_exponents(colmax.amax(dim=0), colbad.amax(dim=0))

    def finish_hidden(self, hi: torch.Tensor, lo: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                      out: torch.Tensor) -> None:
        m, n = out.shape
        if m and n:
            bm, bn = FINISH_TILE
            _tlb_finish_hidden_kernel[(cdiv(m, bm), cdiv(n, bn))](
                hi, lo, ex.contiguous(), ew.contiguous(), out, m, n, OUT=OUT_CODE[out.dtype], BLOCK_M=bm, BLOCK_N=bn,
                num_warps=4, **LAUNCH)

    def maxima_exponents(self, colmax: torch.Tensor, colbad: torch.Tensor) -> torch.Tensor:
        # fp32 >= 0: the bits are what the coefficient kernel's slots hold
        return grid_exponents(colmax.view(torch.int32), colbad.to(torch.int32))

    def finish(self, acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        # C_BITS + O_BITS == X_BITS + W_BITS (47) and the same sentinel: linear_finish's kernel is this rounding
        return L.linear_finish(acc, ex, ew, None, torch.float32)


def grid_exponents(top: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    """int64 [C]: the grid exponents of C rows or columns from ``top`` (int32 [C], the bits of each one's
    max finite ``|t|``) and ``bad`` (int32 [C], nonzero where one holds NaN/inf), by
    ``_tlb_exponents_kernel`` (the generic ``_column_exponents``' rule)."""
    n = top.shape[0]
    e = torch.empty(n, dtype=torch.int64, device=top.device)
    if n:
        _tlb_exponents_kernel[(cdiv(n, EXPONENT_BLOCK),)](top.contiguous(), bad.contiguous(), e, n,
                                                          BLOCK=EXPONENT_BLOCK, num_warps=4, **LAUNCH)
    return e


def coefficient_digits(x: torch.Tensor, ex: torch.Tensor) -> torch.Tensor:
    """int8 [4, R, K]: balanced base-128 digits (each in [-64, 64]) of fp32 x [R, K] (any strides) on the
    28-bit row grids ``ex`` int64 [R] (``_generic.C_BITS``), zeros on SENTINEL rows: one exact split of
    the grid integers that ``_digits_f32`` splits too (the digits may differ, the integers do not)."""
    r, k = x.shape
    planes = torch.empty((_generic.C_DIGITS, r, k), dtype=torch.int8, device=x.device)
    if r and k:
        br, bk = DIGIT_TILE
        _tlb_digits_kernel[(cdiv(r, br), cdiv(k, bk))](x, x.stride(0), x.stride(1), ex.contiguous(), planes, r, k,
                                                       r * k, BLOCK_R=br, BLOCK_K=bk, num_warps=4, **LAUNCH)
    return planes


def token_logprobs_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            temperature: float = 1.0, need_hidden: bool = True, need_weight: bool = True, *,
                            target: TritonTarget) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Kernel ``token_logprobs_backward``: the generic backward with :class:`TritonSteps`
    (arguments and results as :func:`rlkernel.backends.generic.token_logprobs_backward.token_logprobs_backward`)."""
    return _generic.backward_with(TritonSteps(target), grad, hidden, weight, targets, temperature, need_hidden,
                                  need_weight)


def token_logprobs_backward_partial(grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor,
                                    targets: torch.Tensor, vocab_start: int, row_max: torch.Tensor,
                                    sum_int: torch.Tensor, temperature: float = 1.0,
                                    exponents: tuple[torch.Tensor, torch.Tensor] | None = None,
                                    need_weight: bool = True, *,
                                    target: TritonTarget) -> tuple[torch.Tensor | None, ...]:
    """Kernel ``token_logprobs_backward_partial``: one vocabulary shard's part, with :class:`TritonSteps`
    (as :func:`rlkernel.backends.generic.token_logprobs_backward.token_logprobs_backward_partial`)."""
    return _generic.partial_with(TritonSteps(target), grad, hidden, weight_shard, targets, vocab_start, row_max,
                                 sum_int, temperature, exponents, need_weight)


def static_specs(target: TritonTarget):
    """The ``linear`` kernel specialisations this op launches beyond those ``linear`` lists: the
    weight's row exponents alone, the digit planes of W.T / h.T on given exponents, the exact
    int64 products on both paths (T <= 64 rows: decode tiles reading the bf16 operand; more:
    prefill tiles on int8 planes, K split with int64 atomics when the tiles are few), and the
    finish kernel rounding d_weight to fp32 without a bias."""
    prefill, decode = L.gemm_tiles(target)
    return [
        L.digits_spec("token_logprobs_backward", "bf16_weight_exponents", "bf16", has_e=False, write=False, bits=20),
        L.digits_spec("token_logprobs_backward", "bf16_transposed_digits_given_exponents", "bf16", has_e=True,
                      write=True, bits=20),
        L.gemm_spec("token_logprobs_backward", "decode_int64_partial", "*bf16", "*i64", decode, w_digits=False,
                    finish=False),
        L.gemm_spec("token_logprobs_backward", "prefill_int64_partial", "*i8", "*i64", prefill, w_digits=True,
                    finish=False),
        L.gemm_spec("token_logprobs_backward", "prefill_split_k_int64_atomic", "*i8", "*i64", prefill,
                    w_digits=True, finish=False, atomic=True),
        L.finish_spec("token_logprobs_backward", "d_weight_finish_fp32_out", "*fp32", bias=False, out=0),
        ("token_logprobs_backward", "column_maxima_bf16", _tlb_column_max_kernel,
         {"t_ptr": "*bf16", "R": "i32", "C": "i32", "colmax_ptr": "*i32", "colbad_ptr": "*i32",
          "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"}, {"BLOCK_R": COLUMN_TILE[0], "BLOCK_C": COLUMN_TILE[1]}),
        ("token_logprobs_backward", "coefficient_digits", _tlb_digits_kernel,
         {"c_ptr": "*fp32", "stride_r": "i64", "stride_k": "i64", "e_ptr": "*i64", "d_ptr": "*i8", "R": "i32",
          "K": "i32", "plane": "i64", "BLOCK_R": "constexpr", "BLOCK_K": "constexpr"},
         {"BLOCK_R": DIGIT_TILE[0], "BLOCK_K": DIGIT_TILE[1]}),
        ("token_logprobs_backward", "d_hidden_finish_bf16", _tlb_finish_hidden_kernel,
         {"hi_ptr": "*i64", "lo_ptr": "*i64", "ex_ptr": "*i64", "ew_ptr": "*i64", "y_ptr": "*bf16", "M": "i32",
          "N": "i32", "OUT": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr"},
         {"OUT": 1, "BLOCK_M": FINISH_TILE[0], "BLOCK_N": FINISH_TILE[1]}),
        ("token_logprobs_backward", "grid_exponents", _tlb_exponents_kernel,
         {"max_ptr": "*i32", "bad_ptr": "*i32", "e_ptr": "*i64", "C": "i32", "BLOCK": "constexpr"},
         {"BLOCK": EXPONENT_BLOCK}),
        ("token_logprobs_backward", "token_terms", _tlb_tokens_kernel,
         {"z_ptr": "*fp32", "stride_z": "i64", "m_ptr": "*fp32", "sint_ptr": "*i64", "y_ptr": "*i64",
          "finite_ptr": "*i8", "m0_ptr": "*fp32", "total_ptr": "*fp32", "ay_ptr": "*fp32", "R": "i32", "V": "i32",
          "BLOCK": "constexpr"}, {"BLOCK": TOKEN_BLOCK}),
    ] + [coefficients_spec("token_logprobs_backward", cols, rows, False) for cols in (True, False)
         for rows in (True, False)]


def coefficients_spec(op: str, cols: bool, rows: bool, entropy: bool):
    """A static-check spec of ``_tlb_coefficients_kernel`` (this module's and ``token_entropy``'s ``static_specs``)."""
    return (op, f"coefficients{'_columns' if cols else ''}{'_rows' if rows else ''}", _tlb_coefficients_kernel,
            {"z_ptr": "*fp32", "stride_z": "i64", "c_ptr": "*fp32", "m_ptr": "*fp32", "total_ptr": "*fp32",
             "ay_ptr": "*fp32", "s_ptr": "*fp32", "y_ptr": "*i64", "finite_ptr": "*i32", "colmax_ptr": "*i32",
             "colbad_ptr": "*i32", "rowmax_ptr": "*i32", "rowbad_ptr": "*i32", "R": "i32", "V": "i32",
             "COLUMNS": "constexpr", "ROWS": "constexpr", "BLOCK_R": "constexpr", "BLOCK_V": "constexpr",
             "ENTROPY": "constexpr"},
            {"COLUMNS": cols, "ROWS": rows, "BLOCK_R": COEF_TILE[0], "BLOCK_V": COEF_TILE[1], "ENTROPY": entropy},
            {"num_warps": COEF_TILE[2]})
