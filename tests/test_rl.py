"""RL ops (group_advantages, ppo_loss, kl_k3, masked_mean): input errors, generic backend ==
reference bit for bit (contract cases and hypothesis inputs with specials), the metamorphic
invariances, autograd, the micro-batch helpers of rlkernel.rl, and accuracy against float64."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlkernel.dispatch as ops_dispatch
import rlkernel.ops as ops
from rlkernel import rl
from rlkernel.conformance.hashing import first_difference, sha256_of
from rlkernel.contracts import group_advantages as c_adv
from rlkernel.contracts import kl_k3 as c_kl
from rlkernel.contracts import kl_k3_backward as c_klb
from rlkernel.contracts import masked_mean as c_mm
from rlkernel.contracts import masked_mean_backward as c_mmb
from rlkernel.contracts import ppo_loss as c_ppo
from rlkernel.contracts._gen import normal, seed_of

MODULES = {"group_advantages": c_adv, "ppo_loss": c_ppo, "kl_k3": c_kl, "masked_mean": c_mm,
           "kl_k3_backward": c_klb, "masked_mean_backward": c_mmb}


def assert_bits(expected: Any, actual: Any, what: str = "") -> None:
    diff = first_difference(expected, actual)
    assert diff is None, f"{what}: {diff}"


def run(op: str, **inputs: Any) -> Any:
    return getattr(ops, op)(**inputs)


# --------------------------------------------------------------------------- contract cases


def _cases() -> list[tuple[str, Any]]:
    out = []
    for op, mod in MODULES.items():
        for case in mod.golden_cases() + mod.adversarial_cases():
            if not case.full_only:
                out.append(pytest.param(op, case, id=f"{op}/{case.name}"))
    return out


@pytest.mark.parametrize("op, case", _cases())
def test_contract_cases_generic_equals_reference(op, case):
    mod = MODULES[op]
    ref = mod.reference(**case.make())
    out = run(case.op or op, **case.make())
    assert sha256_of(ref) == sha256_of(out), f"{op}/{case.name}: {first_difference(ref, out)}"


def _invariances() -> list[Any]:
    return [pytest.param(mod, ic, id=f"{op}/{ic.invariance}/{ic.name}")
            for op, mod in MODULES.items() for ic in mod.invariance_cases()]


@pytest.mark.parametrize("mod, ic", _invariances())
def test_invariances(mod, ic):
    expected, actual = ic.check(run)
    assert_bits(expected, actual, f"{mod.CONTRACT.name}/{ic.name}")


def test_every_declared_invariance_has_a_check():
    for op, mod in MODULES.items():
        checked = {ic.invariance for ic in mod.invariance_cases()}
        assert checked == set(mod.CONTRACT.invariances), op
        assert mod.CONTRACT.version == 1


# --------------------------------------------------------------------------- hypothesis

special = st.sampled_from([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 2.0**-149, -(2.0**-130),
                           3.0e38, -3.0e38, 1.0, -1.0])
logp_value = st.one_of(st.floats(-30.0, 0.0, width=32), special)
delta_value = st.one_of(st.floats(-1.0, 1.0, width=32), st.floats(-120.0, 120.0, width=32), special)


@st.composite
def ppo_inputs(draw: Any) -> dict[str, Any]:
    b = draw(st.integers(0, 4))
    t = draw(st.integers(1, 9))
    n = b * t
    old = torch.tensor(draw(st.lists(logp_value, min_size=n, max_size=n)), dtype=torch.float32).reshape(b, t)
    d = torch.tensor(draw(st.lists(delta_value, min_size=n, max_size=n)), dtype=torch.float32).reshape(b, t)
    per_seq = draw(st.booleans())
    na = b if per_seq else n
    adv = torch.tensor(draw(st.lists(st.one_of(st.floats(-5.0, 5.0, width=32), special), min_size=na, max_size=na)),
                       dtype=torch.float32)
    adv = adv if per_seq else adv.reshape(b, t)
    mask = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(b, t)
    return {
        "logp": old + d, "old_logp": old, "advantages": adv, "mask": mask,
        "clip_low": draw(st.sampled_from([0.2, 0.1, 0.0])), "clip_high": draw(st.sampled_from([0.2, 0.28, 5.0])),
        "dual_clip": draw(st.sampled_from([None, 3.0, 1.5])), "mode": draw(st.sampled_from(c_mm.MODES)),
        "denominator": draw(st.sampled_from([None, 7, 1000.5])),
    }


@settings(max_examples=40, deadline=None)
@given(ppo_inputs(), st.sampled_from([None, 1.0, -0.375]))
def test_hypothesis_ppo_loss(inputs, g):
    assert_bits(c_ppo.reference(**inputs), ops.ppo_loss(**inputs), "loss")
    assert_bits(c_ppo.reference(**inputs, partial=True), ops.ppo_loss(**inputs, partial=True), "partial")
    if g is not None:
        go = torch.tensor(g)
        assert_bits(c_ppo.reference(**inputs, grad_output=go), ops.ppo_loss(**inputs, grad_output=go), "grad")


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 5), st.integers(0, 9), st.data(), st.sampled_from(c_mm.MODES))
def test_hypothesis_masked_mean(b, t, data, mode):
    n = b * t
    vals = data.draw(st.lists(st.one_of(st.floats(width=32), special), min_size=n, max_size=n))
    x = torch.tensor(vals, dtype=torch.float32).reshape(b, t)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(b, t)
    assert_bits(c_mm.reference(x=x, mask=mask, mode=mode), ops.masked_mean(x, mask, mode=mode))
    p = ops.masked_mean(x, mask, mode=mode, partial=True)
    assert_bits(c_mm.reference(x=x, mask=mask, mode=mode, partial=True), p)
    if b >= 2:  # two micro-batches merge to the full batch's bits
        cut = b // 2
        parts = [ops.masked_mean(x[:cut], mask[:cut], mode=mode, partial=True),
                 ops.masked_mean(x[cut:], mask[cut:], mode=mode, partial=True)]
        assert_bits(p, ops.masked_mean(partials=parts[::-1], partial=True))
        assert_bits(ops.masked_mean(x, mask, mode=mode), ops.masked_mean(partials=parts))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(width=32), special), st.one_of(st.floats(width=32), special)),
                min_size=0, max_size=30))
def test_hypothesis_kl_k3(pairs):
    logp = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
    ref = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
    assert_bits(c_kl.reference(logp, ref), ops.kl_k3(logp, ref))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 4), st.integers(1, 12), st.data(), st.sampled_from([1e-6, 0.0, 0.5]), st.booleans())
def test_hypothesis_group_advantages(g, n, data, eps, scale):
    vals = data.draw(st.lists(st.one_of(st.floats(-1e6, 1e6, width=32), st.floats(width=32), special),
                              min_size=g * n, max_size=g * n))
    r = torch.tensor(vals, dtype=torch.float32).reshape(g, n)
    assert_bits(c_adv.reference(r, eps=eps, scale=scale), ops.group_advantages(r, eps=eps, scale=scale))


# --------------------------------------------------------------------------- semantics


def _ppo_data(b: int = 6, t: int = 33, **kw: Any) -> dict[str, Any]:
    return c_ppo._inputs("test_rl", b, t, spread=0.3, min_len=0, **kw)


def test_unchanged_policy_has_ratio_exactly_one():
    d = _ppo_data()
    d["logp"] = d["old_logp"].clone()
    # ratio 1 -> tok = -A exactly, so the loss is the exact masked mean of -A
    assert_bits(ops.masked_mean(-d["advantages"], d["mask"]), ops.ppo_loss(**d))
    assert_bits(torch.zeros(6, 33), ops.kl_k3(d["logp"], d["old_logp"]))


def test_masked_positions_are_ignored_whatever_they_hold():
    d = _ppo_data()
    poisoned = {**d}
    for key in ("logp", "old_logp", "advantages"):
        poisoned[key] = torch.where(d["mask"], d[key], torch.full_like(d[key], float("nan")))
    assert_bits(ops.ppo_loss(**d), ops.ppo_loss(**poisoned))
    g = torch.tensor(1.0)
    assert_bits(ops.ppo_loss(**d, grad_output=g), ops.ppo_loss(**poisoned, grad_output=g))


def test_all_masked_batch_is_nan_and_a_denominator_makes_it_zero():
    x = torch.ones(3, 4)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for mode in c_mm.MODES:
        assert math.isnan(float(ops.masked_mean(x, mask, mode=mode)))
        out = ops.masked_mean(x, mask, mode=mode, denominator=10)
        assert out.view(torch.int32).item() == 0  # +0


def test_seq_mean_modes_skip_empty_sequences():
    x = torch.tensor([[1.0, 2.0, 3.0], [5.0, 7.0, 9.0], [100.0, 100.0, 100.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [False, False, False]])
    assert float(ops.masked_mean(x, mask, mode="seq-mean-token-mean")) == (1.5 + 7.0) / 2
    assert float(ops.masked_mean(x, mask, mode="seq-mean-token-sum")) == (3.0 + 21.0) / 2
    assert ops.masked_mean(x, mask).item() == torch.tensor(24.0 / 5, dtype=torch.float32).item()


def test_dual_clip_caps_negative_advantage_losses():
    logp = torch.tensor([[5.0, 0.0]])
    old = torch.tensor([[0.0, 0.0]])
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # token 0: ratio e^5 = 148.4, pg = 148.4 capped at 3.0; token 1: ratio 1, pg = -1
    assert float(ops.ppo_loss(logp, old, adv, mask, dual_clip=3.0)) == (3.0 - 1.0) / 2
    g = ops.ppo_loss(logp, old, adv, mask, dual_clip=3.0, grad_output=torch.tensor(1.0))
    assert g[0, 0].item() == 0.0 and g[0, 1].item() == -0.5


def test_autograd_backward_is_the_contract_gradient():
    for mode in c_mm.MODES:
        d = _ppo_data(mode=mode, dual_clip=3.0)
        logp = d["logp"].clone().requires_grad_(True)
        loss = ops.ppo_loss(**{**d, "logp": logp})
        assert loss.requires_grad
        assert_bits(ops.ppo_loss(**d), loss.detach(), "forward under autograd")
        (loss * 0.5).backward()
        assert_bits(c_ppo.reference(**d, grad_output=torch.tensor(0.5)), logp.grad, f"grad {mode}")
        # the native verl loss has the same gradient wherever there is no tie and no rounding
        lp = d["logp"].clone().requires_grad_(True)
        native = {k: v for k, v in d.items() if k != "logp"}
        (c_ppo.verl_ppo_loss(lp, **native) * 0.5).backward()
        assert torch.allclose(lp.grad, logp.grad, rtol=1e-5, atol=1e-9), mode


def test_partial_is_not_differentiable_and_grad_output_checks():
    d = _ppo_data()
    p = ops.ppo_loss(**{**d, "logp": d["logp"].clone().requires_grad_(True)}, partial=True)
    assert p.dtype == torch.int64 and p.shape == (21,) and not p.requires_grad
    with pytest.raises(ValueError, match="exclusive"):
        ops.ppo_loss(**d, partial=True, grad_output=torch.tensor(1.0))
    with pytest.raises(ValueError, match="scalar"):
        ops.ppo_loss(**d, grad_output=torch.ones(2))


# --------------------------------------------------------------------------- rlkernel.rl helpers


def test_rl_module_micro_batch_helpers():
    d = _ppo_data(b=10, t=40)
    keys = ("logp", "old_logp", "advantages", "mask")
    full = rl.ppo_loss(**d)
    acc = rl.ExactMean()
    for lo, hi in ((7, 10), (0, 1), (1, 7)):
        acc.add(rl.ppo_loss_partial(**{**d, **{k: d[k][lo:hi] for k in keys}}))
    assert_bits(full, acc.value())
    assert acc.count() == rl.count(d["mask"]) == int(d["mask"].sum())
    assert_bits(rl.ppo_loss(**d, partial=True), acc.partial)
    x = normal(seed_of("test_rl", "mm"), (10, 40), dtype=torch.float32)
    parts = [rl.masked_mean_partial(x[a:b], d["mask"][a:b], "seq-mean-token-mean") for a, b in ((0, 4), (4, 10))]
    assert_bits(rl.masked_mean(x, d["mask"], mode="seq-mean-token-mean"), rl.finish_partials(parts))
    assert_bits(rl.masked_mean(x, d["mask"], mode="seq-mean-token-mean", partial=True), rl.merge_partials(parts))
    assert rl.partial_count(parts[0]) == rl.count(d["mask"][:4], "seq-mean-token-mean")
    # an all-reduce SUM of canonical partials (not canonical itself) finishes to the same bits
    assert_bits(rl.finish_partials(parts), rl.finish_partials(parts[0] + parts[1]))
    with pytest.raises(RuntimeError, match="no partial"):
        rl.ExactMean().value()
    with pytest.raises(RuntimeError, match="not initialised"):
        rl.all_reduce_partial(parts[0])


def test_global_denominator_makes_micro_batch_gradients_exact():
    d = _ppo_data(b=8, t=50, dual_clip=3.0)
    n = rl.count(d["mask"])
    logp = d["logp"].clone().requires_grad_(True)
    rl.ppo_loss(**{**d, "logp": logp}, denominator=n).backward()
    grads = []
    for lo, hi in ((0, 3), (3, 8)):
        part = d["logp"][lo:hi].clone().requires_grad_(True)
        rl.ppo_loss(part, d["old_logp"][lo:hi], d["advantages"][lo:hi], d["mask"][lo:hi], dual_clip=3.0,
                    denominator=n).backward()
        grads.append(part.grad)
    assert_bits(logp.grad, torch.cat(grads))


# --------------------------------------------------------------------------- backwards of kl_k3 and masked_mean


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(width=32), special), st.one_of(st.floats(width=32), special),
                          st.one_of(st.floats(width=32), special)), min_size=0, max_size=30))
def test_hypothesis_kl_k3_backward(triples):
    g, logp, ref = (torch.tensor([t[i] for t in triples], dtype=torch.float32) for i in range(3))
    assert_bits(c_klb.reference(g, logp, ref), ops.kl_k3_backward(g, logp, ref))


@pytest.mark.parametrize("mode", rl.MODES)
def test_autograd_of_a_kl_loss_is_the_contract_chain(mode):
    """masked_mean(kl_k3(logp, ref)).backward() gives kl_k3_backward(masked_mean_backward(1)) bit for bit."""
    d = _ppo_data(b=6, t=40, dual_clip=None)
    ref = d["logp"] + normal(seed_of("test_rl", "kl_ref"), (6, 40), std=0.3, dtype=torch.float32)
    logp = d["logp"].clone().requires_grad_(True)
    loss = ops.masked_mean(ops.kl_k3(logp, ref), d["mask"], mode=mode)
    assert type(loss.grad_fn).__name__ == "MaskedMeanFunctionBackward"
    loss.backward()
    dk = ops.masked_mean_backward(torch.tensor(1.0), d["mask"], mode=mode)
    assert_bits(ops.kl_k3_backward(dk, d["logp"], ref), logp.grad)
    assert_bits(ops.masked_mean(ops.kl_k3(d["logp"], ref), d["mask"], mode=mode), loss.detach())


@pytest.mark.parametrize("mode", rl.MODES)
def test_masked_mean_gradient_is_ppo_losss_with_unit_factor(mode):
    """The two aggregations round alike: an unchanged policy with advantage -1 has pg1 = 1, and ppo_loss's
    gradient equals masked_mean's on every token."""
    d = _ppo_data(b=7, t=33, dual_clip=None)
    logp = d["logp"].clone().requires_grad_(True)
    rl.ppo_loss(logp, d["logp"], -torch.ones(7), d["mask"], mode=mode, denominator=1000).backward(torch.tensor(0.3))
    x = torch.zeros(7, 33, requires_grad=True)
    ops.masked_mean(x, d["mask"], mode=mode, denominator=1000).backward(torch.tensor(0.3))
    assert_bits(x.grad, logp.grad)


