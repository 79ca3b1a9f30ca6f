"""The CUDA backend's Triton kernels under the Triton interpreter, bitwise against the reference.

``TRITON_INTERPRET=1`` must be set before ``triton.jit`` decorates a kernel, so the kernels run
in child processes: when collection ends, tests/conftest.py starts two ``python
tests/test_cuda_interpreter.py`` children with the variable set (the ops dealt between them), which
run beside the rest of the suite while this module's tests wait at the end of the run; each child
runs its checks and writes JSON; each pytest test asserts on one op's share of it. (Run the file
under ``TRITON_INTERPRET=1 pytest`` and the checks run in-process instead.)

What runs, per op with a CUDA kernel: every non-``full_only`` golden and adversarial case of
its contract that is small enough for the interpreter (:data:`MAX_WORK`), through the public
op with the ``cuda`` backend forced onto CPU tensors, compared on bytes with the contract's
``reference``; and its invariance cases (both sides through the CUDA kernels). Larger cases are
listed as skipped with the reason. Plus the primitives (exp_c, log_c, P1-P3, P4 quantisation,
casts, 21-bit digits) on random bit patterns against ``rlkernel.contracts._exact``, and
``small_tiles``: the golden cases again with tiny row blocks and 16x16x32 GEMM tiles (multi-tile
loops, more vocabulary ranges, 16-query x 32-key attention tiles, one key tile per
``attention_paged`` split), and the small ``sample`` cases with 8-token split tiles (many programs
per row), which must not move a bit; ``small_split``: softmax's split rows with chunks of several
tiles, and embedding's id check; ``small_split_fused``: the same rows on the one-launch split
(``FUSED_SPLIT``: ordered work items, batches of rows); and ``attention_paged_splits``: every
``attention_paged`` case and invariance with one key tile per split and the scores recomputed in
pass 2 (many programs per sequence merged by integer atomics); ``attention_chunks``: prefill on
the chunked fp64 path (``F64_KEYS`` shrunk to 64 keys) against the generic backend, at 32- and
16-row blocks; ``small_tiles_<op>`` for the RL
reductions (2 x 16 tiles: many programs merged by int64 atomics).

Interpreter limits (docs/cuda-backend.md, "Verification"), and how the kernels avoid them: bf16
``tl.dot`` is wrong in it (the kernels only ``tl.dot`` int8 digits, exact in numpy int32, and attention's fp64
integers below 2**53, exact in numpy float64); its fma rounds twice (no
kernel uses fma: contraction is off and the static checks forbid it); casts may truncate (every
rounding cast here is integer bit arithmetic, or fp32 -> fp16, which numpy rounds to nearest
even). The interpreter checks indexing, masking and the arithmetic sequence; the GPU run
(tests/test_cuda_gpu.py, tools/device_run.sh) is the proof on hardware.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

INNER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ROOT = Path(__file__).resolve().parents[1]

#: largest case the interpreter runs, in "work" units: elements for elementwise/row ops,
#: multiply-adds for matmul-like ops (linear, token_logprobs, attention)
MAX_WORK = {"default": 1 << 20, "linear": 1 << 22, "token_logprobs_backward": 1 << 18, "token_logprobs": 1 << 21,
            "token_entropy_backward": 1 << 21, "token_entropy": 1 << 21,
            "attention": 1 << 21}
#: interpreter work of one weight row in token_logprobs_backward (its exponent and digit kernels run
#: one program per row, ~1 ms each there: the 66k-70k vocabulary cases take minutes)
ROW_WORK = 64
#: invariance cases left to the GPU run (the interpreter takes 10-33 s each; the same kernel path runs in
#: the module's other cases: tp2_vocab_shards for the shards, the golden cases for the rest)
INTERPRETER_SKIP = {
    "token_logprobs_backward": ("tp4_vocab_shards", "reduction_order_hidden", "batch_row_alone_vs_in_7"),
    "rms_norm_backward": ("repeat",),
    # 12-27 s each; the golden and adversarial cases run the same rows kernel and logits GEMM
    "token_entropy_backward": ("batch_row_alone_vs_in_7", "permutation_tokens", "repeat"),
    "token_entropy": ("chunking_4_1_4", "prefill6_decode3", "batch_row_alone_vs_in_7", "permutation_batch", "repeat"),
}
#: child-process time limit (seconds)
CHILD_TIMEOUT = 3600


# --------------------------------------------------------------------------------------------
# helpers used in the child (interpreter) process
# --------------------------------------------------------------------------------------------


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        res: list[torch.Tensor] = []
        for o in out:
            res.extend(_flat(o))
        return res
    if isinstance(out, dict):
        return _flat(list(out.values()))
    return [torch.tensor(out)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()
    if t.is_floating_point():
        width = torch.finfo(t.dtype).bits
        return t.contiguous().view({64: torch.int64, 32: torch.int32, 16: torch.int16}[width])
    return t


def compare(expected: Any, actual: Any) -> str | None:
    """None when bitwise equal, else the first difference in hex."""
    e, a = _flat(expected), _flat(actual)
    if len(e) != len(a):
        return f"{len(e)} outputs expected, got {len(a)}"
    for i, (x, y) in enumerate(zip(e, a)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {i}: expected {x.dtype}{tuple(x.shape)}, got {y.dtype}{tuple(y.shape)}"
        bx, by = _bits(x).reshape(-1), _bits(y).reshape(-1)
        diff = (bx != by).nonzero()
        if diff.numel():
            j = int(diff[0])
            n = int(diff.numel())
            return (f"output {i}: {n} of {bx.numel()} differ; first at flat index {j}: expected "
                    f"{x.reshape(-1)[j].item()!r} ({int(bx[j]) & 0xFFFFFFFFFFFFFFFF:#x}), got "
                    f"{y.reshape(-1)[j].item()!r} ({int(by[j]) & 0xFFFFFFFFFFFFFFFF:#x})")
    return None


def _work(op: str, inputs: dict[str, Any]) -> int:
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor)]
    if op in ("linear", "linear_partial", "token_logprobs", "token_logprobs_partial", "token_entropy"):
        x = inputs.get("x", inputs.get("hidden"))
        w = inputs.get("weight", inputs.get("w"))
        if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor):
            return x.numel() * w.shape[0]
    if op in ("token_logprobs_backward", "token_logprobs_backward_partial", "token_entropy_backward"):
        x = inputs.get("hidden")
        w = inputs.get("weight", inputs.get("weight_shard"))
        if isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor):
            return x.numel() * w.shape[0] + ROW_WORK * w.shape[0]
    if op.startswith("attention"):
        q = inputs.get("q")
        k = inputs.get("k", inputs.get("k_cache"))
        if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor):
            return q.numel() * max(1, k.shape[0])
    return sum(t.numel() for t in tensors)


def _limit(op: str) -> int:
    for key, value in MAX_WORK.items():
        if op.startswith(key):
            return value
    return MAX_WORK["default"]


def _xor_sum_in_numpy() -> None:
    """Make the interpreter's ``xor_sum`` one numpy reduction. The interpreter runs a reduction with a
    combine function one element at a time in Python, and ``tl.sort`` swaps its keys with ``xor_sum``:
    a 2048-key sort took ~14 s (``sample``'s register tile). ``np.bitwise_xor.reduce`` gives the same
    bits; every other reduction keeps the interpreter's own code."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as ti

    xor_combine = getattr(tl.standard, "_xor_combine", None)
    reduce_ops = getattr(ti, "ReduceOps", None)  # a Triton without these keeps its own reduction
    if xor_combine is None or reduce_ops is None or getattr(reduce_ops.apply_impl, "xor_in_numpy", False):
        return
    original = reduce_ops.apply_impl

    def apply_impl(self: Any, input: Any) -> Any:
        if self.combine_fn is xor_combine:
            x = input[0]
            return self.to_tensor(np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims),
                                  x.dtype)
        return original(self, input)

    apply_impl.xor_in_numpy = True  # type: ignore[attr-defined]
    reduce_ops.apply_impl = apply_impl


