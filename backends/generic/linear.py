"""Device-generic ``linear`` and its tensor-parallel sub-ops (contract ``linear`` v2, P5).

Independent of the reference: exponents and grids come from the fp32 bit patterns, the exact
integer product ``C = X @ Wt.T`` (x rows on 28-bit grids, weight rows on 21-bit grids) is
formed one of two ways, and the single rounding of ``C * 2**(ex + ew - 47)`` to the output
dtype is integer/bit arithmetic.

Paths for ``C`` (both exact, so both give the contract's bits; the one taken is reported
through :func:`rlkernel.dispatch.note_kernel`):

- ``f64`` (CPU): x's grid values split in two base-2**14 halves (``X = 2**14 Xh + Xl``, both
  at most 2**13 in magnitude) against the 21-bit weight grid in float64 GEMMs (``|Xh Wt| <=
  2**33``: for K <= 2**16 every partial sum is an integer below 2**53, exact in any BLAS
  order), combined in int64. Two GEMMs instead of twelve digit GEMMs.
- ``digits`` (any other device): balanced base-128 digits (four for x, three for the weight),
  made with exact fp32 arithmetic (power-of-two scalings and round-half-even), and twelve fp32
  digit GEMMs over K-chunks of 4096 (every partial sum an integer below 2**24), combined in
  int64 with shifts — exact on fp32, tf32, bf16 and fp16 matrix units.

Rows of x are processed in blocks so that the temporary grids stay small.
"""

from __future__ import annotations

import torch

from rlkernel import dispatch
from rlkernel.backends.generic._exact.digits import digit_planes, int_product
from rlkernel.backends.generic._exact.fp32 import cast_out, exponent, int64_to_float

#: grid magnitude bits of x rows (|X| <= 2**27) and weight rows (|Wt| <= 2**20)
X_BITS = 27
W_BITS = 20
#: base-128 digits per operand on the digits path
X_DIGITS, W_DIGITS = 4, 3
SENTINEL = 1 << 20
#: exponent of an all-zero row or empty K-slice: below every real exponent (MAX over shards ignores it)
ZERO_EXP = -149
#: x's float64 halves: X = 2**HALF_BITS * Xh + Xl
HALF_BITS = 14
#: elements of x per row block (a block's float64 grid is at most 64 MiB)
BLOCK_ELEMENTS = 1 << 23
#: ``linear_weight_digits``: a digit below the top one is ``((v + DIGIT_OFFSET) & 127) - DIGIT_OFFSET``,
#: in [-64, 63]
DIGIT_OFFSET = 64


def _path(device: torch.device) -> str:
    return "f64" if device.type == "cpu" else "digits"


def _exponents(t: torch.Tensor) -> torch.Tensor:
    """Row exponents of a 2-D tensor: expo(max finite |t|); ZERO_EXP for all-zero rows (and K = 0),
    SENTINEL for rows holding NaN/inf."""
    rows = t.shape[0]
    if t.shape[1] == 0:
        return torch.full((rows,), ZERO_EXP, dtype=torch.int64, device=t.device)
    finite = torch.isfinite(t)
    mag = torch.where(finite, t, torch.zeros_like(t)).abs().amax(dim=1)
    e = exponent(mag)
    e = torch.where(mag == 0, torch.full_like(e, ZERO_EXP), e)
    return torch.where(finite.all(dim=1), e, torch.full_like(e, SENTINEL))


def _round_grid(v: torch.Tensor) -> torch.Tensor:
    """The grid rounding of P5: to the nearest integer, ties to even (``v`` holds exact scaled values)."""
    return torch.round(v)


def _pow2_f64(k: torch.Tensor) -> torch.Tensor:
    """float64 ``2**k`` for int64 k in [-1022, 1023], from the exponent bits."""
    return ((k + 1023) << 52).view(torch.float64)


def _grid_f64(t: torch.Tensor, e: torch.Tensor, bits: int) -> torch.Tensor:
    """``RNE(t * 2**(bits - e))`` per row as integer-valued float64 (non-finite entries and SENTINEL rows -> 0)."""
    live = e != SENTINEL
    scale = _pow2_f64(torch.where(live, bits - e, torch.zeros_like(e)))  # bits - e in [-108, 176]: exact
    t64 = torch.where(torch.isfinite(t), t, torch.zeros_like(t)).to(torch.float64)
    g = _round_grid(t64 * scale.unsqueeze(1))  # exact product (<= 24 significant bits), then RNE
    return torch.where(live.unsqueeze(1), g, torch.zeros_like(g))


