"""Device-generic token entropy and its backward: token_logprobs' construction plus one exact sum.

Contracts ``token_entropy`` v1 and ``token_entropy_backward`` v1. The logits, their digit planes
and the token/vocabulary chunking are the generic ``token_logprobs`` kernel's own helpers
(:func:`~rlkernel.backends.generic.token_logprobs._digits`, ``_logit_blocks``, ``_tau``): the same
28/21-bit linear v2 product, rounded once, divided once by ``fp32(tau)``.

Forward, per token chunk (its fp32 logits ``[tc, V]`` held, at most ``LOGITS_BYTES``): the R5 row
max, then slice by slice ``d = z - m``, ``p = exp_c(d)``, ``g = p * (-d)`` (0 where p = 0) and the
two exact int64 sums ``S = sum RNE(p 2**40)``, ``U = sum RNE(g 2**40)``; ``L`` and ``Ubar`` are
rounded once each, ``mean = Ubar / L``, ``H = log_c(L) + mean``.

Backward: the coefficient of logit ``z_tv`` is ``c = RN32(-s * RN32(q * RN32(d + mean)))`` with
``q = RN32(p / L)``, ``s = RN32(grad / tau)`` (0 where p = 0), kept in fp32. Pass A (token chunks)
makes the coefficients, ``d_hidden`` (exact digit product over the whole vocabulary, chunks of
:data:`VOCAB_CHUNK` rows whose int64 partials add into two int64 words, rounded once to hidden's
dtype) and the column maxima for the d_weight grids; pass B (``need_weight``) accumulates the exact
int64 ``c.T @ h`` over all of the call's tokens per vocabulary block (recomputing the block's
logits when pass A needed several token chunks) and rounds it once to fp32. The budgets are
multiplied on an accelerator by :func:`~rlkernel.backends.generic._exact.budget.budget_scale`
(chunking changes no bit). On the CPU the
products run on float64 grids, elsewhere on linear v2's fp32 digit planes; both are exact. Both passes
run through :class:`EntropySteps` (``token_logprobs_backward``'s steps plus the entropy's statistics and
coefficients), which a backend with kernels subclasses (``backends/triton/token_entropy.py``).
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic import token_logprobs as _tl
from rlkernel.backends.generic import token_logprobs_backward as _tlb
from rlkernel.backends.generic._exact.budget import budget_scale
from rlkernel.backends.generic._exact.fixed import F_SUM, to_fixed
from rlkernel.backends.generic._exact.fp32 import (
    canonical_nan,
    int64_to_f32,
    nan_max,
    scale_pow2,
)
from rlkernel.backends.generic._exact.transcendental import exp_c, log_c
from rlkernel.backends.generic.token_logprobs_backward import (  # the same coefficient products and finishes
    _column_exponents,
    _grad_scale,
    _softmax_divide,
    _split,
)
from rlkernel.backends.generic.token_logprobs_backward import _finish_wide as _finish_hidden

#: Bytes of the fp32 logits block one token chunk keeps (and of its coefficients in the backward).
LOGITS_BYTES = 96 << 20
#: Bytes of each group of temporaries (digit planes / float64 grids, exp terms, accumulators).
WORK_BYTES = 48 << 20
#: Bytes per logit of the exp / grid temporaries.
_E_BYTES = 160
# The grids, the digit products and the two-word d_hidden sum are token_logprobs_backward's (imported).
#: vocabulary rows per exact int64 partial of d_hidden (at most 2**16 - 1; the total is chunk-free)
VOCAB_CHUNK = 1 << 15
#: largest token count of one call's d_weight (|C| <= T * 2**47 < 2**63)
MAX_TOKENS = (1 << 16) - 1


# --- shared: the forward's per-token statistics ------------------------------------------------

def _shift(z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """``d = RN32(z - m)``; 0 on rows whose max is not finite (their results are NaN anyway)."""
    return torch.where(finite.unsqueeze(1), z - m0.unsqueeze(1), 0.0)


def _entropy_term(p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``g = RN32(p * (-d))``, 0 where p = 0 (p log p -> 0; d may be -inf there)."""
    return torch.where(p == 0, 0.0, p * (-d))


