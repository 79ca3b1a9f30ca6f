"""Host constants (R8) the product computes itself: RoPE tables and the attention default scale.

The product never imports the reference (docs/design.md): these are second implementations, checked
here against the contract's and against high-precision math, and conformance cases pin their
bits, so a product-side mistake fails the suite (shown here by planting one).
"""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

import rlkernel.ops as ops
from rlkernel.contracts import attention as c_attention
from rlkernel.contracts import rope as c_rope
from rlkernel.ops.rope import clear_table_cache

tables = importlib.import_module("rlkernel.ops._rope_tables")
attention_module = importlib.import_module("rlkernel.ops.attention")


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, np.float32).view(np.int32), np.asarray(b, np.float32).view(np.int32))


CONFIGS = [
    (np.arange(3000), 128, 1e6),
    (np.arange((1 << 24) - 2000, 1 << 24), 128, 1e6),
    (np.random.default_rng(0).integers(0, 1 << 24, 3000), 64, 10000.0),
    (np.arange(2000), 14, 1e6),
    (np.arange(2000), 8, 0.5),
    (np.random.default_rng(1).integers(0, 1 << 24, 500), 12, 0.01),
    (np.random.default_rng(2).integers(0, 1 << 24, 500), 16, 1e30),
    (np.arange(500), 2, 1.0),
]


@pytest.mark.parametrize(("positions", "head_dim", "theta"), CONFIGS,
                         ids=[f"D{d}_theta{t:g}_{p.size}" for p, d, t in CONFIGS])
def test_product_tables_equal_the_contracts(positions: np.ndarray, head_dim: int, theta: float) -> None:
    cos, sin = tables.table_rows(positions, head_dim, theta)
    ref_cos, ref_sin = c_rope.table_rows(positions, head_dim, theta)
    assert _same_bits(cos, ref_cos.numpy()) and _same_bits(sin, ref_sin.numpy())


