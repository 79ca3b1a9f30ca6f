"""SwiGLU's gate: ``y = silu(gate) * up`` with the contract exponential, bit-exact.

The order follows Hugging Face's Qwen3 MLP (``act_fn(gate_proj(x)) * up_proj(x)`` in the
activation dtype): silu is computed in fp32 and rounded to the input dtype, then multiplied
by ``up``. ``exp`` is the contract's ``exp_c`` (R2), never a math library.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import round_to
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import from_bits, normal, seed_of, special_values, with_outlier_channels

CONTRACT = Contract(
    name="silu_mul",
    version=1,
    summary="y = RN(fp32(RN(g ÷ (1 + exp_c(-g)))) * fp32(up)), g = fp32(gate)",
    invariances=("batch", "permutation", "repeat"),
    dtypes={
        "gate": (torch.bfloat16, torch.float16, torch.float32),
        "up": (torch.bfloat16, torch.float16, torch.float32),
    },
    parameters={
        "exp_c": "e = exp_c(-g), the contract exponential (P6; every constant is pinned by softmax)",
        "exp_overflow_rule": "exp_c(x) = +inf for x > 89, so silu(g) = -0 for g < -89",
        "exp_underflow_rule": "exp_c(x) = +0 for x < -104, so silu(g) = g for g > 104",
        "silu_division": "s32 = RN32(g ÷ RN32(1 + e)), one IEEE division (not g * RN(1 / (1 + e)))",
        "s_rounding": "s32 rounded to gate's dtype, nearest even, before the product with up",
        "output_rounding": "y = RN(fp32(s) * fp32(up)) to gate's dtype, nearest even (overflow to inf)",
    },
)


def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise (the definition of ``silu_mul``'s bits).

    ``s = RN_dtype(g ÷ (1 + exp_c(-g)))``, ``y = RN_dtype(fp32(s) * fp32(up))``, ``g = fp32(gate)``.

    Parameters
    ----------
    gate : Tensor, bfloat16/float16/float32, [*, I]
        The gate projection (``x @ W_gate.T``).
    up : Tensor, gate's dtype, [*, I] (gate's shape)
        The up projection (``x @ W_up.T``).

    Returns
    -------
    Tensor, gate's dtype, [*, I]

    Bitwise semantics
    -----------------
    Elementwise; every fp32 operation one IEEE round-to-nearest-even rounding, no FMA:

    1. ``g = fp32(gate)``; ``e = exp_c(-g)`` (the contract exponential, P6);
    2. ``den = RN32(1 + e)``; ``s32 = RN32(g ÷ den)`` (IEEE division, not a reciprocal);
    3. ``s = RN_dtype(s32)`` (no rounding for fp32);
    4. ``y = RN_dtype(RN32(fp32(s) * fp32(up)))``; NaN canonical.

    Special values follow from the formula: ``silu(+inf) = +inf``; ``silu(-inf)`` is
    ``-inf ÷ inf = NaN`` (PyTorch's ``x * sigmoid(x)`` gives NaN there too); for g < -89
    ``exp_c(-g) = +inf`` and silu is ``-0`` (the true value is below 1e-37); NaN propagates;
    ``silu(±0) = ±0``. ``up = ±inf`` times ``s = 0`` is NaN.

    Invariances: batch, permutation (elementwise), repeat.

    Contract ``silu_mul`` version 1.
    """
    if gate.numel() == 0:
        return torch.empty(gate.shape, dtype=gate.dtype)
    g = gate.to(torch.float32)
    one = torch.tensor(1.0, dtype=torch.float32)
    s = g / (one + exp_c(-g))
    if gate.dtype != torch.float32:
        s = s.to(gate.dtype).to(torch.float32)
    return round_to(s * up.to(torch.float32), gate.dtype)


# --------------------------------------------------------------------------- cases

#: Qwen3-8B intermediate size.
QWEN3_8B_INTERMEDIATE = 12288


def _inputs(case: str, shape: tuple[int, ...], dtype: torch.dtype, std: float = 2.0) -> dict[str, Any]:
    gate = normal(seed_of("silu_mul", case, "gate"), shape, std=std, dtype=dtype)
    up = normal(seed_of("silu_mul", case, "up"), shape, std=1.0, dtype=dtype)
    return {"gate": gate, "up": up}


