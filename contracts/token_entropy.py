"""Contract ``token_entropy``: entropy of each token's next-token distribution under the LM head.

``H_t = -sum_v p_tv log p_tv`` with ``p_t = softmax(hidden_t @ weight.T / temperature)``: the
quantity RL trainers log and regularise (verl's ``entropy_coeff``), computed so that every bit is
defined and the ``[T, V]`` logits never need to be held whole. It is built on exactly the
construction of ``token_logprobs`` v2 (same logits, same row max, same ``exp_c`` terms, same exact
sum ``S`` and normaliser ``L``), plus one more exact sum.

The algorithm (the definition; ``reference`` below executes it)
----------------------------------------------------------------
For hidden ``h`` [T, H] and weight ``W`` [V, H] (both bf16 or both fp16) and a temperature ``tau``
(a Python float, ``fp32(tau)`` > 0 and finite):

1. ``z_tv`` = the logits of ``token_logprobs`` v2 steps 1-2: ``linear`` v2 (28-bit hidden grids,
   21-bit head grids, exact int64 product, one rounding to fp32; NaN where a row of h or W holds a
   non-finite value), then one IEEE division by ``fp32(tau)``.
2. ``m_t = max_v z_tv`` (R5: NaN propagates, a zero max is +0).
3. ``d_tv = RN32(z_tv - m_t)`` (<= 0), ``p_tv = exp_c(d_tv)`` (P6).
4. ``S_t = sum_v RNE(p_tv 2**40)`` (exact int64, absolute grid E = 0, F = 40) and
   ``L_t = ldexp_c(int_to_fp32(S_t), -40)``: ``token_logprobs``' normaliser, bit for bit
   (``LSE_t = m_t + log L_t``).
5. The entropy terms ``g_tv = RN32(p_tv * (-d_tv))`` (one fp32 product; ``-d`` is exact), except
   ``g_tv = 0`` where ``p_tv = 0`` (``p log p -> 0``; this also covers ``d = -inf``). ``0 <= g <
   1`` (``x e**-x <= 1/e``).
6. ``U_t = sum_v RNE(g_tv 2**40)`` on the same absolute grid (exact int64; ``U < V 2**40 <=
   2**62``), ``Ubar_t = ldexp_c(int_to_fp32(U_t), -40)``.
7. ``mean_t = RN32(Ubar_t / L_t)`` (one IEEE division): the expected value of ``m - z/tau``.
8. ``H_t = RN32(log_c(L_t) + mean_t)``, NaN-canonicalised.

Why this form: ``H = LSE - sum_v q_v z_v = log L - sum_v q_v d_v`` with ``q = p / L``; both terms
are >= 0, so nothing cancels (the textbook ``logsumexp(z) - sum softmax(z) z`` in fp32 cancels
two numbers of the size of ``m`` and loses the entropy of a confident token entirely). Both sums
are exact integers, so the vocabulary may be tiled, split or reordered freely.

Special values: ``H_t`` is NaN exactly where ``m_t`` is not finite (a NaN anywhere in the row's
logits, a +inf logit, or every logit -inf), as ``token_logprobs``. Otherwise ``L_t`` is in
``[1, V]``, ``U_t >= 0`` and ``H_t`` is finite and ``>= +0`` (V = 1, or a row whose other
probabilities vanish on the grid, gives +0).

Invariances: each output row depends only on its own hidden row, the weight and the temperature,
so batch composition, chunking, prefill+decode, batch permutation and repetition cannot change a
bit; permuting the vocabulary (rows of W) or the hidden dimension (columns of h and W) leaves the
bits alone (exact sums). A vocabulary (TP) split could merge exact partials (the shard's
``S`` and ``U`` on the global ``m`` add as int64, exactly like ``token_logprobs_partial``'s
``sum_int``); no sharded sub-ops are defined in this version, so TP > 1 is refused by the model
layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import token_logprobs as _tl
from ._contract import BenchCase, Case, Contract, InvarianceCase, Runner
from ._exact.fixed import F_SUM, quantize
from ._exact.fp32 import canonicalize, int_to_fp32, ldexp_c, max_r5
from ._exact.transcendental import exp_c, log_c
from ._gen import from_bits, normal, seed_of, special_values, with_outlier_channels
from .token_logprobs import _logits

CONTRACT = Contract(
    name="token_entropy",
    version=1,
    summary="H_t = RN32(log_c(L_t) + RN32(sum_grid(RN32(p (m - z))) / L_t)), p = exp_c(z - m), "
            "L = sum_grid(p), z = linear_v2(h, W) / tau (token_logprobs v2's construction)",
    invariances=("batch", "chunking", "prefill_decode", "permutation", "reduction_order", "repeat"),
    dtypes={"hidden": (torch.bfloat16, torch.float16), "weight": (torch.bfloat16, torch.float16)},
    parameters={
        "hidden_grid_bits": "logits by linear v2: hidden rows on 28-bit grids RNE(h * 2**(27 - e)) (as token_logprobs)",
        "head_grid_bits": "LM-head rows on 21-bit grids RNE(w * 2**(20 - e))",
        "logits_grid_rounding": "placing a value on its row grid rounds to nearest, ties to even",
        "logits_row_exponent": "e = expo(max finite |v|) of each hidden and weight row (P1)",
        "logits_nonfinite": "a NaN or +-inf in hidden row t or weight row v makes z_tv NaN",
        "logits_product": "C = sum_k X Wt exactly in int64 (the scheme is free)",
        "logits_rounding": "z = C * 2**(e_h + e_w - 47) rounded once to fp32, to nearest, ties to even (P3')",
        "subnormal_logits": "logits in the subnormal range are kept (rounded once), not flushed to zero",
        "temperature": "z / fp32(tau): tau rounded once to fp32 (to nearest) and one IEEE division",
        "row_max": "m = R5 max of the logits: NaN propagates, a zero max is +0",
        "exp_c": "p = exp_c(RN32(z - m)): the contract exp (P6)",
        "sum_grid": "S = sum_v RNE(p * 2**40) and U = sum_v RNE(g * 2**40) on the absolute grid 2**-40 "
                    "(E = 0, F = 40), exact int64",
        "sum_rounding": "each p and each g is placed on the grid to nearest, ties to even",
        "int_to_fp32": "S and U -> fp32 in one rounding each, to nearest, ties to even (P3; never through "
                       "float64), then ldexp_c by -40",
        "entropy_term": "g = RN32(p * (-d)), d = RN32(z - m): one fp32 product of the exact negation",
        "zero_term": "g = 0 where p = 0 (the limit of p log p; covers d = -inf, where p * inf is NaN)",
        "mean_division": "mean = RN32(Ubar / L): one IEEE division (no reciprocal)",
        "log_c": "log_c(L): the contract log (P6; coefficients pinned by the log_softmax contract)",
        "output_rounding": "H = RN32(log_c(L) + mean): one fp32 addition",
        "nonfinite_max": "H is NaN (canonical) exactly where m is not finite",
    },
)

#: Largest vocabulary: V * 2**40 < 2**63 (P4 absolute grid, F = 40).
MAX_VOCAB = 1 << 22


def stats(hidden: torch.Tensor, weight: torch.Tensor,
          temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1-7: ``(d [T, V], p [T, V], L [T], mean [T], finite [T])``, all fp32 but ``finite``.

    Rows whose max is not finite get ``d = p = 0``, ``L = 1``, ``mean = 0`` (their results are NaN
    by the caller's rule). The backward contract uses the same values.
    """
    z = _logits(hidden, weight, temperature)
    m = max_r5(z, dim=-1)
    finite = torch.isfinite(m)
    m0 = torch.where(finite, m, torch.zeros_like(m))
    d = z - m0.unsqueeze(-1)
    d = torch.where(finite.unsqueeze(-1), d, torch.zeros_like(d))
    p = exp_c(d)
    p = torch.where(finite.unsqueeze(-1), p, torch.zeros_like(p))
    g = torch.where(p == 0, torch.zeros_like(p), p * (-d))
    grid = torch.zeros((), dtype=torch.int64)
    s_int = quantize(p, grid, F_SUM).sum(dim=-1)
    u_int = quantize(g, grid, F_SUM).sum(dim=-1)
    total = ldexp_c(int_to_fp32(s_int), torch.full_like(s_int, -F_SUM))
    total = torch.where(finite, total, torch.ones_like(total))
    ubar = ldexp_c(int_to_fp32(u_int), torch.full_like(u_int, -F_SUM))
    mean = torch.where(finite, ubar / total, torch.zeros_like(total))
    return d, p, total, mean, finite