def _sums(z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S, U)`` of a logits slice: ``sum RNE(p 2**40)`` and ``sum RNE(g 2**40)``, int64 per row."""
    d = _shift(z, m0, finite)
    p = exp_c(d)
    zero = torch.zeros((), dtype=torch.int64, device=z.device)
    return to_fixed(p, zero, F_SUM).sum(dim=-1), to_fixed(_entropy_term(p, d), zero, F_SUM).sum(dim=-1)


def _from_grid(s: torch.Tensor) -> torch.Tensor:
    """``ldexp_c(int_to_fp32(s), -40)``."""
    return scale_pow2(int64_to_f32(s), torch.full_like(s, -F_SUM))


def _mean_divide(ubar: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``mean = RN32(Ubar / L)``: one IEEE division."""
    return ubar / total


def _entropy(total: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``H = RN32(log_c(L) + mean)``."""
    return log_c(total) + mean


def _stats(z: torch.Tensor, vs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(m0, finite, L, mean)`` of a token chunk's logits [tc, V] (``L = 1``, ``mean = 0`` where the
    max is not finite), the exp terms taken ``vs`` logits at a time."""
    m = nan_max(z, dim=-1)
    finite = torch.isfinite(m)
    m0 = torch.where(finite, m, 0.0)
    s = torch.zeros(z.shape[0], dtype=torch.int64, device=z.device)
    u = torch.zeros_like(s)
    for v0 in range(0, z.shape[1], vs):
        ps, pu = _sums(z[:, v0:v0 + vs], m0, finite)
        s += ps
        u += pu
    total = torch.where(finite, _from_grid(s), 1.0)
    mean = torch.where(finite, _mean_divide(_from_grid(u), total), 0.0)
    return m0, finite, total, mean


def _chunks(t: int, v: int, h: int, k: int) -> tuple[int, int, int]:
    """``(tc, vc, vs)``: token chunk rows (logits and coefficients both held), weight rows per digit
    chunk, logits per exp slice."""
    work, logits_bytes = WORK_BYTES * k, LOGITS_BYTES * k
    tc = max(1, min(t, work // (32 * h), logits_bytes // (8 * max(v, 1))))
    vc = max(1, min(v, work // (32 * h), work // (8 * 5 * tc)))
    vs = max(1, min(v, work // (_E_BYTES * tc)))
    return tc, vc, vs


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, vc: int, tau: torch.Tensor | None) -> torch.Tensor:
    """The fp32 logits [rows, V] of a token chunk, through token_logprobs' digit helpers."""
    xe, xd, xbad = _tl._digits(hidden, _tl.H_BITS, _tl.H_DIGITS)
    z = torch.empty((hidden.shape[0], weight.shape[0]), dtype=torch.float32, device=hidden.device)
    for v0, v1, block in _tl._logit_blocks(xe, xd, xbad, weight, vc, tau):
        z[:, v0:v1] = block
    return z


def token_entropy(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``H_t = log_c(L_t) + (sum_grid p (m - z)) / L_t`` per row, z the linear v2 logits / tau.

    Parameters
    ----------
    hidden : Tensor, bfloat16/float16, [T, H], contiguous
    weight : Tensor, same dtype, [V, H], contiguous
    temperature : float

    Returns
    -------
    Tensor, float32, [T]
    """
    t, h = hidden.shape
    v = weight.shape[0]
    out = torch.empty(t, dtype=torch.float32, device=hidden.device)
    tau = _tl._tau(temperature, hidden.device)
    tc, vc, vs = _chunks(t, v, h, budget_scale(hidden.device))
    for t0 in range(0, t, tc):
        t1 = min(t0 + tc, t)
        z = _chunk_logits(hidden[t0:t1], weight, vc, tau)
        _, finite, total, mean = _stats(z, vs)
        out[t0:t1] = torch.where(finite, _entropy(total, mean), float("nan"))
    return canonical_nan(out)


# --- backward ---------------------------------------------------------------------------------

def _center(d: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """``e = RN32(d + mean)`` (= z/tau minus its expectation, shifted by m)."""
    return d + mean


def _coef_a(q: torch.Tensor, e: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``a = RN32(q * e)``, 0 where p = 0."""
    return torch.where(p == 0, 0.0, q * e)


def _coef_product(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``c = RN32(-s * a)``: one fp32 product of the exact negation; c stays fp32."""
    return (-s) * a


def _coefficients(z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor, total: torch.Tensor, mean: torch.Tensor,
                  s: torch.Tensor) -> torch.Tensor:
    """Coefficients ``dL/dz`` of a logits block [r, k], fp32; NaN rows where the max is not finite."""
    d = _shift(z, m0, finite)
    p = exp_c(d)
    q = _softmax_divide(p, total.unsqueeze(1))
    a = _coef_a(q, _center(d, mean.unsqueeze(1)), p)
    c = _coef_product(s.unsqueeze(1), a)
    return torch.where(finite.unsqueeze(1), c, float("nan"))


class EntropySteps(_tlb.Steps):
    """The backward's steps over ``T x V`` or ``V x H`` elements: ``token_logprobs_backward``'s
    (:class:`~rlkernel.backends.generic.token_logprobs_backward.Steps`: the logits, the exact
    products, the column exponents, the one rounding of d_weight) plus the entropy's row
    statistics and coefficients. This class runs them as torch operations; a backend with kernels
    passes a subclass (``backends/triton/token_entropy.py``). Every step is exact or rounded once as
    the contract says, so a subclass cannot change a bit (the conformance suite checks that it does not).
    """

    def entropy_stats(self, z: torch.Tensor, vs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(m0, finite, L, mean)`` of logits rows z fp32 [r, V] (already divided by tau), as :func:`_stats`."""
        return _stats(z, vs)

    def entropy_coefficients(self, z: torch.Tensor, m0: torch.Tensor, finite: torch.Tensor, total: torch.Tensor,
                             mean: torch.Tensor, s: torch.Tensor, vs: int,
                             columns: tuple[torch.Tensor, torch.Tensor] | None,
                             row_exponents: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(c, ex)``: the fp32 coefficients [r, k] of logits block z and, with ``row_exponents``, the rows'
        exponents of c (``linear``'s ``_exponents``). ``columns`` = (colmax fp32 [k], colbad bool [k]),
        updated in place: the running maxima of the finite ``|c|`` over the rows, and whether a column
        holds a non-finite c."""
        c = torch.empty(z.shape, dtype=torch.float32, device=z.device)
        for v0 in range(0, z.shape[1], vs):
            c[:, v0:v0 + vs] = _coefficients(z[:, v0:v0 + vs], m0, finite, total, mean, s)
        return c, _tlb.coefficient_columns(c, columns, row_exponents)


GENERIC = EntropySteps()


def token_entropy_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
                           need_hidden: bool = True,
                           need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(d_hidden, d_weight)`` of ``token_entropy`` for ``grad = dL/dH``.

    Parameters
    ----------
    grad : Tensor, float32, [T], contiguous
    hidden : Tensor, bfloat16/float16, [T, H], contiguous
    weight : Tensor, same dtype, [V, H], contiguous
    temperature : float
    need_hidden, need_weight : bool

    Returns
    -------
    d_hidden : Tensor, hidden's dtype, [T, H], or None
    d_weight : Tensor, float32, [V, H], or None (this call's tokens as one unit; T <= 2**16 - 1)
    """
    return backward_with(GENERIC, grad, hidden, weight, temperature, need_hidden, need_weight)


def backward_with(steps: EntropySteps, grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                  temperature: float = 1.0, need_hidden: bool = True,
                  need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`token_entropy_backward` with its products and large steps run by ``steps`` (no bit depends on it).

    Pass A (token chunks): the chunk's logits, its statistics, the coefficients with their column
    maxima, and d_hidden's exact product over vocabulary chunks of at most :data:`VOCAB_CHUNK` rows
    (two int64 words). Pass B (``need_weight``): d_weight per vocabulary block, from the coefficients
    kept by pass A when one chunk held every token, else recomputed per token block.
    """
    t, h = hidden.shape
    v = weight.shape[0]
    dev, dtype = hidden.device, hidden.dtype
    if need_weight and t > MAX_TOKENS:
        raise ValueError(f"token_entropy_backward: d_weight reduces over T = {t} tokens, above the exact-sum bound "
                         f"2**16 - 1 = {MAX_TOKENS}; call it per sequence (unit)")
    tau = _tl._tau(temperature, dev)
    s_all = _grad_scale(grad.to(torch.float32), tau)
    m_all = torch.zeros(t, dtype=torch.float32, device=dev)
    total_all = torch.ones(t, dtype=torch.float32, device=dev)
    mean_all = torch.zeros(t, dtype=torch.float32, device=dev)
    finite_all = torch.zeros(t, dtype=torch.bool, device=dev)
    colmax = torch.zeros(v, dtype=torch.float32, device=dev)
    colbad = torch.zeros(v, dtype=torch.bool, device=dev)
    d_hidden = torch.empty((t, h), dtype=dtype, device=dev) if need_hidden else None
    ew = steps.column_exponents(weight) if need_hidden else None
    k = budget_scale(dev)
    work = WORK_BYTES * k
    tc, vc, vs = _chunks(t, v, h, k)
    vch = max(1, min(v, VOCAB_CHUNK, work // (8 * (h + 2 * tc))))
    kept: torch.Tensor | None = None
    for t0 in range(0, t, tc):
        t1 = min(t0 + tc, t)
        z = torch.empty((t1 - t0, v), dtype=torch.float32, device=dev)
        steps.fill_logits(z, hidden[t0:t1], weight, vc, tau)
        m0, finite, total, mean = steps.entropy_stats(z, vs)
        c, ex = steps.entropy_coefficients(z, m0, finite, total, mean, s_all[t0:t1], vs, (colmax, colbad),
                                           d_hidden is not None)
        del z
        kept = c if t1 - t0 == t else None  # one chunk holds every token: pass B reuses its coefficients
        m_all[t0:t1], total_all[t0:t1], mean_all[t0:t1], finite_all[t0:t1] = m0, total, mean, finite
        if d_hidden is not None and ew is not None and ex is not None:
            hi = torch.zeros((t1 - t0, h), dtype=torch.int64, device=dev)
            lo = torch.zeros_like(hi)
            for v0 in range(0, v, vch):
                v1 = min(v0 + vch, v)
                part_hi, part_lo = _split(steps.exact(c[:, v0:v1], weight[v0:v1].T, ex, ew))
                hi += part_hi
                lo += part_lo
            d_hidden[t0:t1] = _finish_hidden(hi, lo, ex, ew, dtype)
    if not need_weight:
        return d_hidden, None

    ec = _column_exponents(colmax, colbad)
    eh = steps.column_exponents(hidden)
    vb = max(1, min(v, work * (steps.weight_block_scale if kept is not None else 1) // (16 * h)))
    d_weight = torch.empty((v, h), dtype=torch.float32, device=dev)
    tb = max(1, min(max(t, 1), work // (32 * h), work // (_E_BYTES * vb)))
    for v0 in range(0, v, vb):
        v1 = min(v0 + vb, v)
        if kept is not None:  # the one product of the block, finished as it is
            d_weight[v0:v1] = steps.exact_finish(kept[:, v0:v1].T, hidden.T, ec[v0:v1], eh)
            continue
        acc = torch.zeros((v1 - v0, h), dtype=torch.int64, device=dev)
        for t0 in range(0, t, tb):
            t1 = min(t0 + tb, t)
            _, _, z = next(steps.logits(hidden[t0:t1], weight[v0:v1], v1 - v0, tau))
            c, _ = steps.entropy_coefficients(z, m_all[t0:t1], finite_all[t0:t1], total_all[t0:t1],
                                              mean_all[t0:t1], s_all[t0:t1], v1 - v0, None, False)
            acc += steps.exact(c.T, hidden[t0:t1].T, ec[v0:v1], eh)
        d_weight[v0:v1] = steps.finish(acc, ec[v0:v1], eh)
    return d_hidden, d_weight
