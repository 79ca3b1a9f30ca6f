"""Registers, spills and the instruction mix of each loop of a CUDA kernel, without a GPU.

For the CUDA static specs of the given ops (the launchers' specialisations, ``all_specs``), with
optional constexpr and launch-option overrides, this compiles sm_90 code as Triton does and reads
Triton's cubin: its registers and stack (``cuobjdump --dump-resource-usage``) and its SASS
(``cuobjdump -sass``), where every loop (a backward branch and the code it jumps over; nested loops
show as overlapping ranges) gets its instruction count, matrix instructions (``DMMA`` / ``IMMA`` /
``HMMA`` / ``HGMMA`` / ``IGMMA``), local (spill) and shared loads / stores, barriers and the most
frequent opcodes. A bundled ``ptxas -v`` runs on the PTX again for the spill bytes a thread (its
default flags, so its code may differ a little from Triton's). These are the compiler's counts per
thread (per warp instruction), not timings: they tell, before a device run, whether a kernel variant
spills inside its hot loop and how many instructions it issues per tile against its matrix work
(docs/bench/issue12-session27.md section 3 reads attention this way).

Usage::

    python tools/sass_loops.py --op attention --case bf16_d128
    python tools/sass_loops.py --op attention --case bf16_d128 --const BLOCK_M=16 --const BLOCK_N=16 --warps 4
    python tools/sass_loops.py --op softmax --json out.json
    python tools/sass_loops.py --op all --json all.json     # every CUDA static spec (minutes)

``--case`` keeps specs whose case name contains the string; ``--const NAME=VALUE`` overrides a
constexpr (int, or True / False); ``--warps`` / ``--stages`` override the launch options.

By default every pointer and integer argument is compiled with the ``tt.divisibility`` 16 that a
launch on 16-byte aligned tensors with sizes divisible by 16 gets from Triton's JIT (the model
shapes: hidden sizes, vocabularies and K are multiples of 16), and ``--one NAME`` makes an integer
argument the constant 1, as the JIT does for a unit stride (``--one stride_wk --one stride_yn``).
``--unaligned`` compiles the static spec exactly as the static checks do (no divisibility): its
loads are byte-wise and its registers and spills can differ a lot from what runs (the session-27
survey read that variant; docs/bench/issue12-session28.md section 2).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

#: matrix-unit opcodes of sm_80 / sm_90 SASS
MATRIX_OPS = ("DMMA", "IMMA", "HMMA", "HGMMA", "IGMMA", "QGMMA")
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse_sass(sass: str) -> list[tuple[int, str]]:
    """``(address, opcode)`` of every instruction of ``cuobjdump -sass`` text; the opcode without its
    predicate and modifiers (``@!P0 LDL.LU R8, [R1]`` -> ``LDL``)."""
    out = []
    for m in _LINE.finditer(sass):
        words = m.group(2).split()
        if words and words[0].startswith("@"):
            words = words[1:]
        if words:
            out.append((int(m.group(1), 16), words[0].split(".")[0]))
    return out


def branch_targets(sass: str) -> list[tuple[int, int]]:
    """``(target, address)`` of every backward branch (a loop's back edge) in ``cuobjdump -sass`` text."""
    loops = []
    for m in _LINE.finditer(sass):
        text = m.group(2)
        if re.search(r"\bBRA\b", text):
            t = re.search(r"0x([0-9a-f]+)", text)
            addr = int(m.group(1), 16)
            if t and int(t.group(1), 16) < addr:
                loops.append((int(t.group(1), 16), addr))
    return loops


def loop_report(instructions: list[tuple[int, str]], lo: int, hi: int, top: int = 12) -> dict[str, Any]:
    """Counts of the instructions at addresses ``lo``..``hi`` (a loop body)."""
    ops = collections.Counter(op for addr, op in instructions if lo <= addr <= hi)
    return {"range": f"{lo:#x}-{hi:#x}", "instructions": sum(ops.values()),
            "matrix": sum(ops[o] for o in MATRIX_OPS), "spill_stores": ops["STL"], "spill_loads": ops["LDL"],
            "shared_stores": ops["STS"], "shared_loads": ops["LDS"], "barriers": ops["BAR"],
            "top": ops.most_common(top)}


def _tool(name: str) -> str:
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def ptxas_usage(ptx: str, arch: int) -> str:
    """The ``ptxas -v`` lines of ``ptx`` (registers, stack, spills); tries each bundled ptxas until one
    accepts the PTX version."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        errors = []
        for name in ("ptxas", "ptxas-blackwell"):
            if not os.path.exists(_tool(name)):
                continue
            run = subprocess.run([_tool(name), "-v", f"-arch=sm_{arch}a", path, "-o", os.path.join(tmp, "k.o")],
                                 capture_output=True, text=True)
            if run.returncode == 0:
                return " | ".join(line.split(":", 1)[-1].strip() for line in run.stderr.splitlines()
                                  if "spill" in line or "Used" in line)
            errors.append(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else name)
        raise RuntimeError(f"no bundled ptxas accepted the PTX: {errors}")


def cuobjdump(cubin: bytes, flag: str) -> str:
    """``cuobjdump <flag>`` of a cubin (``-sass``, ``--dump-resource-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([_tool("cuobjdump"), flag, f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)


def runtime_spec(signature: dict[str, str], constexprs: dict[str, Any],
                 ones: tuple[str, ...] = ()) -> tuple[dict[str, str], dict[str, Any], tuple[str, ...]]:
    """(signature, constexprs, aligned) of the launch-time specialisation: the arguments in ``ones``
    (those of this signature) become the constant 1, every other non-constexpr argument is aligned
    (divisible by 16)."""
    signature, constexprs = dict(signature), dict(constexprs)
    for name in (n for n in ones if n in signature):
        if signature[name].startswith(("*", "constexpr")):
            raise ValueError(f"--one {name}: a {signature[name]} argument, not an integer")
        signature[name] = "constexpr"
        constexprs[name] = 1
    return signature, constexprs, tuple(n for n, t in signature.items() if t != "constexpr")


def report(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], options: dict[str, Any],
           arch: int = 90, aligned: tuple[str, ...] = ()) -> dict[str, Any]:
    """Compile one specialisation for ``sm_<arch>`` (``aligned`` arguments divisible by 16) and report
    its usage and loops."""
    from rlkernel.backends.triton.compile import compile_for

    compiled = compile_for(fn, signature, constexprs, compiler="cuda", arch=arch, warp_size=32,
                           options=dict(options, enable_fp_fusion=False), aligned=aligned)
    sass = cuobjdump(compiled.asm["cubin"], "-sass")
    instructions = parse_sass(sass)
    usage = " ".join(w for line in cuobjdump(compiled.asm["cubin"], "--dump-resource-usage").splitlines()
                     for w in line.split() if w.startswith(("REG:", "STACK:", "SHARED:", "LOCAL:")))
    return {"usage": usage, "ptxas_v": ptxas_usage(compiled.asm["ptx"], arch), "instructions": len(instructions),
            "loops": [loop_report(instructions, lo, hi) for lo, hi in branch_targets(sass)]}


def _value(text: str) -> Any:
    if text in ("True", "False"):
        return text == "True"
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", action="append", required=True, help="op of the static specs ('all': every op)")
    parser.add_argument("--case", default="", help="keep specs whose case name contains this")
    parser.add_argument("--const", action="append", default=[], help="NAME=VALUE constexpr override")
    parser.add_argument("--warps", type=int, help="num_warps override")
    parser.add_argument("--stages", type=int, help="num_stages override")
    parser.add_argument("--one", action="append", default=[], help="integer argument equal to 1 (a unit stride)")
    parser.add_argument("--unaligned", action="store_true",
                        help="compile the static spec as it is (no divisibility, no --one)")
    parser.add_argument("--json", help="write the reports here")
    args = parser.parse_args(argv)
    if args.unaligned and args.one:
        raise SystemExit("--one needs the aligned (default) compile; drop --unaligned")
    from rlkernel.backends.cuda.static_checks import all_specs

    overrides = {name: _value(value) for name, value in (c.split("=", 1) for c in args.const)}
    rows: list[dict[str, Any]] = []
    seen_ones: set[str] = set()
    for op, case, fn, signature, constexprs, options in all_specs():
        if ("all" not in args.op and op not in args.op) or args.case not in case:
            continue
        consts = dict(constexprs)
        for name, value in overrides.items():
            if name not in consts:
                raise SystemExit(f"--const {name}: not a constexpr of {op}/{case} (has {sorted(consts)})")
            consts[name] = value
        opts = dict(options)
        if args.warps:
            opts["num_warps"] = args.warps
        if args.stages:
            opts["num_stages"] = args.stages
        sig, aligned = signature, ()
        if not args.unaligned:
            try:
                sig, consts, aligned = runtime_spec(signature, consts, tuple(args.one))
            except ValueError as e:
                raise SystemExit(f"{op}/{case}: {e}") from None
        ones = [n for n in args.one if n in signature]
        seen_ones.update(ones)
        row = {"op": op, "case": case, "constexprs": {k: consts[k] for k in overrides}, "options": opts,
               "aligned": not args.unaligned, "ones": ones, **report(fn, sig, consts, opts, aligned=aligned)}
        rows.append(row)
        how = "unaligned" if args.unaligned else "aligned" + "".join(f", {n}=1" for n in ones)
        print(f"{op}/{case} {row['constexprs']} {opts} ({how}): {row['instructions']} instructions; Triton's cubin "
              f"{row['usage']}; ptxas -v again: {row['ptxas_v']}")
        for loop in row["loops"]:
            print(f"  loop {loop['range']}: {loop['instructions']} instr, matrix {loop['matrix']}, "
                  f"spills {loop['spill_stores']} st / {loop['spill_loads']} ld, shared {loop['shared_stores']} st / "
                  f"{loop['shared_loads']} ld, bar {loop['barriers']}; top {loop['top'][:8]}")
    unused = set(args.one) - seen_ones
    if unused:
        raise SystemExit(f"--one {sorted(unused)}: no selected spec has such an argument")
    if not rows:
        raise SystemExit(f"no static spec of {args.op} matches case {args.case!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