def golden_cases() -> list[Case]:
    """Qwen3-8B MLP rows (I = 12288) in bf16/fp16/fp32, and small widths 1, 7, 129, 1000."""
    specs: list[tuple[str, tuple[int, ...], torch.dtype, bool]] = [
        ("qwen3_8b_bf16", (5, QWEN3_8B_INTERMEDIATE), torch.bfloat16, False),
        ("qwen3_8b_fp16", (3, QWEN3_8B_INTERMEDIATE), torch.float16, False),
        ("qwen3_8b_fp32", (2, QWEN3_8B_INTERMEDIATE), torch.float32, False),
        ("i1_bf16", (4, 1), torch.bfloat16, False),
        ("i7_fp16", (6, 7), torch.float16, False),
        ("i129_fp32", (3, 129), torch.float32, False),
        ("i1000_bf16", (4, 1000), torch.bfloat16, False),
        ("prefill2048_bf16", (2048, QWEN3_8B_INTERMEDIATE), torch.bfloat16, True),
    ]
    return [Case(name, "golden", lambda n=name, s=shape, d=dt: _inputs(n, s, d), full_only=full)
            for name, shape, dt, full in specs]


def _specials(dtype: torch.dtype) -> dict[str, Any]:
    """Every pairing of the special values in gate and up, plus the exp_c range edges."""
    sv = special_values(dtype)
    n = sv.numel()
    gate = sv.repeat_interleave(n)
    up = sv.repeat(n)
    # gate values around the exp_c cut-offs and where 1 + exp(-g) rounds to 1
    edges = torch.tensor([-104.5, -104.0, -103.9, -89.0, -88.9, -88.7, -87.3, -20.0, -17.0, -16.6,
                          -1e-3, 1e-3, 16.6, 17.0, 20.0, 88.7, 89.0, 89.5, 104.0], dtype=torch.float64)
    edges = edges.to(dtype)
    gate = torch.cat([gate, edges, -edges])
    up = torch.cat([up, torch.ones(2 * edges.numel(), dtype=dtype)])
    return {"gate": gate.reshape(1, -1), "up": up.reshape(1, -1)}


def _ties_bf16() -> dict[str, Any]:
    """Every bf16 gate in [-8, 8): all silu results, many ending on bf16 rounding ties."""
    # positive bf16 values 2**-8 .. 8 and their negatives: a sweep of the bf16 grid
    pos = torch.arange(0x3B80, 0x4100, dtype=torch.int32)
    bits = torch.cat([pos, pos | 0x8000]).tolist()
    gate = from_bits(bits, torch.bfloat16)
    up = from_bits([0x3F80 + (i % 128) for i in range(len(bits))], torch.bfloat16)  # 1 + k/128
    return {"gate": gate.reshape(2, -1), "up": up.reshape(2, -1)}


def _noncontiguous() -> dict[str, Any]:
    """gate and up as column slices of one fused projection output ``[T, 2 * I]`` (strided)."""
    fused = normal(seed_of("silu_mul", "noncontiguous"), (9, 2 * 200), std=2.0, dtype=torch.bfloat16)
    return {"gate": fused[:, :200], "up": fused[:, 200:]}


#: fp32 gates at which a one-ulp change of an exp_c constant (Q4 either way, Q3, log2e, ln2_lo)
#: changes silu(g) in fp32, found by a search of the arguments -g with |r| near ln2 / 2 (e**-g
#: is then not absorbed by the 1 in the denominator: g < 0).
_EXP_PROBES = (0xBEB0330F, 0xBFDEA691, 0xBF83C3F2, 0xC0A7BA0A, 0xBEB0B381, 0xC073FCE0, 0xC14214C9, 0xC201F689,
               0xC201F7B3)


def _pin_exp() -> dict[str, Any]:
    """exp_c pinned through silu: the probe gates in fp32, up = 1 (so y is silu(g) itself)."""
    gate = from_bits(list(_EXP_PROBES), torch.float32).reshape(1, -1)
    return {"gate": gate, "up": torch.ones_like(gate)}


