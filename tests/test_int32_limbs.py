"""The int32-limb alternative of the generic sums gives the int64 path's bits, and the probes pick it.

A device whose int64 arithmetic is not exact (Ascend's AI Core is the known case; see
docs/generic-primitives.md) runs the generic sums on int32 limbs (backends/generic/_exact/
limbs32.py, superacc32.py, fixed32.py). Here, on the CPU, that path is forced and compared bit
for bit with the int64 one (states and results, canonical and not) and, through the conformance
runner, with the contracts' references on a reduced case set of every op whose sums it serves.
The full run is a documented command (docs/generic-primitives.md):

    RLKERNEL_GENERIC_INT=int32 rlkernel conformance --backend generic --device cpu
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlkernel.backends.generic import exact_sum as generic_exact_sum
from rlkernel.backends.generic._exact import fixed, fixed32, fp32, intpath, limbs32, sqrt32, superacc, superacc32


def _random_f32(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, shape, generator=g, dtype=torch.int64).to(torch.int32)
    return bits.view(torch.float32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def test_limbs_round_trip_int64_bits() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.randint(-(2**63), 2**63 - 1, (1000,), generator=g, dtype=torch.int64),
                   torch.tensor([0, -1, 1, 2**63 - 1, -(2**63), 2**31, -(2**31), 2**47 + 5], dtype=torch.int64)])
    limbs = limbs32.from_int64(x)
    assert limbs.dtype == torch.int32 and bool(((limbs[:, :3] >= 0) & (limbs[:, :3] < 2**16)).all())
    assert torch.equal(limbs32.to_int64(limbs), x)
    assert torch.equal(limbs32.is_positive_int64(x), x > 0)
    # a sum of normalised numbers, normalised, is the int64 sum (within int64)
    y = x[:8] >> 4
    total = limbs32.total(limbs32.from_int64(y).unsqueeze(1).expand(-1, 3, -1), dim=1)
    assert torch.equal(limbs32.to_int64(total), y * 3)


@pytest.mark.parametrize("n", [1, 5, 300, 9000])
def test_superacc_states_and_results_match_int64(n: int) -> None:
    cases = [_random_f32((4, n), n), torch.randn(4, n) * 1e-41, torch.full((4, n), 3.0e38), -torch.zeros(4, n)]
    for t in cases:
        states = superacc.accumulate(t)
        assert torch.equal(superacc32.accumulate(t), states)
        assert _same(superacc32.finish(states), superacc.finish(states))
        stacked = torch.stack([states, states, -states])
        assert torch.equal(superacc32.merge(stacked, dim=0), superacc.merge(stacked, dim=0))
        raw = states.clone()  # non-canonical states: the limbs anywhere in int64's range
        raw[:, :17] += torch.randint(-(2**44), 2**44, (4, 17), generator=torch.Generator().manual_seed(n))
        assert torch.equal(superacc32.normalize(raw), superacc.normalize(raw))
        raw[:, 17:] = 0
        assert _same(superacc32.finish(raw), superacc.finish(raw))
        assert _same(superacc32.finish(-raw), superacc.finish(-raw))


def test_scatter_matches_int64() -> None:
    terms = _random_f32((9000, 3), 3)
    index = torch.randint(0, 5, (9000,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(superacc32.scatter(terms, index, 5), generic_exact_sum._scatter(terms, index, 5))


@pytest.mark.parametrize("dim", [0, -1])
def test_fixed_point_sum_matches_int64(dim: int) -> None:
    spread = torch.logspace(-30, 30, 64).repeat(3, 5, 1)
    for t in (torch.nan_to_num(_random_f32((3, 5, 64), 5), nan=1.5), torch.randn(3, 5, 64), spread,
              torch.randn(3, 5, 64) * 1e-40, torch.zeros(3, 5, 64)):
        for keepdim in (False, True):
            assert _same(fixed32.exact_sum(t, dim=dim, keepdim=keepdim), fixed.exact_sum(t, dim=dim, keepdim=keepdim))
    t = torch.randn(3, 5, 64)
    e = fixed.max_exponent(t, -1, keepdim=True) + torch.randint(0, 40, (3, 5, 1))
    assert _same(fixed32.exact_sum(t, e=e, keepdim=True), fixed.exact_sum(t, e=e, keepdim=True))


def test_sqrt_matches_int64() -> None:
    """Random bit patterns (every binade, subnormals, specials), perfect squares (the exact case) and
    the points just around them."""
    squares = (torch.arange(1, 4097, dtype=torch.float32) ** 2)
    near = torch.cat([squares, torch.nextafter(squares, torch.full_like(squares, 1e30)),
                      torch.nextafter(squares, torch.zeros_like(squares))])
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -1.0, 2**-149, 3.4e38])
    for t in (_random_f32((200_000,), 9), near, near * 2**-140, specials):
        a, b = fp32.sqrt_rn(t), sqrt32.sqrt_rn(t)
        assert bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def test_int64_to_f32_and_counts_match_int64() -> None:
    g = torch.Generator().manual_seed(2)
    s = torch.cat([torch.randint(-(2**62), 2**62, (20000,), generator=g),
                   torch.tensor([0, 1, -1, 2**24 + 1, 2**24 + 3, -(2**25) - 2, 2**62 - 1, -(2**62)])])
    mask = torch.rand(7, 33, generator=g) < 0.5
    c = torch.randint(-(2**50), 2**50, (6, 5), generator=g)
    expected = [fp32.int64_to_f32(s).view(torch.int32), mask.sum(), mask.sum(1), mask.sum(1, keepdim=True), c.sum(),
                c.sum(0), c.sum(-1, keepdim=True)]
    with intpath.use_width("int32"):
        got = [fp32.int64_to_f32(s).view(torch.int32), fp32.int_sum(mask), fp32.int_sum(mask, 1),
               fp32.int_sum(mask, 1, True), fp32.int_sum(c), fp32.int_sum(c, 0), fp32.int_sum(c, -1, True)]
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("world", [1, 2, 9000])
def test_all_reduce_matches_int64(world: int) -> None:
    from rlkernel.backends.generic import all_reduce

    g = torch.Generator().manual_seed(world)
    p = torch.randint(-(2**63), 2**63 - 1, (world, 200), generator=g) >> torch.randint(0, 20, (1, 200), generator=g)
    over = all_reduce.overflow_mask(p)
    assert bool(over.any()) or world == 1
    with intpath.use_width("int32"):
        assert torch.equal(all_reduce.overflow_mask(p), over)
        assert torch.equal(all_reduce.all_reduce(p[:, ~over]), p[:, ~over].sum(dim=0))
        assert torch.equal(all_reduce.all_reduce(p, "max"), p.amax(dim=0))


def test_digit_products_and_float_rounding_match_int64() -> None:
    from rlkernel.backends.generic._exact import digits, digits32

    g = torch.Generator().manual_seed(7)
    s = torch.cat([torch.randint(-(2**62), 2**62, (20000,), generator=g) >> torch.randint(0, 62, (20000,), generator=g),
                   torch.tensor([0, 1, -1, 2**24 + 1, 3, -(2**25) - 2, 2**62 - 1, -(2**62), 255, 256, 257])])
    for dtype, view in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16), (torch.float16, torch.int16)):
        for k in (torch.randint(-200, 100, s.shape, generator=g), torch.tensor(-140), torch.tensor(0)):
            expected = fp32.int64_to_float(s, k, dtype).view(view)
            assert torch.equal(digits32.int64_to_float(s, k, dtype).view(view), expected)
    xd = torch.randint(-64, 65, (4, 7, 5000), generator=g).to(torch.float32)
    wd = torch.randint(-64, 65, (3, 5, 5000), generator=g).to(torch.float32)
    assert torch.equal(digits32.int_product(xd, wd), digits.int_product(xd, wd))


def test_switch_routes_the_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(superacc32, "accumulate", lambda t, dim=-1: calls.append("superacc32") or 0)
    monkeypatch.setattr(fixed32, "exact_sum", lambda *a, **k: calls.append("fixed32") or 0)
    t = torch.randn(2, 3)
    superacc.accumulate(t)
    fixed.exact_sum(t)
    assert calls == []
    with intpath.use_width("int32"):
        superacc.accumulate(t)
        fixed.exact_sum(t)
    assert calls == ["superacc32", "fixed32"]
    monkeypatch.setenv(intpath.ENV, "int32")
    assert intpath.width("cpu") == "int32"
    monkeypatch.setenv(intpath.ENV, "int16")
    with pytest.raises(ValueError, match="RLKERNEL_GENERIC_INT"):
        intpath.width("cpu")


def test_probes_pick_int32_limbs_where_int64_is_not_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """A device whose int64 sum goes through float64 (a real detour, not a faked result): the
    ``auto`` width probes it once and picks the int32 limbs; where every int64 probe passes, int64."""
    monkeypatch.setattr(intpath, "_declared", {})
    monkeypatch.setattr(intpath, "_resolved", {})
    monkeypatch.delenv(intpath.ENV, raising=False)
    intpath.set_device_width("cpu", "auto")
    assert intpath.width("cpu") == "int64" and intpath.resolved()["cpu"] == ("int64", "int64 probes pass")

    checks, fn = intpath.INT64_PROBES["int64_sum"]
    calls = []

    def through_float64(t):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:  # the CPU reference run
            return fn(t)
        return (t["i64"].to(torch.float64).sum().to(torch.int64), (t["i64"] >> 2).cumsum(0))

    monkeypatch.setitem(intpath.INT64_PROBES, "int64_sum", (checks, through_float64))
    intpath.set_device_width("cpu", "auto")
    assert intpath.width("cpu") == "int32"
    assert intpath.resolved()["cpu"][1].startswith("int64_sum: fail")
    intpath.set_device_width("cpu", "int64")
    assert intpath.width("cpu") == "int64"


OPS = ["exact_sum", "masked_mean", "masked_mean_backward", "ppo_loss", "group_advantages", "rms_norm",
       "rms_norm_backward", "softmax", "log_softmax", "adamw", "all_reduce", "linear", "token_logprobs"]


def test_conformance_with_int32_limbs_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op whose generic code uses the int32-limb alternatives (sums, ``sqrt_rn``, counts,
    all_reduce, the digit products' combine), forced onto them, with linear on a device's digit
    path: the quick cases bitwise against the references (every op: the command above)."""
    from rlkernel.backends.generic import linear as generic_linear
    from rlkernel.conformance import runner

    monkeypatch.setenv(intpath.ENV, "int32")
    monkeypatch.setattr(generic_linear, "_path", lambda device: "digits")  # a device's path, not the CPU's f64
    config = runner.RunConfig(backend="generic", device="cpu", ops=OPS)
    result = runner.run(config)
    failed = [f"{r.op}/{r.case}: {r.detail}" for r in result.records if r.failed]
    assert result.records and not failed, failed[:5]
    assert {r.op for r in result.records} >= set(OPS)


