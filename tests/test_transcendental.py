"""exp_c / log_c: reference (contracts) vs device-generic (backends) bits, specials, accuracy.

Bitwise checks compare int32 views. The only tolerance is in the tests named ``*_accuracy_*``,
which measure against float64 truth (the contract's <= 1 ulp target). The exhaustive sweep
over all 2**32 inputs lives in ``tools/measure_transcendentals.py`` (docs/accuracy-exp-log.md).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlkernel.backends.generic._exact import transcendental as gen
from rlkernel.contracts._exact import transcendental as ref

FUNCS = ("exp_c", "log_c")
NAN = 0x7FC00000
PINF = 0x7F800000
NINF = 0xFF800000
ONE = 0x3F800000


def f32(bits) -> torch.Tensor:
    """fp32 tensor from uint32 bit patterns (Python ints or an array)."""
    a = np.asarray(bits, dtype=np.uint64).astype(np.uint32)
    return torch.from_numpy(a.view(np.int32).copy()).view(torch.float32)


def u32(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int32).numpy().view(np.uint32)


def assert_same_bits(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    g, w = u32(got.reshape(-1)), u32(want.reshape(-1))
    diff = np.flatnonzero(g != w)
    if diff.size:
        i = int(diff[0])
        xb = int(u32(x.reshape(-1))[i])
        pytest.fail(
            f"{what}: {diff.size} of {g.size} differ; first at index {i}: x=0x{xb:08X}, "
            f"got 0x{int(g[i]):08X}, want 0x{int(w[i]):08X}. Reproduce: "
            f"{what.split()[0]}(torch.tensor([0x{xb:08X}], dtype=torch.int64).to(torch.int32).view(torch.float32))"
        )


def random_bits(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)


def boundary_bits() -> np.ndarray:
    """Every encoding near the special boundaries: zeros, subnormal edges, 1, thresholds."""
    # fmt: off
    centres = [
        0x00000000, 0x007FFFFF, 0x00800000, 0x3F800000, 0x3F3504F3, 0x3FB504F3, 0x7F7FFFFF, 0x7F800000,
        0x42B17217, 0x42B20000, 0xC2AEAC50, 0xC2CE8ED0, 0xC2CFF1B5, 0xC2D00000, 0x3EB17218, 0x3F317218,
    ]
    # fmt: on
    out = [np.arange(c - 2048, c + 2048, dtype=np.int64) for c in centres]
    out += [a | (1 << 31) for a in out]
    allb = np.concatenate(out)
    return (allb[(allb >= 0) & (allb < 1 << 32)]).astype(np.uint32)


# --- special values, stated by the contract ---------------------------------------------------

# fmt: off
EXP_SPECIALS = {
    0x7FC00000: NAN, 0xFFC00000: NAN, 0x7F800001: NAN, 0xFFFFFFFF: NAN,  # NaNs -> canonical
    0x7F800000: PINF, 0xFF800000: 0x00000000,  # exp(+inf) = +inf, exp(-inf) = +0
    0x00000000: ONE, 0x80000000: ONE, 0x00000001: ONE, 0x80000001: ONE,  # exp(+-0), exp(+-tiny)
    0x42B20001: PINF, 0x7F7FFFFF: PINF, 0x42B17218: PINF,  # above the overflow threshold
    0xC2D00001: 0x00000000, 0xFF7FFFFF: 0x00000000, 0xC2D00000: 0x00000000,  # underflow to +0
    0x3F800000: 0x402DF854,  # e, correctly rounded
}
# fmt: on

# fmt: off
LOG_SPECIALS = {
    0x7FC00000: NAN, 0xFFC00000: NAN, 0x7F800001: NAN,  # NaNs -> canonical
    0xBF800000: NAN, 0x80000001: NAN, 0xFF800000: NAN, 0xFF7FFFFF: NAN,  # x < 0 -> NaN
    0x00000000: NINF, 0x80000000: NINF,  # log(+-0) = -inf
    0x7F800000: PINF,
    0x3F800000: 0x00000000,  # log(1) = +0 exactly
    0x00000001: 0xC2CE8ED0,  # log(2**-149), correctly rounded
    0x7F7FFFFF: 0x42B17218,  # log(FLT_MAX)
    0x40000000: 0x3F317218,  # log(2), correctly rounded
}
# fmt: on


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
@pytest.mark.parametrize("name,table", [("exp_c", EXP_SPECIALS), ("log_c", LOG_SPECIALS)])
def test_special_values(impl, name, table):
    x = f32(list(table))
    want = f32(list(table.values()))
    assert_same_bits(x, getattr(impl, name)(x), want, f"{name} {impl.__name__}")


# --- reference == generic -----------------------------------------------------------------------


@pytest.mark.parametrize("name", FUNCS)
def test_reference_equals_generic_random_bits(name):
    """2**20 uniformly random encodings (all of fp32) plus 2**19 in the finite working range."""
    rb = random_bits(1 << 20, seed=1)
    lo, hi = (0xC2D00000, 0x42B20000) if name == "exp_c" else (0x00000001, 0x7F7FFFFF)
    rng = np.random.default_rng(2)
    if name == "exp_c":  # x in [-104, 89]: positive and negative encodings
        pos = rng.integers(0, hi + 1, 1 << 18, dtype=np.int64)
        neg = rng.integers(0x80000000, lo + 1, 1 << 18, dtype=np.int64)
        working = np.concatenate([pos, neg])
    else:
        working = rng.integers(lo, hi + 1, 1 << 19, dtype=np.int64)
    x = f32(np.concatenate([rb, working.astype(np.uint32)]))
    assert_same_bits(x, getattr(gen, name)(x), getattr(ref, name)(x), f"{name} generic vs reference")


@pytest.mark.parametrize("name", FUNCS)
def test_reference_equals_generic_boundaries(name):
    x = f32(boundary_bits())
    assert_same_bits(x, getattr(gen, name)(x), getattr(ref, name)(x), f"{name} generic vs reference")


@pytest.mark.parametrize("name", FUNCS)
def test_reference_equals_generic_subnormal_inputs(name):
    """Every 61st subnormal encoding of both signs (log prescales them; exp sees r = x)."""
    b = np.arange(1, 0x00800000, 61, dtype=np.int64)
    x = f32(np.concatenate([b, b | (1 << 31)]).astype(np.uint32))
    assert_same_bits(x, getattr(gen, name)(x), getattr(ref, name)(x), f"{name} generic vs reference")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True), min_size=1, max_size=64),
    st.sampled_from(FUNCS),
)
def test_reference_equals_generic_property(values, name):
    x = torch.tensor(values, dtype=torch.float32)
    assert_same_bits(x, getattr(gen, name)(x), getattr(ref, name)(x), f"{name} generic vs reference")


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
@pytest.mark.parametrize("name", FUNCS)
def test_elementwise_shape_and_layout_invariance(impl, name):
    """A value's result does not depend on the tensor around it (shape, stride, position)."""
    x = f32(random_bits(6 * 7 * 5, seed=3)).reshape(6, 7, 5)
    fn = getattr(impl, name)
    whole = fn(x)
    assert whole.shape == x.shape and whole.dtype == torch.float32
    assert_same_bits(x, fn(x.transpose(0, 2)).transpose(0, 2), whole, f"{name} transposed")
    assert_same_bits(x[2:3, 4:5, 1:2], fn(x[2:3, 4:5, 1:2]), whole[2:3, 4:5, 1:2], f"{name} alone")
    assert_same_bits(x[:, ::2], fn(x[:, ::2]), whole[:, ::2], f"{name} strided")
    empty = torch.empty(0, 3, dtype=torch.float32)
    assert fn(empty).shape == (0, 3)


