"""Device-generic backward of ``token_logprobs``: coefficients from the forward's exact sums, two exact products.

Contract ``token_logprobs_backward`` v1. The coefficient ``c_tv = RN32(RN32(grad_t / tau) * a_tv)``
(fp32) (``a = -RN32(p / L)`` off the target, the exact complement ``RN32(RN32((S - P_y) 2**-40) /
L)`` on it) is never stored for all tokens. Two passes:

* pass A, token chunks (each holds its fp32 logits ``[tc, V]`` like the forward, and its
  coefficients ``[tc, V]`` in fp32): the row max, the exact int64 grid sum ``S``, the
  coefficients, ``d_hidden`` for the chunk (the product over the vocabulary in chunks of
  :data:`VOCAB_CHUNK` rows, each chunk's exact int64 partial added into two int64 words
  ``HI += C >> 32``, ``LO += C & (2**32 - 1)``, rounded once from the pair), and the running
  column maxima ``max_t |c_tv|`` that give the d_weight grids. Per token only ``m``, ``L``,
  ``a_y`` and ``s`` are kept.
* pass B (``need_weight``), vocabulary blocks outside, token chunks inside: the logits of the
  block are recomputed, the same coefficients rebuilt from the kept per-token values, and the
  exact int64 ``C = c.T @ h`` of the block accumulated over all tokens (T <= 2**16 - 1), then
  rounded once to fp32. When pass A held every token in one chunk, its coefficients are used
  as they are (the same function made them, so the bits are the same; tests force both ways).

The chunk sizes follow the budgets :data:`LOGITS_BYTES` and :data:`WORK_BYTES`, multiplied on an
accelerator by :func:`~rlkernel.backends.generic._exact.budget.budget_scale` (fewer, larger torch
operations; the sums are exact, so no bit depends on them).

Products: on the CPU the grids go to float64 (the coefficient grid in two base-2**14 halves
against the 21-bit grid: every partial sum an integer below 2**53); elsewhere the balanced
base-128 digit planes of linear v2 (four against three, fp32 digit GEMMs over K-chunks of 4096).
Both are exact, so both give the contract's bits. Extra memory stays below
``(LOGITS_BYTES + 4 * WORK_BYTES) * budget_scale`` whatever T and V are.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlkernel.backends.generic import linear as _linear
from rlkernel.backends.generic._exact.budget import budget_scale
from rlkernel.backends.generic._exact.digits import int_product
from rlkernel.backends.generic._exact.fixed import F_SUM, to_fixed
from rlkernel.backends.generic._exact.fp32 import (
    canonical_nan,
    exponent,
    int64_pair_to_float,
    int64_to_f32,
    int64_to_float,
    nan_max,
    scale_pow2,
)
from rlkernel.backends.generic._exact.transcendental import exp_c
from rlkernel.backends.generic.linear import SENTINEL, ZERO_EXP, _digits_f32, _exponents, _grid_f64, _product_f64
from rlkernel.backends.generic.token_logprobs import H_BITS, H_DIGITS, _digits, _logit_blocks, _tau

#: grid magnitude bits of the coefficient rows (28-bit grids, 4 digits) and the other operand (21-bit, 3 digits)
C_BITS, C_DIGITS = 27, 4
O_BITS, O_DIGITS = 20, 3
#: vocabulary rows per exact int64 partial of d_hidden (at most 2**16 - 1; the sum is chunk-free)
VOCAB_CHUNK = 1 << 15
#: D = HI * 2**WORD_SHIFT + LO
WORD_SHIFT = 32
#: largest token count of one call's d_weight (|C| <= T * 2**47 < 2**63)
MAX_TOKENS = (1 << 16) - 1
#: bytes of one token chunk's logits and coefficients (fp32 both) together
LOGITS_BYTES = 96 << 20
#: bytes of each group of temporaries (digit planes / float64 grids, exp terms, accumulators)
WORK_BYTES = 48 << 20
_E_BYTES = 128


def _softmax_divide(p: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``q = RN32(p / L)``: one IEEE division."""
    return p / total


