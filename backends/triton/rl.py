"""RL ops on Triton: ``kl_k3`` and ``kl_k3_backward``, ``masked_mean`` and ``masked_mean_backward``,
``ppo_loss`` (forward) and ``group_advantages``.

The reductions are the exact superaccumulator (P10, ``_tl_superacc``): a **row kernel** (grid =
row blocks x column splits) makes the terms in registers (the kept ``x``, or the PPO token loss
from ``logp``, ``old_logp`` and the advantages), sums their int64 limb contributions per row,
rounds each row's exact sum for ``seq-mean-token-mean`` (``m_b = RN32(S_b) ÷ fp32(c_b)``,
re-accumulated in the same program), normalises the program's state and adds it with int64
atomics into a zeroed global state (exact in any order); a one-program **finish kernel**
rounds the merged state once and divides by fp32(denominator or count), or writes the
canonical partial. Three launches (zero-fill, rows, finish), no host read of device values, so
the launchers can be captured in a CUDA graph. ``group_advantages`` is one launch: a program owns
whole groups. ``masked_mean_backward``: zero-fill, a counts kernel (c_b and the totals by int64
atomics), a write kernel. Merging given ``partials`` is the finish kernel over their rows (slot-wise
int64 sums, one launch); the PPO backward runs the device-generic torch code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from rlkernel import dispatch
from rlkernel.backends.generic import rl as _generic

from . import _tl_exact as E
from . import _tl_superacc as S
from ._common import LAUNCH, cdiv, f32_bits

BLOCK = 1024
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
#: (rows per program, columns per step) of the row kernels, by row length: every shape one of these
TILES = ((32, 16), (8, 64), (1, 512))
#: warps of the row kernels (the 16-limb one-hot of a [rows, columns] step lives in registers)
ROW_WARPS = 8
#: group_advantages' tile and warps for groups of fewer than 64 rewards (GRPO's 4-64 samples a
#: prompt): 4 groups a program, so 512 groups make 128 programs (32 a program gave 16 programs on
#: 132 SMs: 50 us on an H100 for 8192 rewards); longer groups take the row kernels' tiles
GROUP_TILE = (4, 16)
GROUP_WARPS = 2
#: token-mean splits long rows over programs up to about this many programs
TARGET_PROGRAMS = 256
#: longest row the kernels take (one program's raw limb sums stay below 2**23 terms); longer rows
#: run the device-generic code
MAX_ROW = 1 << 22
#: the variant reported (``cuda:rl.masked_mean[torch-exact]``) where the device-generic torch code runs
GENERIC_VARIANT = "torch-exact"
#: test hook: tiles of 2 rows x 16 columns and column splits of one step, so the cross-program
#: atomic merges, the row-block merges and the column loops all run at small sizes
SMALL_TILES = False
SMALL_TILE = (2, 16)


@triton.jit
def _kl_k3_fwd_kernel(lp_ptr, ref_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    lp = tl.load(lp_ptr + offs, mask=mask, other=0.0)
    ref = tl.load(ref_ptr + offs, mask=mask, other=0.0)
    d = ref - lp
    tl.store(y_ptr + offs, E.nan_to_canonical((E.exp_c(d) - d) - 1.0), mask=mask)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Kernel ``kl_k3``: ``(exp_c(d) - d) - 1``, ``d = ref_logp - logp``; fp32 [*] elementwise."""
    lp = logp.to(torch.float32).contiguous()
    ref = ref_logp.to(torch.float32).contiguous()
    out = torch.empty(lp.shape, dtype=torch.float32, device=lp.device)
    n = lp.numel()
    if n:
        _kl_k3_fwd_kernel[(cdiv(n, BLOCK),)](lp, ref, out, n, BLOCK=BLOCK, num_warps=4, **LAUNCH)
    return out


