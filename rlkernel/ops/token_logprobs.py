"""``rlkernel.ops.token_logprobs``: bitwise-reproducible token log-probabilities under the LM head
(contract ``token_logprobs`` v2), its vocabulary-sharded (tensor-parallel) form, and its backward
(contract ``token_logprobs_backward`` v1), wired into autograd."""

from __future__ import annotations

import math
import numbers
from typing import cast

import torch

from rlkernel import _validate as v
from rlkernel import dispatch, grads

#: Largest vocabulary (all shards together): V * 2**40 < 2**63 (exact probability sum, F = 40).
MAX_VOCAB = 1 << 22
#: Largest hidden size of the digit matmul: H * 2**47 < 2**63.
MAX_HIDDEN = (1 << 16) - 1
#: Largest token count of one d_weight unit: the exact int64 digit product over tokens (|C| <= T * 2**47 < 2**63).
MAX_UNIT_TOKENS = (1 << 16) - 1
#: Token ids may come as int64 or int32 (as for embedding); the kernels always receive int64.
_IDS = (torch.int64, torch.int32)

_SEMANTICS = """
    Bitwise semantics
    -----------------
    ``z = linear(hidden, W, out_dtype=float32) ÷ fp32(temperature)`` (contract ``linear`` v2
    logits: hidden rows on 28-bit grids, head rows on 21-bit grids, exact int64 dot products,
    one rounding to fp32; then one IEEE fp32 division); ``m = max_j z_j`` (R5);
    ``L = ldexp_c(int_to_fp32(sum_j RNE(exp_c(z_j - m) * 2**40)), -40)`` (absolute grid E = 0,
    F = 40: an exact integer sum, so the vocabulary may be tiled, split or sharded freely);
    ``out = (z_target - m) - log_c(L)``, NaN-canonical. ``out`` is NaN exactly where ``m`` is
    not finite (a non-finite value in the hidden row or in any weight row, or logits that
    overflow to +inf, e.g. with a tiny temperature); otherwise it is finite or -inf.
    Invariances: batch, chunking, prefill_decode, permutation, reduction_order (vocabulary and
    hidden axes), tp_degree, repeat. Contract ``token_logprobs`` v2
    (``rlkernel.contracts.token_logprobs``)."""


def _temperature(op: str, temperature: object) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"{op}: temperature must be a Python float, got {type(temperature).__name__}; "
                        f"pass e.g. temperature=1.0")
    t = float(temperature)
    t32 = float(torch.tensor(t, dtype=torch.float32)) if math.isfinite(t) else t
    if not (math.isfinite(t32) and t32 > 0):
        raise ValueError(f"{op}: temperature = {temperature!r} (fp32: {t32!r}); expected a value > 0 that stays "
                         f"finite and nonzero in fp32 (1.0 = plain log-probabilities; use sample() with "
                         f"temperature 0 for greedy decoding)")
    return t


def _operands(op: str, hidden: object, weight: object, targets: object, weight_name: str) -> torch.device:
    v.tensor(op, "hidden", hidden)
    v.tensor(op, weight_name, weight)
    v.tensor(op, "targets", targets)
    hidden, weight, targets = cast(torch.Tensor, hidden), cast(torch.Tensor, weight), cast(torch.Tensor, targets)
    v.dtype(op, "hidden", hidden, v.HALF)
    v.dtype(op, weight_name, weight, v.HALF)
    v.same_dtype(op, "hidden", hidden, weight_name, weight)
    v.dtype(op, "targets", targets, _IDS)
    v.ndim(op, "hidden", hidden, 2, "[T, H] (tokens, hidden size); flatten batch axes first")
    v.ndim(op, weight_name, weight, 2, f"[{'Vs' if weight_name != 'weight' else 'V'}, H] (nn.Linear layout)")
    v.ndim(op, "targets", targets, 1, "[T], one target token id per row of hidden")
    h = hidden.shape[1]
    if h < 1 or weight.shape[1] != h:
        raise ValueError(f"{op}: hidden has shape {tuple(hidden.shape)} and {weight_name} {tuple(weight.shape)}; "
                         f"expected [T, H] and [V, H] with the same H >= 1")
    if h > MAX_HIDDEN:
        raise ValueError(f"{op}: hidden size H = {h} exceeds the exact digit-matmul bound {MAX_HIDDEN} (2**16 - 1: "
                         f"28-bit hidden rows times 21-bit head rows must sum below 2**63 in int64)")
    if targets.shape[0] != hidden.shape[0]:
        raise ValueError(f"{op}: targets has shape {tuple(targets.shape)} but hidden has {hidden.shape[0]} rows; "
                         f"expected one target per row")
    if weight.shape[0] < 1:
        raise ValueError(f"{op}: {weight_name} has shape {tuple(weight.shape)}; expected at least one vocabulary row")
    return v.same_device(op, [("hidden", hidden), (weight_name, weight), ("targets", targets)])


