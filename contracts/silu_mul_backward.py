"""The gradients of ``silu_mul`` (v1) in gate and up, bit-exact.

``dgate, dup = silu_mul_backward(grad, gate, up)``, elementwise. The sigmoid is the forward's
own: ``sigma = 1 ÷ RN32(1 + exp_c(-g))`` with the contract exponential (R2), so a backend needs
nothing beyond the forward's exp. The derivative follows PyTorch's ``silu_backward``
(``sigma * (1 + g * (1 - sigma))``) with each step one IEEE rounding; ``dup`` multiplies by the
silu value the forward multiplied (rounded to gate's dtype).
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import round_to
from rlkernel.contracts._exact.transcendental import exp_c
from rlkernel.contracts._gen import from_bits, normal, seed_of, special_values, with_outlier_channels
from rlkernel.contracts.silu_mul import _EXP_PROBES

CONTRACT = Contract(
    name="silu_mul_backward",
    version=1,
    summary=("dgate = RN(RN32(dy*up) * RN32(sig * RN32(1 + RN32(g * RN32(1 - sig))))), "
             "dup = RN(dy * RN(g ÷ den)), sig = RN32(1 ÷ den), den = RN32(1 + exp_c(-g))"),
    invariances=("batch", "permutation", "repeat"),
    dtypes={
        "grad": (torch.bfloat16, torch.float16, torch.float32),
        "gate": (torch.bfloat16, torch.float16, torch.float32),
        "up": (torch.bfloat16, torch.float16, torch.float32),
    },
    parameters={
        "exp_c": "e = exp_c(-g), the contract exponential (P6; every constant is pinned by softmax)",
        "exp_overflow_rule": "exp_c(x) = +inf for x > 89: for g < -89 sig = +0 and dgate = ±0 (or NaN at -inf)",
        "exp_underflow_rule": "exp_c(x) = +0 for x < -104: for g > 104 sig = 1 and the derivative is 1",
        "sigmoid": "den = RN32(1 + e) (the forward's denominator), sig = RN32(1 ÷ den): one IEEE division",
        "derivative": "ds = RN32(sig * RN32(1 + RN32(g * RN32(1 - sig)))): PyTorch's silu_backward order",
        "gate_product": "dgate32 = RN32(RN32(dy * fp32(up)) * ds): dy times up first",
        "up_product": "dup32 = RN32(dy * fp32(s)), s = RN_dtype(RN32(g ÷ den)) the forward's rounded silu",
        "output_rounding": "dgate, dup = RN_dtype(dgate32), RN_dtype(dup32) to gate's dtype, nearest even; NaN "
                           "canonical",
    },
)


def reference(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``y = silu_mul(gate, up)`` (the definition of ``silu_mul_backward``'s bits).

    ``dgate = dy * up * sigma(g) * (1 + g * (1 - sigma(g)))``, ``dup = dy * silu(g)``

    Parameters
    ----------
    grad : Tensor, gate's dtype, [*, I]
        ``dy``, the gradient of the forward's output.
    gate : Tensor, bfloat16/float16/float32, [*, I]
    up : Tensor, gate's dtype, [*, I]

    Returns
    -------
    dgate, dup : Tensor, gate's dtype, [*, I]

    Bitwise semantics
    -----------------
    Elementwise, ``g = fp32(gate)``, ``dy = fp32(grad)``, every fp32 operation one IEEE
    round-to-nearest-even rounding, no FMA:

    1. ``e = exp_c(-g)``; ``den = RN32(1 + e)`` (the forward's); ``sig = RN32(1 ÷ den)``;
    2. ``ds = RN32(sig * RN32(1 + RN32(g * RN32(1 - sig))))``;
    3. ``dgate = RN_dtype(RN32(RN32(dy * fp32(up)) * ds))``;
    4. ``s = RN_dtype(RN32(g ÷ den))`` (the forward's silu); ``dup = RN_dtype(RN32(dy * fp32(s)))``.

    NaN canonical. Special values follow IEEE, as PyTorch's: ``g = +inf`` gives
    ``inf * 0 = NaN`` in step 2, ``g = -inf`` gives ``0 * -inf = NaN``; for g < -89 ``sig = +0``
    and ds is ±0; NaN propagates; ``up = ±inf`` with ``ds = 0`` is NaN.

    Invariances: batch, permutation (elementwise), repeat.

    Contract ``silu_mul_backward`` version 1.
    """
    if gate.numel() == 0:
        return torch.empty(gate.shape, dtype=gate.dtype), torch.empty(gate.shape, dtype=gate.dtype)
    g = gate.to(torch.float32)
    dy = grad.to(torch.float32)
    one = torch.tensor(1.0, dtype=torch.float32)
    den = one + exp_c(-g)
    sig = one / den
    ds = sig * (one + g * (one - sig))
    dgate = (dy * up.to(torch.float32)) * ds
    s = (g / den).to(gate.dtype).to(torch.float32)
    return round_to(dgate, gate.dtype), round_to(dy * s, gate.dtype)


