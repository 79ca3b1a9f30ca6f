"""Contract ``token_entropy_backward``: gradients of ``token_entropy`` in the hidden states and the LM head.

``H_t = -sum_v q_tv log q_tv`` with ``q_t = softmax(z_t / tau)``, ``z = hidden @ weight.T`` (contract
``token_entropy`` v1). Given ``grad_t = dL/dH_t``,
``dH_t/dz_tv = -q_tv (z_tv / tau - sum_u q_tu z_tu / tau) / tau``; the coefficient of logit
``z_tv`` is ``c_tv = grad_t dH_t/dz_tv`` and

* ``d_hidden[t] = sum_v c_tv weight[v]`` (per token: batch invariant);
* ``d_weight[v] = sum_t c_tv hidden[t]`` over the tokens of THIS call, one unit rounded once.

The design is ``token_logprobs_backward``'s (v1): the forward's exact quantities, an fp32
coefficient, and two linear v2 digit products (the vocabulary sum wider than int64).

The algorithm (the definition; ``reference`` below executes it)
----------------------------------------------------------------
For hidden ``h`` [T, H], weight ``W`` [V, H] (both bf16 or both fp16), ``grad`` fp32 [T] and a
temperature ``tau`` (``fp32(tau)`` > 0 and finite):

1. ``d_tv = RN32(z_tv - m_t)``, ``p_tv = exp_c(d_tv)``, ``L_t`` and ``mean_t = RN32(Ubar_t / L_t)``
   exactly as steps 1-7 of ``token_entropy`` v1 (``mean`` is the expectation of ``m - z/tau``, so
   ``z_v/tau - E[z/tau] = d_v + mean``).
2. ``q_tv = RN32(p_tv / L_t)`` (one IEEE division), ``e_tv = RN32(d_tv + mean_t)`` (one addition),
   ``a_tv = RN32(q_tv * e_tv)`` (one product), except ``a_tv = 0`` where ``p_tv = 0`` (the limit
   of ``q (log q + H)``; covers ``d = -inf``).
3. ``s_t = RN32(grad_t / fp32(tau))`` (one IEEE division; ``tau = 1`` gives grad itself) and
   ``c_tv = RN32((-s_t) * a_tv)`` (one fp32 product of the exact negation). ``c`` stays fp32, as
   in ``token_logprobs_backward`` v1 (not cast to the input dtype: on the 28-bit grids below an fp32
   coefficient costs nothing and keeps d_weight at fp32 precision). Where ``m_t`` is not finite
   (the forward's output is NaN) the whole row ``c_t`` is NaN.
4. ``d_hidden = linear v2 of (c [T, V], W.T [H, V])`` with the vocabulary as the reduction axis:
   ``ec_t = expo(max_v |c_tv|)``, ``ew_d = expo(max_v |W_vd|)`` (finite entries; P1);
   ``X_tv = RNE(c_tv 2**(27 - ec_t))`` (28-bit grids), ``Wt_dv = RNE(W_vd 2**(20 - ew_d))``
   (21-bit grids); ``D_td = sum_v X_tv Wt_dv`` EXACTLY (wider than int64 when V > 2**16 - 1:
   carried as two int64 words ``HI = sum_k (C_k >> 32)``, ``LO = sum_k (C_k & (2**32 - 1))`` of
   chunk partials ``C_k`` over at most 2**16 - 1 vocabulary rows; the bits cannot depend on the
   chunking), ``d_hidden_td = RN_dtype(D_td 2**(ec_t + ew_d - 47))`` rounded once (P3' of the
   two-word integer, straight to hidden's dtype). NaN where row t of c or column d of W holds a
   non-finite value (linear v2's rule), canonical NaN.
5. ``d_weight = linear v2 of (c.T [V, T], h.T [H, T])`` with fp32 output: the tokens are the
   reduction axis (T <= 2**16 - 1, checked), ``c.T`` rows on 28-bit grids, ``h.T`` rows on 21-bit
   grids, the exact int64 sum rounded ONCE to fp32. The call is one unit; the autograd layer calls
   the op once per sequence unit (``rlkernel.grads.current_units``) and sums the per-unit fp32
   terms exactly (``rlkernel.grads.weight_grad``).

Special values: ``c`` is NaN on rows whose forward output is NaN, and ``+-inf``/NaN where
``grad`` is not finite or ``s`` overflows; linear v2's rule then makes the matching ``d_hidden``
row and every ``d_weight`` row whose column of c holds it NaN. A zero ``grad_t`` gives ``+-0``
coefficients: ``d_hidden[t] = +0`` and no contribution to ``d_weight``. A uniform row (all logits
equal: ``d = 0``, ``mean = 0``) has ``c = 0``, the entropy's stationary point.

Invariances: ``d_hidden[t]`` depends only on (grad_t, h_t, W, tau): batch, chunking and
permutation of tokens cannot change it; ``d_weight`` depends on the multiset of the call's tokens
(permuting them leaves it alone); permuting the vocabulary permutes ``d_weight``'s rows and leaves
``d_hidden`` alone; permuting the hidden channels permutes both outputs' columns. A vocabulary
(TP) split would combine like ``token_logprobs_backward_partial`` (global ``m``, ``S``, ``U``;
exponents by MAX; the two words by SUM); no sharded sub-ops are defined in this version.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import linear as _linear
from ._contract import BenchCase, Case, Contract, InvarianceCase, Runner
from ._exact.fp32 import canonicalize, int2_to_float
from ._gen import normal, seed_of, special_values, with_outlier_channels
from .token_entropy import stats

CONTRACT = Contract(
    name="token_entropy_backward",
    version=1,
    summary="c = RN32(-RN32(grad/tau) * RN32(RN32(p/L) * RN32(d + mean))) in fp32; d_hidden = linear_v2(c, W.T) "
            "over V (exact, wide); d_weight = linear_v2(c.T, h.T) over this call's tokens, fp32",
    invariances=("batch", "permutation", "reduction_order", "repeat"),
    dtypes={"grad": (torch.float32,), "hidden": (torch.bfloat16, torch.float16),
            "weight": (torch.bfloat16, torch.float16)},
    parameters={
        "forward_rules": "z, m, d = RN32(z - m), p = exp_c(d), L and mean = RN32(Ubar / L) exactly as token_entropy "
                         "v1 (28/21-bit logits, one division by fp32(tau), R5 max, exact grid sums S and U)",
        "softmax_division": "q = RN32(p / L): one IEEE fp32 division (no reciprocal)",
        "centering": "e = RN32(d + mean): one fp32 addition (z/tau minus its expectation)",
        "coef_a": "a = RN32(q * e): one fp32 product (q first)",
        "zero_term": "a = 0 where p = 0 (covers d = -inf, where q * e is NaN)",
        "grad_scale": "s = RN32(grad / fp32(tau)): one IEEE division, before the product",
        "coef_product": "c = RN32((-s) * a): one fp32 product, kept in fp32 (not cast to the input dtype)",
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
                           "T <= 2**16 - 1 tokens, more raises ValueError)",
        "subnormal_results": "results in the output's subnormal range are kept (rounded once), not flushed",
    },
)

#: Magnitude bits of the coefficient grids (28-bit) and of the other operand's grids (21-bit), as linear v2.
C_BITS, O_BITS = _linear.X_BITS, _linear.W_BITS
#: Largest token count of one call's d_weight, and the reference's vocabulary chunk (the linear bound).
MAX_TOKENS = _linear.MAX_K
VOCAB_CHUNK = _linear.MAX_K
#: The two words of the wide vocabulary sum: D = HI * 2**WORD_SHIFT + LO.
WORD_SHIFT = 32


def coefficients(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor,
                 temperature: float = 1.0) -> torch.Tensor:
    """Steps 1-3: the coefficients ``c = grad dH/dz`` [T, V], float32."""
    d, p, total, mean, finite = stats(hidden, weight, temperature)
    q = p / total.unsqueeze(-1)
    e = d + mean.unsqueeze(-1)
    a = torch.where(p == 0, torch.zeros_like(p), q * e)
    tau = torch.tensor(temperature, dtype=torch.float32)
    s = grad.to(torch.float32) / tau
    c = (-s).unsqueeze(-1) * a
    return canonicalize(torch.where(finite.unsqueeze(-1), c, torch.full_like(c, float("nan"))))


def _wide_linear(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``linear`` v2 of x [M, K] and w [N, K] for any K: the exact sum over K carried in two int64
    words (chunks of :data:`VOCAB_CHUNK`), rounded once to ``out_dtype``; NaN on sentinel rows."""
    ex, ew = _linear.reference_exponents(x, w)
    hi = torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64)
    lo = torch.zeros_like(hi)
    for k0 in range(0, x.shape[1], VOCAB_CHUNK):
        part = _linear.reference_partial(x[:, k0:k0 + VOCAB_CHUNK], w[:, k0:k0 + VOCAB_CHUNK], ex, ew)
        hi += part >> WORD_SHIFT
        lo += part & ((1 << WORD_SHIFT) - 1)
    bad = (ex == _linear.SENTINEL).unsqueeze(1) | (ew == _linear.SENTINEL).unsqueeze(0)
    ex0 = torch.where(ex == _linear.SENTINEL, torch.zeros_like(ex), ex)
    ew0 = torch.where(ew == _linear.SENTINEL, torch.zeros_like(ew), ew)
    y = int2_to_float(hi, lo, WORD_SHIFT, ex0.unsqueeze(1) + ew0.unsqueeze(0) - C_BITS - O_BITS, out_dtype)
    return canonicalize(torch.where(bad, torch.full_like(y, float("nan")), y))


