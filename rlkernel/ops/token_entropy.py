"""``rlkernel.ops.token_entropy``: bitwise-reproducible entropy of each token's next-token distribution
under the LM head (contract ``token_entropy`` v1) and its backward (contract ``token_entropy_backward``
v1), wired into autograd."""

from __future__ import annotations

from typing import cast

import torch

from rlkernel import _validate as v
from rlkernel import dispatch, grads
from rlkernel.ops.token_logprobs import MAX_HIDDEN, MAX_VOCAB, _temperature

__all__ = ["TokenEntropyFunction", "token_entropy", "token_entropy_backward"]

#: Largest token count of one d_weight unit: the exact int64 digit product over tokens (|C| <= T * 2**47 < 2**63).
MAX_UNIT_TOKENS = (1 << 16) - 1

_SEMANTICS = """
    Bitwise semantics
    -----------------
    ``token_logprobs`` v2's construction: ``z = linear(hidden, W, out_dtype=float32) ÷
    fp32(temperature)`` (28-bit hidden grids, 21-bit head grids, exact int64 products, one
    rounding; one IEEE division), ``m = max_v z_v`` (R5), ``d = RN32(z - m)``, ``p = exp_c(d)``,
    ``L = ldexp_c(int_to_fp32(sum_v RNE(p 2**40)), -40)``; then the entropy terms ``g =
    RN32(p * (-d))`` (0 where p = 0) summed exactly on the same grid, ``mean =
    RN32(ldexp_c(int_to_fp32(sum_v RNE(g 2**40)), -40) / L)`` and ``H = RN32(log_c(L) + mean)``
    (``H = LSE - E[z]`` with both terms >= 0: no cancellation). NaN (canonical) exactly where
    ``m`` is not finite; otherwise finite and >= +0. Invariances: batch, chunking,
    prefill_decode, permutation, reduction_order (vocabulary and hidden axes), repeat. Contract
    ``token_entropy`` v1 (``rlkernel.contracts.token_entropy``)."""


def _operands(op: str, hidden: object, weight: object) -> torch.device:
    v.tensor(op, "hidden", hidden)
    v.tensor(op, "weight", weight)
    hidden, weight = cast(torch.Tensor, hidden), cast(torch.Tensor, weight)
    v.dtype(op, "hidden", hidden, v.HALF)
    v.dtype(op, "weight", weight, v.HALF)
    v.same_dtype(op, "hidden", hidden, "weight", weight)
    v.ndim(op, "hidden", hidden, 2, "[T, H] (tokens, hidden size); flatten batch axes first")
    v.ndim(op, "weight", weight, 2, "[V, H] (nn.Linear layout)")
    h = hidden.shape[1]
    if h < 1 or weight.shape[1] != h:
        raise ValueError(f"{op}: hidden has shape {tuple(hidden.shape)} and weight {tuple(weight.shape)}; "
                         f"expected [T, H] and [V, H] with the same H >= 1")
    if h > MAX_HIDDEN:
        raise ValueError(f"{op}: hidden size H = {h} exceeds the exact digit-matmul bound {MAX_HIDDEN} (2**16 - 1: "
                         f"28-bit hidden rows times 21-bit head rows must sum below 2**63 in int64)")
    vocab = weight.shape[0]
    if vocab < 1 or vocab > MAX_VOCAB:
        raise ValueError(f"{op}: vocab = {vocab}; expected 1 <= V <= {MAX_VOCAB} (2**22, the exact-sum bound "
                         f"for int64 accumulation with 40 fraction bits)")
    return v.same_device(op, [("hidden", hidden), ("weight", weight)])


