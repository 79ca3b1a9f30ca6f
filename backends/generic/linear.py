"""Device-generic ``linear`` and its tensor-parallel sub-ops (contract ``linear`` v1, P5).

Independent of the reference: exponents and grids come from the fp32 bit patterns, the exact
integer product ``C = X @ Wt.T`` is formed one of two ways, and int64 -> fp32 rounding and the
power-of-two scaling are integer/bit arithmetic.

Paths for ``C`` (both exact, so both give the contract's bits; the one taken is reported
through :func:`rlkernel.dispatch.note_kernel`):

- ``f64`` (CPU): the 21-bit grid values themselves in float64 GEMMs over K-chunks of 8192
  (``|X Wt| <= 2**40``, so every partial sum is an integer of magnitude <= 2**53: exact in
  any BLAS order), accumulated in int64. One GEMM instead of nine digit GEMMs.
- ``digits`` (any other device): three balanced base-128 digits per operand, made with exact
  fp32 arithmetic (power-of-two scalings and round-half-even), and nine fp32 digit GEMMs over
  K-chunks of 4096 (every partial sum an integer below 2**24), combined in int64 with shifts —
  exact on fp32, tf32, bf16 and fp16 matrix units.

Rows of x are processed in blocks so that the temporary grids stay small.
"""

from __future__ import annotations

import torch

from rlkernel import dispatch
from rlkernel.backends.generic._exact.digits import int_product
from rlkernel.backends.generic._exact.fp32 import cast_out, exponent, int64_to_f32, pow2_f32, scale_pow2

GRID = 20
SENTINEL = 1 << 20
#: exponent of an all-zero row or empty K-slice: below every real exponent (MAX over shards ignores it)
ZERO_EXP = -149
F64_K_CHUNK = 1 << 13
#: elements of x per row block (a block's float64 grid is at most 64 MiB)
BLOCK_ELEMENTS = 1 << 23


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


