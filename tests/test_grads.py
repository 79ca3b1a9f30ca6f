"""Exact weight gradients (rlkernel.grads, contract exact_sum): invariance to batching, accuracy of dW.

Bitwise checks compare bytes; the accuracy test is labelled and compares with float64 autograd.
"""

from __future__ import annotations

import pytest
import torch

from rlkernel import grads
from rlkernel import ops as rk


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


def _linear_grads(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, gy: torch.Tensor, cu: list[int],
                  parts: list[tuple[int, int]]) -> tuple[bytes, bytes]:
    """dW and db accumulated exactly over micro-batches ``parts`` (whole sequences each)."""
    acc = grads.ExactGradients([w, b])
    for a, c in parts:
        units = [u - a for u in cu if a <= u <= c]
        with grads.sequence_units(units):
            y = rk.linear(x[a:c], w, b)
        y.backward(gy[a:c])
    acc.finish()
    out = _bits(w.main_grad), _bits(b.main_grad)
    acc.remove()
    return out


def test_linear_weight_grad_is_micro_batch_and_order_invariant() -> None:
    g = torch.Generator().manual_seed(0)
    lens = [3, 1, 7, 5, 2]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    t = cu[-1]
    x = (torch.randn(t, 40, generator=g) * 3).bfloat16()
    x[4, 7] = 300.0  # an outlier channel value
    gy = torch.randn(t, 24, generator=g).bfloat16()
    w = torch.randn(24, 40, generator=g).bfloat16().requires_grad_()
    b = torch.randn(24, generator=g).bfloat16().requires_grad_()
    whole = _linear_grads(x, w, b, gy, cu, [(0, t)])
    splits = [[(0, 3), (3, 4), (4, 11), (11, 16), (16, 18)], [(0, 11), (11, 18)], [(11, 18), (0, 4), (4, 11)]]
    for parts in splits:
        assert _linear_grads(x, w, b, gy, cu, parts) == whole, parts
    # sequences in another order: dW is the same exact sum of the same per-sequence terms
    order = [2, 0, 4, 1, 3]
    xs = torch.cat([x[cu[i]:cu[i + 1]] for i in order])
    gs = torch.cat([gy[cu[i]:cu[i + 1]] for i in order])
    cu2 = [0]
    for i in order:
        cu2.append(cu2[-1] + lens[i])
    assert _linear_grads(xs, w, b, gs, cu2, [(0, t)]) == whole


