"""``linear`` and its tensor-parallel sub-ops: errors, generic == reference bitwise, invariances, backward.

Comparisons are on bytes. Tolerances appear only in ``test_accuracy_*`` (float64 truth).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlkernel
from rlkernel.backends.generic import linear as generic
from rlkernel.contracts import linear as contract
from rlkernel.contracts._exact import superacc
from rlkernel.contracts._gen import normal, seed_of, with_outlier_channels
from rlkernel.ops.all_reduce import all_reduce
from rlkernel.ops.linear import (
    SENTINEL,
    ZERO_EXP,
    linear,
    linear_exponents,
    linear_finish,
    linear_partial,
    linear_weight_digits,
)

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def assert_bits_equal(expected: torch.Tensor, actual: torch.Tensor, what: str = "") -> None:
    """Equal dtype, shape and bytes (NaNs are canonical in both); on failure the first difference in hex."""
    assert expected.dtype == actual.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert expected.shape == actual.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    e = expected.contiguous().view(_INT_VIEW[expected.element_size()]).reshape(-1)
    a = actual.contiguous().view(_INT_VIEW[actual.element_size()]).reshape(-1)
    diff = (e != a).nonzero()
    if diff.numel():
        i = int(diff[0])
        mask = (1 << (8 * expected.element_size())) - 1
        raise AssertionError(f"{what}: {diff.numel()} of {e.numel()} differ; first at flat index {i}: expected "
                             f"{expected.reshape(-1)[i].item()!r} (0x{int(e[i]) & mask:x}), got "
                             f"{actual.reshape(-1)[i].item()!r} (0x{int(a[i]) & mask:x})")


def _data(name: str, m: int, k: int, n: int, dtype: torch.dtype = BF16, outliers: float = 0.0) -> tuple:
    x = normal(seed_of("test_linear", name, "x"), (m, k), 1.0, FP32)
    if outliers:
        x = with_outlier_channels(x, seed_of("test_linear", name, "c"), count=4, factor=outliers)
    w = normal(seed_of("test_linear", name, "w"), (n, k), 0.05, dtype)
    return x.to(dtype), w


# ----------------------------------------------------------------------------- errors


def test_fp32_inputs_are_refused_with_the_reason() -> None:
    x, w = _data("fp32", 2, 8, 3)
    with pytest.raises(TypeError, match=r"float32.*28- or 21-bit integer grid.*bfloat16"):
        linear(x.float(), w.float())
    with pytest.raises(TypeError, match="weight has dtype float32"):
        linear(x, w.float())


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        ({"x": torch.zeros(2, 8, dtype=torch.int32)}, TypeError, "x has dtype int32"),
        ({"weight": torch.zeros(3, 8, dtype=FP16)}, TypeError, "x is torch.bfloat16 but weight is torch.float16"),
        ({"weight": torch.zeros(8, dtype=BF16)}, ValueError, r"weight has shape \(8,\); expected \[N, K\]"),
        ({"weight": torch.zeros(3, 9, dtype=BF16)}, ValueError, r"K = 8\) must equal weight.shape\[1\] \(K = 9\)"),
        ({"x": torch.zeros((), dtype=BF16)}, ValueError, "at least one axis"),
        ({"bias": torch.zeros(4, dtype=BF16)}, ValueError, r"bias has shape \(4,\); expected \[N\] = \(3,\)"),
        ({"bias": torch.zeros(3, dtype=torch.float64)}, TypeError, "bias has dtype float64"),
        ({"out_dtype": torch.float64}, TypeError, "out_dtype is torch.float64"),
        ({"x": [[1.0]]}, TypeError, "x must be a torch.Tensor"),
        ({"weight": torch.zeros(3, 8, dtype=BF16, device="meta")}, ValueError, "weight is on meta but x is on cpu"),
    ],
)
def test_bad_inputs_say_what_and_how_to_fix(kwargs: dict, exc: type, pattern: str) -> None:
    args = {"x": torch.zeros(2, 8, dtype=BF16), "weight": torch.zeros(3, 8, dtype=BF16), **kwargs}
    with pytest.raises(exc, match=pattern):
        linear(**args)


def test_k_bound_is_checked() -> None:
    k = 1 << 16
    with pytest.raises(ValueError, match=r"K = 65536 exceeds the exact-sum bound 2\*\*16 - 1"):
        linear(torch.zeros(1, k, dtype=BF16), torch.zeros(1, k, dtype=BF16))


def test_sub_op_errors() -> None:
    x, w = _data("sub_err", 3, 16, 4)
    ex, ew = linear_exponents(x, w)
    with pytest.raises(ValueError, match=r"ex\[1\] = .* is below that row's own exponent"):
        linear_partial(x, w, ex - torch.tensor([0, 1, 0]), ew)
    with pytest.raises(ValueError, match=r"ew holds 129 at flat index 2"):
        linear_partial(x, w, ex, torch.tensor([0, 0, 129, 0]))
    with pytest.raises(ValueError, match=r"ex has shape \(2,\); expected \[3\]"):
        linear_partial(x, w, ex[:2], ew)
    with pytest.raises(TypeError, match="ex has dtype int32"):
        linear_partial(x, w, ex.int(), ew)
    acc = torch.zeros(3, 4, dtype=torch.int64)
    acc[1, 1] = torch.iinfo(torch.int64).min
    with pytest.raises(ValueError, match="acc holds -2\\*\\*63"):
        linear_finish(acc, ex, ew)
    with pytest.raises(TypeError, match="acc has dtype float32"):
        linear_finish(acc.float(), ex, ew)
    with pytest.raises(ValueError, match=r"ew has shape \(3,\); expected \[4\]"):
        linear_finish(acc.clamp(min=0), ex, ew[:3])


# ----------------------------------------------------------------------------- generic == reference

_SPECIAL_BITS = {
    BF16: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x807F, 0x0080, 0x7F7F, 0xFF7F, 0x3F81, 0x3F7F],
    FP16: [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C01, 0x3BFF],
}


@st.composite
def _matrix(draw: st.DrawFn, rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows of random finite values with per-row scales 2**s, sprinkled with special bit patterns."""
    seed = draw(st.integers(0, 2**32))
    shifts = draw(st.lists(st.integers(-130, 120) if dtype == BF16 else st.integers(-24, 14),
                           min_size=rows, max_size=rows))
    base = normal(seed, (rows, k), 1.0, torch.float64).to(torch.float64)
    scale = torch.tensor([2.0 ** s for s in shifts], dtype=torch.float64).reshape(rows, 1)
    t = (base * scale).to(dtype)
    n_special = draw(st.integers(0, min(4, rows * k)))
    if n_special:
        flat = t.view(torch.int16).reshape(-1).clone()
        for _ in range(n_special):
            pos = draw(st.integers(0, rows * k - 1))
            bits = draw(st.sampled_from(_SPECIAL_BITS[dtype]))
            flat[pos] = bits - (1 << 16) if bits >= 1 << 15 else bits
        t = flat.view(dtype).reshape(rows, k)
    if rows and draw(st.booleans()):
        t[draw(st.integers(0, rows - 1))] = 0.0
    return t


