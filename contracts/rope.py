"""Rotary position embedding (NeoX rotate-half layout) with correctly rounded host tables.

The cos/sin tables are configuration constants (R8): computed once on the host by
:func:`rope_tables`, correctly rounded to fp32 from the exact real values, then copied to
the device, so every backend reads the same table bits. The rotation itself is two fp32
products and one add or subtract per output element, each rounded (no FMA).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import round_to
from rlkernel.contracts._gen import integers, normal, seed_of, special_values

if TYPE_CHECKING:
    import mpmath

#: Positions must lie in [0, MAX_POSITION).
MAX_POSITION = 1 << 24

CONTRACT = Contract(
    name="rope",
    version=1,
    summary="y1 = RN(RN(x1*c) - RN(x2*s)), y2 = RN(RN(x2*c) + RN(x1*s)), c/s = RN32(cos/sin(p * theta**(-2i/D)))",
    invariances=("batch", "permutation", "chunking", "prefill_decode", "repeat"),
    dtypes={"x": (torch.bfloat16, torch.float16, torch.float32), "positions": (torch.int64,)},
    # The table entries themselves (RN32 of the exact cos/sin, R8) are computed on the host by
    # rope_tables and handed to every backend, so no backend mutant can change them; the golden
    # hashes pin them through the outputs.
    parameters={
        "layout": "rotate-half (NeoX): x1 = x[..., :D/2] pairs with x2 = x[..., D/2:]",
        "rotation": "y1 = x1 c - x2 s, y2 = x2 c + x1 s (rotation by +p * theta**(-2i/D))",
        "product_rounding": "each of the four products rounded to fp32, then one rounded add/sub (no FMA)",
        "table_precision": "c, s used as fp32 table entries (not rounded to x's dtype)",
        "output_rounding": "y rounded to x's dtype, nearest even (overflow to inf)",
    },
)

# --------------------------------------------------------------------------- host tables
#
# Exact real value: cos(p * w_i), sin(p * w_i) with w_i = theta**(-2i/D), theta the exact
# binary64 value given. Fast path (float64, vectorised), then a correctness filter:
#
# 1. w_i / (2 pi) as a fixed-point integer W_i = RNE(w_i / (2 pi) * 2**90), from mpmath at
#    300 bits (D/2 values per table). W_i < 2**88 is held as three 30-bit limbs.
# 2. Turns: T = p * W_i mod 2**90, exact in int64 limb arithmetic (p < 2**24, so every limb
#    product is below 2**54). T * 2**-90 equals frac(p * w_i / (2 pi)) within
#    p * 2**-91 <= 2**-67 turns.
# 3. Octant reduction: n = round(T / 2**88) (quarter turns), y = T * 2**-90 - n / 4 in
#    [-1/8, 1/8], converted to float64 (relative error <= 2**-52), a = RN64(y * RN64(2 pi))
#    in [-pi/4, pi/4] (relative error <= 2**-51 in all, plus the 2**-64.3 absolute error of
#    step 2).
# 4. sin(a) and cos(a) by fixed Taylor polynomials in float64 (Horner in a**2; truncation
#    below 2**-70; evaluation error below 2**-49.5 relative: no libm, so the fast path is the
#    same on every host), then the quadrant n mod 4 picks +-sin or +-cos.
#
# Error bound of the fast value c64 against the exact real value:
#     |c64 - exact| <= B = 2**-48 * |c64| + 2**-63   (p > 0; p = 0 is exact: cos 1, sin +0)
# (2**-49.5 for the polynomial plus 2**-50.8 for the argument error, as |sin a| >= 0.9 |a| on
# [-pi/4, pi/4], rounded up; 2**-63 covers the absolute error of step 2.)
# An entry whose c64 lies farther than B from every midpoint between adjacent fp32 numbers
# rounds to the same fp32 as the exact value. The others (about 2**-23 of all entries) are
# recomputed with mpmath at 60 significant digits and rounded to fp32 by comparing with the
# exact midpoints (an entry within 1e-55 relative of a midpoint raises rather than guess; an
# exact tie is impossible for p > 0, the values being transcendental, and none has been seen).

_TURN_BITS = 90
_LIMB = 30
_LIMB_MASK = (1 << _LIMB) - 1
_BOUND_REL = 2.0**-48
_BOUND_ABS = 2.0**-63
_TWO_PI = 2.0 * math.pi  # RN64(2 pi)
_ROWS_PER_BLOCK = 1 << 13
#: Taylor coefficients in z = a**2: sin(a) = a * sum S_k z**k, cos(a) = sum C_k z**k.
_SIN_COEFFS = tuple((-1.0) ** k / math.factorial(2 * k + 1) for k in range(12))
_COS_COEFFS = tuple((-1.0) ** k / math.factorial(2 * k) for k in range(12))


def _check_table_args(max_position: int, head_dim: int, theta: float) -> None:
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"rope_tables: head_dim = {head_dim!r}; expected an even int >= 2")
    if isinstance(max_position, bool) or not isinstance(max_position, int) or not 0 <= max_position <= MAX_POSITION:
        raise ValueError(f"rope_tables: max_position = {max_position!r}; expected an int in [0, 2**24]")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not math.isfinite(theta) or theta <= 0:
        raise ValueError(f"rope_tables: theta = {theta!r}; expected a finite float > 0 (Qwen3 uses 1e6)")


def _mpmath():  # type: ignore[no-untyped-def]
    """mpmath, imported on first use so that only the tables need it."""
    try:
        import mpmath
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "rope tables are computed with mpmath (correct rounding of the entries near an fp32 midpoint); "
            "install it with `pip install mpmath`"
        ) from exc
    return mpmath


def _frequencies(head_dim: int, theta: float) -> list[mpmath.mpf]:
    """``w_i = theta**(-2i/D)`` for i < D/2, at 300 bits (theta's exact binary64 value)."""
    mpmath = _mpmath()
    with mpmath.workprec(300):
        t = mpmath.mpf(float(theta))
        return [t ** (mpmath.mpf(-2 * i) / head_dim) for i in range(head_dim // 2)]


def _turn_limbs(freqs: list[mpmath.mpf]) -> np.ndarray:
    """int64 [3, D/2]: limbs (low, mid, high) of ``W_i = RNE(w_i / (2 pi) * 2**90)``."""
    mpmath = _mpmath()
    limbs = np.zeros((3, len(freqs)), dtype=np.int64)
    with mpmath.workprec(300):
        scale = mpmath.mpf(2) ** _TURN_BITS / (2 * mpmath.pi)
        for i, w in enumerate(freqs):
            big = int(mpmath.nint(w * scale))
            for j in range(3):
                limbs[j, i] = (big >> (_LIMB * j)) & _LIMB_MASK
    return limbs


def _horner(z: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    acc = np.full_like(z, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * z + c
    return acc


def _fast(positions: np.ndarray, limbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 cos, sin for positions [P] x frequencies [D/2] (steps 2-4 above)."""
    p = positions.astype(np.int64)[:, None]
    a0, a1, a2 = p * limbs[0], p * limbs[1], (p * limbs[2]) & _LIMB_MASK
    low = a0 & _LIMB_MASK
    m = a1 + (a0 >> _LIMB)
    mid = m & _LIMB_MASK
    high = (a2 + (m >> _LIMB)) & _LIMB_MASK  # T = high * 2**60 + mid * 2**30 + low (mod 2**90)
    n = (high + (1 << 27)) >> 28  # round(T / 2**88): quarter turns, 0..4
    hy = high - (n << 28)  # T - n * 2**88 = hy * 2**60 + mid * 2**30 + low, hy in [-2**27, 2**27)
    y = ((hy << _LIMB) + mid).astype(np.float64) + low.astype(np.float64) * 2.0**-30
    a = (y * 2.0**-60) * _TWO_PI
    z = a * a
    s = a * _horner(z, _SIN_COEFFS)
    c = _horner(z, _COS_COEFFS)
    quadrant = n & 3
    cos = np.select([quadrant == 0, quadrant == 1, quadrant == 2], [c, -s, -c], s)
    sin = np.select([quadrant == 0, quadrant == 1, quadrant == 2], [s, c, -s], -c)
    return cos, sin


def _near_midpoint(v: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Bool: is float64 ``v`` within ``bound`` of a rounding midpoint between two fp32 numbers?"""
    r = v.astype(np.float32)
    up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
    dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
    rd = r.astype(np.float64)
    dist = np.minimum(np.abs(v - (rd + up) * 0.5), np.abs(v - (rd + dn) * 0.5))
    return dist <= bound


def _round_f32(val: mpmath.mpf) -> float:
    """``val`` (60 digits) correctly rounded to fp32, by comparison with the exact midpoints."""
    mpmath = _mpmath()
    r = np.float32(float(val))
    for _ in range(3):
        up = np.nextafter(r, np.float32(np.inf))
        dn = np.nextafter(r, np.float32(-np.inf))
        mid_up = (mpmath.mpf(float(r)) + mpmath.mpf(float(up))) / 2
        mid_dn = (mpmath.mpf(float(r)) + mpmath.mpf(float(dn))) / 2
        for mid in (mid_up, mid_dn):
            if abs(val - mid) <= abs(val) * mpmath.mpf(10) ** -55:
                raise RuntimeError(f"rope_tables: {val} is too close to an fp32 midpoint to round at 60 digits")
        if val > mid_up:
            r = up
        elif val < mid_dn:
            r = dn
        else:
            return float(r)
    raise RuntimeError(f"rope_tables: rounding {val} to fp32 did not converge")


def table_rows(positions: np.ndarray, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Correctly rounded fp32 ``cos(p * w_i)``, ``sin(p * w_i)`` for the given positions.

    Parameters
    ----------
    positions : ndarray of int, [P], values in [0, 2**24)
    head_dim : int, even
    theta : float, > 0

    Returns
    -------
    cos, sin : Tensor, float32, [P, head_dim // 2]
    """
    _check_table_args(0, head_dim, theta)
    positions = np.asarray(positions, dtype=np.int64).reshape(-1)
    if positions.size and (positions.min() < 0 or positions.max() >= MAX_POSITION):
        raise ValueError(f"rope_tables: positions must lie in [0, 2**24), got [{positions.min()}, {positions.max()}]")
    mpmath = _mpmath()
    freqs = _frequencies(head_dim, theta)
    limbs = _turn_limbs(freqs)
    cos32 = np.empty((positions.size, head_dim // 2), dtype=np.float32)
    sin32 = np.empty_like(cos32)
    for start in range(0, positions.size, _ROWS_PER_BLOCK):  # blocks bound the float64 temporaries
        block = positions[start:start + _ROWS_PER_BLOCK]
        cos64, sin64 = _fast(block, limbs)
        exact_zero = block == 0  # p = 0: cos = 1, sin = +0 exactly (the fast path gives these)
        for fast, out, fn in ((cos64, cos32, mpmath.cos), (sin64, sin32, mpmath.sin)):
            out[start:start + block.size] = fast.astype(np.float32)
            bound = _BOUND_REL * np.abs(fast) + _BOUND_ABS
            flagged = _near_midpoint(fast, bound) & ~exact_zero[:, None]
            for row, col in zip(*np.nonzero(flagged)):
                with mpmath.workdps(60):
                    val = fn(mpmath.mpf(int(block[row])) * freqs[col])
                out[start + row, col] = _round_f32(val)
    return torch.from_numpy(cos32), torch.from_numpy(sin32)


def rope_tables(max_position: int, head_dim: int, theta: float = 1e6) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cos/sin tables, each entry the exact real value correctly rounded to fp32 (R8).

    ``cos[p, i] = RN32(cos(p * theta**(-2i/head_dim)))``, ``sin[p, i] = RN32(sin(...))``

    Parameters
    ----------
    max_position : int
        Number of positions (rows), in [0, 2**24].
    head_dim : int
        Even head dimension D; the tables have D / 2 columns.
    theta : float
        RoPE base (Qwen3: 1e6), taken as its exact binary64 value; finite and > 0.

    Returns
    -------
    cos, sin : Tensor, float32, CPU, [max_position, head_dim // 2]

    Bitwise semantics
    -----------------
    Each entry is the exact real ``cos``/``sin`` of ``p * theta**(-2i/D)`` (real-number
    exponent ``-2i/D``, no intermediate rounding) rounded once to nearest-even fp32. It is
    computed by a float64 fast path with the proven error bound
    ``|c64 - exact| <= 2**-48 |c64| + 2**-63`` (the derivation is in this module's source);
    every entry within that bound of an fp32 rounding midpoint (about one in 2**23) is
    recomputed with mpmath at 60 significant digits. No libm is used on the fast path, so the
    table is the same on every host. Rows are independent: a longer table extends a shorter
    one without changing a bit. Contract ``rope`` version 1.
    """
    _check_table_args(max_position, head_dim, theta)
    return table_rows(np.arange(max_position, dtype=np.int64), head_dim, theta)


def table_rows_reference(positions: torch.Tensor, head_dim: int,
                         theta: float = 1e6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``positions`` of :func:`rope_tables` (the definition of the public ``rope_table_rows``).

    Parameters
    ----------
    positions : Tensor, int64 or int32, [T], values in [0, 2**24)
    head_dim : int, even
    theta : float, > 0

    Returns
    -------
    cos, sin : Tensor, float32, CPU, [T, head_dim // 2]
    """
    return table_rows(positions.to(torch.int64).numpy(), head_dim, theta)


# --------------------------------------------------------------------------- the op


def reference(x: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Rotate-half RoPE of each token at its position (the definition of ``rope``'s bits).

    ``y1 = RN(RN(x1 * c) - RN(x2 * s))``, ``y2 = RN(RN(x2 * c) + RN(x1 * s))``,
    ``c, s = cos[p], sin[p]`` from :func:`rope_tables`.

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [T, n_heads, D] or [T, D]
        Queries or keys of T tokens; D even. ``x1 = x[..., :D/2]``, ``x2 = x[..., D/2:]``
        (NeoX / Hugging Face rotate-half layout).
    positions : Tensor, int64, [T]
        Position of each token, in [0, 2**24). Any order, repeats allowed.
    theta : float
        RoPE base (Qwen3: 1e6), its exact binary64 value; finite and > 0.

    Returns
    -------
    Tensor, x's dtype, x's shape

    Bitwise semantics
    -----------------
    ``c = cos[p, i]``, ``s = sin[p, i]`` are the correctly rounded fp32 values of the exact
    ``cos``/``sin(p * theta**(-2i/D))`` (:func:`rope_tables`, R8: host-computed, identical
    on every device). With ``xf = fp32(x)``, per token, head and ``i < D/2``:
    ``y1 = RN32(RN32(x1 * c) - RN32(x2 * s))``, ``y2 = RN32(RN32(x2 * c) + RN32(x1 * s))``:
    two products and one add/sub, each rounded (no FMA), then ``RN_dtype``; NaN canonical.
    (Hugging Face's ``x * cos + rotate_half(x) * sin`` in the same layout, with fp32 tables
    and fp32 arithmetic.) Specials follow IEEE: at p = 0 (``c = 1``, ``s = +0``) an inf in
    the other half gives NaN (``inf * 0``), as in Hugging Face.

    Each output depends only on its own token's values and position: invariant under batch
    composition, permutation, chunking, and prefill vs decode; repeat.

    Contract ``rope`` version 1.
    """
    if x.dim() not in (2, 3):
        raise ValueError(f"rope: x has shape {tuple(x.shape)}; expected [T, n_heads, D] or [T, D]")
    head_dim = x.shape[-1]
    half = head_dim // 2
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype)
    pos = positions.to(torch.int64)
    unique, inverse = torch.unique(pos, return_inverse=True)
    cos_u, sin_u = table_rows(unique.numpy(), head_dim, theta)
    c, s = cos_u[inverse], sin_u[inverse]  # [T, D/2]
    if x.dim() == 3:
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    xf = x.to(torch.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    return round_to(torch.cat([y1, y2], dim=-1), x.dtype)


#: The reference of each op whose cases live here: the rotation and the public tables (R8:
#: the product computes them with its own code, so conformance must pin their bits).
REFERENCES = {"rope": reference, "rope_tables": rope_tables, "rope_table_rows": table_rows_reference}

# --------------------------------------------------------------------------- cases

#: Qwen3's max_position_embeddings (and the golden cases' position range).
QWEN3_MAX_POSITION = 40960


def _inputs(case: str, shape: tuple[int, ...], dtype: torch.dtype, positions: torch.Tensor,
            theta: float = 1e6, std: float = 1.0) -> dict[str, Any]:
    x = normal(seed_of("rope", case, "x"), shape, std=std, dtype=dtype)
    return {"x": x, "positions": positions, "theta": theta}


def _random_positions(case: str, count: int, high: int = QWEN3_MAX_POSITION) -> torch.Tensor:
    return integers(seed_of("rope", case, "positions"), (count,), 0, high)


#: Positions holding the entries nearest an fp32 rounding midpoint (tools/find_rope_midpoints.py;
#: all within 3e-9 fp32 ulp of one, several exactly on it in float64). No float64 evaluation can
#: round them: both table implementations must take their slow paths.
MIDPOINT_HARD = {
    (64, 10000.0): (1599813, 977267, 2230552, 2127657, 1752384, 523358, 2747831, 3758808),
    (128, 1e6): (2104169, 2913351, 4801219, 8690327, 15998130, 1102865, 1337278, 2536476, 4578025, 4701725),
}


def _table_cases() -> list[Case]:
    """The host tables (R8) as the product computes them: ``rope_tables`` and ``rope_table_rows``."""

    def tables(name: str, rows: int, head_dim: int, theta: float, full_only: bool = False) -> Case:
        return Case(name, "golden", lambda: {"max_position": rows, "head_dim": head_dim, "theta": theta},
                    op="rope_tables", full_only=full_only)

    def rows(name: str, positions: Any, head_dim: int, theta: float) -> Case:
        return Case(name, "golden", lambda: {"positions": positions(), "head_dim": head_dim, "theta": theta},
                    op="rope_table_rows")

    top = MAX_POSITION
    return [
        tables("tables_qwen3_d128_4096", 4096, 128, 1e6),
        tables("tables_d64_theta1e4_1024", 1024, 64, 10000.0),
        tables("tables_d256_theta5e5_2048", 2048, 256, 5e5),
        tables("tables_d14_300", 300, 14, 1e6),
        tables("tables_d2_theta1_64", 64, 2, 1.0),
        tables("tables_d8_theta0p5_512", 512, 8, 0.5),
        tables("tables_qwen3_d128_131072", 1 << 17, 128, 1e6, full_only=True),
        rows("rows_top_of_range_d128", lambda: torch.arange(top - 512, top), 128, 1e6),
        rows("rows_random_d128", lambda: integers(seed_of("rope", "rows_random_d128"), (256,), 0, top), 128, 1e6),
        rows("rows_random_d64_theta1e4",
             lambda: integers(seed_of("rope", "rows_random_d64_theta1e4"), (256,), 0, top), 64, 10000.0),
        rows("rows_midpoint_hard_d64_theta1e4", lambda: torch.tensor(MIDPOINT_HARD[(64, 10000.0)]), 64, 10000.0),
        rows("rows_midpoint_hard_d128", lambda: torch.tensor(MIDPOINT_HARD[(128, 1e6)]), 128, 1e6),
        rows("rows_unsorted_repeated_int32",
             lambda: torch.tensor([5, 0, top - 1, 5, 1, top - 2, 0, 40959], dtype=torch.int32), 128, 1e6),
    ]


def golden_cases() -> list[Case]:
    """Qwen3 heads (32 query / 8 KV heads, head_dim 128, theta 1e6) and smaller shapes; the host
    tables at Qwen3's and other configurations, near 2**24 and at midpoint-hard entries."""
    return _table_cases() + [
        Case("q_bf16", "golden",
             lambda: _inputs("q_bf16", (7, 32, 128), torch.bfloat16, _random_positions("q_bf16", 7))),
        Case("k_fp16", "golden",
             lambda: _inputs("k_fp16", (5, 8, 128), torch.float16, torch.arange(1000, 1005))),
        Case("q_fp32_theta1e4", "golden",
             lambda: _inputs("q_fp32_theta1e4", (6, 4, 64), torch.float32,
                             _random_positions("q_fp32_theta1e4", 6, 4096), theta=10000.0)),
        Case("prefill64_k_bf16", "golden",
             lambda: _inputs("prefill64_k_bf16", (64, 8, 128), torch.bfloat16, torch.arange(64))),
        Case("two_d_bf16", "golden",
             lambda: _inputs("two_d_bf16", (9, 128), torch.bfloat16, torch.arange(9))),
        Case("d7x2_fp16", "golden",
             lambda: _inputs("d7x2_fp16", (4, 3, 14), torch.float16, _random_positions("d7x2_fp16", 4))),
        Case("prefill2048_q_bf16", "golden",
             lambda: _inputs("prefill2048_q_bf16", (2048, 32, 128), torch.bfloat16, torch.arange(2048)),
             full_only=True),
        Case("long_context_bf16", "golden",
             lambda: _inputs("long_context_bf16", (16, 8, 128), torch.bfloat16,
                             _random_positions("long_context_bf16", 16, 1 << 17)),
             full_only=True),
    ]


def _specials(dtype: torch.dtype) -> dict[str, Any]:
    """Every special value in each half of a head, at position 0 (c = 1, s = 0) and others."""
    sv = special_values(dtype)
    n, head_dim = sv.numel(), 16
    x = normal(seed_of("rope", "specials", dtype), (2 * n, 1, head_dim), dtype=dtype)
    for i in range(n):
        x[i, 0, i % 8] = sv[i]  # first half
        x[n + i, 0, 8 + (i % 8)] = sv[i]  # second half
    positions = torch.tensor([0, 1, 2, 3, 7, 100, 40959, 0, 5, 12345, 1, 0] * 2)
    return {"x": x, "positions": positions, "theta": 1e6}


def _ties_bf16() -> dict[str, Any]:
    """Powers of two and bf16 grid points: at p = 0 y = x exactly; elsewhere sums near ties."""
    head_dim = 32
    ks = torch.arange(head_dim, dtype=torch.float64)
    rows = [torch.pow(2.0, ks - 16.0), 1.0 + ks / 128.0, -(1.0 + ks / 256.0), torch.full((head_dim,), 3.0)]
    x = torch.stack(rows).to(torch.bfloat16).reshape(4, 1, head_dim).repeat(3, 2, 1)
    positions = torch.tensor([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    return {"x": x, "positions": positions, "theta": 1e6}


def _noncontiguous() -> dict[str, Any]:
    """q heads viewed out of a fused qkv projection [T, (32 + 8 + 8) * 128] (row stride 6144)."""
    qkv = normal(seed_of("rope", "noncontiguous"), (5, 48 * 128), dtype=torch.bfloat16)
    return {"x": qkv[:, : 32 * 128].view(5, 32, 128), "positions": torch.tensor([9, 3, 3, 40000, 0]), "theta": 1e6}


def adversarial_cases() -> list[Case]:
    """Specials, ties, strided views, smallest heads, repeated/unsorted positions, empty batch."""
    return [
        Case("specials_bf16", "adversarial", lambda: _specials(torch.bfloat16)),
        Case("specials_fp16", "adversarial", lambda: _specials(torch.float16)),
        Case("specials_fp32", "adversarial", lambda: _specials(torch.float32)),
        Case("ties_bf16", "adversarial", _ties_bf16),
        Case("noncontiguous_qkv_bf16", "adversarial", _noncontiguous),
        Case("head_dim2_fp32", "adversarial",
             lambda: _inputs("head_dim2_fp32", (3, 2, 2), torch.float32, torch.tensor([0, 1, 40000]))),
        Case("single_token_fp16", "adversarial",
             lambda: _inputs("single_token_fp16", (1, 1, 6), torch.float16, torch.tensor([31]))),
        Case("repeated_unsorted_positions_bf16", "adversarial",
             lambda: _inputs("repeated_unsorted_positions_bf16", (8, 4, 128), torch.bfloat16,
                             torch.tensor([5, 5, 0, 65535, 5, 17, 0, 65535]))),
        Case("large_positions_fp32", "adversarial",
             lambda: _inputs("large_positions_fp32", (4, 2, 128), torch.float32,
                             torch.tensor([65535, 65534, 32768, 40959]))),
        Case("theta_one_bf16", "adversarial",
             lambda: _inputs("theta_one_bf16", (3, 2, 8), torch.bfloat16, torch.tensor([0, 1, 2]), theta=1.0)),
        Case("huge_values_fp16", "adversarial",
             lambda: _inputs("huge_values_fp16", (4, 2, 64), torch.float16, torch.arange(4) * 997, std=3.0e4)),
        Case("subnormal_values_bf16", "adversarial",
             lambda: _inputs("subnormal_values_bf16", (4, 2, 64), torch.bfloat16, torch.arange(4) * 31,
                             std=2.0**-130)),
        Case("empty_batch_bf16", "adversarial",
             lambda: {"x": torch.empty(0, 8, 128, dtype=torch.bfloat16),
                      "positions": torch.empty(0, dtype=torch.int64), "theta": 1e6}),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """Packed sequences, permuted tokens, chunked prefill, prefill + decode, repeated runs."""
    heads, head_dim, theta = 8, 128, 1e6

    def seq(case: str, count: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = normal(seed_of("rope", case), (count, heads, head_dim), dtype=torch.bfloat16)
        return x, torch.arange(start, start + count)

    def batch(run: Any) -> tuple[Any, Any]:
        xa, pa = seq("inv_batch_a", 5, 100)
        xb, pb = seq("inv_batch_b", 9, 0)
        xc, pc = seq("inv_batch_c", 3, 7000)
        alone = run("rope", x=xa, positions=pa, theta=theta)
        packed = run("rope", x=torch.cat([xb, xa, xc]), positions=torch.cat([pb, pa, pc]), theta=theta)
        first = run("rope", x=torch.cat([xa, xc]), positions=torch.cat([pa, pc]), theta=theta)
        return [alone, alone], [packed[9:14], first[:5]]

    def permutation(run: Any) -> tuple[Any, Any]:
        x, pos = seq("inv_perm", 9, 40)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run("rope", x=x, positions=pos, theta=theta)[perm], run("rope", x=x[perm], positions=pos[perm],
                                                                       theta=theta)

    def chunking(run: Any) -> tuple[Any, Any]:
        x, pos = seq("inv_chunk", 37, 0)
        whole = run("rope", x=x, positions=pos, theta=theta)
        bounds = [0, 3, 16, 17, 37]
        parts = [run("rope", x=x[a:b], positions=pos[a:b], theta=theta) for a, b in zip(bounds, bounds[1:])]
        return whole, torch.cat(parts)

    def prefill_decode(run: Any) -> tuple[Any, Any]:
        x, pos = seq("inv_decode", 20, 0)
        whole = run("rope", x=x, positions=pos, theta=theta)
        steps = [run("rope", x=x[:16], positions=pos[:16], theta=theta)]
        steps += [run("rope", x=x[t:t + 1], positions=pos[t:t + 1], theta=theta) for t in range(16, 20)]
        return whole, torch.cat(steps)

    def repeat(run: Any) -> tuple[Any, Any]:
        x, pos = seq("inv_repeat", 33, 500)
        first = run("rope", x=x, positions=pos, theta=theta)
        return [first, first], [run("rope", x=x, positions=pos, theta=theta) for _ in range(2)]

    return [
        InvarianceCase("packed_sequences", "batch", batch),
        InvarianceCase("permuted_tokens", "permutation", permutation),
        InvarianceCase("chunked_prefill", "chunking", chunking),
        InvarianceCase("prefill_then_decode", "prefill_decode", prefill_decode),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def _hf_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Hugging Face Qwen3: ``Qwen3RotaryEmbedding`` (fp32 angles, cos/sin cast to x's dtype)
    and ``apply_rotary_pos_emb`` (``x * cos + rotate_half(x) * sin`` in x's dtype)."""
    head_dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=x.device).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    if x.dim() == 3:
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def bench_cases() -> list[BenchCase]:
    """Query heads [T, H, 128] bf16, positions 0..T-1. large: Qwen3-8B (H = 32), T in 1, 2048, 8192;
    small: Qwen3-0.6B (H = 16), T in 1, 64."""
    head_dim = 128
    cases = []
    shapes = [("qwen3_8b", 32, "large", t) for t in (1, 2048, 8192)]
    shapes += [("qwen3_0.6b", 16, "small", t) for t in (1, 64)]
    for model, heads, size, tokens in shapes:

        def make(device: torch.device, t: int = tokens, heads: int = heads) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(t)
            x = torch.randn(t, heads, head_dim, generator=g, device=device).to(torch.bfloat16)
            return {"x": x, "positions": torch.arange(t, device=device), "theta": 1e6}

        elems = tokens * heads * head_dim
        cases.append(BenchCase(
            name=f"{model}_q_T{tokens}_bf16",
            make=make,
            native=_hf_rope,
            flops=3.0 * elems,  # two products and one add per output element
            bytes=2.0 * 2 * elems + 8.0 * tokens + 2 * 4.0 * tokens * head_dim // 2,  # x, y, positions, table rows
            sizes=(size,),
            graph=tokens <= 64,
        ))
    return cases
