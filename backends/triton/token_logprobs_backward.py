"""``token_logprobs_backward`` on Triton: the generic passes, with their large steps as kernels.

Contract ``token_logprobs_backward`` v1. The passes and the chunking are the device-generic
implementation's (``backends/generic/token_logprobs_backward.py``: its ``Steps`` hooks); every
step over ``T x V`` or ``V x H`` elements runs here as a Triton kernel, and only O(T), O(V) and
``T x H`` glue stays in torch:

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
from ._common import LAUNCH, cdiv, f32_bits
from .targets import TritonTarget
from .token_logprobs import ROW_TILE, _tlp_rows_kernel

#: (BLOCK_R, BLOCK_V, warps) of the coefficient kernel (16 token rows: one column-maxima slot each)
COEF_TILE = (16, 256, 4)
#: the same under the interpreter's small tiles (several programs per row and per column)
COEF_SMALL_TILE = (4, 32, 1)
#: (BLOCK_R, BLOCK_K) of the coefficient-digit kernel
DIGIT_TILE = (32, 64)
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
        return c, _generic._column_exponents(rowmax.amax(dim=0).view(torch.float32), rowbad.amax(dim=0) != 0)

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
        return _generic._column_exponents(colmax.amax(dim=0).view(torch.float32), colbad.amax(dim=0) != 0)

    def finish(self, acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        # C_BITS + O_BITS == X_BITS + W_BITS (47) and the same sentinel: linear_finish's kernel is this rounding
        return L.linear_finish(acc, ex, ew, None, torch.float32)


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
