"""silu_mul: input errors, generic == reference on bytes, invariances, accuracy vs float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.backends.generic.silu_mul import silu_mul as generic_silu_mul
from rlkernel.backends.generic.silu_mul_backward import silu_mul_backward as generic_silu_mul_backward
from rlkernel.contracts import silu_mul as contract
from rlkernel.contracts import silu_mul_backward as bwd_contract
from rlkernel.contracts._gen import from_bits, special_values
from rlkernel.dispatch import use_backend
from rlkernel.ops.silu_mul import silu_mul, silu_mul_backward

FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def assert_same_bits(expected: torch.Tensor, actual: torch.Tensor, what: str = "") -> None:
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, (
        f"{what}: {expected.dtype}{tuple(expected.shape)} vs {actual.dtype}{tuple(actual.shape)}")
    a, b = _bits(expected), _bits(actual)
    if not torch.equal(a, b):
        idx = tuple((a != b).nonzero()[0].tolist())
        raise AssertionError(f"{what}: first difference at {idx}: expected {int(a[idx]) & 0xFFFFFFFF:#x}, "
                             f"got {int(b[idx]) & 0xFFFFFFFF:#x}; {(a != b).sum().item()} elements differ")


@st.composite
def gate_up(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """gate, up [rows, I]: scaled normals with drawn special values in either operand."""
    dtype = draw(st.sampled_from(FLOATS))
    rows, width = draw(st.integers(0, 4)), draw(st.integers(1, 300))
    scale = draw(st.sampled_from([1.0, 4.0, 30.0, 100.0, 2.0**-20]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gate = torch.from_numpy(rng.standard_normal((rows, width)) * scale).to(dtype)
    up = torch.from_numpy(rng.standard_normal((rows, width))).to(dtype)
    sv = special_values(dtype)
    for _ in range(draw(st.integers(0, 4)) if rows else 0):
        target = draw(st.sampled_from([gate, up]))
        special = sv[draw(st.integers(0, sv.numel() - 1))]
        target[draw(st.integers(0, rows - 1)), draw(st.integers(0, width - 1))] = special
    return gate, up


@settings(max_examples=60, deadline=None)
@given(gate_up())
def test_generic_equals_reference_bits(gu: tuple[torch.Tensor, torch.Tensor]) -> None:
    gate, up = gu
    assert_same_bits(contract.reference(gate, up), generic_silu_mul(gate, up), "generic vs reference")


def test_every_bf16_gate() -> None:
    """All 65536 bf16 gate bit patterns, up = 1.5: generic == reference."""
    gate = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    up = torch.full_like(gate, 1.5)
    assert_same_bits(contract.reference(gate, up), generic_silu_mul(gate, up), "all bf16 gates")


@pytest.mark.parametrize("case", contract.golden_cases() + contract.adversarial_cases(), ids=lambda c: c.name)
def test_cases_match_reference(case) -> None:  # type: ignore[no-untyped-def]
    if case.full_only:
        pytest.skip("full_only case: run by `rlkernel conformance --full`")
    expected = contract.reference(**case.make())
    with use_backend("cpu"):
        actual = silu_mul(**case.make())
    assert_same_bits(expected, actual, case.name)


@pytest.mark.parametrize("case", contract.invariance_cases(), ids=lambda c: c.name)
def test_invariances(case) -> None:  # type: ignore[no-untyped-def]
    def run(op: str, **inputs):  # type: ignore[no-untyped-def]
        with use_backend("cpu"):
            return silu_mul(**inputs)

    expected, actual = case.check(run)
    expected = expected if isinstance(expected, list) else [expected]
    actual = actual if isinstance(actual, list) else [actual]
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same_bits(e, a, f"{case.name}[{i}]")


def test_special_values_semantics() -> None:
    """silu(+inf) = inf, silu(-inf) = NaN (documented), large negative -> -0, NaN canonical."""
    gate = torch.tensor([float("inf"), float("-inf"), -100.0, 0.0, -0.0, float("nan")])
    y = silu_mul(gate, torch.ones(6))
    assert y[0] == float("inf")
    assert torch.isnan(y[1]) and torch.isnan(y[5])
    assert y[2] == 0 and torch.signbit(y[2])
    assert y[3] == 0 and not torch.signbit(y[3])
    assert y[4] == 0 and torch.signbit(y[4])
    assert (_bits(y)[torch.isnan(y)] == 0x7FC00000).all()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"gate": 1.0, "up": torch.ones(2)}, TypeError, "gate must be a torch.Tensor"),
        ({"gate": torch.ones(2, dtype=torch.float64), "up": torch.ones(2, dtype=torch.float64)}, TypeError,
         "float64"),
        ({"gate": torch.ones(2, dtype=torch.bfloat16), "up": torch.ones(2)}, TypeError, "cast one so they match"),
        ({"gate": torch.ones(2, 3), "up": torch.ones(3)}, ValueError,
         r"gate has shape \(2, 3\) but up has shape \(3,\)"),
    ],
)
def test_bad_inputs(kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        silu_mul(**kwargs)


def test_accuracy_against_float64() -> None:
    """Accuracy (not bits): fp32 silu within 2.5 ulp of float64 (exp_c, add, divide); bf16 y within
    1.5 ulp (two bf16 roundings, as in Hugging Face)."""
    rng = np.random.default_rng(3)
    g = torch.from_numpy(rng.standard_normal((64, 4096)) * 4.0).to(torch.float32)
    g64 = g.double()
    truth = g64 / (1.0 + torch.exp(-g64))
    ours = silu_mul(g, torch.ones_like(g)).double()
    ulp = torch.pow(2.0, torch.floor(torch.log2(truth.abs().clamp(min=1e-38))) - 23)
    assert ((ours - truth).abs() / ulp).max().item() <= 2.5
    gb, ub = g.to(torch.bfloat16), torch.from_numpy(rng.standard_normal((64, 4096))).to(torch.bfloat16)
    truth_b = gb.double() / (1.0 + torch.exp(-gb.double())) * ub.double()
    ulp_b = torch.pow(2.0, torch.floor(torch.log2(truth_b.abs().clamp(min=1e-38))) - 7)
    assert ((silu_mul(gb, ub).double() - truth_b).abs() / ulp_b).max().item() <= 1.5


def test_chunks_do_not_change_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's flat chunking (forced small here) gives the reference's bits."""
    import rlkernel.backends.generic.silu_mul as kernel

    rng = np.random.default_rng(8)
    gate = torch.from_numpy(rng.standard_normal((7, 333)) * 5).to(torch.float16)
    up = torch.from_numpy(rng.standard_normal((7, 333))).to(torch.float16)
    monkeypatch.setattr(kernel, "CHUNK_ELEMENTS", 1000)
    assert_same_bits(contract.reference(gate, up), kernel.silu_mul(gate, up), "chunked")