# --------------------------------------------------------------------------- cases


def _inputs(case: str, shape: tuple[int, ...], dtype: torch.dtype, std: float = 2.0,
            grad_std: float = 1.0) -> dict[str, Any]:
    op = "silu_mul_backward"
    return {"grad": normal(seed_of(op, case, "grad"), shape, std=grad_std, dtype=dtype),
            "gate": normal(seed_of(op, case, "gate"), shape, std=std, dtype=dtype),
            "up": normal(seed_of(op, case, "up"), shape, std=1.0, dtype=dtype)}


def golden_cases() -> list[Case]:
    """Qwen3 MLP rows (I = 3072 and 12288) in bf16/fp16/fp32, small widths."""
    specs: list[tuple[str, tuple[int, ...], torch.dtype, bool]] = [
        ("qwen3_8b_bf16", (3, 12288), torch.bfloat16, False),
        ("qwen3_0.6b_fp16", (3, 3072), torch.float16, False),
        ("qwen3_0.6b_fp32", (2, 3072), torch.float32, False),
        ("i1_bf16", (4, 1), torch.bfloat16, False),
        ("i7_fp16", (6, 7), torch.float16, False),
        ("i129_fp32", (3, 129), torch.float32, False),
        ("prefill1024_bf16", (1024, 12288), torch.bfloat16, True),
    ]
    return [Case(name, "golden", lambda n=name, s=shape, d=dt: _inputs(n, s, d), full_only=full)
            for name, shape, dt, full in specs]


def _specials(dtype: torch.dtype) -> dict[str, Any]:
    """Every special value in gate against every one in up, and in grad; the exp_c range edges."""
    sv = special_values(dtype)
    n = sv.numel()
    gate = torch.cat([sv.repeat_interleave(n), sv.repeat_interleave(n)])
    up = torch.cat([sv.repeat(n), torch.ones(n * n, dtype=dtype)])
    grad = torch.cat([torch.ones(n * n, dtype=dtype), sv.repeat(n)])
    edges = torch.tensor([-104.5, -104.0, -103.9, -89.0, -88.9, -88.7, -87.3, -20.0, -17.0, -16.6,
                          -1e-3, 1e-3, 16.6, 17.0, 20.0, 88.7, 89.0, 89.5, 104.0], dtype=torch.float64).to(dtype)
    gate = torch.cat([gate, edges, -edges])
    up = torch.cat([up, torch.ones(2 * edges.numel(), dtype=dtype)])
    grad = torch.cat([grad, torch.ones(2 * edges.numel(), dtype=dtype)])
    return {"grad": grad.reshape(1, -1), "gate": gate.reshape(1, -1), "up": up.reshape(1, -1)}


def _grid_sweep() -> dict[str, Any]:
    """Every bf16 gate in ±[2**-8, 8): many derivative and silu results on bf16 rounding ties."""
    pos = torch.arange(0x3B80, 0x4100, dtype=torch.int32)
    bits = torch.cat([pos, pos | 0x8000]).tolist()
    gate = from_bits(bits, torch.bfloat16)
    up = from_bits([0x3F80 + (i % 128) for i in range(len(bits))], torch.bfloat16)  # 1 + k/128
    grad = from_bits([0x3F80 + ((3 * i) % 128) for i in range(len(bits))], torch.bfloat16)
    return {"grad": grad.reshape(2, -1), "gate": gate.reshape(2, -1), "up": up.reshape(2, -1)}


def _fp32_sweep() -> dict[str, Any]:
    """fp32 gates on a fine grid over [-24, 24] and the forward's exp_c probes: fp32 outputs show
    every rounding of the derivative chain (dy = up = 1)."""
    g = torch.linspace(-24.0, 24.0, 4097, dtype=torch.float64).to(torch.float32)
    probes = from_bits(list(_EXP_PROBES), torch.float32)
    gate = torch.cat([g, probes, -probes]).reshape(1, -1)
    return {"grad": torch.ones_like(gate), "gate": gate, "up": torch.ones_like(gate)}


def _noncontiguous() -> dict[str, Any]:
    """gate and up as column slices of one fused projection output [T, 2 * I] (strided)."""
    fused = normal(seed_of("silu_mul_backward", "noncontiguous"), (9, 400), std=2.0, dtype=torch.bfloat16)
    g = normal(seed_of("silu_mul_backward", "noncontiguous_g"), (200, 9), dtype=torch.bfloat16)
    return {"grad": g.T, "gate": fused[:, :200], "up": fused[:, 200:]}


