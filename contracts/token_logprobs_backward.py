"""Contract ``token_logprobs_backward``: gradients of ``token_logprobs`` in the hidden states and the LM head.

``logp_t = z_t[y_t] / tau - LSE_v(z_tv / tau)`` with ``z = hidden @ weight.T`` (contract
``token_logprobs`` v2). Given ``grad_t = dL/dlogp_t``, the coefficient of logit ``z_tv`` is
``c_tv = grad_t (onehot_v(y_t) - softmax_tv) / tau`` and

* ``d_hidden[t] = sum_v c_tv weight[v]``  (per token: batch invariant);
* ``d_weight[v] = sum_t c_tv hidden[t]`` over the tokens of THIS call, one unit rounded once.

Every bit is defined; the probabilities come from the forward's own exact construction.

The algorithm (the definition; ``reference`` below executes it)
----------------------------------------------------------------
For hidden ``h`` [T, H], weight ``W`` [V, H] (both bf16 or both fp16), targets ``y`` [T],
``grad`` fp32 [T] and a temperature ``tau`` (``fp32(tau)`` > 0 and finite):

1. ``z``, ``m_t``, ``p_tv = exp_c(RN32(z_tv - m_t))`` exactly as steps 1-4 of ``token_logprobs``
   v2 (linear v2 logits in fp32, one IEEE division by ``fp32(tau)``, the R5 row max);
   ``P_tv = RNE(p_tv 2**40)``, ``S_t = sum_v P_tv`` (exact int64), ``L_t = ldexp_c(int_to_fp32(S_t),
   -40)``: the forward's normaliser, bit for bit.
2. ``q_tv = RN32(p_tv / L_t)`` (one IEEE division; never a reciprocal multiply) and, for
   ``v != y_t``, ``a_tv = -q_tv``.
3. The target's coefficient is the exact complement, not ``1 - q``: ``a_{t,y_t} = RN32(r_t / L_t)``
   with ``r_t = ldexp_c(int_to_fp32(S_t - P_{t,y_t}), -40)`` (the grid mass of every other token,
   an exact integer, rounded once). A confident token (``p_y`` within 2**-24 of 1) keeps its
   gradient instead of the rounding residue of ``1 - q``.
4. ``s_t = RN32(grad_t / fp32(tau))`` (one IEEE division; ``tau = 1`` gives ``grad`` itself),
   ``c_tv = RN32(s_t * a_tv)``: one fp32 product. ``c`` stays fp32 (24-bit significands on the
   28-bit row grids below); it is NOT cast to the input dtype as the ``grad_logits`` of a bf16
   autograd are. Measured (``rlkernel accuracy --op token_logprobs_backward``, CPU small sizes,
   relative L2 against float64; torch bf16 autograd / c cast to bf16 / c in fp32): d_hidden
   2.48e-3 / 2.49e-3 / 1.67e-3 and d_weight 2.55e-3 / 1.86e-3 / 3.7e-8 on normal data; with
   100x outlier channels d_hidden 8.5e-3 / 2.2e-3 / 1.6e-3, d_weight 9.1e-3 / 1.4e-3 / 1.1e-7.
   A bf16 ``c`` puts d_hidden at torch's error (a coin flip against the accuracy rule) and
   d_weight at bf16 precision; an fp32 ``c`` costs nothing (the grid is 28 bits either way) and
   leaves only the output rounding. Where ``m_t`` is not finite (the forward's output is NaN),
   the whole row ``c_t`` is NaN.
5. ``d_hidden = linear v2 of (c [T, V], W.T [H, V])`` with the vocabulary as the reduction axis:
   ``ec_t = expo(max_v |c_tv|)``, ``ew_d = expo(max_v |W_vd|)`` (finite entries; P1);
   ``X_tv = RNE(c_tv 2**(27 - ec_t))`` (28-bit grids), ``Wt_dv = RNE(W_vd 2**(20 - ew_d))``
   (21-bit grids); ``D_td = sum_v X_tv Wt_dv`` EXACTLY, and ``d_hidden_td = RN_dtype(D_td
   2**(ec_t + ew_d - 47))`` rounded once. ``|D|`` can pass 2**63 when V > 2**16 - 1 (the many
   probabilities below the 2**-40 grid of step 1 are in ``q`` but not in ``a_y``), so the sum
   is defined as the exact integer, whatever its width: any split of the vocabulary into
   chunks of at most 2**16 - 1 rows gives int64 chunk partials ``C_k`` (each below 2**63), and
   ``D = sum_k C_k`` is carried without loss as two int64 words, ``HI = sum_k (C_k >> 32)`` and
   ``LO = sum_k (C_k & (2**32 - 1))`` (``D = HI 2**32 + LO``), rounded once from the pair (P3' of
   ``int2_to_float``). The bits cannot depend on the chunking. NaN where row t of c or column d
   of W holds a non-finite value (linear v2's rule), canonical NaN.
6. ``d_weight = linear v2 of (c.T [V, T], h.T [H, T])`` with fp32 output: the tokens are the
   reduction axis (T <= 2**16 - 1, checked: raise beyond), ``c.T`` rows (one per vocabulary
   entry, over this call's tokens) on 28-bit grids, ``h.T`` rows (one per hidden channel) on
   21-bit grids, the exact int64 sum rounded ONCE to fp32. The call is one unit: its exponents
   are the maxima over its own tokens. The autograd layer calls this op once per sequence unit
   (``rlkernel.grads.current_units``) and sums the per-unit fp32 terms exactly
   (``rlkernel.grads.weight_grad``), so micro-batching and packing cannot change the bits.

Special values: ``c`` is NaN on rows whose forward output is NaN, and ``+-inf``/NaN where
``grad`` is not finite or ``s`` or ``s * a`` overflows fp32; linear v2's rule then makes the
matching ``d_hidden`` row and every ``d_weight`` row whose column of c holds it NaN. A zero
``grad_t`` (masked token) gives ``+-0`` coefficients: ``d_hidden[t] = +0`` and no contribution to
``d_weight``.

The sharded form (vocabulary split into contiguous shards, as ``token_logprobs_partial`` takes them)
----------------------------------------------------------------------------------------------------
Given the forward's all-reduced ``m`` (MAX of phase 1) and ``S`` (SUM of phase 2's ``sum_int``):

* phase 1: ``token_logprobs_backward_partial(grad, h, W_s, y, start_s, m, S)`` returns
  ``(ec_s, ew_s)``: the exponents of the shard's coefficient rows and of its weight columns
  (``linear_exponents`` rules: -149 for all-zero, 2**20 for non-finite); all-reduce MAX gives the
  global ``ec``, ``ew`` of step 5. Each shard makes the coefficients of its own rows from the
  global ``m`` and ``S``; the target's ``a_y`` is made by the shard that owns ``y_t``.
* phase 2: ``token_logprobs_backward_partial(..., exponents=(ec, ew))`` returns ``(hi_s, lo_s,
  d_weight_s)``: the two words of the shard's exact part of ``D`` on the global grids and the
  shard's rows of ``d_weight`` (final: a vocabulary row's gradient needs no other shard; its
  exponents are over tokens, the hidden channels' too, so they are the same on every shard).
* transport: all-reduce SUM of ``hi`` and ``lo`` (int64, exact in any order; ``|hi|, |lo| <
  2**62`` for any number of shards of a vocabulary <= 2**22).
* ``token_logprobs_backward_finish(hi, lo, ec, ew, out_dtype)``: step 5's single rounding. The bits
  of ``d_hidden`` for any number of shards; the concatenated ``d_weight_s`` are ``d_weight``.

Invariances: ``d_hidden[t]`` depends only on (grad_t, h_t, y_t, W, tau): batch, chunking and
permutation of tokens cannot change it, nor can TP shards 1/2/4 (either output); ``d_weight``
depends on the multiset of this call's tokens (permuting tokens leaves it alone); permuting the
vocabulary permutes ``d_weight``'s rows and leaves ``d_hidden`` alone; permuting the hidden
channels permutes both outputs' columns.
"""

