"""AMD static checks of the rocm backend: every shared Triton kernel compiles for gfx942 and gfx90a on
the CPU and its AMDGCN conforms (backends/rocm/static_checks.py); a planted non-conforming kernel
fails each check; the committed report (conformance/results/rocm-static/) covers every kernel.

Needs Triton (its AMD backend and bundled ld.lld), no GPU and no ROCm. Compiling every
specialisation for two architectures takes minutes: it runs once, in one test, over a process
pool, attention and the GEMMs first.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from rlkernel.backends.rocm import static_checks as R  # noqa: E402
from rlkernel.backends.triton.compile import all_specs, compile_for  # noqa: E402
from rlkernel.backends.triton.targets import ROCM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "conformance" / "results" / "rocm-static" / "report.json"
#: the architectures CI must compile for (gfx950 too where the installed Triton supports it)
CI_ARCHS = ("gfx942", "gfx90a")


def _compile(fn, signature, constexprs, arch="gfx942", **options):  # type: ignore[no-untyped-def]
    return compile_for(fn, signature, constexprs, compiler="hip", arch=arch, warp_size=64,
                       options={"enable_fp_fusion": False, **options})


def _rules(compiled, **kw) -> set[str]:  # type: ignore[no-untyped-def]
    findings = R.scan_amdgcn(compiled.asm["amdgcn"], llir=compiled.asm["llir"],
                             shared=int(compiled.metadata.shared), **kw)
    return {f.split(":")[0] for f in findings}


_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


@triton.jit
def _exp_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.exp(tl.load(x_ptr + offs)))  # v_exp_f32


@triton.jit
def _rcp_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)  # a bare reciprocal estimate (on AMD, `/` and tl.fdiv are IEEE divisions)
    tl.store(y_ptr + offs, tl.inline_asm_elementwise("v_rcp_f32 $0, $1", "=v,v", [x], dtype=tl.float32,
                                                     is_pure=True, pack=1))


@triton.jit
def _rsqrt_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.math.rsqrt(tl.load(x_ptr + offs)))  # v_rsq_f32


@triton.jit
def _sqrt_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.sqrt(tl.load(x_ptr + offs)))  # approximate: v_sqrt_f32 without the correction


@triton.jit
def _mul_add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(y_ptr + offs, x * y + x)  # contracted into v_fmac_f32 when fusion is on


@triton.jit
def _float_atomic_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(y_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def _exact_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """What the kernels use: IEEE division and sqrt, integer division by a runtime value."""
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = tl.load(y_ptr + offs)
    tl.store(y_ptr + offs, tl.math.div_rn(x, y) + tl.math.sqrt_rn(x) + (offs // n).to(tl.float32))


_DOT_SIG = {"a_ptr": "*i8", "b_ptr": "*i8", "c_ptr": "*i32", "BM": "constexpr", "BK": "constexpr",
            "BN": "constexpr"}


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    m, k, n = tl.arange(0, BM), tl.arange(0, BK), tl.arange(0, BN)
    a = tl.load(a_ptr + m[:, None] * BK + k[None, :])
    b = tl.load(b_ptr + k[:, None] * BN + n[None, :])
    tl.store(c_ptr + m[:, None] * BN + n[None, :], tl.dot(a, b))


@triton.jit
def _no_mfma_kernel(a_ptr, b_ptr, c_ptr, BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr):
    m, k, n = tl.arange(0, BM), tl.arange(0, BK), tl.arange(0, BN)
    a = tl.load(a_ptr + m[:, None] * BK + k[None, :]).to(tl.int32)
    b = tl.load(b_ptr + k[:, None] * BN + n[None, :]).to(tl.int32)
    tl.store(c_ptr + m[:, None] * BN + n[None, :], tl.sum(a[:, :, None] * b[None, :, :], axis=1))


@pytest.mark.parametrize("arch", CI_ARCHS)
def test_each_planted_kernel_fails_its_check(arch: str) -> None:
    planted = {
        "approx-transcendental": _rules(_compile(_exp_kernel, _SIG, {"BLOCK": 256}, arch)),
        "approx-rcp": _rules(_compile(_rcp_kernel, _SIG, {"BLOCK": 256}, arch)),
        "approx-rsq": _rules(_compile(_rsqrt_kernel, _SIG, {"BLOCK": 256}, arch)),
        "approx-sqrt": _rules(_compile(_sqrt_kernel, _SIG, {"BLOCK": 256}, arch)),
        "fp32-fma": _rules(_compile(_mul_add_kernel, _SIG, {"BLOCK": 256}, arch, enable_fp_fusion=True)),
        "float-atomic": _rules(_compile(_float_atomic_kernel, _SIG, {"BLOCK": 256}, arch)),
        "denormals": _rules(_compile(_exact_kernel, _SIG, {"BLOCK": 256}, arch, allow_flush_denorm=True)),
        "float-matrix": _rules(_compile(_dot_kernel, {**_DOT_SIG, "a_ptr": "*bf16", "b_ptr": "*bf16",
                                                      "c_ptr": "*fp32"}, {"BM": 32, "BK": 32, "BN": 32}, arch)),
        "int8-mfma": _rules(_compile(_no_mfma_kernel, _DOT_SIG, {"BM": 16, "BK": 16, "BN": 16}, arch),
                            digit_gemm=True),
        "lds": _rules(_compile(_dot_kernel, _DOT_SIG, {"BM": 256, "BK": 512, "BN": 16}, arch), digit_gemm=True),
    }
    assert set(planted) == set(R.RULES)
    missed = {rule: found for rule, found in planted.items() if rule not in found}
    assert not missed, f"planted kernels not flagged by their rule (rule: what was found): {missed}"


@pytest.mark.parametrize("arch", CI_ARCHS)
def test_exact_sequences_pass(arch: str) -> None:
    """IEEE division, IEEE sqrt and exact integer division (their rcp/sqrt/fma are allowed), the
    int8 MFMA digit product, and fusion off for a plain multiply-add."""
    assert not _rules(_compile(_exact_kernel, _SIG, {"BLOCK": 256}, arch))
    assert not _rules(_compile(_mul_add_kernel, _SIG, {"BLOCK": 256}, arch))
    assert not _rules(_compile(_dot_kernel, _DOT_SIG, {"BM": 32, "BK": 32, "BN": 32}, arch), digit_gemm=True)


def test_scanner_rules_on_text() -> None:
    head = ".amdhsa_float_denorm_mode_32 3\n.amdhsa_float_denorm_mode_16_64 3\n"
    bad = {"fp32-fma": ["v_fma_mix_f32 v3, v2, v9, v4 op_sel_hi:[1,1,0]",
                        "v_fma_mix_f32 v2, -v0, 2.0, v19 op_sel_hi:[0,1,1]",
                        "v_fma_mixlo_f16 v2, -v0, 1.0, v19 op_sel_hi:[0,1,1]",
                        "v_pk_fma_f32 v[0:1], v[2:3], v[4:5], v[6:7]",
                        "v_mad_f32 v1, v2, v3, v4", "v_fmaak_f32 v1, v2, v3, 0x3f800000"],
           "approx-transcendental": ["v_log_f32_e32 v1, v2", "v_sin_f32_e32 v1, v2"],
           "approx-rcp": ["v_rcp_f32_e32 v1, v2", "v_rcp_iflag_f32_e32 v1, v2"],
           "float-atomic": ["global_atomic_add_f32 v0, v1, s[0:1]", "ds_add_f32 v0, v1",
                            "global_atomic_pk_add_bf16 v0, v1, s[0:1]", "flat_atomic_cmpswap v0, v[1:2], v[3:4]"],
           "denormals": ["s_denorm_mode 0"],
           "float-matrix": ["v_dot2_f32_bf16 v1, v2, v3, v4", "v_mfma_f32_16x16x16_f16 v[0:3], v[4:5], v[6:7], 0"]}
    for rule, lines in bad.items():
        for line in lines:
            assert rule in {f.split(":")[0] for f in R.scan_amdgcn(head + "\t" + line + "\n")}, line
    good = ["v_fma_mix_f32 v3, v2, v9, neg(0) op_sel_hi:[1,1,0]",
            "v_fma_mixlo_f16 v4, v0, v55, neg(0) op_sel_hi:[0,1,0]", "global_atomic_add_x2 v0, v[1:2], s[0:1]",
            "v_fma_mix_f32 v2, -v0, 1.0, v19 op_sel_hi:[0,1,1]",
            "v_mfma_i32_32x32x16_i8 v[0:15], v[24:25], v[20:21], 0",
            "v_add_f32_e32 v1, v2, v3", "v_mul_f32_e32 v1, v2, v3", "; v_exp_f32 in a comment"]
    for line in good:
        assert not R.scan_amdgcn(head + "\t" + line + "\n"), line
    assert {"denormals"} == {f.split(":")[0] for f in R.scan_amdgcn(".amdhsa_float_denorm_mode_32 0\n"
                                                                     ".amdhsa_float_denorm_mode_16_64 3\n")}


def test_every_rocm_kernel_passes_static_checks_on_gfx942_and_gfx90a() -> None:
    """Every specialisation the launchers use, compiled for gfx942 and gfx90a, conforms; every op with
    a Triton kernel is among them; the committed report lists the same kernels, all passing, and,
    under the Triton it was made with, the same code hashes."""
    archs = [a for a in CI_ARCHS if a in R.supported_archs()]
    assert archs == list(CI_ARCHS), f"the installed Triton {triton.__version__} does not compile {CI_ARCHS}"
    start = time.perf_counter()
    checked = R.check_all(archs=archs, workers=2)
    print(f"compiled {len(checked)} kernels for {archs} in {time.perf_counter() - start:.0f} s")
    failed = [f"{c.arch}/{c.op}/{c.case}: {c.detail()}" for c in checked if not c.passed]
    assert not failed, "\n".join(failed)
    from rlkernel.backends.triton import KERNELS

    ops = {c.op for c in checked}
    triton_ops = [op for op, target in KERNELS.items() if not target.startswith("torch_exact:")]
    # a sub-op's kernels are listed under its own name or its parent's (linear_partial under linear)
    missing = [op for op in triton_ops if op not in ops
               and op.split("_partial")[0].split("_finish")[0].split("_exponents")[0] not in ops]
    assert not missing, f"ops with a Triton kernel but no AMD static check: {missing}"
    assert len(checked) == len(all_specs(ROCM)) * len(archs)

    report = json.loads(REPORT.read_text())
    listed = {(k["arch"], k["op"], k["case"]): k for k in report["kernels"]}
    for c in checked:
        entry = listed.get((c.arch, c.op, c.case))
        assert entry is not None, f"{c.arch}/{c.op}/{c.case} is not in {REPORT}; regenerate it (docs/rocm-backend.md)"
        assert entry["status"] == "pass", entry
        if report["triton"] == triton.__version__:
            assert entry["code_sha256"] == c.code_sha256, (
                f"{c.arch}/{c.op}/{c.case}: the code differs from the committed report's under the same Triton "
                f"{triton.__version__}; regenerate the report (docs/rocm-backend.md)")
    assert all(counts["failed"] == 0 for counts in report["archs"].values()), report["archs"]
