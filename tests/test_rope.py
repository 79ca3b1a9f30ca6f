"""rope and rope_tables: correctly rounded tables, input errors, generic == reference on bytes,
invariances, accuracy vs float64."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.backends.generic.rope import rope as generic_rope
from rlkernel.backends.generic.rope_backward import rope_backward as generic_rope_backward
from rlkernel.conformance.cases import op_of, reference_of
from rlkernel.contracts import rope as contract
from rlkernel.contracts import rope_backward as bwd_contract
from rlkernel.contracts._contract import as_tensors
from rlkernel.contracts._gen import special_values
from rlkernel.dispatch import use_backend
from rlkernel.ops.rope import clear_table_cache, rope, rope_backward, rope_tables
from rlkernel.public import public_op

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


def _mp_round_f32(val: mpmath.mpf) -> float:
    """Independent correct rounding to fp32: mpmath at 24 bits, round-half-even (no overflow here)."""
    with mpmath.workprec(24):
        return float(+val)


# --------------------------------------------------------------------------- tables


def test_small_table_is_correctly_rounded() -> None:
    """Every entry of a [200, 8] table equals mpmath's cos/sin rounded once to fp32."""
    cos, sin = rope_tables(200, 16, 10000.0)
    with mpmath.workdps(50):
        for p in range(200):
            for i in range(8):
                angle = p * mpmath.mpf(10000.0) ** (mpmath.mpf(-2 * i) / 16)
                assert float(cos[p, i]) == _mp_round_f32(mpmath.cos(angle)), (p, i)
                assert float(sin[p, i]) == _mp_round_f32(mpmath.sin(angle)), (p, i)


def test_far_positions_are_correctly_rounded() -> None:
    """Entries at positions up to 2**24 - 1 (Qwen3 head_dim 128, theta 1e6) against mpmath."""
    rng = np.random.default_rng(0)
    positions = np.concatenate([rng.integers(0, 1 << 24, 120), [1, (1 << 24) - 1]])
    cos, sin = contract.table_rows(positions, 128, 1e6)
    cols = rng.integers(0, 64, positions.size)
    with mpmath.workdps(50):
        for k, (p, i) in enumerate(zip(positions, cols)):
            angle = int(p) * mpmath.mpf(1e6) ** (mpmath.mpf(-2 * int(i)) / 128)
            assert float(cos[k, i]) == _mp_round_f32(mpmath.cos(angle)), (p, i)
            assert float(sin[k, i]) == _mp_round_f32(mpmath.sin(angle)), (p, i)


def test_near_midpoint_entries_take_the_slow_path() -> None:
    """Force the filter: with a huge bound every entry is recomputed by mpmath; bits unchanged."""
    positions = np.arange(0, 3000, 7)
    fast = contract.table_rows(positions, 8, 1e6)
    saved = contract._BOUND_REL
    try:
        contract._BOUND_REL = 2.0**-20  # about 1 in 8 entries flagged
        slow = contract.table_rows(positions, 8, 1e6)
    finally:
        contract._BOUND_REL = saved
    assert_same_bits(fast[0], slow[0], "cos")
    assert_same_bits(fast[1], slow[1], "sin")


def test_table_growth_and_devices_keep_bits() -> None:
    clear_table_cache()
    small = rope_tables(50, 64, 1e6)
    big = rope_tables(5000, 64, 1e6)
    assert_same_bits(small[0], big[0][:50], "cos rows")
    assert_same_bits(small[1], big[1][:50], "sin rows")
    direct = contract.rope_tables(5000, 64, 1e6)
    assert_same_bits(direct[0], big[0], "cached vs contract")
    assert rope_tables(0, 4)[0].shape == (0, 2)
    assert float(big[0][0, 0]) == 1.0 and _bits(big[1][0]).eq(0).all()  # p = 0: cos 1, sin +0


def test_rope_tables_is_public() -> None:
    import rlkernel.ops

    assert rlkernel.ops.rope_tables is rope_tables


@pytest.mark.parametrize(
    ("args", "match"),
    [((10, 7, 1e6), "even"), ((-1, 8, 1e6), "max_position"), ((10, 8, 0.0), "theta"),
     ((10, 8, float("inf")), "theta"), (((1 << 24) + 1, 8, 1e6), "max_position")],
)
def test_table_bad_arguments(args, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=match):
        rope_tables(*args)


# --------------------------------------------------------------------------- the op


