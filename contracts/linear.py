"""Contract ``linear``: ``y = x @ weight.T (+ bias)`` by the exact digit matmul (docs/numerics.md P5, R4).

The module also defines the three tensor-parallel sub-ops that split ``linear`` over shards
of K (row-parallel TP): ``linear_exponents``, ``linear_partial`` and ``linear_finish``
(:data:`REFERENCES`). Row-parallel TP is

1. ``ex_r, ew_r = linear_exponents(x_r, w_r)`` on each shard r (its slice of K);
2. ``ex, ew = all_reduce MAX`` of ``ex_r, ew_r`` (the global row exponents);
3. ``acc_r = linear_partial(x_r, w_r, ex, ew)`` (exact int64 partial sums on the global grid);
4. ``acc = all_reduce SUM`` of ``acc_r`` (exact in int64, in any order);
5. ``y = linear_finish(acc, ex, ew, bias, out_dtype)``;

and gives the bits of ``linear`` on the whole K for any number of shards and any split.
Column-parallel TP (a row-slice of ``weight``) gives the matching slice of the output, since
every output element depends only on its own row of x and row of weight.

Bitwise semantics (version 2)
-----------------------------
For x [M, K] (leading axes flattened) and weight [N, K], both bfloat16 or both float16:

- ``ex_i = expo(max_k |x_ik|)``, ``ew_j = expo(max_k |w_jk|)`` (P1, finite entries only). The
  exponent of an all-zero row (or of K = 0) does not affect any bit, since its ``C`` is 0.
- ``X_ik = RNE(x_ik * 2**(27 - ex_i))``: activation rows on a 28-bit signed grid,
  ``|X| <= 2**27`` (bf16/fp16 values within 20 binades of the row max are exact, so a few
  outlier channels 1000x the rest leave the others every bit). ``Wt_jk = RNE(w_jk * 2**(20 -
  ew_j))``: weight rows on a 21-bit grid, ``|Wt| <= 2**20``.
- ``C_ij = sum_k X_ik Wt_jk`` exactly (int64; K <= 65535 = 2**16 - 1 keeps |C| < 2**63, checked).
- Without bias: ``y_ij = RN_out(C_ij * 2**(ex_i + ew_j - 47))``, the exact value rounded once,
  half to even, straight to ``out_dtype`` (P3': subnormals kept, overflow to +-inf). With a
  bias: ``y_ij = RN_out(RN32(RN32(C_ij * 2**(ex_i + ew_j - 47)) + fp32(bias_j)))`` (one rounding
  to fp32, one IEEE fp32 addition, the cast; bias bf16/fp16 is widened exactly).
- If row i of x or row j of weight holds a NaN or an infinity, ``y_ij`` is NaN (and only
  those elements: other rows and columns are unaffected). Output NaN canonical (P8).

Version 1 put both operands on 21-bit grids and rounded ``C`` to fp32 before the scaling and the
cast (two roundings for half outputs): with outlier channels 100-3000x the rest, the ordinary
channels kept ~10 bits. ``rlkernel accuracy --op linear`` measures version 2 against torch
(docs/accuracy/README.md).

Each output element depends only on (row i of x, row j of weight, bias_j), and ``C`` is an
exact integer, so the bits are invariant to batch composition, row order, the order of K
(permuting K of x and weight together), K-splits across tensor-parallel shards, and repeats.

Sub-op semantics: ``linear_exponents`` returns ``ex``/``ew`` above, with the sentinel
:data:`SENTINEL` = 2**20 for a row holding any non-finite value (an all-reduce MAX over shards
then carries it) and :data:`ZERO_EXP` = -149, below every real exponent, for an all-zero row or
an empty K-slice (so a shard that holds only zeros of a row never raises that row's global
exponent). ``linear_partial`` returns ``C`` on the grids of the given exponents (which
must be at least each row's own exponent; sentinel rows contribute 0). ``linear_finish``
applies the last two bullets to an int64 ``acc`` and gives NaN where ``ex_i`` or ``ew_j`` is the
sentinel. ``linear_weight_digits`` returns ``ew`` and the weight's grid integers ``Wt`` as three
balanced base-128 digits, int8 ``[3, N, K]`` with ``Wt = d0 + 128 d1 + 16384 d2``: ``d0 = ((Wt +
64) mod 128) - 64``, ``d1`` the same of ``(Wt - d0) / 128``, ``d2`` the rest (``d0, d1`` in [-64,
63], ``d2`` in [-64, 64]); sentinel rows give zeros. ``linear`` may be given them (with ``ew``) in
place of the weight's own, made once for weights that do not change (a rollout's CUDA graphs).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.digits import int_matmul, nonfinite_rows, row_exponent, to_grid
from rlkernel.contracts._exact.fp32 import canonicalize, int_to_float, round_to
from rlkernel.contracts._gen import (
    from_bits,
    integers,
    normal,
    seed_of,
    special_values,
    uniform,
    with_outlier_channels,
)

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

CONTRACT = Contract(
    name="linear",
    version=2,
    summary="``y = RN_out(sum_k X_ik W_jk * 2**(ex_i + ew_j - 47))`` (+ bias in fp32), 28-bit x rows, 21-bit w rows",
    invariances=("batch", "permutation", "reduction_order", "tp_degree", "repeat", "autograd"),
    dtypes={
        "x": (BF16, FP16),
        "weight": (BF16, FP16),
        "bias": (BF16, FP16, FP32),
        "out_dtype": (FP32, BF16, FP16),
        "ex": (torch.int64,),
        "ew": (torch.int64,),
        "acc": (torch.int64,),
    },
    parameters={
        "x_grid_bits": "28-bit signed grids for the rows of x: X = RNE(x * 2**(27 - e)), |X| <= 2**27 (X_BITS = 27)",
        "w_grid_bits": "21-bit signed grids for the rows of weight: Wt = RNE(w * 2**(20 - e)), |Wt| <= 2**20 "
                       "(W_BITS = 20)",
        "grid_rounding": "placing a value on its row grid rounds to nearest, ties to even",
        "row_exponent": "e = expo(max finite |v|) of each row of x and of weight (P1: 2**(e-1) <= |v| < 2**e, "
                        "a subnormal by its own binade)",
        "zero_row_exponent": "linear_exponents gives ZERO_EXP = -149 for an all-zero row or an empty K-slice",
        "sentinel": "linear_exponents gives SENTINEL = 2**20 for a row holding NaN or +-inf; linear_partial and "
                    "linear_finish read that value as a non-finite row",
        "nonfinite_rows": "a NaN or +-inf in row i of x or row j of weight makes y_ij NaN, and only those",
        "weight_digits": "linear_weight_digits splits each Wt into balanced base-128 digits, low first: "
                         "d0 = ((Wt + 64) mod 128) - 64 and d1 likewise in [-64, 63], d2 the rest in [-64, 64]; "
                         "int8 [3, N, K], zeros on sentinel rows",
        "output_rounding": "C * 2**(ex + ew - 47) rounded once, to nearest, ties to even, straight to out_dtype "
                           "(P3'; never through fp32 or float64 first)",
        "scale_exponent": "the scale 2**(ex + ew - 47) = 2**(ex + ew - X_BITS - W_BITS)",
        "subnormal_results": "a result in the output's subnormal range is kept (rounded once, to nearest even), "
                             "not flushed to zero",
        "bias_add": "with a bias: RN_out(RN32(RN32(C * 2**(ex + ew - 47)) + fp32(bias))), one IEEE fp32 addition "
                    "before the output cast",
        "output_cast": "with a bias, fp32 -> out_dtype: to nearest, ties to even, overflow to +-inf (R6)",
        "digit_product": "C = sum_k X_ik Wt_jk exactly in int64 for any K <= 2**16 - 1; the scheme is free "
                         "(generic: two base-2**14 halves of X in float64 GEMMs on the CPU; elsewhere four and "
                         "three balanced base-128 digits and twelve fp32 digit GEMMs over K-chunks of <= 4096)",
    },
)

#: Magnitude bits of the activation (x) row grid: |X| <= 2**27 (28 signed bits, 4 base-128 digits).
X_BITS = 27
#: Magnitude bits of the weight row grid: |Wt| <= 2**20 (21 signed bits, 3 base-128 digits).
W_BITS = 20
#: Largest K: |C| <= K * 2**47 < 2**63.
MAX_K = (1 << 16) - 1
#: Exponent marking a row that holds NaN or +-inf (larger than any real exponent).
SENTINEL = 1 << 20
#: Exponent of an all-zero row (or an empty K-slice) in the sub-ops: below every real
#: exponent (expo of fp32 values lies in [-148, 128]), so an all-reduce MAX ignores it.
ZERO_EXP = -149
#: The exponents the sub-ops accept (besides SENTINEL).
EXP_MIN, EXP_MAX = ZERO_EXP, 128


# ----------------------------------------------------------------------------- reference


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [*, K] as [M, K] (M the product of the leading axes; works for M = 0 or K = 0)."""
    m = 1
    for s in t.shape[:-1]:
        m *= int(s)
    return t.reshape(m, t.shape[-1])


