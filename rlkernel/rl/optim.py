"""Optimizers and gradient clipping with the same bits on every backend: :class:`AdamW`, :class:`SGD`,
:func:`clip_grad_norm_`.

The update is contract ``adamw`` (``rlkernel.ops.adamw``) on fp32 master weights; a bf16 or
fp16 parameter keeps its fp32 master copy in the optimizer state and receives the master
rounded to its dtype after each step (one IEEE round-to-nearest-even cast). The global gradient
norm is an exact sum of the fp32 squares (the ``masked_mean`` superaccumulator partials, which
add exactly across parameters, micro-batches and ranks), so clipping does not depend on the
parameter order, bucketing or device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from rlkernel.ops import adamw, sgd
from rlkernel.ops._optim_scalars import rn32, rn32_sqrt
from rlkernel.rl.losses import all_reduce_partial, finish_partials, masked_mean_partial, merge_partials

__all__ = ["SGD", "AdamW", "clip_grad_norm_", "grad_norm"]

Params = Iterable[torch.Tensor] | Iterable[dict[str, Any]]


def gradient_of(p: torch.Tensor) -> torch.Tensor | None:
    """``p.main_grad`` (fp32, from :class:`rlkernel.grads.ExactGradients`) when set, else ``p.grad``."""
    main = getattr(p, "main_grad", None)
    return main if main is not None else p.grad


def _grads(parameters: torch.Tensor | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads = [gradient_of(p) for p in params]
    return [g for g in grads if g is not None]


#: squares per row of the exact sum in :func:`grad_norm` (the Triton masked_mean takes rows up to 2**22)
NORM_ROW = 1 << 16
#: gradients below this many elements are concatenated (per device) into buckets of about this many,
#: one exact sum each: a step's ~30-300 small gradients cost a few launches instead of ~5 each
#: (the H200 trainer step at b844a1c spent 21 ms of host time in grad_norm for 1.7 ms of kernels)
NORM_BUCKET = 1 << 24


def _square_partials(flat: torch.Tensor) -> list[torch.Tensor]:
    """The exact partials of the fp32 squares of a 1-D fp32 tensor: rows of NORM_ROW and one shorter
    row (the sum is exact, so the layout is free; one row of a whole 155M-element LM head would run
    the device-generic code)."""
    whole = flat.numel() // NORM_ROW * NORM_ROW
    partials = []
    for rows in (flat[:whole].view(-1, NORM_ROW), flat[whole:].view(1, -1)):
        if rows.numel():
            sq = torch.mul(rows, rows)
            partials.append(masked_mean_partial(sq, torch.ones_like(sq, dtype=torch.bool)))
    return partials


def grad_norm(parameters: torch.Tensor | Iterable[torch.Tensor], group: Any = None) -> float:
    """The global L2 norm of the gradients: ``RN32(sqrt(RN32(sum of RN32(fp32(g)**2))))``, exact sum.

    Parameters
    ----------
    parameters : Tensor or iterable of Tensors
        Parameters whose ``.grad`` counts (those without a gradient are skipped).
    group : torch.distributed process group, optional
        Sum the squares over the ranks of this group too (every rank passes its own shards;
        pass a replicated parameter on one rank only, or it counts once per rank).

    Returns
    -------
    float
        An fp32 value (as a Python float); 0.0 without gradients.

    Bitwise semantics
    -----------------
    Each square ``RN32(fp32(g) * fp32(g))`` is one IEEE rounding; their sum is exact (P10
    superaccumulator), rounded once to fp32; the root is correctly rounded. Invariant to the
    order and grouping of parameters, to ranks and to the device.
    """
    partials: list[torch.Tensor] = []
    buckets: dict[torch.device, tuple[list[torch.Tensor], int]] = {}
    for g in _grads(parameters):
        g32 = g.detach().to(torch.float32).reshape(-1)
        if g32.numel() >= NORM_BUCKET:  # a large gradient alone, as it is (no copy)
            partials += _square_partials(g32)
            continue
        held, size = buckets.get(g32.device, ([], 0))
        held.append(g32)
        size += g32.numel()
        if size >= NORM_BUCKET:
            partials += _square_partials(torch.cat(held))
            held, size = [], 0
        buckets[g32.device] = (held, size)
    for held, _ in buckets.values():
        if held:
            partials += _square_partials(torch.cat(held) if len(held) > 1 else held[0])
    if not partials:
        return 0.0
    device = partials[0].device
    parts = [p.to(device) for p in partials]
    if group is not None:
        parts = [all_reduce_partial(merge_partials(parts).clone(), group)]
    s = float(finish_partials(parts, denominator=1.0))  # RN32(exact sum) / 1: the merge is the finish's own
    if s != s or s == float("inf"):
        return s
    n, d = s.as_integer_ratio()
    return rn32_sqrt(n, d) if n else 0.0


def clip_coefficient(norm: float, max_norm: float) -> float:
    """``RN32(RN32(max_norm) / RN32(norm + RN32(1e-6)))`` for a finite fp32 ``norm`` (unclamped)."""
    mn, md = rn32(*float(max_norm).as_integer_ratio()).as_integer_ratio()
    # norm + eps: both fp32; their exact sum is a rational, rounded once
    eps = rn32(*(1e-6).as_integer_ratio())
    a, b = norm.as_integer_ratio(), eps.as_integer_ratio()
    den = rn32(a[0] * b[1] + b[0] * a[1], a[1] * b[1])
    dn, dd = den.as_integer_ratio()
    return rn32(mn * dd, md * dn)


def clip_grad_norm_(parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float,
                    group: Any = None, replicated: Iterable[torch.Tensor] = ()) -> float:
    """Scale the gradients in place so their global norm is at most ``max_norm`` (torch's rule); returns the norm.

    ``coef = min(1, RN32(RN32(max_norm) / RN32(norm + RN32(1e-6))))``; where ``coef < 1`` each
    gradient becomes ``RN_dtype(RN32(fp32(g) * coef))``. ``norm`` is :func:`grad_norm` (exact
    sum). A non-finite norm leaves the gradients alone and is returned (check it and skip the
    step, as with torch's ``error_if_nonfinite=False``).

    With a tensor-parallel ``group``, ``parameters`` are every rank's own (shards and replicated
    weights alike) and ``replicated`` names those held whole on every rank: they count in the norm
    on the group's rank 0 only, and are scaled on every rank.
    """
    if not isinstance(max_norm, (int, float)) or isinstance(max_norm, bool) or not max_norm > 0:
        raise ValueError(f"clip_grad_norm_: max_norm = {max_norm!r}; expected a number > 0")
    parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    skip = {id(p) for p in replicated}
    if group is not None and skip and torch.distributed.get_rank(group) != 0:
        norm = grad_norm([p for p in parameters if id(p) not in skip], group)
    else:
        norm = grad_norm(parameters, group)
    if not norm < float("inf"):
        return norm
    coef = clip_coefficient(norm, max_norm)
    if coef < 1.0:
        gs = _grads(parameters)
        fp32 = [g for g in gs if g.dtype == torch.float32]
        if fp32:  # RN32(g * coef): coef is an fp32 value, the product is rounded once (one multi-tensor launch)
            torch._foreach_mul_(fp32, coef)
        for g in gs:
            if g.dtype != torch.float32:
                g.copy_(torch.mul(g.to(torch.float32), coef).to(g.dtype))
    return norm


class _MasterWeights(torch.optim.Optimizer):
    """The loop both optimizers share: skip parameters without a gradient, refuse sparse ones,
    count steps, keep an fp32 master copy of a bf16/fp16 parameter and write it back rounded."""

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        """The optimizer's own state of a parameter's first step."""

    def _update(self, master: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> torch.Tensor:
        """The new fp32 master weights (updating ``state``)."""
        raise NotImplementedError

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                grad = gradient_of(p)
                if grad is None:
                    continue
                if grad.is_sparse:
                    raise ValueError(f"{type(self).__name__}: sparse gradients are not supported; use dense gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    self._init_state(p, state)
                    if p.dtype != torch.float32:
                        state["master"] = p.detach().to(torch.float32).contiguous()
                state["step"] += 1
                new_p = self._update(state.get("master", p).detach(), grad, state, group)
                if "master" in state:
                    state["master"] = new_p
                    p.copy_(new_p.to(p.dtype))
                else:
                    p.copy_(new_p)
        return loss


class AdamW(_MasterWeights):
    """torch.optim.AdamW's algorithm through contract ``adamw``: identical new weights on every backend.

    Parameters
    ----------
    params : iterable of Tensors or of dicts (parameter groups)
    lr : float
    betas : (float, float)
    eps : float
    weight_decay : float
        Decoupled weight decay (torch's AdamW default 0.01).

    Notes
    -----
    State per parameter: ``step`` (int), ``exp_avg`` and ``exp_avg_sq`` (fp32), and ``master``
    (fp32) for a bf16/fp16 parameter, which then receives ``master.to(dtype)`` after each step.
    A parameter without a gradient is skipped (its step count does not advance), as in torch.
    Sparse gradients, ``amsgrad``, ``maximize`` and capturable/fused modes are not supported.
    """

    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(state["exp_avg"])

    def _update(self, master: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> torch.Tensor:
        beta1, beta2 = group["betas"]
        new_p, state["exp_avg"], state["exp_avg_sq"] = adamw(
            master, grad, state["exp_avg"], state["exp_avg_sq"], step=state["step"], lr=group["lr"],
            beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"])
        return new_p


class SGD(_MasterWeights):
    """torch.optim.SGD's algorithm through contract ``sgd``: identical new weights on every backend.

    Parameters
    ----------
    params : iterable of Tensors or of dicts (parameter groups)
    lr : float
    momentum, dampening, weight_decay : float
    nesterov : bool

    Notes
    -----
    State per parameter: ``step`` (int), ``momentum_buffer`` (fp32, with momentum) and
    ``master`` (fp32) for a bf16/fp16 parameter, which then receives ``master.to(dtype)``.
    """

    def __init__(self, params: Params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": nesterov}
        super().__init__(params, defaults)

    def _update(self, master: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
                group: dict[str, Any]) -> torch.Tensor:
        buf = state.get("momentum_buffer")
        new_p, new_buf = sgd(master, grad, buf if buf is not None else torch.zeros_like(master), step=state["step"],
                             lr=group["lr"], momentum=group["momentum"], dampening=group["dampening"],
                             weight_decay=group["weight_decay"], nesterov=group["nesterov"])
        if group["momentum"] != 0:
            state["momentum_buffer"] = new_buf
        return new_p