def test_midpoint_hard_rows_are_correctly_rounded() -> None:
    """The conformance rows nearest an fp32 midpoint, against mpmath at 80 digits rounded to 24 bits."""
    for (head_dim, theta), positions in c_rope.MIDPOINT_HARD.items():
        cos, sin = tables.table_rows(np.array(positions), head_dim, theta)
        with mpmath.workdps(80):
            for k, p in enumerate(positions):
                for i in range(head_dim // 2):
                    angle = p * mpmath.mpf(theta) ** (mpmath.mpf(-2 * i) / head_dim)
                    for table, fn in ((cos, mpmath.cos), (sin, mpmath.sin)):
                        value = fn(angle)
                        with mpmath.workprec(24):
                            assert float(table[k, i]) == float(+value), (head_dim, theta, p, i)


def test_fast_path_error_stays_inside_its_bound() -> None:
    """The float64 fast path against mpmath: the error must stay below the bound B it claims."""
    rng = np.random.default_rng(3)
    worst = 0.0
    for head_dim, theta in ((128, 1e6), (64, 10000.0), (8, 0.5)):
        positions = np.concatenate([rng.integers(0, 1 << 24, 60), rng.integers(1, 64, 10)])
        cos, sin, absolute = tables._fast(positions, tables._pieces(head_dim, theta))
        with mpmath.workdps(50):
            for r, p in enumerate(positions):
                for i in rng.integers(0, head_dim // 2, 3):
                    angle = int(p) * mpmath.mpf(theta) ** (mpmath.mpf(-2 * int(i)) / head_dim)
                    for y, fn in ((cos[r, i], mpmath.cos), (sin[r, i], mpmath.sin)):
                        bound = tables._REL_BOUND * abs(y) + absolute[r, i]
                        worst = max(worst, float(abs(mpmath.mpf(float(y)) - fn(angle)) / bound))
    assert worst < 0.25, f"fast-path error reached {worst:.3f} of its bound (a margin of 4 is claimed)"


def test_slow_path_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a huge bound about one entry in eight takes the decimal slow path: bits unchanged."""
    positions = np.arange(0, 4000, 7)
    fast = tables.table_rows(positions, 8, 1e6)
    monkeypatch.setattr(tables, "_REL_BOUND", 2.0**-20)
    slow = tables.table_rows(positions, 8, 1e6)
    assert _same_bits(fast[0], slow[0]) and _same_bits(fast[1], slow[1])


def test_rope_table_rows_is_public_and_matches_rope_tables() -> None:
    cos, sin = ops.rope_tables(300, 16, 1e4)
    positions = torch.tensor([299, 0, 17, 17, 5], dtype=torch.int32)
    rows = ops.rope_table_rows(positions, 16, 1e4)
    assert torch.equal(rows[0].view(torch.int32), cos[positions.long()].view(torch.int32))
    assert torch.equal(rows[1].view(torch.int32), sin[positions.long()].view(torch.int32))
    with pytest.raises(ValueError, match=r"positions span \[0, 16777216\]"):
        ops.rope_table_rows(torch.tensor([0, 1 << 24]), 16)
    with pytest.raises(TypeError, match="positions has dtype float32"):
        ops.rope_table_rows(torch.zeros(2), 16)


def test_default_scale_equals_the_contracts_and_is_correctly_rounded() -> None:
    dims = list(range(1, 5000)) + [4**k for k in range(13, 40)] + [3 * 4**k for k in range(10, 30)] + [(1 << 61) - 1]
    for d in dims:
        assert attention_module.default_scale(d) == c_attention.default_scale(d), d
    for d in (3, 80, 96, 128, 192, 576, (1 << 61) - 1):  # exact check: the two midpoints bracket 1/sqrt(D)
        s = np.float32(attention_module.default_scale(d))
        low = (Fraction(float(s)) + Fraction(float(np.nextafter(s, np.float32(0))))) / 2
        high = (Fraction(float(s)) + Fraction(float(np.nextafter(s, np.float32(1))))) / 2
        assert low * low * d < 1 < high * high * d, d
    assert attention_module.default_scale(64) == 0.125 and attention_module.default_scale(128) != 1 / math.sqrt(128)


# --------------------------------------------------------------------------- conformance catches the product


def _run_conformance(op: str, cases: list[str]) -> dict[str, str]:
    from rlkernel.conformance import runner

    result = runner.run(runner.RunConfig(backend="cpu", device="cpu", ops=[op], cases=cases, static=False))
    assert {r.case for r in result.records} == set(cases)
    return {r.case: r.status for r in result.records}


def test_conformance_fails_a_product_table_that_skips_its_slow_path(monkeypatch: pytest.MonkeyPatch) -> None:
    cases = ["rows_midpoint_hard_d128", "tables_qwen3_d128_4096"]
    assert set(_run_conformance("rope", cases).values()) == {"pass"}
    monkeypatch.setattr(tables, "_REL_BOUND", 0.0)  # the mistake: trust float64 everywhere
    monkeypatch.setattr(tables, "_ABS_BOUND_REDUCED", 0.0)
    monkeypatch.setattr(tables, "_ABS_FLOOR", 0.0)
    clear_table_cache()
    try:
        statuses = _run_conformance("rope", cases)
    finally:
        clear_table_cache()
    # entries (2913351, 35) and (4801219, 47) of the midpoint-hard rows round wrongly in float64
    assert statuses["rows_midpoint_hard_d128"] == "fail", statuses


@pytest.mark.parametrize("toward", [0.0, 1.0], ids=["one_ulp_down", "one_ulp_up"])
def test_conformance_fails_a_product_default_scale_one_ulp_off(monkeypatch: pytest.MonkeyPatch, toward: float) -> None:
    cases = ["prefill_h8_2_d128_fp16", "prefill_h4_2_d64_bf16"]  # scale=None at D = 128 and 64
    assert set(_run_conformance("attention", cases).values()) == {"pass"}
    right = attention_module.default_scale
    monkeypatch.setattr(attention_module, "default_scale",
                        lambda d: float(np.nextafter(np.float32(right(d)), np.float32(toward))))
    # each wrong scale is caught (at D = 128 or 64: a one-ulp score change may round away in a half output)
    assert "fail" in _run_conformance("attention", cases).values()


def test_the_product_never_loads_the_reference() -> None:
    """Importing and running the product (ops, rl, registry, CLI module) loads no rlkernel.contracts module."""
    code = (
        "import sys, torch, rlkernel, rlkernel.ops as ops, rlkernel.rl, rlkernel.cli, rlkernel.distributed\n"
        "from rlkernel import registry\n"
        "registry.all_backends()\n"
        "x = torch.ones(3, 2, 8, dtype=torch.bfloat16)\n"
        "ops.rope(x, torch.tensor([0, 5, 1 << 20]))\n"
        "ops.attention(x, x, x, torch.tensor([0, 3]), torch.tensor([0, 3]))\n"
        "ops.rope_tables(10, 8)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('rlkernel.contracts'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
