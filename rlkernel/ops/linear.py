"""Public ``linear`` and its tensor-parallel sub-ops (contract ``linear`` v2).

``linear(x, weight, bias=None, out_dtype=None)`` is ``torch.nn.functional.linear`` computed by
the exact digit matmul: the same inputs give the same output bits on every backend, for every
batch composition, row order, K order and tensor-parallel degree. The sub-ops
``linear_exponents``, ``linear_partial`` and ``linear_finish`` split it over shards of K
(row-parallel TP; :func:`rlkernel.distributed.row_parallel_linear` runs them with
``torch.distributed``).
"""

from __future__ import annotations

import torch

from rlkernel import _validate as v
from rlkernel import dispatch, grads

__all__ = ["linear", "linear_exponents", "linear_finish", "linear_partial", "linear_weight_digits"]

#: Largest reduction length: |C| <= K * 2**40 < 2**63.
#: Largest K: |C| <= K * 2**47 < 2**63 (x rows on 28 bits, weight rows on 21 bits).
MAX_K = (1 << 16) - 1
#: Row exponent of a row holding NaN or +-inf (see :func:`linear_exponents`).
SENTINEL = 1 << 20
#: Exponent :func:`linear_exponents` gives an all-zero row (or an empty K-slice): below every
#: real exponent (``expo`` of fp32 values lies in [-148, 128]), so a MAX over shards ignores it.
ZERO_EXP = -149
#: Accepted exponents besides SENTINEL.
EXP_MIN, EXP_MAX = ZERO_EXP, 128
_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [*, K] as [M, K]; M = prod of the leading axes (also when M or K is 0)."""
    m = 1
    for s in t.shape[:-1]:
        m *= int(s)
    return t.reshape(m, t.shape[-1])


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check_operands(op: str, x: object, weight: object) -> tuple[torch.Tensor, torch.Tensor]:
    x = v.tensor(op, "x", x)
    weight = v.tensor(op, "weight", weight)
    if x.dtype == torch.float32 or weight.dtype == torch.float32:
        which = "x" if x.dtype == torch.float32 else "weight"
        raise TypeError(
            f"{op}: {which} has dtype float32; expected bfloat16 or float16. The exact digit matmul puts every "
            f"row on a 28- or 21-bit integer grid, which would round fp32 inputs (24-bit significands) before the "
            f"product, so the result would not be the product of the values you passed. Cast x and weight to "
            f"bfloat16 (x.to(torch.bfloat16)) or float16 first, or use torch.nn.functional.linear if you do not "
            f"need reproducible bits"
        )
    v.dtype(op, "x", x, v.HALF)
    v.dtype(op, "weight", weight, v.HALF)
    v.same_dtype(op, "x", x, "weight", weight)
    if x.dim() < 1:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}; expected [*, K] with at least one axis")
    v.ndim(op, "weight", weight, 2, "[N, K]")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)} and weight {tuple(weight.shape)}; the last axis of x "
                         f"(K = {x.shape[-1]}) must equal weight.shape[1] (K = {weight.shape[1]}). weight is [N, K] "
                         f"as in torch.nn.functional.linear (y = x @ weight.T)")
    if x.shape[-1] > MAX_K:
        raise ValueError(f"{op}: K = {x.shape[-1]} exceeds the exact-sum bound 2**16 - 1 = {MAX_K} of the digit "
                         f"matmul (|C| <= K * 2**47 < 2**63); a reduction this long needs a wider accumulator "
                         f"than int64 (row-parallel shards do not help: their partials add up to the same C)")
    return x, weight


def _check_bias(op: str, bias: object, n: int) -> torch.Tensor | None:
    if bias is None:
        return None
    bias = v.tensor(op, "bias", bias)
    v.dtype(op, "bias", bias, _BIAS_DTYPES)
    if tuple(bias.shape) != (n,):
        raise ValueError(f"{op}: bias has shape {tuple(bias.shape)}; expected [N] = ({n},), one value per output "
                         f"feature (weight row)")
    return bias


def _check_out_dtype(op: str, out_dtype: object, default: torch.dtype) -> torch.dtype:
    if out_dtype is None:
        return default
    if out_dtype not in _OUT_DTYPES:
        raise TypeError(f"{op}: out_dtype is {out_dtype!r}; expected torch.float32, torch.bfloat16 or torch.float16 "
                        f"(or None for the default {_name(default)})")
    return out_dtype  # type: ignore[return-value]


def _check_exponents(op: str, name: str, e: object, shape: tuple[int, ...], what: str) -> torch.Tensor:
    e = v.tensor(op, name, e)
    v.dtype(op, name, e, (torch.int64,))
    if tuple(e.shape) != shape:
        raise ValueError(f"{op}: {name} has shape {tuple(e.shape)}; expected {list(shape)} ({what})")
    bad = ~(((e >= EXP_MIN) & (e <= EXP_MAX)) | (e == SENTINEL))
    if e.numel() and bool(bad.any()):
        i = int(bad.reshape(-1).nonzero()[0, 0])
        raise ValueError(f"{op}: {name} holds {int(e.reshape(-1)[i])} at flat index {i}; expected row exponents in "
                         f"[{EXP_MIN}, {EXP_MAX}] or the non-finite sentinel 2**20, as linear_exponents returns them "
                         f"(all-reduced with MAX over the shards)")
    return e


class LinearFunction(torch.autograd.Function):
    """Autograd for :func:`linear`: every gradient an exact digit matmul or an exact sum.

    - ``dX = linear(RN(dY), weight.T)``: per token (a reduction over the N output features), so
      batch invariant like the forward.
    - ``dW``: for each sequence unit ``u`` (:func:`rlkernel.grads.current_units`, captured at
      forward time) ``P_u = linear(RN(dY_u).T, x_u.T)`` in fp32, one rounding per unit; the
      ``P_u`` are summed exactly (:func:`rlkernel.grads.weight_grad`). No sequence spans two
      units, so packing and micro-batching of whole sequences cannot change dW.
    - ``dbias``: the exact sum of the fp32 values of dY over the tokens.
    ``RN(dY)`` is dY rounded to the input dtype (nearest even), as bf16 autograd holds it.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, out_dtype):  # type: ignore[no-untyped-def,override]
        x2 = _rows(x)
        ctx.save_for_backward(x2, weight, bias)
        ctx.x_shape = x.shape
        ctx.units = grads.current_units(x2.shape[0])
        y = dispatch.call("linear", x2.device, x=x2, weight=weight, bias=bias, out_dtype=out_dtype)
        return y.reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        x2, weight, bias = ctx.saved_tensors
        grad = _rows(grad)
        m, n = grad.shape
        gy = grad.to(x2.dtype)  # dY rounded to the input dtype (RNE): the digit matmul takes bf16/fp16
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            _backward_bound("dX = dY @ weight", "N (output features)", n)
            gx = dispatch.call("linear", gy.device, x=gy, weight=weight.T, bias=None, out_dtype=x2.dtype)
            gx = gx.reshape(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            gw = _weight_grad(weight, gy, x2, ctx.units)
        if ctx.needs_input_grad[2]:
            gb = grads.weight_grad(bias, grad.to(torch.float32))
        return gx, gw, gb, None


def _weight_grad(weight: torch.Tensor, gy: torch.Tensor, x2: torch.Tensor, units: list[int]) -> torch.Tensor | None:
    """dW: one exact digit matmul per unit (rounded once to fp32), the units summed exactly."""
    spans = [(a, b) for a, b in zip(units, units[1:]) if b > a]
    for a, b in spans:
        _backward_bound("dW = dY.T @ x of one sequence", "its tokens", b - a)
    per_group = grads.units_per_group(weight)
    unit_sum = grads.UnitStates(weight)
    for g0 in range(0, len(spans), per_group):
        terms = torch.stack([dispatch.call("linear", gy.device, x=gy[a:b].T, weight=x2[a:b].T, bias=None,
                                           out_dtype=torch.float32) for a, b in spans[g0:g0 + per_group]])
        unit_sum.add_terms(terms)
    return unit_sum.gradient()


def _backward_bound(what: str, axis: str, size: int) -> None:
    if size > MAX_K:
        raise ValueError(f"linear backward: {what} reduces over {axis} = {size}, above the exact-sum bound "
                         f"2**16 - 1 = {MAX_K}; use smaller micro-batches")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, *, weight_exponents: torch.Tensor | None = None,
           weight_digits: torch.Tensor | None = None) -> torch.Tensor:
    """Exact, reproducible ``y = x @ weight.T + bias`` (contract ``linear`` v2).

    ``y_ij = RN_out(sum_k X_ik Wt_jk * 2**(ex_i + ew_j - 47))`` (with a bias: ``RN_out(RN32(RN32(...) + bias_j))``)

    Parameters
    ----------
    x : Tensor, bfloat16 or float16, [*, K]
        Activations; leading axes are flattened into rows M (M = 0 is allowed). Any layout.
    weight : Tensor, same dtype as x, [N, K]
        As in :func:`torch.nn.functional.linear`. K <= 2**16 - 1.
    bias : Tensor, x.dtype or float32, [N], optional
    out_dtype : torch.dtype, optional
        ``torch.float32``, ``torch.bfloat16`` or ``torch.float16``; default ``x.dtype``.
    weight_exponents : Tensor, int64, [N], optional
        The weight's row exponents as it is now (``linear_exponents(x, weight)[1]``), made
        beforehand so that the op does not read the weight for them. For CUDA-graph capture: the
        captured kernels then read this buffer instead of recomputing the exponents at every
        replay (``rlkernel.rollout``'s decode graphs refresh it whenever the weights may have
        changed). Outside a capture they are checked against the weight (one read of it and a
        host sync, so eager callers gain nothing); during a capture the caller vouches for them.
        The result is the same bits as without them.
    weight_digits : Tensor, int8, [3, N, K], optional
        With ``weight_exponents``: the weight's grid integers as balanced base-128 digits,
        :func:`linear_weight_digits`'s second output, made once for a weight that does not change.
        Backends whose digit GEMM reads planes read these instead of making them per call (on
        CUDA: the prefill path, and the sm_90 wgmma kernel, which then also takes 65-256 rows from
        4096 output columns); others ignore them. Checked against the weight outside a capture
        like the exponents; the same bits as without them.

    Returns
    -------
    Tensor, out_dtype, [*, N]

    Raises
    ------
    TypeError
        float32 (or other) x/weight: the integer grids would round fp32 inputs — cast to bf16/fp16.
        weight_exponents not int64, weight_digits not int8.
    ValueError
        Shape mismatch, K > 2**16 - 1, bias not [N], weight_exponents not [N] or (outside a
        CUDA-graph capture) not the weight's exponents; weight_digits without weight_exponents,
        not [3, N, K] or (outside a capture) not the weight's digits.

    Bitwise semantics
    -----------------
    docs/numerics.md P5: each row of x is placed on its own 28-bit signed grid relative to its
    max exponent (``X_ik = RNE(x_ik 2**(27 - ex_i))``) and each row of weight on a 21-bit one
    (``Wt_jk = RNE(w_jk 2**(20 - ew_j))``); the integer product ``C = X @ Wt.T`` is exact
    (int64) and ``C * 2**(ex_i + ew_j - 47)`` is rounded once, to nearest even, straight to
    ``out_dtype`` (P3'); with a bias, rounded to fp32, one fp32 addition of the bias, then the
    cast. Canonical NaN. A row of x or of weight holding NaN/inf makes exactly its output
    row/column NaN. K = 0 gives +0 (+ bias). Accuracy against float64 next to torch's GEMM, with
    and without outlier channels: docs/accuracy/ (``rlkernel accuracy --op linear``).

    Invariances: batch (a row's bits do not depend on the other rows), permutation of rows,
    reduction order (permuting K of x and weight together), tensor-parallel degree (row- and
    column-parallel shards), repeat, autograd.

    Backward (deterministic and portable): ``dY`` is rounded to ``x.dtype`` (RNE) as ``dYr``;
    ``dX = dYr @ weight``, ``dW = dYr.T @ x`` and ``dbias = dYr.T @ 1`` are each computed by this
    same exact digit matmul (reductions over N, M and M: each at most 2**16 - 1) and cast to the
    dtype of x, weight and bias. The bits depend only on the values, not on the backend or on
    row order; gradients of separately computed micro-batches are rounded separately.

    Contract: ``linear``, version 2.
    """
    op = "linear"
    x, weight = _check_operands(op, x, weight)
    n = weight.shape[0]
    bias = _check_bias(op, bias, n)
    out = _check_out_dtype(op, out_dtype, x.dtype)
    if weight_exponents is not None:
        weight_exponents = v.tensor(op, "weight_exponents", weight_exponents)
    if weight_digits is not None:
        weight_digits = v.tensor(op, "weight_digits", weight_digits)
        if weight_exponents is None:
            raise ValueError(f"{op}: weight_digits was given without weight_exponents; pass both, as "
                             f"rlkernel.ops.linear_weight_digits(weight) returns them (ew, digits)")
    device = v.same_device(op, [("x", x), ("weight", weight), ("bias", bias), ("weight_exponents", weight_exponents),
                                ("weight_digits", weight_digits)])
    given = {} if weight_exponents is None else _given_weight(op, weight_exponents, weight_digits, weight, device)
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad))
    if needs_grad:  # (given exponents are the weight's own: the autograd path recomputes them)
        y: torch.Tensor = LinearFunction.apply(x, weight, bias, out)
        return y
    y = dispatch.call(op, device, x=_rows(x), weight=weight, bias=bias, out_dtype=out, **given)
    return y.reshape(*x.shape[:-1], n)