from __future__ import annotations

from typing import Any

import torch

from . import linear as _linear
from . import token_logprobs as _tl
from ._contract import BenchCase, Case, Contract, InvarianceCase, Runner
from ._exact.fixed import F_SUM, quantize
from ._exact.fp32 import canonicalize, int2_to_float, int_to_fp32, ldexp_c, max_r5
from ._exact.transcendental import exp_c
from ._gen import from_bits, integers, normal, seed_of, special_values, with_outlier_channels
from .token_logprobs import _logits

CONTRACT = Contract(
    name="token_logprobs_backward",
    version=1,
    summary="c = RN32(RN32(grad/tau) * (onehot - p/L)) in fp32; d_hidden = linear_v2(c, W.T) over V (exact, "
            "wide); d_weight = linear_v2(c.T, h.T) over this call's tokens, fp32",
    invariances=("batch", "permutation", "reduction_order", "tp_degree", "repeat"),
    dtypes={"grad": (torch.float32,), "hidden": (torch.bfloat16, torch.float16),
            "weight": (torch.bfloat16, torch.float16), "weight_shard": (torch.bfloat16, torch.float16),
            "targets": (torch.int64,), "row_max": (torch.float32,), "sum_int": (torch.int64,),
            "hi": (torch.int64,), "lo": (torch.int64,), "ec": (torch.int64,), "ew": (torch.int64,)},
    parameters={
        "forward_rules": "z, m, p = exp_c(z - m), P = RNE(p 2**40), S and L = ldexp_c(int_to_fp32(S), -40) exactly "
                         "as token_logprobs v2 (28/21-bit logits, one division by fp32(tau), R5 max)",
        "softmax_division": "q = RN32(p / L): one IEEE fp32 division (no reciprocal)",
        "target_complement": "a_y = RN32(ldexp_c(int_to_fp32(S - P_y), -40) / L): the exact grid mass of the "
                             "other tokens, one P3 rounding and one division (not RN32(1 - q_y))",
        "grad_scale": "s = RN32(grad / fp32(tau)): one IEEE division, before the product",
        "coef_product": "c = RN32(s * a), a = -q off the target, a_y on it: one fp32 product, kept in fp32 (not "
                        "cast to the input dtype)",
        "nonfinite_max": "where m_t is not finite the whole coefficient row c_t is NaN",
        "c_grid_bits": "c rows (d_hidden: over V; d_weight: c.T rows over tokens) on 28-bit grids "
                       "RNE(c 2**(27 - e)) (C_BITS = 27)",
        "operand_grid_bits": "W.T rows (d_hidden) and h.T rows (d_weight) on 21-bit grids RNE(x 2**(20 - e)) "
                             "(O_BITS = 20)",
        "grid_rounding": "placing a value on its row grid rounds to nearest, ties to even",
        "row_exponent": "e = expo(max finite |x|) of each row of c, c.T, W.T and h.T (P1), over the whole "
                        "reduction axis (the full vocabulary; all of this call's tokens)",
        "nonfinite_rows": "a NaN or +-inf in row t of c / column d of W makes d_hidden[t, d] NaN; in column v of c "
                          "/ column d of h makes d_weight[v, d] NaN (linear v2)",
        "vocab_sum": "D = sum over the whole vocabulary exactly (wider than int64): chunk partials (<= 2**16 - 1 "
                     "rows) summed as two int64 words HI = sum (C >> 32), LO = sum (C & (2**32 - 1))",
        "hidden_rounding": "d_hidden = RN_dtype((HI 2**32 + LO) 2**(ec + ew - 47)): one rounding, straight to "
                           "hidden's dtype (P3'; not through fp32)",
        "weight_rounding": "d_weight = RN32(C 2**(ec + eh - 47)): one rounding to fp32 per call (the unit; "
                           "T <= 2**16 - 1 tokens keep |C| < 2**63, more raises ValueError)",
        "subnormal_results": "results in the output's subnormal range are kept (rounded once), not flushed",
        "shard_rules": "vocabulary shards: each makes the coefficients of its rows from the global m and S (the "
                       "target's a_y on its owner only); phase 1 returns linear_exponents of its c rows and W columns "
                       "(-149 all-zero, 2**20 non-finite) for an all-reduce MAX; phase 2 the two words of its exact "
                       "part of D on the global grids (SUM) and its own d_weight rows",
    },
)