@st.composite
def _problem(draw: st.DrawFn) -> dict:
    dtype = draw(st.sampled_from([BF16, FP16]))
    m, k, n = draw(st.integers(0, 6)), draw(st.integers(0, 70)), draw(st.integers(0, 6))
    bias = draw(st.sampled_from([None, dtype, FP32]))
    return {
        "x": draw(_matrix(m, k, dtype)),
        "weight": draw(_matrix(n, k, dtype)),
        "bias": None if bias is None else draw(_matrix(1, n, bias if bias != FP32 else BF16)).reshape(n).to(bias),
        "out_dtype": draw(st.sampled_from([None, FP32, BF16, FP16])),
    }


@settings(max_examples=60, deadline=None)
@given(_problem())
def test_generic_equals_reference(p: dict) -> None:
    assert_bits_equal(contract.reference(**p), linear(**p), "linear")


@settings(max_examples=30, deadline=None)
@given(_problem(), st.integers(0, 3), st.integers(0, 2**16))
def test_f64_and_digit_paths_give_the_same_integers(p: dict, raise_by: int, seed: int) -> None:
    # on the rows' own grids and on coarser (global) grids, up to the largest exponent 128
    x, w = p["x"], p["weight"]
    ex, ew = generic.linear_exponents(x, w)
    if raise_by:
        g = torch.Generator().manual_seed(seed)  # only picks grids; any choice must agree
        ex, ew = (torch.where(e == SENTINEL, e, (e + torch.randint(0, 40 * raise_by, e.shape, generator=g))
                              .clamp(max=128)) for e in (ex, ew))
    f64 = generic.partial_sum(x, w, ex, ew, path="f64")
    digits = generic.partial_sum(x, w, ex, ew, path="digits")
    assert_bits_equal(f64, digits, "C")
    assert_bits_equal(contract.reference_partial(x, w, ex, ew), f64, "C vs reference")


