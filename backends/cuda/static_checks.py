"""Static kernel checks: compile every shared Triton kernel for sm_90 on the CPU and scan the PTX (docs/design.md,
"Conformance").

No GPU is needed: ``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda",
90, 32))`` produces PTX (and, with ptxas, a cubin). The PTX is scanned for instructions that
break R1/R2/R3:

- approximate math: ``ex2.approx``, ``lg2.approx``, ``sin/cos/tanh.approx``, ``rcp.approx``,
  ``rsqrt.approx``, ``sqrt.approx``, ``div.approx``, ``div.full`` (what ``/`` on fp32 becomes);
- flush-to-zero: any ``.ftz`` modifier;
- fp32 fused multiply-add (``fma.*.f32``, ``mad.f32``) -- contraction is off everywhere here
  (the bf16 x bf16 exemption of R1 is not used, so the simple rule is the strict one);
- fp32 ``add``/``sub``/``mul`` without an explicit rounding modifier: PTX allows ptxas to fuse
  those into FFMA, so a kernel launched without ``enable_fp_fusion=False`` shows up here;
- float atomics / reductions (``atom``/``red`` on ``.f16/.bf16/.f32/.f64``): order-dependent sums.

Each op module of ``backends/triton/`` exposes ``static_specs(target)`` -> ``[(op, case, kernel,
signature, constexprs[, options])]``; :func:`static_checks` compiles each of the CUDA target's
with ``enable_fp_fusion=False`` and returns
``(op, "sm_90/<case>", passed, detail)`` tuples, which the conformance runner records as kind
``static``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rlkernel.backends.triton.compile import Spec, compile_for, make_source, triton_version
from rlkernel.backends.triton.compile import all_specs as _all_specs
from rlkernel.backends.triton.targets import CUDA

__all__ = ["FORBIDDEN_PTX", "all_specs", "compile_ptx", "make_source", "ptx_code_sha256", "scan_ptx",
           "static_checks", "triton_version"]

#: (name, regex) of forbidden PTX; each is matched against instruction lines only
FORBIDDEN_PTX: tuple[tuple[str, str], ...] = (
    ("approx-exp2", r"\bex2\.approx"),
    ("approx-log2", r"\blg2\.approx"),
    ("approx-trig", r"\b(sin|cos|tanh)\.approx"),
    ("approx-rcp", r"\brcp\.approx"),
    ("approx-rsqrt", r"\brsqrt\.approx"),
    ("approx-sqrt", r"\bsqrt\.approx"),
    ("approx-div", r"\bdiv\.(approx|full)"),
    ("ftz", r"\.ftz\b"),
    ("fp32-fma", r"\b(fma|mad)(\.\w+)*\.f32\b"),
    ("contractible-fp32", r"\b(add|sub|mul)(\.sat)?\.f32\b"),
    ("float-atomic", r"\b(atom|red)(\.\w+)*\.(f16|bf16|f16x2|bf16x2|f32|f64)\b"),
)

#: the GPU target the checks compile for
ARCH = 90
WARP = 32


def compile_ptx(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], *, arch: int = ARCH,
                enable_fp_fusion: bool = False, num_warps: int = 4) -> str:
    """Compile ``fn`` for ``sm_<arch>`` without a GPU and return its PTX.

    Every specialisation compiles with ``num_warps=4`` (the launch's warps do not change which
    instructions a kernel uses; the sm_90 report the ``verified`` level rests on was made so).
    """
    compiled = compile_for(fn, signature, constexprs, compiler="cuda", arch=arch, warp_size=WARP,
                           options={"enable_fp_fusion": enable_fp_fusion, "num_warps": num_warps})
    return compiled.asm["ptx"]


def ptx_code_sha256(ptx: str) -> str:
    """SHA-256 of PTX without source locations (``.loc``, ``.file``) and DWARF sections: the same
    code compiled from another checkout (other paths) hashes the same."""
    import hashlib

    lines, in_debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            in_debug = True
        if in_debug:
            in_debug = s != "}"
            continue
        if not s.startswith((".loc", ".file")):
            lines.append(line)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _instruction_lines(ptx: str) -> Iterable[str]:
    for line in ptx.splitlines():
        s = line.strip()
        if not s or s.startswith(("//", ".")):  # comments and directives (.reg, .loc, .file, ...)
            continue
        yield s.split("//")[0]


def scan_ptx(ptx: str) -> list[str]:
    """Forbidden-instruction findings in ``ptx``: ``"<rule>: <line>"`` (empty when clean)."""
    findings = []
    for line in _instruction_lines(ptx):
        for rule, pattern in FORBIDDEN_PTX:
            if re.search(pattern, line):
                findings.append(f"{rule}: {line.strip()}")
    return findings


def all_specs() -> list[Spec]:
    """Every (op, case, kernel, signature, constexprs, options) compiled for sm_90 (the CUDA target)."""
    return _all_specs(CUDA)


def static_checks(ops: list[str] | None = None, arch: int = ARCH) -> list[tuple[str, str, bool, str]]:
    """Compile every kernel for ``sm_<arch>`` and scan it: ``[(op, case, passed, detail)]``.

    A kernel that fails to compile is a failed check (with the error as detail), never a pass.
    """
    results = []
    for op, case, fn, signature, constexprs, _ in all_specs():
        if ops and op not in ops:
            continue
        name = f"sm_{arch}/{case}"
        try:
            ptx = compile_ptx(fn, signature, constexprs, arch=arch)
        except Exception as exc:  # reported as a failed check, with the reason
            results.append((op, name, False, f"compile failed: {type(exc).__name__}: {str(exc)[:500]}"))
            continue
        findings = scan_ptx(ptx)
        detail = "; ".join(findings[:5]) + (f" (+{len(findings) - 5} more)" if len(findings) > 5 else "")
        results.append((op, name, not findings, detail or f"clean ({len(ptx.splitlines())} PTX lines)"))
    if arch == ARCH and (not ops or "linear" in ops):  # linear's sm_90 wgmma digit GEMM (CUDA C, NVRTC)
        from .digit_gemm import CONFIG, SMALL_M_CONFIG, name, static_check

        # the int64 C, and the P3' epilogue to each output dtype (with a bias of another dtype, or
        # none), for both configurations the product launches
        for config in (CONFIG, SMALL_M_CONFIG):
            for variant in ((0, 0, 0), (1, 0, 1), (1, 1, 0), (1, 2, 3)):
                passed, detail = static_check(config, variant)
                label = f"sm_90/digit_gemm_sm90_{name(config)}" + "_finish{}_out{}_bias{}".format(*variant)
                results.append(("linear", label, passed, detail))
    return results