def token_entropy(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of each token's next-token distribution: ``H_t = -sum_v p_tv log p_tv``.

    ``p_t = softmax(hidden_t @ weight.T / temperature)``: the entropy RL trainers log and
    regularise (verl's ``entropy_coeff``), without the ``[T, V]`` logits in memory (on sm_90 a
    call of more than one 128-token chunk holds the weight's int8 digit planes for its duration:
    3 bytes a weight element, independent of T, as :func:`rlkernel.ops.token_logprobs` does).

    Parameters
    ----------
    hidden : Tensor, bfloat16 or float16, [T, H]
        Final hidden states (after the model's last norm).
    weight : Tensor, hidden's dtype, [V, H]
        The LM head (``nn.Linear`` layout), 1 <= V <= 2**22.
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
        Wrong shapes, mixed devices, V outside [1, 2**22], H > 2**16 - 1, a temperature that is not
        > 0 and finite.

    Notes
    -----
    Differentiable in ``hidden`` and ``weight``: ``backward()`` runs
    :func:`token_entropy_backward` (the LM head's gradient per sequence unit of
    :mod:`rlkernel.grads`, summed exactly); see :class:`TokenEntropyFunction`. The [T, V] logits
    are never held whole: the backend works on bounded token x vocabulary blocks.
    {semantics}
    """
    op = "token_entropy"
    device = _operands(op, hidden, weight)
    tau = _temperature(op, temperature)
    hidden, weight = v.contiguous(hidden), v.contiguous(weight)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        out: torch.Tensor = TokenEntropyFunction.apply(hidden, weight, tau)
        return out
    return dispatch.call(op, device, hidden=hidden, weight=weight, temperature=tau)


class TokenEntropyFunction(torch.autograd.Function):
    """Autograd for :func:`token_entropy`: the backward is :func:`token_entropy_backward`.

    - ``d_hidden``: per token (a token's row depends only on its own grad and hidden row), so
      batch and micro-batch invariant like the forward.
    - ``d_weight``: one :func:`token_entropy_backward` call per sequence unit
      (:func:`rlkernel.grads.current_units`, captured at forward time: the sequences inside
      :func:`rlkernel.grads.sequence_units`, else the whole call), each an exact digit product
      over the unit's tokens rounded once to fp32; the per-unit terms are summed exactly
      (:func:`rlkernel.grads.weight_grad` / :func:`rlkernel.grads.deposit`), so the packing and
      micro-batching of whole sequences cannot change the bits of the LM head's gradient.
    """

    @staticmethod
    def forward(ctx, hidden, weight, temperature):  # type: ignore[no-untyped-def,override]
        ctx.save_for_backward(hidden, weight)
        ctx.temperature = temperature
        ctx.units = grads.current_units(hidden.shape[0])
        return dispatch.call("token_entropy", hidden.device, hidden=hidden, weight=weight, temperature=temperature)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        hidden, weight = ctx.saved_tensors
        need_h, need_w = bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1])
        g = grad.to(torch.float32).contiguous()
        op, tau = "token_entropy_backward", ctx.temperature
        if not need_w:
            dh, _ = dispatch.call(op, g.device, grad=g, hidden=hidden, weight=weight, temperature=tau,
                                  need_hidden=need_h, need_weight=False)
            return dh, None, None
        spans = [(a, b) for a, b in zip(ctx.units, ctx.units[1:]) if b > a]
        for a, b in spans:
            _unit_bound(b - a)
        if len(spans) == 1:  # the whole call is one unit
            dh, dw = dispatch.call(op, g.device, grad=g, hidden=hidden, weight=weight, temperature=tau,
                                   need_hidden=need_h, need_weight=True)
            return dh, grads.weight_grad(weight, dw.unsqueeze(0)), None
        dh_parts: list[torch.Tensor] = []
        units_sum = grads.UnitStates(weight)
        per_group = grads.units_per_group(weight)
        for g0 in range(0, len(spans), per_group):
            terms = []
            for a, b in spans[g0:g0 + per_group]:
                dh_u, dw_u = dispatch.call(op, g.device, grad=g[a:b], hidden=hidden[a:b], weight=weight,
                                           temperature=tau, need_hidden=need_h, need_weight=True)
                if dh_u is not None:
                    dh_parts.append(dh_u)
                terms.append(dw_u)
            units_sum.add_terms(torch.stack(terms))
        dh = None
        if need_h:
            dh = torch.cat(dh_parts) if dh_parts else torch.zeros_like(hidden)
        return dh, units_sum.gradient(), None


def _unit_bound(tokens: int) -> None:
    if tokens > MAX_UNIT_TOKENS:
        raise ValueError(f"token_entropy backward: the LM head's gradient of one sequence unit reduces over {tokens} "
                         f"tokens, above the exact-sum bound 2**16 - 1 = {MAX_UNIT_TOKENS}; run the forward inside "
                         f"rlkernel.grads.sequence_units(cu_seqlens) (one unit per sequence) or use smaller "
                         f"micro-batches")


def token_entropy_backward(grad: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
                           need_hidden: bool = True,
                           need_weight: bool = True) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of :func:`token_entropy` in ``hidden`` and ``weight`` for ``grad = dL/dH``.

    ``c_tv = -grad_t q_tv (z_tv / tau - sum_u q_tu z_tu / tau) / tau``; ``d_hidden = c @ weight``;
    ``d_weight = c.T @ hidden``

    Parameters
    ----------
    grad : Tensor, float32, [T]
        Gradient of the loss with respect to each token's entropy.
    hidden : Tensor, bfloat16 or float16, [T, H]
    weight : Tensor, hidden's dtype, [V, H], 1 <= V <= 2**22
    temperature : float
        As in :func:`token_entropy`.
    need_hidden, need_weight : bool
        Which gradients to compute; the other is returned as None (and costs nothing).

    Returns
    -------
    d_hidden : Tensor, hidden's dtype, [T, H], or None
    d_weight : Tensor, float32, [V, H], or None
        The call's tokens as one unit, rounded once (T <= 2**16 - 1 when needed); autograd calls
        this once per sequence unit and sums the units exactly.

    Raises
    ------
    TypeError, ValueError
        As :func:`token_entropy`; grad not float32 [T]; need_* not bools; T > 2**16 - 1 with
        ``need_weight``.
    rlkernel.dispatch.BackwardNotDefined
        An input requires grad with grad mode on (no double backward).

    Bitwise semantics
    -----------------
    The forward's exact ``d = RN32(z - m)``, ``p``, ``L`` and ``mean``; ``q = RN32(p / L)``,
    ``e = RN32(d + mean)``, ``a = RN32(q * e)`` (0 where p = 0), ``s = RN32(grad / fp32(tau))``,
    ``c = RN32((-s) * a)`` kept in fp32 (NaN rows where the forward is NaN). ``d_hidden``: linear
    v2 digit product of c (28-bit row grids over the vocabulary) and W.T (21-bit grids), the
    exact sum over the whole vocabulary (two int64 words), one rounding to hidden's dtype.
    ``d_weight``: linear v2 digit product of c.T (28-bit grids over the call's tokens) and h.T
    (21-bit grids), one rounding to fp32. Invariances: batch, permutation, reduction_order, repeat.
    Contract ``token_entropy_backward`` v1 (``rlkernel.contracts.token_entropy_backward``).
    """
    op = "token_entropy_backward"
    device = _operands(op, hidden, weight)
    tau = _temperature(op, temperature)
    v.tensor(op, "grad", grad)
    v.dtype(op, "grad", grad, (torch.float32,))
    if tuple(grad.shape) != (hidden.shape[0],):
        raise ValueError(f"{op}: grad has shape {tuple(grad.shape)}; expected [T] = [{hidden.shape[0]}], one "
                         f"dL/dH per row of hidden")
    v.same_device(op, [("hidden", hidden), ("grad", grad)])
    for name, flag in (("need_hidden", need_hidden), ("need_weight", need_weight)):
        if not isinstance(flag, bool):
            raise TypeError(f"{op}: {name} must be a bool, got {type(flag).__name__}")
    if need_weight and hidden.shape[0] > MAX_UNIT_TOKENS:
        raise ValueError(f"{op}: d_weight reduces over T = {hidden.shape[0]} tokens, above the exact-sum bound "
                         f"2**16 - 1 = {MAX_UNIT_TOKENS}; call it per sequence (unit) and sum the terms exactly "
                         f"(rlkernel.grads.weight_grad), or pass need_weight=False")
    return dispatch.call(op, device, grad=v.contiguous(grad), hidden=v.contiguous(hidden),
                         weight=v.contiguous(weight), temperature=tau, need_hidden=need_hidden,
                         need_weight=need_weight)


token_entropy.__doc__ = (token_entropy.__doc__ or "").replace("    {semantics}\n",
                                                              "\n" + _SEMANTICS.lstrip("\n") + "\n")