@settings(max_examples=30, deadline=None)
@given(_problem(), st.lists(st.integers(0, 1000), min_size=1, max_size=4))
def test_any_row_parallel_split_gives_linear_bits(p: dict, cuts: list) -> None:
    x, w = p["x"], p["weight"]
    k = x.shape[1]
    bounds = sorted({0, k, *(c % (k + 1) for c in cuts)})
    shards = [(x[:, a:b], w[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:])] or [(x, w)]
    exps = [linear_exponents(xs, ws) for xs, ws in shards]
    ex = all_reduce(torch.stack([e[0] for e in exps]), op="max")
    ew = all_reduce(torch.stack([e[1] for e in exps]), op="max")
    for (xs, ws), (ex_r, _) in zip(shards, exps):
        assert_bits_equal(contract.reference_exponents(xs, ws)[0], ex_r, "ex")
    acc = all_reduce(torch.stack([linear_partial(xs, ws, ex, ew) for xs, ws in shards]), op="sum")
    out = p["out_dtype"] or x.dtype
    assert_bits_equal(linear(x, w, p["bias"], out), linear_finish(acc, ex, ew, p["bias"], out), "TP")


def test_sub_op_sentinels() -> None:
    x, w = _data("sentinel", 4, 32, 3)
    x[1, 3] = float("nan")
    x[2] = 0.0
    w[0, 31] = float("-inf")
    ex, ew = linear_exponents(x, w)
    assert ex[1] == SENTINEL and ew[0] == SENTINEL and ex[2] == ZERO_EXP
    y = linear_finish(linear_partial(x, w, ex, ew), ex, ew)
    assert torch.isnan(y[1]).all() and torch.isnan(y[:, 0]).all()
    assert not torch.isnan(y[[0, 2, 3]][:, [1, 2]]).any()
    assert_bits_equal(linear(x, w, out_dtype=FP32), y)


def test_only_the_nonfinite_row_and_column_are_nan() -> None:
    x, w = _data("nan_rows", 5, 40, 4)
    x[3, 7] = float("inf")
    w[2, 0] = float("nan")
    y = linear(x, w, out_dtype=FP32)
    nan = torch.isnan(y)
    expected = torch.zeros_like(nan)
    expected[3, :] = True
    expected[:, 2] = True
    assert torch.equal(nan, expected)
    assert (y.view(torch.int32)[nan] == 0x7FC00000).all()


def test_tiny_exponent_sums_underflow_to_signed_zero() -> None:
    # ex + ew - 47 far below the subnormal range: the result is +-0 with the sign of C.
    x = torch.tensor([[2.0**-110, -(2.0**-111)], [-(2.0**-110), 0.0]], dtype=BF16)
    w = torch.tensor([[2.0**-108, 2.0**-108]], dtype=BF16)
    y = linear(x, w, out_dtype=FP32)
    assert_bits_equal(contract.reference(x, w, out_dtype=FP32), y)
    assert y.view(torch.int32).tolist() == [[0], [-(1 << 31)]]


def test_given_weight_exponents_give_the_same_bits_and_are_checked() -> None:
    """``weight_exponents`` (the rollout engine's decode graphs hold them in buffers): the bits of
    the op without them, checked against the weight outside a capture; autograd recomputes them."""
    x, w = _data("given_ew", 6, 96, 9, outliers=500.0)
    w[4] = 0.0
    w[7, 5] = float("nan")
    b = normal(seed_of("test_linear", "given_ew_b"), (9,), 0.5, FP32)
    ew = linear_exponents(x, w)[1]
    assert ew[4] == ZERO_EXP and ew[7] == SENTINEL
    for out in (None, FP32):
        assert_bits_equal(linear(x, w, b, out), linear(x, w, b, out, weight_exponents=ew), f"out={out}")
    xr = x.clone().requires_grad_(True)
    assert_bits_equal(linear(x, w, b), linear(xr, w, b, weight_exponents=ew))
    stale = ew.clone()
    stale[2] += 1  # as after the weight's row 2 shrank in place
    with pytest.raises(ValueError, match=r"weight_exponents\[2\] = .* but row 2 of weight has exponent .*Recompute"):
        linear(x, w, weight_exponents=stale)
    with pytest.raises(TypeError, match="weight_exponents"):
        linear(x, w, weight_exponents=ew.to(torch.int32))
    with pytest.raises(ValueError, match=r"weight_exponents has shape \(8,\); expected \[9\]"):
        linear(x, w, weight_exponents=ew[:8])
    with pytest.raises(TypeError, match="weight_exponents"):
        linear(x, w, weight_exponents=ew.tolist())