#: Magnitude bits of the coefficient grids (28-bit) and of the other operand's grids (21-bit), as linear v2.
C_BITS, O_BITS = _linear.X_BITS, _linear.W_BITS
#: Largest token count of one call's d_weight, and the reference's vocabulary chunk (the linear bound).
MAX_TOKENS = _linear.MAX_K
VOCAB_CHUNK = _linear.MAX_K
#: The two words of the wide vocabulary sum: D = HI * 2**WORD_SHIFT + LO.
WORD_SHIFT = 32


def _shard_coefficients(grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                        vocab_start: int, m: torch.Tensor, s_int: torch.Tensor, temperature: float) -> torch.Tensor:
    """Steps 2-4 for the vocabulary rows ``vocab_start ..`` of ``weight_shard``, given the global row
    max ``m`` and the global grid sum ``S``: the coefficients [T, Vs], float32."""
    z = _logits(hidden, weight_shard, temperature)
    finite = torch.isfinite(m)
    m0 = torch.where(finite, m, torch.zeros_like(m))
    p = exp_c(z - m0.unsqueeze(-1))
    p = torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))  # rows with a non-finite max: NaN below
    total = ldexp_c(int_to_fp32(s_int), torch.full_like(s_int, -F_SUM))
    total = torch.where(finite, total, torch.ones_like(total))
    q = p / total.unsqueeze(-1)
    local = targets - vocab_start
    owner = (local >= 0) & (local < weight_shard.shape[0])
    idx = local.clamp(0, weight_shard.shape[0] - 1).view(-1, 1)
    rest = s_int - quantize(p.gather(1, idx).view(-1), torch.zeros((), dtype=torch.int64), F_SUM)
    a_y = ldexp_c(int_to_fp32(rest), torch.full_like(rest, -F_SUM)) / total
    a = torch.where(owner.unsqueeze(-1) & (torch.arange(z.shape[1]).unsqueeze(0) == idx), a_y.unsqueeze(-1), -q)
    tau = torch.tensor(temperature, dtype=torch.float32)
    s = grad.to(torch.float32) / tau
    c = s.unsqueeze(-1) * a
    return canonicalize(torch.where(finite.unsqueeze(-1), c, torch.full_like(c, float("nan"))))


def coefficients(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
    """Steps 1-4: the coefficients ``c`` [T, V], float32 (one shard holding the whole vocabulary)."""
    z = _logits(hidden, weight, temperature)
    m = max_r5(z, dim=-1)
    finite = torch.isfinite(m)
    p = exp_c(z - torch.where(finite, m, torch.zeros_like(m)).unsqueeze(-1))
    p = torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))
    s_int = quantize(p, torch.zeros((), dtype=torch.int64), F_SUM).sum(dim=-1)
    return _shard_coefficients(grad, hidden, weight, targets, 0, m, s_int, temperature)


def _finish_words(hi: torch.Tensor, lo: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                  out_dtype: torch.dtype) -> torch.Tensor:
    """``RN_out((hi 2**32 + lo) 2**(ex + ew - 47))`` once; NaN where ``ex`` or ``ew`` is the sentinel."""
    bad = (ex == _linear.SENTINEL).unsqueeze(1) | (ew == _linear.SENTINEL).unsqueeze(0)
    ex0 = torch.where(ex == _linear.SENTINEL, torch.zeros_like(ex), ex)
    ew0 = torch.where(ew == _linear.SENTINEL, torch.zeros_like(ew), ew)
    y = int2_to_float(hi, lo, WORD_SHIFT, ex0.unsqueeze(1) + ew0.unsqueeze(0) - C_BITS - O_BITS, out_dtype)
    return canonicalize(torch.where(bad, torch.full_like(y, float("nan")), y))