def _check_k(op: str, k: int) -> None:
    if k > MAX_K:
        raise ValueError(f"{op}: K={k} exceeds the exact-sum bound 2**16 - 1 = {MAX_K} of the digit matmul "
                         f"(|C| <= K * 2**47 < 2**63)")


def _exponents(t: torch.Tensor) -> torch.Tensor:
    """Row exponents of a 2-D tensor: SENTINEL for non-finite rows, ZERO_EXP for all-zero rows; int64 [rows]."""
    if t.shape[-1] == 0:
        return torch.full((t.shape[0],), ZERO_EXP, dtype=torch.int64)
    e = row_exponent(t)
    zero = (t == 0).all(dim=-1)
    e = torch.where(zero, torch.full_like(e, ZERO_EXP), e)
    return torch.where(nonfinite_rows(t), torch.full_like(e, SENTINEL), e)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x @ weight.T (+ bias)`` per P5 (the definition of contract ``linear`` v1).

    Parameters
    ----------
    x : Tensor, bfloat16/float16, [*, K]
    weight : Tensor, same dtype as x, [N, K]
    bias : Tensor, x.dtype or float32, [N], optional
    out_dtype : torch.dtype, optional
        float32, bfloat16 or float16; default ``x.dtype``.

    Returns
    -------
    Tensor, out_dtype, [*, N]

    Bitwise semantics
    -----------------
    See the module docstring: 28-bit x rows and 21-bit weight rows, exact int64 ``C``, one
    rounding to ``out_dtype`` (through fp32 and ``RN32(y + bias)`` with a bias), NaN for
    non-finite rows, canonical NaN. Defined as the composition of the three sub-ops on one
    shard: ``linear_finish(linear_partial(x, w, *linear_exponents(x, w)), ...)``.
    """
    _check_k("linear", x.shape[-1])
    ex, ew = reference_exponents(x, weight)
    return reference_finish(reference_partial(x, weight, ex, ew), ex, ew, bias, out_dtype or x.dtype)


def reference_exponents(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ex [*], ew [N])``: the row exponents of this shard; :data:`SENTINEL` for non-finite rows,
    :data:`ZERO_EXP` for all-zero rows and an empty K-slice.

    Parameters
    ----------
    x : Tensor, bfloat16/float16, [*, K]
    weight : Tensor, same dtype, [N, K]

    Returns
    -------
    ex : Tensor, int64, [*]
    ew : Tensor, int64, [N]
    """
    return _exponents(_rows(x)).reshape(x.shape[:-1]), _exponents(weight)


def _grid_or_raise(op: str, name: str, t: torch.Tensor, e: torch.Tensor, bits: int) -> torch.Tensor:
    """Rows of ``t`` on the grids ``e`` (sentinel rows -> 0); raises if ``e`` is below a row's own exponent."""
    own = _exponents(t)
    low = e < own
    if bool(low.any()):
        i = int(low.nonzero()[0, 0])
        raise ValueError(f"{op}: {name}[{i}] = {int(e[i])} is below that row's own exponent {int(own[i])}; "
                         f"pass the all-reduce MAX of linear_exponents over every shard")
    sentinel = e == SENTINEL
    safe = torch.where(sentinel, torch.zeros_like(e), e)
    if t.shape[-1] == 0:
        return torch.zeros(t.shape, dtype=torch.int64)
    grid = to_grid(t, safe, bits)
    return torch.where(sentinel.unsqueeze(-1), torch.zeros_like(grid), grid)