@pytest.mark.parametrize("impl", [ref, gen], ids=["reference", "generic"])
@pytest.mark.parametrize("name", FUNCS)
def test_rejects_other_dtypes(impl, name):
    with pytest.raises(TypeError, match="float32"):
        getattr(impl, name)(torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="float32"):
        getattr(impl, name)(torch.ones(3, dtype=torch.bfloat16))


# --- accuracy against float64 truth (the only tolerances in this file) ------------------------


def _ulp_error(x: torch.Tensor, y: torch.Tensor, name: str) -> np.ndarray:
    x64 = x.numpy().astype(np.float64)
    truth = np.exp(x64) if name == "exp_c" else np.log(x64)
    _, ex = np.frexp(np.abs(truth))
    ulp = np.ldexp(1.0, np.clip(ex - 24, -149, 104))
    err = np.abs(y.numpy().astype(np.float64) - truth) / ulp
    with np.errstate(over="ignore"):
        err[np.isinf(y.numpy()) & (y.numpy() == truth.astype(np.float32))] = 0.0
    return err


@pytest.mark.parametrize("name", FUNCS)
def test_accuracy_within_one_ulp_of_float64(name):
    """Max error <= 1 ulp on 2**18 inputs spread over the whole finite working range."""
    rng = np.random.default_rng(4)
    if name == "exp_c":
        b = np.concatenate([rng.integers(0, 0x42B20001, 1 << 17), rng.integers(0x80000000, 0xC2D00001, 1 << 17)])
    else:
        b = rng.integers(1, 0x7F800000, 1 << 18)
    x = f32(b.astype(np.uint32))
    y = getattr(ref, name)(x)
    err = _ulp_error(x, y, name)
    i = int(np.argmax(err))
    assert err[i] <= 1.0, f"{name}: {err[i]:.3f} ulp at x=0x{int(u32(x)[i]):08X}"
    # and it is usually correctly rounded (measured: > 99 % over all inputs)
    with np.errstate(over="ignore"):
        truth = np.exp(x.numpy().astype(np.float64)) if name == "exp_c" else np.log(x.numpy().astype(np.float64))
        assert np.mean(y.numpy() == truth.astype(np.float32)) > 0.99


def test_exp_accuracy_near_overflow_and_into_subnormals():
    """Every encoding around the overflow edge and the normal/subnormal/zero edges."""
    spans = [(0x42B10000, 0x42B20001), (0xC2AE0000, 0xC2AF0000), (0xC2CE0000, 0xC2D00001)]
    x = f32(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in spans]).astype(np.uint32))
    err = _ulp_error(x, ref.exp_c(x), "exp_c")
    assert err.max() <= 1.0, f"exp_c: {err.max():.3f} ulp at x=0x{int(u32(x)[int(np.argmax(err))]):08X}"


def test_log_accuracy_around_one():
    """Every encoding in [0.96, 1.04]: results near 0 keep full relative accuracy."""
    x = f32(np.arange(0x3F75C28F, 0x3F851EB8, 7, dtype=np.int64).astype(np.uint32))
    err = _ulp_error(x, ref.log_c(x), "log_c")
    assert err.max() <= 1.0, f"log_c: {err.max():.3f} ulp at x=0x{int(u32(x)[int(np.argmax(err))]):08X}"


# --- other devices ----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA (or ROCm) device")
@pytest.mark.parametrize("name", FUNCS)
def test_generic_on_cuda_equals_reference(name):
    x = f32(np.concatenate([random_bits(1 << 22, seed=5), boundary_bits()]))
    y = getattr(gen, name)(x.cuda()).cpu()
    assert_same_bits(x, y, getattr(ref, name)(x), f"{name} generic[cuda] vs reference")