def test_given_weight_digits_give_the_same_bits_and_are_checked() -> None:
    """``weight_digits`` with ``weight_exponents`` (the decode graphs' planes): the op's bits without
    them; ``linear_weight_digits`` gives the contract's digits (they rebuild the grid integers) with a
    weight that requires grad; stale, misshapen or lone digits are refused with the fix."""
    x, w = _data("given_wd", 6, 96, 9, outliers=500.0)
    w[4] = 0.0
    w[7, 5] = float("nan")
    b = normal(seed_of("test_linear", "given_wd_b"), (9,), 0.5, FP32)
    ew, wd = linear_weight_digits(w.clone().requires_grad_(True))
    assert wd.dtype == torch.int8 and tuple(wd.shape) == (3, 9, 96)
    ref_ew, ref_wd = contract.reference_weight_digits(w)
    assert torch.equal(ew, ref_ew) and torch.equal(wd, ref_wd)
    live = ew != SENTINEL
    grid = wd[0].long() + 128 * wd[1].long() + 16384 * wd[2].long()
    scale = torch.pow(2.0, (20 - ew[live]).double()).unsqueeze(1)
    assert torch.equal(grid[live], torch.round(w[live].double() * scale).long())
    assert not wd[:, 7].any() and int(wd[:2].min()) >= -64 and int(wd[:2].max()) <= 63
    for out in (None, FP32):
        assert_bits_equal(linear(x, w, b, out), linear(x, w, b, out, weight_exponents=ew, weight_digits=wd),
                          f"out={out}")
    stale = wd.clone()
    stale[1, 3, 10] += 1
    with pytest.raises(ValueError, match=r"weight_digits differ from the digits of row 3 .*linear_weight_digits"):
        linear(x, w, weight_exponents=ew, weight_digits=stale)
    with pytest.raises(ValueError, match="weight_digits was given without weight_exponents"):
        linear(x, w, weight_digits=wd)
    with pytest.raises(ValueError, match=r"weight_digits has shape \(3, 9, 95\); expected \[3, 9, 96\]"):
        linear(x, w, weight_exponents=ew, weight_digits=wd[..., :95])
    with pytest.raises(TypeError, match="weight_digits"):
        linear(x, w, weight_exponents=ew, weight_digits=wd.to(torch.int16))
    with pytest.raises(TypeError, match="float32"):
        linear_weight_digits(w.float())
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        linear_weight_digits(w[0])


# ----------------------------------------------------------------------------- invariances