def reference_partial(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """The exact integer ``C = X @ Wt.T`` on the given grids (one shard's partial sum).

    Parameters
    ----------
    x : Tensor, bfloat16/float16, [*, K_shard]
    weight : Tensor, same dtype, [N, K_shard]
    ex : Tensor, int64, [*]
        Global row exponents of x (all-reduce MAX of every shard's ``linear_exponents``).
    ew : Tensor, int64, [N]

    Returns
    -------
    Tensor, int64, [*, N]

    Bitwise semantics
    -----------------
    ``C_ij = sum_k RNE(x_ik 2**(27 - ex_i)) RNE(w_jk 2**(20 - ew_j))``; rows whose exponent is
    the sentinel contribute 0. An exponent below the row's own raises ``ValueError`` (the grid
    would exceed 28 / 21 bits).
    """
    lead, k, n = tuple(x.shape[:-1]), x.shape[-1], weight.shape[0]
    _check_k("linear_partial", k)
    xg = _grid_or_raise("linear_partial", "ex", _rows(x), ex.reshape(-1), X_BITS)
    wg = _grid_or_raise("linear_partial", "ew", weight, ew, W_BITS)
    return int_matmul(xg, wg).reshape(*lead, n)


def reference_finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None = None,
                     out_dtype: torch.dtype = FP32) -> torch.Tensor:
    """``y = RN_out(acc * 2**(ex + ew - 47))`` (with a bias: ``RN_out(RN32(RN32(...) + bias))``), NaN on
    sentinel rows.

    Parameters
    ----------
    acc : Tensor, int64, [*, N]
        The all-reduce SUM of every shard's ``linear_partial``.
    ex : Tensor, int64, [*]
    ew : Tensor, int64, [N]
    bias : Tensor, bfloat16/float16/float32, [N], optional
    out_dtype : torch.dtype
        float32 (default), bfloat16 or float16.

    Returns
    -------
    Tensor, out_dtype, [*, N]
    """
    n = acc.shape[-1]
    a2 = _rows(acc)
    e_x, e_w = ex.reshape(-1), ew
    bad = (e_x == SENTINEL).unsqueeze(1) | (e_w == SENTINEL).unsqueeze(0)
    e_x = torch.where(e_x == SENTINEL, torch.zeros_like(e_x), e_x)
    e_w = torch.where(e_w == SENTINEL, torch.zeros_like(e_w), e_w)
    scale = e_x.unsqueeze(1) + e_w.unsqueeze(0) - X_BITS - W_BITS
    if bias is None:
        y = int_to_float(a2, scale, out_dtype)  # one rounding, straight to the output dtype
        y = canonicalize(torch.where(bad, torch.full_like(y, float("nan")), y))
    else:
        y = int_to_float(a2, scale, FP32)
        y = torch.where(bad, torch.full_like(y, float("nan")), y) + bias.to(FP32)  # one IEEE fp32 addition
        y = round_to(y, out_dtype)
    return y.reshape(acc.shape[:-1] + (n,))


def reference_weight_digits(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ew [N], digits [3, N, K])``: the weight's row exponents and its grid integers as three
    balanced base-128 digits.

    Parameters
    ----------
    weight : Tensor, bfloat16/float16, [N, K]

    Returns
    -------
    ew : Tensor, int64, [N]
        As ``linear_exponents`` gives them.
    digits : Tensor, int8, [3, N, K]
        ``Wt = digits[0] + 128 digits[1] + 16384 digits[2]`` with ``Wt = RNE(w 2**(20 - ew))``.

    Bitwise semantics
    -----------------
    ``d0 = ((Wt + 64) mod 128) - 64``, ``r = (Wt - d0) / 128``, ``d1 = ((r + 64) mod 128) - 64``,
    ``d2 = (r - d1) / 128`` (exact integer divisions); ``|Wt| <= 2**20`` puts ``d2`` in [-64, 64].
    Rows holding NaN/inf (sentinel ``ew``) give zeros.
    """
    if weight.dim() != 2:
        raise ValueError(f"linear_weight_digits: weight must be [N, K]; got shape {tuple(weight.shape)}")
    _check_k("linear_weight_digits", weight.shape[-1])
    ew = _exponents(weight)
    g = _grid_or_raise("linear_weight_digits", "ew", weight, ew, W_BITS)
    digits = []
    for _ in range(2):
        d = torch.remainder(g + 64, 128) - 64
        digits.append(d)
        g = torch.div(g - d, 128, rounding_mode="floor")
    digits.append(g)
    return ew, torch.stack(digits).to(torch.int8)


REFERENCES = {
    "linear": reference,
    "linear_exponents": reference_exponents,
    "linear_weight_digits": reference_weight_digits,
    "linear_partial": reference_partial,
    "linear_finish": reference_finish,
}


# ----------------------------------------------------------------------------- inputs


def _seed(*parts: object) -> int:
    return seed_of("linear", *parts)


def _bias(name: str, n: int, kind: str | None, dtype: torch.dtype) -> torch.Tensor | None:
    if kind is None:
        return None
    return normal(_seed(name, "bias"), (n,), 0.5, dtype if kind == "same" else FP32)


def _make(name: str, m: int, k: int, n: int, dtype: torch.dtype, bias: str | None = None,
          out_dtype: torch.dtype | None = None, x_std: float = 1.0, w_std: float = 0.05) -> dict[str, Any]:
    return {
        "x": normal(_seed(name, "x"), (m, k), x_std, dtype),
        "weight": normal(_seed(name, "w"), (n, k), w_std, dtype),
        "bias": _bias(name, n, bias, dtype),
        "out_dtype": out_dtype,
    }


def _case(name: str, kind: str, make: Any, op: str | None = None, full_only: bool = False) -> Case:
    return Case(name=name, kind=kind, make=make, op=op, full_only=full_only)  # type: ignore[arg-type]


def golden_cases() -> list[Case]:
    """Qwen3-ish small shapes, bf16 and fp16, with and without bias, fp32 and half outputs."""
    cases: list[Case] = []
    i = 0
    for m in (1, 3, 17, 64):
        for k in (64, 256, 1024):
            for dtype in (BF16, FP16):
                n = (32, 96)[(i // 2) % 2]
                bias = (None, "same", "fp32")[i % 3]
                out = (None, FP32)[(i // 4) % 2]
                tag = "bf16" if dtype == BF16 else "fp16"
                name = f"m{m}_k{k}_n{n}_{tag}_{bias or 'nobias'}_{'fp32' if out else tag}out"
                cases.append(_case(name, "golden", lambda name=name, m=m, k=k, n=n, d=dtype, b=bias, o=out:
                                   _make(name, m, k, n, d, b, o)))
                i += 1
    cases.append(_case("batch_dims_2x5_k256_n96_bf16", "golden", lambda: {
        "x": normal(_seed("batch_dims", "x"), (2, 5, 256), 1.0, BF16),
        "weight": normal(_seed("batch_dims", "w"), (96, 256), 0.05, BF16),
        "bias": normal(_seed("batch_dims", "b"), (96,), 0.5, FP32),
    }))
    cases.append(_case("m128_k4096_n512_bf16_fp32out", "golden",
                       lambda: _make("m128_k4096_n512", 128, 4096, 512, BF16, "same", FP32), full_only=True))
    # Above 256 rows GPU backends take their prefill path (weight digit planes; on sm_90 optionally
    # the wgmma GEMM): row and column tails, an odd N, K off the 128-deep steps.
    cases.append(_case("m300_k1040_n99_bf16_same_bf16out", "golden",
                       lambda: _make("m300_k1040_n99", 300, 1040, 99, BF16, "same")))
    cases.append(_case("m520_k272_n64_fp16_fp32_fp32out", "golden",
                       lambda: _make("m520_k272_n64", 520, 272, 64, FP16, "fp32", FP32)))
    # The tensor-parallel sub-ops, on a shard whose global exponents exceed its own.
    cases.append(_case("exponents_m17_k256_n32_bf16", "golden",
                       lambda: {"x": normal(_seed("exp", "x"), (17, 256), 1.0, BF16),
                                "weight": normal(_seed("exp", "w"), (32, 256), 0.05, BF16)},
                       op="linear_exponents"))
    for dtype, tag in ((BF16, "bf16"), (FP16, "fp16")):
        cases.append(_case(f"weight_digits_n96_k1040_{tag}", "golden",
                           lambda dtype=dtype, tag=tag: {"weight": normal(_seed("wd", tag), (96, 1040), 0.05, dtype)},
                           op="linear_weight_digits"))
    cases.append(_case("partial_m17_k256_n32_bf16_global_grid", "golden", lambda: _partial_inputs("p_bf16", BF16),
                       op="linear_partial"))
    cases.append(_case("partial_m9_k256_n32_fp16_global_grid", "golden", lambda: _partial_inputs("p_fp16", FP16),
                       op="linear_partial"))
    for out in (FP32, BF16, FP16):
        tag = str(out).replace("torch.", "")
        cases.append(_case(f"finish_m17_n32_{tag}", "golden",
                           lambda out=out, tag=tag: _finish_inputs(f"finish_{tag}", out), op="linear_finish"))
    return cases


def _partial_inputs(name: str, dtype: torch.dtype) -> dict[str, Any]:
    m = 17 if dtype == BF16 else 9
    x = normal(_seed(name, "x"), (m, 256), 1.0, dtype)
    w = normal(_seed(name, "w"), (32, 256), 0.05, dtype)
    ex, ew = reference_exponents(x, w)
    return {"x": x, "weight": w, "ex": ex + integers(_seed(name, "dx"), (m,), 0, 4),
            "ew": ew + integers(_seed(name, "dw"), (32,), 0, 3)}


def _finish_inputs(name: str, out: torch.dtype) -> dict[str, Any]:
    acc = integers(_seed(name, "acc"), (17, 32), -(1 << 50), 1 << 50)
    acc = acc >> integers(_seed(name, "shift"), (17, 32), 0, 50)  # magnitudes over many binades
    ex = integers(_seed(name, "ex"), (17,), -10, 8)
    ew = integers(_seed(name, "ew"), (32,), -12, 2)
    ex[5] = SENTINEL
    ew[7] = SENTINEL
    return {"acc": acc, "ex": ex, "ew": ew, "bias": normal(_seed(name, "b"), (32,), 0.5, FP32), "out_dtype": out}


def _scaled_rows(name: str, rows: int, k: int, shifts: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Rows of N(0, 1) values times ``2**shift`` (the scaling is exact in float64; one cast)."""
    base = normal(_seed(name), (rows, k), 1.0, FP32).to(torch.float64)
    scale = torch.tensor([2.0 ** s for s in shifts], dtype=torch.float64).unsqueeze(1)
    return (base * scale).to(dtype)