@st.composite
def rope_inputs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, float]:
    dtype = draw(st.sampled_from(FLOATS))
    tokens, heads = draw(st.integers(0, 6)), draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1.0, 2.0**-20, 1e4]))
    x = torch.from_numpy(rng.standard_normal((tokens, heads, head_dim)) * scale).to(dtype)
    sv = special_values(dtype)
    for _ in range(draw(st.integers(0, 3)) if tokens else 0):
        x[draw(st.integers(0, tokens - 1)), draw(st.integers(0, heads - 1)), draw(st.integers(0, head_dim - 1))] = (
            sv[draw(st.integers(0, sv.numel() - 1))])
    positions = torch.from_numpy(rng.integers(0, draw(st.sampled_from([1, 8, 5000])), tokens).astype(np.int64))
    if tokens and draw(st.booleans()):
        positions[0] = 0
    theta = draw(st.sampled_from([1e6, 10000.0, 500000.0]))
    if draw(st.booleans()):
        x = x[:, 0]  # [T, D] form
    return x, positions, theta


@settings(max_examples=50, deadline=None)
@given(rope_inputs())
def test_generic_equals_reference_bits(inputs: tuple[torch.Tensor, torch.Tensor, float]) -> None:
    x, positions, theta = inputs
    cos, sin = rope_tables(5000, x.shape[-1], theta)
    expected = contract.reference(x, positions, theta)
    assert_same_bits(expected, generic_rope(x, positions, cos, sin), "generic vs reference")
    assert_same_bits(expected, rope(x, positions, theta), "public op vs reference")


@pytest.mark.parametrize("case", contract.golden_cases() + contract.adversarial_cases(), ids=lambda c: c.name)
def test_cases_match_reference(case) -> None:  # type: ignore[no-untyped-def]
    if case.full_only:
        pytest.skip("full_only case: run by `rlkernel conformance --full`")
    op = op_of(contract, case)  # rope, or the public tables rope_tables / rope_table_rows
    expected = reference_of(contract, op)(**case.make())
    with use_backend("cpu"):
        actual = public_op(op)(**case.make())
    for e, a in zip(as_tensors(expected), as_tensors(actual), strict=True):
        assert_same_bits(e, a, f"{op} {case.name}")


@pytest.mark.parametrize("case", contract.invariance_cases(), ids=lambda c: c.name)
def test_invariances(case) -> None:  # type: ignore[no-untyped-def]
    def run(op: str, **inputs):  # type: ignore[no-untyped-def]
        with use_backend("cpu"):
            return rope(**inputs)

    expected, actual = case.check(run)
    expected = expected if isinstance(expected, list) else [expected]
    actual = actual if isinstance(actual, list) else [actual]
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same_bits(e, a, f"{case.name}[{i}]")


def test_position_zero_is_identity_and_two_d_form() -> None:
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((3, 2, 64)) + 0.5).to(torch.bfloat16)
    assert_same_bits(x, rope(x, torch.zeros(3, dtype=torch.int64)), "p = 0")
    assert_same_bits(rope(x, torch.tensor([3, 9, 1]))[:, 1], rope(x[:, 1], torch.tensor([3, 9, 1])), "[T, D] form")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"x": [1.0], "positions": torch.zeros(1, dtype=torch.int64)}, TypeError, "x must be a torch.Tensor"),
        ({"x": torch.ones(2, 4, dtype=torch.float64), "positions": torch.zeros(2, dtype=torch.int64)}, TypeError,
         "float64"),
        ({"x": torch.ones(2, 4), "positions": torch.zeros(2, dtype=torch.int16)}, TypeError,
         "positions has dtype int16; expected one of int64, int32"),
        ({"x": torch.ones(2, 1, 2, 4), "positions": torch.zeros(2, dtype=torch.int64)}, ValueError,
         r"\[T, n_heads, D\] or \[T, D\]"),
        ({"x": torch.ones(2, 4), "positions": torch.zeros(3, dtype=torch.int64)}, ValueError, "T = x.shape"),
        ({"x": torch.ones(2, 4), "positions": torch.zeros(2, 1, dtype=torch.int64)}, ValueError, "one position"),
        ({"x": torch.ones(2, 5), "positions": torch.zeros(2, dtype=torch.int64)}, ValueError, "even D"),
        ({"x": torch.ones(2, 4), "positions": torch.tensor([0, -1])}, ValueError, r"\[0, 2\*\*24\)"),
        ({"x": torch.ones(2, 4), "positions": torch.tensor([0, 1 << 24])}, ValueError, r"\[0, 2\*\*24\)"),
        ({"x": torch.ones(2, 4), "positions": torch.tensor([0, 1]), "theta": -1.0}, ValueError, "theta"),
        ({"x": torch.ones(2, 4), "positions": torch.tensor([0, 1]), "theta": "1e6"}, TypeError, "theta"),
    ],
)
def test_bad_inputs(kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        rope(**kwargs)


def test_int32_positions_give_the_bits_of_int64_positions() -> None:
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((4, 2, 16))).to(torch.bfloat16)
    positions = torch.tensor([7, 0, 40000, 7])
    assert_same_bits(rope(x, positions), rope(x, positions.int()), "int32 positions")