def test_batch_invariance_row_alone_vs_batches() -> None:
    x, w = _data("batch", 64, 512, 48, outliers=1000.0)
    alone = linear(x[9:10], w)
    for size in (2, 5, 17, 64):
        for pos in {0, size // 2, size - 1}:
            batch = x[:size].clone()
            batch[pos] = x[9]
            assert_bits_equal(alone[0], linear(batch, w)[pos], f"size={size} pos={pos}")


def test_reduction_order_invariance() -> None:
    x, w = _data("korder", 7, 300, 11, FP16, outliers=3000.0)
    p = torch.randperm(300, generator=torch.Generator().manual_seed(0))  # only a permutation: bits don't depend on it
    assert_bits_equal(linear(x, w, out_dtype=FP32), linear(x[:, p], w[:, p], out_dtype=FP32))


def test_leading_dims_empty_and_k0() -> None:
    x, w = _data("lead", 6, 32, 5)
    assert_bits_equal(linear(x, w).reshape(2, 3, 5), linear(x.reshape(2, 3, 32), w))
    assert linear(torch.zeros(0, 4, 32, dtype=BF16), w).shape == (0, 4, 5)
    b = torch.tensor([1.0, -0.0, float("inf"), -2.5, 0.0])
    y = linear(torch.zeros(3, 0, dtype=BF16), torch.zeros(5, 0, dtype=BF16), b, FP32)
    assert_bits_equal((torch.zeros(3, 5) + b), y)


def test_kernel_is_reported() -> None:
    x, w = _data("trace", 2, 16, 3)
    with rlkernel.trace() as calls:
        linear(x, w)
    assert calls == [("linear", "cpu:linear.linear[f64]")]


# ----------------------------------------------------------------------------- backward


def test_autograd_forward_equals_plain_forward() -> None:
    x, w = _data("ag", 5, 64, 7)
    b = normal(seed_of("test_linear", "ag_b"), (7,), 0.5, FP32)
    plain = linear(x, w, b)
    xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
    assert_bits_equal(plain, linear(xr, wr, br))


def test_backward_is_the_exact_digit_matmul_and_deterministic() -> None:
    x, w = _data("bw", 9, 48, 6, outliers=300.0)
    b = normal(seed_of("test_linear", "bw_b"), (6,), 0.5, FP32)
    gy = normal(seed_of("test_linear", "bw_gy"), (9, 6), 1.0, FP32)
    grads = []
    for _ in range(2):
        xr, wr, br = (t.clone().requires_grad_(True) for t in (x, w, b))
        linear(xr, wr, br, FP32).backward(gy)
        grads.append((xr.grad, wr.grad, br.grad))
    for a, c in zip(*grads):
        assert_bits_equal(a, c, "repeat")
    gx, gw, gb = grads[0]
    gyr = gy.to(BF16)
    assert_bits_equal(contract.reference(gyr, w.T.contiguous(), out_dtype=BF16), gx, "dX")
    # one unit (no sequence_units): dW = linear v2 in fp32, the (single-term) exact sum rounded to the weight dtype
    assert_bits_equal(contract.reference(gyr.T.contiguous(), x.T.contiguous(), out_dtype=FP32).to(BF16), gw, "dW")
    # dbias: the exact sum of dY's fp32 values over the tokens, rounded once (contract exact_sum)
    assert_bits_equal(superacc.exact_sum(gy.T.contiguous(), dim=-1), gb, "dbias")


def test_backward_rows_are_batch_invariant() -> None:
    x, w = _data("bw_batch", 12, 32, 5)
    gy = normal(seed_of("test_linear", "bw_batch_gy"), (12, 5), 1.0, BF16)
    xr = x.clone().requires_grad_(True)
    linear(xr, w).backward(gy)
    xs = x[4:6].clone().requires_grad_(True)
    linear(xs, w).backward(gy[4:6])
    assert_bits_equal(xr.grad[4:6], xs.grad)


# ----------------------------------------------------------------------------- accuracy (float64 truth)


def _normwise_error(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    truth = x.double() @ w.double().T
    absdot = x.double().abs() @ w.double().abs().T
    return float(((y.double() - truth).abs() / absdot).max())


def test_accuracy_without_outliers_matches_fp32_accumulation() -> None:
    x, w = _data("acc_plain", 32, 2048, 64)
    ours = _normwise_error(linear(x, w, out_dtype=FP32), x, w)
    native = _normwise_error(torch.nn.functional.linear(x.float(), w.float()), x, w)
    assert ours <= 2e-8 and ours <= 2 * native, (ours, native)


def test_accuracy_with_outlier_channels_matches_fp32_accumulation() -> None:
    # v2 puts x rows on 28 bits: with 1000x outlier channels the ordinary channels keep every bit
    # (bf16 values within 20 binades of the row max are exact on the grid), so the normwise error
    # is that of the single final rounding, no larger than fp32 accumulation's.
    x, w = _data("acc_outliers", 32, 2048, 64, outliers=1000.0)
    ours = _normwise_error(linear(x, w, out_dtype=FP32), x, w)
    native = _normwise_error(torch.nn.functional.linear(x.float(), w.float()), x, w)
    assert ours <= native, (ours, native)


def test_half_outputs_are_the_correctly_rounded_exact_product() -> None:
    # One rounding, int64 -> bf16: on products whose exact value lies within half an fp32 ulp of a
    # bf16 midpoint, rounding through fp32 lands on the tie and breaks it the wrong way half the time.
    from rlkernel.conformance.accuracy.data import halfway_rows
    from rlkernel.conformance.accuracy.metrics import round_to

    x, w = halfway_rows("linear-test", 64, 8, 4)
    exact = x.double() @ w.double().T
    assert torch.equal(linear(x, w).view(torch.int16), round_to(exact, BF16).view(torch.int16))
    assert not torch.equal(exact.float().to(BF16).view(torch.int16), round_to(exact, BF16).view(torch.int16))