def force_cuda_backend_on_cpu() -> None:
    """Let the ``cuda`` backend serve CPU tensors in this (interpreter) process."""
    from rlkernel import registry

    _xor_sum_in_numpy()
    backend = registry.get_backend("cuda")
    backend.device_types = ("cuda", "cpu")  # type: ignore[misc]
    registry._probes["cuda"] = (True, "Triton interpreter on the CPU (test)")


def run_op_checks(contract_module: str, golden_only: bool = False, limit_scale: float = 1.0,
                  skip_invariance: bool = False, only_op: str | None = None,
                  also_invariances: tuple[str, ...] = (), select: Any = None) -> list[dict[str, Any]]:
    """Every small case of one contract module through the CUDA kernels vs the reference; with
    ``only_op``, the cases of that op and the invariance checks of kinds ``also_invariances``; with
    ``select``, only the bit cases whose name it accepts, and no invariance case."""
    from rlkernel.backends.cuda import KERNELS
    from rlkernel.conformance.cases import bit_cases, invariance_cases, op_of, reference_of
    from rlkernel.dispatch import trace, use_backend
    from rlkernel.public import public_op

    module = __import__(f"rlkernel.contracts.{contract_module}", fromlist=["CONTRACT"])
    results = []

    def run(op_name: str, /, **inputs: Any) -> Any:
        with use_backend("cuda"), trace() as calls:
            out = public_op(op_name)(**inputs)
        kernels = {k for _, k in calls}
        if not all(k.startswith("cuda:") for k in kernels):
            raise AssertionError(f"a non-cuda kernel ran: {kernels}")
        return out

    for case in bit_cases(module, full=False):
        op = op_of(module, case)
        rec: dict[str, Any] = {"case": case.name, "op": op, "kind": case.kind}
        if (golden_only and case.kind != "golden") or (only_op is not None and op != only_op):
            continue
        if select is not None and not select(case.name):
            continue
        if op not in KERNELS:
            rec.update(status="skip", detail=f"no CUDA kernel for {op}")
            results.append(rec)
            continue
        inputs = case.make()
        work = _work(op, inputs)
        limit = int(_limit(op) * limit_scale)
        if work > limit:
            rec.update(status="skip", detail=f"too large for the interpreter ({work} > {limit})")
            results.append(rec)
            continue
        t0 = time.perf_counter()
        try:
            expected = reference_of(module, op)(**case.make())
            actual = run(op, **inputs)
            diff = compare(expected, actual)
            rec.update(status="pass" if diff is None else "fail", detail=diff or "")
        except Exception as exc:  # reported as an error with its reason
            rec.update(status="error", detail=f"{type(exc).__name__}: {exc}"[:800])
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        results.append(rec)

    for inv in [] if golden_only or skip_invariance or select is not None else invariance_cases(module, full=False):
        op = op_of(module, inv)
        if only_op is not None and op != only_op and inv.invariance not in also_invariances:
            continue
        rec = {"case": inv.name, "op": op, "kind": "invariance"}
        if inv.name in INTERPRETER_SKIP.get(contract_module, ()):
            rec.update(status="skip", detail="left to the GPU run (tests/test_cuda_interpreter.py INTERPRETER_SKIP)")
            results.append(rec)
            continue
        if op not in KERNELS:
            rec.update(status="skip", detail=f"no CUDA kernel for {op}")
            results.append(rec)
            continue
        t0 = time.perf_counter()
        try:
            expected, actual = inv.check(run)
            diff = compare(expected, actual)
            rec.update(status="pass" if diff is None else "fail", detail=diff or "")
        except Exception as exc:
            rec.update(status="error", detail=f"{type(exc).__name__}: {exc}"[:800])
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        results.append(rec)
    return results


