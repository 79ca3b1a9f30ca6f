"""The PPO/GRPO clipped policy-gradient loss, with dual clip, exact masked aggregation and an
exact, elementwise backward.

The per-token objective is verl's ``compute_policy_loss`` (vanilla PPO with the dual-clip of
Ye et al. 2020); the importance ratio uses the contract exponential ``exp_c`` (P6), so an
unchanged policy (``logp == old_logp``) gives a ratio of exactly 1.0 on every backend; the
aggregation is ``masked_mean`` (exact superaccumulator sums, P10), so the loss does not depend
on the batch layout or on micro-batching.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize, int_to_fp32
from rlkernel.contracts._exact.transcendental import exp_c, log_c
from rlkernel.contracts._gen import normal, seed_of, special_values
from rlkernel.contracts.masked_mean import (
    MODES,
    finish_partial,
    fp32_denominator,
    partial_of,
    ragged_mask,
)

CONTRACT = Contract(
    name="ppo_loss",
    version=1,
    summary=("tok = max(-A*r, -A*clamp(r, 1-cl, 1+ch)) (dual clip: min(tok, -A*c) where A < 0), "
             "r = exp_c(logp - old_logp); loss = masked_mean(tok, mask, mode)"),
    invariances=("permutation", "batch", "micro_batch", "repeat", "autograd"),
    dtypes={"logp": (torch.float32,), "old_logp": (torch.float32,), "advantages": (torch.float32,),
            "mask": (torch.bool,), "grad_output": (torch.float32,)},
    parameters={
        "exp_c": "ratio r = exp_c(RN32(logp - old_logp)): the contract exp (P6; its coefficients, range "
                 "reduction and limits are pinned by the softmax contract)",
        "clip_bounds": "clamp(r, lo, hi) = min(max(r, lo), hi) with lo = RN32(1 - clip_low), "
                       "hi = RN32(1 + clip_high) (host-rounded from float64, default 0.8 and 1.2)",
        "tie_rule": "the unclipped branch is active where not (pg1 < pg2): at ties the gradient flows through pg1",
        "dual_clip": "where A < 0 and RN32(-A * c) < tok: tok = RN32(-A * c), inactive; ties keep tok and "
                     "stay active; c = RN32(dual_clip) (host-rounded)",
        "aggregation": "loss = masked_mean(tok): exact P10 sums rounded once (ties to even), ÷ fp32(count "
                       "or denominator)",
        "grad_rounding": "grad = RN32(RN32(pg1 * g) ÷ D); seq-mean-token-mean: RN32(RN32(RN32(pg1 * g) ÷ "
                         "fp32(c_b)) ÷ D)",
        "grad_denominator": "D = fp32(denominator), else the mode's count: kept tokens (token-mean), "
                            "sequences with at least one kept token (seq-mean modes)",
    },
)


def clip_bounds(clip_low: float, clip_high: float, dual_clip: float | None) -> tuple[torch.Tensor, ...]:
    """Host constants (R8): ``fp32(1 - clip_low)``, ``fp32(1 + clip_high)``, ``fp32(dual_clip)``.

    Each is the float64 value rounded once to fp32 (``1 - 0.2`` is computed in float64).
    """
    lo = torch.tensor(1.0 - float(clip_low), dtype=torch.float64).to(torch.float32)
    hi = torch.tensor(1.0 + float(clip_high), dtype=torch.float64).to(torch.float32)
    c = torch.tensor(float(dual_clip) if dual_clip is not None else float("nan"), dtype=torch.float64)
    return lo, hi, c.to(torch.float32)


def token_terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float = 0.2,
                clip_high: float = 0.2, dual_clip: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss ``tok``, unclipped term ``pg1`` and the gradient-active flag (mask not applied)."""
    lo, hi, c = clip_bounds(clip_low, clip_high, dual_clip)
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    neg_adv = -adv  # exact
    ratio = exp_c(logp - old_logp)  # one rounding, then the contract exp
    clamped = torch.minimum(torch.maximum(ratio, lo), hi)  # NaN propagates
    pg1 = neg_adv * ratio
    pg2 = neg_adv * clamped
    unclipped = ~(pg1 < pg2)  # pg1 wins ties (and NaN)
    tok = torch.where(unclipped, pg1, pg2)
    tok = torch.where(torch.isnan(pg2), pg2, tok)  # max with NaN propagation (R5)
    tok = torch.where(tok == 0, torch.zeros_like(tok), tok)  # a zero max is +0 (R5)
    active = unclipped
    if dual_clip is not None:
        pg3 = neg_adv * c
        dual = (adv < 0) & (pg3 < tok)
        tok = torch.where(dual, pg3.expand_as(tok), tok)
        active = active & ~dual
    return tok, pg1, active


