"""The reference primitives (contracts/_exact) against exact Python integer arithmetic, and the
device-generic primitives (backends/generic/_exact) against the reference, bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rlkernel.backends.generic._exact import digits as gen_digits
from rlkernel.backends.generic._exact import fixed as gen_fixed
from rlkernel.backends.generic._exact import fp32 as gen_fp32
from rlkernel.contracts._exact import digits as ref_digits
from rlkernel.contracts._exact import fixed as ref_fixed
from rlkernel.contracts._exact import fp32 as ref_fp32
from rlkernel.contracts._gen import normal, random_bits, special_values, with_outlier_channels


def bits32(t: torch.Tensor) -> torch.Tensor:
    return ref_fp32.canonicalize(t).view(torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    va, vb = bits32(a).flatten(), bits32(b).flatten()
    diff = (va != vb).nonzero()
    if len(diff):
        i = int(diff[0])
        raise AssertionError(f"first difference at flat index {i}: {int(va[i]) & 0xFFFFFFFF:#010x} "
                             f"vs {int(vb[i]) & 0xFFFFFFFF:#010x} ({len(diff)} differ)")


def all_fp32_patterns(seed: int, n: int) -> torch.Tensor:
    """n random fp32 bit patterns (every class: normal, subnormal, zero, inf, NaN)."""
    raw = (random_bits(seed, n) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return torch.from_numpy(raw).to(torch.int32).view(torch.float32)


def rn32_exact(v: int) -> float:
    """Correct round-to-nearest-even of a Python int to binary32 (integer arithmetic only)."""
    a = abs(v)
    shift = max(a.bit_length() - 24, 0)
    q, r = divmod(a, 1 << shift)
    if shift and (r > 1 << (shift - 1) or (r == 1 << (shift - 1) and q & 1)):
        q += 1
    return float(np.float32((q << shift) * (1 if v >= 0 else -1)))


def test_int_to_fp32_is_correctly_rounded_including_ties():
    rng = random.Random(7)
    vals = []
    for _ in range(20000):
        width = rng.randint(1, 62)
        v = rng.getrandbits(width)
        if rng.random() < 0.4 and width > 25:  # exact ties and near-ties
            shift = width - 24
            v = (v >> shift << shift) | (1 << (shift - 1)) | rng.choice([0, 0, 1])
        vals.append(v if rng.random() < 0.5 else -v)
    t = torch.tensor(vals, dtype=torch.int64)
    expected = torch.tensor([rn32_exact(v) for v in vals], dtype=torch.float32)
    assert_same_bits(ref_fp32.int_to_fp32(t), expected)
    assert_same_bits(gen_fp32.int64_to_f32(t), expected)


def test_expo_matches_definition_and_generic():
    x = all_fp32_patterns(1, 200000)
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    e = ref_fp32.expo(x)
    nz = x != 0
    mag = x[nz].abs().to(torch.float64)
    assert bool(((2.0 ** (e[nz] - 1).double() <= mag) & (mag < 2.0 ** e[nz].double())).all())
    assert torch.equal(e, gen_fp32.exponent(x))


@pytest.mark.parametrize("k_range", [(-252, 252), (-30, 30)])
def test_ldexp_generic_equals_reference(k_range):
    y = all_fp32_patterns(2, 100000)
    y = torch.where(torch.isfinite(y), y, torch.ones_like(y))
    span = np.uint64(k_range[1] - k_range[0] + 1)
    k = torch.from_numpy((random_bits(3, 100000) % span).astype(np.int64)) + k_range[0]
    assert_same_bits(ref_fp32.ldexp_c(y, k), gen_fp32.scale_pow2(y, k))


def test_ldexp_far_out_of_range_matches_reference():
    y = torch.tensor([2.0**63, -(2.0**40), 3.0, -1.0, 2.0**-20, 1.0])
    k = torch.tensor([-253, -336, -400, -260, 300, 255])
    assert_same_bits(ref_fp32.ldexp_c(y, k), gen_fp32.scale_pow2(y, k))


def test_digit_matmul_tiny_rows():
    x = torch.tensor([[2.0**-130, 0.0]], dtype=torch.bfloat16)
    w = torch.tensor([[-(2.0**-131), 1e-40]], dtype=torch.bfloat16)
    assert_same_bits(ref_digits.digit_matmul(x, w), gen_digits.matmul_exact(x, w))


def test_fixed_sum_exact_against_integers_and_generic():
    t = normal(5, (40, 700), dtype=torch.float32) * torch.logspace(-40, 30, 40).unsqueeze(1).float()
    e = ref_fixed.grid_exponent(t, 1)
    # the definition with Python integers
    for row in range(0, 40, 7):
        n = sum(round(float(v) * 2.0 ** (40 - int(e[row]))) for v in t[row].double().tolist())
        expected = rn32_exact(n)  # then an exact power-of-two scale (normal range here)
        got = ref_fixed.fixed_sum(t[row : row + 1], 1)
        assert float(got[0]) == float(np.float32(expected) * np.float64(2.0) ** (int(e[row]) - 40))
    assert_same_bits(ref_fixed.fixed_sum(t, 1), gen_fixed.exact_sum(t, 1))


def test_fixed_sum_specials_and_patterns():
    x = all_fp32_patterns(4, 64 * 500).view(64, 500)
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    assert_same_bits(ref_fixed.fixed_sum(finite, 1), gen_fixed.exact_sum(finite, 1))
    specials = torch.cat([special_values(torch.float32), torch.ones(4)])
    rows = torch.stack([specials.roll(i) for i in range(len(specials))])
    assert_same_bits(ref_fixed.fixed_sum(rows, 1), gen_fixed.exact_sum(rows, 1))
    assert_same_bits(ref_fixed.fixed_sum(torch.zeros(3, 0), 1), gen_fixed.exact_sum(torch.zeros(3, 0), 1))


def test_fixed_sum_order_free():
    t = normal(6, (8, 3000), dtype=torch.float32)
    perm = torch.from_numpy(np.argsort(random_bits(9, 3000)).astype(np.int64))
    assert_same_bits(gen_fixed.exact_sum(t, 1), gen_fixed.exact_sum(t[:, perm], 1))


def test_fixed_sum_bound_raises():
    with pytest.raises(ValueError, match="exact-sum bound"):
        ref_fixed.check_count("demo", 1 << 23)


def exact_linear(x: torch.Tensor, w: torch.Tensor) -> list[list[int]]:
    """C_ij with Python integers on the P5 grids."""
    ex, ew = ref_digits.row_exponent(x), ref_digits.row_exponent(w)
    xi, wi = ref_digits.to_grid(x, ex).tolist(), ref_digits.to_grid(w, ew).tolist()
    return [[sum(a * b for a, b in zip(r, c)) for c in wi] for r in xi]


def test_int_matmul_exact():
    x = with_outlier_channels(normal(10, (5, 300)), 11, factor=3000.0)
    w = normal(12, (4, 300), dtype=torch.float16)
    ex, ew = ref_digits.row_exponent(x), ref_digits.row_exponent(w)
    c = ref_digits.int_matmul(ref_digits.to_grid(x, ex), ref_digits.to_grid(w.to(torch.float32), ew))
    xi, wi = ref_digits.to_grid(x, ex).tolist(), ref_digits.to_grid(w.to(torch.float32), ew).tolist()
    assert c.tolist() == [[sum(a * b for a, b in zip(r, col)) for col in wi] for r in xi]


@pytest.mark.parametrize("k", [1, 7, 300, 4097])
def test_digit_matmul_generic_equals_reference(k):
    x = with_outlier_channels(normal(20 + k, (9, k)), 1, count=min(k, 3), factor=1000.0)
    w = normal(30 + k, (6, k))
    x[1] = 0
    x[2, 0] = float("nan")
    w[3, -1] = float("inf")
    assert_same_bits(ref_digits.digit_matmul(x, w), gen_digits.matmul_exact(x, w))


def test_digit_matmul_is_order_free():
    x, w = normal(40, (3, 2000)), normal(41, (5, 2000))
    perm = torch.from_numpy(np.argsort(random_bits(42, 2000)).astype(np.int64))
    assert_same_bits(gen_digits.matmul_exact(x, w), gen_digits.matmul_exact(x[:, perm], w[:, perm]))


def test_canonical_nan_and_casts():
    y = special_values(torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        a, b = ref_fp32.round_to(y, dtype), gen_fp32.cast_out(y, dtype)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    weird_nan = torch.tensor([-1], dtype=torch.int32).view(torch.float32)  # 0xFFFFFFFF
    assert int(ref_fp32.canonicalize(weird_nan).view(torch.int32)) == 0x7FC00000
    assert int(gen_fp32.canonical_nan(weird_nan).view(torch.int32)) == 0x7FC00000


def test_max_and_argmax_rules():
    x = torch.tensor([[-0.0, 0.0, -1.0], [1.0, float("nan"), 2.0], [3.0, 5.0, 5.0], [-0.0, -0.0, -2.0]])
    m = ref_fp32.max_r5(x, 1)
    assert_same_bits(m, gen_fp32.nan_max(x, 1))
    assert int(m[3].view(torch.int32)) == 0  # +0, not -0
    assert ref_fp32.argmax_r5(x).tolist() == [0, 1, 1, 0]
    assert gen_fp32.first_argmax(x).tolist() == [0, 1, 1, 0]


# --- P-sqrt: correctly rounded fp32 square root -------------------------------------------------


def _ieee_sqrt(x: torch.Tensor) -> torch.Tensor:
    """Truth: numpy's float64 sqrt (the hardware's IEEE instruction) rounded once more to fp32;
    exact, since double rounding is innocuous for sqrt when 53 >= 2 * 24 + 2."""
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(np.sqrt(x.numpy().astype(np.float64)).astype(np.float32))


def test_sqrt_rn_reference_is_ieee():
    x = torch.cat([all_fp32_patterns(11, 200000), special_values(torch.float32)])
    assert_same_bits(ref_fp32.canonicalize(ref_fp32.sqrt_rn(x)), ref_fp32.canonicalize(_ieee_sqrt(x)))


def test_sqrt_rn_generic_is_ieee():
    # every subnormal exponent, the powers of two and their neighbours, then random patterns
    edges = torch.tensor([1, 2, 3, 0x7FFFFF, 0x800000, 0x800001, 0x3F800000, 0x3F800001, 0x3F7FFFFF,
                          0x40000000, 0x7F7FFFFF, 0x7F800000, 0x80000001, 0xFF800000, 0x7FC00000],
                         dtype=torch.int64).to(torch.int32).view(torch.float32)
    sub = (torch.ones(23, dtype=torch.int64) << torch.arange(23)).to(torch.int32).view(torch.float32)
    x = torch.cat([edges, sub, all_fp32_patterns(12, 1 << 20)])
    expected = ref_fp32.canonicalize(_ieee_sqrt(x))
    assert_same_bits(gen_fp32.canonical_nan(gen_fp32.sqrt_rn(x)), expected)
    # the sign of zero survives
    zeros = gen_fp32.sqrt_rn(torch.tensor([0.0, -0.0]))
    assert bits32(zeros).tolist() == [0, -(1 << 31)]


def test_generic_bit_length_equals_python() -> None:
    """``bit_length`` reads an fp32 conversion's exponent: every power of two and its neighbours (where
    the conversion rounds up to the next power), and random int64 magnitudes of every length."""
    g = torch.Generator().manual_seed(7)
    values = [0] + [v for k in range(64) for v in ((1 << k) - 1, 1 << k, (1 << k) + 1) if 0 <= v < 1 << 63]
    values += [(1 << 63) - 1, (1 << 24) - 1 << 39, ((1 << 24) + 1) << 30]
    rand = torch.randint(0, 1 << 62, (50000,), generator=g) >> torch.randint(0, 63, (50000,), generator=g)
    a = torch.cat([torch.tensor(values, dtype=torch.int64), rand])
    expected = torch.tensor([int(x).bit_length() for x in a.tolist()])
    assert torch.equal(gen_fp32.bit_length(a), expected)
