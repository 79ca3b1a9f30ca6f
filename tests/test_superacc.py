"""The exact superaccumulator (P10): reference against exact rational arithmetic, and the
device-generic implementation against the reference, bit for bit (states and results)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.backends.generic._exact import superacc as gen
from rlkernel.contracts._exact import superacc as ref
from rlkernel.contracts._gen import random_bits

F32_MAX = Fraction(2**128 - 2**104)


def bits32(t: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(t), torch.full_like(t, float("nan")), t).view(torch.int32)


def assert_same_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    va, vb = bits32(a).flatten(), bits32(b).flatten()
    diff = (va != vb).nonzero()
    if len(diff):
        i = int(diff[0])
        raise AssertionError(f"{what}: first difference at flat index {i}: {int(va[i]) & 0xFFFFFFFF:#010x} vs "
                             f"{int(vb[i]) & 0xFFFFFFFF:#010x} ({len(diff)} differ)")


def assert_same_states(a: torch.Tensor, b: torch.Tensor) -> None:
    if not torch.equal(a, b):
        rows = (a != b).any(dim=-1).nonzero()
        i = tuple(int(k) for k in rows[0])
        raise AssertionError(f"states differ at {i}: {a[i].tolist()} vs {b[i].tolist()}")


def fp32_patterns(seed: int, n: int) -> torch.Tensor:
    raw = (random_bits(seed, n) & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return torch.from_numpy(raw).to(torch.int32).view(torch.float32)


def oracle(terms: torch.Tensor) -> float:
    """Correctly rounded fp32 of the exact sum, found independently with Fractions: the nearest
    of the fp32 neighbours of the float64 approximation, ties to the even significand."""
    t = terms.flatten()
    if torch.isnan(t).any() or (torch.isinf(t) & (t > 0)).any() and (torch.isinf(t) & (t < 0)).any():
        return float("nan")
    if torch.isinf(t).any():
        return float(t[torch.isinf(t)][0])
    exact = sum((Fraction(v) for v in t.to(torch.float64).tolist()), Fraction(0))
    if abs(exact) >= F32_MAX + Fraction(2**103):  # at or beyond the halfway point to 2**128: inf
        return float("inf") if exact > 0 else float("-inf")
    f = float(exact)
    approx = np.float32(f) if abs(f) < 3.4028235e38 else np.float32(math.copysign(3.4028235e38, f))
    with np.errstate(over="ignore"):
        cands = {approx, np.nextafter(approx, np.float32(np.inf)), np.nextafter(approx, np.float32(-np.inf))}
    cands = [c for c in cands if np.isfinite(c)]
    best = min(cands, key=lambda c: (abs(Fraction(float(c)) - exact), int(np.array(c).view(np.int32)) & 1))
    return 0.0 if best == 0 else float(best)


# --------------------------------------------------------------------------- decomposition


def test_term_decomposition_is_exact_and_matches_the_bits():
    t = fp32_patterns(1, 20000)
    t = torch.cat([t, torch.tensor([0.0, -0.0, 2.0**-149, -(2.0**-149), 2.0**-126, 3.4028234663852886e38, 1.0])])
    limb, contrib = ref.term_limbs(t)
    g_limb, g_contrib = gen._decompose(t)
    finite = torch.isfinite(t)
    assert torch.equal(limb[finite], g_limb[finite]) and torch.equal(contrib[finite], g_contrib[finite])
    assert int(limb.max()) <= 15 and int(contrib.abs().max()) < 2**39
    for v, li, c in zip(t[finite].tolist(), limb[finite].tolist(), contrib[finite].tolist()):
        assert Fraction(v) == Fraction(c) * Fraction(2) ** (16 * li - 149)


# --------------------------------------------------------------------------- finishing


@pytest.mark.parametrize("terms, expected", [
    ([1.0, 2.0**-24], 1.0),  # tie: to even (down)
    ([1.0 + 2.0**-23, 2.0**-24], 1.0 + 2.0**-22),  # tie: to even (up)
    ([1.0, 2.0**-24, 2.0**-149], 1.0 + 2.0**-23),  # just above the tie: sticky bit
    ([1.0, 2.0**-24, -(2.0**-149)], 1.0),  # just below the tie
    ([2.0**-126, -(2.0**-149)], 2.0**-126 - 2.0**-149),  # largest subnormal, exact
    ([2.0**-149, 2.0**-149, -(2.0**-148)], 0.0),  # exact zero -> +0
    ([-0.0, -0.0], 0.0),  # -0 + -0: the contract gives +0
    ([3.4028234663852886e38, 2.0**103], float("inf")),  # max + half ulp: tie, odd -> inf
    ([3.4028234663852886e38, 2.0**103, -(2.0**-149)], 3.4028234663852886e38),
    ([3.4028234663852886e38, 3.4028234663852886e38, -3.4028234663852886e38], 3.4028234663852886e38),
    ([-3.4028234663852886e38, -3.4028234663852886e38], float("-inf")),
    ([1.0e30, 1.0, -1.0e30], 1.0),  # catastrophic cancellation, exact
    ([float("inf"), 1.0], float("inf")),
    ([float("inf"), float("-inf")], float("nan")),
    ([float("nan"), 1.0], float("nan")),
    ([], 0.0),
])
def test_finish_edge_cases(terms, expected):
    t = torch.tensor(terms, dtype=torch.float32).reshape(1, -1)
    want = torch.tensor([expected], dtype=torch.float32)
    assert_same_bits(ref.exact_sum(t, dim=1), want, "reference")
    assert_same_bits(gen.exact_sum(t, dim=1), want, "generic")
    if terms:
        assert_same_bits(torch.tensor([oracle(t)], dtype=torch.float32), want, "oracle")


def _structured(seed: int) -> torch.Tensor:
    """Rows of terms in a narrow or wide exponent range, with cancellation and ties."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 5, 17, 64])
    kind = seed % 4
    if kind == 0:
        return fp32_patterns(seed, 4 * n).reshape(4, n)
    if kind == 1:
        t = fp32_patterns(seed, 4 * n).reshape(4, n)
        return torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    e = rng.randint(-150, 126)
    vals = [rng.uniform(-1.0, 1.0) * 2.0**e for _ in range(4 * n)]
    t = torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(4, n)
    if kind == 3:  # add the negated partial sums back: heavy cancellation
        t = torch.cat([t, -t[:, : max(1, n - 1)]], dim=1)
    return t


