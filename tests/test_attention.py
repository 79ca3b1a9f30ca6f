"""attention / attention_paged: input errors, generic == reference bit for bit (cases and
hypothesis), blocking and paging invariances, the correctly rounded default scale, and accuracy
against float64 (``test_accuracy_*``, the only tests with tolerances)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rlkernel
from rlkernel.backends.generic import attention as gen
from rlkernel.conformance.hashing import first_difference
from rlkernel.contracts import attention as contract
from rlkernel.contracts._gen import from_bits, special_values
from rlkernel.ops.attention import attention, attention_paged

REF = contract.REFERENCES
OPS = {"attention": attention, "attention_paged": attention_paged}


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    # Small GEMMs on a shared 2-core machine run far faster on one thread; bits do not depend on it.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_same_bits(expected: Any, actual: Any) -> None:
    diff = first_difference(expected, actual)
    assert diff is None, diff


def run_public(op: str, **inputs: Any) -> Any:
    return OPS[op](**inputs)


# --------------------------------------------------------------------------- default scale


def _is_rn32_of_inv_sqrt(value: float, d: int) -> bool:
    """Exact check that ``value`` is the fp32 nearest to 1/sqrt(d): the midpoints to its fp32
    neighbours bracket 1/sqrt(d) (compare squares as fractions; 1/sqrt(d) > 0)."""
    x = np.float32(value)
    lo = Fraction(float(np.nextafter(x, np.float32(0)))) if value > 0 else Fraction(0)
    hi = Fraction(float(np.nextafter(x, np.float32(np.inf))))
    mid_lo, mid_hi = (lo + Fraction(value)) / 2, (hi + Fraction(value)) / 2
    target = Fraction(1, d)  # (1/sqrt(d))**2
    below = mid_lo * mid_lo < target or (mid_lo * mid_lo == target and int(x.view(np.int32)) % 2 == 0)
    above = target < mid_hi * mid_hi or (mid_hi * mid_hi == target and int(x.view(np.int32)) % 2 == 0)
    return below and above


def test_default_scale_is_correctly_rounded_and_matches_float64_route() -> None:
    dims = list(range(1, 1025)) + [1536, 2048, 4096, 12288, 65536, 2**20 + 1]
    for d in dims:
        s = contract.default_scale(d)
        assert float(np.float32(s)) == s, d
        assert _is_rn32_of_inv_sqrt(s, d), d
        assert s == float(np.float32(1.0 / math.sqrt(d))), d  # the float64 route agrees here
        assert gen.default_scale(d) == s, d  # the backend's independent host computation


def test_explicit_scale_is_rounded_once_to_fp32() -> None:
    assert contract.resolve_scale(0.1, 64) == float(np.float32(0.1))
    assert contract.resolve_scale(None, 128) == float(np.float32(128**-0.5))


# --------------------------------------------------------------------------- bad inputs


def _small(dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    return contract.make_pack("errors", [(3, 3), (1, 4)], 4, 2, 8, dtype)


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        (lambda i: i.update(q=i["q"].float()), TypeError, "q has dtype float32"),
        (lambda i: i.update(k=i["k"].half()), TypeError, "cast one so they match"),
        (lambda i: i.update(q=i["q"][:, :, None]), ValueError, "expected [Tq, Hq, D]"),
        (lambda i: i.update(q=i["q"][:, :3]), ValueError, "positive multiple"),
        (lambda i: i.update(q=i["q"][:, :0]), ValueError, "positive multiple"),
        (lambda i: i.update(v=i["v"][:, :, :4]), ValueError, "expected equal shapes"),
        (lambda i: i.update(cu_seqlens_q=i["cu_seqlens_q"].float()), TypeError, "cu_seqlens_q has dtype"),
        (lambda i: i.update(cu_seqlens_q=torch.tensor([0, 3, 5], dtype=torch.int32)), ValueError, "[-1] = 5"),
        (lambda i: i.update(cu_seqlens_q=torch.tensor([1, 3, 4], dtype=torch.int32)), ValueError, "expected 0"),
        (lambda i: i.update(cu_seqlens_k=torch.tensor([0, 5, 3, 7], dtype=torch.int32)), ValueError, "[3]"),
        (lambda i: i.update(cu_seqlens_k=torch.tensor([0, 4, 3], dtype=torch.int32)), ValueError, "decreases"),
        (lambda i: i.update(cu_seqlens_k=torch.tensor([0, 2, 7], dtype=torch.int32)), ValueError, "lk >= lq"),
        (lambda i: i.update(scale=float("inf")), ValueError, "not finite"),
        (lambda i: i.update(scale=1e39), ValueError, "not finite in fp32"),
        (lambda i: i.update(scale="0.1"), TypeError, "scale must be"),
        (lambda i: i.update(causal=1), TypeError, "causal must be a bool"),
        (lambda i: i.update(q=[1, 2]), TypeError, "q must be a torch.Tensor"),
    ],
)
def test_attention_rejects_bad_inputs(change: Any, exc: type[Exception], words: str) -> None:
    inputs = _small()
    change(inputs)
    with pytest.raises(exc) as info:
        attention(**inputs)
    assert words in str(info.value), str(info.value)


def test_attention_rejects_more_keys_than_the_exact_sum_bound() -> None:
    n = contract.MAX_KEYS + 1
    k = torch.zeros((n, 1, 1), dtype=torch.bfloat16)
    q = torch.zeros((1, 1, 1), dtype=torch.bfloat16)
    cu_q = torch.tensor([0, 1], dtype=torch.int32)
    cu_k = torch.tensor([0, n], dtype=torch.int64)
    with pytest.raises(ValueError, match="exact-sum bound 4194304"):
        attention(q, k, k, cu_q, cu_k)


def _paged_small() -> dict[str, Any]:
    return contract.to_paged(_small(), 2, "errors")


@pytest.mark.parametrize(
    ("change", "exc", "words"),
    [
        (lambda i: i["block_table"].__setitem__((1, 0), 99), ValueError, "out of range"),
        (lambda i: i["block_table"].__setitem__((0, 1), -3), ValueError, "block_table[0, 1] = -3"),
        (lambda i: i.update(block_table=i["block_table"][:, :1]), ValueError, "widen block_table"),
        (lambda i: i.update(seq_lens_k=torch.tensor([3, -1], dtype=torch.int32)), ValueError, ">= 0"),
        (lambda i: i.update(seq_lens_k=torch.tensor([3], dtype=torch.int32)), ValueError, "seq_lens_k has shape"),
        (lambda i: i.update(k_cache=i["k_cache"][0]), ValueError, "num_blocks, block_size, Hkv, D"),
        (lambda i: i.update(v_cache=i["v_cache"].half()), TypeError, "cast one so they match"),
        (lambda i: i.update(block_table=i["block_table"].float()), TypeError, "block_table has dtype"),
        (lambda i: i.update(seq_lens_k=torch.tensor([2, 4], dtype=torch.int32)), ValueError, "lk >= lq"),
    ],
)
def test_attention_paged_rejects_bad_inputs(change: Any, exc: type[Exception], words: str) -> None:
    inputs = _paged_small()
    change(inputs)
    with pytest.raises(exc) as info:
        attention_paged(**inputs)
    assert words in str(info.value), str(info.value)


def test_unused_block_table_entries_are_not_checked_or_read() -> None:
    inputs = _paged_small()
    table = inputs["block_table"]
    assert int(table[1, -1]) == -1  # the padding entries are -1
    table[0, 2:] = 12345  # beyond the 2 blocks sequence 0 uses
    assert_same_bits(attention(**_small()), attention_paged(**inputs))


# --------------------------------------------------------------------------- generic == reference


def _bit_cases() -> list[Any]:
    return contract.golden_cases() + contract.adversarial_cases()


@pytest.mark.parametrize("case", _bit_cases(), ids=lambda c: c.name)
def test_generic_matches_reference_on_conformance_cases(case: Any) -> None:
    op = case.op or "attention"
    expected = REF[op](**case.make())
    with rlkernel.dispatch.trace() as calls:
        actual = OPS[op](**case.make())
    assert calls and calls[-1][1].endswith(f"attention.{op}"), calls
    assert_same_bits(expected, actual)
    assert actual.is_contiguous()


@st.composite
def problems(draw: Any) -> dict[str, Any]:
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float16]))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.integers(1, 3))
    d = draw(st.sampled_from([1, 3, 8, 16, 33]))
    causal = draw(st.booleans())
    nseq = draw(st.integers(0, 4))
    lens = []
    for _ in range(nseq):
        lq = draw(st.integers(0, 9))
        lk = lq + draw(st.integers(0, 12)) if causal else draw(st.integers(0, 12))
        lens.append((lq, lk))
    tag = draw(st.integers(0, 2**31))
    inputs = contract.make_pack(f"hyp{tag}", lens, hq, hkv, d, dtype,
                                q_std=draw(st.sampled_from([1.0, 4.0, 2.0**-40])),
                                v_std=draw(st.sampled_from([1.0, 2.0**-20, 300.0])))
    inputs["causal"] = causal
    inputs["scale"] = draw(st.sampled_from([None, 0.125, 1.0, 7.3]))
    sv = special_values(dtype)
    for name in ("q", "k", "v"):  # sprinkle specials (±0, ±inf, NaN, subnormals, extremes)
        x = inputs[name]
        for _ in range(draw(st.integers(0, 2))):
            if x.numel():
                flat = draw(st.integers(0, x.numel() - 1))
                x.view(-1)[flat] = sv[draw(st.integers(0, sv.numel() - 1))]
    if draw(st.booleans()) and inputs["v"].shape[0]:  # zero V rows
        inputs["v"][draw(st.integers(0, inputs["v"].shape[0] - 1))] = 0
    return inputs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_generic_matches_reference_on_random_problems(inputs: dict[str, Any]) -> None:
    assert_same_bits(REF["attention"](**inputs), attention(**inputs))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from([1, 3, 16]))
def test_paged_matches_contiguous_on_random_problems(inputs: dict[str, Any], block_size: int) -> None:
    paged = contract.to_paged(inputs, block_size, "hyp_paged")
    assert_same_bits(attention(**inputs), attention_paged(**paged))


# --------------------------------------------------------------------------- invariances


@pytest.mark.parametrize("case", contract.invariance_cases(), ids=lambda c: c.name)
def test_declared_invariances(case: Any) -> None:
    expected, actual = case.check(run_public)
    assert_same_bits(expected, actual)


def test_invariance_cases_cover_every_declared_invariance() -> None:
    assert {c.invariance for c in contract.invariance_cases()} == set(contract.CONTRACT.invariances)


@pytest.mark.parametrize(
    "sizes",
    [
        {"Q_TILE": 1, "KEY_BLOCK": 1, "ROW_BUDGET": 1, "KEY_BUDGET": 1},
        {"Q_TILE": 3, "KEY_BLOCK": 7, "ROW_BUDGET": 9, "KEY_BUDGET": 50, "RED_CHUNK": 5},
        {"Q_TILE": 256, "KEY_BLOCK": 4096, "ROW_BUDGET": 4096, "KEY_BUDGET": 1 << 20},
    ],
)
def test_generic_tile_and_block_sizes_do_not_change_bits(sizes: dict[str, int], monkeypatch: Any) -> None:
    """Split-KV inside the kernel: key blocks of any size add integer partials."""
    inputs = contract.make_pack("tiles", [(7, 7), (1, 40), (5, 30), (0, 3)], 4, 2, 16, torch.bfloat16)
    inputs["v"][5] = 0
    expected = attention(**inputs)
    for name, value in sizes.items():
        monkeypatch.setattr(gen, name, value)
    assert_same_bits(expected, attention(**inputs))


def test_keys_outside_the_allowed_set_never_matter() -> None:
    """Causal: later keys (even NaN/inf) leave earlier query rows alone; other sequences too."""
    inputs = contract.make_pack("future", [(9, 9), (4, 4)], 4, 2, 16, torch.float16)
    base = attention(**inputs)
    poisoned = {**inputs, "k": inputs["k"].clone(), "v": inputs["v"].clone()}
    poisoned["k"][6] = float("nan")
    poisoned["v"][7] = float("inf")
    out = attention(**poisoned)
    assert_same_bits(base[:6], out[:6])  # rows 0-5 of sequence 0 cannot see keys 6, 7
    assert_same_bits(base[9:], out[9:])  # sequence 1 is untouched
    assert torch.isnan(out[7:9]).all()


def test_nan_outputs_are_canonical() -> None:
    inputs = contract.make_pack("canon", [(3, 3)], 2, 1, 8, torch.bfloat16)
    inputs["q"][1, 0, 0] = from_bits([0xFFC1], torch.bfloat16)[0]  # a negative, non-canonical NaN
    out = attention(**inputs)
    assert torch.isnan(out[1, 0]).all()
    assert (out.view(torch.int16)[1, 0] == 0x7FC0).all()


def test_zero_v_rows_do_not_lower_the_grid() -> None:
    """V rows live on relative grids and zero rows take no part in E_i, so scaling V by a power
    of two scales the output exactly -- zero rows included (were a zero row's exponent 0 part of
    E_i, small V rows would lose bits and this would fail)."""
    inputs = contract.make_pack("zero_rows_scaling", [(5, 5), (1, 12)], 4, 2, 16, torch.bfloat16)
    inputs["v"][[1, 3, 8, 9]] = 0
    base = attention(**inputs)
    for e in (-12, -40, 20):
        scaled = {**inputs, "v": (inputs["v"].double() * 2.0**e).to(torch.bfloat16)}
        assert_same_bits((base.double() * 2.0**e).to(torch.bfloat16), attention(**scaled))


# --------------------------------------------------------------------------- accuracy (tolerances)


def _truth64(inputs: dict[str, Any]) -> torch.Tensor:
    q, k, v = inputs["q"].double(), inputs["k"].double(), inputs["v"].double()
    cq = [int(x) for x in inputs["cu_seqlens_q"].tolist()]
    ck = [int(x) for x in inputs["cu_seqlens_k"].tolist()]
    group = q.shape[1] // k.shape[1]
    scale = inputs["scale"] or q.shape[2] ** -0.5
    outs = []
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        qq = q[cq[b]:cq[b + 1]].transpose(0, 1)
        kk = k[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(group, 0)
        vv = v[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(group, 0)
        s = qq @ kk.transpose(1, 2) * scale
        if inputs["causal"]:
            i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
            s = s.masked_fill(j > lk - lq + i, float("-inf"))
        outs.append((torch.softmax(s, -1) @ vv).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_accuracy_against_float64_and_sdpa(dtype: torch.dtype) -> None:
    """rlkernel is at least as accurate as torch SDPA in the same dtype (relative L2 per row),
    and rounds to the correctly rounded result far more often (the full-size measurement: docs/accuracy/README.md)."""
    lens = [(96, 96), (1, 300), (20, 200)]
    inputs = contract.make_pack(f"accuracy_{dtype}", lens, 8, 2, 64, dtype, q_std=1.5, k_std=1.5)
    truth = _truth64(inputs)
    ours = attention(**inputs)
    native = []
    cq, ck = inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()
    for b, (lq, lk) in enumerate(lens):
        qq = inputs["q"][cq[b]:cq[b + 1]].transpose(0, 1)[None]
        kk = inputs["k"][ck[b]:ck[b + 1]].transpose(0, 1)[None]
        vv = inputs["v"][ck[b]:ck[b + 1]].transpose(0, 1)[None]
        mask = torch.arange(lk)[None, :] <= lk - lq + torch.arange(lq)[:, None]
        o = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)
        native.append(o[0].transpose(0, 1))
    theirs = torch.cat(native)

    def row_err(x: torch.Tensor) -> torch.Tensor:
        return (x.double() - truth).norm(dim=-1) / truth.norm(dim=-1)

    ours_err, theirs_err = row_err(ours), row_err(theirs)
    unit = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-11
    assert ours_err.max() <= max(theirs_err.max().item(), 0.5 * unit)
    assert ours_err.mean() <= theirs_err.mean()
    correctly_rounded = (ours.view(torch.int16) == truth.to(dtype).view(torch.int16)).double().mean()
    assert correctly_rounded > 0.95


def test_accuracy_bench_baselines_compute_the_same_function() -> None:
    """The SDPA baselines of the bench cases (given the bench's in-order block layout) agree with
    the op to bf16 accuracy; the declared work formulas are positive and the names unique."""
    hq, hkv, d, bs, b, ctx = 4, 2, 16, 16, 3, 32
    inputs = contract.make_pack("bench_baseline", [(1, ctx)] * b, hq, hkv, d, torch.bfloat16)
    paged = contract.to_paged(inputs, bs, "bench_baseline", spare_blocks=0, table_pad=0)
    order = paged["block_table"].to(torch.int64).reshape(-1)  # lay the blocks out in order, as the bench does
    paged.update(k_cache=paged["k_cache"][order], v_cache=paged["v_cache"][order],
                 block_table=torch.arange(b * ctx // bs, dtype=torch.int32).view(b, ctx // bs))
    ours = attention_paged(**paged).double()
    native = contract._sdpa_paged_decode(**paged).double()
    assert (ours - native).abs().max() <= 2.0**-6

    prefill = contract.make_pack("bench_prefill", [(40, 40)], hq, hkv, d, torch.bfloat16)
    ours = attention(**prefill).double()
    native = contract._sdpa_varlen_prefill(**prefill).double()
    assert (ours - native).abs().max() <= 2.0**-6

    cases = contract.bench_cases()
    assert len({c.name for c in cases}) == len(cases)
    assert all(c.flops > 0 and c.bytes > 0 for c in cases)