def adversarial_cases() -> list[Case]:
    """exp_c probes; specials in every combination, exp_c edges, bf16 grid sweep, outliers, odd and empty shapes."""
    def outliers(dtype: torch.dtype, tag: str) -> dict[str, Any]:
        d = _inputs(f"outliers_{tag}", (4, 4096), dtype)
        d["gate"] = with_outlier_channels(d["gate"], seed_of("silu_mul", "outliers_ch", tag), count=8, factor=40.0)
        d["up"] = with_outlier_channels(d["up"], seed_of("silu_mul", "outliers_up", tag), count=8,
                                        factor=100.0 if dtype == torch.float16 else 1000.0)
        return d

    cases = [Case("pin_exp_fp32", "adversarial", _pin_exp)]
    cases += [
        Case(f"specials_{tag}", "adversarial", lambda d=dt: _specials(d))
        for tag, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32))
    ]
    cases += [
        Case("bf16_grid_sweep", "adversarial", _ties_bf16),
        Case("outliers_bf16", "adversarial", lambda: outliers(torch.bfloat16, "bf16")),
        Case("outliers_fp16", "adversarial", lambda: outliers(torch.float16, "fp16")),
        Case("len1_fp32", "adversarial", lambda: _inputs("len1_fp32", (1, 1), torch.float32)),
        Case("len17_bf16", "adversarial", lambda: _inputs("len17_bf16", (3, 17), torch.bfloat16)),
        Case("subnormal_gate_fp16", "adversarial",
             lambda: _inputs("subnormal_gate_fp16", (2, 129), torch.float16, std=2.0**-18)),
        Case("large_gate_fp32", "adversarial", lambda: _inputs("large_gate_fp32", (3, 129), torch.float32, std=60.0)),
        Case("noncontiguous_bf16", "adversarial", _noncontiguous),
        Case("empty_batch_bf16", "adversarial",
             lambda: {"gate": torch.empty(0, 64, dtype=torch.bfloat16),
                      "up": torch.empty(0, 64, dtype=torch.bfloat16)}),
        Case("three_d_fp16", "adversarial", lambda: _inputs("three_d_fp16", (2, 3, 65), torch.float16)),
    ]
    return cases


def invariance_cases() -> list[InvarianceCase]:
    """A row alone vs inside batches; permuted batch; repeated runs."""
    width = 4096

    def batch(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_batch", (20, width), torch.bfloat16)
        alone = run("silu_mul", gate=d["gate"][3:4], up=d["up"][3:4])
        got = [run("silu_mul", gate=d["gate"][3 - pos:3 - pos + size], up=d["up"][3 - pos:3 - pos + size])[pos:pos + 1]
               for size, pos in ((2, 1), (7, 3), (13, 0), (4, 3))]
        return [alone] * len(got), got

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_perm", (9, width), torch.float16)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run("silu_mul", **d)[perm], run("silu_mul", gate=d["gate"][perm], up=d["up"][perm])

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_repeat", (33, width), torch.bfloat16)
        first = run("silu_mul", **d)
        return [first, first], [run("silu_mul", **d) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch),
        InvarianceCase("permuted_batch", "permutation", permutation),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def _native(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Hugging Face ``Qwen3MLP``: ``act_fn(gate) * up`` in the activation dtype."""
    return torch.nn.functional.silu(gate) * up


def bench_cases() -> list[BenchCase]:
    """MLP activations, bf16. large: Qwen3-8B, T in 1, 64, 2048, 8192 rows of I = 12288; small:
    Qwen3-0.6B, T in 1, 64 rows of I = 3072."""
    cases = []
    shapes = [("qwen3_8b", QWEN3_8B_INTERMEDIATE, "large", t) for t in (1, 64, 2048, 8192)]
    shapes += [("qwen3_0.6b", 3072, "small", t) for t in (1, 64)]
    for model, width, size, rows in shapes:

        def make(device: torch.device, t: int = rows, width: int = width) -> dict[str, Any]:
            g = torch.Generator(device=device).manual_seed(t)
            gate = (2.0 * torch.randn(t, width, generator=g, device=device)).to(torch.bfloat16)
            up = torch.randn(t, width, generator=g, device=device).to(torch.bfloat16)
            return {"gate": gate, "up": up}

        cases.append(BenchCase(
            name=f"{model}_T{rows}_bf16",
            make=make,
            native=_native,
            flops=5.0 * rows * width,  # negate, exp, add, divide, multiply (exp counted once)
            bytes=2.0 * 3 * rows * width,  # read gate and up, write y (bf16)
            sizes=(size,),
            graph=rows <= 64,
        ))
    return cases
