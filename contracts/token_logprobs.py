"""Contract ``token_logprobs``: log-probability of the target token under the LM head.

``out_t = log_softmax(hidden_t @ weight.T / temperature)[targets_t]``, computed so that every
bit is defined: the logits are the exact digit matmul (P5), the max is exact (R5), the
normaliser is an exact fixed-point sum of contract exponentials (P4, P6) and the log is the
contract log. The module also defines the vocabulary-sharded (tensor-parallel) form,
``token_logprobs_partial`` and ``token_logprobs_finish``, whose combination over any number of
shards gives the bits of the unsharded op.

The algorithm (the definition; ``reference`` below executes it)
----------------------------------------------------------------
For hidden ``h`` [T, H] and weight ``W`` [V, H] (both bf16 or both fp16), targets ``y`` [T]
(int64 in [0, V)) and a temperature ``tau`` (a Python float, ``fp32(tau)`` > 0 and finite):

1. ``z_tj = linear(h, W, out_dtype=float32)_tj`` (contract ``linear`` v2: hidden rows on 28-bit
   grids, weight rows on 21-bit grids, exact int64 dot product ``C``, ``C * 2**(eh + ew - 47)``
   rounded once to fp32; NaN where row t of h or row j of W holds a non-finite value). H <= 2**16
   - 1. (Version 1 used 21-bit grids for both: hidden states with outlier channels lost ~10 bits.)
2. ``z_tj = z_tj / fp32(tau)`` (one IEEE fp32 division of two fp32 numbers).
3. ``m_t = max_j z_tj`` (R5: NaN propagates, a zero max is +0).
4. ``d_tj = z_tj - m_t``; ``p_tj = exp_c(d_tj)`` (P6).
5. ``L_t = fixed_sum_j(p_tj)`` on the absolute grid E = 0, F = 40 (P4): ``S_t = sum_j
   RNE(p_tj * 2**40)`` (exact int64; V <= 2**22 keeps it below 2**63) and
   ``L_t = ldexp_c(int_to_fp32(S_t), -40)``; NaN if any ``p_tj`` is NaN.
6. ``out_t = (z_{t, y_t} - m_t) - log_c(L_t)``, NaN-canonicalised.

Special values: ``out_t`` is NaN exactly when ``m_t`` is not finite (a NaN anywhere in the
row's logits, a +inf logit, or every logit -inf). Otherwise ``L_t`` is in [1, V] and
``out_t`` is finite or -inf (a -inf target logit). Logits overflow to +-inf only for extreme
inputs or a tiny temperature.

The sharded form (vocabulary split into contiguous shards, shard s holding rows
``[start_s, start_s + V_s)`` of W)
-------------------------------------------------------------------------------------------
* phase 1: ``token_logprobs_partial(h, W_s, y, start_s)`` returns the shard's ``max_j z_tj``
  (fp32 [T], R5). The global ``m_t`` is the R5 max over shards (an all-reduce MAX that
  propagates NaN; every local zero max is already +0). Exact in any order.
* phase 2: ``token_logprobs_partial(h, W_s, y, start_s, row_max=m)`` returns
  ``(sum_int, target_d)``: ``sum_int`` int64 [T] is the shard's part of ``S_t`` (step 5,
  computed with the global ``m``); ``target_d`` fp32 [T] is ``z_{t, y_t} - m_t`` on the shard
  that owns ``y_t`` and +0 on every other shard, except that where ``m_t`` is not finite the
  owner returns NaN (so the finish is NaN exactly where the unsharded op is).
* transport: all-reduce SUM of ``sum_int`` (int64, exact in any order); all-reduce SUM of
  ``target_d.view(torch.int32)`` (an integer sum: all shards but the owner contribute the
  bit pattern 0, so the sum *is* the owner's bit pattern, including -0 and NaN; a float sum
  would turn the owner's -0 into +0).
* ``token_logprobs_finish(sum_int, target_d) = target_d - log_c(ldexp_c(int_to_fp32(sum_int),
  -40))``, NaN-canonicalised: the bits of ``token_logprobs`` on the whole vocabulary.

Invariances: each output row depends only on its own hidden row, its target, the weight and
the temperature, so batch composition, chunking, prefill+decode, batch permutation and
repetition cannot change a bit; permuting the vocabulary (rows of W, targets remapped) or the
hidden dimension (columns of h and W) leaves the bits alone (exact sums); TP shards 1/2/4 give
the TP=1 bits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._contract import BenchCase, Case, Contract, InvarianceCase, Runner
from ._exact.digits import int_matmul, nonfinite_rows, row_exponent, to_grid
from ._exact.fixed import F_SUM, fixed_sum, fixed_sum_int
from ._exact.fp32 import canonicalize, int_to_float, int_to_fp32, ldexp_c, max_r5
from ._exact.transcendental import exp_c, log_c
from ._gen import from_bits, integers, normal, seed_of, special_values, with_outlier_channels
from .linear import long_k_rows

CONTRACT = Contract(
    name="token_logprobs",
    version=2,
    summary="out_t = (z_t[y_t] - max z_t) - log_c(fixed_sum(exp_c(z_t - max z_t))), z = linear_v2(h, W) / tau",
    invariances=("batch", "chunking", "prefill_decode", "permutation", "reduction_order", "tp_degree", "repeat"),
    dtypes={"hidden": (torch.bfloat16, torch.float16), "weight": (torch.bfloat16, torch.float16),
            "targets": (torch.int64,)},
    parameters={
        "hidden_grid_bits": "logits by linear v2: hidden rows on 28-bit grids RNE(h * 2**(27 - e)) (H_BITS = 27)",
        "head_grid_bits": "LM-head rows on 21-bit grids RNE(w * 2**(20 - e)) (W_BITS = 20)",
        "logits_grid_rounding": "placing a value on its row grid rounds to nearest, ties to even",
        "logits_row_exponent": "e = expo(max finite |v|) of each hidden and weight row (P1)",
        "logits_nonfinite": "a NaN or +-inf in hidden row t or weight row j makes z_tj NaN",
        "logits_product": "C = sum_k X Wt exactly in int64 (the scheme is free; generic: four and three balanced "
                          "base-128 digits and twelve fp32 digit GEMMs over K-chunks of <= 4096)",
        "logits_rounding": "z = C * 2**(e_h + e_w - 47) rounded once to fp32, to nearest, ties to even (P3')",
        "int_to_fp32": "the probability sum S -> fp32 in one rounding, to nearest, ties to even (P3; never "
                       "through float64)",
        "subnormal_logits": "logits in the subnormal range are kept (rounded once), not flushed to zero",
        "temperature": "z / fp32(tau): tau rounded once to fp32 (to nearest) and one IEEE division",
        "row_max": "m = R5 max of the logits: NaN propagates, a zero max is +0",
        "exp_c": "p = exp_c(RN32(z - m)): the contract exp (P6; coefficients pinned by the softmax contract)",
        "sum_grid": "L = sum_j RNE(p * 2**40) on the absolute grid 2**-40 (E = 0, F = 40), rounded once",
        "sum_rounding": "each p is placed on the grid to nearest, ties to even",
        "log_c": "log_c(L): the contract log (P6; coefficients pinned by the log_softmax contract)",
        "output_rounding": "out = RN32(RN32(z_y - m) - log_c(L)): two subtractions, in that order",
        "shard_rules": "phase 2: target_d = +0 on non-owner shards; NaN on the owner where m is not finite; "
                       "sum_int = 0 where m is not finite",
    },
)

#: Largest vocabulary: V * 2**40 < 2**63 (P4 absolute grid, F = 40).
MAX_VOCAB = 1 << 22
#: Grid magnitude bits of hidden rows (28-bit grid) and LM-head rows (21-bit grid), as linear v2.
H_BITS, W_BITS = 27, 20
#: Largest hidden size: |C| <= H * 2**47 < 2**63.
MAX_HIDDEN = (1 << 16) - 1


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """Steps 1-2: fp32 [T, V] logits ``linear_v2(h, W) / fp32(tau)``."""
    eh, ew = row_exponent(hidden), row_exponent(weight)
    c = int_matmul(to_grid(hidden, eh, H_BITS), to_grid(weight, ew, W_BITS))
    z = int_to_float(c, eh.unsqueeze(1) + ew.unsqueeze(0) - H_BITS - W_BITS, torch.float32)
    bad = nonfinite_rows(hidden).unsqueeze(1) | nonfinite_rows(weight).unsqueeze(0)
    z = torch.where(bad, torch.full_like(z, float("nan")), z)
    tau = torch.tensor(temperature, dtype=torch.float32)  # fp32(tau): one RNE rounding
    return z / tau


def reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
              temperature: float = 1.0) -> torch.Tensor:
    """Token log-probabilities: ``out_t = log_softmax(h_t W^T / tau)[y_t]``, bitwise defined.

    Parameters
    ----------
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight : Tensor, same dtype, [V, H] (the LM head, ``nn.Linear`` layout), V <= 2**22
    targets : Tensor, int64, [T], values in [0, V)
    temperature : float
        ``fp32(temperature)`` must be > 0 and finite.

    Returns
    -------
    Tensor, float32, [T]

    Bitwise semantics
    -----------------
    Steps 1-6 of the module docstring: digit-matmul logits, one IEEE division by
    ``fp32(tau)``, R5 row max, ``exp_c`` of the shifted logits, their exact sum on the grid
    2**-40, ``log_c`` of it. NaN (canonical) exactly where the row max is not finite.
    Contract ``token_logprobs`` version 2.
    """
    z = _logits(hidden, weight, temperature)
    m = max_r5(z, dim=-1)
    p = exp_c(z - m.unsqueeze(-1))
    grid = torch.zeros(m.shape, dtype=torch.int64)
    total = fixed_sum(p, dim=-1, e=grid, frac_bits=F_SUM, op="token_logprobs")
    z_target = z.gather(1, targets.view(-1, 1)).view(-1)
    return canonicalize((z_target - m) - log_c(total))


def reference_partial(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor, vocab_start: int,
                      temperature: float = 1.0, row_max: torch.Tensor | None = None) -> Any:
    """One vocabulary shard's part of ``token_logprobs`` (tensor parallelism).

    Parameters
    ----------
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight_shard : Tensor, same dtype, [Vs, H]: rows ``vocab_start .. vocab_start + Vs - 1``
        of the full weight.
    targets : Tensor, int64, [T]: global token ids.
    vocab_start : int
        Global id of the shard's first row.
    temperature : float
    row_max : Tensor, float32, [T], optional
        The global row max (R5 max over all shards of phase 1's outputs).

    Returns
    -------
    Tensor, float32, [T]
        Without ``row_max`` (phase 1): the shard's row max ``max_j z_tj`` (R5).
    tuple of (Tensor int64 [T], Tensor float32 [T])
        With ``row_max`` (phase 2): ``(sum_int, target_d)``: the shard's exact integer part of
        ``sum_j RNE(exp_c(z_tj - m_t) * 2**40)`` (0 where ``m_t`` is not finite), and
        ``z_{t,y_t} - m_t`` if the shard owns ``y_t`` (NaN there if ``m_t`` is not finite),
        else +0.

    Bitwise semantics
    -----------------
    See the module docstring: all-reduce SUM ``sum_int`` as int64 and ``target_d`` through its
    int32 bit pattern, then :func:`reference_finish`. Contract ``token_logprobs`` version 2.
    """
    z = _logits(hidden, weight_shard, temperature)
    if row_max is None:
        return canonicalize(max_r5(z, dim=-1))
    m = row_max.to(torch.float32)
    finite = torch.isfinite(m)
    m_safe = torch.where(finite, m, torch.zeros_like(m))
    if bool((finite.unsqueeze(-1) & ~(z <= m_safe.unsqueeze(-1))).any()):
        raise ValueError("token_logprobs_partial: row_max is below a logit of this shard (or a logit is NaN "
                         "while row_max is finite); pass the R5 max over all shards of phase 1")
    p = exp_c(z - m_safe.unsqueeze(-1))
    grid = torch.zeros(m.shape, dtype=torch.int64)
    sum_int = fixed_sum_int(p, grid, dim=-1, frac_bits=F_SUM)
    sum_int = torch.where(finite, sum_int, torch.zeros_like(sum_int))
    local = targets - vocab_start
    owner = (local >= 0) & (local < weight_shard.shape[0])
    z_target = z.gather(1, local.clamp(0, max(weight_shard.shape[0] - 1, 0)).view(-1, 1)).view(-1)
    target_d = torch.where(finite, z_target - m, torch.full_like(m, float("nan")))
    target_d = torch.where(owner, target_d, torch.zeros_like(target_d))
    return sum_int, canonicalize(target_d)


def reference_finish(sum_int: torch.Tensor, target_d: torch.Tensor) -> torch.Tensor:
    """Combine the all-reduced shard partials: ``target_d - log_c(ldexp_c(int_to_fp32(sum_int), -40))``.

    Parameters
    ----------
    sum_int : Tensor, int64, [T]: the SUM over shards of phase 2's ``sum_int``.
    target_d : Tensor, float32, [T]: the owner's ``target_d`` (int32 SUM of bit patterns).

    Returns
    -------
    Tensor, float32, [T]: the bits of ``token_logprobs`` on the whole vocabulary.

    Bitwise semantics
    -----------------
    One ``int_to_fp32`` (P3), one ``ldexp_c`` (P2), ``log_c`` (P6), one fp32 subtraction,
    NaN-canonicalised. Contract ``token_logprobs`` version 2.
    """
    total = ldexp_c(int_to_fp32(sum_int), torch.full_like(sum_int, -F_SUM))
    return canonicalize(target_d - log_c(total))


REFERENCES = {
    "token_logprobs": reference,
    "token_logprobs_partial": reference_partial,
    "token_logprobs_finish": reference_finish,
}


# --- simulated tensor parallelism (used by invariance cases and tests) -----------------------

def shard_bounds(vocab: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` vocabulary shards, as even as possible (first ones larger)."""
    base, extra = divmod(vocab, shards)
    bounds, start = [], 0
    for s in range(shards):
        stop = start + base + (1 if s < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def max_over_shards(maxes: list[torch.Tensor]) -> torch.Tensor:
    """R5 max of per-shard row maxima (the all-reduce MAX): NaN propagates, zero is +0."""
    return max_r5(torch.stack(maxes), dim=0)


def sum_bits_over_shards(parts: list[torch.Tensor]) -> torch.Tensor:
    """All-reduce SUM of fp32 ``target_d`` through its int32 bit pattern (exact transport)."""
    bits = torch.stack([p.contiguous().view(torch.int32) for p in parts]).sum(dim=0, dtype=torch.int32)
    return bits.view(torch.float32)


def sharded(run: Runner, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float,
            shards: int) -> torch.Tensor:
    """``token_logprobs`` through ``shards`` vocabulary shards: phase 1, MAX, phase 2, SUMs, finish."""
    bounds = shard_bounds(weight.shape[0], shards)
    maxes = [run("token_logprobs_partial", hidden=hidden, weight_shard=weight[a:b], targets=targets,
                 vocab_start=a, temperature=temperature) for a, b in bounds]
    m = max_over_shards(maxes)
    sums, tds = [], []
    for a, b in bounds:
        s, td = run("token_logprobs_partial", hidden=hidden, weight_shard=weight[a:b], targets=targets,
                    vocab_start=a, temperature=temperature, row_max=m)
        sums.append(s)
        tds.append(td)
    total = torch.stack(sums).sum(dim=0)
    return run("token_logprobs_finish", sum_int=total, target_d=sum_bits_over_shards(tds))


# --- conformance cases ------------------------------------------------------------------------

def _inputs(case: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            w_std: float = 0.05) -> dict[str, Any]:
    seed = seed_of("token_logprobs", case)
    return {
        "hidden": normal(seed + 1, (t, h), std=1.0, dtype=dtype),
        "weight": normal(seed + 2, (v, h), std=w_std, dtype=dtype),
        "targets": integers(seed + 3, (t,), 0, v),
        "temperature": temperature,
    }


def _golden(name: str, t: int, h: int, v: int, dtype: torch.dtype, temperature: float = 1.0,
            full_only: bool = False) -> Case:
    return Case(name, "golden", lambda: _inputs(name, t, h, v, dtype, temperature), full_only=full_only)


def _partial_inputs(name: str, phase: int) -> dict[str, Any]:
    base = _inputs(name, 12, 96, 700, torch.bfloat16, 0.8)
    full_z = _logits(base["hidden"], base["weight"], 0.8)
    inputs = {"hidden": base["hidden"], "weight_shard": base["weight"][250:520], "targets": base["targets"],
              "vocab_start": 250, "temperature": 0.8}
    if phase == 2:
        inputs["row_max"] = max_r5(full_z, dim=-1)
    return inputs


def _finish_inputs(name: str) -> dict[str, Any]:
    seed = seed_of("token_logprobs", name)
    t = 9
    sum_int = integers(seed, (t,), 1 << 40, 700 << 40)
    sum_int[0] = 1 << 40  # L = 1 exactly: log_c = +0
    sum_int[1] = (1 << 62) + 12345  # largest magnitudes, P3 rounding
    target_d = -normal(seed + 1, (t,), std=4.0, dtype=torch.float32).abs()
    target_d[2] = -0.0
    target_d[3] = float("-inf")
    target_d[4] = float("nan")
    target_d[5] = 0.0
    return {"sum_int": sum_int, "target_d": target_d}


def golden_cases() -> list[Case]:
    """Realistic shapes, bf16 and fp16, several temperatures; the sharded ops on one shard."""
    return [
        _golden("bf16_t16_h64_v1000", 16, 64, 1000, torch.bfloat16),
        _golden("fp16_t8_h128_v517_tau0.7", 8, 128, 517, torch.float16, 0.7),
        _golden("bf16_t33_h256_v4099_tau1.3", 33, 256, 4099, torch.bfloat16, 1.3),
        _golden("bf16_t1_h512_v2048", 1, 512, 2048, torch.bfloat16),
        _golden("bf16_t64_h512_v32000", 64, 512, 32000, torch.bfloat16, full_only=True),
        Case("partial_phase1_bf16", "golden", lambda: _partial_inputs("partial_phase1_bf16", 1),
             op="token_logprobs_partial"),
        Case("partial_phase2_bf16", "golden", lambda: _partial_inputs("partial_phase2_bf16", 2),
             op="token_logprobs_partial"),
        Case("finish", "golden", lambda: _finish_inputs("finish"), op="token_logprobs_finish"),
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
    """A +inf weight row: that logit column is NaN, so every row max and every output is NaN (fp16)."""
    inputs = _inputs(name, 5, 32, 64, torch.float16)
    w = inputs["weight"].clone()
    w[7, 3] = float("inf")
    inputs["weight"] = w
    return inputs


def _outliers(name: str, factor: float) -> dict[str, Any]:
    """LLM-like outlier channels in the hidden states (huge dynamic range: grid rounding, ties)."""
    inputs = _inputs(name, 24, 256, 1031, torch.bfloat16)
    inputs["hidden"] = with_outlier_channels(inputs["hidden"], seed_of("token_logprobs", name, "ch"), 4, factor)
    return inputs


def _zero_and_ties(name: str) -> dict[str, Any]:
    """All-zero hidden rows (every logit +0: out = -log_c(V)), duplicated weight rows (max ties),
    and targets at 0 and V - 1."""
    inputs = _inputs(name, 6, 48, 129, torch.bfloat16)
    h = inputs["hidden"].clone()
    h[0].zero_()
    h[3].zero_()
    w = inputs["weight"].clone()
    w[100] = w[5]
    w[128] = w[5]
    y = inputs["targets"].clone()
    y[0], y[1], y[2] = 0, 128, 100
    inputs.update(hidden=h, weight=w, targets=y)
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
    """bf16 rounding-tie bit patterns on the 21-bit grid: a 2**13 outlier with odd small values."""
    inputs = _inputs(name, 7, 64, 97, torch.bfloat16)
    h = inputs["hidden"].clone()
    h[:, 0] = 2.0**13
    h[:, 1:9] = from_bits([0x3F81, 0xBF83, 0x3E85, 0xBD87, 0x3C89, 0xBB8B, 0x3A8D, 0xB98F], torch.bfloat16)
    inputs["hidden"] = h
    return inputs


def _non_contiguous(name: str) -> dict[str, Any]:
    """hidden a transposed view, weight a strided view, targets a strided view."""
    inputs = _inputs(name, 10, 40, 200, torch.float16)
    inputs["hidden"] = inputs["hidden"].t().contiguous().t()
    w = torch.zeros((200, 80), dtype=torch.float16)
    w[:, ::2] = inputs["weight"]
    inputs["weight"] = w[:, ::2]
    y = torch.zeros(20, dtype=torch.int64)
    y[::2] = inputs["targets"]
    inputs["targets"] = y[::2]
    return inputs


def _ninf_logit(name: str) -> dict[str, Any]:
    """A logit that overflows to -inf (hidden 2**100 against weight -2**100 on one channel) while
    the row max stays finite; row 0 targets it (out = -inf), row 1 targets another column."""
    inputs = _inputs(name, 3, 24, 70, torch.bfloat16)
    h = inputs["hidden"].clone()
    w = inputs["weight"].clone()
    h[0:2, 5] = 2.0**100
    w[3, 5] = -(2.0**100)
    y = inputs["targets"].clone()
    y[0] = 3
    y[1] = 4
    inputs.update(hidden=h, weight=w, targets=y)
    return inputs


def _tiny_temperature(name: str, temperature: float) -> dict[str, Any]:
    return _inputs(name, 6, 32, 50, torch.bfloat16, temperature)


def _exact_logits(h: list[float], w: list[float], targets: list[int], width: int = 1) -> dict[str, Any]:
    """hidden [T, width] and weight [V, width] in bf16, zero beyond column 0 (the values must be bf16):
    logit z_tj = h_t * w_j exactly."""
    hidden = torch.zeros((len(h), width), dtype=torch.float64)
    weight = torch.zeros((len(w), width), dtype=torch.float64)
    hidden[:, 0] = torch.tensor(h, dtype=torch.float64)
    weight[:, 0] = torch.tensor(w, dtype=torch.float64)
    return {"hidden": hidden.to(torch.bfloat16), "weight": weight.to(torch.bfloat16),
            "targets": torch.tensor(targets, dtype=torch.int64), "temperature": 1.0}


def _many_small_terms() -> dict[str, Any]:
    """Per row one logit 0 (the target) and 2**17 logits -h_t, h_t = 26, 27, 27.875, 28.125:
    p = exp_c(-h_t) = 5.6, 2.1, 0.86 and 0.67 times 2**-40, each 2**17 times.

    L = 1 + 2**17 * RNE(p * 2**40) * 2**-40 = 1 + RNE(p * 2**40) * 2**-23 is exact, so
    out = -log_c(L) shows how p was placed on the grid: a grid one bit coarser or finer, or another
    rounding, changes L. (H = 8: beyond the Triton interpreter's work limit, which skips it.)
    """
    return _exact_logits([26.0, 27.0, 27.875, 28.125], [0.0] + [-1.0] * (1 << 17), [0] * 4, width=8)


def _wide_logits() -> dict[str, Any]:
    """Logits 0 and every bf16 value in [-32, -1/8] (row 0), and -1/2 times them (row 1): p = exp_c(d)
    covers 1 down to 2**-46, so RNE(p * 2**40) meets every grid regime, ties included."""
    vals = [0.0] + [-(1 + i / 128) * 2.0**e for e in range(-3, 5) for i in range(128)]
    return _exact_logits([1.0, -0.5], vals, [0, len(vals) - 1])


def _partial_wide_logits() -> dict[str, Any]:
    d = _wide_logits()
    m = max_r5(_logits(d["hidden"], d["weight"], 1.0), dim=-1)
    return {"hidden": d["hidden"], "weight_shard": d["weight"][1:], "targets": d["targets"], "vocab_start": 1,
            "temperature": 1.0, "row_max": m}


def _finish_log_range() -> dict[str, Any]:
    """256 sums L in [1, 1.41] (log_c's own range, where its polynomial shows in every bit) and
    256 in [2**9, 2**9 * 1.41]."""
    j = torch.arange(256, dtype=torch.int64)
    near_one = (1 << 40) + j * (((1 << 40) * 53) // (128 * 256)) + j % 7
    sum_int = torch.cat([near_one, near_one << 9])
    return {"sum_int": sum_int, "target_d": torch.zeros(512, dtype=torch.float32)}


def _phase1_long(k: int) -> dict[str, Any]:
    """One hidden row and one weight row of K = 8192 or 16384 whose exact logit needs the last unit
    of C (see ``linear.long_k_rows``); phase 1 returns that logit."""
    d = long_k_rows(k)
    return {"hidden": d["x"], "weight_shard": d["weight"], "targets": torch.zeros(1, dtype=torch.int64),
            "vocab_start": 0, "temperature": 1.0}


def _phase1_tiny() -> dict[str, Any]:
    """Hidden and weight rows near 2**-70: every logit is an fp32 subnormal, and so is the row max."""
    inputs = _inputs("partial_phase1_subnormal_logits", 3, 16, 20, torch.bfloat16)
    h = (inputs["hidden"].to(torch.float64) * 2.0**-70).to(torch.bfloat16)
    w = (inputs["weight"].to(torch.float64) * 2.0**-66).to(torch.bfloat16)
    return {"hidden": h, "weight_shard": w, "targets": inputs["targets"], "vocab_start": 0, "temperature": 1.0}


def _phase1_subnormal_tie() -> dict[str, Any]:
    """Logits ``2**-140 (1 + 2**-10 +- 2**-25)``: in the fp32 subnormal range (quantum 2**-149) the
    exact value is just off a tie, which one rounding decides; rounding to 24 bits first drops the
    ``2**-25`` and leaves the tie (P3' against P3 + P2)."""
    bf = torch.bfloat16
    h = torch.tensor([[2.0**-70, 2.0**-80, 2.0**-95], [2.0**-70, 2.0**-80, -(2.0**-95)]], dtype=bf)
    w = torch.tensor([[2.0**-70] * 3], dtype=bf)
    return {"hidden": h, "weight_shard": w, "targets": torch.zeros(2, dtype=torch.int64), "vocab_start": 0,
            "temperature": 1.0}


def _sum_tie() -> dict[str, Any]:
    """V = 2: logits 0 and -1.8984375 (bf16), so ``S = 2**40 + RNE(exp_c(d) 2**40)`` lies exactly half-way
    between two fp32 values, the lower one even: the conversion of S (P3) rounds it down (found by
    search over bf16 d)."""
    bf = torch.bfloat16
    return {"hidden": torch.ones((1, 1), dtype=bf), "weight": torch.tensor([[0.0], [-1.8984375]], dtype=bf),
            "targets": torch.tensor([0])}  # out = -log_c(L) shows L's last bit


def _sum_beyond_2_53() -> dict[str, Any]:
    """V = 8194: 8192 logits 0 (p = 1) and two tuned logits, so ``S = 2**53 + 2**29 + 1``. Through
    float64 the sum loses its last bit (a tie, to even) and then lands on an fp32 tie; rounded once
    (P3) it rounds up. Logits ``w1 + w2 2**-8 + w3 2**-16`` from bf16 rows (found by search)."""
    bf = torch.bfloat16
    w = torch.zeros((8194, 3), dtype=bf)
    w[8192] = torch.tensor([-7.625, 0.0625, 1.0], dtype=bf)  # RNE(exp_c(z) 2**40) = 2**29 - 65279
    w[8193] = torch.tensor([-16.625, -3.6875, -2.125], dtype=bf)  # ... = 65280
    h = torch.tensor([[1.0, 2.0**-8, 2.0**-16]], dtype=bf)
    return {"hidden": h, "weight": w, "targets": torch.tensor([0])}  # out = -log_c(L) shows L's last bit


def _phase1_nan_logit() -> dict[str, Any]:
    """A +inf weight entry makes one logit column NaN among finite ones: the row max is NaN (R5)."""
    inputs = _inputs("partial_phase1_nan_logit", 4, 16, 30, torch.bfloat16)
    w = inputs["weight"].clone()
    w[7, 2] = float("inf")
    return {"hidden": inputs["hidden"], "weight_shard": w, "targets": inputs["targets"], "vocab_start": 0,
            "temperature": 1.0}


def _negative_zero_logit() -> dict[str, Any]:
    """V = 1 and the logit -0 (the product of two subnormals underflows): the max is +0, so
    out = (-0 - +0) - log_c(1) = -0."""
    return {"hidden": from_bits([0x8001], torch.bfloat16).reshape(1, 1),
            "weight": from_bits([0x0001], torch.bfloat16).reshape(1, 1),
            "targets": torch.zeros(1, dtype=torch.int64), "temperature": 1.0}


def adversarial_cases() -> list[Case]:
    """Specials, outliers, zeros and ties, underflow, overflow by temperature, odd shapes; first the
    designed ones that pin a single parameter (grid width and rounding, long reductions, double
    rounding, subnormal logits, R5 max rules, log_c's own range)."""

    def case(name: str, make: Any, op: str | None = None) -> Case:
        return Case(name, "adversarial", make, op=op)

    return [
        case("many_small_terms_v131073", _many_small_terms),
        case("wide_logits_v1025", _wide_logits),
        case("partial_phase2_wide_logits", _partial_wide_logits, op="token_logprobs_partial"),
        case("finish_log_range", _finish_log_range, op="token_logprobs_finish"),
        case("partial_phase1_long_h8192", lambda: _phase1_long(8192), op="token_logprobs_partial"),
        case("partial_phase1_long_h16384", lambda: _phase1_long(16384), op="token_logprobs_partial"),
        case("partial_phase1_subnormal_logits", _phase1_tiny, op="token_logprobs_partial"),
        case("partial_phase1_subnormal_tie", _phase1_subnormal_tie, op="token_logprobs_partial"),
        case("sum_tie_v2", _sum_tie),
        case("sum_beyond_2_53_v8194", _sum_beyond_2_53),
        case("partial_phase1_nan_logit", _phase1_nan_logit, op="token_logprobs_partial"),
        case("t1_v1_negative_zero_logit", _negative_zero_logit),
        case("specials_in_hidden_bf16", lambda: _specials_hidden("specials_in_hidden_bf16", torch.bfloat16)),
        case("specials_in_hidden_fp16", lambda: _specials_hidden("specials_in_hidden_fp16", torch.float16)),
        case("inf_weight_row_fp16", lambda: _special_weight("inf_weight_row_fp16")),
        case("outlier_channels_1e3", lambda: _outliers("outlier_channels_1e3", 1000.0)),
        case("outlier_channels_3e5", lambda: _outliers("outlier_channels_3e5", 3.0e5)),
        case("zero_rows_and_max_ties", lambda: _zero_and_ties("zero_rows_and_max_ties")),
        case("subnormal_underflow", lambda: _tiny("subnormal_underflow")),
        case("bf16_grid_ties", lambda: _bf16_ties("bf16_grid_ties")),
        case("temperature_1e-40_overflow", lambda: _tiny_temperature("temperature_1e-40_overflow", 1e-40)),
        case("temperature_3e38_subnormal", lambda: _tiny_temperature("temperature_3e38_subnormal", 3e38)),
        case("logit_overflow_ninf", lambda: _ninf_logit("logit_overflow_ninf")),
        case("temperature_1e-3", lambda: _tiny_temperature("temperature_1e-3", 1e-3)),
        case("t1_v1", lambda: _inputs("t1_v1", 1, 8, 1, torch.bfloat16)),
        case("t3_h17_v129", lambda: _inputs("t3_h17_v129", 3, 17, 129, torch.float16)),
        case("t0_empty", lambda: _inputs("t0_empty", 0, 16, 33, torch.bfloat16)),
        case("non_contiguous", lambda: _non_contiguous("non_contiguous")),
        case("partial_phase2_nan_and_inf_max", lambda: _partial_specials("partial_phase2_nan_and_inf_max"),
             op="token_logprobs_partial"),
    ]


def _partial_specials(name: str) -> dict[str, Any]:
    """Phase 2 with row maxima NaN, +inf and -inf (non-owner and owner rows)."""
    inputs = _inputs(name, 6, 32, 90, torch.bfloat16)
    z = _logits(inputs["hidden"], inputs["weight"], 1.0)
    m = max_r5(z, dim=-1)
    m[0] = float("nan")
    m[1] = float("inf")
    m[2] = float("-inf")
    y = inputs["targets"].clone()
    y[0], y[1], y[2], y[3] = 40, 41, 5, 70
    return {"hidden": inputs["hidden"], "weight_shard": inputs["weight"][30:60], "targets": y,
            "vocab_start": 30, "temperature": 1.0, "row_max": m}


# --- invariance cases -------------------------------------------------------------------------

def _inv_inputs(name: str) -> dict[str, Any]:
    return _inputs(name, 9, 96, 523, torch.bfloat16, 0.9)


def _check_batch(run: Runner) -> tuple[Any, Any]:
    """Row 4 alone vs the same row at position 3 of a batch of 7 (other rows different)."""
    a = _inv_inputs("inv_batch")
    row = {"hidden": a["hidden"][4:5], "targets": a["targets"][4:5]}
    alone = run("token_logprobs", weight=a["weight"], temperature=a["temperature"], **row)
    other = _inputs("inv_batch_other", 7, 96, 523, torch.bfloat16, 0.9)
    h = other["hidden"].clone()
    y = other["targets"].clone()
    h[3] = a["hidden"][4]
    y[3] = a["targets"][4]
    batch = run("token_logprobs", hidden=h, weight=a["weight"], targets=y, temperature=a["temperature"])
    return alone, batch[3:4]


def _check_chunking(run: Runner) -> tuple[Any, Any]:
    """The whole sequence vs chunks of 4, 1 and 4 rows, concatenated."""
    a = _inv_inputs("inv_chunking")
    whole = run("token_logprobs", **a)
    parts = [run("token_logprobs", hidden=a["hidden"][s:e], weight=a["weight"], targets=a["targets"][s:e],
                 temperature=a["temperature"]) for s, e in ((0, 4), (4, 5), (5, 9))]
    return whole, torch.cat(parts)


def _check_prefill_decode(run: Runner) -> tuple[Any, Any]:
    """A 6-row prefill then 3 single-row decode steps vs one call over all 9 rows."""
    a = _inv_inputs("inv_prefill_decode")
    whole = run("token_logprobs", **a)
    parts = [run("token_logprobs", hidden=a["hidden"][:6], weight=a["weight"], targets=a["targets"][:6],
                 temperature=a["temperature"])]
    for t in range(6, 9):
        parts.append(run("token_logprobs", hidden=a["hidden"][t:t + 1], weight=a["weight"],
                         targets=a["targets"][t:t + 1], temperature=a["temperature"]))
    return whole, torch.cat(parts)


def _check_permutation(run: Runner) -> tuple[Any, Any]:
    """Permuting the batch permutes the output."""
    a = _inv_inputs("inv_permutation")
    perm = torch.tensor([5, 2, 8, 0, 7, 1, 4, 6, 3])
    whole = run("token_logprobs", **a)
    permuted = run("token_logprobs", hidden=a["hidden"][perm], weight=a["weight"], targets=a["targets"][perm],
                   temperature=a["temperature"])
    return whole[perm], permuted


def _check_vocab_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the vocabulary (rows of W, targets remapped) leaves every bit alone."""
    a = _inv_inputs("inv_vocab_order")
    v = a["weight"].shape[0]
    perm = torch.flip(torch.arange(v), (0,))
    perm = torch.cat([perm[1::2], perm[0::2]])  # reversed, then interleaved
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(v)
    whole = run("token_logprobs", **a)
    permuted = run("token_logprobs", hidden=a["hidden"], weight=a["weight"][perm], targets=inverse[a["targets"]],
                   temperature=a["temperature"])
    return whole, permuted


def _check_hidden_order(run: Runner) -> tuple[Any, Any]:
    """Permuting the hidden dimension (columns of h and W together) leaves every bit alone."""
    a = _inv_inputs("inv_hidden_order")
    perm = torch.flip(torch.arange(a["hidden"].shape[1]), (0,))
    whole = run("token_logprobs", **a)
    permuted = run("token_logprobs", hidden=a["hidden"][:, perm], weight=a["weight"][:, perm],
                   targets=a["targets"], temperature=a["temperature"])
    return whole, permuted


def _check_tp(shards: int, run: Runner) -> tuple[Any, Any]:
    """TP=1 vs ``shards`` vocabulary shards (partial phases, exact all-reduces, finish)."""
    a = _inv_inputs(f"inv_tp{shards}")
    h = a["hidden"].clone()
    h[2, 7] = float("nan")  # a NaN row travels through the shards too
    a["hidden"] = h
    whole = run("token_logprobs", **a)
    return whole, sharded(run, a["hidden"], a["weight"], a["targets"], a["temperature"], shards)


def _check_repeat(run: Runner) -> tuple[Any, Any]:
    a = _inv_inputs("inv_repeat")
    return run("token_logprobs", **a), run("token_logprobs", **a)


def invariance_cases() -> list[InvarianceCase]:
    """One check per declared invariance (two for reduction order, two TP degrees)."""
    return [
        InvarianceCase("batch_row_alone_vs_in_7", "batch", _check_batch),
        InvarianceCase("chunking_4_1_4", "chunking", _check_chunking),
        InvarianceCase("prefill6_decode3", "prefill_decode", _check_prefill_decode),
        InvarianceCase("permutation_batch", "permutation", _check_permutation),
        InvarianceCase("reduction_order_vocab", "reduction_order", _check_vocab_order),
        InvarianceCase("reduction_order_hidden", "reduction_order", _check_hidden_order),
        InvarianceCase("tp2_vocab_shards", "tp_degree", lambda run: _check_tp(2, run)),
        InvarianceCase("tp4_vocab_shards", "tp_degree", lambda run: _check_tp(4, run)),
        InvarianceCase("repeat", "repeat", _check_repeat),
    ]


# --- benchmarks -------------------------------------------------------------------------------

#: Qwen3-8B LM head: hidden 4096, vocabulary 151936.
_QWEN3_8B = {"hidden": 4096, "vocab": 151936}


def _native(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
            temperature: float = 1.0) -> torch.Tensor:
    """The plain PyTorch computation the op replaces."""
    logits = F.linear(hidden, weight).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.view(-1, 1)).view(-1)


def _bench(t: int, h: int = _QWEN3_8B["hidden"], v: int = _QWEN3_8B["vocab"], name: str = "qwen3_8b",
           size: str = "large") -> BenchCase:
    def make(device: torch.device) -> dict[str, Any]:
        # Timing inputs only (no golden bits depend on them): torch's RNG on the device is fine.
        g = torch.Generator(device=device).manual_seed(t)
        hidden = torch.randn((t, h), generator=g, device=device, dtype=torch.bfloat16)
        weight = torch.randn((v, h), generator=g, device=device, dtype=torch.bfloat16) * 0.02
        targets = torch.randint(0, v, (t,), generator=g, device=device)
        return {"hidden": hidden, "weight": weight, "targets": targets, "temperature": 1.0}

    return BenchCase(f"{name}_t{t}", make, _native, flops=2.0 * t * v * h,
                     bytes=2.0 * v * h + 2.0 * t * h + 8.0 * t + 4.0 * t, sizes=(size,),
                     graph=t <= 64)


def bench_cases(full: bool = False) -> list[BenchCase]:
    """large: the Qwen3-8B LM head at T = 1, 64, 256, 2048 (``full=True`` adds T = 8192). small: hidden
    1024 (Qwen3-0.6B) with the vocabulary cut to 8192 (one CPU call takes ~0.25 s), T = 1, 16.

    bytes = weight (bf16) + hidden (bf16) + targets (int64) + output (fp32);
    flops = 2 T V H (the logits GEMM).
    """
    large = [_bench(t) for t in ((1, 64, 256, 2048, 8192) if full else (1, 64, 256, 2048))]
    return large + [_bench(t, h=1024, v=8192, name="h1024_v8192", size="small") for t in (1, 16)]