def _given_weight(op: str, ew: torch.Tensor, wd: torch.Tensor | None, weight: torch.Tensor,
                  device: torch.device) -> dict[str, torch.Tensor]:
    """``weight_exponents`` (int64 [N]) and ``weight_digits`` (int8 [3, N, K] or None) checked; outside
    a CUDA-graph capture, equal to the weight's own. The kernel arguments ``ew`` (and ``wd``)."""
    n, k = weight.shape
    v.dtype(op, "weight_exponents", ew, (torch.int64,))
    if tuple(ew.shape) != (n,):
        raise ValueError(f"{op}: weight_exponents has shape {tuple(ew.shape)}; expected [{n}] (one per row of weight)")
    if wd is not None:
        v.dtype(op, "weight_digits", wd, (torch.int8,))
        if tuple(wd.shape) != (3, n, k):
            raise ValueError(f"{op}: weight_digits has shape {tuple(wd.shape)}; expected [3, {n}, {k}] (three "
                             f"digit planes of weight [N, K]), as rlkernel.ops.linear_weight_digits(weight) makes them")
    given = {"ew": ew.contiguous()} if wd is None else {"ew": ew.contiguous(), "wd": wd.contiguous()}
    if v.capturing(device):  # the capturing caller vouches for the values (they cannot be read now)
        return given
    with torch.no_grad():
        if wd is None:
            own = dispatch.call("linear_exponents", device, x=weight[:0], weight=weight)[1]
        else:
            own, own_digits = dispatch.call("linear_weight_digits", device, weight=weight)
    wrong = own != ew
    if n and bool(wrong.any()):
        i = int(wrong.nonzero()[0, 0])
        raise ValueError(f"{op}: weight_exponents[{i}] = {int(ew[i])}, but row {i} of weight has exponent "
                         f"{int(own[i])}: the weight changed after they were made. Recompute them with "
                         f"rlkernel.ops.linear_exponents(x, weight)[1] after every change of the weight")
    if wd is not None and not torch.equal(own_digits, wd):
        j = int((own_digits != wd).any(dim=0).any(dim=1).nonzero()[0, 0])
        raise ValueError(f"{op}: weight_digits differ from the digits of row {j} of weight: the weight changed "
                         f"after they were made. Recompute them with rlkernel.ops.linear_weight_digits(weight) "
                         f"after every change of the weight")
    return given


