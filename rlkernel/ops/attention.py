"""``rlkernel.ops.attention`` and ``attention_paged``: bitwise-reproducible attention over packed
sequences with a KV cache and over a paged KV cache (contract ``attention`` v2), and
``attention_backward``, its exact gradients in q, k and v (contract ``attention_backward`` v1).

``attention`` is differentiable in q, k and v (:class:`AttentionFunction` saves the output and
calls ``attention_backward``); ``attention_paged`` is the rollout path and stays forward-only."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from numbers import Real

import numpy as np
import torch

from rlkernel import _validate as val
from rlkernel import dispatch

#: Largest number of keys of one sequence (attention v2): L <= lk 2**40 and each 20-bit limb of the
#: numerator, |O_x| <= lk 2**40, stay below 2**63.
MAX_KEYS = 1 << 22
#: Longest exact reduction of a backward product (keys for dQ; query heads per KV head x queries
#: for dK and dV): 28-bit x 21-bit grids, |C| <= n * 2**47 < 2**63.
MAX_BACKWARD_REDUCTION = (1 << 16) - 1

_INTS = (torch.int32, torch.int64)

_SEMANTICS = """
    Bitwise semantics
    -----------------
    Query head h reads KV head ``h // (Hq // Hkv)``. Query i of a sequence (0-based in its
    segment) may attend keys ``0 .. lk - lq + i`` when causal (bottom-right aligned: prefill
    ``lq = lk``, decode ``lq = 1``, chunked prefill ``lq < lk``), all ``lk`` keys otherwise. Per
    query row and head, each fp32 operation one IEEE round-to-nearest-even:
    ``s_j = RN32(digit_dot(q, k_j) * scale_f)`` (P5: 21-bit row grids, exact integer dot,
    ``scale_f = RN32(scale)`` or the correctly rounded ``RN32(1/sqrt(D))``);
    ``m = max s_j`` (NaN propagates); the reference max ``ref = max(c, RN32(m - 64))``, ``c`` the
    max score over the keys whose V row is not all zero; ``p_j = exp_c(RN32(s_j - ref))``.
    V rows on their own grids ``Vint_j = RNE(v_j 2**(20 - e_j))``, ``E = max e_j`` over the
    allowed non-zero rows; ``e_l = expo(exp_c(RN32(m - ref)))``;
    ``L = sum RNE(p_j 2**(40 - e_l))`` and ``O = sum RNE(p_j 2**(40 + e_j - E)) Vint_j`` (exact
    integers on 2**-40 grids); ``out = RN_dtype(RN32(O 2**(E - 60)) ÷ RN32(L 2**(e_l - 40)))``.
    NaN (canonical) when the row's q, an allowed k or v row holds NaN/inf, or scores
    overflow to +inf. Every quantity depends only on the query row and its allowed keys, so
    packing, permuting sequences, chunked prefill, decode, KV block size and split-KV give
    the same bits. Contract ``attention`` v2 (``rlkernel.contracts.attention``).
