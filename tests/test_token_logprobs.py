"""token_logprobs: input errors, generic == reference bit for bit (hypothesis, specials, the
sharded form, forced chunking), the conformance cases, and accuracy against float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlkernel
from rlkernel.backends.generic import token_logprobs as gen
from rlkernel.contracts import token_logprobs as con
from rlkernel.contracts._gen import normal, seed_of, special_values, with_outlier_channels
from rlkernel.ops.token_logprobs import token_logprobs, token_logprobs_finish, token_logprobs_partial
from rlkernel.public import public_op

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    if t.dtype == torch.float32:
        t = torch.where(torch.isnan(t), torch.tensor(0x7FC00000, dtype=torch.int32).view(torch.float32), t)
        return t.view(torch.int32)
    return t


def assert_bits(expected: torch.Tensor, actual: torch.Tensor, what: str = "") -> None:
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, (expected.dtype, expected.shape,
                                                                                actual.dtype, actual.shape)
    a, b = bits(expected).flatten(), bits(actual).flatten()
    diff = (a != b).nonzero()
    if len(diff):
        i = int(diff[0])
        raise AssertionError(f"{what}: first difference at index {i}: expected {int(a[i]) & 0xFFFFFFFF:#010x} "
                             f"({expected.flatten()[i].item()}), got {int(b[i]) & 0xFFFFFFFF:#010x} "
                             f"({actual.flatten()[i].item()}); {len(diff)} of {a.numel()} differ")


def inputs(t: int = 5, h: int = 24, v: int = 37, dtype: torch.dtype = torch.bfloat16, tag: str = "t") -> dict:
    s = seed_of("test_token_logprobs", tag, t, h, v)
    return {"hidden": normal(s, (t, h), dtype=dtype), "weight": normal(s + 1, (v, h), std=0.1, dtype=dtype),
            "targets": torch.arange(t, dtype=torch.int64) % v}


def _run(op: str, **kw):
    """Call the public op by name (what the conformance runner does)."""
    return public_op(op)(**kw)


# --- errors -------------------------------------------------------------------------------------

def test_int32_targets_give_the_bits_of_int64_targets():
    # int32 targets used to be refused while embedding took int32 ids; both widths are token ids.
    a = inputs()
    expected = token_logprobs(a["hidden"], a["weight"], a["targets"])
    assert_bits(expected, token_logprobs(a["hidden"], a["weight"], a["targets"].int()), "int32 targets")
    shard = a["weight"][3:]
    row_max = token_logprobs_partial(a["hidden"], shard, a["targets"], 3)
    assert_bits(row_max, token_logprobs_partial(a["hidden"], shard, a["targets"].int(), 3), "phase 1")
    wide = token_logprobs_partial(a["hidden"], shard, a["targets"], 3, row_max=row_max)
    narrow = token_logprobs_partial(a["hidden"], shard, a["targets"].int(), 3, row_max=row_max)
    for w, n, what in zip(wide, narrow, ("sum_int", "target_d")):
        assert_bits(w, n, f"phase 2 {what}")


def test_rejects_bad_dtypes_and_shapes():
    a = inputs()
    with pytest.raises(TypeError, match="hidden has dtype float32; expected one of bfloat16, float16"):
        token_logprobs(a["hidden"].float(), a["weight"], a["targets"])
    with pytest.raises(TypeError, match="hidden is torch.bfloat16 but weight is torch.float16"):
        token_logprobs(a["hidden"], a["weight"].half(), a["targets"])
    with pytest.raises(TypeError, match="targets has dtype int16; expected one of int64, int32"):
        token_logprobs(a["hidden"], a["weight"], a["targets"].short())
    with pytest.raises(ValueError, match=r"expected \[T, H\] and \[V, H\] with the same H"):
        token_logprobs(a["hidden"], a["weight"][:, :5], a["targets"])
    with pytest.raises(ValueError, match="expected one target per row"):
        token_logprobs(a["hidden"], a["weight"], a["targets"][:2])
    with pytest.raises(ValueError, match=r"hidden has shape \(120,\)"):
        token_logprobs(a["hidden"].flatten(), a["weight"], a["targets"])
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        token_logprobs(a["hidden"], a["weight"], [0, 1, 2, 3, 4])


def test_rejects_bad_targets_temperature_and_vocab():
    a = inputs()
    y = a["targets"].clone()
    y[2] = 37
    with pytest.raises(ValueError, match=r"targets holds 37; expected token ids in \[0, 37\)"):
        token_logprobs(a["hidden"], a["weight"], y)
    y[2] = -1
    with pytest.raises(ValueError, match="targets holds -1"):
        token_logprobs(a["hidden"], a["weight"], y)
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e-50, 1e39):
        with pytest.raises(ValueError, match="temperature"):
            token_logprobs(**a, temperature=bad)
    with pytest.raises(TypeError, match="temperature must be a Python float"):
        token_logprobs(**a, temperature=torch.tensor(1.0))
    with pytest.raises(TypeError, match="temperature must be a Python float"):
        token_logprobs(**a, temperature=True)
    big = torch.zeros((con.MAX_VOCAB + 1, 1), dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"vocab=4194305 exceeds the exact-sum bound 4194304 \(2\*\*22\)"):
        token_logprobs(torch.zeros((1, 1), dtype=torch.bfloat16), big, torch.zeros(1, dtype=torch.int64))


def test_rejects_mixed_devices():
    a = inputs()
    with pytest.raises(ValueError, match="targets is on meta but hidden is on cpu"):
        token_logprobs(a["hidden"], a["weight"], a["targets"].to("meta"))


def test_partial_and_finish_reject_bad_inputs():
    a = inputs()
    with pytest.raises(ValueError, match="vocab_start = -1"):
        token_logprobs_partial(a["hidden"], a["weight"], a["targets"], -1)
    with pytest.raises(ValueError, match="vocab_start \\+ Vs <= 4194304"):
        token_logprobs_partial(a["hidden"], a["weight"], a["targets"], (1 << 22) - 3)
    with pytest.raises(TypeError, match="vocab_start must be a Python int"):
        token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 1.0)
    with pytest.raises(ValueError, match=r"row_max has shape \(4,\); expected \[T\] = \[5\]"):
        token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 0, row_max=torch.zeros(4))
    with pytest.raises(TypeError, match="row_max has dtype bfloat16"):
        token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 0, row_max=torch.zeros(5, dtype=torch.bfloat16))
    m = token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 0)
    with pytest.raises(ValueError, match="row_max is below a logit of this shard"):
        token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 0, row_max=m - 1.0)
    with pytest.raises(ValueError, match="sum_int holds -5"):
        token_logprobs_finish(torch.tensor([-5, 3]), torch.zeros(2))
    with pytest.raises(ValueError, match="expected both \\[T\\]"):
        token_logprobs_finish(torch.tensor([5, 3]), torch.zeros(3))


# --- bits: generic == reference ----------------------------------------------------------------

@st.composite
def problems(draw: st.DrawFn) -> dict:
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    t, h, v = draw(st.integers(0, 6)), draw(st.integers(1, 40)), draw(st.integers(1, 50))
    seed = draw(st.integers(0, 2**32))
    hidden = normal(seed, (t, h), std=draw(st.sampled_from([1e-3, 1.0, 30.0])), dtype=dtype)
    weight = normal(seed + 1, (v, h), std=draw(st.sampled_from([0.02, 1.0])), dtype=dtype)
    sv = special_values(dtype)
    for tensor in (hidden, weight):
        for _ in range(draw(st.integers(0, 3)) if tensor.numel() else 0):
            i = draw(st.integers(0, tensor.numel() - 1))
            tensor.view(-1)[i] = sv[draw(st.integers(0, len(sv) - 1))]
    if draw(st.booleans()) and h > 2:
        hidden = with_outlier_channels(hidden, seed + 2, count=1, factor=draw(st.sampled_from([300.0, 3000.0])))
    targets = torch.tensor([draw(st.integers(0, v - 1)) for _ in range(t)], dtype=torch.int64)
    temperature = draw(st.sampled_from([1.0, 0.7, 1.3, 1e-3, 2.5e4]))
    return {"hidden": hidden, "weight": weight, "targets": targets, "temperature": temperature}


@SETTINGS
@given(problems())
def test_generic_equals_reference(p: dict) -> None:
    assert_bits(con.reference(**p), token_logprobs(**p), "token_logprobs")


@SETTINGS
@given(problems(), st.integers(1, 5), st.integers(0, 2**16))
def test_sharded_equals_whole(p: dict, shards: int, salt: int) -> None:
    """Any number of uneven shards through partial/finish gives the unsharded bits (generic and reference)."""
    v = p["weight"].shape[0]
    shards = min(shards, v)
    cuts = sorted({(salt * (i + 7) * 2654435761) % v for i in range(shards - 1)} - {0})
    bounds = list(zip([0, *cuts], [*cuts, v]))

    def run_with(table: dict):
        def run(op: str, **kw):
            return table[op](**kw)
        return run

    public = {"token_logprobs_partial": token_logprobs_partial, "token_logprobs_finish": token_logprobs_finish}
    for run in (run_with(public), run_with(con.REFERENCES)):
        maxes = [run("token_logprobs_partial", hidden=p["hidden"], weight_shard=p["weight"][a:b],
                     targets=p["targets"], vocab_start=a, temperature=p["temperature"]) for a, b in bounds]
        m = con.max_over_shards(maxes)
        parts = [run("token_logprobs_partial", hidden=p["hidden"], weight_shard=p["weight"][a:b],
                     targets=p["targets"], vocab_start=a, temperature=p["temperature"], row_max=m)
                 for a, b in bounds]
        total = torch.stack([s for s, _ in parts]).sum(dim=0)
        out = run("token_logprobs_finish", sum_int=total, target_d=con.sum_bits_over_shards([d for _, d in parts]))
        assert_bits(con.reference(**p), out, f"{len(bounds)} shards {bounds}")


def test_negative_zero_target_survives_the_sharded_transport():
    """z = [-0 (underflow), -2**80]: m = +0, L = 1, out_0 = (-0 - +0) - log_c(1) = -0. The int32
    transport of target_d keeps the -0; a float all-reduce (-0 + +0 = +0) would not."""
    hidden = torch.tensor([[2.0**-20, 0.0]], dtype=torch.bfloat16)
    weight = torch.tensor([[-(2.0**-133), 0.0], [-(2.0**100), 0.0]], dtype=torch.bfloat16)
    p = {"hidden": hidden, "weight": weight, "targets": torch.tensor([0]), "temperature": 1.0}
    whole = token_logprobs(**p)
    assert_bits(con.reference(**p), whole)
    assert float(whole) == 0.0 and math.copysign(1.0, float(whole)) < 0
    out = con.sharded(_run, hidden, weight, p["targets"], 1.0, 2)
    assert_bits(whole, out, "sharded")


def test_forced_small_blocks_give_the_same_bits(monkeypatch: pytest.MonkeyPatch):
    """Chunking of tokens and vocabulary by the memory budget cannot change a bit."""
    a = inputs(t=7, h=40, v=301, tag="blocks")
    a["temperature"] = 0.9
    expected = token_logprobs(**a)
    monkeypatch.setattr(gen, "LOGITS_BYTES", 4 * 301 * 2)  # two tokens' logits per chunk
    monkeypatch.setattr(gen, "WORK_BYTES", 40 * gen._W_BYTES * 17)  # 17 weight rows per digit chunk
    assert gen._plan(7, 301, 40, keep_logits=True, device=torch.device("cpu"))[:2] == (2, 17)
    assert_bits(expected, token_logprobs(**a), "small blocks")
    m = token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 0, 0.9)
    s, d = token_logprobs_partial(a["hidden"], a["weight"], a["targets"], 0, 0.9, row_max=m)
    assert_bits(expected, token_logprobs_finish(s, d), "small blocks, one shard")


@pytest.mark.parametrize("bits, count", [(27, 4), (20, 3)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_digit_planes_rebuild_the_grid(dtype: torch.dtype, bits: int, count: int):
    """The kernel's fp32-only digits recombine to the reference's grid integers (28-bit hidden rows,
    21-bit head rows), for rows of random finite bit patterns (every binade, subnormals, ties on the
    grid) and scaled rows."""
    from rlkernel.contracts._exact.digits import row_exponent, to_grid
    from rlkernel.contracts._gen import random_bits

    raw = torch.from_numpy((random_bits(seed_of("test_token_logprobs", "digits"), 64 * 96) & 0xFFFF).astype("int64"))
    x = raw.to(torch.int16).view(dtype).view(64, 96).clone()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    x[:8] = (x[:8].double() * 2.0**-100).to(dtype)  # tiny rows (bf16: subnormal row maxima)
    x[8] = 0
    e, d, bad = gen._digits(x, bits, count)
    assert not bool(bad.any()) and float(d.abs().max()) <= 64 and d.shape[0] == count
    rebuilt = sum(d[i].to(torch.int64) << (7 * i) for i in range(count))
    assert torch.equal(e, row_exponent(x))
    assert torch.equal(rebuilt, to_grid(x, row_exponent(x), bits))


def test_dispatch_reports_the_kernel():
    a = inputs()
    with rlkernel.trace() as calls:
        token_logprobs(**a)
    assert calls == [("token_logprobs", "cpu:token_logprobs.token_logprobs")]


# --- the conformance cases, run here too ---------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in con.golden_cases() + con.adversarial_cases() if not c.full_only],
                         ids=lambda c: c.name)
def test_conformance_case_bits(case):
    op = case.op or "token_logprobs"
    expected, actual = con.REFERENCES[op](**case.make()), _run(op, **case.make())
    for e, a in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected, actual))):
        assert_bits(e, a, case.name)


@pytest.mark.parametrize("case", con.invariance_cases(), ids=lambda c: c.name)
def test_invariance(case):
    expected, actual = case.check(_run)
    assert_bits(expected, actual, case.name)


# --- accuracy (tolerances allowed here only) ------------------------------------------------------

def _truth(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, tau: float) -> torch.Tensor:
    z = (hidden.double() @ weight.double().T) / tau
    return torch.log_softmax(z, dim=-1).gather(1, targets.view(-1, 1)).view(-1)


def test_accuracy_token_logprobs_vs_float64():
    """Against float64 truth on LLM-like data with outlier channels: at least as accurate as the
    plain PyTorch path (bf16 GEMM with fp32 accumulation, fp32 log_softmax)."""
    s = seed_of("test_token_logprobs", "accuracy")
    hidden = with_outlier_channels(normal(s, (32, 256), dtype=torch.bfloat16), s + 1, count=3, factor=30.0)
    weight = normal(s + 2, (2000, 256), std=0.02, dtype=torch.bfloat16)
    targets = torch.arange(32, dtype=torch.int64) * 61 % 2000
    for tau in (1.0, 0.7):
        truth = _truth(hidden, weight, targets, tau)
        ours = token_logprobs(hidden, weight, targets, tau).double()
        native = torch.log_softmax(F.linear(hidden, weight).float() / tau, -1).gather(1, targets.view(-1, 1)).view(-1)
        err_ours = (ours - truth).abs().max().item()
        err_native = (native.double() - truth).abs().max().item()
        assert err_ours < 1e-5 * truth.abs().max().item() + 1e-6, err_ours
        assert err_ours <= err_native, (err_ours, err_native)