def _words(x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact ``X @ Wt.T`` over K of any length on the grids ``ex``/``ew``, as two int64 words."""
    hi = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64)
    lo = torch.zeros_like(hi)
    for k0 in range(0, x.shape[1], VOCAB_CHUNK):
        part = _linear.reference_partial(x[:, k0:k0 + VOCAB_CHUNK], w[:, k0:k0 + VOCAB_CHUNK], ex, ew)
        hi += part >> WORD_SHIFT
        lo += part & ((1 << WORD_SHIFT) - 1)
    return hi, lo


def _wide_linear(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``linear`` v2 of x [M, K] and w [N, K] for any K: the exact sum over K carried in two int64
    words (chunks of :data:`VOCAB_CHUNK`), rounded once to ``out_dtype``."""
    ex, ew = _linear.reference_exponents(x, w)
    return _finish_words(*_words(x, w, ex, ew), ex, ew, out_dtype)


def reference(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
              temperature: float = 1.0, need_hidden: bool = True,
              need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``token_logprobs`` in hidden and weight: ``(d_hidden, d_weight)``.

    ``c_tv = grad_t (onehot_v(y_t) - softmax_tv) / tau``; ``d_hidden = c @ W``; ``d_weight = c.T @ h``

    Parameters
    ----------
    grad : Tensor, float32, [T]
        ``dL/dlogp_t``, one per token.
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight : Tensor, same dtype, [V, H], V <= 2**22
    targets : Tensor, int64, [T], in [0, V)
    temperature : float
        ``fp32(temperature)`` > 0 and finite.
    need_hidden, need_weight : bool
        Which gradients to compute (the other is None).

    Returns
    -------
    d_hidden : Tensor, hidden's dtype, [T, H], or None
    d_weight : Tensor, float32, [V, H], or None
        This call's tokens as one unit, rounded once; T <= 2**16 - 1.

    Bitwise semantics
    -----------------
    Steps 1-6 of the module docstring: the forward's exact p and L, ``q = RN32(p / L)``, the
    target's exact complement, ``c = RN32(RN32(grad / tau) * a)`` (fp32); ``d_hidden`` is the
    linear v2 digit product over the whole vocabulary (28-bit c rows, 21-bit W columns, an
    exact sum wider than int64, one rounding to hidden's dtype); ``d_weight`` the linear v2
    digit product over the call's tokens (28-bit c columns, 21-bit h columns, one rounding to
    fp32). Canonical NaN. Contract ``token_logprobs_backward`` version 1.
    """
    t, h = hidden.shape
    if need_weight and t > MAX_TOKENS:
        raise ValueError(f"token_logprobs_backward: d_weight reduces over T = {t} tokens, above the exact-sum "
                         f"bound 2**16 - 1 = {MAX_TOKENS}; call it per sequence (unit) and sum the terms exactly")
    c = coefficients(grad, hidden, weight, targets, temperature)
    d_hidden = _wide_linear(c, weight.T, hidden.dtype) if need_hidden else None
    d_weight = _linear.reference(c.T, hidden.T, out_dtype=torch.float32) if need_weight else None
    return d_hidden, d_weight


def reference_partial(grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                      vocab_start: int, row_max: torch.Tensor, sum_int: torch.Tensor, temperature: float = 1.0,
                      exponents: tuple[torch.Tensor, torch.Tensor] | None = None,
                      need_weight: bool = True) -> tuple[torch.Tensor | None, ...]:
    """One vocabulary shard's part of :func:`reference` (tensor parallelism over the vocabulary).

    Parameters
    ----------
    grad, hidden, targets, temperature
        As in :func:`reference` (the same on every shard; targets are global ids).
    weight_shard : Tensor, hidden's dtype, [Vs, H]: rows ``vocab_start ..`` of the LM head.
    vocab_start : int
    row_max : Tensor, float32, [T]: the forward's global row max (R5 MAX of
        ``token_logprobs_partial`` phase 1 over the shards).
    sum_int : Tensor, int64, [T]: the forward's global grid sum (SUM of phase 2's ``sum_int``).
    exponents : tuple (ec int64 [T], ew int64 [H]), optional
        Phase 2: the all-reduce MAX over the shards of phase 1's outputs.
    need_weight : bool

    Returns
    -------
    Phase 1: ``(ec, ew)``: the exponents of this shard's coefficient rows and weight columns
    (``linear_exponents`` rules: -149 for an all-zero row, 2**20 for a non-finite one).
    Phase 2: ``(hi, lo, d_weight_shard)``: the two int64 words of this shard's exact part of
    ``D = sum_v X_tv Wt_dv`` on the global grids, and this shard's rows of ``d_weight`` (fp32,
    or None) -- final, since a vocabulary row's gradient needs no other shard.

    Bitwise semantics
    -----------------
    Steps 2-6 of the module docstring on the shard's rows, with the global ``m`` and ``S`` (the
    target's coefficient is made by the shard that owns it). All-reduce SUM ``hi`` and ``lo`` as
    int64 (exact in any order), then :func:`reference_finish`: the bits of :func:`reference`'s
    ``d_hidden`` for any number of shards; the concatenated ``d_weight_shard`` are its ``d_weight``.
    Contract ``token_logprobs_backward`` version 1.
    """
    m = row_max.to(torch.float32)
    c = _shard_coefficients(grad, hidden, weight_shard, targets, vocab_start, m, sum_int, temperature)
    if exponents is None:
        return _linear.reference_exponents(c, weight_shard.T)
    finite = torch.isfinite(m)
    z = _logits(hidden, weight_shard, temperature)
    if bool((finite.unsqueeze(-1) & ~(z <= torch.where(finite, m, torch.zeros_like(m)).unsqueeze(-1))).any()):
        raise ValueError("token_logprobs_backward_partial: row_max is below a logit of this shard (or a logit is NaN "
                         "while row_max is finite); pass the R5 max over all shards of token_logprobs_partial's "
                         "phase 1")
    ec, ew = exponents
    hi, lo = _words(c, weight_shard.T, ec, ew)
    d_weight = _linear.reference(c.T, hidden.T, out_dtype=torch.float32) if need_weight else None
    return hi, lo, d_weight


def reference_finish(hi: torch.Tensor, lo: torch.Tensor, ec: torch.Tensor, ew: torch.Tensor,
                     out_dtype: torch.dtype) -> torch.Tensor:
    """``d_hidden = RN_out((hi 2**32 + lo) 2**(ec + ew - 47))`` from the all-reduced words.

    Parameters
    ----------
    hi, lo : Tensor, int64, [T, H]: SUM over the shards of phase 2's words (|hi|, |lo| < 2**62).
    ec : Tensor, int64, [T]; ew : Tensor, int64, [H]: the global exponents.
    out_dtype : torch.dtype: hidden's dtype.

    Returns
    -------
    Tensor, out_dtype, [T, H]

    Bitwise semantics
    -----------------
    One rounding of the exact value (P3' of a two-word integer), NaN where ``ec`` or ``ew`` is the
    sentinel 2**20, canonical NaN. Contract ``token_logprobs_backward`` version 1.
    """
    return _finish_words(hi, lo, ec, ew, out_dtype)


REFERENCES = {
    "token_logprobs_backward": reference,
    "token_logprobs_backward_partial": reference_partial,
    "token_logprobs_backward_finish": reference_finish,
}


# --- simulated tensor parallelism ---------------------------------------------------------------

def sharded(run: Runner, grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            temperature: float, shards: int) -> tuple[Any, Any]:
    """``token_logprobs_backward`` through ``shards`` vocabulary shards: the forward's phase 1 (MAX) and
    phase 2 (SUM of sum_int), backward phase 1 (MAX of exponents), phase 2 (SUM of the words), finish."""
    bounds = _tl.shard_bounds(weight.shape[0], shards)

    def part(op: str, a: int, b: int, **kw: Any) -> Any:
        return run(op, hidden=hidden, weight_shard=weight[a:b], targets=targets, vocab_start=a,
                   temperature=temperature, **kw)

    m = _tl.max_over_shards([part("token_logprobs_partial", a, b) for a, b in bounds])
    s_int = torch.stack([part("token_logprobs_partial", a, b, row_max=m)[0] for a, b in bounds]).sum(dim=0)
    exps = [part("token_logprobs_backward_partial", a, b, grad=grad, row_max=m, sum_int=s_int) for a, b in bounds]
    ec = torch.stack([e[0] for e in exps]).amax(dim=0)
    ew = torch.stack([e[1] for e in exps]).amax(dim=0)
    words = [part("token_logprobs_backward_partial", a, b, grad=grad, row_max=m, sum_int=s_int, exponents=(ec, ew))
             for a, b in bounds]
    hi = torch.stack([w[0] for w in words]).sum(dim=0)
    lo = torch.stack([w[1] for w in words]).sum(dim=0)
    d_hidden = run("token_logprobs_backward_finish", hi=hi, lo=lo, ec=ec, ew=ew, out_dtype=hidden.dtype)
    return d_hidden, torch.cat([w[2] for w in words])


# --- conformance cases ------------------------------------------------------------------------

def _inputs(case: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            w_std: float = 0.25) -> dict[str, Any]:
    seed = seed_of("token_logprobs_backward", case)
    return {
        "grad": normal(seed + 4, (t,), std=1.0, dtype=torch.float32),
        "hidden": normal(seed + 1, (t, h), std=1.0, dtype=dtype),
        "weight": normal(seed + 2, (v, h), std=w_std, dtype=dtype),
        "targets": integers(seed + 3, (t,), 0, v),
        "temperature": temperature,
    }


def _golden(name: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            w_std: float = 0.25, full_only: bool = False) -> Case:
    return Case(name, "golden", lambda: _inputs(name, t, h, v, dtype, temperature, w_std), full_only=full_only)


def golden_cases() -> list[Case]:
    """Realistic shapes, bf16 and fp16, several temperatures and logit spreads."""
    return [
        _golden("bf16_t16_h64_v1000", 16, 64, 1000, torch.bfloat16),
        _golden("fp16_t8_h128_v517_tau0.7", 8, 128, 517, torch.float16, 0.7, w_std=0.1),
        _golden("bf16_t33_h96_v2053_tau1.3", 33, 96, 2053, torch.bfloat16, 1.3, w_std=0.5),
        _golden("bf16_t1_h256_v2048", 1, 256, 2048, torch.bfloat16, w_std=0.05),
        _golden("bf16_t64_h512_v32000", 64, 512, 32000, torch.bfloat16, full_only=True),
        # a decode step's rows (64 < T <= 256) and a prefill's (T > 256): where a backend's GEMM
        # takes other paths for more rows (CUDA: the wgmma kernel on weight planes made per call)
        _golden("bf16_t160_h64_v17000_tau0.9", 160, 64, 17000, torch.bfloat16, 0.9, full_only=True),
        _golden("bf16_t300_h128_v5000", 300, 128, 5000, torch.bfloat16, full_only=True),
        Case("partial_phase1_bf16", "golden", lambda: _partial_inputs("partial_phase1_bf16", 1),
             op="token_logprobs_backward_partial"),
        Case("partial_phase2_bf16", "golden", lambda: _partial_inputs("partial_phase2_bf16", 2),
             op="token_logprobs_backward_partial"),
        Case("finish_bf16", "golden", lambda: _finish_inputs("finish_bf16", torch.bfloat16),
             op="token_logprobs_backward_finish"),
        Case("finish_fp16", "golden", lambda: _finish_inputs("finish_fp16", torch.float16),
             op="token_logprobs_backward_finish"),
    ]


def _forward_stats(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's global ``(row_max, sum_int)`` (what token_logprobs_partial's all-reduces give)."""
    z = _logits(hidden, weight, temperature)
    m = max_r5(z, dim=-1)
    finite = torch.isfinite(m)
    p = exp_c(z - torch.where(finite, m, torch.zeros_like(m)).unsqueeze(-1))
    p = torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))
    return m, quantize(p, torch.zeros((), dtype=torch.int64), F_SUM).sum(dim=-1)


