"""The gradient of ``masked_mean`` (v1) in x, bit-exact and micro-batch invariant.

``dx = masked_mean_backward(grad, mask, mode, denominator)``: the mean is linear in x, so its
gradient is a per-token constant: ``g ÷ D`` on kept tokens (``g ÷ c_b ÷ D`` for the
sequence-mean of token-means), +0 elsewhere, whatever x held there (masked_mean ignores
masked-out values, NaN included). These are the roundings of ``ppo_loss``'s backward with its
per-token factor ``pg1`` replaced by 1, so the two aggregations give consistent gradients.

Micro-batching: with a *global* ``denominator`` (the count of the whole global batch:
``rlkernel.rl.count(mask, mode)`` summed over every micro-batch and data-parallel rank), a
token's gradient depends only on g, that denominator and (for ``seq-mean-token-mean``) its own
sequence's kept-token count, so every split of the batch into micro-batches of whole sequences
gives each token the bits the full batch gives it. Without a denominator the count is the
call's own batch's, and the gradient depends on the split (as in any trainer).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize, int_to_fp32
from rlkernel.contracts._gen import normal, seed_of, special_values
from rlkernel.contracts.masked_mean import MODES, fp32_denominator, ragged_mask

CONTRACT = Contract(
    name="masked_mean_backward",
    version=1,
    summary=("dx = RN32(g ÷ D) on kept tokens (seq-mean-token-mean: RN32(RN32(g ÷ fp32(c_b)) ÷ D)), +0 "
             "elsewhere; D = fp32(denominator or count)"),
    invariances=("batch", "permutation", "micro_batch", "repeat"),
    dtypes={"grad": (torch.float32,), "mask": (torch.bool,)},
    parameters={
        "grad_denominator": "D = fp32(denominator) (rounded once on the host), else fp32(count) of this call: kept "
                            "tokens (token-mean), sequences with at least one kept token (seq-mean modes)",
        "grad_rounding": "token-mean and seq-mean-token-sum: RN32(g ÷ D); seq-mean-token-mean: "
                         "RN32(RN32(g ÷ fp32(c_b)) ÷ D), c_b the kept tokens of the sequence; IEEE divisions",
        "masked_out": "+0 at every position the mask drops (and in sequences without kept tokens)",
    },
)


def reference(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              denominator: float | int | None = None) -> torch.Tensor:
    """Gradient of ``masked_mean(x, mask, mode, denominator)`` in x (the definition of its bits).

    ``token-mean``: ``dx_bt = g / D`` where ``mask_bt``, else 0

    Parameters
    ----------
    grad : Tensor, float32, []
        ``g``, the gradient of the scalar mean.
    mask : Tensor, bool, [B, T]
        The forward's mask.
    mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}
        The forward's mode.
    denominator : float or int, optional
        The forward's denominator. For micro-batch invariant gradients pass the global batch's
        count (kept tokens for ``token-mean``, sequences with at least one kept token for the
        ``seq-mean`` modes), summed over every micro-batch and rank; every micro-batch's loss is
        then its share of the global mean and every token gets the full batch's gradient.

    Returns
    -------
    Tensor, float32, [B, T]

    Bitwise semantics
    -----------------
    ``D = fp32(denominator)`` (rounded once from the float64 value) if given, else the correctly
    rounded fp32 of the mode's count over this call's mask (kept tokens; sequences with
    ``c_b >= 1``). On kept tokens: ``RN32(g ÷ D)`` for ``token-mean`` and ``seq-mean-token-sum``,
    ``RN32(RN32(g ÷ fp32(c_b)) ÷ D)`` for ``seq-mean-token-mean``; +0 everywhere else. IEEE
    division: ``g = ±inf`` or NaN propagate to the kept tokens, ``g = -0`` gives -0 there. NaN
    canonical. No kept token: all +0 (no division is observed).

    Invariances: batch and micro_batch (with a denominator: a sequence's gradient does not depend
    on the other sequences of the call), permutation (of sequences), repeat.

    Contract ``masked_mean_backward`` version 1.
    """
    if mode not in MODES:
        raise ValueError(f"masked_mean_backward: mode {mode!r}; expected one of {MODES}")
    g = grad.to(torch.float32).reshape(())
    counts = mask.sum(dim=1, keepdim=True)
    if denominator is not None:
        d = fp32_denominator(denominator)
    elif mode == "token-mean":
        d = int_to_fp32(mask.sum())
    else:
        d = int_to_fp32((counts > 0).sum())
    per_token = g.expand(mask.shape)
    if mode == "seq-mean-token-mean":
        per_token = per_token / int_to_fp32(counts)
    dx = per_token / d
    return canonicalize(torch.where(mask, dx, torch.zeros_like(dx)))


# --------------------------------------------------------------------------- cases


def _inputs(case: str, batch: int, length: int, mode: str = "token-mean", denominator: float | None = None,
            min_len: int = 1, grad: float | None = None) -> dict[str, Any]:
    mask = ragged_mask(seed_of("masked_mean_backward", case, "mask"), batch, length, min_len)
    g = normal(seed_of("masked_mean_backward", case, "grad"), (), dtype=torch.float32) if grad is None else \
        torch.tensor(grad, dtype=torch.float32)
    return {"grad": g, "mask": mask, "mode": mode, "denominator": denominator}


def golden_cases() -> list[Case]:
    """RL shapes B in {1, 4, 16}, T in {17, 256}, every mode, with and without a denominator."""
    cases = []
    for b in (1, 4, 16):
        for t in (17, 256):
            for mode in MODES:
                name = f"B{b}_T{t}_{mode}"
                cases.append(Case(name, "golden", lambda n=name, bb=b, tt=t, m=mode: _inputs(n, bb, tt, m)))
    for mode in MODES:
        name = f"B16_T256_{mode}_denominator"
        cases.append(Case(name, "golden", lambda n=name, m=mode: _inputs(n, 16, 256, m, denominator=8191.0)))
    cases.append(Case("B64_T4096_token-mean", "golden", lambda: _inputs("B64_T4096", 64, 4096), full_only=True))
    return cases


def _many_grads(mode: str, denominator: float | None) -> list[Case]:
    """One case per special or rounding-sensitive g (every case a scalar gradient)."""
    sv = special_values(torch.float32)
    values = [float(v) for v in sv] + [0.1, 1.0 / 3.0, 1e-30, 7.0e-45]
    return [Case(f"grad_{i}_{mode}{'_denominator' if denominator else ''}", "adversarial",
                 lambda v=v, m=mode: _inputs("many_grads", 6, 33, m, denominator=denominator, min_len=0, grad=v))
            for i, v in enumerate(values)]


def adversarial_cases() -> list[Case]:
    """Special gradients, empty sequences and batches, subnormal and odd denominators, strided masks."""
    cases: list[Case] = []
    for mode in MODES:
        cases += _many_grads(mode, None)
        cases += [
            Case(f"all_masked_rows_{mode}", "adversarial", lambda m=mode: _inputs("all_masked_rows", 6, 17, m,
                                                                                   min_len=0)),
            Case(f"all_masked_batch_{mode}", "adversarial",
                 lambda m=mode: {"grad": torch.tensor(1.0), "mask": torch.zeros(3, 5, dtype=torch.bool), "mode": m}),
            Case(f"empty_batch_{mode}", "adversarial",
                 lambda m=mode: {"grad": torch.tensor(1.0), "mask": torch.zeros(0, 8, dtype=torch.bool), "mode": m}),
            Case(f"denominator_subnormal_{mode}", "adversarial",
                 lambda m=mode: _inputs("den_sub", 4, 17, m, denominator=1.0e-40)),
            Case(f"denominator_odd_{mode}", "adversarial",
                 lambda m=mode: _inputs("den_odd", 7, 45, m, denominator=1234567.891)),
        ]
    cases += _many_grads("seq-mean-token-mean", 77.0)
    cases += [
        Case("denominator_int", "adversarial", lambda: _inputs("den_int", 4, 17, "seq-mean-token-sum", denominator=7)),
        Case("noncontiguous_mask", "adversarial", _noncontiguous),
    ]
    return cases


def _noncontiguous() -> dict[str, Any]:
    mask = ragged_mask(seed_of("masked_mean_backward", "noncontig_mask"), 33, 6).T  # [6, 33], strides (1, 6)
    return {"grad": torch.tensor(0.3), "mask": mask, "mode": "seq-mean-token-mean"}


def _micro_batches(batch: int, sizes: tuple[int, ...]) -> list[tuple[int, int]]:
    out, start, i = [], 0, 0
    while start < batch:
        stop = min(batch, start + sizes[i % len(sizes)])
        out.append((start, stop))
        start, i = stop, i + 1
    return out


def invariance_cases() -> list[InvarianceCase]:
    """A sequence alone vs inside batches (global denominator), permuted sequences, micro-batches, repeat."""
    b, t, op = 16, 129, "masked_mean_backward"

    def data(tag: str, mode: str) -> dict[str, Any]:
        return _inputs(f"inv_{tag}", b, t, mode, min_len=0)

    def batch(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        for mode in MODES:
            inp = data("batch", mode)
            inp["denominator"] = 100.0
            alone = run(op, **{**inp, "mask": inp["mask"][3:4]})
            for size, pos in ((2, 1), (7, 3), (13, 0)):
                exp.append(alone)
                act.append(run(op, **{**inp, "mask": inp["mask"][3 - pos:3 - pos + size]})[pos:pos + 1])
        return exp, act

    def permutation(run: Any) -> tuple[Any, Any]:
        perm = torch.tensor([5, 11, 0, 15, 3, 8, 1, 14, 6, 2, 13, 9, 4, 12, 7, 10])
        exp, act = [], []
        for mode in MODES:
            inp = data("perm", mode)
            exp.append(run(op, **inp)[perm])
            act.append(run(op, **{**inp, "mask": inp["mask"][perm]}))
        return exp, act

    def micro_batch(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        for mode in MODES:
            inp = data("mb", mode)
            mask = inp["mask"]
            count = int(mask.sum()) if mode == "token-mean" else int((mask.sum(dim=1) > 0).sum())
            inp["denominator"] = count  # the global count, as rl.count gives it
            full = run(op, **inp)
            for sizes in ((1,), (3,), (5, 2, 9)):
                parts = [run(op, **{**inp, "mask": mask[lo:hi]}) for lo, hi in _micro_batches(b, sizes)]
                exp.append(full)
                act.append(torch.cat(parts))
        return exp, act

    def repeat(run: Any) -> tuple[Any, Any]:
        inp = data("repeat", "seq-mean-token-mean")
        first = run(op, **inp)
        return [first, first], [run(op, **inp) for _ in range(2)]

    return [
        InvarianceCase("sequence_alone_vs_in_batch", "batch", batch),
        InvarianceCase("permuted_sequences", "permutation", permutation),
        InvarianceCase("micro_batches_1_3_mixed", "micro_batch", micro_batch),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_autograd(grad: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                   denominator: float | None = None) -> torch.Tensor:
    """torch autograd of verl-style ``agg_loss`` (fp32): the native baseline."""
    with torch.enable_grad():
        x = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device, requires_grad=True)
        m = mask.to(x.dtype)
        if mode == "token-mean":
            loss = (x * m).sum() / (denominator or m.sum())
        else:
            seq_tokens = m.sum(-1)
            seq = (x * m).sum(-1)
            if mode == "seq-mean-token-mean":
                seq = seq / (seq_tokens + 1e-8)
            keep = (seq_tokens > 0).to(x.dtype)
            loss = (seq * keep).sum() / (denominator or keep.sum())
        (dx,) = torch.autograd.grad(loss, (x,), grad)
    return dx


def bench_cases() -> list[BenchCase]:
    """token-mean and seq-mean-token-mean over B = 64, T = 4096 (a PPO micro-batch)."""
    cases = []
    for mode in ("token-mean", "seq-mean-token-mean"):
        def make(device: torch.device, m: str = mode) -> dict[str, Any]:
            gen = torch.Generator(device=device).manual_seed(0)
            lens = torch.randint(1, 4097, (64, 1), generator=gen, device=device)
            mask = torch.arange(4096, device=device).unsqueeze(0) < lens
            return {"grad": torch.tensor(1.0, device=device), "mask": mask, "mode": m}

        cases.append(BenchCase(name=f"B64_T4096_{mode}", make=make, native=torch_autograd,
                               flops=2.0 * 64 * 4096, bytes=5.0 * 64 * 4096, sizes=("small", "large")))
    return cases
