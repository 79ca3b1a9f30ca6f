"""``tools/e2e_bench.py`` with module constants set first: an A/B of a tuning knob in one device run.

Usage: ``python tools/e2e_knobs.py MOD.ATTR=VALUE [...] -- <e2e_bench.py arguments>``, e.g.
``rlkernel.grads.PENDING_TERMS=0 rlkernel.backends.triton.exact_sum.SPLIT_PROGRAMS=0`` (the trainer's
accumulators write whole states and partial sums never split: the behaviour before 7775996 / d28af73).
"""

from __future__ import annotations

import ast
import importlib
import runpy
import sys
from pathlib import Path


def main() -> None:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    for item in argv[:cut]:
        name, value = item.split("=", 1)
        module, attr = name.rsplit(".", 1)
        setattr(importlib.import_module(module), attr, ast.literal_eval(value))
        print(f"set {name} = {value}", flush=True)
    sys.argv = [str(Path(__file__).with_name("e2e_bench.py")), *argv[cut + 1:]]
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