def _partial_inputs(name: str, phase: int) -> dict[str, Any]:
    """Rows 250..519 of a 700-row head; row 2's hidden holds a NaN, row 4's grad is 0, rows 0-5 target the
    shard, the rest other shards."""
    base = _inputs(name, 12, 48, 700, torch.bfloat16, 0.8)
    h = base["hidden"].clone()
    h[2, 7] = float("nan")
    base["grad"][4] = 0.0  # an all-zero coefficient row: exponent -149
    y = base["targets"].clone()
    y[:6] = torch.tensor([250, 300, 400, 519, 260, 261])
    y[6:] = torch.tensor([0, 249, 520, 699, 10, 600])
    m, s_int = _forward_stats(h, base["weight"], 0.8)
    out: dict[str, Any] = {"grad": base["grad"], "hidden": h, "weight_shard": base["weight"][250:520], "targets": y,
                           "vocab_start": 250, "row_max": m, "sum_int": s_int, "temperature": 0.8}
    if phase == 2:
        c = coefficients(base["grad"], h, base["weight"], y, 0.8)
        out["exponents"] = _linear.reference_exponents(c, base["weight"].T)
    return out


def _finish_inputs(name: str, dtype: torch.dtype) -> dict[str, Any]:
    """Words of either sign and both magnitudes (|hi| up to 2**40), exponents spanning the output range,
    a zero row (-149) and a sentinel row and column."""
    seed = seed_of("token_logprobs_backward", name)
    t, h = 6, 10
    hi = integers(seed, (t, h), -(1 << 40), 1 << 40)
    hi[0] = 0
    lo = integers(seed + 1, (t, h), 0, 1 << 32)
    ec = torch.tensor([-149, 0, -20, 5, -60, 1 << 20], dtype=torch.int64)
    ew = integers(seed + 2, (h,), -30, 3)
    ew[4] = 1 << 20
    return {"hi": hi, "lo": lo, "ec": ec, "ew": ew, "out_dtype": dtype}