def test_tied_weight_two_uses_add_exactly() -> None:
    """A weight used by embedding and linear (a tied LM head) gets one exact sum of both gradients,
    whichever backward runs first and whether they run in one graph or two."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(10, 8, generator=g).bfloat16().requires_grad_()
    ids = torch.tensor([1, 4, 4, 9, 0, 1])
    gy = torch.randn(6, 10, generator=g).bfloat16()

    h = rk.embedding(ids, w).detach().requires_grad_()
    dx = torch.autograd.grad(rk.linear(h, w), h, gy)[0]  # before any accumulator: a backward deposits dW

    def run(order: str) -> bytes:
        acc = grads.ExactGradients([w])
        if order == "graph":
            rk.linear(rk.embedding(ids, w), w).backward(gy)
        else:
            steps = [lambda: rk.linear(h.detach(), w).backward(gy), lambda: rk.embedding(ids, w).backward(dx)]
            for step in (steps if order == "linear-first" else steps[::-1]):
                step()
        acc.finish()
        out = _bits(w.main_grad)
        acc.remove()
        return out

    graph = run("graph")
    assert run("linear-first") == graph
    assert run("embedding-first") == graph


def test_accumulators_without_a_state_finish_to_the_bits_of_zero_filled_ones() -> None:
    """An accumulator starts EMPTY (no zero fill). A first dense deposit of a few terms is kept as it
    is and scattered rows as row states (a tied embedding), finished by exact_sum_total without the
    whole state; a second deposit makes the state. Every way gives the bits of accumulators that start
    zero-filled: per-unit terms (linear, the LM head), scattered tied rows, a bias, many terms (the
    state at once), two micro-batches, more scattered deposits than are kept, and no deposit (+0.0)."""
    g = torch.Generator().manual_seed(5)
    cu = [0, 3, 4, 9]
    x = torch.randn(9, 16, generator=g).bfloat16()
    w = torch.randn(12, 16, generator=g).bfloat16().requires_grad_()
    b = torch.randn(12, generator=g).bfloat16().requires_grad_()
    norm = torch.rand(12, generator=g).bfloat16().requires_grad_()  # 9 token terms: kept as terms too
    head = torch.randn(40, 12, generator=g).bfloat16().requires_grad_()  # tied: embedding and LM head
    unused = torch.randn(5, 3, generator=g).bfloat16().requires_grad_()
    ids = torch.randint(0, 40, (9,), generator=g)
    targets = torch.randint(0, 40, (9,), generator=g)
    params = [w, b, norm, head, unused]

    def step(a: int, c: int) -> None:
        with grads.sequence_units([u - a for u in cu if a <= u <= c]):
            h = rk.rms_norm(rk.linear(x[a:c], w, b) + rk.embedding(ids[a:c], head), norm)
            rk.token_logprobs(h, head, targets[a:c]).sum().backward()

    def run(zero_filled: bool, batches: list[tuple[int, int]], extra_rows: int = 0,
            pending_terms: int = grads.PENDING_TERMS) -> list[bytes]:
        acc = grads.ExactGradients(params)
        assert all(p.exact_grad is grads.EMPTY for p in params)
        if zero_filled:
            for p in params:
                p.exact_grad = torch.zeros((*p.shape, 20), dtype=torch.int64)
        saved, grads.PENDING_TERMS = grads.PENDING_TERMS, pending_terms
        try:
            for a, c in batches:
                step(a, c)
            for i in range(extra_rows):  # scattered deposits alone
                rk.embedding(ids[i % 7:i % 7 + 2], head).backward(torch.ones(2, 12, dtype=torch.bfloat16))
        finally:
            grads.PENDING_TERMS = saved
        acc.finish()
        out = [_bits(p.main_grad) for p in params]
        acc.remove()
        return out

    one = run(False, [(0, 9)])
    assert one == run(True, [(0, 9)])
    assert one == run(False, [(0, 9)], pending_terms=0)  # no terms kept: the state at once
    assert one[4] == _bits(torch.zeros(5, 3))
    two = run(False, [(0, 4), (4, 9)])
    assert two == run(True, [(0, 4), (4, 9)])
    many = run(False, [(0, 9)], extra_rows=grads._Pending.MAX_ROW_PARTS + 2)
    assert many == run(True, [(0, 9)], extra_rows=grads._Pending.MAX_ROW_PARTS + 2)
    rows_only = run(False, [], extra_rows=3)
    assert rows_only == run(True, [], extra_rows=3)


def test_exact_gradients_refuse_plain_autograd_grads() -> None:
    w = torch.randn(4, 4).requires_grad_()
    acc = grads.ExactGradients([w])
    (w * 2).sum().backward()
    with pytest.raises(RuntimeError, match="plain autograd"):
        acc.finish()


def test_units_must_match_the_rows() -> None:
    x = torch.randn(5, 8).bfloat16()
    w = torch.randn(3, 8).bfloat16().requires_grad_()
    with grads.sequence_units([0, 2, 4]), pytest.raises(ValueError, match="sequence units end at 4"):
        rk.linear(x, w)
    with pytest.raises(ValueError, match="non-decreasing"):
        with grads.sequence_units([1, 3]):
            pass


def test_exact_sum_scatter_matches_dense_sums() -> None:
    g = torch.Generator().manual_seed(2)
    terms = torch.randn(40, 6, generator=g) * torch.logspace(-30, 30, 40).unsqueeze(1)
    index = torch.randint(0, 5, (40,), generator=g)
    scattered = rk.exact_sum_finish(rk.exact_sum_partial(terms.float(), index, 5))
    for r in range(5):
        dense = rk.exact_sum_finish(rk.exact_sum_partial(terms.float()[index == r]))
        assert _bits(scattered[r]) == _bits(dense)


def test_exact_sum_errors_name_the_fix() -> None:
    with pytest.raises(TypeError, match="float32"):
        rk.exact_sum_partial(torch.zeros(3, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="num_rows"):
        rk.exact_sum_partial(torch.zeros(3, 2), torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"\[0, num_rows = 2\)"):
        rk.exact_sum_partial(torch.zeros(3, 2), torch.tensor([0, 1, 2]), 2)
    with pytest.raises(ValueError, match="20"):
        rk.exact_sum_finish(torch.zeros(3, 7, dtype=torch.int64))


def test_exact_sum_accumulate_is_in_place_and_equals_merge() -> None:
    """The accumulator takes terms in place (the returned tensor is the state, a strided state too),
    with the bits of merge(state, partial(terms)); its errors name the fix."""
    g = torch.Generator().manual_seed(4)
    terms = torch.randn(30, 7, 3, generator=g) * torch.logspace(-20, 20, 30).reshape(30, 1, 1)
    start = rk.exact_sum_partial(terms[:10])
    expected = rk.exact_sum_merge(torch.stack([start, rk.exact_sum_partial(terms[10:])]))
    state = start.clone()
    assert rk.exact_sum_accumulate(state, terms[10:]) is state
    assert _bits(state) == _bits(expected)
    strided = start.transpose(0, 1).contiguous().transpose(0, 1)  # [7, 3, 20] with non-contiguous strides
    assert not strided.is_contiguous()
    assert rk.exact_sum_accumulate(strided, terms[10:]) is strided
    assert _bits(strided) == _bits(expected)
    with pytest.raises(ValueError, match=r"expected \[S, 7, 3\]"):
        rk.exact_sum_accumulate(state, terms[:, :6])
    with pytest.raises(TypeError, match="float32"):
        rk.exact_sum_accumulate(state, terms.to(torch.float64))
    with pytest.raises(ValueError, match="20"):
        rk.exact_sum_accumulate(state[..., :19], terms)


def test_linear_weight_grad_accuracy_vs_float64() -> None:
    """Labelled accuracy: dW per sequence rounded once to fp32, summed exactly, vs float64 and torch bf16."""
    g = torch.Generator().manual_seed(3)
    lens = [16, 9, 30, 1]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    x = torch.randn(cu[-1], 64, generator=g).bfloat16()
    gy = torch.randn(cu[-1], 32, generator=g).bfloat16()
    w = torch.randn(32, 64, generator=g).bfloat16().requires_grad_()
    with grads.sequence_units(cu):
        rk.linear(x, w).backward(gy)
    ours = w.grad.double()
    truth = gy.double().T @ x.double()
    native = (gy.T @ x).double()  # torch's bf16 matmul backward
    err_ours = ((ours - truth).norm() / truth.norm()).item()
    err_native = ((native - truth).norm() / truth.norm()).item()
    assert err_ours <= err_native * 1.05 + 1e-7, (err_ours, err_native)