def _grad(pg1: torch.Tensor, active: torch.Tensor, mask: torch.Tensor, mode: str,
          denominator: float | int | None, grad_output: torch.Tensor) -> torch.Tensor:
    """``d loss / d logp`` per the contract (see :func:`reference`)."""
    live = active & mask
    g = grad_output.to(torch.float32).reshape(())
    scaled = pg1 * g
    counts = mask.sum(dim=1, keepdim=True)
    if denominator is not None:
        d = fp32_denominator(denominator)
    elif mode == "token-mean":
        d = int_to_fp32(mask.sum())
    else:
        d = int_to_fp32((counts > 0).sum())
    if mode == "seq-mean-token-mean":
        scaled = scaled / int_to_fp32(counts)
    grad = scaled / d
    return canonicalize(torch.where(live, grad, torch.zeros_like(grad)))


def reference(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
              mode: str = "token-mean", denominator: float | int | None = None, partial: bool = False,
              grad_output: torch.Tensor | None = None) -> torch.Tensor:
    """Clipped PPO policy loss (the definition of ``ppo_loss``'s bits, forward and backward).

    ``loss = masked_mean(max(-A * r, -A * clamp(r, 1 - clip_low, 1 + clip_high)), mask, mode)``
    with ``r = exp_c(logp - old_logp)``.

    Parameters
    ----------
    logp : Tensor, float32, [B, T]
        Token log-probabilities under the current policy (the differentiable input).
    old_logp : Tensor, float32, [B, T]
        Log-probabilities under the behaviour (rollout) policy.
    advantages : Tensor, float32, [B, T] or [B]
        Per-token advantages, or one per sequence (GRPO) broadcast over T.
    mask : Tensor, bool, [B, T]
        Response tokens that count; other positions are ignored whatever their values.
    clip_low, clip_high : float
        The ratio is clamped to ``[fp32(1 - clip_low), fp32(1 + clip_high)]`` (DAPO's
        clip-higher uses clip_high > clip_low). Defaults 0.2, 0.2.
    dual_clip : float, optional
        The dual-clip constant c > 1 (verl's ``clip_ratio_c``, typically 3.0); None disables it.
    mode : {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum"}
        Aggregation, as in ``masked_mean``.
    denominator : float or int, optional
        Global normalisation count (as in ``masked_mean``).
    partial : bool
        Return the exact ``masked_mean`` partial (int64 [21]) of the per-token losses.
    grad_output : Tensor, float32, [], optional
        If given, return the backward ``grad_output * d loss / d logp`` (fp32 [B, T]) instead.

    Returns
    -------
    Tensor, float32, [] (the loss); int64 [21] (``partial=True``); float32 [B, T] (``grad_output``)

    Bitwise semantics
    -----------------
    Host constants (R8): ``lo = RN32(1 - clip_low)``, ``hi = RN32(1 + clip_high)``,
    ``c = RN32(dual_clip)``, each from the float64 value. Per token, every fp32 operation one
    IEEE round-to-nearest-even rounding (A broadcast from [B] if needed):

    1. ``r = exp_c(RN32(logp - old_logp))`` (contract exp: ratio 1.0 exactly when equal)
    2. ``pg1 = RN32(-A * r)``; ``pg2 = RN32(-A * clamp(r, lo, hi))``, clamp = min(max(r, lo), hi)
       with NaN propagating
    3. ``tok = max(pg1, pg2)`` (R5: NaN propagates, a zero result is +0); the unclipped
       branch is *active* when ``not (pg1 < pg2)`` — ties go to pg1
    4. dual clip (if c is given): where ``A < 0`` and ``RN32(-A * c) < tok``: ``tok = RN32(-A * c)``
       and the token is not active (ties keep tok and stay active)
    5. ``loss = masked_mean(tok, mask, mode, denominator)`` (exact sums, P10)

    Backward (``grad_output = g``; elementwise, deterministic, no reduction): on kept and
    active tokens ``grad = RN32(RN32(pg1 * g) ÷ D)`` for ``token-mean`` and
    ``seq-mean-token-sum``, ``grad = RN32(RN32(RN32(pg1 * g) ÷ fp32(c_b)) ÷ D)`` for
    ``seq-mean-token-mean`` (c_b the kept tokens of the sequence), where ``D`` is
    ``fp32(denominator)`` or the count of the mode (tokens; sequences with >= 1 token);
    ``+0`` on masked or inactive tokens. ``pg1 = d tok / d logp`` exactly, since
    ``d r / d logp = r``. At exact ties (pg1 == pg2, or tok == -A * c) the whole gradient
    flows through the active branch (PyTorch's ``maximum``/``minimum`` would split it in half).
    No gradient for old_logp, advantages or mask.

    Special values follow from the steps: logp - old_logp > 89 gives r = +inf, below -104
    r = +0; NaN anywhere in a kept token makes the loss NaN; an all-masked batch without a
    denominator gives NaN (0 ÷ 0).

    Invariances: permutation (of sequences), batch (a sequence's gradient with a fixed
    denominator does not depend on the others), micro_batch (merged partials give the
    full-batch loss; with a global denominator per-token gradients are those of the full
    batch), repeat, autograd (the forward under autograd is the plain forward).

    Contract ``ppo_loss`` version 1.
    """
    logp32 = logp.to(torch.float32)
    tok, pg1, active = token_terms(logp32, old_logp.to(torch.float32), advantages.to(torch.float32),
                                   clip_low, clip_high, dual_clip)
    if grad_output is not None:
        return _grad(pg1, active, mask, mode, denominator, grad_output)
    p = partial_of(tok, mask, mode)
    return p if partial else finish_partial(p, denominator)