def _vocab_beyond_int64() -> dict[str, Any]:
    """V = 70000, one token: the target's logit 0, every other -29 (p = exp_c(-29) ~ 2**-41.9, below the
    2**-40 grid: S = 2**40, so a_y = +0 while every other coefficient is -RN(s p)); grad makes those
    coefficients about -1.9921875 * 2**-40 (top of their binade) and column 1 of W is
    1.9921875 everywhere (0 in the logits): ``D = -69999 * (2**27 - 2**19) * (2**20 - 2**12)`` is below
    -2**63. An int64 accumulator wraps, a float64 one rounds; only the exact wide sum is right."""
    v = 70000
    w = torch.zeros((v, 2), dtype=torch.float64)
    w[1:, 0] = -29.0
    w[:, 1] = 1.9921875
    h = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    p = float(exp_c(torch.tensor([-29.0], dtype=torch.float32))[0])
    grad = torch.tensor([1.9921875 * 2.0**-40 / p], dtype=torch.float32)
    return {"grad": grad, "hidden": h.to(torch.bfloat16), "weight": w.to(torch.bfloat16),
            "targets": torch.zeros(1, dtype=torch.int64), "temperature": 1.0}


def _vocab_chunks() -> dict[str, Any]:
    """V = 66000 > 2**16 - 1 with ordinary values, three tokens: the vocabulary sum spans chunks."""
    return _inputs("vocab_66000", 3, 4, 66000, torch.bfloat16, w_std=1.0)


def _confident() -> dict[str, Any]:
    """Targets 20-40 nats above the rest: q_y rounds to 1 in fp32, so 1 - q_y would be 0; the exact
    complement S - P_y keeps the target's gradient (the tail's p ~ e**-20 .. e**-40 on the grid)."""
    base = _inputs("confident_targets", 6, 16, 300, torch.bfloat16, w_std=0.05)
    w = base["weight"].clone()
    h = base["hidden"].clone()
    y = base["targets"].clone()
    h[:, :6] = 0.0
    w[:, :6] = 0.0
    for t in range(6):  # token t alone reads channel t, where only its target's row is nonzero
        h[t, t] = 8.0
        y[t] = 10 * t + 3
        w[10 * t + 3, t] = 2.5 + 0.5 * t  # z_y - z_other ~ 20 .. 40
    base.update(hidden=h, weight=w, targets=y)
    return base


def _grad_specials() -> dict[str, Any]:
    """grad holds +-0, huge (grad / tau overflows fp32 at tau = 0.5, or almost), tiny (subnormal
    coefficients and d_weight rows) and ordinary values; rows of d_hidden with a non-finite coefficient
    are NaN, and so is every d_weight row."""
    base = _inputs("grad_specials", 10, 32, 120, torch.bfloat16, 0.5)
    g = base["grad"].clone()
    g[0], g[1], g[2], g[3], g[4], g[5] = 0.0, -0.0, 1e38, 3e-39, -2e-41, 3e38
    base["grad"] = g
    return base


def _grad_nonfinite(dtype: torch.dtype) -> dict[str, Any]:
    base = _inputs(f"grad_nonfinite_{dtype}", 4, 16, 40, dtype)
    g = base["grad"].clone()
    g[1] = float("inf")
    g[2] = float("nan")
    g[3] = 1.0e5  # fp16: d_hidden of this row overflows to +-inf
    base["grad"] = g
    return base


def _specials_hidden(dtype: torch.dtype) -> dict[str, Any]:
    """A few hidden rows with one special value each: NaN / inf rows make NaN coefficients."""
    name = f"specials_in_hidden_{str(dtype).replace('torch.', '')}"
    base = _inputs(name, 14, 32, 90, dtype)
    sv = special_values(dtype)
    h = base["hidden"].clone()
    for i in range(len(sv)):
        h[i, (5 * i) % h.shape[1]] = sv[i]
    base["hidden"] = h
    return base


def _outliers(factor: float) -> dict[str, Any]:
    name = f"outlier_channels_{factor:g}"
    base = _inputs(name, 24, 128, 531, torch.bfloat16, w_std=0.1)
    base["hidden"] = with_outlier_channels(base["hidden"], seed_of("token_logprobs_backward", name, "ch"), 4,
                                           factor)
    return base


def _massive_token() -> dict[str, Any]:
    """One token 1000x the others in every channel: the h.T rows of d_weight span 10 binades."""
    base = _inputs("massive_token", 12, 64, 257, torch.bfloat16, w_std=0.02)
    h = base["hidden"].to(torch.float64)
    h[5] *= 1000.0
    base["hidden"] = h.to(torch.bfloat16)
    return base


def _tiny() -> dict[str, Any]:
    """Tiny hidden rows and weight rows (subnormal logits), tiny grads: fp16 subnormal coefficients and
    subnormal outputs."""
    base = _inputs("subnormal_fp16", 5, 16, 40, torch.float16)
    h = base["hidden"].to(torch.float64)
    h[1] *= 2.0**-14
    h[2] *= 2.0**-20
    base["hidden"] = h.to(torch.float16)
    base["grad"] = base["grad"] * torch.tensor([1.0, 2.0**-10, 2.0**-14, 2.0**-20, 1e-3])
    return base