def linear_exponents(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row exponents of one shard's K-slice, for row-parallel ``linear``.

    ``ex_i = expo(max_k |x_ik|)``, ``ew_j = expo(max_k |w_jk|)``; ``2**20`` if NaN/inf, ``-149`` if all zero

    Parameters
    ----------
    x : Tensor, bfloat16 or float16, [*, K_shard]
    weight : Tensor, same dtype, [N, K_shard]

    Returns
    -------
    ex : Tensor, int64, [*]
    ew : Tensor, int64, [N]
        Integers: not differentiable; computed without grad even when x or weight requires grad.

    Bitwise semantics
    -----------------
    P1 exponent of each row's largest finite magnitude. An all-zero row (or K_shard = 0) gets
    ``-149``, below every real exponent, and a row holding any NaN or +-inf gets the sentinel
    ``2**20``, above every real exponent: an all-reduce MAX over the shards then gives the global
    exponent of every row (a shard that holds only zeros of a row never raises it) and carries
    the sentinel. (In :func:`linear` a zero row's exponent affects no bit: its products are 0.)
    Exponents are integers: any MAX order gives the same result.

    Contract: ``linear`` (sub-op ``linear_exponents``), version 2.
    """
    op = "linear_exponents"
    x, weight = _check_operands(op, x, weight)
    device = v.same_device(op, [("x", x), ("weight", weight)])
    with torch.no_grad():  # integer exponents: nothing to differentiate, inputs that require grad are fine
        ex, ew = dispatch.call(op, device, x=_rows(x), weight=weight)
    return ex.reshape(x.shape[:-1]), ew


def linear_weight_digits(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's row exponents and its 21-bit grid integers as three int8 digit planes, made once
    for :func:`linear`'s ``weight_exponents=`` and ``weight_digits=``.

    ``Wt_jk = RNE(w_jk 2**(20 - ew_j)) = d0 + 128 d1 + 16384 d2``

    Parameters
    ----------
    weight : Tensor, bfloat16 or float16, [N, K]
        K <= 2**16 - 1.

    Returns
    -------
    ew : Tensor, int64, [N]
        As :func:`linear_exponents` gives them (``2**20`` for a row holding NaN/inf, ``-149`` for
        an all-zero row).
    digits : Tensor, int8, [3, N, K]
        Low digit first. Integers: not differentiable; computed without grad even when weight
        requires grad. 3 bytes a weight element (1.5x the bf16 weight).

    Raises
    ------
    TypeError
        weight not bfloat16/float16.
    ValueError
        weight not [N, K], or K > 2**16 - 1.

    Bitwise semantics
    -----------------
    Balanced base-128 digits of the grid integer, low first: ``d0 = ((Wt + 64) mod 128) - 64``,
    ``d1`` the same of ``(Wt - d0) / 128``, ``d2`` the rest; ``d0, d1`` in [-64, 63] and ``d2`` in
    [-64, 64] (``|Wt| <= 2**20``). Rows holding NaN/inf give zeros. Each element depends on its own
    row only.

    Contract: ``linear`` (sub-op ``linear_weight_digits``), version 2.
    """
    op = "linear_weight_digits"
    weight = v.tensor(op, "weight", weight)
    v.dtype(op, "weight", weight, v.HALF)
    v.ndim(op, "weight", weight, 2, "[N, K]")
    if weight.shape[1] > MAX_K:
        raise ValueError(f"{op}: K = {weight.shape[1]} exceeds the exact-sum bound 2**16 - 1 = {MAX_K} of linear's "
                         f"digit matmul; such a weight cannot be used by rlkernel.ops.linear")
    with torch.no_grad():  # integers: nothing to differentiate, a weight that requires grad is fine
        ew, digits = dispatch.call(op, weight.device, weight=weight)
    return ew, digits


def linear_partial(x: torch.Tensor, weight: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """One shard's exact int64 partial sums ``C = X @ Wt.T`` on the global grids.

    ``C_ij = sum_k RNE(x_ik 2**(20 - ex_i)) * RNE(w_jk 2**(20 - ew_j))``

    Parameters
    ----------
    x : Tensor, bfloat16 or float16, [*, K_shard]
    weight : Tensor, same dtype, [N, K_shard]
    ex : Tensor, int64, [*]
        Global row exponents of x: the all-reduce MAX over the shards of
        :func:`linear_exponents`. Each must be at least the row's own exponent on this shard.
    ew : Tensor, int64, [N]

    Returns
    -------
    Tensor, int64, [*, N]

    Raises
    ------
    ValueError
        An exponent outside [-148, 128] and not the sentinel, or below its row's own exponent
        (the grid would exceed 28 / 21 bits), or K_shard > 2**16 - 1.
    rlkernel.dispatch.BackwardNotDefined
        x or weight requires grad with grad mode on: the int64 partial would drop the gradient.

    Bitwise semantics
    -----------------
    Exact integers (|C| <= K_shard 2**47). Rows whose exponent is the sentinel contribute 0
    (the NaN is applied by :func:`linear_finish`). Summing the partials of every shard in
    int64 (in any order) gives the ``C`` of ``linear`` on the whole K.

    Contract: ``linear`` (sub-op ``linear_partial``), version 2.
    """
    op = "linear_partial"
    x, weight = _check_operands(op, x, weight)
    lead, n = tuple(x.shape[:-1]), weight.shape[0]
    ex = _check_exponents(op, "ex", ex, lead, "one per row of x")
    ew = _check_exponents(op, "ew", ew, (n,), "one per row of weight")
    device = v.same_device(op, [("x", x), ("weight", weight), ("ex", ex), ("ew", ew)])
    dispatch.refuse_grad(op, {"x": x, "weight": weight})  # before the exponent check below
    x2, ex2 = _rows(x), ex.reshape(-1)
    own_x, own_w = dispatch.call("linear_exponents", device, x=x2, weight=weight)
    for name, given, own in (("ex", ex2, own_x), ("ew", ew, own_w)):
        low = given < own
        if given.numel() and bool(low.any()):
            i = int(low.nonzero()[0, 0])
            raise ValueError(f"{op}: {name}[{i}] = {int(given[i])} is below that row's own exponent {int(own[i])} "
                             f"on this shard, so its grid would exceed 28 / 21 bits; pass the all-reduce MAX of "
                             f"linear_exponents over every shard")
    acc = dispatch.call(op, device, x=x2, weight=weight, ex=ex2, ew=ew)
    return acc.reshape(*lead, n)


def linear_finish(acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Round the all-reduced int64 sums of row-parallel ``linear`` to the output.

    ``y_ij = RN_out(acc_ij * 2**(ex_i + ew_j - 47))`` (with a bias: ``RN_out(RN32(RN32(...) + bias_j))``)

    Parameters
    ----------
    acc : Tensor, int64, [*, N]
        The all-reduce SUM of every shard's :func:`linear_partial` (``|acc| < 2**63``).
    ex : Tensor, int64, [*]
    ew : Tensor, int64, [N]
    bias : Tensor, bfloat16/float16/float32, [N], optional
        Added once (not sharded).
    out_dtype : torch.dtype
        ``torch.float32`` (default), ``torch.bfloat16`` or ``torch.float16``.

    Returns
    -------
    Tensor, out_dtype, [*, N]

    Bitwise semantics
    -----------------
    P3' (one rounding of ``acc * 2**(ex + ew - 47)`` to ``out_dtype``; with a bias, to fp32, one
    fp32 bias addition, then the cast), NaN where ``ex_i`` or ``ew_j`` is the sentinel ``2**20``,
    canonical NaN: the last steps of :func:`linear`, so ``finish(sum of partials)`` has the bits
    of ``linear`` on the whole K.

    Contract: ``linear`` (sub-op ``linear_finish``), version 2.
    """
    op = "linear_finish"
    acc = v.tensor(op, "acc", acc)
    v.dtype(op, "acc", acc, (torch.int64,))
    if acc.dim() < 1:
        raise ValueError(f"{op}: acc has shape {tuple(acc.shape)}; expected [*, N]")
    lead, n = tuple(acc.shape[:-1]), acc.shape[-1]
    ex = _check_exponents(op, "ex", ex, lead, "one per row of acc")
    ew = _check_exponents(op, "ew", ew, (n,), "one per column of acc")
    bias = _check_bias(op, bias, n)
    out = _check_out_dtype(op, out_dtype, torch.float32)
    device = v.same_device(op, [("acc", acc), ("ex", ex), ("ew", ew), ("bias", bias)])
    if acc.numel() and bool((acc == torch.iinfo(torch.int64).min).any()):
        raise ValueError(f"{op}: acc holds -2**63, outside the range |acc| < 2**63 of exact partial sums; "
                         f"acc must be the int64 all-reduce SUM of linear_partial outputs")
    y = dispatch.call(op, device, acc=_rows(acc), ex=ex.reshape(-1), ew=ew, bias=bias, out_dtype=out)
    return y.reshape(*lead, n)