def long_k_rows(k: int) -> dict[str, torch.Tensor]:
    """One bf16 row of x and of weight, K = 8192 or 16384, whose exact product needs its last unit.

    x = w = 255/128 first (the row max: grid value 2**20 - 2**12), then K - 3 middle values, one
    adjusting w value, and a last product 1 * 1 (x = w = 2**-19). ``C - 1`` is an fp32 tie with
    an even floor, so a product that loses the last 1 rounds the other way. K = 8192, middle
    -2**-13 (low digit -64): the low digit products sum to 2**24 + 1, exact in fp32 digit GEMMs
    over K-chunks of at most 4096 only. K = 16384, middle 255/128: the grid products sum past
    2**53 (C - 1 = float64(C)), exact in float64 GEMMs over K-chunks of at most 8192 only.
    """
    middle, adjust = {8192: (-(2.0**-13), 21 * 2.0**-13), 16384: (255 / 128, 94 / 128)}[k]
    x = torch.full((1, k), middle, dtype=torch.float64)
    x[0, 0] = 255 / 128
    x[0, -1] = 2.0**-19
    w = x.clone()
    w[0, -2] = adjust
    return {"x": x.to(BF16), "weight": w.to(BF16)}


def _halfway(dtype: torch.dtype) -> dict[str, Any]:
    """Products whose exact value lies off a midpoint of two ``dtype`` values by less than half an fp32
    ulp: x rows ``[a, h, +-d, ...]`` against weight rows ``[1, 1, 1, ...]`` (``a`` a ``dtype`` value,
    ``h`` half its ulp, ``d = 2**-(27 - mant)`` of it). One rounding from the exact integer gets every
    output right; a rounding to fp32 first lands on the tie and goes the wrong way for half of them."""
    mant = 8 if dtype == BF16 else 11
    m, k = 24, 8
    a_int = integers(_seed("halfway", dtype, "a"), (m,), 1 << (mant - 1), 1 << mant).to(torch.float64)
    ulp = torch.pow(2.0, integers(_seed("halfway", dtype, "e"), (m,), -4, 5).to(torch.float64) - (mant - 1))
    sign = torch.where(integers(_seed("halfway", dtype, "s"), (m,), 0, 2) == 0, -1.0, 1.0)
    x = torch.zeros(m, k, dtype=torch.float64)
    x[:, 0], x[:, 1], x[:, 2] = a_int * ulp, ulp / 2, sign * ulp * 2.0 ** -(26 - mant)
    w = torch.zeros(5, k, dtype=torch.float64)
    w[:, :3] = 1.0
    w[1] = -w[1]
    return {"x": x.to(dtype), "weight": w.to(dtype), "bias": None, "out_dtype": None}