def adversarial_cases() -> list[Case]:
    """Specials, exp_c edges and probes, grid sweeps, outliers, odd, strided and empty shapes."""
    def outliers(dtype: torch.dtype, tag: str) -> dict[str, Any]:
        d = _inputs(f"outliers_{tag}", (4, 4096), dtype)
        d["gate"] = with_outlier_channels(d["gate"], seed_of("silu_mul_backward", "outliers_ch", tag), count=8,
                                          factor=40.0)
        d["up"] = with_outlier_channels(d["up"], seed_of("silu_mul_backward", "outliers_up", tag), count=8,
                                        factor=100.0 if dtype == torch.float16 else 1000.0)
        return d

    return [
        Case("fp32_sweep_and_exp_probes", "adversarial", _fp32_sweep),
        Case("specials_bf16", "adversarial", lambda: _specials(torch.bfloat16)),
        Case("specials_fp16", "adversarial", lambda: _specials(torch.float16)),
        Case("specials_fp32", "adversarial", lambda: _specials(torch.float32)),
        Case("bf16_grid_sweep", "adversarial", _grid_sweep),
        Case("outliers_bf16", "adversarial", lambda: outliers(torch.bfloat16, "bf16")),
        Case("outliers_fp16", "adversarial", lambda: outliers(torch.float16, "fp16")),
        Case("len1_fp32", "adversarial", lambda: _inputs("len1_fp32", (1, 1), torch.float32)),
        Case("subnormal_gate_fp16", "adversarial",
             lambda: _inputs("subnormal_gate_fp16", (2, 129), torch.float16, std=2.0**-18)),
        Case("subnormal_grad_bf16", "adversarial",
             lambda: _inputs("subnormal_grad_bf16", (2, 129), torch.bfloat16, grad_std=2.0**-130)),
        Case("large_gate_fp32", "adversarial", lambda: _inputs("large_gate_fp32", (3, 129), torch.float32, std=60.0)),
        Case("noncontiguous_bf16", "adversarial", _noncontiguous),
        Case("empty_batch_bf16", "adversarial",
             lambda: {name: torch.empty(0, 64, dtype=torch.bfloat16) for name in ("grad", "gate", "up")}),
        Case("three_d_fp16", "adversarial", lambda: _inputs("three_d_fp16", (2, 3, 65), torch.float16)),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """A row alone vs inside batches; permuted batch; repeated runs."""
    width, op = 4096, "silu_mul_backward"

    def batch(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_batch", (20, width), torch.bfloat16)
        alone = run(op, **{k: t[3:4] for k, t in d.items()})
        inside = []
        for size, pos in ((2, 1), (7, 3), (13, 0), (4, 3)):
            dg, du = run(op, **{k: t[3 - pos:3 - pos + size] for k, t in d.items()})
            inside.append((dg[pos:pos + 1], du[pos:pos + 1]))
        return [alone] * len(inside), inside

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_perm", (9, width), torch.float16)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        dg, du = run(op, **d)
        return (dg[perm], du[perm]), run(op, **{k: t[perm] for k, t in d.items()})

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _inputs("inv_repeat", (33, width), torch.bfloat16)
        first = run(op, **d)
        return [first, first], [run(op, **d) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch),
        InvarianceCase("permuted_batch", "permutation", permutation),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_autograd(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch autograd of Hugging Face's ``act_fn(gate) * up`` in the inputs' dtype: the native baseline."""
    with torch.enable_grad():
        gl, ul = gate.detach().requires_grad_(True), up.detach().requires_grad_(True)
        y = torch.nn.functional.silu(gl) * ul
        dg, du = torch.autograd.grad(y, (gl, ul), grad)
    return dg, du


def bench_cases() -> list[BenchCase]:
    """MLP activations, bf16. large: Qwen3-8B, T in 64, 2048 rows of 12288; small: Qwen3-0.6B, 64 rows of 3072."""
    cases = []
    shapes = [("qwen3_8b", 12288, "large", t) for t in (64, 2048)] + [("qwen3_0.6b", 3072, "small", 64)]
    for model, width, size, rows in shapes:

        def make(device: torch.device, t: int = rows, width: int = width) -> dict[str, Any]:
            gen = torch.Generator(device=device).manual_seed(t)
            gate = (2.0 * torch.randn(t, width, generator=gen, device=device)).to(torch.bfloat16)
            up = torch.randn(t, width, generator=gen, device=device).to(torch.bfloat16)
            g = torch.randn(t, width, generator=gen, device=device).to(torch.bfloat16)
            return {"grad": g, "gate": gate, "up": up}

        cases.append(BenchCase(
            name=f"{model}_T{rows}_bf16",
            make=make,
            native=torch_autograd,
            flops=12.0 * rows * width,  # exp, sigmoid, derivative chain, two products
            bytes=2.0 * 5 * rows * width,  # read dy, gate, up; write dgate, dup (bf16)
            sizes=(size,),
        ))
    return cases