def reference(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
              need_hidden: bool = True, need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of ``token_entropy`` in hidden and weight: ``(d_hidden, d_weight)``.

    ``c_tv = -grad_t q_tv (z_tv / tau - sum_u q_tu z_tu / tau) / tau``; ``d_hidden = c @ W``;
    ``d_weight = c.T @ h``

    Parameters
    ----------
    grad : Tensor, float32, [T]
        ``dL/dH_t``, one per token (e.g. ``-entropy_coeff`` times the loss's token weights).
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight : Tensor, same dtype, [V, H], 1 <= V <= 2**22
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
    Steps 1-5 of the module docstring: the forward's exact ``p``, ``L`` and ``mean``;
    ``q = RN32(p / L)``, ``e = RN32(d + mean)``, ``a = RN32(q e)`` (0 where p = 0),
    ``c = RN32(-RN32(grad / tau) a)`` (fp32); ``d_hidden`` is the linear v2 digit product over
    the whole vocabulary (28-bit c rows, 21-bit W columns, an exact sum wider than int64, one
    rounding to hidden's dtype); ``d_weight`` the linear v2 digit product over the call's tokens
    (28-bit c columns, 21-bit h columns, one rounding to fp32). Canonical NaN. Contract
    ``token_entropy_backward`` version 1.
    """
    t = hidden.shape[0]
    if need_weight and t > MAX_TOKENS:
        raise ValueError(f"token_entropy_backward: d_weight reduces over T = {t} tokens, above the exact-sum "
                         f"bound 2**16 - 1 = {MAX_TOKENS}; call it per sequence (unit) and sum the terms exactly")
    c = coefficients(grad, hidden, weight, temperature)
    d_hidden = _wide_linear(c, weight.T, hidden.dtype) if need_hidden else None
    d_weight = _linear.reference(c.T, hidden.T, out_dtype=torch.float32) if need_weight else None
    return d_hidden, d_weight


REFERENCES = {"token_entropy_backward": reference}


# --- conformance cases ------------------------------------------------------------------------

def _inputs(case: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            w_std: float = 0.25) -> dict[str, Any]:
    seed = seed_of("token_entropy_backward", case)
    return {
        "grad": normal(seed + 4, (t,), std=1.0, dtype=torch.float32),
        "hidden": normal(seed + 1, (t, h), std=1.0, dtype=dtype),
        "weight": normal(seed + 2, (v, h), std=w_std, dtype=dtype),
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
        _golden("bf16_t1_h256_v2048_flat", 1, 256, 2048, torch.bfloat16, w_std=0.02),
        _golden("bf16_t64_h512_v32000", 64, 512, 32000, torch.bfloat16, full_only=True),
    ]


def _vocab_beyond_int64() -> dict[str, Any]:
    """V = 140000: logits +-1.9375 * 2**-8 on the two halves of the vocabulary (weight rows +-(1.9375,
    1.9375), hidden (2**-8, 0)). Then ``|c|`` is the same on every row in reals (``q_+ e_+ = q_- |e_-|``)
    and the sign of c matches the weight's, so every term of ``D`` is at the grid maximum of both
    operands: ``|D| >= 140000 * 1.9375 * 2**45 > 2**63``, and an int64 accumulator wraps."""
    v = 140000
    w = torch.full((v, 2), 1.9375, dtype=torch.float32)
    w[v // 2:] = -1.9375
    h = torch.tensor([[2.0**-8, 0.0], [2.0**-8, 0.0]])
    return {"grad": torch.tensor([1.0, -3.0]), "hidden": h.to(torch.bfloat16), "weight": w.to(torch.bfloat16),
            "temperature": 1.0}


def _hidden_rounding_tie() -> dict[str, Any]:
    """V = 3, logits (0, 0, x): ``c_2 ~ -2 c_0`` and column 1 of W = (-1, 0, -3 * 2**-10), so
    ``d_hidden[t, 1] = |c_0| (1 - 3 * 2**-9) + ~2**-31`` with grad chosen to make ``|c_0|`` about 1:
    just above a bf16 tie whose lower neighbour is even. Rounded once it goes up (0.99609375); through
    fp32 the excess is lost and the tie goes to even, 0.9921875 (P3' against P3; found by search)."""
    h = torch.tensor([[-0.515625, 0.0], [-0.546875, 0.0], [-0.6015625, 0.0]], dtype=torch.bfloat16)
    w = torch.tensor([[0.0, -1.0], [0.0, 0.0], [1.0, -3 * 2.0**-10]], dtype=torch.bfloat16)
    grad = torch.tensor([21.907135009765625, 21.010534286499023, 19.695087432861328], dtype=torch.float32)
    return {"grad": grad, "hidden": h, "weight": w, "temperature": 1.0}


def _grad_specials() -> dict[str, Any]:
    """grad rows 0, +-0, +-inf, NaN, huge (s * a overflows), subnormal."""
    base = _inputs("grad_specials", 8, 32, 90, torch.bfloat16)
    base["grad"] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3e38, 1e-40, 1.0])
    return base


def _specials_hidden(dtype: torch.dtype) -> dict[str, Any]:
    """One special value planted per hidden row (NaN rows of c), fp16/bf16."""
    base = _inputs(f"specials_hidden_{dtype}", 16, 32, 200, dtype)
    sv = special_values(dtype)
    h = base["hidden"].clone()
    for i in range(len(sv)):
        h[i, (5 * i) % h.shape[1]] = sv[i]
    base["hidden"] = h
    return base


def _special_weight() -> dict[str, Any]:
    """A +inf weight entry: every row max is NaN, so every coefficient and both outputs are NaN."""
    base = _inputs("inf_weight", 5, 32, 64, torch.float16)
    w = base["weight"].clone()
    w[7, 3] = float("inf")
    base["weight"] = w
    return base


def _outliers(factor: float, w_std: float) -> dict[str, Any]:
    """LLM-like outlier channels in the hidden states (peaked rows, wide grids)."""
    base = _inputs(f"outliers_{factor}", 24, 128, 531, torch.bfloat16, w_std=w_std)
    base["hidden"] = with_outlier_channels(base["hidden"], seed_of("token_entropy_backward", factor), 4, factor)
    return base


def _tiny() -> dict[str, Any]:
    """Subnormal hidden rows and weight rows: logits and gradients in the subnormal range."""
    base = _inputs("tiny", 4, 16, 40, torch.bfloat16)
    h = base["hidden"].to(torch.float64)
    w = base["weight"].to(torch.float64)
    h[1] *= 2.0**-130
    h[2] *= 2.0**-60
    w[:10] *= 2.0**-128
    w[10:20] *= 2.0**-70
    base["hidden"], base["weight"] = h.to(torch.bfloat16), w.to(torch.bfloat16)
    base["grad"] = base["grad"] * 2.0**-120
    return base


def _zero_and_ties() -> dict[str, Any]:
    """All-zero hidden rows (uniform: c = 0, the stationary point) and duplicated weight rows."""
    base = _inputs("zero_and_ties", 6, 48, 129, torch.bfloat16, w_std=0.5)
    h = base["hidden"].clone()
    h[0].zero_()
    h[3].zero_()
    w = base["weight"].clone()
    w[100] = w[5]
    w[128] = w[5]
    base.update(hidden=h, weight=w)
    return base


def _ninf_logit() -> dict[str, Any]:
    """Logits that overflow to -inf while the row max stays finite: p = 0, d = -inf, the zero rule."""
    base = _inputs("ninf_logit", 3, 24, 70, torch.bfloat16)
    h = base["hidden"].clone()
    w = base["weight"].clone()
    h[0:2, 5] = 2.0**60
    w[:, 5] = w[:, 5] * 2.0**-62
    w[3, 5] = -(2.0**100)
    w[9, 5] = -(2.0**100)
    base.update(hidden=h, weight=w)
    return base


def _all_ninf() -> dict[str, Any]:
    """Row 0: every logit overflows to -inf (m = -inf: the forward is NaN, so is the row of c); row 1:
    equal finite logits (uniform: c = 0)."""
    h = torch.tensor([[2.0**100, 0.0], [1.0, 1.0]], dtype=torch.bfloat16)
    w = torch.tensor([[-(2.0**100), 0.5], [-(2.0**100), -0.25], [-(2.0**100), 1.0]], dtype=torch.bfloat16)
    return {"grad": torch.tensor([1.0, 0.5]), "hidden": h, "weight": w, "temperature": 1.0}


def _confident() -> dict[str, Any]:
    """Peaked rows (one logit 8-20 above the rest): small coefficients where q is tiny, cancellation
    in ``d + mean`` near the expectation."""
    base = _inputs("confident", 6, 16, 300, torch.bfloat16, w_std=0.3)
    h = base["hidden"].clone()
    w = base["weight"].clone()
    h[:, 0] = torch.tensor([8.0, 10.0, 12.0, 14.0, 17.0, 20.0], dtype=torch.bfloat16)
    w[:, 0] = 0.0
    w[17, 0] = 1.0
    base.update(hidden=h, weight=w)
    return base


def _small_vocab() -> dict[str, Any]:
    """V = 2 and 3-valued logits: every coefficient shows its roundings (q, e, a, c) in d_hidden's
    last bits (few terms, hidden rows of one channel)."""
    j = torch.arange(48, dtype=torch.float32)
    h = (-(0.01 + j * 0.37)).to(torch.bfloat16).view(-1, 1)
    w = torch.tensor([[0.0], [1.0], [0.5]], dtype=torch.bfloat16)
    grad = normal(seed_of("token_entropy_backward", "small_vocab"), (48,), std=1.0, dtype=torch.float32)
    return {"grad": grad, "hidden": h, "weight": w, "temperature": 0.7}


def _non_contiguous() -> dict[str, Any]:
    base = _inputs("non_contiguous", 10, 40, 200, torch.float16)
    base["hidden"] = base["hidden"].t().contiguous().t()
    w = torch.zeros((200, 80), dtype=torch.float16)
    w[:, ::2] = base["weight"]
    base["weight"] = w[:, ::2]
    g = torch.zeros(20, dtype=torch.float32)
    g[::2] = base["grad"]
    base["grad"] = g[::2]
    return base


def adversarial_cases() -> list[Case]:
    """Wide vocabulary sums, grad specials, hidden/weight specials, outliers, underflow, the zero-term
    rule, confident rows, few-term rows, odd shapes."""

    def case(name: str, make: Any) -> Case:
        return Case(name, "adversarial", make)

    return [
        case("small_vocab_v3_tau0.7", _small_vocab),
        case("vocab_140000_beyond_int64", _vocab_beyond_int64),
        case("hidden_rounding_tie", _hidden_rounding_tie),
        case("grad_specials", _grad_specials),
        case("specials_in_hidden_bf16", lambda: _specials_hidden(torch.bfloat16)),
        case("specials_in_hidden_fp16", lambda: _specials_hidden(torch.float16)),
        case("inf_weight_fp16", _special_weight),
        case("outlier_channels_100", lambda: _outliers(100.0, 0.01)),
        case("outlier_channels_3e4", lambda: _outliers(3.0e4, 1e-4)),
        case("subnormal_underflow", _tiny),
        case("zero_rows_and_max_ties", _zero_and_ties),
        case("logit_overflow_ninf", _ninf_logit),
        case("all_logits_ninf", _all_ninf),
        case("confident_rows", _confident),
        case("temperature_0.05", lambda: _inputs("temperature_0.05", 4, 32, 50, torch.bfloat16, 0.05)),
        case("t3_h17_v129", lambda: _inputs("t3_h17_v129", 3, 17, 129, torch.float16)),
        case("t0_empty", lambda: _inputs("t0_empty", 0, 16, 33, torch.bfloat16)),
        case("non_contiguous", _non_contiguous),
    ]


# --- invariance cases -------------------------------------------------------------------------

def _inv(name: str, t: int = 9) -> dict[str, Any]:
    return _inputs(name, t, 48, 311, torch.bfloat16, 0.9)


def _run(run: Runner, a: dict[str, Any], **over: Any) -> tuple[torch.Tensor, torch.Tensor]:
    out = run("token_entropy_backward", **{**a, **over})
    return out[0], out[1]


def _check_batch(run: Runner) -> tuple[Any, Any]:
    """d_hidden of row 4 alone vs the same row at position 3 of a batch of 7."""
    a = _inv("inv_batch")
    alone, _ = _run(run, a, grad=a["grad"][4:5], hidden=a["hidden"][4:5], need_weight=False)
    other = _inputs("inv_batch_other", 7, 48, 311, torch.bfloat16, 0.9)
    h, g = other["hidden"].clone(), other["grad"].clone()
    h[3], g[3] = a["hidden"][4], a["grad"][4]
    batch, _ = _run(run, a, grad=g, hidden=h, need_weight=False)
    return alone, batch[3:4]


def _check_permutation(run: Runner) -> tuple[Any, Any]:
    """Permuting the tokens permutes d_hidden and leaves d_weight alone."""
    a = _inv("inv_permutation")
    perm = torch.tensor([5, 2, 8, 0, 7, 1, 4, 6, 3])
    dh, dw = _run(run, a)
    pdh, pdw = _run(run, a, grad=a["grad"][perm], hidden=a["hidden"][perm])
    return (dh[perm], dw), (pdh, pdw)


def _check_vocab_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the vocabulary permutes d_weight's rows and leaves d_hidden alone."""
    a = _inv("inv_vocab_order")
    v = a["weight"].shape[0]
    perm = torch.flip(torch.arange(v), (0,))
    perm = torch.cat([perm[1::2], perm[0::2]])
    dh, dw = _run(run, a)
    pdh, pdw = _run(run, a, weight=a["weight"][perm])
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


def invariance_cases() -> list[InvarianceCase]:
    """One check per declared invariance (two for reduction order)."""
    return [
        InvarianceCase("batch_row_alone_vs_in_7", "batch", _check_batch),
        InvarianceCase("permutation_tokens", "permutation", _check_permutation),
        InvarianceCase("reduction_order_vocab", "reduction_order", _check_vocab_order),
        InvarianceCase("reduction_order_hidden", "reduction_order", _check_hidden_order),
        InvarianceCase("repeat", "repeat", _check_repeat),
    ]


# --- benchmarks -------------------------------------------------------------------------------

def _native(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
            need_hidden: bool = True, need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """torch autograd of the same function in the same dtype (bf16 logits, fp32 entropy)."""
    h = hidden.detach().requires_grad_(need_hidden)
    w = weight.detach().requires_grad_(need_weight)
    logits = F.linear(h, w).float() / temperature
    ent = torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
    wanted = [x for x, need in ((h, need_hidden), (w, need_weight)) if need]
    got = list(torch.autograd.grad(ent, wanted, grad)) if wanted else []
    return (got.pop(0) if need_hidden else None), (got.pop(0) if need_weight else None)


def _bench(t: int, h: int, v: int, name: str, size: str) -> BenchCase:
    def make(device: torch.device) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(t)
        return {"grad": torch.randn((t,), generator=g, device=device),
                "hidden": torch.randn((t, h), generator=g, device=device, dtype=torch.bfloat16),
                "weight": torch.randn((v, h), generator=g, device=device, dtype=torch.bfloat16) * 0.02,
                "temperature": 1.0}

    return BenchCase(f"{name}_t{t}", make, _native, flops=6.0 * t * v * h,
                     bytes=2.0 * v * h * 2 + 4.0 * v * h + 4.0 * t * h + 4.0 * t, sizes=(size,))


def bench_cases(full: bool = False) -> list[BenchCase]:
    """large: the Qwen3-8B LM head at T = 256; small: hidden 1024, vocabulary 8192, T = 16.
    flops = 6 T V H (logits, d_hidden, d_weight)."""
    return [_bench(256, 4096, 151936, "qwen3_8b", "large"), _bench(16, 1024, 8192, "h1024_v8192", "small")]