def test_int64_ops_are_the_documented_ones() -> None:
    """``intpath.INT64_OPS`` (what a device with failed int64 probes refuses) is the generated list
    of docs/generic-primitives.md of ops still running int64 arithmetic with int32 limbs."""
    from rlkernel.conformance import primitives

    _, _, left = primitives.parse_int32((Path(__file__).resolve().parents[1] / "docs" / "generic-primitives.md")
                                        .read_text())
    assert set(left) == set(intpath.INT64_OPS)


def test_ops_needing_int64_refuse_a_device_whose_int64_probes_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a vendor device whose int64 probes failed, an op with an int32-limb formulation runs on the
    limbs, and one without (``linear``) raises an error naming the failed probe instead of
    computing wrong bits; forcing int32 for a test changes nothing of that."""
    from rlkernel.backends.ascend import AscendBackend

    backend = AscendBackend()
    monkeypatch.setattr(intpath, "_declared", {})
    monkeypatch.setattr(intpath, "_resolved", {"cpu": ("int32", "int64_sum: fail output 0 differs")})
    intpath.set_device_width("cpu", "auto")
    monkeypatch.setattr(intpath, "_resolved", {"cpu": ("int32", "int64_sum: fail output 0 differs")})
    x = torch.randn(3, 8).to(torch.bfloat16)
    w = torch.randn(4, 8).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"ascend: linear needs exact int64 arithmetic.*int64_sum: fail"):
        backend.kernel("linear")(x=x, weight=w, bias=None, out_dtype=None)
    out = backend.kernel("rms_norm")(x=x, weight=torch.ones(8, dtype=torch.bfloat16), eps=1e-6)
    assert out.shape == x.shape
    monkeypatch.setattr(intpath, "_resolved", {"cpu": ("int64", "int64 probes pass")})
    assert backend.kernel("linear")(x=x, weight=w, bias=None, out_dtype=None).shape == (3, 4)