def _zero_and_ties() -> dict[str, Any]:
    """Zero hidden rows (uniform p), duplicated weight rows (max ties), targets at 0 and V - 1."""
    base = _inputs("zero_rows_and_max_ties", 6, 24, 129, torch.bfloat16)
    h = base["hidden"].clone()
    h[0].zero_()
    h[3].zero_()
    w = base["weight"].clone()
    w[100] = w[5]
    w[128] = w[5]
    y = base["targets"].clone()
    y[0], y[1], y[2] = 0, 128, 100
    base.update(hidden=h, weight=w, targets=y)
    return base


def _bf16_ties() -> dict[str, Any]:
    """A 2**13 outlier channel with odd small values: the 21-bit h.T and W.T grids meet rounding ties."""
    base = _inputs("bf16_grid_ties", 7, 32, 97, torch.bfloat16, w_std=0.05)
    h = base["hidden"].clone()
    h[:, 1:9] = from_bits([0x3F81, 0xBF83, 0x3E85, 0xBD87, 0x3C89, 0xBB8B, 0x3A8D, 0xB98F], torch.bfloat16)
    h[0, 1:9] = 2.0**13
    w = base["weight"].clone()
    w[0, :] = 2.0**9
    base.update(hidden=h, weight=w)
    return base


def _hidden_rounding_tie() -> dict[str, Any]:
    """One token, V = 3, logits 0, 0 and -17.25 (target 0, grad 1): c = (0.5, -0.5, -RN(p_2 / 2)) with
    p_2 / 2 ~ 2**-25.9, and column 1 of W (0 in the logits) = (1, -2**-8, -0.25), so
    ``d_hidden[0, 1] = 0.5 + 2**-9 + ~2**-28``: just above a bf16 tie. Rounded once it goes up to
    0.5 + 2**-8; through fp32 the 2**-28 is lost and the tie goes to even, 0.5 (P3' against P3)."""
    w = torch.tensor([[0.0, 1.0], [0.0, -(2.0**-8)], [-17.25, -0.25]], dtype=torch.bfloat16)
    return {"grad": torch.ones(1, dtype=torch.float32), "hidden": torch.tensor([[1.0, 0.0]], dtype=torch.bfloat16),
            "weight": w, "targets": torch.zeros(1, dtype=torch.int64), "temperature": 1.0}


def _infinite_max() -> dict[str, Any]:
    """Row 0: every logit overflows to -inf (row max -inf); row 1: a logit overflows to +inf (row max
    +inf); rows 2-4 ordinary. The first two coefficient rows are NaN (their log-probs are NaN)."""
    base = _inputs("infinite_row_max", 5, 16, 40, torch.bfloat16)
    h, w = base["hidden"].clone(), base["weight"].clone()
    h[:, 5:7] = 0.0
    h[0, 5] = 2.0**100
    w[:, 5] = -(2.0**100)
    h[1, 6] = 2.0**100
    w[7, 6] = 2.0**100
    base.update(hidden=h, weight=w)
    return base


def _non_contiguous() -> dict[str, Any]:
    base = _inputs("non_contiguous", 10, 40, 200, torch.float16, w_std=0.1)
    base["hidden"] = base["hidden"].t().contiguous().t()
    w = torch.zeros((200, 80), dtype=torch.float16)
    w[:, ::2] = base["weight"]
    base["weight"] = w[:, ::2]
    g = torch.zeros(20, dtype=torch.float32)
    g[::2] = base["grad"]
    base["grad"] = g[::2]
    return base


def adversarial_cases() -> list[Case]:
    """The wide vocabulary sum, confident targets, special grads and hidden rows, outliers, subnormals,
    ties, temperatures, odd and empty shapes."""

    def case(name: str, make: Any) -> Case:
        return Case(name, "adversarial", make)

    return [
        case("vocab_sum_beyond_int64_v70000", _vocab_beyond_int64),
        case("vocab_chunks_v66000", _vocab_chunks),
        case("confident_targets", _confident),
        case("hidden_rounding_tie", _hidden_rounding_tie),
        case("infinite_row_max", _infinite_max),
        case("grad_specials", _grad_specials),
        case("grad_nonfinite_bf16", lambda: _grad_nonfinite(torch.bfloat16)),
        case("grad_nonfinite_fp16", lambda: _grad_nonfinite(torch.float16)),
        case("specials_in_hidden_bf16", lambda: _specials_hidden(torch.bfloat16)),
        case("specials_in_hidden_fp16", lambda: _specials_hidden(torch.float16)),
        case("outlier_channels_1e3", lambda: _outliers(1000.0)),
        case("outlier_channels_3e5", lambda: _outliers(3.0e5)),
        case("massive_token", _massive_token),
        case("subnormal_fp16", _tiny),
        case("zero_rows_and_max_ties", _zero_and_ties),
        case("bf16_grid_ties", _bf16_ties),
        case("temperature_1e-3", lambda: _inputs("temperature_1e-3", 6, 32, 50, torch.bfloat16, 1e-3)),
        case("temperature_3e2", lambda: _inputs("temperature_3e2", 6, 32, 50, torch.bfloat16, 300.0)),
        case("t1_v1", lambda: _inputs("t1_v1", 1, 8, 1, torch.bfloat16)),
        case("t3_h17_v129_fp16", lambda: _inputs("t3_h17_v129_fp16", 3, 17, 129, torch.float16)),
        case("t0_empty", lambda: _inputs("t0_empty", 0, 16, 33, torch.bfloat16)),
        case("non_contiguous", _non_contiguous),
    ]


# --- invariance cases -------------------------------------------------------------------------

def _inv(name: str, t: int = 9) -> dict[str, Any]:
    return _inputs(name, t, 48, 311, torch.bfloat16, 0.9)


def _run(run: Runner, a: dict[str, Any], **over: Any) -> tuple[torch.Tensor, torch.Tensor]:
    args = {**a, **over}
    out = run("token_logprobs_backward", **args)
    return out[0], out[1]


