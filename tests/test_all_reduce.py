"""``all_reduce``: exact int64 sum/max over a world axis, overflow raises, floats are refused."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.contracts import all_reduce as contract
from rlkernel.ops.all_reduce import all_reduce

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def test_floats_are_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match=r"float32; expected int64. A floating-point all-reduce is not exact"):
        all_reduce(torch.zeros(2, 3))
    with pytest.raises(TypeError, match=r"int32; expected int64.*\.to\(torch.int64\)"):
        all_reduce(torch.zeros(2, 3, dtype=torch.int32))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="op='mean'; expected 'sum' or 'max'"):
        all_reduce(torch.zeros(2, 3, dtype=torch.int64), op="mean")
    with pytest.raises(ValueError, match=r"shape \(0, 3\); expected \[world, \*\] with world >= 1"):
        all_reduce(torch.zeros(0, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"shape \(\); expected \[world, \*\]"):
        all_reduce(torch.tensor(3))


def test_overflow_of_the_total_raises_but_intermediate_overflow_does_not() -> None:
    big = 1 << 62
    ok = torch.tensor([[big], [big], [-big], [5]])  # 2**62 + 2**62 leaves int64 on the way
    assert all_reduce(ok).tolist() == [big + 5]
    with pytest.raises(ValueError, match="the exact sum at flat index 1 is 9223372036854775808, outside int64"):
        all_reduce(torch.tensor([[0, big], [0, big]]))
    with pytest.raises(ValueError, match="outside int64"):
        all_reduce(torch.tensor([[INT64_MIN], [-1]]))


_values = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from([INT64_MIN, INT64_MAX, 0, -1, 1, 1 << 62]),
                    st.integers(-(1 << 52), 1 << 52))


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5), st.sampled_from(["sum", "max"]), st.data())
def test_generic_equals_reference(world: int, length: int, op: str, data: st.DataObject) -> None:
    vals = data.draw(st.lists(st.lists(_values, min_size=length, max_size=length), min_size=world, max_size=world))
    t = torch.tensor(vals, dtype=torch.int64).reshape(world, length)
    exact = [sum(c) if op == "sum" else max(c) for c in zip(*vals)] if length else []
    if any(not INT64_MIN <= e <= INT64_MAX for e in exact):
        with pytest.raises(ValueError, match="outside int64"):
            all_reduce(t, op=op)
        with pytest.raises(ValueError, match="outside int64"):
            contract.reference(t, op=op)
        return
    out = all_reduce(t, op=op)
    assert out.tolist() == exact
    assert torch.equal(contract.reference(t, op=op), out)
    assert torch.equal(all_reduce(t.flip(0), op=op), out)  # order of the world axis is free


def test_shapes() -> None:
    t = torch.arange(24, dtype=torch.int64).reshape(2, 3, 4)
    assert torch.equal(all_reduce(t), t[0] + t[1])
    assert torch.equal(all_reduce(t.transpose(1, 2), op="max"), t[1].T)
    assert all_reduce(torch.zeros(3, 0, 2, dtype=torch.int64)).shape == (0, 2)
    assert all_reduce(torch.tensor([4, -9, 7])).tolist() == 2
