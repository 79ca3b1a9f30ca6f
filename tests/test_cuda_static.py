"""Static checks of the CUDA backend: every Triton kernel compiles for sm_90 on the CPU and its PTX
holds no forbidden instruction (docs/design.md, "Conformance"); a deliberately non-conforming kernel is flagged.

Needs Triton (with its bundled ptxas) but no GPU. Compiling every kernel takes a few minutes on
a small machine; compiled kernels are cached by Triton afterwards.
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from rlkernel.backends.cuda import static_checks as sc  # noqa: E402


@triton.jit
def _nonconforming_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.exp(x) / y + x * y, mask=mask)  # ex2.approx, div.full, contractible mul+add


@triton.jit
def _float_atomic_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(y_ptr, tl.sum(tl.load(x_ptr + offs, mask=mask, other=0.0), axis=0))


_SIG = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def _rules(findings: list[str]) -> set[str]:
    return {f.split(":")[0] for f in findings}


def test_nonconforming_kernel_is_flagged_with_fusion_on() -> None:
    ptx = sc.compile_ptx(_nonconforming_kernel, _SIG, {"BLOCK": 128}, enable_fp_fusion=True)
    rules = _rules(sc.scan_ptx(ptx))
    assert {"approx-exp2", "approx-div", "fp32-fma"} <= rules, rules


def test_nonconforming_kernel_is_flagged_with_fusion_off() -> None:
    ptx = sc.compile_ptx(_nonconforming_kernel, _SIG, {"BLOCK": 128}, enable_fp_fusion=False)
    rules = _rules(sc.scan_ptx(ptx))
    assert {"approx-exp2", "approx-div"} <= rules, rules
    assert "fp32-fma" not in rules, rules  # fusion off: mul.rn + add.rn, not fma


def test_float_atomic_is_flagged() -> None:
    ptx = sc.compile_ptx(_float_atomic_kernel, _SIG, {"BLOCK": 128})
    assert "float-atomic" in _rules(sc.scan_ptx(ptx))


def test_scanner_rules_on_text() -> None:
    bad = ["ex2.approx.ftz.f32 %f1, %f2;", "div.full.f32 %f1, %f2, %f3;", "fma.rn.f32 %f1, %f2, %f3, %f4;",
           "add.f32 %f1, %f2, %f3;", "red.global.add.f32 [%rd1], %f1;", "rsqrt.approx.f32 %f1, %f2;",
           "sqrt.approx.f32 %f1, %f2;", "atom.global.add.f64 %fd1, [%rd1], %fd2;"]
    for line in bad:
        assert sc.scan_ptx(line), line
    good = ["add.rn.f32 %f1, %f2, %f3;", "mul.rn.f32 %f1, %f2, %f3;", "div.rn.f32 %f1, %f2, %f3;",
            "sqrt.rn.f32 %f1, %f2;", "add.s64 %rd1, %rd2, %rd3;", "atom.global.add.u64 %rd1, [%rd2], %rd3;",
            "cvt.rn.bf16.f32 %rs1, %f1;", "// ex2.approx.f32 in a comment", ".reg .f32 %f<10>;"]
    for line in good:
        assert not sc.scan_ptx(line), line


def test_every_backend_kernel_passes_static_checks() -> None:
    results = sc.static_checks()
    from rlkernel.backends.cuda import KERNELS

    checked_ops = {op for op, _, _, _ in results}
    triton_ops = [op for op, target in KERNELS.items() if not target.startswith("torch_exact:")]  # no Triton there
    # a sub-op's kernels are listed under its own name or its parent's (linear_partial under linear)
    missing = [op for op in triton_ops if op not in checked_ops
               and op.split("_partial")[0].split("_finish")[0].split("_exponents")[0] not in checked_ops]
    assert not missing, f"ops with a Triton kernel in KERNELS but no static check: {missing}"
    failed = [f"{op} {case}: {detail}" for op, case, passed, detail in results if not passed]
    assert not failed, "\n".join(failed)


def test_backend_exposes_static_checks() -> None:
    from rlkernel.backends.cuda import CudaBackend

    assert callable(getattr(CudaBackend(), "static_checks", None))


def test_paged_kernels_compile_with_block_size_one() -> None:
    """Triton turns an integer argument equal to 1 into a constant at launch: the paged attention
    kernels (matrix-unit and decode rows, both passes) must compile when ``block_size`` is 1, as
    the conformance case ``paged_prefill_h4_2_d64_bf16_bs1`` launches them (the interpreter does not
    specialise, so only a compile shows it)."""
    from rlkernel.backends.triton.compile import compile_for

    kernels = {}
    for op, case, fn, sig, consts, opts in sc.all_specs():
        if op == "attention_paged" and not case.startswith("finish") and fn.__name__ not in kernels:
            kernels[fn.__name__] = (fn, dict(sig, block_size="constexpr"), dict(consts, block_size=1), opts)
    assert {"_stats_kernel", "_sums_kernel", "_rows_stats_kernel", "_rows_sums_kernel"} <= set(kernels)
    for fn, sig, consts, opts in kernels.values():
        compile_for(fn, sig, consts, compiler="cuda", arch=90, warp_size=32,
                    options=dict(opts, enable_fp_fusion=False))


def test_wgmma_digit_gemm_static_check_passes_and_can_fail(tmp_path, monkeypatch) -> None:
    """linear's sm_90 wgmma kernel builds without a GPU and passes its check; the same source made
    to wait for every K step's products (``wait_group 0`` in the loop) fails it, as does a build error."""
    from rlkernel.backends.cuda import digit_gemm as D

    passed, detail = D.static_check(D.CONFIG)
    assert passed, detail
    source = D.SOURCE.read_text()
    waiting = tmp_path / "waiting.cu"
    waiting.write_text(source.replace('"wgmma.wait_group.sync.aligned 1;', '"wgmma.wait_group.sync.aligned 0;'))
    monkeypatch.setattr(D, "SOURCE", waiting)
    passed, detail = D.static_check(D.CONFIG)
    assert not passed and "wait" in detail, detail
    broken = tmp_path / "broken.cu"
    broken.write_text(source.replace("typedef long long i64;", "typedef long long i64 oops;"))
    monkeypatch.setattr(D, "SOURCE", broken)
    passed, detail = D.static_check(D.CONFIG)
    assert not passed and detail.startswith("build failed"), detail


