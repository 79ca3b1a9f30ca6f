"""Device-generic token log-probabilities: digit-matmul logits, exact sums, contract exp/log.

Memory: the [T, V] logits are never materialised whole. Tokens are processed in chunks of
``tc`` rows (rows are independent, so chunking cannot change a bit) and, inside a token chunk,
the vocabulary in chunks of ``vc`` weight rows:

* ``token_logprobs`` keeps one token chunk's fp32 logits ``[tc, V]`` (at most
  :data:`LOGITS_BYTES`), takes the exact row max over them, then sums ``exp_c(z - m)`` on the
  integer grid slice by slice (slices of at most :data:`WORK_BYTES` of temporaries);
* ``token_logprobs_partial`` phase 1 keeps only the running max (no logits block), phase 2
  only the running int64 sums (the max is given).

The weight's digit planes of one vocabulary chunk (three fp32 planes and their temporaries,
about :data:`_W_BYTES` per weight element) are bounded by :data:`WORK_BYTES`; they are rebuilt
for every token chunk (a token chunk holds up to 165 rows at V = 151936, so the rebuild is
small next to the nine digit GEMMs). Each of three groups of temporaries is bounded by
:data:`WORK_BYTES`: the hidden chunk's digit planes, one vocabulary chunk's weight planes, and
either the digit-GEMM products of a [tc, vc] block or the exp/grid terms of a [tc, vs] slice.
So the extra memory beyond the inputs and the output stays below
``LOGITS_BYTES + 3 * WORK_BYTES`` = 240 MiB on the CPU, whatever T and V are; on an accelerator
both budgets are multiplied by :func:`~rlkernel.backends.generic._exact.budget.budget_scale`
(fewer, larger torch operations; rows are independent and the sums exact, so no bit changes).

Digits (the logits are contract ``linear`` v2's product): hidden rows on the 28-bit grid
``RNE(h * 2**(27 - e))`` in four balanced base-128 digits, weight rows on the 21-bit grid in
three, all made in fp32 alone (:func:`~rlkernel.backends.generic._exact.digits.digit_planes`).
Each digit lies in [-64, 64], so every K-chunk of 4096 keeps the digit GEMM's partial sums
integers below 2**24 (exact on any fp32, tf32, bf16 or fp16 matrix unit); the twelve products
are combined exactly in int64, and ``C * 2**(eh + ew - 47)`` is rounded once to fp32.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlkernel.backends.generic._exact.budget import budget_scale
from rlkernel.backends.generic._exact.digits import digit_planes, int_product, row_exponents
from rlkernel.backends.generic._exact.fixed import F_SUM, to_fixed
from rlkernel.backends.generic._exact.fp32 import canonical_nan, int64_to_f32, int64_to_float, nan_max, scale_pow2
from rlkernel.backends.generic._exact.transcendental import exp_c, log_c

#: Bytes of the fp32 logits block one token chunk keeps (``token_logprobs`` only).
LOGITS_BYTES = 96 << 20
#: Bytes of per-block temporaries: weight digit planes, hidden digit planes, exp/grid terms.
WORK_BYTES = 48 << 20
#: Bytes per element of a vocabulary chunk's digit planes and their fp32 temporaries.
_W_BYTES = 32
#: grid magnitude bits and base-128 digits of hidden rows (28-bit grid) and weight rows (21-bit)
H_BITS, H_DIGITS = 27, 4
W_BITS, W_DIGITS = 20, 3
#: Bytes per logit of the exp_c / grid temporaries (a dozen fp32/int32 and a few int64 arrays).
_E_BYTES = 128


def _plan(t: int, v: int, h: int, keep_logits: bool, device: torch.device) -> tuple[int, int, int]:
    """``(tc, vc, vs)``: token chunk rows, weight rows per digit chunk, logits per exp slice (the
    budgets times :func:`~rlkernel.backends.generic._exact.budget.budget_scale` of ``device``)."""
    work, logits_bytes = WORK_BYTES * budget_scale(device), LOGITS_BYTES * budget_scale(device)
    tc = max(1, min(t, work // (_W_BYTES * h)))
    if keep_logits:
        tc = max(1, min(tc, logits_bytes // (4 * v)))
    vc = max(1, min(v, work // (_W_BYTES * h), work // (8 * 5 * tc)))  # 5 int64 [tc, vc]
    vs = max(1, min(v, work // (_E_BYTES * tc)))
    return tc, vc, vs


def _digits(x: torch.Tensor, bits: int, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row exponents, fp32 digit planes [count, rows, H] of the ``bits``-bit row grids, and the
    non-finite-row mask of bf16/fp16 rows."""
    e = row_exponents(x)
    return e, digit_planes(x, e, bits, count), (~torch.isfinite(x)).any(dim=-1)