def run_primitive_checks(device: str = "cpu") -> list[dict[str, Any]]:
    """The Triton primitives on random bit patterns + specials vs ``rlkernel.contracts._exact``
    (``device``: where the kernels run; "cpu" under the interpreter, "cuda" on a GPU)."""
    from types import SimpleNamespace

    from rlkernel.backends.triton import _prims as prims

    def on_device(fn: Any) -> Any:  # a primitive's launcher on ``device``, its results brought back
        def call(*args: Any) -> Any:
            out = fn(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))
            return tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu()
        return call

    P = SimpleNamespace(**{name: on_device(getattr(prims, name))
                           for name in ("prim_f32", "prim_int", "prim_out", "prim_grid", "prim_grid28",
                                        "prim_fixed_abs", "prim_exp_nonpos", "prim_grid_unit")})

    from rlkernel.contracts._exact import fixed as FX
    from rlkernel.contracts._exact import fp32 as F
    from rlkernel.contracts._exact import transcendental as T

    g = torch.Generator().manual_seed(1234)
    bits = torch.randint(-(2**31), 2**31, (30000,), generator=g, dtype=torch.int64).to(torch.int32)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, -1.0, 89.0, 89.0001,
                             -104.0, -104.0001, 1e-45, -1e-45, 2**-126, 2**-127, 0.5, 88.72, -87.33, 0.7071067,
                             0.70710677, 3.4e38, -3.4e38], dtype=torch.float32)
    ramp = torch.linspace(-110.0, 95.0, 20001, dtype=torch.float32)
    x = torch.cat([bits.view(torch.float32), specials, ramp, ramp.abs() * 1e-3, torch.nextafter(ramp, ramp + 1)])
    results = []

    def rec(name: str, expected: torch.Tensor, actual: torch.Tensor) -> None:
        diff = compare(expected, actual)
        results.append({"case": name, "op": "primitives", "kind": "primitive",
                        "status": "pass" if diff is None else "fail", "detail": diff or f"{expected.numel()} values"})

    rec("exp_c", T.exp_c(x), P.prim_f32("exp_c", x))
    rec("log_c", T.log_c(x), P.prim_f32("log_c", x))
    fin = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    rec("expo", F.expo(fin).to(torch.int32), P.prim_f32("expo", fin))
    rec("cast_bf16", F.round_to(x, torch.bfloat16), P.prim_f32("bf16", x))
    rec("cast_fp16", F.round_to(x, torch.float16), P.prim_f32("fp16", x))
    rec("canonical_nan", F.canonicalize(x), P.prim_f32("canonical", x))
    s = torch.randint(-(2**62), 2**62, (20000,), generator=g) >> torch.randint(0, 62, (20000,), generator=g)
    s = torch.cat([s, torch.tensor([0, 1, -1, 2**24 + 1, 2**24 + 3, -(2**25 + 2), 2**53 + 1, (1 << 62) + (1 << 38),
                                    16777217 << 20, -(16777219 << 30), (1 << 63) - 1, -(1 << 63) + 1])])
    k = torch.randint(-200, 60, s.shape, generator=g).to(torch.int32)
    y, q = P.prim_int(s, k)
    y_ref = F.ldexp_c(F.int_to_fp32(s), k.to(torch.int64))
    rec("int64_to_f32+ldexp_c", y_ref, y)
    rec("to_fixed_F40", FX.quantize(torch.where(torch.isfinite(y_ref), y_ref, 0.0), F.expo(
        torch.where(torch.isfinite(y_ref), y_ref, 0.0)), 40), q)
    # P4 on the absolute grid in fp32 arithmetic (softmax's sums): exp_c's values in [0, 1], ties
    # (2k + 1) * 2**-41 and their neighbours, subnormals, both signs, magnitudes up to 2**21, specials
    p = T.exp_c(-ramp.abs())
    tie = ((torch.randint(0, 1 << 23, (4000,), generator=g) * 2 + 1).to(torch.float64) * 2.0**-41).to(torch.float32)
    wide = bits.view(torch.float32)
    wide = wide[torch.isfinite(wide) & (wide.abs() < 2.0**21)]
    u = torch.cat([p, tie, torch.nextafter(tie, torch.ones_like(tie)), torch.nextafter(tie, torch.zeros_like(tie)),
                   -tie, wide, specials, torch.tensor([2.0**21 - 1.0, -(2.0**21), 2.0**-149, 8388607.5 * 2.0**-40])])
    u = u[~torch.isfinite(u) | (u.abs() < 2.0**22)]  # its domain: |u| * 2**40 < 2**62, and the specials
    u_fin = torch.where(torch.isfinite(u), u, 0.0)
    rec("to_fixed_abs_F40", FX.quantize(u_fin, torch.zeros_like(u_fin, dtype=torch.int64), 40), P.prim_fixed_abs(u))
    # softmax's split sum: exp_c without its NaN / overflow cases for x <= 0 (every finite and -inf
    # x, the subnormal results included), then the terms in [0, 1] on the grid as fp32 integers added
    # in fp64 to integer offsets up to 2**52 - 2**40 - 1, read back as int64
    neg = torch.cat([-x[~torch.isnan(x)].abs(), torch.tensor([-0.0, -float("inf"), -103.97, -87.34, -2.0**-30])])
    rec("exp_c_nonpos", T.exp_c(neg), P.prim_exp_nonpos(neg))
    unit = torch.cat([p, tie, torch.nextafter(tie, torch.ones_like(tie)), torch.nextafter(tie, torch.zeros_like(tie)),
                      torch.tensor([0.0, 1.0, 2.0**-149, 2.0**-41, 2.0**-17, 8388607.5 * 2.0**-40])])
    offset = torch.randint(0, 2**52 - 2**40, unit.shape, generator=g)
    offset[:8] = torch.tensor([0, 1, 2**52 - 2**40 - 1, 2**51, 2**40, 3, 2**52 - 2**41, 12345])
    rec("to_grid_unit_F40+f64_count", offset + FX.quantize(unit, torch.zeros_like(unit, dtype=torch.int64), 40),
        P.prim_grid_unit(unit, offset.to(torch.float64)))
    # P3' straight to each format (linear's epilogue, the paged finish): magnitudes of every bit
    # length, exponents across the subnormal and overflow edges, ties at 24, 11 and 8 bits
    ties = torch.tensor([(2**24 + 1) << 5, (2**24 + 3) << 9, -((2**24 + 1) << 30), (2**11 + 1) << 3, (2**11 + 3) << 40,
                         -((2**8 + 1) << 20), (2**8 + 3) << 50, 3 << 61, (1 << 62) + (1 << 9), (1 << 63) - (1 << 10),
                         (1 << 63) - 1, -(1 << 63) + 1, 1, -1, 0, 3, -5, 2**53 + 1, -(2**53 + 3)])
    so = torch.cat([s, ties.repeat(40)])
    ko = torch.randint(-330, 200, so.shape, generator=g)
    edges = torch.tensor([-149, -150, -133, -134, -24, -25, -14, -15, -126, -127, 104, 105, 127, 128, -200, 65, 66,
                          -212, -211, -190, -186, 60, 64, 127 - 62, 128 - 62, -149 - 62, -512, 512])
    ko[s.numel():] = edges.repeat(so.numel() // edges.numel() + 1)[: so.numel() - s.numel()]
    half = s.numel() // 2  # these land at the edges: k = edge - bit length of s (+- 1)
    near = edges[torch.randint(0, edges.numel(), (half,), generator=g)] + torch.randint(-1, 2, (half,), generator=g)
    ko[:half] = (near - torch.frexp(s[:half].abs().to(torch.float64))[1].to(torch.int64)).clamp(-512, 512)
    # double-rounding traps: a tie at p bits, and one last bit above or below it that a first
    # rounding (to 53 bits, or to fp32's 24) drops; in normal and subnormal ranges
    traps = torch.tensor([sign * ((((1 << p) + odd) << j) + low) for p in (24, 11, 8) for j in (3, 20, 30, 36, 45, 50)
                          for odd in (1, 3) for sign in (1, -1) for low in (1, 0, -1) if p + j < 62])
    kt = torch.tensor([0, -40, 31, -160, -20])
    so = torch.cat([so, traps.repeat(kt.numel())])
    ko = torch.cat([ko, kt.repeat_interleave(traps.numel())])
    for code, dt in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        rec(f"int64_to_out_{str(dt)[6:]}", F.int_to_float(so, ko, dt).to(torch.float32),
            P.prim_out(so, ko.to(torch.int32), code))
    xb = x[torch.isfinite(x)][:30000].to(torch.bfloat16)
    xb = torch.where(torch.isfinite(xb), xb, torch.zeros_like(xb))
    e = torch.randint(0, 10, xb.shape, generator=g) + F.expo(xb.to(torch.float32))  # |x| < 2**e
    d = P.prim_grid(xb, e.to(torch.int32)).to(torch.int64)
    grid = torch.round(xb.to(torch.float64) * torch.ldexp(torch.ones_like(e, dtype=torch.float64), 20 - e))
    rec("grid21_digits", grid.to(torch.int64), d[0] + (d[1] << 7) + (d[2] << 14))
    bounds_ok = bool((d[0].abs() <= 64).all() and (d[1].abs() <= 64).all() and (d[2].abs() <= 64).all())
    results.append({"case": "digit_bounds", "op": "primitives", "kind": "primitive",
                    "status": "pass" if bounds_ok else "fail", "detail": "" if bounds_ok else "digit out of [-64, 64]"})
    # fp32 on 28-bit grids (24-bit significands: fractions up to 2**23 to round, ties among them)
    xf = torch.cat([x[torch.isfinite(x)][:30000], torch.tensor([0.5, 1.5, 2.5, -2.5, 8388607.5, -8388606.5,
                                                                 4194303.5, 16777215.0, -0.0])])
    ef = (torch.randint(0, 6, xf.shape, generator=g) + F.expo(xf)).clamp(min=-149, max=128)
    near = (xf.abs() == 8388607.5) | (xf.abs() == 8388606.5) | (xf.abs() == 16777215.0)
    ef = torch.where(near, 27, ef)  # scale 1 or 8: halves just below 2**23 (ties to even), integers above it
    d4 = P.prim_grid28(xf, ef.to(torch.int32)).to(torch.int64)
    scale = torch.ldexp(torch.ones_like(ef, dtype=torch.float64), 27 - ef)
    grid28 = torch.round(xf.to(torch.float64) * scale)  # exact product in float64, then RNE
    rec("grid28_f32_digits", grid28.to(torch.int64), d4[0] + (d4[1] << 7) + (d4[2] << 14) + (d4[3] << 21))
    bounds_ok = bool((d4.abs() <= 64).all())
    results.append({"case": "digit_bounds_28", "op": "primitives", "kind": "primitive",
                    "status": "pass" if bounds_ok else "fail", "detail": "" if bounds_ok else "digit out of [-64, 64]"})
    return results


#: token_logprobs_backward cases of 10-14 tokens, run again under ``small_tiles``
SMALL_TILE_BACKWARD_CASES = ("partial_phase2_bf16", "massive_token", "non_contiguous", "specials_in_hidden_fp16")
#: their logits budget there: 8 KB holds 3-11 tokens of their 90-270 vocabulary rows (of 10-14 tokens)
SMALL_TILE_BACKWARD_LOGITS_BYTES = 8192
#: token_entropy_backward cases run again under ``small_tiles`` with that logits budget (several token
#: chunks, then pass B recomputing the logits per vocabulary block)
SMALL_TILE_ENTROPY_BACKWARD_CASES = ("specials_in_hidden_fp16", "non_contiguous")


def run_tiling_checks() -> list[dict[str, Any]]:
    """The golden cases again with small tiles/blocks: looped (multi-tile) rows in rms_norm and
    softmax, 16x16x32 GEMM tiles in linear (token_logprobs' logits at ``LOGITS_TILE`` 16x32x32; linear's
    prefill path from M = 9, with K split over programs; token_logprobs_backward's products on it
    for a few cases of 10-14 tokens, in several token chunks and 4 x 32 coefficient tiles), 16x32
    (query x key) tiles in attention and in attention_backward's dS kernel. The bits must not move:
    tiling is free because every sum is an integer sum."""
    from rlkernel.backends.generic import token_entropy as entropy
    from rlkernel.backends.generic import token_logprobs_backward as backward
    from rlkernel.backends.triton import attention, attention_paged, linear, rms_norm, softmax

    saved_logits = backward.LOGITS_BYTES, entropy.LOGITS_BYTES
    saved = (rms_norm.MAX_BLOCK, softmax.MAX_BLOCK, linear.SMALL_TILES, attention.SMALL_TILES,
             attention_paged.SMALL_SPLITS, attention_paged.ROWS_OFF, linear.DECODE_MAX_M, linear.MID_MAX_M,
             linear.LOGITS_TILE)
    rms_norm.MAX_BLOCK, softmax.MAX_BLOCK, linear.SMALL_TILES, attention.SMALL_TILES = 32, 32, True, True
    linear.LOGITS_TILE = (16, 32, 32, 1, 1)  # token_logprobs' chunks at their own tile (SMALL_TILES' is 16 x 16)
    # decode blocks through the matrix-unit kernels too (the other runs take attention_rows.py's)
    attention_paged.SMALL_SPLITS, attention_paged.ROWS_OFF = True, True
    linear.DECODE_MAX_M = 8  # M > 8 takes the prefill path (digit planes, split K over the fake 64 SMs) ...
    linear.MID_MAX_M = 32  # ... from M = 33: 8 < M <= 32 (M = 17) runs the decode kernel as the mid path
    records = []
    try:
        for name in ("rms_norm", "softmax", "log_softmax", "linear", "token_logprobs", "attention",
                     "attention_backward"):
            for rec in run_op_checks(name, golden_only=True, limit_scale=0.25):
                rec["case"] = f"{name}/{rec['case']}"
                records.append(rec)
        # token_logprobs_backward's products with T > 8 rows on the prefill path (int8 planes, K split),
        # with a logits budget of a few tokens: several token chunks (the coefficient kernel's column
        # maxima merged over chunks and over 4-row programs), then pass B (logits recomputed per block)
        backward.LOGITS_BYTES = SMALL_TILE_BACKWARD_LOGITS_BYTES
        for rec in run_op_checks("token_logprobs_backward", select=SMALL_TILE_BACKWARD_CASES.__contains__):
            rec["case"] = f"token_logprobs_backward/{rec['case']}"
            records.append(rec)
        entropy.LOGITS_BYTES = SMALL_TILE_BACKWARD_LOGITS_BYTES
        for rec in run_op_checks("token_entropy_backward", select=SMALL_TILE_ENTROPY_BACKWARD_CASES.__contains__):
            rec["case"] = f"token_entropy_backward/{rec['case']}"
            records.append(rec)
    finally:
        (rms_norm.MAX_BLOCK, softmax.MAX_BLOCK, linear.SMALL_TILES, attention.SMALL_TILES,
         attention_paged.SMALL_SPLITS, attention_paged.ROWS_OFF, linear.DECODE_MAX_M, linear.MID_MAX_M,
         linear.LOGITS_TILE) = saved
        backward.LOGITS_BYTES, entropy.LOGITS_BYTES = saved_logits
    records.extend(run_sample_split_checks())
    return records


def run_sample_split_checks() -> list[dict[str, Any]]:
    """``sample`` with 8-token split tiles (several programs per row: the per-program winners,
    NaN / +inf / tie rows split across programs, merged exactly), 256-token filter tiles
    (multi-tile top-k / top-p selection passes) and 8- and 16-key tiles (rows with k <= 16 stop
    their count passes early and finish in a tile, rows with a larger k run the full passes): the
    cases of up to 4096 elements (specials, ties, extremes, per-row parameter mixes; each tile costs
    the interpreter ~0.1 s). The bits must not move. Plus the launch hint ``filtered=False``
    (hist and gather kernels skipped) on a batch with every row kind: the same tokens."""
    from rlkernel.backends.triton import sample

    saved = (sample.SPLIT_BLOCK, sample.PROGRAMS, sample.FILTER_BLOCK, sample.COMPACT, sample.SMALL_TILE)
    sample.SPLIT_BLOCK, sample.PROGRAMS, sample.FILTER_BLOCK, sample.COMPACT, sample.SMALL_TILE = 8, 64, 256, 16, 8
    records = []
    try:
        for rec in run_op_checks("sample", skip_invariance=True, limit_scale=1 / 256):
            rec["case"] = f"sample/{rec['case']}"
            records.append(rec)
        records.append(_sample_hint_record(sample.sample))
    finally:
        sample.SPLIT_BLOCK, sample.PROGRAMS, sample.FILTER_BLOCK, sample.COMPACT, sample.SMALL_TILE = saved
    return records


def _sample_hint_record(kernel: Any) -> dict[str, Any]:
    """The Triton ``sample`` with ``filtered`` True and False against the reference on greedy, plain,
    top-k (in and beyond the tile), top-p, both, and NaN rows: the hint only skips launches."""
    from rlkernel.contracts import sample as contract

    t0 = time.monotonic()
    g = torch.Generator().manual_seed(5)
    x = torch.randn((8, 300), generator=g) * 3.0
    x[7, 11] = float("nan")
    tau = torch.tensor([0.0, 1.0, 0.8, 0.8, 1.0, 0.7, 0.9, 1.0])
    k = torch.tensor([5, 0, 5, 100, 0, 10, 0, 3])
    p = torch.tensor([0.5, 1.0, 1.0, 1.0, 0.9, 0.8, 0.3, 0.9])
    seed, pos = torch.arange(8) * 977, torch.arange(8) + 40
    want = contract.reference(x, tau, k, p, seed, pos)
    got = {hint: kernel(x, tau, k, p, seed, pos, filtered=hint) for hint in (True, False)}
    bad = {hint: out.tolist() for hint, out in got.items() if not torch.equal(out, want)}
    return {"case": "sample/filtered_hint", "op": "sample", "kind": "golden", "status": "fail" if bad else "pass",
            "detail": f"want {want.tolist()}, got {bad}" if bad else "", "seconds": time.monotonic() - t0}


def _softmax_golden_with(settings: dict[str, Any], label: str) -> list[dict[str, Any]]:
    """softmax / log_softmax golden cases (quarter-size limits) with the softmax module's knobs set
    to ``settings`` for the run; case names ``<op>/<label><case>``."""
    from rlkernel.backends.triton import softmax

    saved = {k: getattr(softmax, k) for k in settings}
    records = []
    try:
        for k, value in settings.items():
            setattr(softmax, k, value)
        for name in ("softmax", "log_softmax"):
            for rec in run_op_checks(name, golden_only=True, limit_scale=0.25):
                rec["case"] = f"{name}/{label}{rec['case']}"
                records.append(rec)
    finally:
        for k, value in saved.items():
            setattr(softmax, k, value)
    return records


def run_split_checks() -> list[dict[str, Any]]:
    """softmax / log_softmax golden cases with split rows of few programs: 32-column tiles and
    three programs wanted in all, so a program's chunk spans several tiles (``small_tiles`` runs
    the same split path with one tile per program); plus embedding's in-kernel id check and
    all_reduce's overflow count."""
    records = _softmax_golden_with({"MAX_BLOCK": 32, "SPLIT_PROGRAMS": 3}, "")
    records.append(_embedding_bad_id_check())
    records.append(_all_reduce_overflow_check())
    return records


def run_split_fused_checks() -> list[dict[str, Any]]:
    """softmax / log_softmax golden cases on the one-launch split (``FUSED_SPLIT``): 32-column tiles,
    two a work item, batches of 2 KiB of x, so rows span several items and batches (the last one
    partial). The interpreter runs the programs one after another, so the first takes every ticket
    and no wait ever spins: this checks the tickets' order, the items' indexing and the bits; the
    waits between programs need a GPU."""
    return _softmax_golden_with({"MAX_BLOCK": 32, "FUSED_SPLIT": True, "FUSED_ITEM_TILES": 2,
                                 "FUSED_BATCH_BYTES": 2048}, "fused/")


def _all_reduce_overflow_check(device: str = "cpu") -> dict[str, Any]:
    """``all_reduce``'s overflow count on the cuda kernel: a total outside int64 raises naming its
    first element (in the second block of 1024: the count is per block); an intermediate overflow
    whose total fits does not raise."""
    from rlkernel.dispatch import use_backend
    from rlkernel.public import public_op

    rec: dict[str, Any] = {"case": "all_reduce/overflow", "op": "all_reduce", "kind": "error"}
    big = 1 << 62
    partials = torch.zeros((2, 3000), dtype=torch.int64)
    partials[:, 1500] = big
    partials[:, 2900] = -big - 7
    fine = torch.tensor([[big], [big], [-big], [5]])
    partials, fine = partials.to(device), fine.to(device)
    with use_backend("cuda"):
        if public_op("all_reduce")(partials=fine).tolist() != [big + 5]:
            rec.update(status="fail", detail="2**62 + 2**62 - 2**62 + 5 did not give 2**62 + 5")
            return rec
        try:
            public_op("all_reduce")(partials=partials)
            rec.update(status="fail", detail="no error for a total of 2**63 at index 1500")
        except ValueError as exc:
            ok = "the exact sum at flat index 1500 is 9223372036854775808, outside int64" in str(exc)
            rec.update(status="pass" if ok else "fail", detail="" if ok else str(exc))
    return rec


def _embedding_bad_id_check() -> dict[str, Any]:
    """``embedding``'s in-kernel id check: the public op on the cuda kernel names the first bad id."""
    from rlkernel.dispatch import use_backend
    from rlkernel.public import public_op

    rec: dict[str, Any] = {"case": "embedding/bad_id", "op": "embedding", "kind": "error"}
    weight = torch.arange(40, dtype=torch.float32).reshape(10, 4).to(torch.bfloat16)
    try:
        with use_backend("cuda"):
            public_op("embedding")(ids=torch.tensor([[0, 3], [12, -1]]), weight=weight)
        rec.update(status="fail", detail="no error for ids 12 and -1 with V = 10")
    except ValueError as exc:
        ok = "ids holds 12 at index (1, 0); expected 0 <= id < V = 10" in str(exc)
        rec.update(status="pass" if ok else "fail", detail="" if ok else str(exc))
    return rec


def run_attention_chunk_checks() -> list[dict[str, Any]]:
    """``attention`` prefill on the chunked fp64 path (sequences longer than ``F64_KEYS`` keys: fp64
    accumulators folded into int64 sums per chunk), which no conformance case reaches (it takes more
    than 4 096 keys): ``F64_KEYS`` shrunk to 64 for the run, so 150 keys span three chunks, against
    the generic backend; at the launcher's 32-row blocks and at ``CHUNKS_BLOCK_M`` 16. Causal, GQA 4 / 2
    heads, D 32, two sequences (100 queries on 100 keys, 6 queries at the end of 150), an attention
    sink, outlier channels and a zero V row."""
    import triton.language as tl

    from rlkernel.backends.generic import attention as generic
    from rlkernel.backends.triton import attention as A
    from rlkernel.backends.triton.targets import CUDA

    g = torch.Generator().manual_seed(9)
    lq, lk = (100, 6), (100, 150)
    q = torch.randn(sum(lq), 4, 32, generator=g)
    k = torch.randn(sum(lk), 2, 32, generator=g)
    v = torch.randn(sum(lk), 2, 32, generator=g)
    q[:, :, 3] *= 20.0
    k[:, :, 3] *= 8.0
    k[0] = 6.0 * q[:8].mean(dim=(0, 1))
    k[lk[0]] = k[0]
    v[5] = 0.0
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    cu_q = torch.tensor([0, lq[0], sum(lq)], dtype=torch.int32)
    cu_k = torch.tensor([0, lk[0], sum(lk)], dtype=torch.int32)
    want = generic.attention(q, k, v, cu_q, cu_k, None, True)
    saved = (A.F64_KEYS, A._F64_KEYS, A.CHUNKS_BLOCK_M)
    records = []
    try:
        A.F64_KEYS, A._F64_KEYS = 64, tl.constexpr(64)
        for rows in (None, 16):
            A.CHUNKS_BLOCK_M = rows
            rec: dict[str, Any] = {"case": f"attention/chunked_rows{rows or 32}", "op": "attention",
                                   "kind": "golden"}
            t0 = time.monotonic()
            try:
                got = A.attention(q, k, v, cu_q, cu_k, None, True, target=CUDA)
                same = torch.equal(want.view(torch.int16), got.view(torch.int16))
                rec.update(status="pass" if same else "fail", detail="" if same else "bytes differ from generic")
            except Exception as exc:  # reported as the record's error, as run_op_checks does
                rec.update(status="error", detail=f"{type(exc).__name__}: {exc}")
            rec["seconds"] = time.monotonic() - t0
            records.append(rec)
    finally:
        A.F64_KEYS, A._F64_KEYS, A.CHUNKS_BLOCK_M = saved
    return records


def run_paged_split_checks() -> list[dict[str, Any]]:
    """``attention_paged``'s golden, adversarial and invariance cases with one key tile per split
    (many programs per sequence, merged by the integer atomics) and the scores recomputed in pass 2
    instead of stored (the path of large scratch sizes). The bits must not move."""
    from rlkernel.backends.triton import attention_paged

    saved = (attention_paged.SMALL_SPLITS, attention_paged.STORE_S_MAX_BYTES)
    attention_paged.SMALL_SPLITS, attention_paged.STORE_S_MAX_BYTES = True, 0
    try:
        # the kv_split invariance compares attention with attention_paged at block sizes 1, 16, 64
        return run_op_checks("attention", only_op="attention_paged", also_invariances=("kv_split",))
    finally:
        attention_paged.SMALL_SPLITS, attention_paged.STORE_S_MAX_BYTES = saved


#: ops of ``backends/triton/rl.py`` run again with 2-row x 16-column tiles (``rl.SMALL_TILES``), and
#: ``exact_sum`` with 4 elements per program and a normalisation every 4 terms (``exact_sum.SMALL_TILES``)
RL_TILED = ("masked_mean", "ppo_loss", "group_advantages", "masked_mean_backward", "exact_sum")


def _rl_small_case(name: str) -> bool:
    """The cases small enough for many tiny programs in the interpreter (specials, ties, overflow,
    empty rows and batches included); the gradient runs no row kernel."""
    return not any(tag in name for tag in ("T256", "B16", "G16", "n64", "grad", "huge_spread"))


def run_rl_tiling_checks(name: str) -> list[dict[str, Any]]:
    """``name``'s small golden and adversarial cases with the RL row kernels on 2 x 16 tiles and
    one column step per program: many programs merge their exact states with int64 atomics, long
    rows loop over column steps, group rows span several steps. The bits must not move."""
    from rlkernel.backends.triton import exact_sum, rl

    mod = exact_sum if name == "exact_sum" else rl
    saved = mod.SMALL_TILES
    mod.SMALL_TILES = True
    try:
        records = run_op_checks(name, select=_rl_small_case)
    finally:
        mod.SMALL_TILES = saved
    for rec in records:
        rec["case"] = f"{name}/{rec['case']}"
    return records


def cuda_contract_modules() -> list[str]:
    """Contract modules with a Triton kernel in the CUDA KERNELS table (module order); the
    ``torch_exact`` ops are the generic backend's code, tested on the CPU by the cpu backend."""
    import importlib.util

    from rlkernel.backends.cuda import KERNELS
    from rlkernel.contracts import CONTRACT_MODULES

    found = []
    for name in CONTRACT_MODULES:
        if importlib.util.find_spec(f"rlkernel.contracts.{name}") is None:
            continue
        triton_ops = [op for op, target in KERNELS.items() if not target.startswith("torch_exact:")]
        if name in triton_ops or any(op.startswith(name) for op in triton_ops):
            found.append(name)
    return found


def run_all(modules: list[str]) -> dict[str, list[dict[str, Any]]]:
    force_cuda_backend_on_cpu()
    out: dict[str, list[dict[str, Any]]] = {}
    for name in modules:
        if name == "primitives":
            out[name] = run_primitive_checks()
        elif name == "attention_paged_splits":
            out[name] = run_paged_split_checks()
        elif name == "small_tiles":
            out[name] = run_tiling_checks()
        elif name == "small_split":
            out[name] = run_split_checks()
        elif name == "small_split_fused":
            out[name] = run_split_fused_checks()
        elif name == "attention_chunks":
            out[name] = run_attention_chunk_checks()
        elif name.startswith("small_tiles_"):
            out[name] = run_rl_tiling_checks(name.removeprefix("small_tiles_"))
        else:
            try:
                out[name] = run_op_checks(name)
            except Exception as exc:
                out[name] = [{"case": "*", "op": name, "kind": "module", "status": "error",
                              "detail": f"{type(exc).__name__}: {exc}"}]
    return out


# --------------------------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------------------------

OPS = (["primitives"] + cuda_contract_modules() + ["small_tiles", "small_split", "small_split_fused",
                                                    "attention_paged_splits", "attention_chunks"]
       + [f"small_tiles_{op}" for op in RL_TILED])


#: interpreter children: two, so that both CI cores work on them once the rest of the suite is done
CHILDREN = 2
#: the children, started by :func:`start_child` (tests/conftest.py starts them when collection ends,
#: so that they run beside the rest of the suite instead of after it)
_CHILD: dict[str, Any] = {}


def start_child(ops: list[str] | None = None) -> None:
    """Start the interpreter children (once) for ``ops`` (the selected tests' entries of :data:`OPS`;
    all of them by default), dealt round-robin over :data:`CHILDREN` processes; their output goes to
    files under ``.pytest_cache`` so that a full pipe cannot stall them while nobody reads."""
    if INNER or _CHILD:
        return
    cache = ROOT / ".pytest_cache"
    cache.mkdir(exist_ok=True)
    # one torch thread each: the children share the CI cores with the main pytest process
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    wanted = list(ops or OPS)
    procs = []
    for i in range(min(CHILDREN, len(wanted))):
        out_path, log_path = cache / f"cuda_interpreter.{i}.json", cache / f"cuda_interpreter.{i}.log"
        out_path.unlink(missing_ok=True)
        log = log_path.open("w")
        proc = subprocess.Popen([sys.executable, __file__, "--json", str(out_path), *wanted[i::CHILDREN]], env=env,
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        procs.append({"proc": proc, "out": out_path, "log": log_path, "log_file": log})
    _CHILD.update(procs=procs, started=time.monotonic())


def stop_child() -> None:
    """Kill the children that still run (the session ended before their tests ran, or was interrupted)."""
    for child in _CHILD.get("procs", []):
        if child["proc"].poll() is None:
            child["proc"].kill()
            child["proc"].wait()


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, list[dict[str, Any]]]:
    if INNER:
        return {}
    start_child()
    results: dict[str, list[dict[str, Any]]] = {}
    for child in _CHILD["procs"]:
        left = CHILD_TIMEOUT - (time.monotonic() - _CHILD["started"])
        try:
            rc = child["proc"].wait(timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            stop_child()
            pytest.fail(f"interpreter children ran past {CHILD_TIMEOUT} s; logs: {child['log']}")
        child["log_file"].close()
        if rc != 0:
            pytest.fail(f"interpreter child failed (rc={rc}):\n{child['log'].read_text()[-6000:]}")
        results.update(json.loads(child["out"].read_text()))
    return results


@pytest.mark.parametrize("op", OPS)
def test_cuda_kernels_bitwise_in_interpreter(op: str, interpreter_results: dict[str, Any]) -> None:
    records = run_all([op])[op] if INNER else interpreter_results[op]
    failed = [r for r in records if r["status"] in ("fail", "error")]
    ran = [r for r in records if r["status"] == "pass"]
    skipped = [f"{r['case']}: {r['detail']}" for r in records if r["status"] == "skip"]
    if skipped:
        print(f"{op}: skipped {len(skipped)}:\n  " + "\n  ".join(skipped))
    assert not failed, "\n".join(f"{r['case']} ({r['kind']}): {r['status']}: {r['detail']}" for r in failed)
    assert ran, f"{op}: no case ran in the interpreter (skipped: {skipped})"


if __name__ == "__main__":
    if not INNER:
        sys.exit("run with TRITON_INTERPRET=1")
    args = sys.argv[1:]
    json_path = None
    if args[:1] == ["--json"]:
        json_path, args = args[1], args[2:]
    result = run_all(args or OPS)
    text = json.dumps(result, indent=1)
    if json_path:
        Path(json_path).write_text(text)
    for op, recs in result.items():
        counts: dict[str, int] = {}
        for r in recs:
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        print(op, counts, f"{sum(r.get('seconds', 0) for r in recs):.0f} s")
        for r in recs:
            if r["status"] in ("fail", "error"):
                print("  ", r["case"], r["status"], r["detail"][:300])