# --------------------------------------------------------------------------- cases


def _inputs(case: str, batch: int, length: int, per_seq_adv: bool = False, spread: float = 0.05,
            mode: str = "token-mean", min_len: int = 1, **kw: Any) -> dict[str, Any]:
    """Realistic PPO tensors: old log-probs in about [-8, 0], a policy that moved a little."""
    s = seed_of("ppo_loss", case)
    z = normal(seed_of(s, "old"), (batch, length), dtype=torch.float64)
    old = (-(z.abs() * 2.0)).to(torch.float32)
    logp = (old.to(torch.float64) + normal(seed_of(s, "d"), (batch, length), std=spread,
                                             dtype=torch.float64)).to(torch.float32)
    adv_shape = (batch,) if per_seq_adv else (batch, length)
    adv = normal(seed_of(s, "adv"), adv_shape, dtype=torch.float32)
    mask = ragged_mask(seed_of(s, "mask"), batch, length, min_len)
    return {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask, "mode": mode, **kw}


def golden_cases() -> list[Case]:
    """B in {1, 4, 16}, T in {1, 17, 256}; per-token and per-sequence advantages; all modes;
    dual clip; clip-higher; global denominators; partials; gradients."""
    cases = []
    for b in (1, 4, 16):
        for t in (1, 17, 256):
            name = f"B{b}_T{t}"
            cases.append(Case(name, "golden", lambda n=name, bb=b, tt=t: _inputs(n, bb, tt)))
            name = f"B{b}_T{t}_grpo"
            cases.append(Case(name, "golden", lambda n=name, bb=b, tt=t: _inputs(n, bb, tt, per_seq_adv=True,
                                                                                  spread=0.2)))
    for mode in MODES:
        name = f"B16_T256_{mode}_dual"
        cases.append(Case(name, "golden", lambda n=name, m=mode: _inputs(n, 16, 256, mode=m, spread=0.3,
                                                                          dual_clip=3.0)))
        name = f"B16_T256_{mode}_grad"
        cases.append(Case(name, "golden", lambda n=name, m=mode: _inputs(
            n, 16, 256, mode=m, spread=0.3, dual_clip=3.0, grad_output=torch.tensor(1.0))))
        name = f"B16_T256_{mode}_partial"
        cases.append(Case(name, "golden", lambda n=name, m=mode: _inputs(n, 16, 256, mode=m, partial=True)))
    cases += [
        Case("B16_T256_clip_higher", "golden",
             lambda: _inputs("clip_higher", 16, 256, spread=0.3, clip_low=0.2, clip_high=0.28)),
        Case("B16_T256_global_denominator", "golden",
             lambda: _inputs("global_den", 16, 256, spread=0.3, denominator=16384)),
        Case("B16_T256_grad_scaled", "golden",
             lambda: _inputs("grad_scaled", 16, 256, spread=0.3, denominator=16384,
                             grad_output=torch.tensor(0.125))),
        Case("B64_T4096", "golden", lambda: _inputs("B64_T4096", 64, 4096, spread=0.3), full_only=True),
    ]
    # gradients whose counts (12 sequences, ragged lengths) are not powers of two: the order of the
    # divisions by c_b and D then shows in the bits
    for mode in MODES:
        name = f"B12_T33_{mode}_grad"
        cases.append(Case(name, "golden", lambda n=name, m=mode: _inputs(
            n, 12, 33, mode=m, spread=0.3, dual_clip=3.0, grad_output=torch.tensor(1.0))))
    return cases


