"""Prove a refactor left the CUDA kernels' compiled code unchanged: sm_90 PTX of every static spec, two trees.

Each tree (a git revision, or the working tree) is staged in its installed layout (as
``.ci/lint_imports.py`` does: contracts/ backends/ conformance/ under rlkernel/), and a child
process with that tree first on ``PYTHONPATH`` and a fresh ``TRITON_CACHE_DIR`` compiles every
specialisation of the CUDA static checks for sm_90 (``compile_ptx``, the checks' own options) and
writes its PTX. The PTX is compared after dropping what names the source file rather than the
code: ``.loc``/``.file`` lines, the DWARF sections and their ``$L__tmp`` labels (moving a kernel
to another file, or a helper out of a kernel, changes only those). Both trees must list the same (op, case) specs.

Usage (minutes per tree: ptxas compiles the attention and GEMM kernels slowly):

    python tools/ptx_identity.py --base 6bbfc61            # base revision vs the working tree
    python tools/ptx_identity.py --dump DIR [--rev REV]    # write one tree's PTX to DIR
    python tools/ptx_identity.py --compare DIR_A DIR_B     # compare two dumps
    python tools/ptx_identity.py --base REV --op silu_mul  # only the specs of these ops (--op repeats)

Exit status 0 when every spec's normalised PTX is identical.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"rlkernel": "rlkernel", "rlkernel/contracts": "contracts", "rlkernel/backends": "backends",
           "rlkernel/conformance": "conformance"}

_CHILD = r"""
import json, os, sys
out = sys.argv[1]
only = set(sys.argv[2:])
from rlkernel.backends.cuda import static_checks as sc
index = {}
for spec in sc.all_specs():
    op, case, fn, sig, consts = spec[:5]
    if only and op not in only:
        continue
    name = f"{op}__{case}".replace("/", "_")
    with open(os.path.join(out, name + ".ptx"), "w") as f:
        f.write(sc.compile_ptx(fn, sig, consts))
    index[name] = fn.__name__
with open(os.path.join(out, "index.json"), "w") as f:
    json.dump(index, f, indent=1, sort_keys=True)
"""


def stage(rev: str | None, dest: Path) -> None:
    """The tree of ``rev`` (None: the working tree) in its installed layout under ``dest``."""
    src = dest / "src"
    if rev is None:
        src = ROOT
    else:
        src.mkdir()
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name, folder in FOLDERS.items():
        shutil.copytree(src / folder, dest / "tree" / name, ignore=ignore, dirs_exist_ok=True)


def dump(rev: str | None, out: Path, ops: list[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rlkernel-ptx-") as tmp:
        stage(rev, Path(tmp))
        env = dict(os.environ, PYTHONPATH=str(Path(tmp) / "tree"), TRITON_CACHE_DIR=str(Path(tmp) / "cache"))
        subprocess.run([sys.executable, "-c", _CHILD, str(out), *(ops or [])], env=env, check=True, cwd=tmp)


def normalise(ptx: str) -> list[str]:
    """PTX lines without source locations, debug sections and debug labels (``$L__tmpN:``, which mark
    inlined helpers' ranges for the debug sections)."""
    lines, in_debug = [], False
    for line in ptx.splitlines():
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            in_debug = True
        if in_debug:
            if s == "}":
                in_debug = False
            continue
        if s.startswith((".loc", ".file")) or (s.startswith("$L__tmp") and s.endswith(":")):
            continue  # source locations, and the labels only the debug sections refer to
        lines.append(line)
    return lines


def compare(a: Path, b: Path) -> int:
    ia, ib = json.loads((a / "index.json").read_text()), json.loads((b / "index.json").read_text())
    if sorted(ia) != sorted(ib):
        print(f"spec lists differ: only in {a}: {sorted(set(ia) - set(ib))}; only in {b}: {sorted(set(ib) - set(ia))}")
        return 1
    differ = 0
    for name in sorted(ia):
        pa, pb = normalise((a / f"{name}.ptx").read_text()), normalise((b / f"{name}.ptx").read_text())
        if pa != pb:
            differ += 1
            print(f"DIFFERS {name}:")
            print("\n".join(list(difflib.unified_diff(pa, pb, lineterm="", n=1))[:40]))
    print(f"{len(ia)} specs compared for sm_90: {len(ia) - differ} identical PTX (without .loc/.file/debug "
          f"sections and labels), {differ} differ")
    return 1 if differ else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", help="revision to compare the working tree with")
    parser.add_argument("--dump", type=Path, help="write the PTX of --rev (default: the working tree) here")
    parser.add_argument("--rev", help="revision for --dump")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("DIR_A", "DIR_B"))
    parser.add_argument("--op", action="append", help="only the static specs of this op (repeat for several)")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.dump:
        dump(args.rev, args.dump, args.op)
        return 0
    if args.base:
        with tempfile.TemporaryDirectory(prefix="rlkernel-ptx-cmp-") as tmp:
            dump(args.base, Path(tmp) / "base", args.op)
            dump(None, Path(tmp) / "head", args.op)
            return compare(Path(tmp) / "base", Path(tmp) / "head")
    parser.error("give --base REV, --dump DIR or --compare DIR_A DIR_B")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