# --------------------------------------------------------------------------- backward (silu_mul_backward v1)


@settings(max_examples=60, deadline=None)
@given(gate_up(), st.integers(0, 2**32 - 1))
def test_backward_generic_equals_reference_bits(gu: tuple[torch.Tensor, torch.Tensor], seed: int) -> None:
    """Random gates and ups with drawn specials, and a special in dy: generic dgate and dup are the reference's."""
    gate, up = gu
    rng = np.random.default_rng(seed)
    dy = torch.from_numpy(rng.standard_normal(tuple(gate.shape))).to(gate.dtype)
    if gate.numel():
        dy.view(-1)[int(rng.integers(0, gate.numel()))] = special_values(gate.dtype)[int(rng.integers(0, 12))]
    for e, a, what in zip(bwd_contract.reference(dy, gate, up), generic_silu_mul_backward(dy, gate, up),
                          ("dgate", "dup")):
        assert_same_bits(e, a, what)


def test_backward_every_bf16_gate() -> None:
    """All 65536 bf16 gate bit patterns, up = 1.5, dy = 0.75: generic == reference."""
    gate = from_bits(list(range(1 << 16)), torch.bfloat16)
    up, dy = torch.full_like(gate, 1.5), torch.full_like(gate, 0.75)
    for e, a, what in zip(bwd_contract.reference(dy, gate, up), generic_silu_mul_backward(dy, gate, up),
                          ("dgate", "dup")):
        assert_same_bits(e, a, what)


def test_autograd_runs_the_backward_op() -> None:
    rng = np.random.default_rng(5)
    gate = torch.from_numpy(rng.standard_normal((4, 300)) * 3.0).to(torch.bfloat16)
    up = torch.from_numpy(rng.standard_normal((4, 300))).to(torch.bfloat16)
    dy = torch.from_numpy(rng.standard_normal((4, 300))).to(torch.bfloat16)
    gl, ul = gate.clone().requires_grad_(True), up.clone().requires_grad_(True)
    y = silu_mul(gl, ul)
    assert type(y.grad_fn).__name__ == "SiluMulFunctionBackward"
    y.backward(dy)
    dgate, dup = silu_mul_backward(dy, gate, up)
    assert gl.grad is not None and ul.grad is not None
    assert_same_bits(dgate, gl.grad, "dgate")
    assert_same_bits(dup, ul.grad, "dup")
    assert_same_bits(silu_mul(gate, up), y.detach(), "forward inside autograd")


def test_backward_bad_inputs() -> None:
    g = torch.ones(2, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="grad"):
        silu_mul_backward(torch.ones(2, 8), g, g)
    with pytest.raises(ValueError, match="grad has shape"):
        silu_mul_backward(torch.ones(2, 7, dtype=torch.bfloat16), g, g)


def test_accuracy_backward_vs_float64_no_worse_than_torch_bf16() -> None:
    """Accuracy (not bits): dgate and dup against float64 autograd on normal, wide and outlier data: relative
    L2 error no larger than torch's bf16 autograd of F.silu(gate) * up (the suite's rule)."""
    from rlkernel.conformance.accuracy.ops import silu_mul_backward as rows
    from rlkernel.conformance.accuracy.suite import verdict

    for m in rows.measurements():
        v = verdict(m.run("small", torch.device("cpu")), m.metric)
        assert v["meets"], f"{m.dataset}: ours {v['rlkernel']:.3e} vs torch bf16 {v['native']:.3e}"
