"""``rlkernel.ops.rope``, ``rope_tables`` and ``rope_table_rows``: bitwise-reproducible rotary
embedding (contract ``rope`` v1).

The cos/sin tables are host constants (R8), every entry the exact value correctly rounded to
fp32, computed by the product's own implementation (:mod:`rlkernel.ops._rope_tables`, written
independently of the contract's; conformance pins both to the same bits) and cached per
``(head_dim, theta, device)``, grown on demand to the largest position seen; rows never
change when a table grows, so the cache cannot change a bit.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from rlkernel import _validate as v
from rlkernel import dispatch
from rlkernel.ops._rope_tables import MAX_POSITION, table_rows

__all__ = ["MAX_POSITION", "RopeFunction", "clear_table_cache", "rope", "rope_backward", "rope_table_rows",
           "rope_tables"]
#: Smallest number of rows a cached table is built with.
MIN_TABLE_ROWS = 4096
#: Largest growth step of a cached table (rows); below it a table doubles.
MAX_TABLE_GROWTH = 1 << 20

_cache: dict[tuple[int, float, str], tuple[torch.Tensor, torch.Tensor]] = {}
#: Tables read by captured CUDA graphs: never freed (a growth replaces the cached pair).
_captured: list[tuple[torch.Tensor, torch.Tensor]] = []
_lock = threading.Lock()


def _check_config(op: str, head_dim: int, theta: float) -> None:
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise TypeError(f"{op}: theta must be a Python float, got {type(theta).__name__}; pass e.g. theta=1e6")
    if not math.isfinite(theta) or theta <= 0:
        raise ValueError(f"{op}: theta = {theta!r}; expected a finite value > 0 (Qwen3 uses 1e6)")
    if head_dim < 2 or head_dim % 2:
        raise ValueError(f"{op}: head dimension D = {head_dim}; expected an even D >= 2 (rotate-half pairs "
                         f"x[..., i] with x[..., i + D/2])")


def rope_tables(max_position: int, head_dim: int, theta: float = 1e6,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The contract's RoPE cos/sin tables, correctly rounded to fp32, on ``device``.

    ``cos[p, i] = RN32(cos(p * theta**(-2i/head_dim)))``, ``sin[p, i] = RN32(sin(...))``

    Parameters
    ----------
    max_position : int
        Rows: positions 0 .. max_position - 1, at most 2**24.
    head_dim : int
        Even head dimension D; the tables have D / 2 columns.
    theta : float
        RoPE base (Qwen3: 1e6), its exact binary64 value; finite and > 0.
    device : torch.device or str, optional
        Where the tables live (default CPU). Served from the cache when possible.

    Returns
    -------
    cos, sin : Tensor, float32, [max_position, head_dim // 2]

    Bitwise semantics
    -----------------
    Each entry is the exact real value rounded once to nearest-even fp32 (a float64 fast
    path with a proven error bound, entries near an fp32 midpoint recomputed in ``decimal``
    and rounded by exact comparison; :mod:`rlkernel.ops._rope_tables`); identical on every
    host and device. Contract ``rope`` v1.
    """
    op = "rope_tables"
    if isinstance(max_position, bool) or not isinstance(max_position, int) or not 0 <= max_position <= MAX_POSITION:
        raise ValueError(f"{op}: max_position = {max_position!r}; expected an int in [0, 2**24]")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"{op}: head_dim must be an int, got {type(head_dim).__name__}")
    _check_config(op, head_dim, theta)
    cos, sin = _tables(head_dim, float(theta), torch.device(device or "cpu"), max_position)
    return cos[:max_position], sin[:max_position]


