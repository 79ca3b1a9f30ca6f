"""sample: input errors, generic == reference bit for bit (hypothesis, specials), the
conformance cases, semantic properties (greedy, top-k = 1, top-p = 0, kept sets) and a
labelled statistical check of the sampled distribution."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlkernel
from rlkernel.backends.generic import sample as gen
from rlkernel.contracts import sample as con
from rlkernel.contracts._gen import integers, normal, seed_of, special_values
from rlkernel.ops.sample import sample
from rlkernel.public import public_op

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)


def _run(op: str, **kw):
    """Call the public op by name (what the conformance runner does)."""
    return public_op(op)(**kw)


def assert_tokens(expected: torch.Tensor, actual: torch.Tensor, what: str = "") -> None:
    assert expected.dtype == actual.dtype == torch.int64, (expected.dtype, actual.dtype)
    assert expected.shape == actual.shape, (expected.shape, actual.shape)
    diff = (expected != actual).nonzero()
    if len(diff):
        i = int(diff[0])
        raise AssertionError(f"{what}: first difference at row {i}: expected token {int(expected[i])}, got "
                             f"{int(actual[i])}; {len(diff)} of {expected.numel()} rows differ")


def inputs(b: int = 4, v: int = 30, tag: str = "t") -> dict:
    s = seed_of("test_sample", tag, b, v)
    return {"logits": normal(s, (b, v), std=2.0, dtype=torch.float32), "temperature": 1.0, "top_k": 0,
            "top_p": 1.0, "seed": integers(s + 1, (b,), 0, 2**62), "position": torch.arange(b, dtype=torch.int64)}


# --- errors -------------------------------------------------------------------------------------

def test_rejects_bad_inputs():
    a = inputs()
    with pytest.raises(TypeError, match="logits has dtype int64"):
        sample(**{**a, "logits": a["logits"].long()})
    with pytest.raises(ValueError, match=r"logits has shape \(120,\); expected \[B, V\]"):
        sample(**{**a, "logits": a["logits"].flatten()})
    with pytest.raises(ValueError, match=r"expected 1 <= V <= 262144 \(2\*\*18"):
        sample(**{**a, "logits": torch.zeros((1, (1 << 18) + 1))})
    with pytest.raises(TypeError, match="seed must be a torch.Tensor"):
        sample(**{**a, "seed": 5})
    with pytest.raises(TypeError, match="seed has dtype int32"):  # a 64-bit pattern: int32 would change it
        sample(**{**a, "seed": a["seed"].int()})
    with pytest.raises(TypeError, match="position has dtype int16; expected one of int64, int32"):
        sample(**{**a, "position": a["position"].short()})
    with pytest.raises(ValueError, match=r"position has shape \(3,\); expected \[B\] = \[4\]"):
        sample(**{**a, "position": a["position"][:3]})
    with pytest.raises(TypeError, match="temperature has dtype float64"):
        sample(**{**a, "temperature": torch.ones(4, dtype=torch.float64)})
    with pytest.raises(TypeError, match="top_k must be a int64 tensor \\[B\\] or a Python int, got float"):
        sample(**{**a, "top_k": 2.0})
    with pytest.raises(ValueError, match=r"temperature\[2\] = -1.0; expected a finite value >= 0"):
        sample(**{**a, "temperature": torch.tensor([1.0, 1.0, -1.0, 1.0])})
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(ValueError, match="temperature"):
            sample(**{**a, "temperature": bad})
    with pytest.raises(ValueError, match="temperature = 1e-50 rounds to 0 in fp32"):
        sample(**{**a, "temperature": 1e-50})
    with pytest.raises(ValueError, match=r"top_k = -1; expected an integer >= 0"):
        sample(**{**a, "top_k": -1})
    with pytest.raises(ValueError, match=r"top_p = nan; expected a value >= 0"):
        sample(**{**a, "top_p": float("nan")})
    with pytest.raises(ValueError, match=r"position\[1\] = -3; expected a token position >= 0"):
        sample(**{**a, "position": torch.tensor([0, -3, 1, 2])})
    with pytest.raises(ValueError, match="seed is on meta but logits is on cpu"):
        sample(**{**a, "seed": a["seed"].to("meta")})


def test_tensor_parameter_checks_need_every_value_valid():
    """The tensor parameters are checked with one minimum: each bad value is found, each edge of
    the valid range passes (-0.0 and 0 temperature, +inf top_p, top_k 0, position 0)."""
    a = inputs()
    ok = {"temperature": torch.tensor([0.0, -0.0, 1e-30, 3.0]), "top_k": torch.tensor([0, 1, 2**40, 5]),
          "top_p": torch.tensor([0.0, 1.0, float("inf"), 0.5]), "position": torch.tensor([0, 1, 2**40, 3])}
    sample(**{**a, **ok})
    bad = {"temperature": (float("inf"), float("-inf"), float("nan"), -1e-30), "top_k": (-1, -(2**62)),
           "top_p": (float("nan"), -0.5, float("-inf")), "position": (-1, -(2**62))}
    for name, values in bad.items():
        for value in values:
            t = ok[name].clone()
            t[3] = value
            with pytest.raises(ValueError, match=rf"sample: {name}\[3\] = .*; expected"):
                sample(**{**a, **ok, name: t})


@pytest.mark.parametrize("top_k, top_p, filtered", [
    (0, 1.0, False), (200, 2.0, False), (50, 1.0, True), (0, 0.9, True),  # Python scalars (V = 200)
    ([0, 0, 200], [1.0, 1.5, 1.0], False), ([0, 3, 0], [1.0, 1.0, 1.0], True), ([0, 0, 0], [1.0, 0.999, 1.0], True),
    ([0, 0, 999], 1.0, False), (0, [1.0, float("inf"), 1.0], False)])
def test_launch_hint_says_whether_a_row_is_filtered(monkeypatch: pytest.MonkeyPatch, top_k, top_p,
                                                   filtered: bool) -> None:
    """The public op tells the backend whether any row has top-k (0 < k < V) or top-p (p < 1) on, as
    the Python scalars or the tensor values its check read say (``filtered``: a launch hint the
    Triton kernels use to skip two launches; tokens never depend on it)."""
    from rlkernel import dispatch

    seen = []
    real = dispatch.call

    def spy(op: str, device: torch.device, /, **kwargs):
        seen.append(kwargs["filtered"])
        return real(op, device, **kwargs)

    monkeypatch.setattr(dispatch, "call", spy)
    a = inputs(b=3, v=200, tag="hint")
    a.update(top_k=torch.tensor(top_k) if isinstance(top_k, list) else top_k,
             top_p=torch.tensor(top_p) if isinstance(top_p, list) else top_p)
    assert_tokens(con.reference(**a), sample(**a), f"top_k={top_k} top_p={top_p}")
    assert seen == [filtered]


# --- bits: generic == reference ----------------------------------------------------------------

@st.composite
def problems(draw: st.DrawFn) -> dict:
    b, v = draw(st.integers(0, 6)), draw(st.integers(1, 80))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    s = draw(st.integers(0, 2**32))
    logits = normal(s, (b, v), std=draw(st.sampled_from([1e-3, 1.0, 8.0])), dtype=dtype)
    sv = special_values(dtype)
    for _ in range(draw(st.integers(0, 3)) if logits.numel() else 0):
        logits.view(-1)[draw(st.integers(0, logits.numel() - 1))] = sv[draw(st.integers(0, len(sv) - 1))]
    if draw(st.booleans()) and logits.numel():  # ties
        logits[:, : v // 2] = logits[:, :1]

    def per_row(strategy: st.SearchStrategy, dtype: torch.dtype):
        if draw(st.booleans()):
            return draw(strategy)
        return torch.tensor([draw(strategy) for _ in range(b)], dtype=dtype)

    return {"logits": logits,
            "temperature": per_row(st.sampled_from([0.0, 1.0, 0.6, 1.7, 1e-3]), torch.float32),
            "top_k": per_row(st.sampled_from([0, 0, 1, 2, 5, v, v + 1]), torch.int64),
            "top_p": per_row(st.sampled_from([1.0, 1.0, 0.0, 0.3, 0.9, 0.999, 2.0]), torch.float32),
            "seed": torch.tensor([draw(st.integers(-(2**63), 2**63 - 1)) for _ in range(b)], dtype=torch.int64),
            "position": torch.tensor([draw(st.integers(0, 2**63 - 1)) for _ in range(b)], dtype=torch.int64)}


@SETTINGS
@given(problems())
def test_generic_equals_reference(p: dict) -> None:
    assert_tokens(con.reference(**p), sample(**p), "sample")


def test_row_chunking_gives_the_same_tokens(monkeypatch: pytest.MonkeyPatch):
    a = con._mixed("chunks", 11, 500)
    expected = sample(**a)
    monkeypatch.setattr(gen, "WORK_BYTES", gen._ROW_BYTES * 500 * 3)  # three rows per chunk
    assert_tokens(expected, sample(**a), "row chunks of 3")


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (3, 0.5), (700, 1.0), (0, 0.999), (1000, 0.3)])
def test_noise_for_candidates_only_or_for_all_gives_the_same_tokens(top_k: int, top_p: float):
    """Small kept sets draw Philox only for their candidates, large ones for the whole row."""
    a = inputs(b=9, v=1000, tag="paths")
    a.update(top_k=top_k, top_p=top_p, temperature=0.9)
    assert_tokens(con.reference(**a), sample(**a), f"top_k={top_k} top_p={top_p}")


def test_dispatch_reports_the_kernel():
    with rlkernel.trace() as calls:
        sample(**inputs())
    assert calls == [("sample", "cpu:sample.sample")]


# --- semantics ---------------------------------------------------------------------------------

def test_int32_position_gives_the_tokens_of_int64_position():
    a = inputs()
    assert_tokens(sample(**a), sample(**{**a, "position": a["position"].int()}), "int32 position")


def test_greedy_top1_and_top_p_zero_pick_the_argmax():
    a = inputs(b=6, v=50, tag="greedy")
    a["logits"][1, 7] = a["logits"][1].max()  # a tie: the lower index must win
    first_max = torch.stack([(row == row.max()).nonzero()[0, 0] for row in a["logits"]])
    assert_tokens(first_max, sample(**{**a, "temperature": 0.0}), "greedy")
    assert_tokens(first_max, sample(**{**a, "top_k": 1}), "top_k = 1")
    assert_tokens(first_max, sample(**{**a, "top_p": 0.0}), "top_p = 0")


def test_samples_stay_inside_the_kept_set():
    """Top-k = 5: always one of the 5 largest; top-p = 0.5 on a known distribution: the kept set."""
    b = 400
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.05, 0.05])).repeat(b, 1)
    seed = torch.full((b,), 99, dtype=torch.int64)
    pos = torch.arange(b, dtype=torch.int64)
    tok = sample(logits, 1.0, 0, 0.5, seed, pos)  # cum_before: 0, .4, .7 -> keeps {0, 1}
    assert set(tok.tolist()) == {0, 1}
    tok = sample(logits, 1.0, 3, 1.0, seed, pos)
    assert set(tok.tolist()) == {0, 1, 2}
    big = normal(seed_of("test_sample", "topk"), (64, 1000), std=3.0, dtype=torch.float32)
    tok = sample(big, 1.0, 5, 1.0, torch.arange(64), torch.zeros(64, dtype=torch.int64))
    top5 = big.topk(5, dim=-1).indices
    assert bool((top5 == tok.view(-1, 1)).any(dim=-1).all())


def test_seed_and_position_change_the_draw():
    a = inputs(b=1, v=1000, tag="noise")
    a["logits"] = torch.zeros((1, 1000))
    toks = {int(sample(**{**a, "position": torch.tensor([p])})) for p in range(20)}
    assert len(toks) > 15
    toks = {int(sample(**{**a, "seed": torch.tensor([s])})) for s in range(20)}
    assert len(toks) > 15


# --- the conformance cases, run here too ---------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in con.golden_cases() + con.adversarial_cases() if not c.full_only],
                         ids=lambda c: c.name)
def test_conformance_case_bits(case):
    assert_tokens(con.reference(**case.make()), _run("sample", **case.make()), case.name)


@pytest.mark.parametrize("case", con.invariance_cases(), ids=lambda c: c.name)
def test_invariance(case):
    expected, actual = case.check(_run)
    assert_tokens(expected, actual, case.name)


# --- statistics (a labelled statistical check: fixed seeds, deterministic) -----------------------

def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    return float(((counts - expected) ** 2 / expected).sum())


def test_accuracy_sample_distribution():
    """Frequencies over 40000 positions match softmax(z) (chi-square, 7 degrees of freedom, the
    0.1 % critical value 24.32), and with top-k = 4 the renormalised top-4 softmax (3 d.o.f.,
    16.27). The inputs are fixed, so the statistic is the same number on every run and backend."""
    n = 40000
    z = torch.tensor([1.5, 0.2, -0.7, 0.9, 0.0, -2.0, 1.1, 0.4])
    tau = 0.8
    probs = torch.softmax(z.double() / tau, dim=0)
    seed = torch.full((n,), 0x5EED, dtype=torch.int64)
    pos = torch.arange(n, dtype=torch.int64)
    tok = sample(z.repeat(n, 1), tau, 0, 1.0, seed, pos)
    assert _chi_square(tok, probs) < 24.32
    tok = sample(z.repeat(n, 1), tau, 4, 1.0, seed, pos)
    top = torch.tensor([0, 6, 3, 7])
    assert set(tok.unique().tolist()) <= set(top.tolist())
    p4 = probs[top] / probs[top].sum()
    remap = torch.full((8,), -1, dtype=torch.int64)
    remap[top] = torch.arange(4)
    assert _chi_square(remap[tok], p4) < 16.27
