"""Philox4x32-10 and uint32 -> fp32: known answers, reference == generic, a pure-Python oracle."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from rlkernel.backends.generic._exact import philox as gen
from rlkernel.contracts._exact import philox as ref

M32 = 0xFFFFFFFF

#: Random123 kat_vectors, philox4x32 with 10 rounds: (counter, key, expected output)
# fmt: off
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
# fmt: on


def philox_python(ctr: tuple[int, ...], key: tuple[int, ...], rounds: int = 10) -> tuple[int, ...]:
    """Oracle: Random123's philox4x32_R on Python ints, written straight from the paper."""
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for i in range(rounds):
        if i:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
    return c0, c1, c2, c3


def hexwords(t) -> str:
    return " ".join(f"{int(v):08x}" for v in t)


def assert_same_words(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == torch.int64 and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    diff = (got != want).reshape(-1, 4).any(-1).nonzero()
    if diff.numel():
        i = int(diff[0])
        pytest.fail(
            f"{what}: {diff.numel()} blocks differ; first block {i}: got {hexwords(got.reshape(-1, 4)[i])}, "
            f"want {hexwords(want.reshape(-1, 4)[i])}"
        )


def test_python_oracle_matches_known_answers():
    for ctr, key, want in KAT:
        assert philox_python(ctr, key) == want, hexwords(philox_python(ctr, key))


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
@pytest.mark.parametrize("kat", KAT, ids=["zeros", "ones", "pi"])
def test_known_answer_vectors(impl, kat):
    ctr, key, want = kat
    out = impl.philox4x32(torch.tensor(ctr, dtype=torch.int64), torch.tensor(key, dtype=torch.int64))
    assert_same_words(out, torch.tensor(want, dtype=torch.int64), f"{impl.__name__} KAT")


def _random_words(n: int, width: int, seed: int) -> torch.Tensor:
    w = np.random.default_rng(seed).integers(0, 1 << 32, (n, width), dtype=np.uint64).astype(np.int64)
    w[:8] = [[0] * width, [M32] * width, [1] * width, [1 << 31] * width] * 2  # edge words first
    return torch.from_numpy(w)


def test_reference_and_generic_equal_python_oracle():
    ctr, key = _random_words(512, 4, seed=11), _random_words(512, 2, seed=12)
    want = torch.tensor([philox_python(tuple(c), tuple(k)) for c, k in zip(ctr.tolist(), key.tolist())])
    assert_same_words(ref.philox4x32(ctr, key), want, "reference vs python")
    assert_same_words(gen.philox4x32(ctr, key), want, "generic vs python")


def test_reference_equals_generic_random_counters():
    ctr, key = _random_words(1 << 17, 4, seed=13), _random_words(1 << 17, 2, seed=14)
    assert_same_words(gen.philox4x32(ctr, key), ref.philox4x32(ctr, key), "generic vs reference")


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
def test_broadcast_and_batch_invariance(impl):
    """One key for a [3, 5] grid of counters; each block equals the block computed alone."""
    ctr = _random_words(15, 4, seed=15).reshape(3, 5, 4)
    key = torch.tensor([0x12345678, 0x9ABCDEF0], dtype=torch.int64)
    out = impl.philox4x32(ctr, key)
    assert out.shape == (3, 5, 4)
    alone = impl.philox4x32(ctr[1, 2], key)
    assert_same_words(out[1, 2], alone, "one block alone")
    assert impl.philox4x32(ctr[:0], key).shape == (0, 5, 4)


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
def test_int32_and_uint32_words_are_bit_patterns(impl):
    ctr64, key64 = _random_words(64, 4, seed=16), _random_words(64, 2, seed=17)
    want = impl.philox4x32(ctr64, key64)
    as_i32 = impl.philox4x32(ctr64.to(torch.int32), key64.to(torch.int32))  # wraps to the bit pattern
    assert_same_words(as_i32, want, "int32 words")
    as_u32 = impl.philox4x32(ctr64.to(torch.uint32), key64.to(torch.uint32))
    assert_same_words(as_u32, want, "uint32 words")


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
def test_rejects_bad_input(impl):
    key = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"\[\.\.\., 4\]"):
        impl.philox4x32(torch.zeros(3, dtype=torch.int64), key)
    with pytest.raises(ValueError, match=r"outside \[0, 2\*\*32\)"):
        impl.philox4x32(torch.tensor([0, 0, 0, 1 << 32]), key)
    with pytest.raises(ValueError, match=r"outside \[0, 2\*\*32\)"):
        impl.philox4x32(torch.tensor([0, 0, 0, -1]), key)
    with pytest.raises(TypeError, match="int64"):
        impl.philox4x32(torch.zeros(4), key)
    with pytest.raises(ValueError, match="outside"):
        impl.uniform_from_u32(torch.tensor([1 << 32]))


# --- uint32 -> fp32 -----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
def test_uniform_exact_values(impl):
    r = torch.tensor([0, 511, 512, 1 << 31, M32 - 511, M32], dtype=torch.int64)
    u = impl.uniform_from_u32(r)
    assert u.dtype == torch.float32
    want = [Fraction(2 * (v >> 9) + 1, 1 << 24) for v in r.tolist()]
    assert [Fraction(float(v)) for v in u.tolist()] == want
    assert float(u[0]) == 2.0**-24 and float(u[-1]) == 1 - 2.0**-24


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
def test_uniform_symmetry_and_range(impl):
    r = _random_words(1 << 16, 1, seed=18).reshape(-1)
    u = impl.uniform_from_u32(r)
    u_flip = impl.uniform_from_u32(M32 - r)  # ~r
    assert bool(((u + u_flip) == 1.0).all())  # exact: both are odd multiples of 2**-24
    assert bool((u > 0).all()) and bool((u < 1).all())


def test_uniform_reference_equals_generic():
    r = _random_words(1 << 18, 1, seed=19).reshape(-1)
    a, b = ref.uniform_from_u32(r), gen.uniform_from_u32(r)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    a32, b32 = ref.uniform_from_u32(r.to(torch.int32)), gen.uniform_from_u32(r.to(torch.int32))
    assert torch.equal(a32.view(torch.int32), a.view(torch.int32))
    assert torch.equal(b32.view(torch.int32), a.view(torch.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA (or ROCm) device")
def test_generic_on_cuda_equals_reference():
    ctr, key = _random_words(1 << 16, 4, seed=20), _random_words(1 << 16, 2, seed=21)
    out = gen.philox4x32(ctr.cuda(), key.cuda()).cpu()
    assert_same_words(out, ref.philox4x32(ctr, key), "generic[cuda] vs reference")
    u = gen.uniform_from_u32(out[:, 0].cuda()).cpu()
    assert torch.equal(u.view(torch.int32), ref.uniform_from_u32(out[:, 0]).view(torch.int32))