def _at_bounds() -> dict[str, Any]:
    """Ratios exactly at fp32(0.8), 1 and fp32(1.2) and one ulp either side, with both signs of A.

    ``old_logp = -0.75``; the log-probs are found by searching the fp32 neighbours of
    ``old + log_c(bound)`` for those whose exact difference gives ``exp_c(logp - old)`` equal to
    the bound or to its neighbours.
    """
    lo, hi, _ = clip_bounds(0.2, 0.2, None)
    old_v = torch.tensor([-0.75], dtype=torch.float32)
    logps = []
    for target in (lo, hi, torch.tensor(1.0)):
        base = old_v + log_c(target.reshape(1))
        cand = (base.view(torch.int32) + torch.arange(-40, 41, dtype=torch.int32)).view(torch.float32)
        r = exp_c(cand - old_v)  # the differences are exact (Sterbenz)
        for want in (target, torch.nextafter(target, torch.tensor(0.0)), torch.nextafter(target, torch.tensor(9.0))):
            hit = (r == want).nonzero()
            if len(hit):
                logps.append(float(cand[hit[0, 0]]))
    logp = torch.tensor(logps, dtype=torch.float32).expand(4, len(logps)).contiguous()
    old = torch.full_like(logp, -0.75)
    adv = torch.tensor([[1.0], [-1.0], [2.0**-140], [-3.0e38]], dtype=torch.float32).expand_as(logp).contiguous()
    return {"logp": logp, "old_logp": old, "advantages": adv, "mask": torch.ones_like(logp, dtype=torch.bool),
            "dual_clip": 3.0}


def _extremes() -> dict[str, Any]:
    """logp differences of ±80 and beyond the exp range, huge and subnormal advantages, specials."""
    sv = special_values(torch.float32)
    diffs = torch.tensor([80.0, -80.0, 88.7, 88.9, 89.5, -103.0, -110.0, 0.0, -0.0, 1e-30, -1e-30, 20.0, -20.0],
                         dtype=torch.float32)
    old = torch.full((len(sv), len(diffs)), -2.0, dtype=torch.float32)
    logp = old + diffs
    adv = sv.unsqueeze(1).expand(len(sv), len(diffs)).contiguous()
    return {"logp": logp, "old_logp": old, "advantages": adv, "mask": torch.ones_like(logp, dtype=torch.bool)}


def _extremes_finite() -> dict[str, Any]:
    """As :func:`_extremes` with finite ratios (|logp - old_logp| <= 88.7 or below -104) and the
    moderate advantages (±0, subnormals, the least normal, 1 ± ulp): a finite loss."""
    d = _extremes()
    rows = torch.tensor([0, 1, 5, 6, 7, 10, 11])  # special_values: ±0, subnormals, least normal, 1 ± ulp
    cols = torch.tensor([0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12])  # drop 88.9 and 89.5 (ratio inf)
    return {k: t[rows][:, cols].contiguous() for k, t in d.items()}


def _special_logps() -> dict[str, Any]:
    """NaN/inf in logp and old_logp at kept and at masked positions."""
    sv = special_values(torch.float32)
    n = len(sv)
    logp = torch.full((n, 6), -1.0)
    old = torch.full((n, 6), -1.25)
    logp[:, 0] = sv
    old[:, 1] = sv
    logp[:, 4] = sv  # position 4 and 5 are masked out: ignored
    old[:, 5] = sv
    mask = torch.tensor([True, True, True, True, False, False]).expand(n, 6).contiguous()
    mask[0] = False  # one all-masked row
    adv = normal(seed_of("ppo_loss", "special_logps"), (n,), dtype=torch.float32)
    return {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask}


