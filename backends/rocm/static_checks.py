"""AMD static checks: compile every shared Triton kernel for gfx942/gfx90a/gfx950 on the CPU and scan the AMDGCN.

No GPU and no ROCm install are needed: ``triton.compile(ASTSource(...), target=GPUTarget("hip",
"gfx942", 64))`` runs LLVM's AMDGPU backend and the ld.lld bundled in the Triton wheel and gives
``amdgcn`` (assembly) and ``hsaco`` (the code object). The assembly of each kernel is checked
for what would break R1-R3 (docs/numerics.md) on AMD hardware:

- ``fp32-fma``: no contraction. ``v_fma_f32``/``v_fmac_f32`` (and every other fused or legacy
  multiply-add: ``v_mad*``, ``v_mac*``, ``v_fmaak/fmamk``, ``v_pk_fma_f32``, f16/f64 forms) are
  allowed only inside the three sequences below, which LLVM emits for exact operations.
  ``v_fma_mix_f32`` / ``v_fma_mixlo_f16`` with the addend ``neg(0)`` are products, not sums
  (LLVM selects them for ``fmul`` / ``fptrunc(fmul)`` of f16-extended operands: one f32
  rounding, then the conversion); ``v_fma_mix_f32`` with a factor ``1.0`` is a sum (``fsub`` /
  ``fadd`` of an f16-extended operand: the product is exact, one f32 rounding); any other
  addend is a contraction.
- ``approx-rcp`` / ``approx-sqrt`` / ``approx-transcendental`` / ``approx-rsq``: no ``v_exp_f32``,
  ``v_log_f32``, ``v_sin/cos``, ``v_rsq_*``, ``v_rcp_*`` or ``v_sqrt_*`` except inside:

  1. **IEEE division** (``tl.math.div_rn`` -> ``fdiv`` -> LLVM's correctly rounded f32
     division): ``v_div_scale_f32`` (denominator and numerator), ``v_rcp_f32`` of the scaled
     denominator (the seed), Newton steps ``v_fma_f32``/``v_fmac_f32`` on those, ``v_mul_f32``,
     ``v_div_fmas_f32``, ``v_div_fixup_f32`` (special cases, exponent). An fma counts as part of
     it when a multiplicand comes from ``v_div_scale_f32``, from the seed or from an earlier step.
  2. **IEEE square root** (``tl.math.sqrt_rn`` -> ``llvm.sqrt.f32`` -> LLVM's correctly rounded
     expansion): ``v_sqrt_f32`` gives ``s``; its neighbours ``s - 1ulp``, ``s + 1ulp`` are integer
     adds of ±1 to the bits; the residuals ``fma(-s∓, s, x)`` pick the correctly rounded one with
     ``v_cndmask``. An fma counts as part of it when both multiplicands are ``s`` or a neighbour.
  3. **Exact integer division** (``//`` and ``%`` on runtime integers): the quotient estimate
     ``v_cvt_f32_u32`` -> ``v_rcp_iflag_f32``/``v_rcp_f32`` -> ``v_mul_f32`` (0x4f7ffffe,
     0x5f7ffffc, 0x2f800000; 64-bit: ``v_fmac_f32`` with 0x4f800000 / 0xcf800000) ->
     ``v_cvt_u32_f32``, followed by integer correction steps that make the quotient exact (gfx90a
     uses the unfused ``v_mac_f32`` where gfx942 uses ``v_fmac_f32``).

  Membership is decided by a def-use pass over the kernel's instructions in program order
  (registers carry a tag: division, sqrt or integer-division, set by the instruction that wrote
  them). It is a linear approximation of the data flow, not a proof; the conformance run on AMD
  hardware is the proof.
- ``float-atomic``: no float atomics (``*_atomic_*_f32/f64/f16/bf16``, ``ds_add_f32``, ...) and no
  compare-and-swap loops (``*_atomic_cmpswap``: how a float atomic lowers without native
  support); in the LLVM IR, no ``atomicrmw`` on a float type. Integer atomics (split-K ``linear``
  adds int64 partials) are exact in any order.
- ``denormals``: the kernel descriptor keeps fp32 and fp16/fp64 denormals on input and output
  (``.amdhsa_float_denorm_mode_32 3``, ``.amdhsa_float_denorm_mode_16_64 3``) and no instruction
  changes the mode (``s_denorm_mode``, ``s_setreg`` of ``HW_REG_MODE``).
- ``float-matrix``: no float matrix or dot instructions (``v_mfma_f32_*``, ``v_dot2_f32_*``, WMMA).
- ``int8-mfma``: the digit GEMMs (``linear``'s GEMM, ``attention``) contain int8 MFMA
  instructions (``v_mfma_i32_*i8``): their products run on the matrix units, exactly.
- ``lds``: the LDS the kernel takes fits the workgroup's (64 KiB on gfx90a/gfx942, 160 KiB on
  gfx950): a kernel that does not fit compiles but cannot launch.

:func:`static_checks` returns ``(op, "<arch>/<case>", passed, detail)`` per specialisation and
architecture (the conformance runner records them as kind ``static``); :func:`report` adds the
SHA-256 of every code object, for ``conformance/results/rocm-static/``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlkernel.backends.triton.compile import Spec, all_specs, compile_for
from rlkernel.backends.triton.targets import ROCM

#: architecture -> LDS bytes per workgroup
LDS_BYTES = {"gfx90a": 64 << 10, "gfx942": 64 << 10, "gfx950": 160 << 10}
#: kernels whose products must run on int8 MFMA (the digit GEMMs)
DIGIT_GEMMS = ("_linear_gemm_kernel", "_attention_fwd_kernel")
#: what every check of a kernel is called (the rule names of findings)
RULES = ("fp32-fma", "approx-rcp", "approx-sqrt", "approx-transcendental", "approx-rsq", "float-atomic",
         "denormals", "float-matrix", "int8-mfma", "lds")

_FMA_FAMILY = re.compile(r"^v_(pk_)?(fma|fmac|mad|mac|fmaak|fmamk|madak|madmk)(_legacy)?_f(16|32|64)$")
_MIX = re.compile(r"^v_(fma|mad)_mix(lo|hi)?_(f16|f32|bf16)$")
_RCP = re.compile(r"^v_rcp(_iflag|_legacy|_clamp)?_f(16|32|64)$")
_SQRT = re.compile(r"^v_sqrt_f(16|32|64)$")
_TRANSCENDENTAL = re.compile(r"^v_(exp|log|sin|cos)(_legacy)?_f(16|32|64)$")
_RSQ = re.compile(r"^v_rsq(_clamp|_legacy)?_f(16|32|64)$")
_FLOAT_ATOMIC = re.compile(r"^(global|flat|buffer|scratch|ds)_atomic_\w*_(f16|bf16|f32|f64)(_\w+)?$"
                           r"|^ds_(add|sub|min|max|pk_add)(_rtn)?_(f16|bf16|f32|f64)$"
                           r"|_atomic_(cmpswap|fcmpswap)|^ds_(cmpst|cmpstore|wrxchg)")
_FLOAT_MATRIX = re.compile(r"^v_(mfma_f(32|64)|smfmac_f32|wmma_f|swmmac_f|dot\d+c?_f(16|32)|pk_dot)")
_INT8_MFMA = re.compile(r"^v_mfma_i32_\w*i8$")
_MODE_CHANGE = re.compile(r"^s_denorm_mode$|^s_setreg(_imm32)?_b32$")
_LLIR_FLOAT_ATOMIC = re.compile(r"\batomicrmw\s+(volatile\s+)?f(add|sub|max|min)\b"
                                r"|\batomicrmw\b.*\b(float|half|bfloat|double)\b")
#: literals of LLVM's integer-division quotient estimate (2**32 - 2 ulp, 2**64 - 4 ulp, 2**-32, 2**32, -2**32)
_INT_DIV_LITERALS = {"0x4f7ffffe", "0x5f7ffffc", "0x2f800000", "0x4f800000", "0xcf800000"}
#: multiply-adds of the 64-bit quotient estimate (gfx942: v_fmac_f32; gfx90a: v_mac_f32, unfused)
_INT_DIV_MULADD = ("v_fmac_f32", "v_fmamk_f32", "v_fmaak_f32", "v_fma_f32", "v_mac_f32", "v_mad_f32", "v_madmk_f32",
                   "v_madak_f32")
_REG = re.compile(r"\b([vs])(\d+)\b|\b([vs])\[(\d+):(\d+)\]")
_INSTR = re.compile(r"^(v|s|global|buffer|ds|flat|scratch)_\w+")


@dataclass
class Instr:
    """One AMDGCN instruction: mnemonic without encoding suffix, operand text, register operands."""

    line: str
    mnemonic: str
    operands: list[str]
    dest: list[str] = field(default_factory=list)
    srcs: list[list[str]] = field(default_factory=list)


def _regs(text: str) -> list[str]:
    out = []
    for m in _REG.finditer(text):
        if m.group(1):
            out.append(f"{m.group(1)}{m.group(2)}")
        else:
            out += [f"{m.group(3)}{i}" for i in range(int(m.group(4)), int(m.group(5)) + 1)]
    return out


def instructions(amdgcn: str) -> Iterable[Instr]:
    """The instructions of the kernel text (directives, labels, comments and metadata left out)."""
    for raw in amdgcn.splitlines():
        line = raw.split(";")[0].split("//")[0].strip()
        if not line or not _INSTR.match(line) or line.endswith(":"):
            continue
        head, _, rest = line.partition(" ")
        mnemonic = re.sub(r"_(e32|e64|dpp|sdwa|e64_dpp)$", "", head)
        operands = [o.strip() for o in rest.split(",")] if rest.strip() else []
        ins = Instr(line, mnemonic, operands)
        if operands:
            ins.dest = _regs(operands[0])
            ins.srcs = [_regs(o) for o in operands[1:]]
        yield ins


def _tag_of(tags: dict[str, str], regs: Sequence[str]) -> set[str]:
    return {tags[r] for r in regs if r in tags}


def scan_amdgcn(amdgcn: str, *, digit_gemm: bool = False, llir: str = "", shared: int = 0,
                lds_bytes: int = 64 << 10) -> list[str]:
    """Findings ``"<rule>: <instruction>"`` in one kernel's AMDGCN (empty when it conforms).

    ``digit_gemm``: the kernel must contain int8 MFMA. ``llir``: its LLVM IR (float atomics).
    ``shared``: LDS bytes it takes (``compiled.metadata.shared``), checked against ``lds_bytes``.
    """
    findings: list[str] = []
    tags: dict[str, str] = {}  # register -> "div" | "sqrt" | "int" (the sequence that wrote it)
    consts: dict[str, str] = {}  # SGPR -> literal it holds (s_mov_b32 s4, 0x4f800000)
    int8_mfma = False
    for ins in instructions(amdgcn):
        mn, ops = ins.mnemonic, ins.operands
        srcs = [r for group in ins.srcs for r in group]
        new_tag: str | None = None
        if mn == "s_mov_b32" and len(ops) == 2:
            consts[ops[0]] = ops[1].lower()
        literals = {o.lower() for o in ops[1:]} | {consts.get(r, "") for r in srcs}
        if mn in ("v_div_scale_f32", "v_div_fmas_f32"):
            new_tag = "div"
        elif mn in ("v_cvt_f32_u32", "v_cvt_f32_i32"):
            new_tag = "int"
        elif _RCP.match(mn):
            seed = _tag_of(tags, srcs)
            if mn in ("v_rcp_f32", "v_rcp_iflag_f32") and seed & {"div", "int"}:
                new_tag = "div" if "div" in seed and mn == "v_rcp_f32" else "int"
            else:
                findings.append(f"approx-rcp: {ins.line}")
        elif _SQRT.match(mn):
            if mn == "v_sqrt_f32":
                new_tag = "sqrt"  # an error only if no IEEE correction follows (checked below)
            else:
                findings.append(f"approx-sqrt: {ins.line}")
        elif mn in ("v_add_u32", "v_add_co_u32", "v_add_nc_u32", "v_sub_u32") and _tag_of(tags, srcs) == {"sqrt"} \
                and any(o in ("1", "-1") for o in ops[1:]):
            new_tag = "sqrt"  # s -/+ 1 ulp of the sqrt estimate
        elif mn in ("v_mul_f32", "v_trunc_f32") and "int" in _tag_of(tags, srcs) \
                and (mn == "v_trunc_f32" or literals & _INT_DIV_LITERALS):
            new_tag = "int"
        elif mn == "v_mul_f32" and "div" in _tag_of(tags, srcs):
            new_tag = "div"
        elif _FMA_FAMILY.match(mn):
            mult_tags = [_tag_of(tags, g) for g in ins.srcs[:2]]  # the multiplicands (v_fmac: d += a * b)
            flat = set().union(*mult_tags) if mult_tags else set()
            if mn in ("v_fma_f32", "v_fmac_f32") and "div" in flat:
                new_tag = "div"
            elif mn in ("v_fma_f32", "v_fmac_f32") and len(mult_tags) == 2 and all(t == {"sqrt"} for t in mult_tags):
                new_tag = None  # a residual of the sqrt correction (read by v_cmp only)
            elif mn in _INT_DIV_MULADD and flat == {"int"} \
                    and literals & _INT_DIV_LITERALS:
                new_tag = "int"
            else:
                findings.append(f"fp32-fma: {ins.line}")
        elif _MIX.match(mn):
            addend = ops[3].split()[0] if len(ops) >= 4 and ops[3].split() else ""
            factors = [o.split()[0].lstrip("-") for o in ops[1:3] if o.split()]
            # a * 1.0 + c with an fp32 result is the IEEE addition a + c (the product is exact):
            # LLVM selects it for fp32(half) - fp32 (softmax's x - m on fp16 input)
            unit_add = mn == "v_fma_mix_f32" and "1.0" in factors
            if addend not in ("neg(0)", "-0") and not unit_add:
                findings.append(f"fp32-fma: {ins.line}")
        elif _TRANSCENDENTAL.match(mn):
            findings.append(f"approx-transcendental: {ins.line}")
        elif _RSQ.match(mn):
            findings.append(f"approx-rsq: {ins.line}")
        elif _FLOAT_ATOMIC.search(mn):
            findings.append(f"float-atomic: {ins.line}")
        elif _FLOAT_MATRIX.match(mn):
            findings.append(f"float-matrix: {ins.line}")
        elif _MODE_CHANGE.match(mn) and (mn == "s_denorm_mode" or "MODE" in ins.line):
            findings.append(f"denormals: {ins.line} (changes the float mode)")
        if _INT8_MFMA.match(mn):
            int8_mfma = True
        for reg in ins.dest:
            if new_tag is None:
                tags.pop(reg, None)
            else:
                tags[reg] = new_tag
    findings += _sqrt_without_correction(amdgcn)
    for directive in (".amdhsa_float_denorm_mode_32", ".amdhsa_float_denorm_mode_16_64"):
        m = re.search(rf"{re.escape(directive)}\s+(\d+)", amdgcn)
        if m is None or m.group(1) != "3":
            found = m.group(1) if m else "missing"
            findings.append(f"denormals: {directive} {found} (3 = denormals kept on input and output)")
    if llir:
        findings += [f"float-atomic: {line.strip()}" for line in llir.splitlines() if _LLIR_FLOAT_ATOMIC.search(line)]
    if digit_gemm and not int8_mfma:
        findings.append("int8-mfma: no v_mfma_i32_*i8 in a digit GEMM (its products do not run on the matrix units)")
    if shared > lds_bytes:
        findings.append(f"lds: {shared} bytes of LDS > {lds_bytes} per workgroup (cannot launch)")
    return findings


def _sqrt_without_correction(amdgcn: str) -> list[str]:
    """``v_sqrt_f32`` whose result is not corrected by the two residual fmas of the IEEE sequence."""
    found = []
    seq = list(instructions(amdgcn))
    for i, ins in enumerate(seq):
        if ins.mnemonic != "v_sqrt_f32" or not ins.dest:
            continue
        s = ins.dest[0]
        window = seq[i + 1:i + 40]
        residuals = 0
        for later in window:
            if later.mnemonic in ("v_fma_f32", "v_fmac_f32") and any(s in g for g in later.srcs[:2]):
                residuals += 1
            if s in later.dest and later.mnemonic != "v_sqrt_f32":
                break
        if residuals < 2:
            found.append(f"approx-sqrt: {ins.line} (no IEEE correction: {residuals} residual fma of 2)")
    return found


def code_sha256(amdgcn: str) -> str:
    """SHA-256 of a kernel's code: its instructions and kernel-descriptor directives, one per line.

    Source locations (``.loc``, ``.file``, DWARF sections) are left out: they name the checkout's
    paths, so the code object's own hash differs between machines for the same code. This hash
    is the one to compare between the static-check report and a vendor's run.
    """
    lines = [i.line for i in instructions(amdgcn)]
    lines += [raw.strip() for raw in amdgcn.splitlines() if raw.strip().startswith(".amdhsa_")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


# ------------------------------------------------------------------------------------------- compile


@dataclass
class Checked:
    """One specialisation compiled for one architecture and scanned."""

    op: str
    case: str
    arch: str
    kernel: str
    findings: list[str]
    hsaco_sha256: str = ""
    code_sha256: str = ""
    lds: int = 0
    scratch: int = 0
    mfma: list[str] = field(default_factory=list)
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.findings and not self.error

    def detail(self) -> str:
        if self.error:
            return f"compile failed: {self.error}"
        if self.findings:
            more = f" (+{len(self.findings) - 5} more)" if len(self.findings) > 5 else ""
            return "; ".join(self.findings[:5]) + more
        mfma = f", {'/'.join(self.mfma)}" if self.mfma else ""
        return f"clean (LDS {self.lds} B, scratch {self.scratch} B{mfma}; code sha256 {self.code_sha256})"


def check_spec(spec: Spec, arch: str) -> Checked:
    """Compile one specialisation for ``arch`` (launch options, ``enable_fp_fusion=False``) and scan it."""
    op, case, fn, signature, constexprs, options = spec
    name = getattr(fn, "__name__", str(fn))
    try:
        compiled = compile_for(fn, signature, constexprs, compiler=ROCM.compiler, arch=arch,
                               warp_size=ROCM.warp_size, options={"enable_fp_fusion": False, **options})
    except Exception as exc:  # a kernel that does not compile is a failed check, with the reason
        return Checked(op, case, arch, name, [], error=f"{type(exc).__name__}: {str(exc)[:500]}")
    asm = compiled.asm["amdgcn"]
    hsaco = compiled.asm["hsaco"]
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    findings = scan_amdgcn(asm, digit_gemm=name in DIGIT_GEMMS, llir=compiled.asm.get("llir", ""),
                           shared=shared, lds_bytes=LDS_BYTES.get(arch, 64 << 10))
    scratch = re.search(r"\.amdhsa_private_segment_fixed_size\s+(\d+)", asm)
    mfma = sorted({i.mnemonic for i in instructions(asm) if i.mnemonic.startswith("v_mfma")})
    return Checked(op, case, arch, name, findings,
                   hsaco_sha256=hashlib.sha256(hsaco if isinstance(hsaco, bytes) else hsaco.encode()).hexdigest(),
                   code_sha256=code_sha256(asm), lds=shared,
                   scratch=int(scratch.group(1)) if scratch else 0, mfma=mfma)


def _check_indexed(job: tuple[int, str]) -> Checked:
    index, arch = job
    return check_spec(all_specs(ROCM)[index], arch)


def supported_archs() -> list[str]:
    """The ROCm target's architectures the installed Triton's AMD backend compiles for."""
    try:
        from triton.backends.amd.compiler import HIPBackend
        from triton.backends.compiler import GPUTarget
    except ImportError:
        return []
    archs = []
    for arch in ROCM.static_archs:
        try:
            HIPBackend(GPUTarget("hip", arch, ROCM.warp_size))
        except Exception:
            continue
        archs.append(str(arch))
    return archs


def check_all(ops: list[str] | None = None, archs: Sequence[str] | None = None,
              workers: int | None = None) -> list[Checked]:
    """Every specialisation of ``ops`` (default all) for every arch (default: :func:`supported_archs`).

    ``workers`` > 1 compiles in that many processes (default: the CPUs, at most 8); the longest
    compiles (attention, the GEMMs) are started first. Results come in spec order.
    """
    specs = all_specs(ROCM)
    archs = list(archs) if archs is not None else supported_archs()
    jobs = [(i, arch) for arch in archs for i, spec in enumerate(specs) if not ops or spec[0] in ops]
    heavy = ("attention", "linear")
    jobs.sort(key=lambda j: (not specs[j[0]][0].startswith(heavy), archs.index(j[1]), j[0]))
    workers = workers if workers is not None else min(8, os.cpu_count() or 1)
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(_check_indexed, jobs))
    else:
        results = [check_spec(specs[i], arch) for i, arch in jobs]
    order = {job: k for k, job in enumerate(sorted(jobs, key=lambda j: (archs.index(j[1]), j[0])))}
    return [r for _, r in sorted(zip(jobs, results), key=lambda jr: order[jr[0]])]


def static_checks(ops: list[str] | None = None, archs: Sequence[str] | None = None) -> list[tuple[str, str, bool, str]]:
    """``[(op, "<arch>/<case>", passed, detail)]`` for every specialisation and architecture."""
    return [(c.op, f"{c.arch}/{c.case}", c.passed, c.detail()) for c in check_all(ops, archs)]


def report(ops: list[str] | None = None, archs: Sequence[str] | None = None) -> dict[str, Any]:
    """The static-check report: Triton version, per architecture the counts, and every kernel's
    result with the SHA-256 of its code (:func:`code_sha256`) and of its code object (``hsaco``,
    which also holds this checkout's source paths)."""
    import triton

    checked = check_all(ops, archs)
    archs_done = sorted({c.arch for c in checked}, key=lambda a: [str(x) for x in ROCM.static_archs].index(a))
    return {
        "backend": "rocm",
        "triton": triton.__version__,
        "target": {"compiler": ROCM.compiler, "warp_size": ROCM.warp_size, "linear_prefill": ROCM.linear_prefill,
                   "linear_decode": ROCM.linear_decode},
        "archs": {a: {"compiled": sum(1 for c in checked if c.arch == a and not c.error),
                      "passed": sum(1 for c in checked if c.arch == a and c.passed),
                      "failed": sum(1 for c in checked if c.arch == a and not c.passed)} for a in archs_done},
        "kernels": [{"op": c.op, "case": c.case, "arch": c.arch, "kernel": c.kernel,
                     "status": "pass" if c.passed else "fail", "findings": c.findings, "error": c.error,
                     "lds_bytes": c.lds, "scratch_bytes": c.scratch, "mfma": c.mfma,
                     "code_sha256": c.code_sha256, "hsaco_sha256": c.hsaco_sha256} for c in checked],
    }