def _digits_f32(t: torch.Tensor, e: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """fp32 [count, R, K] balanced base-128 digits of the rows' grids (SENTINEL rows -> 0)."""
    live = e != SENTINEL
    planes = digit_planes(t, torch.where(live, e, torch.zeros_like(e)), bits, count)
    return torch.where(live.unsqueeze(-1), planes, torch.zeros_like(planes))


def _product_f64(xg: torch.Tensor, wg: torch.Tensor) -> torch.Tensor:
    """Exact int64 ``X @ Wt.T`` for float64 grids (|X| <= 2**27, |Wt| <= 2**20, K <= 2**16).

    ``Xh = RNE(X / 2**14)`` and ``Xl = X - 2**14 Xh`` are exact integers of magnitude <= 2**13
    (+1), so each float64 GEMM below sums products below 2**34: exact for K <= 2**18.
    """
    xh = torch.round(xg * 2.0**-HALF_BITS)
    xl = xg - xh * 2.0**HALF_BITS
    m = xg.shape[0]
    both = (torch.cat((xh, xl)) @ wg.T).to(torch.int64)
    return (both[:m] << HALF_BITS) + both[m:]


def partial_sum(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                path: str | None = None) -> torch.Tensor:
    """Exact int64 ``C = X @ Wt.T`` for x [M, K], weight [N, K] on the grids ``ex`` [M], ``ew`` [N].

    ``path`` forces ``"f64"`` or ``"digits"`` (default: by device). The caller guarantees
    ``ex``/``ew`` are at least each row's own exponent (so ``|X| <= 2**27``, ``|Wt| <= 2**20``).
    """
    m, k = x.shape
    n = weight.shape[0]
    path = path or _path(x.device)
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=torch.int64, device=x.device)
    rows = max(1, BLOCK_ELEMENTS // k)
    out = []
    if path == "f64":
        wg = _grid_f64(weight, ew, W_BITS)
        for start in range(0, m, rows):
            stop = min(start + rows, m)
            out.append(_product_f64(_grid_f64(x[start:stop], ex[start:stop], X_BITS), wg))
    elif path == "digits":
        wd = _digits_f32(weight, ew, W_BITS, W_DIGITS)
        for start in range(0, m, rows):
            stop = min(start + rows, m)
            out.append(int_product(_digits_f32(x[start:stop], ex[start:stop], X_BITS, X_DIGITS), wd))
    else:
        raise ValueError(f"linear: unknown product path {path!r}; expected 'f64' or 'digits'")
    return out[0] if len(out) == 1 else torch.cat(out, dim=0)


def finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None,
           out_dtype: torch.dtype) -> torch.Tensor:
    """``RN_out(acc * 2**(ex + ew - 47))`` in one rounding; with a bias ``RN_out(RN32(RN32(...) + bias))``;
    NaN where ex or ew is SENTINEL."""
    bad_x, bad_w = ex == SENTINEL, ew == SENTINEL
    ex0 = torch.where(bad_x, torch.zeros_like(ex), ex)
    ew0 = torch.where(bad_w, torch.zeros_like(ew), ew)
    k = ex0.unsqueeze(1) + ew0.unsqueeze(0) - X_BITS - W_BITS
    bad = bad_x.unsqueeze(1) | bad_w.unsqueeze(0)
    if bias is None:
        y = int64_to_float(acc, k, out_dtype)
        return cast_out(torch.where(bad, torch.full_like(y, float("nan")), y), out_dtype)
    y = int64_to_float(acc, k, torch.float32)
    y = torch.where(bad, torch.full_like(y, float("nan")), y) + bias.to(torch.float32)  # one IEEE fp32 addition
    return cast_out(y, out_dtype)


# ----------------------------------------------------------------------------- kernels


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, ew: torch.Tensor | None = None,
           wd: torch.Tensor | None = None) -> torch.Tensor:
    """Kernel ``linear``: x [M, K], weight [N, K] (bf16/fp16), bias [N] or None -> [M, N] out_dtype.

    Parameters
    ----------
    ew : Tensor, int64, [N], optional
        The weight's row exponents (``linear_exponents``), made beforehand: the public op passes
        them only when its caller gave ``weight_exponents`` (checked equal to the weight's own,
        or vouched for by a CUDA-graph capture). None: compute them here.
    wd : Tensor, int8, [3, N, K], optional
        The weight's digits (``linear_weight_digits``), given with ``ew``. Not read: this
        backend's products take the weight's grids from the weight itself (the same integers).
    """
    ex = _exponents(x)
    ew = _exponents(weight) if ew is None else ew
    path = _path(x.device)
    dispatch.note_kernel(path)
    acc = partial_sum(x, weight, ex, ew, path)
    return finish(acc, ex, ew, bias, out_dtype or x.dtype)


def linear_exponents(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``linear_exponents``: (ex int64 [M], ew int64 [N]), SENTINEL for non-finite rows."""
    return _exponents(x), _exponents(weight)


def linear_weight_digits(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``linear_weight_digits``: (ew int64 [N], digits int8 [3, N, K]) of weight [N, K].

    The 21-bit grid integers (exact in fp32: at most 11 significant bits, ``|v| <= 2**20``; as the
    digits path makes them), as int32, split low digit first with integer masks and shifts:
    ``d = ((v + 64) & 127) - 64``, ``v = (v - d) >> 7``; the last ``v`` is the top digit. SENTINEL
    rows give zeros.
    """
    ew = _exponents(weight)
    v = _digits_f32(weight, ew, W_BITS, 1)[0].to(torch.int32)
    planes = []
    for _ in range(W_DIGITS - 1):
        d = ((v + DIGIT_OFFSET) & 127) - DIGIT_OFFSET
        planes.append(d)
        v = (v - d) >> 7
    planes.append(v)
    return ew, torch.stack(planes).to(torch.int8)


def linear_partial(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """Kernel ``linear_partial``: exact int64 [M, N] partial sums on the grids ``ex`` [M], ``ew`` [N]."""
    path = _path(x.device)
    dispatch.note_kernel(path)
    return partial_sum(x, weight, ex, ew, path)


def linear_finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Kernel ``linear_finish``: acc int64 [M, N], ex [M], ew [N] -> [M, N] out_dtype."""
    return finish(acc, ex, ew, bias, out_dtype)