def _targets_in(op: str, targets: torch.Tensor, low: int, high: int, what: str) -> None:
    if targets.numel() == 0 or v.capturing(targets.device):  # a CUDA-graph capture cannot read them on the host
        return
    lo, hi = v.int_range(targets)
    if lo < low or hi >= high:
        bad = lo if lo < low else hi
        raise ValueError(f"{op}: targets holds {bad}; expected token ids in [{low}, {high}) ({what}). "
                         f"Mask or drop padding positions before calling")


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each target token: ``log_softmax(hidden @ weight.T / temperature)[targets]``.

    Parameters
    ----------
    hidden : Tensor, bfloat16 or float16, [T, H]
        Final hidden states (after the last norm), one row per token.
    weight : Tensor, hidden's dtype, [V, H]
        LM head (``nn.Linear`` layout), V <= 2**22, on hidden's device.
    targets : Tensor, int64 or int32, [T]
        Token whose log-probability is wanted, in [0, V).
    temperature : float
        Logits are divided by ``fp32(temperature)``; must be > 0 and finite in fp32 (default 1).

    Returns
    -------
    Tensor, float32, [T]

    Raises
    ------
    TypeError
        A non-tensor, a wrong dtype, mixed dtypes, or a non-real temperature.
    ValueError
        Wrong shapes, mixed devices, V > 2**22, a target outside [0, V), a temperature that is
        not > 0 and finite.

    Notes
    -----
    Non-contiguous inputs are read through contiguous copies. The [T, V] logits are never
    held whole: the backend works on bounded token x vocabulary blocks. On sm_90 (the cuda
    backend's wgmma digit GEMM), a call of more than one 128-token chunk also holds the
    weight's int8 digit planes for its duration (3 bytes a weight element, independent of T:
    1.87 GB for Qwen3-8B's LM head), as the backward does. Differentiable in
    ``hidden`` and ``weight``: ``backward()`` runs :func:`token_logprobs_backward` (the LM
    head's gradient per sequence unit of :mod:`rlkernel.grads`, summed exactly); see
    :class:`TokenLogprobsFunction`.
    {semantics}
    """
    op = "token_logprobs"
    device = _operands(op, hidden, weight, targets, "weight")
    tau = _temperature(op, temperature)
    vocab = weight.shape[0]
    if vocab > MAX_VOCAB:
        raise ValueError(f"{op}: vocab={vocab} exceeds the exact-sum bound {MAX_VOCAB} (2**22) for int64 "
                         f"accumulation with 40 fraction bits; shard the vocabulary (token_logprobs_partial)")
    _targets_in(op, targets, 0, vocab, f"V = {vocab}")
    ids = v.contiguous(targets.to(torch.int64))
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        out: torch.Tensor = TokenLogprobsFunction.apply(v.contiguous(hidden), v.contiguous(weight), ids, tau)
        return out
    return dispatch.call(op, device, hidden=v.contiguous(hidden), weight=v.contiguous(weight), targets=ids,
                         temperature=tau)


class TokenLogprobsFunction(torch.autograd.Function):
    """Autograd for :func:`token_logprobs`: the backward is :func:`token_logprobs_backward`.

    - ``d_hidden``: per token (a token's row depends only on its own grad, hidden row and
      target), so batch and micro-batch invariant like the forward.
    - ``d_weight``: one :func:`token_logprobs_backward` call per sequence unit ``u``
      (:func:`rlkernel.grads.current_units`, captured at forward time: the sequences inside
      :func:`rlkernel.grads.sequence_units`, else the whole call), each an exact digit product
      over the unit's tokens rounded once to fp32; the per-unit terms are summed exactly
      (:func:`rlkernel.grads.weight_grad`). No sequence spans two units, so the packing and the
      micro-batching of whole sequences cannot change the bits of the LM head's gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature):  # type: ignore[no-untyped-def,override]
        ctx.save_for_backward(hidden, weight, targets)
        ctx.temperature = temperature
        ctx.units = grads.current_units(hidden.shape[0])
        return dispatch.call("token_logprobs", hidden.device, hidden=hidden, weight=weight, targets=targets,
                             temperature=temperature)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        hidden, weight, targets = ctx.saved_tensors
        need_h, need_w = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        g = grad.to(torch.float32).contiguous()
        op, tau = "token_logprobs_backward", ctx.temperature
        if not need_w:
            dh, _ = dispatch.call(op, g.device, grad=g, hidden=hidden, weight=weight, targets=targets,
                                  temperature=tau, need_hidden=need_h, need_weight=False)
            return dh, None, None, None
        spans = [(a, b) for a, b in zip(ctx.units, ctx.units[1:]) if b > a]
        for a, b in spans:
            _unit_bound(b - a)
        if len(spans) == 1:  # the whole call is one unit
            dh, dw = dispatch.call(op, g.device, grad=g, hidden=hidden, weight=weight, targets=targets,
                                   temperature=tau, need_hidden=need_h, need_weight=True)
            return dh, grads.weight_grad(weight, dw.unsqueeze(0)), None, None
        # d_hidden is per token: one call over every token has the bits of the per-unit calls and
        # runs the vocabulary pass and its d_hidden products once instead of once a unit
        dh = None
        if need_h:
            dh, _ = dispatch.call(op, g.device, grad=g, hidden=hidden, weight=weight, targets=targets,
                                  temperature=tau, need_hidden=True, need_weight=False)
        units_sum = grads.UnitStates(weight)
        per_group = grads.units_per_group(weight)
        for g0 in range(0, len(spans), per_group):
            terms = [dispatch.call(op, g.device, grad=g[a:b], hidden=hidden[a:b], weight=weight, targets=targets[a:b],
                                   temperature=tau, need_hidden=False, need_weight=True)[1]
                     for a, b in spans[g0:g0 + per_group]]
            units_sum.add_terms(torch.stack(terms))
        return dh, units_sum.gradient(), None, None


def _unit_bound(tokens: int) -> None:
    if tokens > MAX_UNIT_TOKENS:
        raise ValueError(f"token_logprobs backward: the LM head's gradient of one sequence unit reduces over "
                         f"{tokens} tokens, above the exact-sum bound 2**16 - 1 = {MAX_UNIT_TOKENS}; run the forward "
                         f"inside rlkernel.grads.sequence_units(cu_seqlens) (one unit per sequence) or use smaller "
                         f"micro-batches")


def token_logprobs_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                            temperature: float = 1.0, need_hidden: bool = True,
                            need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of :func:`token_logprobs` in ``hidden`` and ``weight`` for ``grad = dL/dlogp``.

    ``c_tv = grad_t (onehot_v(y_t) - softmax_tv) / tau``; ``d_hidden = c @ weight``; ``d_weight = c.T @ hidden``

    Parameters
    ----------
    grad : Tensor, float32, [T]
        Gradient of the loss with respect to each token's log-probability.
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight : Tensor, hidden's dtype, [V, H], V <= 2**22
    targets : Tensor, int64 or int32, [T], in [0, V)
    temperature : float
        As in :func:`token_logprobs`.
    need_hidden, need_weight : bool
        Which gradients to compute; the other is returned as None (and costs nothing).

    Returns
    -------
    d_hidden : Tensor, hidden's dtype, [T, H], or None
    d_weight : Tensor, float32, [V, H], or None
        This call's tokens as one unit (T <= 2**16 - 1), rounded once to fp32. Sum several
        calls' ``d_weight`` exactly with :func:`rlkernel.grads.weight_grad`, never in floating point.

    Raises
    ------
    TypeError, ValueError
        As :func:`token_logprobs`; also ``grad`` not float32 [T], non-bool flags, or
        ``need_weight`` with T > 2**16 - 1 tokens (the exact int64 product over tokens).

    Notes
    -----
    The [T, V] logits are never held whole: the backend works on bounded token x vocabulary
    blocks (the logits of a vocabulary block are computed twice when ``need_weight``: once
    with the row sums and ``d_hidden``, once for ``d_weight``).

    Bitwise semantics
    -----------------
    The forward's own exact construction gives ``p = exp_c(z - m)`` and ``L`` (the 2**-40 grid
    sum ``S`` rounded once); ``q = RN32(p / L)``; off the target ``a = -q``, on it the exact
    complement ``a_y = RN32(RN32((S - P_y) 2**-40) / L)`` (``P = RNE(p 2**40)``), so a token
    whose probability is within 2**-24 of 1 keeps its gradient; ``s = RN32(grad /
    fp32(temperature))``; ``c = RN_dtype(RN32(s * a))`` (the bf16/fp16 ``grad_logits`` of
    autograd), NaN on rows whose log-probability is NaN. ``d_hidden`` is the linear v2 digit
    product of ``c`` (28-bit rows) and the columns of ``weight`` (21-bit grids over the whole
    vocabulary), its exact sum carried past int64 in two int64 words (chunk partials ``C >> 32``
    and ``C & (2**32 - 1)``), rounded once to hidden's dtype: the bits cannot depend on how the
    vocabulary is chunked. ``d_weight`` is the linear v2 digit product of ``c.T`` (28-bit rows
    over this call's tokens) and ``hidden.T`` (21-bit rows), rounded once to fp32. NaN where
    linear v2 puts it (a non-finite coefficient or operand row), canonical.
    Invariances: batch and permutation of tokens (``d_hidden`` per token; ``d_weight`` of the
    call independent of token order), reduction order (vocabulary and hidden axes), repeat.
    Contract ``token_logprobs_backward`` v1 (``rlkernel.contracts.token_logprobs_backward``).
    """
    op = "token_logprobs_backward"
    device = _operands(op, hidden, weight, targets, "weight")
    tau = _temperature(op, temperature)
    v.tensor(op, "grad", grad)
    v.dtype(op, "grad", grad, (torch.float32,))
    if tuple(grad.shape) != (hidden.shape[0],):
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)}; expected [T] = [{hidden.shape[0]}], one "
                         f"dL/dlogp per row of hidden (the gradient of token_logprobs' output)")
    v.same_device(op, [("hidden", hidden), ("grad", grad)])
    for name, flag in (("need_hidden", need_hidden), ("need_weight", need_weight)):
        if not isinstance(flag, bool):
            raise TypeError(f"{op}: {name} must be a bool, got {type(flag).__name__}")
    vocab = weight.shape[0]
    if vocab > MAX_VOCAB:
        raise ValueError(f"{op}: vocab={vocab} exceeds the exact-sum bound {MAX_VOCAB} (2**22) of the forward's "
                         f"probability sum")
    if need_weight and hidden.shape[0] > MAX_UNIT_TOKENS:
        raise ValueError(f"{op}: d_weight reduces over T = {hidden.shape[0]} tokens, above the exact-sum bound "
                         f"2**16 - 1 = {MAX_UNIT_TOKENS}; call it per sequence (or in smaller pieces) and add the "
                         f"d_weight terms exactly with rlkernel.grads.weight_grad")
    _targets_in(op, targets, 0, vocab, f"V = {vocab}")
    return dispatch.call(op, device, grad=v.contiguous(grad), hidden=v.contiguous(hidden),
                         weight=v.contiguous(weight), targets=v.contiguous(targets.to(torch.int64)),
                         temperature=tau, need_hidden=need_hidden, need_weight=need_weight)


def token_logprobs_partial(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                           vocab_start: int, temperature: float = 1.0,
                           row_max: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One vocabulary shard's part of :func:`token_logprobs` (tensor parallelism), two phases.

    Phase 1 (``row_max=None``) returns the shard's row max; all-reduce it with MAX (R5: NaN
    must propagate) to get the global max ``m``. Phase 2 (``row_max=m``) returns
    ``(sum_int, target_d)``; all-reduce ``sum_int`` with SUM (int64: exact in any order) and
    ``target_d.view(torch.int32)`` with SUM (every shard but the target's owner holds +0, bit
    pattern 0, so the integer sum is the owner's exact bits, -0 and NaN included; a float sum
    would turn -0 into +0). Then :func:`token_logprobs_finish` gives the bits of
    :func:`token_logprobs` on the whole vocabulary, for any number of shards.

    Parameters
    ----------
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight_shard : Tensor, hidden's dtype, [Vs, H]
        Rows ``vocab_start .. vocab_start + Vs - 1`` of the full LM head.
    targets : Tensor, int64 or int32, [T]
        Global token ids in [0, 2**22) (the same tensor on every shard).
    vocab_start : int
        Global id of the shard's first row; ``vocab_start + Vs <= 2**22``.
    temperature : float
        As in :func:`token_logprobs` (the same on every shard).
    row_max : Tensor, float32, [T], optional
        Phase 2: the global R5 row max from phase 1.

    Returns
    -------
    Tensor, float32, [T]
        Phase 1: the shard's R5 row max of the logits.
    tuple of (Tensor, int64, [T]; Tensor, float32, [T])
        Phase 2: ``sum_int``, the shard's exact integer part of ``sum_j RNE(exp_c(z_j - m) *
        2**40)`` (0 where ``m`` is not finite); ``target_d = z_target - m`` on the owning
        shard (NaN there where ``m`` is not finite), +0 elsewhere.

    Raises
    ------
    TypeError, ValueError
        As :func:`token_logprobs`; also a negative ``vocab_start``, a shard reaching past
        2**22, a ``row_max`` of the wrong dtype/shape/device, or (from the backend) a finite
        ``row_max`` below one of this shard's logits.
    {semantics}
    """
    op = "token_logprobs_partial"
    device = _operands(op, hidden, weight_shard, targets, "weight_shard")
    tau = _temperature(op, temperature)
    if isinstance(vocab_start, bool) or not isinstance(vocab_start, numbers.Integral):
        raise TypeError(f"{op}: vocab_start must be a Python int, got {type(vocab_start).__name__}")
    start, vs = int(vocab_start), weight_shard.shape[0]
    if start < 0 or start + vs > MAX_VOCAB:
        raise ValueError(f"{op}: vocab_start = {start} with a shard of {vs} rows; expected 0 <= vocab_start and "
                         f"vocab_start + Vs <= {MAX_VOCAB} (2**22, the exact-sum bound of the whole vocabulary)")
    _targets_in(op, targets, 0, MAX_VOCAB, "global ids of a vocabulary of at most 2**22")
    if row_max is not None:
        v.tensor(op, "row_max", row_max)
        v.dtype(op, "row_max", row_max, (torch.float32,))
        if tuple(row_max.shape) != (hidden.shape[0],):
            raise ValueError(f"{op}: row_max has shape {tuple(row_max.shape)}; expected [T] = "
                             f"[{hidden.shape[0]}], the all-reduced output of phase 1")
        v.same_device(op, [("hidden", hidden), ("row_max", row_max)])
        row_max = v.contiguous(row_max)
    return dispatch.call(op, device, hidden=v.contiguous(hidden), weight_shard=v.contiguous(weight_shard),
                         targets=v.contiguous(targets.to(torch.int64)), vocab_start=start, temperature=tau,
                         row_max=row_max)


def token_logprobs_finish(sum_int: torch.Tensor, target_d: torch.Tensor) -> torch.Tensor:
    """Finish the sharded form: ``target_d - log_c(ldexp_c(int_to_fp32(sum_int), -40))``.

    Parameters
    ----------
    sum_int : Tensor, int64, [T]
        SUM over all shards of phase 2's ``sum_int``.
    target_d : Tensor, float32, [T]
        The owner's ``target_d`` (SUM over shards of the int32 bit patterns).

    Returns
    -------
    Tensor, float32, [T]: the bits of :func:`token_logprobs` on the whole vocabulary.

    Raises
    ------
    TypeError, ValueError
        Wrong dtypes, shapes or devices; a negative ``sum_int`` (not a sum of phase 2 outputs).

    Bitwise semantics
    -----------------
    One P3 rounding of the integer total, ``ldexp_c`` by -40, ``log_c``, one fp32 subtraction,
    NaN-canonical. Contract ``token_logprobs`` v2.
    """
    op = "token_logprobs_finish"
    v.tensor(op, "sum_int", sum_int)
    v.tensor(op, "target_d", target_d)
    v.dtype(op, "sum_int", sum_int, (torch.int64,))
    v.dtype(op, "target_d", target_d, (torch.float32,))
    v.ndim(op, "sum_int", sum_int, 1, "[T]")
    if tuple(target_d.shape) != tuple(sum_int.shape):
        raise ValueError(f"{op}: target_d has shape {tuple(target_d.shape)} but sum_int {tuple(sum_int.shape)}; "
                         f"expected both [T]")
    device = v.same_device(op, [("sum_int", sum_int), ("target_d", target_d)])
    if sum_int.numel() and int(sum_int.min()) < 0:
        raise ValueError(f"{op}: sum_int holds {int(sum_int.min())}; expected sums of phase 2's non-negative "
                         f"int64 partials (all-reduce SUM as int64, never through a float type)")
    return dispatch.call(op, device, sum_int=v.contiguous(sum_int), target_d=v.contiguous(target_d))


# One text for the shared semantics, so the three docstrings cannot disagree.
for _fn in (token_logprobs, token_logprobs_partial):
    _fn.__doc__ = (_fn.__doc__ or "").replace("    {semantics}\n", "\n" + _SEMANTICS.lstrip("\n") + "\n")


def _int64_vector(op: str, name: str, t: object, size: int, what: str) -> torch.Tensor:
    t = v.tensor(op, name, t)
    v.dtype(op, name, t, (torch.int64,))
    if tuple(t.shape) != (size,):
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}; expected [{size}] ({what})")
    return t


def _exponent_values(op: str, name: str, e: torch.Tensor) -> None:
    ok = ((e >= -149) & (e <= 128)) | (e == (1 << 20))
    if e.numel() and not bool(ok.all()):
        i = int((~ok).nonzero()[0, 0])
        raise ValueError(f"{op}: {name}[{i}] = {int(e[i])}; expected exponents in [-149, 128] or the non-finite "
                         f"sentinel 2**20, as phase 1 returns them (all-reduced with MAX over the shards)")


def token_logprobs_backward_partial(grad: torch.Tensor, hidden: torch.Tensor, weight_shard: torch.Tensor,
                                    targets: torch.Tensor, vocab_start: int, row_max: torch.Tensor,
                                    sum_int: torch.Tensor, temperature: float = 1.0,
                                    exponents: tuple[torch.Tensor, torch.Tensor] | None = None,
                                    need_weight: bool = True) -> tuple[torch.Tensor | None, ...]:
    """One vocabulary shard's part of :func:`token_logprobs_backward` (tensor parallelism), two phases.

    Phase 1 (``exponents=None``) returns ``(ec, ew)``: the exponents of the shard's coefficient rows
    and weight columns; all-reduce both with MAX. Phase 2 (``exponents=(ec, ew)``) returns ``(hi,
    lo, d_weight_shard)``: all-reduce ``hi`` and ``lo`` with SUM (int64, exact in any order), then
    :func:`token_logprobs_backward_finish` gives ``d_hidden`` with the bits of the unsharded op;
    ``d_weight_shard`` is this shard's rows of ``d_weight``, final.

    Parameters
    ----------
    grad : Tensor, float32, [T]
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight_shard : Tensor, hidden's dtype, [Vs, H]: rows ``vocab_start ..`` of the LM head
    targets : Tensor, int64 or int32, [T]: global ids (the same tensor on every shard)
    vocab_start : int
    row_max : Tensor, float32, [T]
        The forward's global row max (MAX over the shards of ``token_logprobs_partial`` phase 1).
    sum_int : Tensor, int64, [T]
        The forward's global probability sum (SUM over the shards of phase 2's ``sum_int``).
    temperature : float
    exponents : tuple of (Tensor int64 [T], Tensor int64 [H]), optional
        Phase 2: the global exponents (MAX over the shards of phase 1).
    need_weight : bool
        Phase 2: also return this shard's rows of ``d_weight`` (else None).

    Returns
    -------
    Phase 1: tuple (Tensor int64 [T], Tensor int64 [H]).
    Phase 2: tuple (Tensor int64 [T, H], Tensor int64 [T, H], Tensor float32 [Vs, H] or None).

    Raises
    ------
    TypeError, ValueError
        As :func:`token_logprobs_partial`; also bad ``row_max``/``sum_int``/``exponents`` dtypes or
        shapes, exponents outside [-149, 128] and not 2**20, or (from the backend) a finite
        ``row_max`` below one of this shard's logits.

    Bitwise semantics
    -----------------
    Contract ``token_logprobs_backward`` v1, sharded form: each shard makes the coefficients of its
    rows from the global ``m`` and ``S`` (the target's exact complement on the owner), puts them on
    the global 28-bit row grids and the weight columns on the global 21-bit grids, and returns the
    exact sum over its rows as two int64 words ``(sum C >> 32, sum C & (2**32 - 1))``.
    """
    op = "token_logprobs_backward_partial"
    device = _operands(op, hidden, weight_shard, targets, "weight_shard")
    tau = _temperature(op, temperature)
    t, h = hidden.shape
    v.tensor(op, "grad", grad)
    v.dtype(op, "grad", grad, (torch.float32,))
    if tuple(grad.shape) != (t,):
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)}; expected [T] = [{t}]")
    if isinstance(vocab_start, bool) or not isinstance(vocab_start, numbers.Integral):
        raise TypeError(f"{op}: vocab_start must be a Python int, got {type(vocab_start).__name__}")
    start = int(vocab_start)
    if start < 0 or start + weight_shard.shape[0] > MAX_VOCAB:
        raise ValueError(f"{op}: vocab_start = {start} with a shard of {weight_shard.shape[0]} rows; expected "
                         f"0 <= vocab_start and vocab_start + Vs <= {MAX_VOCAB}")
    _targets_in(op, targets, 0, MAX_VOCAB, "global ids of a vocabulary of at most 2**22")
    v.tensor(op, "row_max", row_max)
    v.dtype(op, "row_max", row_max, (torch.float32,))
    if tuple(row_max.shape) != (t,):
        raise ValueError(f"{op}: row_max has shape {tuple(row_max.shape)}; expected [T] = [{t}], the all-reduced "
                         f"output of token_logprobs_partial's phase 1")
    sum_int = _int64_vector(op, "sum_int", sum_int, t, "the all-reduced sum_int of token_logprobs_partial's phase 2")
    if not isinstance(need_weight, bool):
        raise TypeError(f"{op}: need_weight must be a bool, got {type(need_weight).__name__}")
    tensors = [("hidden", hidden), ("grad", grad), ("row_max", row_max), ("sum_int", sum_int)]
    ex = None
    if exponents is not None:
        if not isinstance(exponents, (tuple, list)) or len(exponents) != 2:
            raise TypeError(f"{op}: exponents must be a pair (ec [T], ew [H]) from phase 1, all-reduced with MAX")
        ec = _int64_vector(op, "ec", exponents[0], t, "one per token")
        ew = _int64_vector(op, "ew", exponents[1], h, "one per hidden channel")
        _exponent_values(op, "ec", ec)
        _exponent_values(op, "ew", ew)
        tensors += [("ec", ec), ("ew", ew)]
        ex = (v.contiguous(ec), v.contiguous(ew))
        if need_weight and t > MAX_UNIT_TOKENS:
            raise ValueError(f"{op}: d_weight reduces over T = {t} tokens, above the exact-sum bound 2**16 - 1")
    v.same_device(op, tensors)
    return dispatch.call(op, device, grad=v.contiguous(grad), hidden=v.contiguous(hidden),
                         weight_shard=v.contiguous(weight_shard), targets=v.contiguous(targets.to(torch.int64)),
                         vocab_start=start, row_max=v.contiguous(row_max), sum_int=v.contiguous(sum_int),
                         temperature=tau, exponents=ex, need_weight=need_weight)