def adversarial_cases() -> list[Case]:
    """Outliers, zero and non-finite rows, subnormals, extreme exponents, ties, odd shapes."""
    cases: list[Case] = []

    def add(name: str, make: Any, op: str | None = None) -> None:
        cases.append(_case(name, "adversarial", make, op))

    add("halfway_bf16_out", lambda: _halfway(BF16))
    add("halfway_fp16_out", lambda: _halfway(FP16))

    for factor in (1000.0, 3000.0):
        for dtype in (BF16, FP16):
            tag = "bf16" if dtype == BF16 else "fp16"

            def make(factor: float = factor, dtype: torch.dtype = dtype, tag: str = tag) -> dict[str, Any]:
                name = f"outliers_{int(factor)}_{tag}"
                x = normal(_seed(name, "x"), (17, 1024), 1.0, FP32)
                x = with_outlier_channels(x, _seed(name, "ch"), count=4, factor=factor).to(dtype)
                return {"x": x, "weight": normal(_seed(name, "w"), (96, 1024), 0.05, dtype),
                        "bias": normal(_seed(name, "b"), (96,), 0.5, FP32),
                        "out_dtype": FP32 if tag == "fp16" else None}

            add(f"outliers_{int(factor)}x_{tag}", make)

    def zero_rows() -> dict[str, Any]:
        d = _make("zero_rows", 7, 64, 9, BF16, "same", FP32)
        d["x"][0] = 0.0
        d["x"][4] = -0.0
        d["weight"][2] = 0.0
        d["weight"][8] = -0.0
        return d

    add("zero_rows_bf16", zero_rows)

    def nonfinite(dtype: torch.dtype) -> dict[str, Any]:
        d = _make(f"nonfinite_{dtype}", 8, 129, 6, dtype, "fp32", FP32)
        d["x"][2, 5] = float("nan")
        d["x"][4, 0] = float("inf")
        d["x"][6, 128] = float("-inf")
        d["weight"][1, 64] = float("nan")
        d["weight"][3, 3] = float("inf")
        return d

    add("nonfinite_rows_bf16", lambda: nonfinite(BF16))
    add("nonfinite_rows_fp16_halfout", lambda: {**nonfinite(FP16), "out_dtype": None})

    def subnormals(dtype: torch.dtype) -> dict[str, Any]:
        width_mask = 0x007F if dtype == BF16 else 0x03FF
        bits = integers(_seed("subnormal", str(dtype)), (6, 48), 0, 1 << 16)
        sub = (bits & width_mask) | (bits & 0x8000)  # sign + subnormal significand, exponent 0
        x = from_bits([int(b) for b in sub.reshape(-1)], dtype).reshape(6, 48)
        w = normal(_seed("subnormal_w", str(dtype)), (5, 48), 1.0, dtype)
        w[4] = x[5]  # subnormal times subnormal
        x[0, :24] = normal(_seed("subnormal_mix", str(dtype)), (24,), 1.0, dtype)  # normal max, subnormal tail
        return {"x": x, "weight": w, "out_dtype": FP32}

    add("subnormals_bf16", lambda: subnormals(BF16))
    add("subnormals_fp16", lambda: subnormals(FP16))

    def exponent_sweep() -> dict[str, Any]:
        # row scales from 2**-126 to 2**120: results normal, subnormal, underflowing to +-0
        # (exponent sums far below -252) and overflowing to +-inf.
        shifts_x = [-126, -110, -90, -70, -60, -40, -20, 0, 20, 60, 100, 120]
        shifts_w = [-126, -100, -75, -50, -25, 0, 30, 64, 100, 125]
        return {"x": _scaled_rows("sweep_x", len(shifts_x), 40, shifts_x, BF16),
                "weight": _scaled_rows("sweep_w", len(shifts_w), 40, shifts_w, BF16),
                "out_dtype": FP32}

    add("exponent_sweep_bf16", exponent_sweep)
    add("exponent_sweep_bf16_halfout", lambda: {**exponent_sweep(), "out_dtype": None})

    def exponent_sweep_fp16() -> dict[str, Any]:
        shifts = [-24, -18, -14, -8, 0, 6, 12, 15]
        return {"x": _scaled_rows("sweep16_x", len(shifts), 33, shifts, FP16),
                "weight": _scaled_rows("sweep16_w", len(shifts), 33, shifts, FP16), "out_dtype": None}

    add("exponent_sweep_fp16_overflow", exponent_sweep_fp16)

    def specials_finite(dtype: torch.dtype) -> dict[str, Any]:
        sv = special_values(dtype)
        finite = sv[torch.isfinite(sv)]
        x = normal(_seed("specials", str(dtype)), (len(finite), 24), 1.0, dtype)
        for i in range(len(finite)):
            x[i, (3 * i) % 24] = finite[i]
            x[i, (5 * i + 7) % 24] = finite[(i + 1) % len(finite)]
        w = normal(_seed("specials_w", str(dtype)), (4, 24), 1.0, dtype)
        w[3, :len(finite)] = finite
        return {"x": x, "weight": w, "bias": None, "out_dtype": FP32}

    add("special_finite_values_bf16", lambda: specials_finite(BF16))
    add("special_finite_values_fp16", lambda: specials_finite(FP16))

    def grid_ties(dtype: torch.dtype) -> dict[str, Any]:
        # Row max 1 (ex = 1, grid step 2**-19); entries (2j + 1) * 2**-20 lie exactly halfway
        # between grid points and round half-to-even.
        j = torch.arange(32, dtype=torch.float64)
        tail = (2 * j + 1) * 2.0**-20 * torch.where(j % 3 == 0, -1.0, 1.0)
        x = torch.cat([torch.ones(1, dtype=torch.float64), tail]).unsqueeze(0)
        x = torch.cat([x, x.flip(1), -x], 0).to(dtype)
        w = torch.ones((3, 33), dtype=torch.float64)
        w[1] = 2.0**-30  # tiny everywhere: its own grid, no ties
        w[2, 0] = 0.0
        return {"x": x, "weight": w.to(dtype), "out_dtype": FP32}

    add("grid_ties_bf16", lambda: grid_ties(BF16))
    add("grid_ties_fp16", lambda: grid_ties(FP16))

    def rounding_ties() -> dict[str, Any]:
        # C = 2**38 + 2**14 and 2**38 + 3 * 2**14: exact ties in the int64 -> fp32 rounding;
        # y = 1 + 2**-8 and 1 + 3 * 2**-8: exact ties in the fp32 -> bf16 output cast.
        x = torch.tensor([[1.0, 2.0**-19], [1.0, 3 * 2.0**-19], [1.0, 2.0**-8], [1.0, 3 * 2.0**-8],
                          [-1.0, -(2.0**-19)], [-1.0, -(3 * 2.0**-8)]], dtype=torch.float64)
        w = torch.tensor([[1.0, 2.0**-5], [1.0, 1.0], [0.5, 0.5 * 2.0**-5]], dtype=torch.float64)
        return {"x": x.to(BF16), "weight": w.to(BF16), "out_dtype": None}

    add("rounding_ties_bf16out", rounding_ties)
    add("rounding_ties_fp32out", lambda: {**rounding_ties(), "out_dtype": FP32})
    add("k1", lambda: _make("k1", 5, 1, 7, BF16, "same", None))
    add("k129_fp16", lambda: _make("k129", 3, 129, 5, FP16, None, FP32))
    add("k8193_crosses_chunks", lambda: _make("k8193", 2, 8193, 3, BF16, "fp32", FP32, x_std=3.0))

    def noncontiguous() -> dict[str, Any]:
        x = normal(_seed("nc", "x"), (96, 5), 1.0, BF16).t()  # [5, 96], a transposed view
        w = normal(_seed("nc", "w"), (96, 14), 0.05, BF16).t()[::2]  # [7, 96], transposed + strided
        return {"x": x, "weight": w, "bias": normal(_seed("nc", "b"), (14,), 0.5, BF16)[::2], "out_dtype": FP32}

    add("noncontiguous_views", noncontiguous)
    add("empty_m", lambda: _make("empty_m", 0, 64, 32, BF16, "same", None))
    add("empty_m_batch_dims", lambda: {"x": torch.zeros((2, 0, 16), dtype=FP16),
                                       "weight": normal(_seed("em3", "w"), (4, 16), 0.05, FP16)})
    add("k0_bias", lambda: {"x": torch.zeros((3, 0), dtype=BF16), "weight": torch.zeros((5, 0), dtype=BF16),
                            "bias": normal(_seed("k0", "b"), (5,), 0.5, FP32), "out_dtype": FP32})
    add("x_1d", lambda: {"x": normal(_seed("x1d", "x"), (64,), 1.0, BF16),
                         "weight": normal(_seed("x1d", "w"), (8, 64), 0.05, BF16)})

    def bias_specials() -> dict[str, Any]:
        d = _make("bias_specials", 4, 32, 12, BF16, None, FP32)
        sv = special_values(FP32)
        d["bias"] = sv
        return d

    add("bias_special_values", bias_specials)

    # sub-ops
    add("exponents_nonfinite_sentinel", lambda: {"x": nonfinite(BF16)["x"], "weight": nonfinite(BF16)["weight"]},
        op="linear_exponents")
    add("exponents_zero_rows", lambda: {"x": zero_rows()["x"], "weight": zero_rows()["weight"]},
        op="linear_exponents")
    add("exponents_k0", lambda: {"x": torch.zeros((3, 0), dtype=BF16), "weight": torch.zeros((2, 0), dtype=BF16)},
        op="linear_exponents")
    def digits_special_rows() -> dict[str, Any]:
        w = nonfinite(BF16)["weight"]  # rows 1 and 3 hold NaN / inf
        w[4] = -0.0
        w[5] = 0.0
        return {"weight": w}

    add("weight_digits_nonfinite_zero_rows", digits_special_rows, op="linear_weight_digits")
    add("weight_digits_k0", lambda: {"weight": torch.zeros((3, 0), dtype=FP16)}, op="linear_weight_digits")

    def digit_boundaries() -> dict[str, Any]:
        # the row max 2 - 2**-7 sets a grid of 2**19 per unit and Wt = 2**20 - 2**12 (d2 = 64); the rest,
        # in grid units: every digit at and next to its ends, and ties of the grid rounding
        units = [63, 64, -64, -63, 65, -65, 127, 128, 8064, 8128, 8192, -8192, 0.5, 1.5, 2.5, -0.5, -1.5]
        row = torch.tensor([2 - 2.0**-7, -(2 - 2.0**-7)] + [u * 2.0**-19 for u in units], dtype=FP32)
        return {"weight": torch.stack([row, -row, row * 0.75, row * 2.0**-100]).to(BF16)}

    add("weight_digits_boundaries_bf16", digit_boundaries, op="linear_weight_digits")

    def partial_sentinel() -> dict[str, Any]:
        d = nonfinite(BF16)
        ex, ew = reference_exponents(d["x"], d["weight"])
        ex[1] = SENTINEL  # another shard saw a NaN in row 1
        return {"x": d["x"], "weight": d["weight"], "ex": ex, "ew": ew}

    add("partial_sentinel_rows", partial_sentinel, op="linear_partial")

    def finish_extremes() -> dict[str, Any]:
        acc = torch.tensor([[0, 1, -1, (1 << 62) - 1, -(1 << 62) + 1, (1 << 24) + 1, -((1 << 25) + 3), 12345]])
        acc = acc.repeat(6, 1) * torch.tensor([[1], [-1], [1], [1], [-1], [1]])
        ex = torch.tensor([EXP_MIN, EXP_MIN, EXP_MAX, -100, 0, SENTINEL])
        ew = torch.tensor([EXP_MIN, -20, EXP_MAX, 60, -74, 3, SENTINEL, 0])
        return {"acc": acc, "ex": ex, "ew": ew, "bias": None, "out_dtype": FP32}

    add("finish_extreme_exponents", finish_extremes, op="linear_finish")
    add("finish_extreme_exponents_bf16", lambda: {**finish_extremes(), "out_dtype": BF16}, op="linear_finish")

    def finish_double_rounding() -> dict[str, Any]:
        # |C| >= 2**53 one unit above an fp32 tie (2**53 + 2**29 + 1, ...): int64 -> fp32 rounds up,
        # int64 -> float64 -> fp32 lands on the tie and rounds to even (down).
        vals = [(1 << 53) + (1 << 29) + 1, (1 << 54) + (1 << 30) + 1, (1 << 55) + (1 << 31) + 3,
                (1 << 62) + (1 << 38) + 1]
        acc = torch.tensor([vals + [-v for v in vals]], dtype=torch.int64).repeat(2, 1)
        return {"acc": acc, "ex": torch.tensor([0, -30]), "ew": torch.zeros(8, dtype=torch.int64), "bias": None,
                "out_dtype": FP32}

    add("finish_double_rounding_ties", finish_double_rounding, op="linear_finish")
    add("exponents_subnormal_rows", lambda: {"x": subnormals(BF16)["x"], "weight": subnormals(BF16)["weight"]},
        op="linear_exponents")

    add("long_k8192_digit_chunk_sums", lambda: {**long_k_rows(8192), "out_dtype": FP32})
    add("long_k16384_f64_chunk_sums", lambda: {**long_k_rows(16384), "out_dtype": FP32})
    return cases