@pytest.mark.parametrize("mode", rl.MODES)
def test_global_denominator_makes_masked_mean_gradients_exact(mode):
    """With the global count as denominator every split of the batch gives every token the full batch's bits."""
    d = _ppo_data(b=9, t=30, dual_clip=None)
    mask = d["mask"].clone()
    mask[4] = False  # an empty sequence
    n = rl.count(mask, mode)
    x = d["logp"].clone().requires_grad_(True)
    ops.masked_mean(ops.kl_k3(x, d["old_logp"]), mask, mode=mode, denominator=n).backward()
    for bounds in ((0, 9), (0, 1, 2, 3, 4, 5, 6, 7, 8, 9), (0, 4, 5, 9)):
        parts = []
        for lo, hi in zip(bounds, bounds[1:]):
            xp = d["logp"][lo:hi].clone().requires_grad_(True)
            ops.masked_mean(ops.kl_k3(xp, d["old_logp"][lo:hi]), mask[lo:hi], mode=mode, denominator=n).backward()
            parts.append(xp.grad)
        assert_bits(x.grad, torch.cat(parts), f"split {bounds}")


def test_kl_k3_refuses_a_ref_logp_that_requires_grad():
    logp = torch.zeros(2, 3, requires_grad=True)
    with pytest.raises(ops_dispatch.BackwardNotDefined, match="defined for logp only, and ref_logp requires grad"):
        ops.kl_k3(logp, torch.zeros(2, 3, requires_grad=True))
    with torch.no_grad():
        ops.kl_k3(logp, torch.zeros(2, 3, requires_grad=True))