@pytest.mark.parametrize("variant", [(0, 0, 0), (1, 1, 2)], ids=["C", "bf16_bias_bf16"])
def test_wgmma_candidate_configs_pass_static_check(variant: tuple[int, int, int]) -> None:
    """Every configuration the experiment times and the GPU tests check (the TMA producer
    warpgroup at BLOCK_N 64 included) builds for sm_90a without a GPU: its products in flight, no
    spill (the producer's registers go to the consumers), no ptxas warning."""
    from rlkernel.backends.cuda import digit_gemm as D

    for cfg in D.CANDIDATES:
        passed, detail = D.static_check(cfg, variant)
        assert passed, f"{D.name(cfg)}: {detail}"


def test_wgmma_producer_check_fails_without_register_handover(tmp_path, monkeypatch) -> None:
    """The producer configuration at BLOCK_N 64 holds 6 x 32 accumulators a consumer thread: without
    ``setmaxnreg`` (168 registers for 384 threads) its static check fails."""
    from rlkernel.backends.cuda import digit_gemm as D

    source = D.SOURCE.read_text()
    assert 'setmaxnreg.inc.sync.aligned.u32 232;' in source
    crippled = tmp_path / "no_setmaxnreg.cu"
    text = source.replace('asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\\n" ::: "memory");', "")
    assert text != source
    crippled.write_text(text)
    monkeypatch.setattr(D, "SOURCE", crippled)
    passed, detail = D.static_check((2, 64, 2, 0, 1))
    assert not passed and ("setmaxnreg" in detail or "spill" in detail), detail


def test_wgmma_digit_gemm_is_used_only_where_it_runs(monkeypatch) -> None:
    """Not on the CPU, not for K off 16 bytes, not with RLKERNEL_WGMMA=0; bad operands are refused
    before any launch, with what was given."""
    import torch

    from rlkernel.backends.cuda import digit_gemm as D

    assert not D.usable(torch.device("cpu"), 1024)
    monkeypatch.setenv(D.ENV, "0")
    assert not D.usable(torch.device("cuda"), 1024)
    xd, wd = torch.zeros(4, 8, 40, dtype=torch.int8), torch.zeros(3, 8, 40, dtype=torch.int8)
    with pytest.raises(ValueError, match="K=40 must be a multiple of 16"):
        D.digit_gemm(xd, wd, torch.zeros(8, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"got \(4, 8, 40\), \(3, 8, 40\), \(8, 9\)"):
        D.digit_gemm(xd, wd, torch.zeros(8, 9, dtype=torch.int64))
    xd, wd = torch.zeros(4, 8, 48, dtype=torch.int8), torch.zeros(3, 8, 48, dtype=torch.int8)
    y = torch.zeros(8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"int64 ex \[8\] and ew \[8\] expected; got torch.int32"):
        D.digit_gemm_finish(xd, wd, torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int64), None, y)
    with pytest.raises(ValueError, match=r"bias \[8\] of fp32/bf16/fp16 expected; got torch.float64"):
        D.digit_gemm_finish(xd, wd, torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64),
                            torch.zeros(8, dtype=torch.float64), y)


def test_wgmma_mid_rows_and_config_by_shape(monkeypatch) -> None:
    """The decode step's rows take the wgmma kernel from MID_MIN_N output columns (the LM head)
    only; a launch whose 128-row blocks would fill at most a third of the SMs (M = 256, N = 1024 on
    132 SMs) takes the 64-row configuration, the others the default one."""
    import types

    import torch

    from rlkernel.backends.cuda import digit_gemm as D

    assert not D.usable_mid(6144) and D.usable_mid(151936)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(multi_processor_count=132))
    cuda0 = torch.device("cuda", 0)
    assert D.config_for(256, 1024, cuda0) == D.SMALL_M_CONFIG
    assert D.config_for(300, 99, cuda0) == D.SMALL_M_CONFIG
    assert D.config_for(77, 4097, cuda0) == D.CONFIG  # 65 blocks: measured faster than the 64-row one
    assert D.config_for(256, 4096, cuda0) == D.CONFIG
    assert D.config_for(16384, 1024, cuda0) == D.CONFIG
    assert D.block_m(D.SMALL_M_CONFIG[0], D.SMALL_M_CONFIG[3]) == 64
    assert D.CONFIG in D.CANDIDATES and D.SMALL_M_CONFIG in D.CANDIDATES