def adversarial_cases() -> list[Case]:
    cases = [
        Case("ratio_at_clip_bounds", "adversarial", _at_bounds),
        Case("ratio_at_clip_bounds_grad", "adversarial",
             lambda: {**_at_bounds(), "grad_output": torch.tensor(1.0)}),
        Case("extreme_ratios_and_advantages", "adversarial", _extremes),
        Case("extreme_ratios_and_advantages_grad", "adversarial",
             lambda: {**_extremes(), "grad_output": torch.tensor(-3.0)}),
        Case("extremes_dual_clip", "adversarial", lambda: {**_extremes(), "dual_clip": 3.0}),
        Case("extreme_ratios_finite_advantages", "adversarial", _extremes_finite),
        Case("extreme_ratios_finite_advantages_dual_seq_mean", "adversarial",
             lambda: {**_extremes_finite(), "dual_clip": 3.0, "mode": "seq-mean-token-mean"}),
        Case("extreme_ratios_finite_advantages_seq_sum", "adversarial",
             lambda: {**_extremes_finite(), "mode": "seq-mean-token-sum"}),
        Case("special_logps_masked_out", "adversarial",
             lambda: (lambda d: {**d, "mask": d["mask"] & (torch.arange(6) >= 2)})(_special_logps())),
        Case("special_logps", "adversarial", _special_logps),
        Case("special_logps_grad_seq_mean", "adversarial",
             lambda: {**_special_logps(), "mode": "seq-mean-token-mean", "grad_output": torch.tensor(1.0)}),
        Case("unchanged_policy", "adversarial",
             lambda: (lambda d: {**d, "logp": d["old_logp"].clone()})(_inputs("unchanged", 4, 33))),
        Case("all_masked_batch", "adversarial",
             lambda: {**_inputs("all_masked", 3, 17), "mask": torch.zeros(3, 17, dtype=torch.bool)}),
        Case("all_masked_batch_grad", "adversarial",
             lambda: {**_inputs("all_masked", 3, 17), "mask": torch.zeros(3, 17, dtype=torch.bool),
                      "grad_output": torch.tensor(1.0)}),
        Case("all_masked_rows_seq_mean", "adversarial",
             lambda: _inputs("all_masked_rows", 8, 17, mode="seq-mean-token-mean", min_len=0)),
        Case("huge_spread_dual_clip", "adversarial",
             lambda: _inputs("huge_spread", 4, 65, spread=30.0, dual_clip=3.0)),
        Case("subnormal_advantages", "adversarial",
             lambda: {**_inputs("subnormal_adv", 4, 17), "advantages": normal(
                 seed_of("ppo_loss", "subadv"), (4, 17), std=2.0**-135, dtype=torch.float32)}),
        Case("B1_T1_dual_seq_mean", "adversarial",
             lambda: _inputs("B1_T1_dual", 1, 1, spread=2.0, dual_clip=3.0, mode="seq-mean-token-mean")),
        Case("empty_batch", "adversarial",
             lambda: {"logp": torch.zeros(0, 5), "old_logp": torch.zeros(0, 5), "advantages": torch.zeros(0),
                      "mask": torch.zeros(0, 5, dtype=torch.bool)}),
        Case("noncontiguous", "adversarial", _noncontiguous),
    ]
    return cases


def _noncontiguous() -> dict[str, Any]:
    d = _inputs("noncontig", 17, 6, spread=0.3)
    return {**d, "logp": d["logp"].T.contiguous().T, "old_logp": d["old_logp"][:, :],
            "advantages": d["advantages"].T.contiguous().T}