def test_accuracy_against_float64() -> None:
    """Accuracy (not bits): fp32 outputs within 3 * 2**-24 of |x1 c| + |x2 s| of the exact rotation
    (correctly rounded tables, then three roundings); Hugging Face's fp32-angle path is far worse at
    long positions, which is why the tables are exact."""
    rng = np.random.default_rng(9)
    positions = torch.from_numpy(rng.integers(0, 40960, 64).astype(np.int64))
    x = torch.from_numpy(rng.standard_normal((64, 4, 128))).to(torch.float32)
    c, s = contract._fast(positions.numpy(), contract._turn_limbs(contract._frequencies(128, 1e6)))
    c, s = torch.from_numpy(c)[:, None], torch.from_numpy(s)[:, None]
    x1, x2 = x.double()[..., :64], x.double()[..., 64:]
    truth = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    scale = torch.cat([(x1 * c).abs() + (x2 * s).abs(), (x2 * c).abs() + (x1 * s).abs()], -1)
    err = ((rope(x, positions).double() - truth).abs() / scale).max().item()
    err_hf = ((contract._hf_rope(x, positions).double() - truth).abs() / scale).max().item()
    assert err <= 3 * 2.0**-24
    assert err_hf > 100 * err


def test_token_chunks_do_not_change_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's token chunking (forced small here) gives the reference's bits."""
    import rlkernel.backends.generic.rope as kernel

    x = torch.from_numpy(np.random.default_rng(8).standard_normal((37, 4, 64))).to(torch.bfloat16)
    positions = torch.arange(37) * 101
    cos, sin = rope_tables(4000, 64, 1e6)
    monkeypatch.setattr(kernel, "CHUNK_ELEMENTS", 1000)  # 3 tokens per chunk, ragged last chunk
    assert_same_bits(contract.reference(x, positions, 1e6), kernel.rope(x, positions, cos, sin), "chunked tokens")


# --------------------------------------------------------------------------- backward (rope_backward v1)


@settings(max_examples=50, deadline=None)
@given(rope_inputs())
def test_backward_generic_equals_reference_bits(inputs: tuple[torch.Tensor, torch.Tensor, float]) -> None:
    """Random gradients with drawn specials: the generic kernel and the public op give the reference's bits."""
    grad, positions, theta = inputs
    cos, sin = rope_tables(5000, grad.shape[-1], theta)
    expected = bwd_contract.reference(grad, positions, theta)
    assert_same_bits(expected, generic_rope_backward(grad, positions, cos, sin), "generic vs reference")
    assert_same_bits(expected, rope_backward(grad, positions, theta), "public op vs reference")


def test_autograd_runs_the_backward_op() -> None:
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((9, 4, 64))).to(torch.bfloat16)
    dy = torch.from_numpy(rng.standard_normal((9, 4, 64))).to(torch.bfloat16)
    positions = torch.tensor([0, 5, 5, 17, 300, 2, 40000, 1, 9], dtype=torch.int32)
    xl = x.clone().requires_grad_(True)
    y = rope(xl, positions)
    assert type(y.grad_fn).__name__ == "RopeFunctionBackward"
    y.backward(dy)
    assert xl.grad is not None
    assert_same_bits(rope_backward(dy, positions), xl.grad, "dx")
    assert_same_bits(rope(x, positions), y.detach(), "forward inside autograd")


def test_backward_is_the_inverse_rotation() -> None:
    """Accuracy (not bits): the gradient of a rotation is its inverse, so rope_backward(rope(x)) is x within
    a few fp32 ulps (fp32 inputs; the tables are correctly rounded)."""
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.standard_normal((16, 2, 128))).to(torch.float32)
    positions = torch.arange(16) * 997
    back = rope_backward(rope(x, positions), positions)
    assert float((back - x).abs().max()) < 1e-5


def test_backward_bad_inputs() -> None:
    with pytest.raises(ValueError, match="positions has shape"):
        rope_backward(torch.ones(3, 8), torch.arange(4))
    with pytest.raises(ValueError, match="even"):
        rope_backward(torch.ones(3, 7), torch.arange(3))


def test_accuracy_backward_vs_float64_no_worse_than_torch_bf16() -> None:
    """Accuracy (not bits): dx against float64 autograd of the rotation: relative L2 error no larger than
    torch's bf16 autograd of Hugging Face's rotary embedding (the suite's rule)."""
    from rlkernel.conformance.accuracy.ops import rope_backward as rows
    from rlkernel.conformance.accuracy.suite import verdict

    for m in rows.measurements():
        v = verdict(m.run("small", torch.device("cpu")), m.metric)
        assert v["meets"], f"{m.dataset}: ours {v['rlkernel']:.3e} vs torch bf16 {v['native']:.3e}"
