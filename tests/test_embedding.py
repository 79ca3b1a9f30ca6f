"""``embedding``: errors, bit copies with canonical NaN, generic == reference, invariances."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.contracts import embedding as contract
from rlkernel.contracts._exact import superacc
from rlkernel.contracts._gen import integers, normal, seed_of
from rlkernel.ops.embedding import embedding

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
_INT_VIEW = {2: torch.int16, 4: torch.int32}
_NAN = {FP32: 0x7FC00000, BF16: 0x7FC0, FP16: 0x7E00}


def assert_bits_equal(expected: torch.Tensor, actual: torch.Tensor) -> None:
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, (expected.shape, actual.shape)
    e = expected.contiguous().view(_INT_VIEW[expected.element_size()]).reshape(-1)
    a = actual.contiguous().view(_INT_VIEW[actual.element_size()]).reshape(-1)
    diff = (e != a).nonzero()
    if diff.numel():
        i = int(diff[0])
        raise AssertionError(f"{diff.numel()} differ; first at flat index {i}: "
                             f"expected {int(e[i]):#x}, got {int(a[i]):#x}")


def _weight(name: str, v: int, h: int, dtype: torch.dtype) -> torch.Tensor:
    return normal(seed_of("test_embedding", name), (v, h), 0.02, dtype)


@pytest.mark.parametrize("bad", [-1, 10, 11])
def test_out_of_range_ids_name_the_value_and_v(bad: int) -> None:
    ids = torch.tensor([[0, 3], [bad, 2]])
    with pytest.raises(ValueError, match=rf"ids holds {bad} at index \(1, 0\); expected 0 <= id < V = 10"):
        embedding(ids, _weight("range", 10, 4, BF16))


def test_bad_dtypes_and_shapes() -> None:
    w = _weight("bad", 10, 4, BF16)
    with pytest.raises(TypeError, match="ids has dtype float32"):
        embedding(torch.zeros(3), w)
    with pytest.raises(TypeError, match="weight has dtype int64"):
        embedding(torch.zeros(3, dtype=torch.int64), torch.zeros(10, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"weight has shape \(40,\); expected \[V, H\]"):
        embedding(torch.zeros(3, dtype=torch.int64), w.reshape(-1))
    with pytest.raises(ValueError, match="weight is on meta but ids is on cpu"):
        embedding(torch.zeros(3, dtype=torch.int64), w.to("meta"))


@pytest.mark.parametrize("dtype", [FP32, BF16, FP16])
def test_rows_are_bit_copies_with_canonical_nan(dtype: torch.dtype) -> None:
    width = torch.finfo(dtype).bits
    view = torch.int32 if width == 32 else torch.int16
    raw = integers(seed_of("test_embedding", "bits", str(dtype)), (6, 64), -(1 << (width - 1)), 1 << (width - 1))
    w = raw.to(view).view(dtype)  # every bit pattern: NaN payloads, -0, subnormals, infinities
    ids = torch.tensor([5, 0, 5, 3])
    out = embedding(ids, w)
    src = w[ids]
    nan = torch.isnan(src)
    assert torch.equal(out.view(view)[~nan], src.view(view)[~nan])
    assert (out.view(view)[nan].to(torch.int64) & ((1 << width) - 1) == _NAN[dtype]).all()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([FP32, BF16, FP16]), st.sampled_from([torch.int64, torch.int32]),
       st.integers(1, 50), st.integers(0, 9),
       st.lists(st.integers(0, 4), min_size=0, max_size=3), st.integers(0, 2**32))
def test_generic_equals_reference(dtype, id_dtype, v, h, shape, seed) -> None:
    w = _weight(f"h{seed}", v, h, dtype)
    ids = integers(seed, shape, 0, v).to(id_dtype)
    assert_bits_equal(contract.reference(ids, w), embedding(ids, w))


def test_batch_invariance_and_shapes() -> None:
    w = _weight("batch", 100, 16, BF16)
    ids = integers(seed_of("test_embedding", "ids"), (4, 9), 0, 100)
    whole = embedding(ids, w)
    assert whole.shape == (4, 9, 16)
    assert_bits_equal(whole[2], embedding(ids[2], w))
    assert_bits_equal(whole.reshape(36, 16)[7], embedding(ids.reshape(-1)[7], w))  # 0-d ids -> [H]
    assert embedding(torch.zeros(2, 0, dtype=torch.int32), w).shape == (2, 0, 16)


def test_weight_gradient_is_the_exact_scatter_add() -> None:
    """dW[v] = RN32(exact sum of the gradient rows of the tokens with id v) (contract exact_sum),
    whatever the order of the tokens; no grad_fn under no_grad."""
    w = _weight("ag", 20, 8, FP32)
    ids = torch.tensor([3, 1, 3, 19, 3, 0])
    g = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 1e-30, 1e30, 1, 1, 1, 1, 1])
    wr = w.clone().requires_grad_(True)
    embedding(ids, wr).backward(g)
    expected = torch.zeros(20, 8)
    for v in ids.unique().tolist():
        expected[v] = superacc.exact_sum(g[ids == v].T.contiguous(), dim=-1)
    assert_bits_equal(expected, wr.grad)
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    wp = w.clone().requires_grad_(True)
    embedding(ids[perm], wp).backward(g[perm])
    assert_bits_equal(wr.grad, wp.grad)
    with torch.no_grad():
        out = embedding(ids, wr)
    assert out.grad_fn is None
    assert_bits_equal(embedding(ids, w), out)