def _check_batch(run: Runner) -> tuple[Any, Any]:
    """Token 4's d_hidden alone vs the same token at position 3 of a batch of 7 (others different)."""
    a = _inv("inv_batch")
    alone, _ = _run(run, a, grad=a["grad"][4:5], hidden=a["hidden"][4:5], targets=a["targets"][4:5])
    other = _inv("inv_batch_other", 7)
    g, h, y = other["grad"].clone(), other["hidden"].clone(), other["targets"].clone()
    g[3], h[3], y[3] = a["grad"][4], a["hidden"][4], a["targets"][4]
    batch, _ = _run(run, a, grad=g, hidden=h, targets=y)
    return alone, batch[3:4]


def _check_permutation(run: Runner) -> tuple[Any, Any]:
    """Permuting the tokens permutes d_hidden's rows and leaves d_weight (one unit) alone."""
    a = _inv("inv_permutation")
    perm = torch.tensor([5, 2, 8, 0, 7, 1, 4, 6, 3])
    dh, dw = _run(run, a)
    pdh, pdw = _run(run, a, grad=a["grad"][perm], hidden=a["hidden"][perm], targets=a["targets"][perm])
    return (dh[perm], dw), (pdh, pdw)


def _check_vocab_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the vocabulary leaves d_hidden alone and permutes d_weight's rows."""
    a = _inv("inv_vocab_order")
    v = a["weight"].shape[0]
    perm = torch.flip(torch.arange(v), (0,))
    perm = torch.cat([perm[1::2], perm[0::2]])
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(v)
    dh, dw = _run(run, a)
    pdh, pdw = _run(run, a, weight=a["weight"][perm], targets=inverse[a["targets"]])
    return (dh, dw[perm]), (pdh, pdw)


def _check_hidden_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the hidden channels permutes both outputs' columns."""
    a = _inv("inv_hidden_order")
    perm = torch.flip(torch.arange(a["hidden"].shape[1]), (0,))
    dh, dw = _run(run, a)
    pdh, pdw = _run(run, a, hidden=a["hidden"][:, perm], weight=a["weight"][:, perm])
    return (dh[:, perm], dw[:, perm]), (pdh, pdw)


def _check_repeat(run: Runner) -> tuple[Any, Any]:
    a = _inv("inv_repeat")
    return _run(run, a), _run(run, a)


def _check_tp(shards: int, run: Runner) -> tuple[Any, Any]:
    """TP=1 vs ``shards`` vocabulary shards (forward partials, backward phases, exact all-reduces, finish);
    a NaN hidden row travels through the shards too."""
    a = _inv(f"inv_tp{shards}")
    h = a["hidden"].clone()
    h[2, 7] = float("nan")
    whole = _run(run, a, hidden=h)
    return whole, sharded(run, a["grad"], h, a["weight"], a["targets"], a["temperature"], shards)


def invariance_cases() -> list[InvarianceCase]:
    """Batch (d_hidden), permutation of tokens, vocabulary and hidden order, TP 2 and 4, repeat."""
    return [
        InvarianceCase("batch_row_alone_vs_in_7", "batch", _check_batch),
        InvarianceCase("permutation_tokens", "permutation", _check_permutation),
        InvarianceCase("reduction_order_vocab", "reduction_order", _check_vocab_order),
        InvarianceCase("reduction_order_hidden", "reduction_order", _check_hidden_order),
        InvarianceCase("tp2_vocab_shards", "tp_degree", lambda run: _check_tp(2, run)),
        InvarianceCase("tp4_vocab_shards", "tp_degree", lambda run: _check_tp(4, run)),
        InvarianceCase("repeat", "repeat", _check_repeat),
    ]


# --- benchmarks -------------------------------------------------------------------------------

def _native(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            temperature: float = 1.0, need_hidden: bool = True,
            need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """torch autograd of the same function in the input dtype (bf16 logits -> float -> log_softmax)."""
    with torch.enable_grad():
        h = hidden.detach().requires_grad_(need_hidden)
        w = weight.detach().requires_grad_(need_weight)
        logits = torch.nn.functional.linear(h, w).float() / temperature
        out = torch.log_softmax(logits, dim=-1).gather(-1, targets.view(-1, 1)).view(-1)
        wanted = [x for x, need in ((h, need_hidden), (w, need_weight)) if need]
        got = list(torch.autograd.grad(out, wanted, grad))
    return (got.pop(0) if need_hidden else None), (got.pop(0) if need_weight else None)


def _bench(t: int, h: int, v: int, name: str, size: str) -> BenchCase:
    def make(device: torch.device) -> dict[str, Any]:
        # Timing inputs only (no golden bits depend on them): torch's RNG on the device is fine.
        g = torch.Generator(device=device).manual_seed(t)
        return {"grad": torch.randn((t,), generator=g, device=device),
                "hidden": torch.randn((t, h), generator=g, device=device, dtype=torch.bfloat16),
                "weight": torch.randn((v, h), generator=g, device=device, dtype=torch.bfloat16) * 0.02,
                "targets": torch.randint(0, v, (t,), generator=g, device=device), "temperature": 1.0}

    return BenchCase(f"{name}_t{t}", make, _native, flops=6.0 * t * v * h,
                     bytes=2.0 * v * h + 4.0 * t * h + 12.0 * t + 4.0 * v * h, sizes=(size,))


def bench_cases(full: bool = False) -> list[BenchCase]:
    """large: the Qwen3-8B LM head (H 4096, V 151936) at T = 256 and 2048; small: H 1024, V 8192, T = 16.

    flops = 6 T V H (the logits and the two gradient GEMMs); bytes = weight (bf16) + hidden and
    d_hidden (bf16) + grad, targets + d_weight (fp32)."""
    large = [_bench(t, 4096, 151936, "qwen3_8b", "large") for t in (256, 2048)]
    return large + [_bench(16, 1024, 8192, "h1024_v8192", "small")]