@triton.jit
def _kl_k3_bwd_kernel(g_ptr, lp_ptr, ref_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    lp = tl.load(lp_ptr + offs, mask=mask, other=0.0)
    ref = tl.load(ref_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, E.nan_to_canonical(g * (1.0 - E.exp_c(ref - lp))), mask=mask)


def kl_k3_backward(grad: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Kernel ``kl_k3_backward``: ``RN32(g * RN32(1 - exp_c(RN32(ref_logp - logp))))``, fp32 [*] elementwise.

    Parameters
    ----------
    grad, logp, ref_logp : Tensor, float32, one shape

    Returns
    -------
    Tensor, float32, logp's shape

    Bitwise semantics
    -----------------
    Each fp32 op one IEEE rounding (``exp_c`` the contract sequence), NaN canonical.
    """
    g = grad.to(torch.float32).contiguous()
    lp = logp.to(torch.float32).contiguous()
    ref = ref_logp.to(torch.float32).contiguous()
    out = torch.empty(lp.shape, dtype=torch.float32, device=lp.device)
    n = lp.numel()
    if n:
        _kl_k3_bwd_kernel[(cdiv(n, BLOCK),)](g, lp, ref, out, n, BLOCK=BLOCK, num_warps=4, **LAUNCH)
    return out


# --------------------------------------------------------------------------- masked means, ppo


@triton.jit
def _ppo_token(lp, old, adv, lo, hi, dual, has_dual):
    """The contract's per-token PPO loss (generic ``_ppo_tokens``), each fp32 op one rounding."""
    neg_adv = -adv
    ratio = E.exp_c(lp - old)
    clamped = tl.where(ratio < lo, lo, ratio)
    clamped = tl.where(clamped > hi, hi, clamped)  # NaN stays NaN
    pg1 = neg_adv * ratio
    pg2 = neg_adv * clamped
    tok = tl.where(pg1 < pg2, pg2, pg1)
    tok = tl.where(E.is_nan(pg1) | E.is_nan(pg2), E.canonical_nan_f32(tok), tok)
    tok = tl.where(tok == 0.0, 0.0, tok)  # R5: a zero max is +0
    pg3 = neg_adv * dual
    return tl.where((has_dual != 0) & (adv < 0.0) & (pg3 < tok), pg3, tok)


@triton.jit
def _rows_kernel(x_ptr, old_ptr, adv_ptr, m_ptr, buf_ptr, B, T, cols_per_split, mode, adv_row,
                 lo_bits, hi_bits, dual_bits, has_dual,
                 PPO: tl.constexpr, RB: tl.constexpr, TB: tl.constexpr):
    """Program (row block, column split): the normalised P10 state of its terms (21 slots) added
    into ``buf`` with int64 atomics. ``mode`` 0 token-mean, 1 seq-mean-token-mean (one split per
    row: the row sums are rounded here), 2 seq-mean-token-sum (one split: counts nonempty rows)."""
    rows = tl.program_id(0) * RB + tl.arange(0, RB)
    row_ok = rows < B
    c_begin = tl.program_id(1) * cols_per_split
    c_end = tl.minimum(c_begin + cols_per_split, T)
    lo = E.f32_from_bits(lo_bits)
    hi = E.f32_from_bits(hi_bits)
    dual = E.f32_from_bits(dual_bits)
    acc = tl.zeros((RB, 16), tl.int64)
    nan = tl.zeros((RB,), tl.int64)
    pinf = tl.zeros((RB,), tl.int64)
    ninf = tl.zeros((RB,), tl.int64)
    cnt = tl.zeros((RB,), tl.int64)
    for c0 in range(c_begin, c_end, TB):
        cols = c0 + tl.arange(0, TB)
        ok = row_ok[:, None] & (cols < c_end)[None, :]
        offs = rows.to(tl.int64)[:, None] * T + cols[None, :]
        keep = ok & (tl.load(m_ptr + offs, mask=ok, other=0) != 0)
        if PPO:
            lp = tl.load(x_ptr + offs, mask=ok, other=0.0)
            old = tl.load(old_ptr + offs, mask=ok, other=0.0)
            a_offs = tl.where(adv_row != 0, rows.to(tl.int64)[:, None] + cols[None, :] * 0, offs)
            adv = tl.load(adv_ptr + a_offs, mask=ok, other=0.0)
            t = _ppo_token(lp, old, adv, lo, hi, dual, has_dual)
        else:
            t = tl.load(x_ptr + offs, mask=ok, other=0.0)
        acc += S.raw_limbs(t, keep)
        n0, n1, n2 = S.special_counts(t, keep)
        nan += n0
        pinf += n1
        ninf += n2
        cnt += tl.sum(keep.to(tl.int64), axis=1)
    nonempty = cnt > 0
    if mode == 1:
        # m_b = RN32(exact row sum) ÷ fp32(c_b) for the nonempty rows, summed exactly
        sums = S.round_state(S.widen(acc), nan, pinf, ninf)
        m = tl.math.div_rn(sums, E.int64_to_f32(cnt))
        m = tl.where(nonempty, m, 0.0)[None, :]
        keep_m = nonempty[None, :]
        m0, m1, m2 = S.special_counts(m, keep_m)
        state = S.state_row(S.raw_limbs(m, keep_m), m0, m1, m2, nonempty.to(tl.int64))
    else:
        count = tl.where(mode == 0, cnt, nonempty.to(tl.int64))
        state = S.state_row(acc, nan, pinf, ninf, count)
    S.atomic_merge(buf_ptr, state)


@triton.jit
def _finish_kernel(buf_ptr, n_rows, out_ptr, den_bits, has_den, PARTIAL: tl.constexpr):
    """One program: the canonical partial (int64 [21]) or ``RN32(S) ÷ fp32(denominator or count)`` of the
    ``n_rows`` states at ``buf_ptr`` (int64 [n_rows, 21]): the row kernels' one atomic buffer as it is,
    or partials of micro-batches to merge, each made canonical first and then summed slot-wise (the
    generic ``superacc.merge``: fewer than 2**46 canonical states keep every limb sum below 2**62, the
    bound of ``normalize``'s carry ripple)."""
    idx = tl.arange(0, 32)[None, :]
    if n_rows == 1:
        s = tl.load(buf_ptr + idx, mask=idx < 21, other=0)
    else:
        s = tl.zeros((1, 32), tl.int64)
        for k in range(n_rows):
            row = tl.load(buf_ptr + k * 21 + idx, mask=idx < 21, other=0)
            s += tl.where(idx < 17, S.normalize(tl.where(idx < 17, row, 0)), row)
    if PARTIAL:
        canon = S.normalize(tl.where(idx < 17, s, 0))
        tl.store(out_ptr + idx, tl.where(idx < 17, canon, s), mask=idx < 21)
    else:
        total = S.round_state(s, S.col(s, 17), S.col(s, 18), S.col(s, 19))
        d = tl.where(has_den != 0, E.f32_from_bits(den_bits), E.int64_to_f32(S.col(s, 20)))
        y = E.nan_to_canonical(tl.math.div_rn(total, d))
        tl.store(out_ptr + tl.arange(0, 1), y)


def _tile(length: int) -> tuple[int, int]:
    if SMALL_TILES:
        return SMALL_TILE
    if length < 64:
        return TILES[0]
    return TILES[1] if length < 512 else TILES[2]


def _reduce(x: torch.Tensor, mask: torch.Tensor, mode: str, denominator: float | None, partial: bool,
            ppo: tuple[torch.Tensor, torch.Tensor, bool, float, float, float | None] | None) -> torch.Tensor:
    """Launch zero-fill + rows + finish for the [B, T] terms (``x``, or PPO tokens from ``x`` = logp)."""
    b, t = x.shape
    dev = x.device
    buf = torch.zeros(21, dtype=torch.int64, device=dev)
    if b and t:
        rb, tb = _tile(t)
        m = mask.contiguous().view(torch.uint8)
        n_rb = cdiv(b, rb)
        if mode == "token-mean":
            splits = max(1, min(cdiv(t, tb), TARGET_PROGRAMS // n_rb))
            if SMALL_TILES:
                splits = cdiv(t, tb)
        else:
            splits = 1
        cols = cdiv(cdiv(t, splits), tb) * tb
        splits = cdiv(t, cols)
        if ppo is None:
            old, adv, adv_row, lo, hi, dual = x, x, False, 0.0, 0.0, None
        else:
            old, adv, adv_row, lo, hi, dual = ppo
        _rows_kernel[(n_rb, splits)](
            x, old, adv, m, buf, b, t, cols, MODES.index(mode), int(adv_row),
            f32_bits(lo), f32_bits(hi), f32_bits(dual if dual is not None else 0.0), int(dual is not None),
            PPO=ppo is not None, RB=rb, TB=tb, num_warps=ROW_WARPS, **LAUNCH)
    if partial:
        out = torch.empty(21, dtype=torch.int64, device=dev)
    else:
        out = torch.empty((), dtype=torch.float32, device=dev)
    _finish(buf, 1, out, denominator, partial)
    return out


def _finish(states: torch.Tensor, n_rows: int, out: torch.Tensor, denominator: float | None, partial: bool) -> None:
    """Launch ``_finish_kernel`` over ``n_rows`` int64 states [n_rows, 21] (contiguous) into ``out``."""
    _finish_kernel[(1,)](states, n_rows, out, f32_bits(denominator if denominator is not None else 1.0),
                         int(denominator is not None), PARTIAL=partial, num_warps=1, **LAUNCH)


def _merge(partials: torch.Tensor | Sequence[torch.Tensor], denominator: float | None,
           partial: bool) -> torch.Tensor:
    """Merged partials [K, 21] (slot-wise int64 sums in the finish kernel, one launch): the canonical
    partial, or its mean."""
    states = _generic._as_partials(partials).contiguous()
    dev = states.device
    if partial:
        out = torch.empty(21, dtype=torch.int64, device=dev)
    else:
        out = torch.empty((), dtype=torch.float32, device=dev)
    _finish(states, states.shape[0], out, denominator, partial)
    return out


def _check_mode(op: str, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"{op}: mode {mode!r}; expected one of {MODES}")


def masked_mean(x: torch.Tensor | None = None, mask: torch.Tensor | None = None, mode: str = "token-mean",
                denominator: float | None = None, partial: bool = False,
                partials: torch.Tensor | Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """Kernel ``masked_mean`` (contract ``masked_mean`` v1): exact masked mean or partial.

    Parameters
    ----------
    x : Tensor, float32, [B, T]; mask : Tensor, bool, [B, T]
    mode : str
        "token-mean", "seq-mean-token-mean" or "seq-mean-token-sum".
    denominator : float, optional
        Already rounded to fp32 by the caller.
    partial : bool
        Return the canonical int64 [21] partial.
    partials : Tensor int64 [K, 21] or sequence of [21], optional
        Merged (and finished unless ``partial``) by the finish kernel: slot-wise integer sums.

    Returns
    -------
    Tensor, float32 [] or int64 [21]

    Bitwise semantics
    -----------------
    Every sum is the exact P10 superaccumulator sum (int64 limbs, merged across programs with
    integer atomics), rounded once to fp32 (RNE, sticky, subnormals exact, overflow to ±inf,
    specials by count); ``seq-mean-token-mean`` rounds each row's sum and divides by fp32(c_b)
    (``div_rn``) before the exact sum of the means; the result is ``div_rn`` by fp32(denominator
    or count), NaN canonical. Independent of the tiling and of the atomic order.
    """
    if partials is not None:
        return _merge(partials, denominator, partial)
    if x is None or mask is None:
        raise ValueError("masked_mean: give x and mask, or partials")
    _check_mode("masked_mean", mode)
    x = x.to(torch.float32).contiguous()
    if x.shape[1] > MAX_ROW:
        dispatch.note_kernel(GENERIC_VARIANT)
        return _generic.masked_mean(x, mask, mode=mode, denominator=denominator, partial=partial)
    return _reduce(x, mask, mode, denominator, partial, None)


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             clip_lo: float, clip_hi: float, dual_clip: float | None = None, mode: str = "token-mean",
             denominator: float | None = None, partial: bool = False,
             grad_output: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel ``ppo_loss`` (contract ``ppo_loss`` v1): fused token loss + exact aggregation.

    Parameters
    ----------
    logp, old_logp : Tensor, float32, [B, T]
    advantages : Tensor, float32, [B, T] or [B]
    mask : Tensor, bool, [B, T]
    clip_lo, clip_hi, dual_clip : float
        ``fp32(1 - clip_low)``, ``fp32(1 + clip_high)``, ``fp32(c)`` (host-rounded).
    mode, denominator, partial
        As in :func:`masked_mean`.
    grad_output : Tensor, float32, [], optional
        The backward (elementwise), served by the device-generic code.

    Returns
    -------
    Tensor: float32 [] loss, int64 [21] partial, or float32 [B, T] gradient

    Bitwise semantics
    -----------------
    Per token, the contract's sequence of single IEEE roundings (``exp_c`` ratio, clamp, the max
    with NaN propagated, +0 for a zero, the dual clip), then the exact reduction of
    :func:`masked_mean` over the kept tokens, fused in one row kernel.
    """
    if grad_output is not None or logp.shape[1] > MAX_ROW:
        dispatch.note_kernel(GENERIC_VARIANT)
        return _generic.ppo_loss(logp, old_logp, advantages, mask, clip_lo, clip_hi, dual_clip, mode, denominator,
                                 partial, grad_output)
    _check_mode("ppo_loss", mode)
    lp = logp.to(torch.float32).contiguous()
    adv = advantages.to(torch.float32).contiguous()
    ppo = (old_logp.to(torch.float32).contiguous(), adv, adv.dim() == 1, clip_lo, clip_hi, dual_clip)
    return _reduce(lp, mask, mode, denominator, partial, ppo)


# --------------------------------------------------------------------------- masked mean backward


@triton.jit
def _mm_counts_kernel(m_ptr, cnt_ptr, tot_ptr, B, T, RB: tl.constexpr, TB: tl.constexpr):
    """Program: the kept-token counts c_b of RB whole rows (stored), their sum and the number of
    nonempty rows added into ``tot[0]``, ``tot[1]`` with int64 atomics."""
    rows = tl.program_id(0) * RB + tl.arange(0, RB)
    row_ok = rows < B
    cnt = tl.zeros((RB,), tl.int64)
    for c0 in range(0, T, TB):
        cols = c0 + tl.arange(0, TB)
        ok = row_ok[:, None] & (cols < T)[None, :]
        keep = tl.load(m_ptr + rows.to(tl.int64)[:, None] * T + cols[None, :], mask=ok, other=0) != 0
        cnt += tl.sum(keep.to(tl.int64), axis=1)
    tl.store(cnt_ptr + rows, cnt, mask=row_ok)
    tl.atomic_add(tot_ptr, tl.sum(cnt, axis=0), sem="relaxed")
    tl.atomic_add(tot_ptr + 1, tl.sum((cnt > 0).to(tl.int64), axis=0), sem="relaxed")


@triton.jit
def _mm_bwd_kernel(g_ptr, m_ptr, cnt_ptr, tot_ptr, y_ptr, B, T, cols_per_split, mode, den_bits, has_den,
                   RB: tl.constexpr, TB: tl.constexpr):
    """Program (row block, column split): ``RN32(g ÷ D)`` (``RN32(RN32(g ÷ fp32(c_b)) ÷ D)`` for
    seq-mean-token-mean) on kept tokens, +0 elsewhere; D = fp32(denominator) or fp32(count)."""
    rows = tl.program_id(0) * RB + tl.arange(0, RB)
    row_ok = rows < B
    zero_idx = rows * 0
    g = tl.load(g_ptr + zero_idx)
    count = tl.load(tot_ptr + tl.where(mode == 0, zero_idx, zero_idx + 1))
    d = tl.where(has_den != 0, E.f32_from_bits(den_bits), E.int64_to_f32(count))
    c_b = tl.load(cnt_ptr + rows, mask=row_ok, other=0)
    v = tl.where(mode == 1, tl.math.div_rn(tl.math.div_rn(g, E.int64_to_f32(c_b)), d), tl.math.div_rn(g, d))
    v = E.nan_to_canonical(v)
    c_begin = tl.program_id(1) * cols_per_split
    c_end = tl.minimum(c_begin + cols_per_split, T)
    for c0 in range(c_begin, c_end, TB):
        cols = c0 + tl.arange(0, TB)
        ok = row_ok[:, None] & (cols < c_end)[None, :]
        offs = rows.to(tl.int64)[:, None] * T + cols[None, :]
        keep = tl.load(m_ptr + offs, mask=ok, other=0) != 0
        tl.store(y_ptr + offs, tl.where(keep, v[:, None], 0.0), mask=ok)


def masked_mean_backward(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                         denominator: float | None = None) -> torch.Tensor:
    """Kernel ``masked_mean_backward`` (contract ``masked_mean_backward`` v1): zero-fill, counts, write.

    Parameters
    ----------
    grad : Tensor, float32, []
    mask : Tensor, bool, [B, T]
    mode : str
    denominator : float, optional
        Already rounded to fp32 by the caller.

    Returns
    -------
    Tensor, float32, [B, T]: the per-token gradient on kept tokens, +0 elsewhere

    Bitwise semantics
    -----------------
    ``D = fp32(denominator)`` or the correctly rounded fp32 of the count (exact int64 atomics);
    kept tokens ``div_rn(g, D)`` or ``div_rn(div_rn(g, fp32(c_b)), D)``; +0 elsewhere; NaN canonical.
    """
    _check_mode("masked_mean_backward", mode)
    b, t = mask.shape
    dev = mask.device
    out = torch.empty((b, t), dtype=torch.float32, device=dev)
    if b == 0 or t == 0:
        return out
    g = grad.to(torch.float32).reshape(1).contiguous()
    m = mask.contiguous().view(torch.uint8)
    buf = torch.zeros(b + 2, dtype=torch.int64, device=dev)
    cnt, tot = buf[:b], buf[b:]
    rb, tb = _tile(t)
    n_rb = cdiv(b, rb)
    _mm_counts_kernel[(n_rb,)](m, cnt, tot, b, t, RB=rb, TB=tb, num_warps=ROW_WARPS, **LAUNCH)
    splits = max(1, min(cdiv(t, tb), TARGET_PROGRAMS // n_rb))
    if SMALL_TILES:
        splits = cdiv(t, tb)
    cols = cdiv(cdiv(t, splits), tb) * tb
    _mm_bwd_kernel[(n_rb, cdiv(t, cols))](
        g, m, cnt, tot, out, b, t, cols, MODES.index(mode), f32_bits(denominator if denominator is not None else 1.0),
        int(denominator is not None), RB=rb, TB=tb, num_warps=ROW_WARPS, **LAUNCH)
    return out


# --------------------------------------------------------------------------- group advantages


@triton.jit
def _group_adv_kernel(r_ptr, y_ptr, G, N, n_bits, nm1_bits, eps_bits, scale,
                      RB: tl.constexpr, TB: tl.constexpr):
    """Program: RB whole groups (rows of N rewards): exact mean, exact variance, advantages."""
    rows = tl.program_id(0) * RB + tl.arange(0, RB)
    row_ok = rows < G
    base = rows.to(tl.int64)[:, None] * N
    acc = tl.zeros((RB, 16), tl.int64)
    nan = tl.zeros((RB,), tl.int64)
    pinf = tl.zeros((RB,), tl.int64)
    ninf = tl.zeros((RB,), tl.int64)
    for c0 in range(0, N, TB):
        cols = c0 + tl.arange(0, TB)
        ok = row_ok[:, None] & (cols < N)[None, :]
        r = tl.load(r_ptr + base + cols[None, :], mask=ok, other=0.0)
        acc += S.raw_limbs(r, ok)
        n0, n1, n2 = S.special_counts(r, ok)
        nan += n0
        pinf += n1
        ninf += n2
    mean = tl.math.div_rn(S.round_state(S.widen(acc), nan, pinf, ninf), E.f32_from_bits(n_bits))
    den = tl.zeros((RB,), tl.float32) + 1.0
    if scale != 0:
        acc = tl.zeros((RB, 16), tl.int64)
        nan = tl.zeros((RB,), tl.int64)
        pinf = tl.zeros((RB,), tl.int64)
        ninf = tl.zeros((RB,), tl.int64)
        for c0 in range(0, N, TB):
            cols = c0 + tl.arange(0, TB)
            ok = row_ok[:, None] & (cols < N)[None, :]
            r = tl.load(r_ptr + base + cols[None, :], mask=ok, other=0.0)
            d = r - mean[:, None]
            sq = d * d
            acc += S.raw_limbs(sq, ok)
            n0, n1, n2 = S.special_counts(sq, ok)
            nan += n0
            pinf += n1
            ninf += n2
        var = tl.math.div_rn(S.round_state(S.widen(acc), nan, pinf, ninf), E.f32_from_bits(nm1_bits))
        std = tl.where(N > 1, tl.math.sqrt_rn(var), 0.0)
        den = std + E.f32_from_bits(eps_bits)
    for c0 in range(0, N, TB):
        cols = c0 + tl.arange(0, TB)
        ok = row_ok[:, None] & (cols < N)[None, :]
        r = tl.load(r_ptr + base + cols[None, :], mask=ok, other=0.0)
        d = r - mean[:, None]
        y = tl.where(scale != 0, tl.math.div_rn(d, den[:, None]), d)
        tl.store(y_ptr + base + cols[None, :], E.nan_to_canonical(y), mask=ok)


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale: bool = True) -> torch.Tensor:
    """Kernel ``group_advantages`` (contract ``group_advantages`` v1): one launch, a program per row block.

    Parameters
    ----------
    rewards : Tensor, float32, [G, n]
    eps : float
        Already rounded to fp32 by the caller.
    scale : bool

    Returns
    -------
    Tensor, float32, [G, n]

    Bitwise semantics
    -----------------
    Per group: ``mean = RN32(exact sum r) ÷ fp32(n)``, ``d = r - mean``, ``var = RN32(exact sum of
    RN32(d * d)) ÷ fp32(n - 1)``, ``std = sqrt_rn(var)`` (+0 for n = 1), ``adv = d ÷ (std + eps)``
    (or ``d``); every fp32 op one IEEE rounding, the sums exact P10, NaN canonical.
    """
    r = rewards.to(torch.float32).contiguous()
    g, n = r.shape
    out = torch.empty((g, n), dtype=torch.float32, device=r.device)
    if r.numel() == 0:
        return out
    if n > MAX_ROW:
        dispatch.note_kernel(GENERIC_VARIANT)
        return _generic.group_advantages(r, eps, scale)
    rb, tb = _tile(n)
    warps = ROW_WARPS
    if n < 64 and not SMALL_TILES:
        (rb, tb), warps = GROUP_TILE, GROUP_WARPS
    _group_adv_kernel[(cdiv(g, rb),)](
        r, out, g, n, f32_bits(float(n)), f32_bits(float(n - 1)), f32_bits(eps), int(scale),
        RB=rb, TB=tb, num_warps=warps, **LAUNCH)
    return out


def static_specs(target):
    specs: list[tuple[Any, ...]] = [
        ("kl_k3", "fp32", _kl_k3_fwd_kernel,
         {"lp_ptr": "*fp32", "ref_ptr": "*fp32", "y_ptr": "*fp32", "n": "i64", "BLOCK": "constexpr"}, {"BLOCK": BLOCK}),
        ("kl_k3_backward", "fp32", _kl_k3_bwd_kernel,
         {"g_ptr": "*fp32", "lp_ptr": "*fp32", "ref_ptr": "*fp32", "y_ptr": "*fp32", "n": "i64", "BLOCK": "constexpr"},
         {"BLOCK": BLOCK})]
    rows_sig = {"x_ptr": "*fp32", "old_ptr": "*fp32", "adv_ptr": "*fp32", "m_ptr": "*u8", "buf_ptr": "*i64",
                "B": "i32", "T": "i32", "cols_per_split": "i32", "mode": "i32", "adv_row": "i32", "lo_bits": "i32",
                "hi_bits": "i32", "dual_bits": "i32", "has_dual": "i32",
                "PPO": "constexpr", "RB": "constexpr", "TB": "constexpr"}
    for rb, tb in TILES:
        for op, ppo in (("masked_mean", False), ("ppo_loss", True)):
            specs.append((op, f"rows_{rb}x{tb}", _rows_kernel, rows_sig, {"PPO": ppo, "RB": rb, "TB": tb},
                          {"num_warps": ROW_WARPS}))
        specs.append(("masked_mean_backward", f"counts_{rb}x{tb}", _mm_counts_kernel,
                      {"m_ptr": "*u8", "cnt_ptr": "*i64", "tot_ptr": "*i64", "B": "i32", "T": "i32",
                       "RB": "constexpr", "TB": "constexpr"}, {"RB": rb, "TB": tb}, {"num_warps": ROW_WARPS}))
        specs.append(("masked_mean_backward", f"write_{rb}x{tb}", _mm_bwd_kernel,
                      {"g_ptr": "*fp32", "m_ptr": "*u8", "cnt_ptr": "*i64", "tot_ptr": "*i64", "y_ptr": "*fp32",
                       "B": "i32", "T": "i32", "cols_per_split": "i32", "mode": "i32", "den_bits": "i32",
                       "has_den": "i32", "RB": "constexpr", "TB": "constexpr"}, {"RB": rb, "TB": tb},
                      {"num_warps": ROW_WARPS}))
    for (rb, tb), warps in ((GROUP_TILE, GROUP_WARPS), (TILES[1], ROW_WARPS), (TILES[2], ROW_WARPS)):
        specs.append(("group_advantages", f"groups_{rb}x{tb}", _group_adv_kernel,
                      {"r_ptr": "*fp32", "y_ptr": "*fp32", "G": "i32", "N": "i32", "n_bits": "i32",
                       "nm1_bits": "i32", "eps_bits": "i32", "scale": "i32", "RB": "constexpr", "TB": "constexpr"},
                      {"RB": rb, "TB": tb}, {"num_warps": warps}))
    for op in ("masked_mean", "ppo_loss"):
        for partial in (False, True):
            specs.append((op, f"finish_{'partial' if partial else 'mean'}", _finish_kernel,
                          {"buf_ptr": "*i64", "n_rows": "i32", "out_ptr": "*i64" if partial else "*fp32",
                           "den_bits": "i32",
                           "has_den": "i32", "PARTIAL": "constexpr"}, {"PARTIAL": partial}, {"num_warps": 1}))
    return specs