@pytest.mark.parametrize("seed", range(60))
def test_reference_matches_oracle_and_generic_matches_reference(seed):
    t = _structured(seed)
    r_state, g_state = ref.accumulate(t, dim=1), gen.accumulate(t, dim=1)
    assert_same_states(r_state, g_state)
    r = ref.finish(r_state)
    assert_same_bits(r, ref.exact_sum(t, dim=1), "reference finish vs exact_sum")
    assert_same_bits(gen.finish(g_state), r, "generic vs reference")
    want = torch.tensor([oracle(row) for row in t], dtype=torch.float32)
    assert_same_bits(r, want, "reference vs oracle")


finite_f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any_f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(finite_f32, any_f32, st.sampled_from([0.0, -0.0, 2.0**-149, 3.4028234663852886e38])),
                min_size=1, max_size=40))
def test_hypothesis_generic_equals_reference(values):
    t = torch.tensor(values, dtype=torch.float32).reshape(1, -1)
    assert_same_states(gen.accumulate(t, dim=1), ref.accumulate(t, dim=1))
    assert_same_bits(gen.exact_sum(t, dim=1), ref.exact_sum(t, dim=1))
    assert_same_bits(ref.exact_sum(t, dim=1), torch.tensor([oracle(t)], dtype=torch.float32), "oracle")


# --------------------------------------------------------------------------- merging and splits