def token_logprobs_backward_finish(hi: torch.Tensor, lo: torch.Tensor, ec: torch.Tensor, ew: torch.Tensor,
                                   out_dtype: torch.dtype) -> torch.Tensor:
    """Finish the sharded backward: ``d_hidden = RN_out((hi 2**32 + lo) 2**(ec + ew - 47))``.

    Parameters
    ----------
    hi, lo : Tensor, int64, [T, H]
        SUM over the shards of :func:`token_logprobs_backward_partial` phase 2's words.
    ec : Tensor, int64, [T]
    ew : Tensor, int64, [H]
        The global exponents (MAX over the shards of phase 1).
    out_dtype : torch.dtype
        hidden's dtype: ``torch.bfloat16`` or ``torch.float16``.

    Returns
    -------
    Tensor, out_dtype, [T, H]: the bits of :func:`token_logprobs_backward`'s ``d_hidden``.

    Bitwise semantics
    -----------------
    One rounding of the exact two-word value (P3'), NaN where ``ec`` or ``ew`` is the sentinel
    2**20, canonical NaN. Contract ``token_logprobs_backward`` v1.
    """
    op = "token_logprobs_backward_finish"
    hi, lo = v.tensor(op, "hi", hi), v.tensor(op, "lo", lo)
    v.dtype(op, "hi", hi, (torch.int64,))
    v.dtype(op, "lo", lo, (torch.int64,))
    v.ndim(op, "hi", hi, 2, "[T, H]")
    if tuple(lo.shape) != tuple(hi.shape):
        raise ValueError(f"{op}: lo has shape {tuple(lo.shape)} but hi {tuple(hi.shape)}; expected both [T, H]")
    ec = _int64_vector(op, "ec", ec, hi.shape[0], "one per token")
    ew = _int64_vector(op, "ew", ew, hi.shape[1], "one per hidden channel")
    _exponent_values(op, "ec", ec)
    _exponent_values(op, "ew", ew)
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"{op}: out_dtype is {out_dtype!r}; expected hidden's dtype, torch.bfloat16 or torch.float16")
    limit = 1 << 62
    for name, t in (("hi", hi), ("lo", lo)):
        if t.numel() and bool((t.abs() >= limit).any() | (t == torch.iinfo(torch.int64).min).any()):
            raise ValueError(f"{op}: {name} holds a value of magnitude >= 2**62; expected the int64 SUM of phase 2's "
                             f"words (never through a float type)")
    device = v.same_device(op, [("hi", hi), ("lo", lo), ("ec", ec), ("ew", ew)])
    return dispatch.call(op, device, hi=v.contiguous(hi), lo=v.contiguous(lo), ec=v.contiguous(ec),
                         ew=v.contiguous(ew), out_dtype=out_dtype)