def invariance_cases() -> list[InvarianceCase]:
    """Permuted sequences, a sequence alone vs in batches (gradient), micro-batches, repeat, autograd."""
    b, t = 12, 97

    def data(tag: str, **kw: Any) -> dict[str, Any]:
        return _inputs(f"inv_{tag}", b, t, spread=0.3, dual_clip=3.0, min_len=0, **kw)

    def permutation(run: Any) -> tuple[Any, Any]:
        perm = torch.tensor([7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 6, 4])
        exp, act = [], []
        for mode in MODES:
            d = data("perm", mode=mode)
            permuted = {**d, **{k: d[k][perm] for k in ("logp", "old_logp", "advantages", "mask")}}
            exp.append(run("ppo_loss", **d))
            act.append(run("ppo_loss", **permuted))
            g = torch.tensor(1.0)
            exp.append(run("ppo_loss", **d, grad_output=g)[perm])
            act.append(run("ppo_loss", **permuted, grad_output=g))
        return exp, act

    def batch(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        for mode in MODES:
            d = data("batch", mode=mode, denominator=1000)
            g = torch.tensor(1.0)
            alone = run("ppo_loss", **{**d, **{k: d[k][4:5] for k in ("logp", "old_logp", "advantages", "mask")}},
                        grad_output=g)
            for lo, hi in ((0, 12), (3, 9), (4, 6)):
                part = {k: d[k][lo:hi] for k in ("logp", "old_logp", "advantages", "mask")}
                exp.append(alone)
                act.append(run("ppo_loss", **{**d, **part}, grad_output=g)[4 - lo:5 - lo])
        return exp, act

    def micro_batch(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        keys = ("logp", "old_logp", "advantages", "mask")
        for mode in MODES:
            d = data("mb", mode=mode)
            full = run("ppo_loss", **d)
            for slices in (
                [(i, i + 1) for i in range(b)][::-1],
                [(3, 6), (0, 3), (9, 12), (6, 9)],
                [(5, 12), (0, 1), (1, 5)],
            ):
                parts = [run("ppo_loss", **{**d, **{k: d[k][lo:hi] for k in keys}}, partial=True)
                         for lo, hi in slices]
                exp.append(full)
                act.append(run("masked_mean", partials=parts))
            # gradients with the global count as denominator: micro-batch gradients are the full ones
            count = int(d["mask"].sum()) if mode == "token-mean" else int((d["mask"].sum(1) > 0).sum())
            g = torch.tensor(1.0)
            full_grad = run("ppo_loss", **{**d, "denominator": count}, grad_output=g)
            mb_grads = [run("ppo_loss", **{**d, "denominator": count, **{k: d[k][lo:hi] for k in keys}},
                            grad_output=g) for lo, hi in ((0, 5), (5, 7), (7, 12))]
            exp.append(full_grad)
            act.append(torch.cat(mb_grads))
        return exp, act

    def repeat(run: Any) -> tuple[Any, Any]:
        d = data("repeat")
        first = run("ppo_loss", **d)
        return [first, first], [run("ppo_loss", **d) for _ in range(2)]

    def autograd(run: Any) -> tuple[Any, Any]:
        exp, act = [], []
        for mode in MODES:
            d = data("autograd", mode=mode)
            plain = run("ppo_loss", **d)
            tracked = run("ppo_loss", **{**d, "logp": d["logp"].clone().requires_grad_(True)})
            exp.append(plain)
            act.append(tracked)
        return exp, act

    return [
        InvarianceCase("permuted_sequences", "permutation", permutation),
        InvarianceCase("sequence_grad_alone_vs_in_batch", "batch", batch),
        InvarianceCase("micro_batches", "micro_batch", micro_batch),
        InvarianceCase("repeat", "repeat", repeat),
        InvarianceCase("forward_under_autograd", "autograd", autograd),
    ]


# --------------------------------------------------------------------------- bench


def verl_ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                  clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
                  mode: str = "token-mean", denominator: float | None = None) -> torch.Tensor:
    """verl's ``compute_policy_loss`` + ``agg_loss`` in plain PyTorch: the native baseline."""
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    tok = torch.maximum(pg1, pg2)
    if dual_clip is not None:
        tok = torch.where(adv < 0, torch.min(tok, -adv * dual_clip), tok)
    m = mask.to(tok.dtype)
    if mode == "token-mean":
        return (tok * m).sum() / (denominator or m.sum())
    seq_tokens = m.sum(-1)
    seq = (tok * m).sum(-1)
    if mode == "seq-mean-token-mean":
        seq = seq / (seq_tokens + 1e-8)
    keep = (seq_tokens > 0).to(tok.dtype)
    return (seq * keep).sum() / (denominator or keep.sum())


def bench_cases() -> list[BenchCase]:
    """A PPO micro-batch B = 64, T = 4096 with dual clip, forward; against the verl-style loss.
    Milliseconds on a CPU too, so the same shape serves both sets."""

    def make(device: torch.device) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(0)
        old = -torch.rand(64, 4096, generator=g, device=device) * 8.0
        logp = old + 0.1 * torch.randn(64, 4096, generator=g, device=device)
        adv = torch.randn(64, 4096, generator=g, device=device)
        lens = torch.randint(1, 4097, (64, 1), generator=g, device=device)
        mask = torch.arange(4096, device=device).unsqueeze(0) < lens
        return {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask, "dual_clip": 3.0}

    n = 64 * 4096
    return [BenchCase(name="B64_T4096_dual_clip", make=make, native=verl_ppo_loss,
                      flops=12.0 * n, bytes=13.0 * n, sizes=("small", "large"))]