# ----------------------------------------------------------------------------- invariances


def _inv_inputs(name: str, m: int = 17, k: int = 256, n: int = 96, dtype: torch.dtype = BF16) -> dict[str, Any]:
    x = normal(_seed(name, "x"), (m, k), 1.0, FP32)
    x = with_outlier_channels(x, _seed(name, "ch"), count=3, factor=1000.0).to(dtype)
    return {"x": x, "weight": normal(_seed(name, "w"), (n, k), 0.05, dtype),
            "bias": normal(_seed(name, "b"), (n,), 0.5, dtype)}


def _permutation(seed: int, n: int) -> torch.Tensor:
    return torch.from_numpy(uniform(seed, (n,)).argsort(kind="stable"))


def _batch_check(dtype: torch.dtype, out_dtype: torch.dtype | None) -> Any:
    def check(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs(f"batch_{dtype}", m=64, dtype=dtype)
        row = d["x"][5:6]
        alone = run("linear", x=row, weight=d["weight"], bias=d["bias"], out_dtype=out_dtype)
        expected, actual = [], []
        for size, pos in ((3, 1), (17, 16), (64, 0), (64, 37)):
            batch = d["x"][:size].clone()
            batch[pos] = row[0]
            out = run("linear", x=batch, weight=d["weight"], bias=d["bias"], out_dtype=out_dtype)
            expected.append(alone[0])
            actual.append(out[pos])
        return tuple(expected), tuple(actual)

    return check


def _row_parallel(run: Any, x: torch.Tensor, w: torch.Tensor, bias: Any, out_dtype: Any,
                  splits: list[int]) -> torch.Tensor:
    """Simulated row-parallel TP over K-shards of the given sizes, through the public sub-ops."""
    bounds = [0]
    for s in splits:
        bounds.append(bounds[-1] + s)
    shards = [(x[..., a:b], w[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    exps = [run("linear_exponents", x=xs, weight=ws) for xs, ws in shards]
    ex = run("all_reduce", partials=torch.stack([e[0] for e in exps]), op="max")
    ew = run("all_reduce", partials=torch.stack([e[1] for e in exps]), op="max")
    parts = [run("linear_partial", x=xs, weight=ws, ex=ex, ew=ew) for xs, ws in shards]
    acc = run("all_reduce", partials=torch.stack(parts), op="sum")
    return run("linear_finish", acc=acc, ex=ex, ew=ew, bias=bias, out_dtype=out_dtype)  # type: ignore[no-any-return]


def invariance_cases() -> list[InvarianceCase]:
    """batch, permutation, reduction_order, tp_degree (row and column), repeat, autograd."""
    cases: list[InvarianceCase] = []

    def add(name: str, inv: str, check: Any) -> None:
        cases.append(InvarianceCase(name=name, invariance=inv, check=check))

    add("batch_row_alone_vs_batches_bf16", "batch", _batch_check(BF16, None))
    add("batch_row_alone_vs_batches_fp16_fp32out", "batch", _batch_check(FP16, FP32))

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("perm")
        p = _permutation(_seed("perm", "p"), 17)
        whole = run("linear", **d)
        return whole[p], run("linear", x=d["x"][p], weight=d["weight"], bias=d["bias"])

    add("permuted_rows", "permutation", permutation)

    def reduction_order(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("korder", k=1024, dtype=FP16)
        whole = run("linear", out_dtype=FP32, **d)
        p = _permutation(_seed("korder", "p"), 1024)
        outs = (run("linear", x=d["x"][:, p], weight=d["weight"][:, p], bias=d["bias"], out_dtype=FP32),
                run("linear", x=d["x"].flip(1), weight=d["weight"].flip(1), bias=d["bias"], out_dtype=FP32))
        return (whole, whole), outs

    add("permuted_and_reversed_k", "reduction_order", reduction_order)

    def row_parallel(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("tp_row", m=9, k=1024)
        d["x"][4, 700] = float("nan")  # a NaN in one shard must reach every rank's output row
        whole = run("linear", out_dtype=BF16, **d)
        tp2 = _row_parallel(run, d["x"], d["weight"], d["bias"], BF16, [512, 512])
        tp4 = _row_parallel(run, d["x"], d["weight"], d["bias"], BF16, [256, 256, 256, 256])
        uneven = _row_parallel(run, d["x"], d["weight"], d["bias"], BF16, [1, 300, 600, 123])
        return (whole, whole, whole), (tp2, tp4, uneven)

    add("row_parallel_tp1_tp2_tp4", "tp_degree", row_parallel)

    def row_parallel_fp32(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("tp_row32", m=5, k=512, n=32, dtype=FP16)
        whole = run("linear", out_dtype=FP32, **d)
        tp2 = _row_parallel(run, d["x"], d["weight"], d["bias"], FP32, [200, 312])
        return whole, tp2

    add("row_parallel_fp16_fp32out", "tp_degree", row_parallel_fp32)

    def row_parallel_zero_shards(run: Any) -> tuple[Any, Any]:
        # Rows whose slice on some shard is all zero, and an empty shard: with weights of
        # magnitude < 1 every real exponent is negative, so a zero shard must not raise it.
        d = _inv_inputs("tp_zero", m=6, k=256, n=24)
        d["weight"] = d["weight"] * 0.01
        d["x"] = d["x"] * 0.001
        d["x"][1, :128] = 0.0
        d["x"][2, 128:] = 0.0
        d["x"][3] = 0.0
        d["weight"][5, :200] = -0.0
        whole = run("linear", out_dtype=FP32, **d)
        halves = _row_parallel(run, d["x"], d["weight"], d["bias"], FP32, [128, 128])
        with_empty = _row_parallel(run, d["x"], d["weight"], d["bias"], FP32, [0, 200, 0, 56])
        return (whole, whole), (halves, with_empty)

    add("row_parallel_zero_and_empty_shards", "tp_degree", row_parallel_zero_shards)

    def column_parallel(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("tp_col", m=9, k=256, n=96)
        whole = run("linear", **d)
        shards = []
        for tp in (2, 4):
            size = 96 // tp
            parts = [run("linear", x=d["x"], weight=d["weight"][r * size:(r + 1) * size],
                         bias=d["bias"][r * size:(r + 1) * size]) for r in range(tp)]
            shards.append(torch.cat(parts, dim=-1))
        return (whole, whole), tuple(shards)

    add("column_parallel_tp2_tp4", "tp_degree", column_parallel)

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("repeat")
        first = run("linear", out_dtype=FP32, **d)
        return (first, first), (run("linear", out_dtype=FP32, **d), run("linear", out_dtype=FP32, **d))

    add("repeated_runs", "repeat", repeat)

    def autograd(run: Any) -> tuple[Any, Any]:
        d = _inv_inputs("autograd")
        plain = run("linear", **d)
        x = d["x"].clone().requires_grad_(True)
        w = d["weight"].clone().requires_grad_(True)
        with torch.enable_grad():
            tracked = run("linear", x=x, weight=w, bias=d["bias"])
        return plain, tracked

    add("forward_under_autograd", "autograd", autograd)

    # linear_weight_digits: each row's planes depend on that row only
    def digits_permuted_rows(run: Any) -> tuple[Any, Any]:
        w = _inv_inputs("wd_perm", n=40)["weight"]
        w[7, 3] = float("nan")
        p = _permutation(_seed("wd_perm", "p"), 40)
        ew, digits = run("linear_weight_digits", weight=w)
        return (ew[p], digits[:, p]), run("linear_weight_digits", weight=w[p])

    cases.append(InvarianceCase(name="weight_digits_permuted_rows", invariance="permutation",
                                check=digits_permuted_rows, op="linear_weight_digits"))

    def digits_column_parallel(run: Any) -> tuple[Any, Any]:
        # a column-parallel shard (a slice of the weight's rows) holds the matching slice of the planes
        w = _inv_inputs("wd_cols", n=48, dtype=FP16)["weight"]
        ew, digits = run("linear_weight_digits", weight=w)
        shards = [run("linear_weight_digits", weight=w[a:b]) for a, b in ((0, 16), (16, 40), (40, 48))]
        return (ew, digits), (torch.cat([e for e, _ in shards]), torch.cat([d for _, d in shards], dim=1))

    cases.append(InvarianceCase(name="weight_digits_column_parallel_shards", invariance="tp_degree",
                                check=digits_column_parallel, op="linear_weight_digits"))
    return cases


# ----------------------------------------------------------------------------- benchmarks


def _bench_tensor(name: str, rows: int, cols: int, std: float, device: torch.device) -> torch.Tensor:
    """Deterministic bf16 [rows, cols]: a 64-row block from _gen, tiled (cheap to make at 8B scale)."""
    block = normal(_seed("bench", name, cols), (min(rows, 64), cols), std, BF16).to(device)
    reps = -(-rows // block.shape[0])
    return block.repeat(reps, 1)[:rows].contiguous()


def _native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None) -> torch.Tensor:
    y = torch.nn.functional.linear(x, weight, bias)
    return y if out_dtype is None else y.to(out_dtype)


def bench_cases() -> list[BenchCase]:
    """Projections in bf16, decode to prefill. large: Qwen3-8B (hidden 4096, intermediate 12288);
    small: Qwen3-0.6B (hidden 1024, intermediate 3072) at decode-sized M."""
    shapes = [("qwen3_8b", "large", mkn) for mkn in ((1, 4096, 4096), (8, 4096, 12288), (64, 4096, 4096),
                                                     (256, 12288, 4096), (2048, 4096, 12288), (8192, 4096, 4096))]
    shapes += [("qwen3_0.6b", "small", mkn) for mkn in ((1, 1024, 1024), (16, 1024, 3072), (64, 3072, 1024))]
    # a rollout's decode step at 256 sequences: o_proj and down_proj (32 output tiles of 128 x 64)
    shapes += [("qwen3_0.6b", "large", mkn) for mkn in ((256, 2048, 1024), (256, 3072, 1024))]
    cases = []
    for model, size, (m, k, n) in shapes:
        def make(device: torch.device, m: int = m, k: int = k, n: int = n) -> dict[str, Any]:
            return {"x": _bench_tensor("x", m, k, 1.0, device), "weight": _bench_tensor("w", n, k, 0.02, device)}

        cases.append(BenchCase(name=f"{model}_m{m}_k{k}_n{n}_bf16", make=make, native=_native,
                               flops=2.0 * m * n * k, bytes=2.0 * (m * k + n * k + m * n), sizes=(size,),
                               graph=m <= 64 or model == "qwen3_0.6b"))
    # the same decode shapes as the rollout's decode graphs run them: the weight's row exponents
    # (M <= 64) or exponents and digit planes (M 256 on sm_90's wgmma kernel) made once per weight
    # and passed in. Eager, the op checks them against the weight (a read and a sync); captured, the
    # caller vouches for them, so the graph ratio is the engine's decode step
    for model, (m, k, n), planes in (("qwen3_8b", (1, 4096, 4096), False), ("qwen3_8b", (8, 4096, 12288), False),
                                     ("qwen3_8b", (64, 4096, 4096), False), ("qwen3_0.6b", (256, 2048, 1024), True),
                                     ("qwen3_0.6b", (256, 3072, 1024), True)):
        def make_given(device: torch.device, m: int = m, k: int = k, n: int = n,
                       planes: bool = planes) -> dict[str, Any]:
            weight = _bench_tensor("w", n, k, 0.02, device)
            ew, digits = reference_weight_digits(weight) if planes else (_exponents(weight), None)
            given = {"weight_exponents": ew} | ({"weight_digits": digits} if planes else {})
            return {"x": _bench_tensor("x", m, k, 1.0, device), "weight": weight} | given

        cases.append(BenchCase(name=f"{model}_m{m}_k{k}_n{n}_bf16_{'planes' if planes else 'exponents'}_given",
                               make=make_given, native=_native_given, flops=2.0 * m * n * k,
                               bytes=2.0 * (m * k + n * k + m * n), sizes=("large",), graph=True))
    return cases


def _native_given(x: torch.Tensor, weight: torch.Tensor, weight_exponents: torch.Tensor,
                  weight_digits: torch.Tensor | None = None) -> torch.Tensor:
    """torch's linear; the weight's exponents and planes are rlkernel's alone (nothing to pass)."""
    return torch.nn.functional.linear(x, weight)