def _logit_blocks(xe: torch.Tensor, xd: torch.Tensor, xbad: torch.Tensor, weight: torch.Tensor, vc: int,
                  tau: torch.Tensor | None) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(v0, v1, z[:, v0:v1])`` for one token chunk: the linear-v2 logits, divided by ``tau``."""
    for v0 in range(0, weight.shape[0], vc):
        v1 = min(v0 + vc, weight.shape[0])
        we, wd, wbad = _digits(weight[v0:v1], W_BITS, W_DIGITS)
        c = int_product(xd, wd)
        z = int64_to_float(c, xe.unsqueeze(1) + we.unsqueeze(0) - H_BITS - W_BITS, torch.float32)
        z = torch.where(xbad.unsqueeze(1) | wbad.unsqueeze(0), float("nan"), z)
        if tau is not None:
            z = _divide(z, tau)
        yield v0, v1, z


def _divide(z: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``z / tau``: one IEEE division of two fp32 tensors (never a reciprocal multiply)."""
    return z / tau


def _log_prob(z_target: torch.Tensor, m: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``(z_y - m) - log_c(L)``: two fp32 subtractions, in that order."""
    return (z_target - m) - log_c(total)


def _tau(temperature: float, device: torch.device) -> torch.Tensor | None:
    """``fp32(temperature)`` as a 0-d tensor, or None for 1.0 (x / 1 == x for every x)."""
    t = torch.full((), temperature, dtype=torch.float32, device=device)
    return None if float(temperature) == 1.0 else t


def _grid_sum(z: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_j RNE(exp_c(z_j - m) * 2**40), any p NaN)`` per row, int64 and bool."""
    p = exp_c(z - m.unsqueeze(1))
    zero = torch.zeros((), dtype=torch.int64, device=z.device)
    return to_fixed(p, zero, F_SUM).sum(dim=-1), torch.isnan(p).any(dim=-1)


def _total(s: torch.Tensor) -> torch.Tensor:
    """``ldexp_c(int_to_fp32(S), -40)``."""
    return scale_pow2(int64_to_f32(s), torch.full_like(s, -F_SUM))


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """``(z[y] - max z) - log_c(sum_grid exp_c(z - max z))`` per row, z the P5 logits / tau.

    Parameters
    ----------
    hidden : Tensor, bfloat16/float16, [T, H], contiguous
    weight : Tensor, same dtype, [V, H], contiguous
    targets : Tensor, int64, [T], in [0, V) (validated by the public op)
    temperature : float

    Returns
    -------
    Tensor, float32, [T]
    """
    t, h = hidden.shape
    v = weight.shape[0]
    out = torch.empty(t, dtype=torch.float32, device=hidden.device)
    tau = _tau(temperature, hidden.device)
    tc, vc, vs = _plan(t, v, h, keep_logits=True, device=hidden.device)
    for t0 in range(0, t, tc):
        t1 = min(t0 + tc, t)
        xe, xd, xbad = _digits(hidden[t0:t1], H_BITS, H_DIGITS)
        z = torch.empty((t1 - t0, v), dtype=torch.float32, device=hidden.device)
        for v0, v1, block in _logit_blocks(xe, xd, xbad, weight, vc, tau):
            z[:, v0:v1] = block
        m = nan_max(z, dim=-1)
        s = torch.zeros(t1 - t0, dtype=torch.int64, device=hidden.device)
        nan = torch.zeros(t1 - t0, dtype=torch.bool, device=hidden.device)
        for v0 in range(0, v, vs):
            part, part_nan = _grid_sum(z[:, v0:v0 + vs], m)
            s += part
            nan |= part_nan
        # p = exp_c(z - m) is never +inf (z <= m, or m = +inf and then z - m is -inf or NaN),
        # so NaN is the only special value the sum can take.
        total = torch.where(nan, float("nan"), _total(s))
        z_target = z.gather(1, targets[t0:t1].view(-1, 1)).view(-1)
        out[t0:t1] = _log_prob(z_target, m, total)
    return canonical_nan(out)


def token_logprobs_partial(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                           vocab_start: int, temperature: float = 1.0,
                           row_max: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One vocabulary shard: phase 1 (``row_max`` None) the local R5 row max; phase 2 the shard's
    ``(sum_int int64 [T], target_d fp32 [T])`` for the given global row max.

    Parameters
    ----------
    hidden : Tensor, bfloat16/float16, [T, H], contiguous
    weight_shard : Tensor, same dtype, [Vs, H], contiguous
    targets : Tensor, int64, [T], global ids
    vocab_start : int
    temperature : float
    row_max : Tensor, float32, [T], optional

    Returns
    -------
    Tensor float32 [T], or tuple (Tensor int64 [T], Tensor float32 [T])
    """
    t, h = hidden.shape
    vsh = weight_shard.shape[0]
    dev = hidden.device
    tau = _tau(temperature, dev)
    tc, vc, _ = _plan(t, vsh, h, keep_logits=False, device=hidden.device)
    if row_max is None:
        out = torch.empty(t, dtype=torch.float32, device=dev)
        for t0 in range(0, t, tc):
            t1 = min(t0 + tc, t)
            xe, xd, xbad = _digits(hidden[t0:t1], H_BITS, H_DIGITS)
            m = None
            for _, _, block in _logit_blocks(xe, xd, xbad, weight_shard, vc, tau):
                bm = nan_max(block, dim=-1)
                m = bm if m is None else torch.maximum(m, bm)  # maximum propagates NaN
            out[t0:t1] = m if m is not None else torch.zeros(t1 - t0, device=dev)
        return canonical_nan(out + 0.0)  # +0 for a zero max
    sums = torch.zeros(t, dtype=torch.int64, device=dev)
    target_d = torch.zeros(t, dtype=torch.float32, device=dev)
    finite_all = torch.isfinite(row_max)
    m_all = torch.where(finite_all, row_max, 0.0)
    local_all = targets - vocab_start
    bad = torch.zeros((), dtype=torch.bool, device=dev)
    for t0 in range(0, t, tc):
        t1 = min(t0 + tc, t)
        xe, xd, xbad = _digits(hidden[t0:t1], H_BITS, H_DIGITS)
        finite, m = finite_all[t0:t1], m_all[t0:t1]
        local = local_all[t0:t1]
        s = torch.zeros(t1 - t0, dtype=torch.int64, device=dev)
        zt = torch.zeros(t1 - t0, dtype=torch.float32, device=dev)
        for v0, v1, block in _logit_blocks(xe, xd, xbad, weight_shard, vc, tau):
            bad = bad | (finite.unsqueeze(1) & ~(block <= m.unsqueeze(1))).any()
            part, _ = _grid_sum(block, m)
            s += part
            inside = (local >= v0) & (local < v1)
            picked = block.gather(1, (local - v0).clamp(0, v1 - v0 - 1).view(-1, 1)).view(-1)
            zt = torch.where(inside, picked, zt)
        sums[t0:t1] = torch.where(finite, s, 0)
        d = torch.where(finite, zt - row_max[t0:t1], float("nan"))
        owner = (local >= 0) & (local < vsh)
        target_d[t0:t1] = torch.where(owner, d, 0.0)
    if bool(bad):
        raise ValueError("token_logprobs_partial: row_max is below a logit of this shard (or a logit is NaN while "
                         "row_max is finite); pass the R5 max over all shards of phase 1's outputs")
    return sums, canonical_nan(target_d)


def token_logprobs_finish(sum_int: torch.Tensor, target_d: torch.Tensor) -> torch.Tensor:
    """``target_d - log_c(ldexp_c(int_to_fp32(sum_int), -40))``, NaN-canonical.

    Parameters
    ----------
    sum_int : Tensor, int64, [T]
    target_d : Tensor, float32, [T]

    Returns
    -------
    Tensor, float32, [T]
    """
    return canonical_nan(target_d - log_c(_total(sum_int)))