def test_accuracy_rl_backwards_vs_float64_no_worse_than_torch_fp32():
    """Accuracy (not bits): kl_k3 and masked_mean gradients against float64 autograd: relative L2 error no
    larger than torch's fp32 autograd of the verl-style expressions (the suite's rule)."""
    from rlkernel.conformance.accuracy.ops import rl_backward as rows
    from rlkernel.conformance.accuracy.suite import verdict

    for m in rows.measurements():
        v = verdict(m.run("small", torch.device("cpu")), m.metric)
        assert v["meets"], f"{m.op}/{m.dataset}: ours {v['rlkernel']:.3e} vs torch fp32 {v['native']:.3e}"


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("call, exc, match", [
    (lambda: ops.masked_mean(torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool)),
     TypeError, "x has dtype float64; expected one of float32"),
    (lambda: ops.masked_mean(torch.ones(2, 3), torch.ones(2, 3)), TypeError, "mask has dtype float32; expected bool"),
    (lambda: ops.masked_mean(torch.ones(2, 3), torch.ones(3, 2, dtype=torch.bool)), ValueError,
     r"mask has shape \(3, 2\)"),
    (lambda: ops.masked_mean(torch.ones(6), torch.ones(6, dtype=torch.bool)), ValueError, r"expected \[B, T\]"),
    (lambda: ops.masked_mean(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), mode="mean"), ValueError,
     "mode = 'mean'; expected one of token-mean"),
    (lambda: ops.masked_mean(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), denominator=0), ValueError,
     "expected a finite value > 0"),
    (lambda: ops.masked_mean(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), denominator=1e39), ValueError,
     "rounds to inf"),
    (lambda: ops.masked_mean(torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), denominator="7"), TypeError,
     "denominator must be a Python float"),
    (lambda: ops.masked_mean(partials=[torch.zeros(20, dtype=torch.int64)]), ValueError, r"expected int64 \[..., 21\]"),
    (lambda: ops.masked_mean(partials=[]), ValueError, "partials is empty"),
    (lambda: ops.masked_mean(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool),
                             partials=[torch.zeros(21, dtype=torch.int64)]), ValueError, "not both"),
    (lambda: ops.masked_mean(), ValueError, "x and mask are required"),
    (lambda: ops.ppo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3), torch.ones(2, 3, dtype=torch.bool)),
     ValueError, r"advantages has shape \(3,\); expected \[B, T\]"),
    (lambda: ops.ppo_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool)),
     ValueError, "old_logp has shape"),
    (lambda: ops.ppo_loss(torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(2, 3), torch.zeros(2),
                          torch.ones(2, 3, dtype=torch.bool)), TypeError, "logp has dtype bfloat16"),
    (lambda: ops.ppo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool),
                          dual_clip=0.5), ValueError, "dual_clip = 0.5; expected a finite value > 1"),
    (lambda: ops.ppo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool),
                          clip_low=1.5), ValueError, "clip_low = 1.5"),
    (lambda: ops.ppo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool),
                          clip_high=-0.1), ValueError, "clip_high = -0.1"),
    (lambda: ops.kl_k3(torch.zeros(2, 3), torch.zeros(3, 2)), ValueError, "ref_logp has shape"),
    (lambda: ops.kl_k3(torch.zeros(2), torch.zeros(2, dtype=torch.float16)), TypeError, "ref_logp has dtype float16"),
    (lambda: ops.group_advantages(torch.zeros(8)), ValueError, r"expected \[G, n\]"),
    (lambda: ops.group_advantages(torch.zeros(2, 8), eps=-1.0), ValueError, "eps = -1.0"),
    (lambda: ops.group_advantages(torch.zeros(2, 8, dtype=torch.int64)), TypeError, "rewards has dtype int64"),
    (lambda: ops.group_advantages([[1.0]]), TypeError, "must be a torch.Tensor"),
])
def test_bad_inputs_raise_clear_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_term_bound_is_checked(monkeypatch):
    import rlkernel.ops._rl as ops_rl

    monkeypatch.setattr(ops_rl, "MAX_TERMS", 10)
    with pytest.raises(ValueError, match="superaccumulator bound"):
        ops.masked_mean(torch.ones(3, 4), torch.ones(3, 4, dtype=torch.bool))