def _target_coef(rest: torch.Tensor, p_y: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``a_y = RN32(RN32(rest * 2**-40) / L)``, rest = S - P_y (exact int64); ``p_y`` is not used (the
    exact complement replaces ``1 - p_y / L``)."""
    return scale_pow2(int64_to_f32(rest), torch.full_like(rest, -F_SUM)) / total


def _grad_scale(grad: torch.Tensor, tau: torch.Tensor | None) -> torch.Tensor:
    """``s = RN32(grad / fp32(tau))`` (``tau = 1``: grad itself, x / 1 == x)."""
    return grad if tau is None else grad / tau


def _coef_product(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """``c = RN32(s * a)``: one fp32 product; c stays fp32."""
    return s * a


def _coefficients(z: torch.Tensor, m0: torch.Tensor, total: torch.Tensor, a_y: torch.Tensor, s: torch.Tensor,
                  local_y: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """Coefficients of a logits block z [r, k] whose column j is vocabulary entry ``v0 + j``;
    ``local_y`` = y - v0 (outside [0, k): the target is elsewhere)."""
    p = exp_c(z - m0.unsqueeze(1))
    a = -_softmax_divide(p, total.unsqueeze(1))
    cols = torch.arange(z.shape[1], device=z.device)
    a = torch.where(cols.unsqueeze(0) == local_y.unsqueeze(1), a_y.unsqueeze(1), a)
    c = _coef_product(s.unsqueeze(1), a)
    return torch.where(finite.unsqueeze(1), c, float("nan"))


def _product(x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``X @ Wt.T``: x rows on 28-bit grids ``ex``, w rows on 21-bit grids ``ew`` (K <= 2**16 - 1)."""
    if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
    if _linear._path(x.device) == "f64":  # linear's choice (the primitive trace takes the digits path)
        return _product_f64(_grid_f64(x, ex, C_BITS), _grid_f64(w, ew, O_BITS))
    return int_product(_digits_f32(x, ex, C_BITS, C_DIGITS), _digits_f32(w, ew, O_BITS, O_DIGITS))


class Steps:
    """The backward's steps, which a backend may run as kernels: over ``T x V`` or ``V x H`` elements
    the matrix products (the logits of token rows against weight rows; the exact int64 ``X @ W.T``
    of coefficient rows on 28-bit grids against 21-bit-grid rows), the row max and exact sum of a
    logits chunk, the coefficients with their row and column maxima, the column exponents of W and
    h, and the one rounding of d_weight's exact sums; and the per-token terms, the exponents from
    the running maxima and d_hidden's finish, small but each a chain of ~10-60 torch operations here.

    This class is the device-generic way (torch operations: digit GEMMs, float64 grids on the CPU);
    a backend with kernels passes a subclass (``backends/triton/token_logprobs_backward.py``: Triton).
    Every step is exact or rounded once as the contract says, so the subclass cannot change a bit;
    the conformance suite checks that it does not.
    """

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor, vc: int,
               tau: torch.Tensor | None) -> Iterator[tuple[int, int, torch.Tensor]]:
        """``(v0, v1, z[:, v0:v1])``: fp32 ``RN32(hidden @ weight.T) / tau`` in blocks of ``vc`` weight rows."""
        xe, xd, xbad = _digits(hidden, H_BITS, H_DIGITS)
        yield from _logit_blocks(xe, xd, xbad, weight, vc, tau)

    #: pass B's vocabulary blocks are this many times the budget's (a backend whose products keep no
    #: large temporaries takes the whole vocabulary in fewer blocks: fewer launches, no copies)
    weight_block_scale = 1

    def fill_logits(self, z: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, vc: int,
                    tau: torch.Tensor | None) -> None:
        """``z`` fp32 [T, V] (contiguous) = :meth:`logits` of every vocabulary block of ``vc`` rows."""
        for v0, v1, block in self.logits(hidden, weight, vc, tau):
            z[:, v0:v1] = block

    def exact(self, x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        """Exact int64 ``X @ W.T``: x fp32 [M, K] on 28-bit row grids ``ex``, w [N, K] on 21-bit grids ``ew``."""
        return _product(x, w, ex, ew)

    def exact_finish(self, x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        """fp32 [M, N] :meth:`finish` of :meth:`exact` (d_weight of one vocabulary block from all its tokens)."""
        return self.finish(self.exact(x, w, ex, ew), ex, ew)

    def row_stats(self, z: torch.Tensor, vs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(m, S)`` of logits rows z fp32 [r, V]: the R5 row max (NaN where a row holds NaN) and the
        exact ``S = sum_v RNE(exp_c(z - m0) 2**40)`` int64, ``m0`` = m where finite, else 0 (``vs``:
        columns per torch operation)."""
        m = nan_max(z, dim=-1)
        m0 = torch.where(torch.isfinite(m), m, 0.0)
        zero = torch.zeros((), dtype=torch.int64, device=z.device)
        s_int = torch.zeros(z.shape[0], dtype=torch.int64, device=z.device)
        for v0 in range(0, z.shape[1], vs):
            s_int += to_fixed(exp_c(z[:, v0:v0 + vs] - m0.unsqueeze(1)), zero, F_SUM).sum(dim=-1)
        return m, s_int

    def token_terms(self, z: torch.Tensor, m: torch.Tensor, s_int: torch.Tensor,
                    local_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(finite, m0, total, a_y)`` per token row of logits z fp32 [r, V] from its max ``m`` fp32 [r]
        and exact sum ``s_int`` int64 [r] (``local_y`` int64 [r]: the target's column, outside [0, V)
        when it lies in another shard; its logit is then read from the clamped column and a_y unused):
        ``finite = isfinite(m)``, ``m0 = m`` where finite else 0, ``total = L = RN32(S 2**-40)`` (1 on
        non-finite rows), ``a_y = RN32(RN32((S - RNE(p_y 2**40)) 2**-40) / L)`` with
        ``p_y = exp_c(RN32(z_y - m0))``: the target's coefficient before the gradient's scale."""
        finite = torch.isfinite(m)
        m0 = torch.where(finite, m, 0.0)
        total = torch.where(finite, scale_pow2(int64_to_f32(s_int), torch.full_like(s_int, -F_SUM)), 1.0)
        p_y = exp_c(z.gather(1, local_y.clamp(0, z.shape[1] - 1).view(-1, 1)).view(-1) - m0)
        zero = torch.zeros((), dtype=torch.int64, device=z.device)
        a_y = _target_coef(s_int - to_fixed(p_y, zero, F_SUM), p_y, total)
        return finite, m0, total, a_y

    def coefficients(self, z: torch.Tensor, m0: torch.Tensor, total: torch.Tensor, a_y: torch.Tensor,
                     s: torch.Tensor, local_y: torch.Tensor, finite: torch.Tensor, vs: int,
                     columns: tuple[torch.Tensor, torch.Tensor] | None,
                     row_exponents: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(c, ex)``: the fp32 coefficients [r, k] of logits block z (column j is vocabulary entry
        ``v0 + j``, ``local_y`` = target - v0) and, with ``row_exponents``, the rows' exponents of c
        (``linear``'s ``_exponents``: ZERO_EXP for all-zero rows, SENTINEL for rows holding NaN/inf).

        ``columns`` = (colmax fp32 [k], colbad bool [k]), updated in place: the running maxima of
        the finite ``|c|`` over the rows, and whether a column holds a non-finite c.
        """
        c = torch.empty(z.shape, dtype=torch.float32, device=z.device)
        for v0 in range(0, z.shape[1], vs):
            v1 = min(v0 + vs, z.shape[1])
            c[:, v0:v1] = _coefficients(z[:, v0:v1], m0, total, a_y, s, local_y - v0, finite)
        return c, coefficient_columns(c, columns, row_exponents)

    def column_exponents(self, t: torch.Tensor) -> torch.Tensor:
        """int64 [K]: the exponents of the columns of t [N, K] (the rows of ``t.T`` as ``linear``'s
        ``_exponents`` gives them: ZERO_EXP for all-zero, SENTINEL for columns holding NaN/inf)."""
        return _exponents(t.T)

    def finish_hidden(self, hi: torch.Tensor, lo: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                      out: torch.Tensor) -> None:
        """``out`` [M, N] (bf16/fp16, contiguous rows of d_hidden) ``= RN_out((hi 2**32 + lo) 2**(ex + ew - 47))``,
        one rounding, NaN on sentinel rows/columns: d_hidden's rows from their two exact int64 words."""
        out.copy_(_finish_wide(hi, lo, ex, ew, out.dtype))

    def maxima_exponents(self, colmax: torch.Tensor, colbad: torch.Tensor) -> torch.Tensor:
        """int64 [V]: the exponents of the rows of c.T from the running maxima of pass A (colmax fp32 [V],
        colbad bool [V]): ZERO_EXP for all-zero, SENTINEL for non-finite."""
        return _column_exponents(colmax, colbad)

    def finish(self, acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
        """fp32 [M, N] ``RN32(acc * 2**(ex + ew - 47))``, one rounding, NaN on sentinel rows/columns
        (d_weight's rows from their exact int64 sums: ``linear_finish``'s semantics)."""
        return _finish(acc, ex, ew)


def coefficient_columns(c: torch.Tensor, columns: tuple[torch.Tensor, torch.Tensor] | None,
                        row_exponents: bool) -> torch.Tensor | None:
    """Fold coefficients c fp32 [r, k] into ``columns`` = (colmax fp32 [k], colbad bool [k]) in place (the
    running maxima of the finite ``|c|``, whether a column holds a non-finite c); the rows' exponents of c
    (``linear``'s ``_exponents``) with ``row_exponents``, else None."""
    if columns is not None:
        colmax, colbad = columns
        live = torch.isfinite(c)
        torch.maximum(colmax, torch.where(live, c, 0.0).abs().amax(dim=0), out=colmax)
        colbad |= ~live.all(dim=0)
    return _exponents(c) if row_exponents else None


GENERIC = Steps()


def _scale(ex: torch.Tensor, ew: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k, bad)``: the exponent ``ex + ew - 47`` per element and the sentinel (non-finite) mask."""
    bad_x, bad_w = ex == SENTINEL, ew == SENTINEL
    ex0 = torch.where(bad_x, torch.zeros_like(ex), ex)
    ew0 = torch.where(bad_w, torch.zeros_like(ew), ew)
    return ex0.unsqueeze(1) + ew0.unsqueeze(0) - C_BITS - O_BITS, bad_x.unsqueeze(1) | bad_w.unsqueeze(0)


def _finish_wide(hi: torch.Tensor, lo: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """``RN_dtype((HI 2**32 + LO) 2**(ex + ew - 47))`` in one rounding; NaN on sentinel rows/columns."""
    k, bad = _scale(ex, ew)
    y = int64_pair_to_float(hi, lo, WORD_SHIFT, k, dtype)
    return canonical_nan(torch.where(bad, torch.full_like(y, float("nan")), y))


def _finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """``RN32(acc 2**(ex + ew - 47))`` in one rounding; NaN on sentinel rows/columns."""
    k, bad = _scale(ex, ew)
    y = int64_to_float(acc, k, torch.float32)
    return canonical_nan(torch.where(bad, torch.full_like(y, float("nan")), y))


def _split(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An int64 partial as ``(C >> 32, C & (2**32 - 1))``: the two words that add without loss."""
    return part >> WORD_SHIFT, part & ((1 << WORD_SHIFT) - 1)


def _column_exponents(colmax: torch.Tensor, colbad: torch.Tensor) -> torch.Tensor:
    """Exponents of the rows of c.T from the running maxima: ZERO_EXP for all-zero, SENTINEL for non-finite."""
    e = exponent(colmax)
    e = torch.where(colmax == 0, torch.full_like(e, ZERO_EXP), e)
    return torch.where(colbad, torch.full_like(e, SENTINEL), e)


class _Result:
    """What one pass over a (shard of the) vocabulary produced."""

    def __init__(self) -> None:
        self.d_hidden: torch.Tensor | None = None
        self.hi: torch.Tensor | None = None
        self.lo: torch.Tensor | None = None
        self.ex: torch.Tensor | None = None
        self.d_weight: torch.Tensor | None = None


def _core(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_start: int,
          temperature: float, row_max: torch.Tensor | None, sum_int: torch.Tensor | None,
          given_ex: torch.Tensor | None, given_ew: torch.Tensor | None, exponents_only: bool, need_hidden: bool,
          need_weight: bool, steps: Steps) -> _Result:
    """Both passes over ``weight`` (the whole vocabulary, or the shard starting at ``vocab_start``).

    Unsharded: ``row_max``/``sum_int`` None (computed here), ``given_ex`` None (the rows' own exponents),
    d_hidden finished. Sharded: the global ``row_max``, ``sum_int``; ``exponents_only`` gives the
    shard's coefficient-row exponents; with ``given_ex``/``given_ew`` (the all-reduced MAX) the two
    words of the shard's exact d_hidden sum are returned, and the shard's rows of d_weight.
    """
    out = _Result()
    t, h = hidden.shape
    v = weight.shape[0]
    dev, dtype = hidden.device, hidden.dtype
    tau = _tau(temperature, dev)
    kept: torch.Tensor | None = None
    s_all = _grad_scale(grad.to(torch.float32), tau)
    m_all = torch.zeros(t, dtype=torch.float32, device=dev)
    total_all = torch.ones(t, dtype=torch.float32, device=dev)
    ay_all = torch.zeros(t, dtype=torch.float32, device=dev)
    finite_all = torch.zeros(t, dtype=torch.bool, device=dev)
    colmax = torch.zeros(v, dtype=torch.float32, device=dev)
    colbad = torch.zeros(v, dtype=torch.bool, device=dev)
    sharded = given_ex is not None
    if exponents_only:
        out.ex = torch.empty(t, dtype=torch.int64, device=dev)
    elif need_hidden and sharded:
        out.hi = torch.zeros((t, h), dtype=torch.int64, device=dev)
        out.lo = torch.zeros((t, h), dtype=torch.int64, device=dev)
    elif need_hidden:
        out.d_hidden = torch.empty((t, h), dtype=dtype, device=dev)
    ew = given_ew if given_ew is not None else (steps.column_exponents(weight) if need_hidden else None)
    bad = torch.zeros((), dtype=torch.bool, device=dev)

    work, logits_bytes = WORK_BYTES * budget_scale(dev), LOGITS_BYTES * budget_scale(dev)
    tc = max(1, min(t, work // (32 * h), logits_bytes // (8 * v)))
    vc = max(1, min(v, work // (32 * h), work // (8 * 5 * tc)))
    vs = max(1, min(v, work // (_E_BYTES * tc)))
    vch = max(1, min(v, VOCAB_CHUNK, work // (8 * (h + 2 * tc))))
    for t0 in range(0, t, tc):
        t1 = min(t0 + tc, t)
        z = torch.empty((t1 - t0, v), dtype=torch.float32, device=dev)
        steps.fill_logits(z, hidden[t0:t1], weight, vc, tau)
        if row_max is None or sum_int is None:
            m, s_int = steps.row_stats(z, vs)
        else:
            m, s_int = row_max[t0:t1], sum_int[t0:t1]
        y = targets[t0:t1] - vocab_start  # the target's column in this shard (outside [0, v): another shard's)
        finite, m0, total, a_y = steps.token_terms(z, m, s_int, y)
        if row_max is not None and sum_int is not None:
            bad = bad | (finite.unsqueeze(1) & ~(z <= m0.unsqueeze(1))).any()
        s = s_all[t0:t1]
        own_ex = out.ex is not None or (need_hidden and ew is not None and given_ex is None)
        c, c_ex = steps.coefficients(z, m0, total, a_y, s, y, finite, vs,
                                     None if out.ex is not None else (colmax, colbad), own_ex)
        del z
        if out.ex is not None:
            out.ex[t0:t1] = c_ex
            continue
        kept = c if t1 - t0 == t else None  # one token chunk holds every token: pass B reuses its coefficients
        m_all[t0:t1], total_all[t0:t1], ay_all[t0:t1], finite_all[t0:t1] = m0, total, a_y, finite
        if need_hidden and ew is not None:
            ex = given_ex[t0:t1] if given_ex is not None else c_ex
            assert ex is not None
            hi = torch.zeros((t1 - t0, h), dtype=torch.int64, device=dev)
            lo = torch.zeros_like(hi)
            for v0 in range(0, v, vch):
                v1 = min(v0 + vch, v)
                part_hi, part_lo = _split(steps.exact(c[:, v0:v1], weight[v0:v1].T, ex, ew))
                hi += part_hi
                lo += part_lo
            if out.hi is not None and out.lo is not None:
                out.hi[t0:t1], out.lo[t0:t1] = hi, lo
            elif out.d_hidden is not None:
                steps.finish_hidden(hi, lo, ex, ew, out.d_hidden[t0:t1])
    if row_max is not None and sum_int is not None and bool(bad):  # only a shard's check reads the device
        raise ValueError("token_logprobs_backward_partial: row_max is below a logit of this shard (or a logit is NaN "
                         "while row_max is finite); pass the R5 max over all shards of token_logprobs_partial's "
                         "phase 1")
    if out.ex is not None or not need_weight:
        return out

    ec = steps.maxima_exponents(colmax, colbad)
    eh = steps.column_exponents(hidden)
    # with the coefficients kept, a block is one product (the backend's scale applies); else every block
    # recomputes its logits per token chunk, whose size shrinks as the block grows
    vb = max(1, min(v, work * (steps.weight_block_scale if kept is not None else 1) // (16 * h)))
    if vb < v or v == 0:  # several blocks (one block's result is d_weight itself)
        out.d_weight = torch.empty((v, h), dtype=torch.float32, device=dev)
    tb = max(1, min(max(t, 1), work // (32 * h), work // (_E_BYTES * vb)))
    for v0 in range(0, v, vb):
        v1 = min(v0 + vb, v)
        if kept is not None:  # the one product of the block, finished as it is
            d_weight = steps.exact_finish(kept[:, v0:v1].T, hidden.T, ec[v0:v1], eh)
        else:
            acc = torch.zeros((v1 - v0, h), dtype=torch.int64, device=dev)
            for t0 in range(0, t, tb):
                t1 = min(t0 + tb, t)
                _, _, z = next(steps.logits(hidden[t0:t1], weight[v0:v1], v1 - v0, tau))
                c, _ = steps.coefficients(z, m_all[t0:t1], total_all[t0:t1], ay_all[t0:t1], s_all[t0:t1],
                                          targets[t0:t1] - vocab_start - v0, finite_all[t0:t1], v1 - v0, None, False)
                acc += steps.exact(c.T, hidden[t0:t1].T, ec[v0:v1], eh)
            d_weight = steps.finish(acc, ec[v0:v1], eh)
        if out.d_weight is None:
            out.d_weight = d_weight
        else:
            out.d_weight[v0:v1] = d_weight
    return out


def _check_tokens(op: str, t: int) -> None:
    if t > MAX_TOKENS:
        raise ValueError(f"{op}: d_weight reduces over T = {t} tokens, above the exact-sum bound 2**16 - 1 = "
                         f"{MAX_TOKENS}; call it per sequence (unit)")


def token_logprobs_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            temperature: float = 1.0, need_hidden: bool = True,
                            need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(d_hidden, d_weight)`` of ``token_logprobs`` for ``grad = dL/dlogp``.

    Parameters
    ----------
    grad : Tensor, float32, [T], contiguous
    hidden : Tensor, bfloat16/float16, [T, H], contiguous
    weight : Tensor, same dtype, [V, H], contiguous
    targets : Tensor, int64, [T], in [0, V) (validated by the public op)
    temperature : float
    need_hidden, need_weight : bool

    Returns
    -------
    d_hidden : Tensor, hidden's dtype, [T, H], or None
    d_weight : Tensor, float32, [V, H], or None
    """
    return backward_with(GENERIC, grad, hidden, weight, targets, temperature, need_hidden, need_weight)


def backward_with(steps: Steps, grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                  targets: torch.Tensor, temperature: float = 1.0, need_hidden: bool = True,
                  need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`token_logprobs_backward` with its products and large steps run by ``steps`` (no bit depends on it)."""
    if need_weight:
        _check_tokens("token_logprobs_backward", hidden.shape[0])
    out = _core(grad, hidden, weight, targets, 0, temperature, None, None, None, None, False, need_hidden,
                need_weight, steps)
    return out.d_hidden, out.d_weight


def token_logprobs_backward_partial(grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor,
                                    targets: torch.Tensor, vocab_start: int, row_max: torch.Tensor,
                                    sum_int: torch.Tensor, temperature: float = 1.0,
                                    exponents: tuple[torch.Tensor, torch.Tensor] | None = None,
                                    need_weight: bool = True) -> tuple[torch.Tensor | None, ...]:
    """One vocabulary shard's part of ``token_logprobs_backward``.

    Phase 1 (``exponents`` None): ``(ec int64 [T], ew int64 [H])``, the shard's coefficient-row and
    weight-column exponents (all-reduce MAX them). Phase 2 (``exponents=(ec, ew)``, global):
    ``(hi int64 [T, H], lo int64 [T, H], d_weight_shard fp32 [Vs, H] or None)``; all-reduce SUM
    ``hi`` and ``lo`` and finish with :func:`token_logprobs_backward_finish`.
    """
    return partial_with(GENERIC, grad, hidden, weight_shard, targets, vocab_start, row_max, sum_int, temperature,
                        exponents, need_weight)


def partial_with(steps: Steps, grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor,
                 targets: torch.Tensor, vocab_start: int, row_max: torch.Tensor, sum_int: torch.Tensor,
                 temperature: float = 1.0, exponents: tuple[torch.Tensor, torch.Tensor] | None = None,
                 need_weight: bool = True) -> tuple[torch.Tensor | None, ...]:
    """:func:`token_logprobs_backward_partial` with its products and large steps run by ``steps``."""
    op = "token_logprobs_backward_partial"
    if exponents is None:
        out = _core(grad, hidden, weight_shard, targets, vocab_start, temperature, row_max, sum_int, None, None,
                    True, True, False, steps)
        return out.ex, steps.column_exponents(weight_shard)
    if need_weight:
        _check_tokens(op, hidden.shape[0])
    ec, ew = exponents
    out = _core(grad, hidden, weight_shard, targets, vocab_start, temperature, row_max, sum_int, ec, ew, False,
                True, need_weight, steps)
    return out.hi, out.lo, out.d_weight


def token_logprobs_backward_finish(hi: torch.Tensor, lo: torch.Tensor, ec: torch.Tensor, ew: torch.Tensor,
                                   out_dtype: torch.dtype) -> torch.Tensor:
    """``d_hidden = RN_out((hi 2**32 + lo) 2**(ec + ew - 47))`` in one rounding, NaN on sentinel rows/columns."""
    return _finish_wide(hi, lo, ec, ew, out_dtype)