def rope_table_rows(positions: torch.Tensor, head_dim: int, theta: float = 1e6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the RoPE tables at the given positions, without the rows in between.

    ``cos[t, i] = RN32(cos(positions[t] * theta**(-2i/head_dim)))``, ``sin[t, i] = RN32(sin(...))``

    Parameters
    ----------
    positions : Tensor, int64 or int32, [T]
        Positions in [0, 2**24), any order, repeats allowed, on any device.
    head_dim : int
        Even head dimension D; the rows have D / 2 columns.
    theta : float
        RoPE base (Qwen3: 1e6), its exact binary64 value; finite and > 0.

    Returns
    -------
    cos, sin : Tensor, float32, [T, head_dim // 2], on positions' device

    Raises
    ------
    TypeError
        positions is not an int64/int32 tensor; head_dim not an int; theta not a number.
    ValueError
        positions not 1-D or outside [0, 2**24); odd head_dim; theta not finite and > 0.

    Bitwise semantics
    -----------------
    Row t equals row ``positions[t]`` of :func:`rope_tables` bit for bit (computed on the
    host, R8). Contract ``rope`` v1.
    """
    op = "rope_table_rows"
    v.tensor(op, "positions", positions)
    v.dtype(op, "positions", positions, (torch.int64, torch.int32))
    v.ndim(op, "positions", positions, 1, "[T], one position per row")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int):
        raise TypeError(f"{op}: head_dim must be an int, got {type(head_dim).__name__}")
    _check_config(op, head_dim, theta)
    host = positions.detach().to("cpu", torch.int64).numpy()
    if host.size and (host.min() < 0 or host.max() >= MAX_POSITION):
        raise ValueError(f"{op}: positions span [{host.min()}, {host.max()}]; expected every position in [0, 2**24)")
    cos, sin = table_rows(host, head_dim, float(theta))
    return torch.from_numpy(cos).to(positions.device), torch.from_numpy(sin).to(positions.device)


def _tables(head_dim: int, theta: float, device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached tables with at least ``rows`` rows (grown by doubling, at most 2**20 rows beyond the
    request, capped at 2**24)."""
    key = (head_dim, theta, str(device))
    with _lock:
        have = _cache.get(key)
        old = 0 if have is None else have[0].shape[0]
        if old >= rows and have is not None:
            return have
        new = min(MAX_POSITION, max(rows, old + min(old, MAX_TABLE_GROWTH), MIN_TABLE_ROWS))
        cos_np, sin_np = table_rows(np.arange(old, new, dtype=np.int64), head_dim, theta)
        # normal tensors even when first asked for under inference_mode (the rollout engine): the
        # trainer's autograd saves table rows for the backward, which inference tensors refuse
        with torch.inference_mode(False):
            cos, sin = torch.from_numpy(cos_np).to(device), torch.from_numpy(sin_np).to(device)
            if have is not None:
                cos, sin = torch.cat([have[0], cos]), torch.cat([have[1], sin])
        _cache[key] = (cos, sin)
        return cos, sin


def clear_table_cache() -> None:
    """Drop every cached table (they are rebuilt, bit-identical, on the next call)."""
    with _lock:
        _cache.clear()


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Rotary position embedding, NeoX/Hugging Face rotate-half layout, the same bits everywhere.

    ``y = [x1*c - x2*s, x2*c + x1*s]``, ``x1, x2 = x[..., :D/2], x[..., D/2:]``,
    ``c, s = cos[positions], sin[positions]`` (correctly rounded fp32 tables)

    Parameters
    ----------
    x : Tensor, bfloat16/float16/float32, [T, n_heads, D] or [T, D]
        Queries or keys of T tokens (a packed batch: tokens of any sequences, in any order);
        D even. A ``[T, D]`` input is one head per token. Non-contiguous views (q/k slices of
        a fused qkv projection) are accepted (read through a contiguous copy).
    positions : Tensor, int64 or int32, [T], on x's device
        Position of each token in its sequence, in [0, 2**24). While a CUDA graph is being
        captured they are not read (nor checked): they must lie below the cached tables' length,
        grown beforehand by an eager call at the largest position.
    theta : float
        RoPE base (Qwen3: 1e6), its exact binary64 value; finite and > 0.

    Returns
    -------
    Tensor, x's dtype, x's shape

    Raises
    ------
    TypeError
        Not tensors, unsupported dtypes (positions must be int64 or int32), theta not a number.
    ValueError
        Bad shapes, odd D, positions outside [0, 2**24), devices differ, theta not > 0.

    Bitwise semantics
    -----------------
    ``c, s`` are the exact ``cos``/``sin(p * theta**(-2i/D))`` correctly rounded to fp32
    (:func:`rope_tables`, host-computed, R8). In fp32: ``y1 = RN(RN(x1*c) - RN(x2*s))``,
    ``y2 = RN(RN(x2*c) + RN(x1*s))`` (no FMA), then rounded to x's dtype; NaN canonical.
    Each token depends only on its values and its position, so decode at position p equals
    prefill at position p by construction. Invariances: batch, permutation, chunking,
    prefill_decode, repeat. Contract ``rope`` v1 (``rlkernel.contracts.rope``).
    """
    op = "rope"
    device = _check(op, "x", x, positions, theta)
    head_dim = x.shape[-1]
    if v.capturing(device):
        # A CUDA-graph capture cannot read the positions: it uses the cached tables as they are,
        # which the caller has grown beforehand (an eager call at its largest position), and
        # keeps them alive for the graph's lifetime (it holds their addresses).
        cos, sin = _tables(head_dim, float(theta), device, 1)
        with _lock:
            if not any(c is cos for c, _ in _captured):
                _captured.append((cos, sin))
        return dispatch.call(op, device, x=v.contiguous(x), positions=v.contiguous(positions.to(torch.int64)),
                             cos=cos, sin=sin)
    cos, sin = _tables(head_dim, float(theta), device, _rows_needed(op, positions))
    x, pos = v.contiguous(x), v.contiguous(positions.to(torch.int64))
    if torch.is_grad_enabled() and x.requires_grad:
        out: torch.Tensor = RopeFunction.apply(x, pos, cos, sin)
        return out
    return dispatch.call(op, device, x=x, positions=pos, cos=cos, sin=sin)


class RopeFunction(torch.autograd.Function):
    """Autograd for :func:`rope`: ``rope_backward`` (the transposed rotation) with the forward's tables."""

    @staticmethod
    def forward(ctx, x, positions, cos, sin):  # type: ignore[no-untyped-def,override]
        ctx.save_for_backward(positions, cos, sin)
        return dispatch.call("rope", x.device, x=x, positions=positions, cos=cos, sin=sin)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        positions, cos, sin = ctx.saved_tensors
        dx = dispatch.call("rope_backward", grad.device, grad=v.contiguous(grad), positions=positions, cos=cos,
                           sin=sin)
        return dx, None, None, None


def _check(op: str, name: str, x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.device:
    """rope's input checks (``name`` is ``x`` or ``grad``); returns the device."""
    v.tensor(op, name, x)
    v.tensor(op, "positions", positions)
    v.dtype(op, name, x, v.FLOATS)
    v.dtype(op, "positions", positions, (torch.int64, torch.int32))
    v.ndim(op, name, x, (2, 3), "[T, n_heads, D] or [T, D]")
    v.ndim(op, "positions", positions, 1, "[T], one position per token")
    if positions.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: positions has shape {tuple(positions.shape)} but {name} has shape "
                         f"{tuple(x.shape)}; expected positions [T] with T = {name}.shape[0] = {x.shape[0]}")
    device = v.same_device(op, [(name, x), ("positions", positions)])
    _check_config(op, x.shape[-1], theta)
    return device


def _rows_needed(op: str, positions: torch.Tensor) -> int:
    """Table rows the positions need (reads them: not during a CUDA-graph capture)."""
    if not positions.numel():
        return 1
    lo, hi = v.int_range(positions)
    if lo < 0 or hi >= MAX_POSITION:
        raise ValueError(f"{op}: positions span [{lo}, {hi}]; expected every position in [0, 2**24). "
                         f"Positions are per sequence; reset them at each sequence start")
    return hi + 1


def rope_backward(grad: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Gradient of :func:`rope` in x: the rotation by the opposite angle, with the forward's tables.

    ``dx = [dy1*c + dy2*s, dy2*c - dy1*s]``, ``dy1, dy2 = dy[..., :D/2], dy[..., D/2:]``,
    ``c, s = cos[positions], sin[positions]``

    Parameters
    ----------
    grad : Tensor, bfloat16/float16/float32, [T, n_heads, D] or [T, D]
        ``dy``, the gradient of rope's output (x's dtype and shape).
    positions : Tensor, int64 or int32, [T], on grad's device
        The forward's positions, in [0, 2**24).
    theta : float
        The forward's RoPE base.

    Returns
    -------
    Tensor, grad's dtype, grad's shape

    Raises
    ------
    TypeError, ValueError
        As :func:`rope` (with ``grad`` in place of ``x``).
    rlkernel.dispatch.BackwardNotDefined
        grad requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    The forward's correctly rounded fp32 tables (:func:`rope_tables`, R8, the same cache); in
    fp32 ``dx1 = RN(RN(dy1*c) + RN(dy2*s))``, ``dx2 = RN(RN(dy2*c) - RN(dy1*s))`` (no FMA), then
    rounded to grad's dtype; NaN canonical. Invariances: batch, permutation, chunking, repeat.
    Contract ``rope_backward`` v1.
    """
    op = "rope_backward"
    device = _check(op, "grad", grad, positions, theta)
    cos, sin = _tables(grad.shape[-1], float(theta), device, _rows_needed(op, positions))
    return dispatch.call(op, device, grad=v.contiguous(grad), positions=v.contiguous(positions.to(torch.int64)),
                         cos=cos, sin=sin)