def _grid_f64(t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """``RNE(t * 2**(20 - e))`` per row as integer-valued float64 (non-finite entries and SENTINEL rows -> 0)."""
    live = e != SENTINEL
    scale = _pow2_f64(torch.where(live, GRID - e, torch.zeros_like(e)))  # 20 - e in [-108, 169]: exact
    t64 = torch.where(torch.isfinite(t), t, torch.zeros_like(t)).to(torch.float64)
    g = _round_grid(t64 * scale.unsqueeze(1))  # exact product (<= 24 significant bits), then RNE
    return torch.where(live.unsqueeze(1), g, torch.zeros_like(g))


def _digits_f32(t: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """fp32 [3, R, K]: balanced base-128 digits (each in [-64, 64]) of ``g = RNE(t * 2**(20 - e))``.

    Every step is exact in fp32. ``t * 2**a * 2**b`` (a + b = 20 - e, both in [-54, 85]) is
    exact whenever the scaled value can round to a nonzero grid integer (a bf16/fp16 value has at
    most 11 significant bits and the intermediate is then normal); values that underflow in the
    first or second step are below 2**-41 and round to 0 either way. Then ``g = d0 + 128 d1 +
    128**2 d2`` with ``q1 = RNE(g / 128)``, ``d0 = g - 128 q1``, ``d2 = RNE(q1 / 128)``,
    ``d1 = q1 - 128 d2`` (scalings by 2**-7 are exact multiplications).
    """
    live = e != SENTINEL
    s = torch.where(live, GRID - e, torch.zeros_like(e))
    a = torch.div(s, 2, rounding_mode="floor")
    b = s - a
    tf = torch.where(torch.isfinite(t), t, torch.zeros_like(t)).to(torch.float32)
    g = _round_grid((tf * pow2_f32(a).unsqueeze(1)) * pow2_f32(b).unsqueeze(1))
    g = torch.where(live.unsqueeze(1), g, torch.zeros_like(g))
    q1 = torch.round(g * 2.0**-7)
    d0 = g - q1 * 128.0
    d2 = torch.round(q1 * 2.0**-7)
    d1 = q1 - d2 * 128.0
    return torch.stack((d0, d1, d2))


def _product_f64(xg: torch.Tensor, wg: torch.Tensor) -> torch.Tensor:
    k = xg.shape[1]
    if k <= F64_K_CHUNK:
        return (xg @ wg.T).to(torch.int64)
    acc = torch.zeros((xg.shape[0], wg.shape[0]), dtype=torch.int64, device=xg.device)
    for start in range(0, k, F64_K_CHUNK):
        stop = min(start + F64_K_CHUNK, k)
        acc += (xg[:, start:stop] @ wg[:, start:stop].T).to(torch.int64)
    return acc


def partial_sum(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                path: str | None = None) -> torch.Tensor:
    """Exact int64 ``C = X @ Wt.T`` for x [M, K], weight [N, K] on the grids ``ex`` [M], ``ew`` [N].

    ``path`` forces ``"f64"`` or ``"digits"`` (default: by device). The caller guarantees
    ``ex``/``ew`` are at least each row's own exponent (so ``|X|, |Wt| <= 2**20``).
    """
    m, k = x.shape
    n = weight.shape[0]
    path = path or _path(x.device)
    if m == 0 or n == 0 or k == 0:
        return torch.zeros((m, n), dtype=torch.int64, device=x.device)
    rows = max(1, BLOCK_ELEMENTS // k)
    out = []
    if path == "f64":
        wg = _grid_f64(weight, ew)
        for start in range(0, m, rows):
            stop = min(start + rows, m)
            out.append(_product_f64(_grid_f64(x[start:stop], ex[start:stop]), wg))
    elif path == "digits":
        wd = _digits_f32(weight, ew)
        for start in range(0, m, rows):
            stop = min(start + rows, m)
            out.append(int_product(_digits_f32(x[start:stop], ex[start:stop]), wd))
    else:
        raise ValueError(f"linear: unknown product path {path!r}; expected 'f64' or 'digits'")
    return out[0] if len(out) == 1 else torch.cat(out, dim=0)


def _ldexp(y: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """P2 ``ldexp_c(y, k)`` for integer-valued fp32 y (|y| < 2**63) and any int64 k.

    ``scale_pow2`` builds its two factors from exponent bits, valid for k in [-252, 254]. Outside
    that range the result is already decided: for k < -252, ``|y 2**k| < 2**-189`` rounds to
    +-0 (the sign of y) exactly as at k = -252; for k > 254 any nonzero integer y overflows to
    +-inf exactly as at k = 254. So clamping k keeps the bits of the definition.
    """
    return scale_pow2(y, k.clamp(min=-252, max=254))


def finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None,
           out_dtype: torch.dtype) -> torch.Tensor:
    """``cast(RN32(ldexp_c(RN32(acc), ex + ew - 40) + bias))``, NaN where ex or ew is SENTINEL."""
    bad_x, bad_w = ex == SENTINEL, ew == SENTINEL
    ex0 = torch.where(bad_x, torch.zeros_like(ex), ex)
    ew0 = torch.where(bad_w, torch.zeros_like(ew), ew)
    y = _ldexp(int64_to_f32(acc), ex0.unsqueeze(1) + ew0.unsqueeze(0) - 2 * GRID)
    y = torch.where(bad_x.unsqueeze(1) | bad_w.unsqueeze(0), torch.full_like(y, float("nan")), y)
    if bias is not None:
        y = y + bias.to(torch.float32)  # one IEEE fp32 addition
    return cast_out(y, out_dtype)


# ----------------------------------------------------------------------------- kernels


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Kernel ``linear``: x [M, K], weight [N, K] (bf16/fp16), bias [N] or None -> [M, N] out_dtype."""
    ex, ew = _exponents(x), _exponents(weight)
    path = _path(x.device)
    dispatch.note_kernel(path)
    acc = partial_sum(x, weight, ex, ew, path)
    return finish(acc, ex, ew, bias, out_dtype or x.dtype)


def linear_exponents(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``linear_exponents``: (ex int64 [M], ew int64 [N]), SENTINEL for non-finite rows."""
    return _exponents(x), _exponents(weight)


def linear_partial(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """Kernel ``linear_partial``: exact int64 [M, N] partial sums on the grids ``ex`` [M], ``ew`` [N]."""
    path = _path(x.device)
    dispatch.note_kernel(path)
    return partial_sum(x, weight, ex, ew, path)


def linear_finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Kernel ``linear_finish``: acc int64 [M, N], ex [M], ew [N] -> [M, N] out_dtype."""
    return finish(acc, ex, ew, bias, out_dtype)