def test_split_and_merge_in_any_order_is_exact():
    t = torch.cat([fp32_patterns(7, 3000), torch.tensor([1.0e38, -1.0e38, 2.0**-149])])
    t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    whole = gen.accumulate(t, dim=0)
    assert_same_states(whole, ref.accumulate(t.reshape(1, -1), dim=1)[0])
    rng = random.Random(3)
    for _ in range(5):
        cuts = sorted(rng.sample(range(1, t.numel()), 6))
        pieces = [t[a:b] for a, b in zip([0] + cuts, cuts + [t.numel()])]
        rng.shuffle(pieces)
        states = torch.stack([gen.accumulate(p, dim=0) for p in pieces])
        assert_same_states(gen.merge(states, dim=0), whole)
        assert_same_states(ref.merge(states, dim=0), whole)
        plain = states.sum(dim=0)  # an all-reduce SUM: not canonical, same value
        assert_same_bits(gen.finish(plain), gen.finish(whole))
        assert_same_states(gen.normalize(plain), whole)


def test_canonical_state_is_unique_per_value():
    t = torch.tensor([[1.0, -1.0, 2.0**-149], [2.0**-149, 0.0, 0.0]], dtype=torch.float32)
    s = gen.accumulate(t, dim=1)
    assert_same_states(s[0:1], s[1:2])
    assert ref.value_of(s[0])[0] == 1


def test_carry_limb_many_huge_terms():
    big = torch.full((5000,), 3.0e38, dtype=torch.float32)
    t = torch.cat([big, -big[:-1], torch.tensor([-1.0])])  # sum is exactly 3e38 - 1 -> 3e38
    s = gen.accumulate(t, dim=0)
    assert int(gen.accumulate(big, dim=0)[gen.CARRY]) > 0  # the total passes 2**256 * 2**-149
    assert_same_bits(gen.finish(s), torch.tensor(3.0e38))
    assert_same_bits(gen.finish(gen.accumulate(big, dim=0)), torch.tensor(float("inf")))
    assert_same_bits(gen.finish(gen.accumulate(-big, dim=0)), torch.tensor(float("-inf")))
    assert_same_states(gen.accumulate(big, dim=0), ref.accumulate(big.reshape(1, -1), dim=1)[0])


def test_chunked_accumulation_paths(monkeypatch):
    """Reductions longer than one step (and many rows) are cut into blocks: same states."""
    t = fp32_patterns(11, 6 * 257).reshape(6, 257)
    t = torch.where(torch.isfinite(t), t, torch.zeros_like(t))
    t[2, 5] = float("nan")
    t[4, 7] = float("-inf")
    expected = ref.accumulate(t, dim=1)
    monkeypatch.setattr(gen, "STEP_ELEMENTS", 64)
    assert_same_states(gen.accumulate(t, dim=1), expected)
    monkeypatch.setattr(gen, "STEP_ELEMENTS", 1 << 22)
    monkeypatch.setattr(gen, "BLOCK_TERMS", 5)
    assert_same_states(gen.accumulate(t, dim=1), expected)


def test_other_axes_and_empty():
    t = fp32_patterns(5, 2 * 3 * 7).reshape(2, 3, 7)
    assert_same_states(gen.accumulate(t, dim=1), ref.accumulate(t, dim=1))
    assert gen.accumulate(torch.zeros(0, 4), dim=1).shape == (0, 20)
    assert_same_bits(gen.finish(gen.accumulate(torch.zeros(3, 0), dim=1)), torch.zeros(3))
    with pytest.raises(TypeError, match="float32"):
        gen.accumulate(torch.zeros(3, dtype=torch.float64), dim=0)
    with pytest.raises(ValueError, match="slot axis"):
        gen.merge(torch.zeros(3, 20, dtype=torch.int64), dim=1)


def test_one_term_states_equal_the_reference() -> None:
    """The bench's vectorised one-term states are the reference's canonical states, bit for bit:
    random bit patterns (subnormals, huge magnitudes, both signs) and the special values."""
    from rlkernel.contracts.exact_sum import one_term_states, partial_reference

    words = (random_bits(11, 4096) & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 2.0**-149, -(2.0**-149),
                             3.4028234663852886e38, -3.4028234663852886e38, 1.0, -1.0])
    t = torch.cat([torch.from_numpy(words.copy()), specials, torch.tensor([0.0])]).reshape(-1, 4)
    assert_same_states(one_term_states(t), partial_reference(t[None]))