"""


def _int_vector(op: str, name: str, t: object, length: int | None, what: str) -> torch.Tensor:
    t = val.tensor(op, name, t)
    val.dtype(op, name, t, _INTS)
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = f"[{length}]" if length is not None else "[n]"
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected a 1-D tensor {want} ({what})")
    return t


def _cu_seqlens(op: str, name: str, cu: torch.Tensor, total: int, axis: str) -> list[int]:
    c = [int(x) for x in cu.tolist()]
    if not c:
        raise ValueError(f"{op}: {name} is empty; expected [B + 1] offsets starting at 0 (use [0] for no sequences)")
    if c[0] != 0:
        raise ValueError(f"{op}: {name}[0] = {c[0]}; expected 0 (offsets of the packed {axis} rows)")
    for i in range(len(c) - 1):
        if c[i + 1] < c[i]:
            raise ValueError(f"{op}: {name} decreases at index {i + 1} ({c[i]} -> {c[i + 1]}); "
                             f"expected non-decreasing offsets (cumulative lengths)")
    if c[-1] != total:
        raise ValueError(f"{op}: {name}[-1] = {c[-1]} but {axis} has {total} rows; expected the last "
                         f"offset to equal the number of packed rows")
    return c


def default_scale(head_dim: int) -> float:
    """``RN32(1 / sqrt(head_dim))``, correctly rounded (a host constant, R8), as a Python float.

    Written independently of the contract's (which cuts an integer square root): start from the
    float64 estimate and step through the fp32 neighbours until ``1/sqrt(D)`` lies between the
    two rounding midpoints around the candidate, comparing exactly (``1/sqrt(D) < m`` iff
    ``m * m * D > 1``, m a dyadic rational). There are no ties: a midpoint has 25 significant
    bits ending in 1, so ``1 / m**2`` is never an integer D.

    Parameters
    ----------
    head_dim : int
        D >= 1.

    Returns
    -------
    float
        A binary32 value (exactly representable in fp32).
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"attention: head_dim = {head_dim!r}; expected an int >= 1")
    c = np.float32(1.0 / math.sqrt(head_dim))
    for _ in range(8):
        here = Fraction(float(c))
        low = (here + Fraction(float(np.nextafter(c, np.float32(0))))) / 2
        high = (here + Fraction(float(np.nextafter(c, np.float32(np.inf))))) / 2
        if low * low * head_dim > 1:  # 1/sqrt(D) < low: c is too large
            c = np.nextafter(c, np.float32(0))
        elif high * high * head_dim < 1:  # 1/sqrt(D) > high: too small
            c = np.nextafter(c, np.float32(np.inf))
        else:
            return float(c)
    raise RuntimeError(f"attention: the default scale for head_dim {head_dim} did not converge")  # pragma: no cover


def _scale(op: str, scale: object, head_dim: int) -> float:
    if scale is None:
        return default_scale(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, Real):
        raise TypeError(f"{op}: scale must be a Python float or None, got {type(scale).__name__}; "
                        f"pass e.g. scale=1/math.sqrt(head_dim), or None for that default")
    value = float(torch.tensor(float(scale), dtype=torch.float32))  # RN32, once (overflow: inf, refused below)
    if not math.isfinite(value):
        raise ValueError(f"{op}: scale = {scale!r} is not finite in fp32; expected a finite value "
                         f"(|scale| < 3.4e38)")
    return value


def _heads(op: str, q: torch.Tensor, k_name: str, k: torch.Tensor, v_name: str, vv: torch.Tensor,
           hkv_axis: int) -> None:
    val.dtype(op, "q", q, val.HALF)
    val.same_dtype(op, "q", q, k_name, k)
    val.same_dtype(op, "q", q, v_name, vv)
    if k.shape != vv.shape:
        raise ValueError(f"{op}: {k_name} has shape {tuple(k.shape)} but {v_name} has shape {tuple(vv.shape)}; "
                         f"expected equal shapes")
    hq, d = q.shape[1], q.shape[2]
    hkv = k.shape[hkv_axis]
    if k.shape[-1] != d:
        raise ValueError(f"{op}: {k_name} has head_dim {k.shape[-1]} but q has head_dim {d}; expected equal")
    if d < 1:
        raise ValueError(f"{op}: head_dim is 0; expected D >= 1")
    if hq < 1 or hkv < 1 or hq % hkv:
        raise ValueError(f"{op}: q has {hq} heads and {k_name} has {hkv}; expected Hq to be a positive multiple "
                         f"of Hkv (grouped-query attention: query head h reads KV head h // (Hq // Hkv))")


def _lengths_ok(op: str, q_lens: list[int], k_lens: list[int], causal: bool) -> None:
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
        if lk > MAX_KEYS:
            raise ValueError(f"{op}: sequence {b} has {lk} keys, above the exact-sum bound {MAX_KEYS} (2**22) of "
                             f"int64 accumulation (2**-40 probability grids); split the context")
        if causal and lk < lq:
            raise ValueError(f"{op}: sequence {b} has {lq} queries but {lk} keys; causal attention (bottom-right "
                             f"aligned) needs lk >= lq: the keys must include the queries' own positions")