def reference(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of each token's next-token distribution: ``H_t = -sum_v p_tv log p_tv``, bitwise defined.

    Parameters
    ----------
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight : Tensor, same dtype, [V, H] (the LM head, ``nn.Linear`` layout), V <= 2**22
    temperature : float
        ``fp32(temperature)`` must be > 0 and finite; ``p = softmax(z / temperature)``.

    Returns
    -------
    Tensor, float32, [T]

    Bitwise semantics
    -----------------
    Steps 1-8 of the module docstring: ``token_logprobs`` v2's logits, row max, ``exp_c`` terms and
    exact grid sum ``S`` (``L = ldexp_c(int_to_fp32(S), -40)``); the terms ``g = RN32(p (m - z))``
    (0 where p = 0) summed exactly on the same grid (``U``); ``mean = RN32(ldexp_c(int_to_fp32(U),
    -40) / L)``; ``H = RN32(log_c(L) + mean)``. NaN (canonical) exactly where the row max is not
    finite. Contract ``token_entropy`` version 1.
    """
    _, _, total, mean, finite = stats(hidden, weight, temperature)
    out = log_c(total) + mean
    return canonicalize(torch.where(finite, out, torch.full_like(out, float("nan"))))


REFERENCES = {"token_entropy": reference}


# --- conformance cases ------------------------------------------------------------------------

def _inputs(case: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            w_std: float = 0.1) -> dict[str, Any]:
    seed = seed_of("token_entropy", case)
    return {
        "hidden": normal(seed + 1, (t, h), std=1.0, dtype=dtype),
        "weight": normal(seed + 2, (v, h), std=w_std, dtype=dtype),
        "temperature": temperature,
    }


def _golden(name: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            w_std: float = 0.1, full_only: bool = False) -> Case:
    return Case(name, "golden", lambda: _inputs(name, t, h, v, dtype, temperature, w_std), full_only=full_only)


def golden_cases() -> list[Case]:
    """Realistic shapes, bf16 and fp16, several temperatures and logit spreads (flat to peaked)."""
    return [
        _golden("bf16_t16_h64_v1000", 16, 64, 1000, torch.bfloat16),
        _golden("fp16_t8_h128_v517_tau0.7", 8, 128, 517, torch.float16, 0.7),
        _golden("bf16_t33_h96_v2053_tau1.3_peaked", 33, 96, 2053, torch.bfloat16, 1.3, w_std=0.6),
        _golden("bf16_t5_h256_v2048_flat", 5, 256, 2048, torch.bfloat16, w_std=0.01),
        _golden("bf16_t64_h512_v32000", 64, 512, 32000, torch.bfloat16, full_only=True),
    ]


def _specials_hidden(name: str, dtype: torch.dtype) -> dict[str, Any]:
    """Rows 0-11: one special value each, planted in an ordinary row; rows 12-15 clean."""
    inputs = _inputs(name, 16, 32, 300, dtype)
    sv = special_values(dtype)
    h = inputs["hidden"].clone()
    for i in range(len(sv)):
        h[i, (5 * i) % h.shape[1]] = sv[i]
    inputs["hidden"] = h
    return inputs


def _special_weight(name: str) -> dict[str, Any]:
    """A +inf weight entry: that logit column is NaN, so every output is NaN (fp16)."""
    inputs = _inputs(name, 5, 32, 64, torch.float16)
    w = inputs["weight"].clone()
    w[7, 3] = float("inf")
    inputs["weight"] = w
    return inputs


def _outliers(name: str, factor: float, w_std: float = 0.1) -> dict[str, Any]:
    """LLM-like outlier channels in the hidden states (huge dynamic range: grid rounding, peaked rows)."""
    inputs = _inputs(name, 24, 256, 1031, torch.bfloat16, w_std=w_std)
    inputs["hidden"] = with_outlier_channels(inputs["hidden"], seed_of("token_entropy", name, "ch"), 4, factor)
    return inputs


def _zero_and_ties(name: str) -> dict[str, Any]:
    """All-zero hidden rows (every logit +0: H = log_c(V), the uniform entropy, with U = 0) and
    duplicated weight rows (max ties)."""
    inputs = _inputs(name, 6, 48, 129, torch.bfloat16, w_std=0.5)
    h = inputs["hidden"].clone()
    h[0].zero_()
    h[3].zero_()
    w = inputs["weight"].clone()
    w[100] = w[5]
    w[128] = w[5]
    inputs.update(hidden=h, weight=w)
    return inputs


def _tiny(name: str) -> dict[str, Any]:
    """Subnormal hidden rows times subnormal weight rows: logits underflow to +-0 or subnormals."""
    inputs = _inputs(name, 4, 16, 40, torch.bfloat16)
    h = inputs["hidden"].to(torch.float64)
    w = inputs["weight"].to(torch.float64)
    h[1] *= 2.0**-130
    h[2] *= 2.0**-60
    w[:10] *= 2.0**-128
    w[10:20] *= 2.0**-70
    inputs["hidden"] = h.to(torch.bfloat16)
    inputs["weight"] = w.to(torch.bfloat16)
    return inputs


def _bf16_ties(name: str) -> dict[str, Any]:
    """bf16 rounding-tie bit patterns on the grids: a 2**13 outlier with odd small values."""
    inputs = _inputs(name, 7, 64, 97, torch.bfloat16, w_std=0.002)
    h = inputs["hidden"].clone()
    h[:, 0] = 2.0**13
    h[:, 1:9] = from_bits([0x3F81, 0xBF83, 0x3E85, 0xBD87, 0x3C89, 0xBB8B, 0x3A8D, 0xB98F], torch.bfloat16)
    inputs["hidden"] = h
    return inputs


def _non_contiguous(name: str) -> dict[str, Any]:
    """hidden a transposed view, weight a strided view."""
    inputs = _inputs(name, 10, 40, 200, torch.float16)
    inputs["hidden"] = inputs["hidden"].t().contiguous().t()
    w = torch.zeros((200, 80), dtype=torch.float16)
    w[:, ::2] = inputs["weight"]
    inputs["weight"] = w[:, ::2]
    return inputs


def _ninf_logit(name: str) -> dict[str, Any]:
    """Logits that overflow to -inf (hidden 2**100 against weight -2**100 on one channel) while the
    row max stays finite: p = 0 and d = -inf there, so the zero-term rule decides (p * inf is NaN)."""
    inputs = _inputs(name, 3, 24, 70, torch.bfloat16)
    h = inputs["hidden"].clone()
    w = inputs["weight"].clone()
    h[0:2, 5] = 2.0**100
    w[3, 5] = -(2.0**100)
    w[9, 5] = -(2.0**100)
    inputs.update(hidden=h, weight=w)
    return inputs


def _tiny_temperature(name: str, temperature: float) -> dict[str, Any]:
    return _inputs(name, 4, 32, 50, torch.bfloat16, temperature)


def _confident(name: str) -> dict[str, Any]:
    """Peaked rows (one logit 12-30 above the rest): the entropy is tiny (1e-12 .. 1e-4), carried by
    the grid terms ``g`` of the small probabilities and by ``log_c(L)`` near 1."""
    inputs = _inputs(name, 8, 16, 300, torch.bfloat16, w_std=0.05)
    h = inputs["hidden"].clone()
    w = inputs["weight"].clone()
    h[:, 0] = torch.tensor([12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 30.0], dtype=torch.bfloat16)
    w[:, 0] = 0.0
    w[17, 0] = 1.0
    inputs.update(hidden=h, weight=w)
    return inputs


def _term_grid(name: str) -> dict[str, Any]:
    """V = 2, 64 rows whose off-max logit ``d`` ranges over (-30, -0.01): each ``g = p (-d)`` lands
    on the 2**-40 grid in a different regime, and for the peaked rows (L close to 1) the output
    shows the last bits of ``U``."""
    j = torch.arange(64, dtype=torch.float32)
    h = (-(0.01 + j * 0.47)).to(torch.bfloat16).view(-1, 1)  # row t: logits 0 and d_t
    w = torch.tensor([[0.0], [1.0]], dtype=torch.bfloat16)
    return {"hidden": h, "weight": w, "temperature": 1.0}


def _log_range(name: str) -> dict[str, Any]:
    """V = 2, 515 rows with logits 0 and -t/256 or -t/32: L over (1.37, 2] and (1, 2) with mean and
    log_c(L) of similar size, so both show in H's last bits (exp_c and log_c in their own ranges); and
    the three bf16 d in (-20, 0) where exp_c's coefficient E1 decides a bit of p (found by search)."""
    t = torch.arange(256, dtype=torch.float32)
    e1 = torch.tensor([-0.32421875, -0.349609375, -0.357421875])
    h = torch.cat([-t / 256, -t / 32, e1]).to(torch.bfloat16).view(-1, 1)
    return {"hidden": h, "weight": torch.tensor([[0.0], [1.0]], dtype=torch.bfloat16), "temperature": 1.0}


def _from_logprobs(make: Any) -> Any:
    """A designed token_logprobs v2 case without its targets (the same logits)."""
    def inputs() -> dict[str, Any]:
        d = dict(make())
        d.pop("targets", None)
        return d
    return inputs


def _subnormal_tie_scaled() -> dict[str, Any]:
    """token_logprobs' subnormal-tie logits ``2**-140 (1 + 2**-10 +- 2**-25)`` next to a logit 0, with
    temperature 2**-140: the division brings the subnormal logit's rounding (and a flush to zero) into
    H, which without it could never see a subnormal logit (d would be subnormal, p = 1)."""
    d = _tl._phase1_subnormal_tie()
    w = torch.cat([d["weight_shard"], torch.zeros((1, 3), dtype=torch.bfloat16)])
    return {"hidden": d["hidden"], "weight": w, "temperature": 2.0**-140}


def _single(name: str) -> dict[str, Any]:
    """V = 1: L = 1, U = 0, H = +0 for every finite row (and -0 logits)."""
    return {"hidden": from_bits([0x8001, 0x3F80, 0x0000], torch.bfloat16).reshape(3, 1),
            "weight": from_bits([0x0001], torch.bfloat16).reshape(1, 1), "temperature": 1.0}


def adversarial_cases() -> list[Case]:
    """Specials, outliers, zeros and ties, underflow, overflow by temperature, confident rows, the
    term grid, odd shapes."""

    def case(name: str, make: Any) -> Case:
        return Case(name, "adversarial", make)

    return [
        case("term_grid_v2", lambda: _term_grid("term_grid_v2")),
        case("log_range_v2", lambda: _log_range("log_range_v2")),
        case("wide_logits_v1025", _from_logprobs(_tl._wide_logits)),
        case("sum_beyond_2_53_v8194", _from_logprobs(_tl._sum_beyond_2_53)),
        case("subnormal_logit_tie_tau_2e-140", _subnormal_tie_scaled),
        case("confident_rows", lambda: _confident("confident_rows")),
        case("specials_in_hidden_bf16", lambda: _specials_hidden("specials_in_hidden_bf16", torch.bfloat16)),
        case("specials_in_hidden_fp16", lambda: _specials_hidden("specials_in_hidden_fp16", torch.float16)),
        case("inf_weight_row_fp16", lambda: _special_weight("inf_weight_row_fp16")),
        case("outlier_channels_1e3", lambda: _outliers("outlier_channels_1e3", 1000.0, 0.002)),
        case("outlier_channels_3e5", lambda: _outliers("outlier_channels_3e5", 3.0e5, 1e-5)),
        case("zero_rows_and_max_ties", lambda: _zero_and_ties("zero_rows_and_max_ties")),
        case("subnormal_underflow", lambda: _tiny("subnormal_underflow")),
        case("bf16_grid_ties", lambda: _bf16_ties("bf16_grid_ties")),
        case("temperature_1e-40_overflow", lambda: _tiny_temperature("temperature_1e-40_overflow", 1e-40)),
        case("temperature_3e38_subnormal", lambda: _tiny_temperature("temperature_3e38_subnormal", 3e38)),
        case("temperature_0.05", lambda: _tiny_temperature("temperature_0.05", 0.05)),
        case("logit_overflow_ninf", lambda: _ninf_logit("logit_overflow_ninf")),
        case("v1_single_token", lambda: _single("v1_single_token")),
        case("t3_h17_v129", lambda: _inputs("t3_h17_v129", 3, 17, 129, torch.float16)),
        case("t0_empty", lambda: _inputs("t0_empty", 0, 16, 33, torch.bfloat16)),
        case("non_contiguous", lambda: _non_contiguous("non_contiguous")),
    ]


# --- invariance cases -------------------------------------------------------------------------

def _inv_inputs(name: str) -> dict[str, Any]:
    return _inputs(name, 9, 96, 523, torch.bfloat16, 0.9, w_std=0.2)


def _check_batch(run: Runner) -> tuple[Any, Any]:
    """Row 4 alone vs the same row at position 3 of a batch of 7 (other rows different)."""
    a = _inv_inputs("inv_batch")
    alone = run("token_entropy", hidden=a["hidden"][4:5], weight=a["weight"], temperature=a["temperature"])
    other = _inputs("inv_batch_other", 7, 96, 523, torch.bfloat16, 0.9)
    h = other["hidden"].clone()
    h[3] = a["hidden"][4]
    batch = run("token_entropy", hidden=h, weight=a["weight"], temperature=a["temperature"])
    return alone, batch[3:4]


def _check_chunking(run: Runner) -> tuple[Any, Any]:
    """The whole sequence vs chunks of 4, 1 and 4 rows, concatenated."""
    a = _inv_inputs("inv_chunking")
    whole = run("token_entropy", **a)
    parts = [run("token_entropy", hidden=a["hidden"][s:e], weight=a["weight"], temperature=a["temperature"])
             for s, e in ((0, 4), (4, 5), (5, 9))]
    return whole, torch.cat(parts)


def _check_prefill_decode(run: Runner) -> tuple[Any, Any]:
    """A 6-row prefill then 3 single-row decode steps vs one call over all 9 rows."""
    a = _inv_inputs("inv_prefill_decode")
    whole = run("token_entropy", **a)
    parts = [run("token_entropy", hidden=a["hidden"][:6], weight=a["weight"], temperature=a["temperature"])]
    for t in range(6, 9):
        parts.append(run("token_entropy", hidden=a["hidden"][t:t + 1], weight=a["weight"],
                         temperature=a["temperature"]))
    return whole, torch.cat(parts)


def _check_permutation(run: Runner) -> tuple[Any, Any]:
    """Permuting the batch permutes the output."""
    a = _inv_inputs("inv_permutation")
    perm = torch.tensor([5, 2, 8, 0, 7, 1, 4, 6, 3])
    whole = run("token_entropy", **a)
    permuted = run("token_entropy", hidden=a["hidden"][perm], weight=a["weight"], temperature=a["temperature"])
    return whole[perm], permuted


def _check_vocab_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the vocabulary (rows of W) leaves every bit alone."""
    a = _inv_inputs("inv_vocab_order")
    v = a["weight"].shape[0]
    perm = torch.flip(torch.arange(v), (0,))
    perm = torch.cat([perm[1::2], perm[0::2]])
    whole = run("token_entropy", **a)
    permuted = run("token_entropy", hidden=a["hidden"], weight=a["weight"][perm], temperature=a["temperature"])
    return whole, permuted


def _check_hidden_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the hidden dimension (columns of h and W together) leaves every bit alone."""
    a = _inv_inputs("inv_hidden_order")
    perm = torch.flip(torch.arange(a["hidden"].shape[1]), (0,))
    whole = run("token_entropy", **a)
    permuted = run("token_entropy", hidden=a["hidden"][:, perm], weight=a["weight"][:, perm],
                   temperature=a["temperature"])
    return whole, permuted


def _check_repeat(run: Runner) -> tuple[Any, Any]:
    a = _inv_inputs("inv_repeat")
    return run("token_entropy", **a), run("token_entropy", **a)


def invariance_cases() -> list[InvarianceCase]:
    """One check per declared invariance (two for reduction order)."""
    return [
        InvarianceCase("batch_row_alone_vs_in_7", "batch", _check_batch),
        InvarianceCase("chunking_4_1_4", "chunking", _check_chunking),
        InvarianceCase("prefill6_decode3", "prefill_decode", _check_prefill_decode),
        InvarianceCase("permutation_batch", "permutation", _check_permutation),
        InvarianceCase("reduction_order_vocab", "reduction_order", _check_vocab_order),
        InvarianceCase("reduction_order_hidden", "reduction_order", _check_hidden_order),
        InvarianceCase("repeat", "repeat", _check_repeat),
    ]


# --- benchmarks -------------------------------------------------------------------------------

def _native(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The plain PyTorch computation the op replaces (verl's entropy_from_logits on fp32 logits)."""
    logits = F.linear(hidden, weight).float() / temperature
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(dim=-1)


def _bench(t: int, h: int, v: int, name: str, size: str) -> BenchCase:
    def make(device: torch.device) -> dict[str, Any]:
        # Timing inputs only (no golden bits depend on them): torch's RNG on the device is fine.
        g = torch.Generator(device=device).manual_seed(t)
        hidden = torch.randn((t, h), generator=g, device=device, dtype=torch.bfloat16)
        weight = torch.randn((v, h), generator=g, device=device, dtype=torch.bfloat16) * 0.02
        return {"hidden": hidden, "weight": weight, "temperature": 1.0}

    return BenchCase(f"{name}_t{t}", make, _native, flops=2.0 * t * v * h,
                     bytes=2.0 * v * h + 2.0 * t * h + 4.0 * t, sizes=(size,))


def bench_cases(full: bool = False) -> list[BenchCase]:
    """large: the Qwen3-8B LM head (hidden 4096, vocabulary 151936) at T = 1, 256, 2048; small: hidden
    1024 with the vocabulary cut to 8192, T = 16. flops = 2 T V H (the logits GEMM)."""
    large = [_bench(t, 4096, 151936, "qwen3_8b", "large") for t in (1, 256, 2048)]
    return large + [_bench(16, 1024, 8192, "h1024_v8192", "small")]