# --------------------------------------------------------------------------- accuracy vs float64


def _rel(a: torch.Tensor, truth: torch.Tensor) -> float:
    return float(((a.to(torch.float64) - truth).abs() / truth.abs().clamp(min=1e-300)).max())


def test_accuracy_masked_mean_and_ppo_loss_vs_float64():
    d = c_ppo._inputs("accuracy", 16, 512, spread=0.3, dual_clip=3.0)
    loss = ops.ppo_loss(**d)
    d64 = {k: (v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
           for k, v in d.items()}
    truth = c_ppo.verl_ppo_loss(**d64)
    assert _rel(loss, truth) < 1e-5
    x = normal(seed_of("test_rl", "acc"), (16, 512), dtype=torch.float32)
    x[3, 7] = 1.0e6  # a large value: the exact sum loses nothing, fp32 accumulation does
    x[5, 9] = -1.0e6
    mask = torch.ones_like(x, dtype=torch.bool)
    truth_mm = x.to(torch.float64).sum() / x.numel()
    assert _rel(ops.masked_mean(x, mask), truth_mm) <= 2.0**-24  # a correctly rounded sum, one division


def test_accuracy_group_advantages_and_kl_vs_float64():
    r = normal(seed_of("test_rl", "acc_adv"), (256, 16), dtype=torch.float32)
    adv = ops.group_advantages(r)
    r64 = r.to(torch.float64)
    truth = (r64 - r64.mean(1, keepdim=True)) / (r64.std(1, keepdim=True) + 1e-6)
    assert float((adv.to(torch.float64) - truth).abs().max()) < 1e-5
    d = c_kl._inputs("acc_kl", (16, 512), spread=0.5)
    k = ops.kl_k3(**d)
    dd = d["ref_logp"].to(torch.float64) - d["logp"].to(torch.float64)
    truth_k = torch.expm1(dd) - dd
    assert float(((k.to(torch.float64) - truth_k).abs()).max()) < 1e-6