def _same_device(op: str, device: torch.device, items: list[tuple[str, torch.Tensor]]) -> None:
    for name, t in items:
        if t.device != device and t.device.type != "cpu":
            raise ValueError(f"{op}: {name} is on {t.device} but q is on {device}; expected it on {device} "
                             f"(or on the CPU)")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """Attention over packed (varlen) sequences with a KV cache, the same bits on every backend.

    ``out_i = sum_{j in A_i} softmax_j(scale * q_i . k_j) v_j`` (exact construction below)

    Parameters
    ----------
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
        Queries of all sequences, packed by ``cu_seqlens_q``. Any strides (e.g. a slice of a
        fused qkv projection): read in place, never copied whole.
    k : Tensor, q's dtype, [Tk, Hkv, D]
        Keys of all sequences, packed by ``cu_seqlens_k``: each sequence's whole context (cached
        keys followed by the new ones). Any strides.
    v : Tensor, q's dtype, [Tk, Hkv, D]
        Values, laid out like ``k``.
    cu_seqlens_q : Tensor, int32/int64, [B + 1]
        Offsets of the query segments: ``0 = c_0 <= c_1 <= ... <= c_B = Tq``. A sequence may have
        no queries (``lq = 0``). On q's device or the CPU (read on the host).
    cu_seqlens_k : Tensor, int32/int64, [B + 1]
        Offsets of the key segments, ending at Tk.
    scale : float, optional
        Score scale, rounded once to fp32. Default ``RN32(1 / sqrt(D))``, correctly rounded.
    causal : bool
        Bottom-right aligned causal mask (default True); needs ``lk >= lq`` per sequence.

    Returns
    -------
    Tensor, q's dtype, [Tq, Hq, D], contiguous

    Raises
    ------
    TypeError
        A tensor has the wrong dtype (q, k, v must be one of bfloat16/float16, all equal;
        offsets int32/int64), or scale/causal has the wrong type.
    ValueError
        Shapes disagree, Hq is not a multiple of Hkv, offsets are not cumulative lengths ending
        at Tq/Tk, a causal sequence has fewer keys than queries, a sequence has more than 2**22
        keys, devices differ, or scale is not finite in fp32; with inputs that require grad,
        also a sequence beyond the backward's exact-sum bounds (see :func:`attention_backward`).

    Autograd: differentiable in q, k and v (:class:`AttentionFunction`): ``loss.backward()`` runs
    :func:`attention_backward` (contract ``attention_backward`` v1) on the saved output.
    """
    op = "attention"
    q, k, v, cu_q, cu_k, q_lens, k_lens, scale_f = _check_packed(op, q, k, v, cu_seqlens_q, cu_seqlens_k, scale,
                                                                 causal)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        _backward_bounds(op, q_lens, k_lens, q.shape[1] // k.shape[1])  # refuse now, not at backward time
        y: torch.Tensor = AttentionFunction.apply(q, k, v, cu_q, cu_k, scale_f, causal, (q_lens, k_lens))
        return y
    return dispatch.call(op, q.device, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=scale_f,
                         causal=causal)


def _check_packed(op: str, q: object, k: object, v: object, cu_seqlens_q: object, cu_seqlens_k: object,
                  scale: object, causal: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                          torch.Tensor, list[int], list[int], float]:
    """The checks of :func:`attention`: (q, k, v, cu_q, cu_k, q_lens, k_lens, RN32 scale)."""
    q = val.tensor(op, "q", q)
    k = val.tensor(op, "k", k)
    v = val.tensor(op, "v", v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            axes = "[Tq, Hq, D]" if name == "q" else "[Tk, Hkv, D]"
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected {axes} (packed tokens, heads, "
                             f"head_dim). For a batch [B, T, H, D], flatten it to [B*T, H, D] with cu_seqlens")
    _heads(op, q, "k", k, "v", v, hkv_axis=1)
    b_plus_1 = None
    cu_q = _int_vector(op, "cu_seqlens_q", cu_seqlens_q, b_plus_1, "B + 1 query offsets")
    cu_k = _int_vector(op, "cu_seqlens_k", cu_seqlens_k, cu_q.shape[0], "B + 1 key offsets, like cu_seqlens_q")
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    device = val.same_device(op, [("q", q), ("k", k), ("v", v)])
    _same_device(op, device, [("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)])
    cq = _cu_seqlens(op, "cu_seqlens_q", cu_q, q.shape[0], "q")
    ck = _cu_seqlens(op, "cu_seqlens_k", cu_k, k.shape[0], "k")
    q_lens = [cq[i + 1] - cq[i] for i in range(len(cq) - 1)]
    k_lens = [ck[i + 1] - ck[i] for i in range(len(ck) - 1)]
    _lengths_ok(op, q_lens, k_lens, causal)
    return q, k, v, cu_q, cu_k, q_lens, k_lens, _scale(op, scale, q.shape[2])


def _backward_bounds(op: str, q_lens: list[int], k_lens: list[int], group: int) -> None:
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens)):
        if lq and lk > MAX_BACKWARD_REDUCTION:
            raise ValueError(f"{op}: sequence {b} has {lk} keys; the backward's dQ is an exact int64 sum over the keys "
                             f"(28-bit x 21-bit grids) that allows at most {MAX_BACKWARD_REDUCTION} (2**16 - 1) terms; "
                             f"train on sequences of at most {MAX_BACKWARD_REDUCTION} tokens")
        if group * lq > MAX_BACKWARD_REDUCTION:
            raise ValueError(f"{op}: sequence {b} has {lq} queries and {group} query heads per KV head: dK and dV sum "
                             f"{group * lq} terms exactly in int64, above the bound {MAX_BACKWARD_REDUCTION} "
                             f"(2**16 - 1); train on sequences of at most {MAX_BACKWARD_REDUCTION // group} tokens")


class AttentionFunction(torch.autograd.Function):
    """Autograd for :func:`attention`: the forward kernel, then ``attention_backward`` on the saved output.

    Saves q, k, v and the output (no recomputation of the forward output in the backward; the
    probabilities are recomputed there exactly). The incoming gradient is rounded to q's dtype
    (nearest even; it already is, when the loss reads the bf16/fp16 output). dq, dk, dv come back in
    q's dtype. Double backward is not defined (``attention_backward`` refuses inputs that require grad).
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, scale, causal, lens):  # type: ignore[no-untyped-def,override]
        out = dispatch.call("attention", q.device, q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=scale,
                            causal=causal)
        ctx.save_for_backward(q, k, v, out)
        ctx.offsets = backward_offsets(lens)
        ctx.scale, ctx.causal = scale, causal
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        q, k, v, out = ctx.saved_tensors
        cu_q, cu_k = ctx.offsets
        dq, dk, dv = dispatch.call("attention_backward", q.device, grad_out=grad.to(q.dtype), q=q, k=k, v=v, out=out,
                                   cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=ctx.scale, causal=ctx.causal)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None, None, None, None, None,
                None)


def backward_offsets(lens: tuple[list[int], list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The offsets :class:`AttentionFunction` hands ``attention_backward``: CPU int64 tensors of the
    offsets the forward's checks read on the host (``lens``: the query and key lengths), so that the
    backward, which reads them on the host too, does not wait for the device (a read of a device
    tensor waits for every queued kernel: on an H100 trainer step the backward's eight such reads
    waited 8.6 ms and left the GPU idle while the host caught up). The same integers as the forward's
    ``cu_seqlens_q`` / ``cu_seqlens_k``: the same bits (and an in-place change of those tensors after
    the forward cannot reach its backward)."""
    q_lens, k_lens = lens
    return (torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int64),
            torch.tensor([0, *itertools.accumulate(k_lens)], dtype=torch.int64))


def attention_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, scale: float | None = None,
                       causal: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact gradients of :func:`attention` in q, k and v, the same bits on every backend.

    ``dV = p^T dO``, ``dS = p * (dO V^T - rowsum(dO * O))``, ``dQ = scale dS K``, ``dK = scale dS^T Q``

    Parameters
    ----------
    grad_out : Tensor, q's dtype, [Tq, Hq, D]
        Gradient of the loss with respect to the output of :func:`attention`. Any strides.
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
    k : Tensor, q's dtype, [Tk, Hkv, D]
    v : Tensor, q's dtype, [Tk, Hkv, D]
    out : Tensor, q's dtype, [Tq, Hq, D]
        The output of ``attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal)``, used as
        given (``D = rowsum(dO * out)``); the probabilities are recomputed exactly.
    cu_seqlens_q, cu_seqlens_k : Tensor, int32/int64, [B + 1]
        As in :func:`attention`.
    scale : float, optional
        As in :func:`attention`.
    causal : bool
        As in :func:`attention`.

    Returns
    -------
    dq : Tensor, q's dtype, [Tq, Hq, D]
    dk : Tensor, q's dtype, [Tk, Hkv, D]
    dv : Tensor, q's dtype, [Tk, Hkv, D]

    Raises
    ------
    TypeError, ValueError
        As :func:`attention`; also grad_out/out not q's dtype and shape, or a sequence beyond the
        exact-sum bounds: ``lk <= 2**16 - 1`` keys and ``(Hq / Hkv) * lq <= 2**16 - 1``.
    rlkernel.dispatch.BackwardNotDefined
        An input requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    FlashAttention-2's backward with every rounding pinned. The forward's probabilities are
    recomputed exactly (scores, reference max, ``exp_c``, the integers ``P`` of the 2**-40 grid and
    their sum ``L``) and normalised ``pn = RN32(RN32(P) ÷ RN32(L))``. ``D_i = RN32(dO_i . O_i)`` and
    ``dP_ij = RN32(dO_i . V_j)`` are exact products of a 28-bit grid (the dO row) and 21-bit grids (the
    out and V rows). ``dS = RN32(pn * RN32(dP - D))``, then dS and pn are rounded to q's dtype.
    ``dQ = RN(scale * dS K)``, ``dK = RN(scale * dS^T Q)``, ``dV = RN(pn^T dO)``: exact integer sums (dS /
    pn on 28-bit grids per row, K, Q, dO on 21-bit grids per feature), each rounded once straight
    to the dtype with the scale inside the rounding; dK and dV of a KV head are ONE exact sum over
    all its query heads and queries. Masked pairs contribute exact zeros. A bad row (the forward's
    row NaN, or NaN/inf in its dO or out row) gives a NaN dQ row and NaN dK/dV rows for the keys it
    sees. The bits do not depend on the other sequences of the pack, their order, the split of the
    KV groups over ranks, or the backend. Contract ``attention_backward`` v1
    (``rlkernel.contracts.attention_backward``).
    """
    op = "attention_backward"
    q, k, v, cu_q, cu_k, q_lens, k_lens, scale_f = _check_packed(op, q, k, v, cu_seqlens_q, cu_seqlens_k, scale,
                                                                 causal)
    named = {"grad_out": val.tensor(op, "grad_out", grad_out), "out": val.tensor(op, "out", out)}
    for name, t in named.items():
        val.same_dtype(op, "q", q, name, t)
        if t.shape != q.shape:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected q's shape {tuple(q.shape)} "
                             f"([Tq, Hq, D])")
    val.same_device(op, [("q", q), ("grad_out", named["grad_out"]), ("out", named["out"])])
    _backward_bounds(op, q_lens, k_lens, q.shape[1] // k.shape[1])
    result: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = dispatch.call(
        op, q.device, grad_out=named["grad_out"], q=q, k=k, v=v, out=named["out"], cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k, scale=scale_f, causal=causal)
    return result


def attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens_k: torch.Tensor, cu_seqlens_q: torch.Tensor, scale: float | None = None,
                    causal: bool = True) -> torch.Tensor:
    """Attention over a block-paged KV cache (vLLM layout): the bits of :func:`attention` on the
    gathered contiguous keys.

    ``out = attention(q, gather(k_cache), gather(v_cache), cu_seqlens_q, cumsum(seq_lens_k))``

    Parameters
    ----------
    q : Tensor, bfloat16/float16, [Tq, Hq, D]
        Queries, packed by ``cu_seqlens_q`` (decode: one row per sequence). Any strides.
    k_cache : Tensor, q's dtype, [num_blocks, block_size, Hkv, D]
        Paged keys: position ``pos`` of sequence b is at block ``block_table[b, pos // block_size]``,
        slot ``pos % block_size``.
    v_cache : Tensor, q's dtype, [num_blocks, block_size, Hkv, D]
        Paged values, same layout.
    block_table : Tensor, int32/int64, [B, max_blocks]
        Physical block of each logical block. Entries past ``ceil(seq_lens_k[b] / block_size)``
        are not read (any value, e.g. -1 padding); the entries in use must lie in
        ``[0, num_blocks)``.
    seq_lens_k : Tensor, int32/int64, [B]
        Context length (keys) of each sequence, including the new tokens' own keys.
    cu_seqlens_q : Tensor, int32/int64, [B + 1]
        Offsets of the query segments, ending at Tq.
    scale : float, optional
        As in :func:`attention`.
    causal : bool
        As in :func:`attention` (needs ``seq_lens_k[b] >= lq_b``).

    While a CUDA graph is being captured the host cannot read the lengths and the table: their
    value checks are skipped, and every query segment must be non-empty (a decode step's are
    all 1; the CUDA launcher bounds the longest by ``Tq - B + 1``).

    Returns
    -------
    Tensor, q's dtype, [Tq, Hq, D], contiguous

    Raises
    ------
    TypeError
        Wrong dtypes (see :func:`attention`), or scale/causal of the wrong type.
    ValueError
        Shapes disagree, a used block_table entry is out of range, a sequence is longer than
        its table row covers, lengths break the causal or 2**22 bounds, devices differ.
    """
    op = "attention_paged"
    q = val.tensor(op, "q", q)
    k_cache = val.tensor(op, "k_cache", k_cache)
    v_cache = val.tensor(op, "v_cache", v_cache)
    if q.dim() != 3:
        raise ValueError(f"{op}: q has shape {tuple(q.shape)}; expected [Tq, Hq, D]")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected [num_blocks, block_size, Hkv, D] "
                             f"(vLLM's paged layout)")
    _heads(op, q, "k_cache", k_cache, "v_cache", v_cache, hkv_axis=2)
    block_size = k_cache.shape[1]
    if block_size < 1:
        raise ValueError(f"{op}: k_cache has block_size 0 (shape {tuple(k_cache.shape)}); expected >= 1")
    table = val.tensor(op, "block_table", block_table)
    val.dtype(op, "block_table", table, _INTS)
    if table.dim() != 2:
        raise ValueError(f"{op}: block_table has shape {tuple(table.shape)}; expected [B, max_blocks]")
    lens = _int_vector(op, "seq_lens_k", seq_lens_k, table.shape[0], "one context length per block_table row")
    cu_q = _int_vector(op, "cu_seqlens_q", cu_seqlens_q, table.shape[0] + 1, "B + 1 query offsets")
    if not isinstance(causal, bool):
        raise TypeError(f"{op}: causal must be a bool, got {type(causal).__name__}")
    device = val.same_device(op, [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])
    _same_device(op, device, [("block_table", table), ("seq_lens_k", lens), ("cu_seqlens_q", cu_q)])
    if val.capturing(device):  # a CUDA-graph capture cannot read the lengths and tables on the host
        return dispatch.call(op, device, q=q, k_cache=k_cache, v_cache=v_cache, block_table=table, seq_lens_k=lens,
                             cu_seqlens_q=cu_q, scale=_scale(op, scale, q.shape[2]), causal=causal)
    cq = _cu_seqlens(op, "cu_seqlens_q", cu_q, q.shape[0], "q")
    k_lens = [int(x) for x in lens.tolist()]
    q_lens = [cq[i + 1] - cq[i] for i in range(len(cq) - 1)]
    num_blocks, max_blocks = k_cache.shape[0], table.shape[1]
    host_table = table.to("cpu", torch.int64)
    for b, n in enumerate(k_lens):
        if n < 0:
            raise ValueError(f"{op}: seq_lens_k[{b}] = {n}; expected a length >= 0")
        used = -(-n // block_size)
        if used > max_blocks:
            raise ValueError(f"{op}: sequence {b} has {n} keys = {used} blocks of {block_size} but block_table has "
                             f"{max_blocks} columns; widen block_table")
        row = host_table[b, :used]
        bad = ((row < 0) | (row >= num_blocks)).nonzero()
        if len(bad):
            j = int(bad[0])
            raise ValueError(f"{op}: block_table[{b}, {j}] = {int(row[j])} is out of range for a cache of "
                             f"{num_blocks} blocks; expected entries in [0, {num_blocks}) for the "
                             f"{used} blocks that sequence {b} uses")
    _lengths_ok(op, q_lens, k_lens, causal)
    return dispatch.call(op, device, q=q, k_cache=k_cache, v_cache=v_cache, block_table=table, seq_lens_k=lens,
                         cu_seqlens_q=cu_q, scale=_scale(op, scale, q.shape[2]), causal=causal)


attention.__doc__ = (attention.__doc__ or "") + _SEMANTICS
attention_paged.__doc__ = (attention_paged.__doc__ or "") + _SEMANTICS
