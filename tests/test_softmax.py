"""softmax and log_softmax: input errors, generic == reference on bytes, invariances, accuracy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.backends.generic import softmax as generic
from rlkernel.contracts import log_softmax as log_contract
from rlkernel.contracts import softmax as contract
from rlkernel.contracts._gen import special_values
from rlkernel.dispatch import use_backend
from rlkernel.ops.softmax import log_softmax, softmax

FLOATS = (torch.float32, torch.bfloat16, torch.float16)
OPS = {"softmax": (softmax, contract, generic.softmax), "log_softmax": (log_softmax, log_contract, generic.log_softmax)}


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
def logits(draw: st.DrawFn) -> tuple[torch.Tensor, torch.dtype | None]:
    """x [rows, N] (N >= 0) with drawn specials (±0, ±inf, NaN, subnormals, extremes), and an output dtype."""
    dtype = draw(st.sampled_from(FLOATS))
    rows, n = draw(st.integers(0, 5)), draw(st.integers(0, 400))
    scale = draw(st.sampled_from([1.0, 5.0, 30.0, 1e-30, 1e4]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = torch.from_numpy(rng.standard_normal((rows, n)) * scale).to(dtype)
    sv = special_values(dtype)
    for _ in range(draw(st.integers(0, 4)) if rows and n else 0):
        x[draw(st.integers(0, rows - 1)), draw(st.integers(0, n - 1))] = sv[draw(st.integers(0, sv.numel() - 1))]
    if rows and n and draw(st.booleans()):
        x[draw(st.integers(0, rows - 1))] = float("-inf")  # a fully masked row
    return x, draw(st.sampled_from([None, torch.float32]))


@pytest.mark.parametrize("name", sorted(OPS))
@settings(max_examples=50, deadline=None)
@given(case=logits())
def test_generic_equals_reference_bits(name: str, case: tuple[torch.Tensor, torch.dtype | None]) -> None:
    x, dtype = case
    _, module, kernel = OPS[name]
    assert_same_bits(module.reference(x, dtype), kernel(x, dtype), f"{name} generic vs reference")


def _all_cases():  # type: ignore[no-untyped-def]
    for name, (_, module, _) in sorted(OPS.items()):
        for case in module.golden_cases() + module.adversarial_cases():
            yield pytest.param(name, case, id=f"{name}-{case.name}")


@pytest.mark.parametrize(("name", "case"), list(_all_cases()))
def test_cases_match_reference(name, case) -> None:  # type: ignore[no-untyped-def]
    if case.full_only:
        pytest.skip("full_only case: run by `rlkernel conformance --full`")
    fn, module, _ = OPS[name]
    expected = module.reference(**case.make())
    with use_backend("cpu"):
        actual = fn(**case.make())
    assert_same_bits(expected, actual, case.name)


def _all_invariances():  # type: ignore[no-untyped-def]
    for name, (_, module, _) in sorted(OPS.items()):
        for case in module.invariance_cases():
            yield pytest.param(name, case, id=f"{name}-{case.name}")


@pytest.mark.parametrize(("name", "case"), list(_all_invariances()))
def test_invariances(name, case) -> None:  # type: ignore[no-untyped-def]
    def run(op: str, **inputs):  # type: ignore[no-untyped-def]
        with use_backend("cpu"):
            return OPS[op][0](**inputs)

    expected, actual = case.check(run)
    expected = expected if isinstance(expected, list) else [expected]
    actual = actual if isinstance(actual, list) else [actual]
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        assert_same_bits(e, a, f"{case.name}[{i}]")


def test_vocab_split_sums_compose() -> None:
    """The reason for the exact sum: L of a row equals the sum of its shards' integer partials.

    Checked through the public op: a row and the same row with its halves swapped (a different
    shard order) give permuted bits of the same values."""
    x = torch.from_numpy(np.random.default_rng(5).standard_normal((3, 5000)) * 6.0).to(torch.float32)
    swapped = torch.cat([x[:, 2500:], x[:, :2500]], dim=1)
    y = softmax(x)
    assert_same_bits(torch.cat([y[:, 2500:], y[:, :2500]], dim=1), softmax(swapped), "shard order")


def test_special_rows_match_torch_semantics() -> None:
    """NaN rows and all -inf rows -> all NaN; +inf -> all NaN; masked entries -> 0 / -inf; N = 1 -> 1 / 0."""
    inf = float("inf")
    x = torch.tensor([[1.0, float("nan"), 2.0], [-inf, -inf, -inf], [1.0, inf, 0.0], [-inf, 3.0, -inf]])
    for fn, tfn in ((softmax, torch.softmax), (log_softmax, torch.log_softmax)):
        y, t = fn(x), tfn(x, dim=-1)
        assert torch.equal(torch.isnan(y), torch.isnan(t))
        assert torch.equal(y[3], t[3])
        assert (_bits(y)[torch.isnan(y)] == 0x7FC00000).all()
    one = torch.tensor([[2.5], [-1e30]])
    assert (softmax(one) == 1).all() and (log_softmax(one) == 0).all()


def test_dim_and_dtype_arguments() -> None:
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((4, 6, 5))).to(torch.bfloat16)
    for fn in (softmax, log_softmax):
        y = fn(x, dim=1)
        assert y.dtype == torch.bfloat16 and y.shape == x.shape and y.is_contiguous()
        assert_same_bits(fn(x.transpose(1, 2).contiguous()).transpose(1, 2).contiguous(), y, "dim=1")
        y32 = fn(x, dtype=torch.float32)
        assert y32.dtype == torch.float32
        assert_same_bits(y32.to(torch.bfloat16), fn(x), "fp32 output rounds to the default output")
    assert softmax(torch.empty(3, 0)).shape == (3, 0)
    assert log_softmax(torch.empty(0, 7, dtype=torch.float16)).shape == (0, 7)


@pytest.mark.parametrize("fn", [softmax, log_softmax])
@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (([1.0, 2.0],), {}, TypeError, "x must be a torch.Tensor"),
        ((torch.ones(3, dtype=torch.float64),), {}, TypeError, "float64"),
        ((torch.ones(3, dtype=torch.int64),), {}, TypeError, "int64"),
        ((torch.ones(()),), {}, ValueError, "0-d"),
        ((torch.ones(2, 3),), {"dim": 2}, ValueError, "dim = 2 is out of range"),
        ((torch.ones(2, 3),), {"dim": 1.0}, TypeError, "dim must be an int"),
        ((torch.ones(2, 3),), {"dtype": torch.float16}, TypeError, "expected None"),
        ((torch.ones(2, 3, dtype=torch.bfloat16),), {"dtype": torch.float64}, TypeError, "torch.float32"),
    ],
)
def test_bad_inputs(fn, args, kwargs, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        fn(*args, **kwargs)


def test_dtype_message_lists_each_allowed_dtype_once() -> None:
    # For float32 x the message used to read "expected None (x's dtype), torch.float32 or torch.float32".
    with pytest.raises(TypeError) as info:
        softmax(torch.ones(2, 3), dtype=torch.float16)
    assert "expected None (x's dtype) or torch.float32. Cast" in str(info.value)
    with pytest.raises(TypeError) as info:
        log_softmax(torch.ones(2, 3, dtype=torch.bfloat16), dtype=torch.float16)
    assert "expected None (x's dtype), torch.bfloat16 or torch.float32. Cast" in str(info.value)


def test_length_bound_is_checked() -> None:
    x = torch.zeros(1, (1 << 22) + 1, dtype=torch.bfloat16)
    for fn in (softmax, log_softmax):
        with pytest.raises(ValueError, match="exact-sum bound"):
            fn(x)


def test_accuracy_against_float64() -> None:
    """Accuracy (not bits): fp32 softmax within 1e-5 relative of float64 over a vocabulary-sized row
    and no worse than torch.softmax's maximum; log_softmax within 2**-22 absolute."""
    x = torch.from_numpy(np.random.default_rng(11).standard_normal((2, 151936)) * 4.0).to(torch.float32)
    x64 = x.double()
    truth = torch.softmax(x64, -1)
    ours = softmax(x).double()
    rel = ((ours - truth).abs() / truth).max().item()
    rel_torch = ((torch.softmax(x, -1).double() - truth).abs() / truth).max().item()
    assert rel <= 1e-5 and rel <= rel_torch
    log_err = (log_softmax(x).double() - torch.log_softmax(x64, -1)).abs().max().item()
    assert log_err <= 2.0**-22 * 16  # |log p| <= ~40 here: a few ulp of the largest magnitudes


def test_row_chunks_do_not_change_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's row chunking (forced small here) gives the reference's bits."""
    x = torch.from_numpy(np.random.default_rng(8).standard_normal((37, 300)) * 4).to(torch.float32)
    monkeypatch.setattr(generic, "CHUNK_ELEMENTS", 1000)
    assert_same_bits(contract.reference(x), generic.softmax(x), "chunked softmax")
    assert_same_bits(log_contract.reference(x), generic.log_softmax(x), "chunked log_softmax")
