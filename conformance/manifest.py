"""The golden manifest: SHA-256 of the reference's output for every golden/adversarial case.

``conformance/golden/manifest.json`` is committed, so a backend cannot edit its expectations,
and the reference itself is checked against it (``rlkernel conformance --backend reference``).
Layout::

    {"suite_version": 1,
     "ops": {"<contract module>": {"version": <CONTRACT.version>,
                                   "cases": {"<case name>": "<sha256>"}}}}

Regenerate entries from the reference with
``python -m rlkernel.conformance.manifest --update [--op OP ...]``; entries of ops not
regenerated are kept as they are.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from rlkernel.conformance.cases import bit_cases, contract_version, op_of, reference_of
from rlkernel.conformance.hashing import sha256_of

logger = logging.getLogger(__name__)

#: Version of the suite's rules (hash layout, case semantics). Bump when hashes change meaning.
SUITE_VERSION = 1

#: The committed manifest, beside this module.
MANIFEST_PATH = Path(__file__).resolve().parent / "golden" / "manifest.json"

UPDATE_COMMAND = "python -m rlkernel.conformance.manifest --update --op {op}"


def empty() -> dict[str, Any]:
    return {"suite_version": SUITE_VERSION, "ops": {}}


def load(path: Path | None = None) -> dict[str, Any]:
    """The manifest at ``path`` (default :data:`MANIFEST_PATH`); an absent file is empty.

    Raises
    ------
    ValueError
        The file is not a manifest of this suite version.
    """
    path = path or MANIFEST_PATH
    if not path.exists():
        return empty()
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or "ops" not in data:
        raise ValueError(f"{path} is not a conformance manifest (expected keys suite_version, ops)")
    if data.get("suite_version") != SUITE_VERSION:
        raise ValueError(
            f"{path} holds suite_version {data.get('suite_version')!r}, this suite is {SUITE_VERSION}: "
            f"regenerate it with `python -m rlkernel.conformance.manifest --update`"
        )
    return data


def file_sha256(path: Path | None = None) -> str | None:
    """SHA-256 of the manifest file's bytes, ``None`` if it does not exist."""
    path = path or MANIFEST_PATH
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def expected_hash(manifest: dict[str, Any], module_name: str, version: int, case: str) -> tuple[str | None, str]:
    """``(sha256, "")`` for a case, or ``(None, why)`` when the manifest cannot answer."""
    entry = manifest["ops"].get(module_name)
    fix = UPDATE_COMMAND.format(op=module_name)
    if entry is None:
        return None, f"op {module_name!r} is not in the manifest: generate it with `{fix}`"
    if entry.get("version") != version:
        return None, f"manifest holds version {entry.get('version')}, contract is {version}: regenerate with `{fix}`"
    sha = entry.get("cases", {}).get(case)
    if sha is None:
        return None, f"case {case!r} is not in the manifest for {module_name} v{version}: regenerate with `{fix}`"
    return str(sha), ""


def entry_for(module: ModuleType) -> dict[str, Any]:
    """A fresh manifest entry for one contract module, computed by its reference on the CPU."""
    cases: dict[str, str] = {}
    for case in bit_cases(module, full=True):
        reference = reference_of(module, op_of(module, case))
        cases[case.name] = sha256_of(reference(**case.make()))
        logger.info("manifest: %s/%s %s", module.__name__, case.name, cases[case.name])
    return {"version": contract_version(module), "cases": dict(sorted(cases.items()))}


def write_entries(entries: dict[str, dict[str, Any]], path: Path | None = None) -> dict[str, Any]:
    """Replace the entries of the ops in ``entries``, keep the others, write the file."""
    path = path or MANIFEST_PATH
    manifest = load(path) if path.exists() else empty()
    manifest["ops"].update(entries)
    manifest["ops"] = dict(sorted(manifest["ops"].items()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


def update(modules: dict[str, ModuleType], path: Path | None = None) -> dict[str, Any]:
    """Regenerate the entries of ``modules`` (name -> contract module), keep the others, write."""
    return write_entries({name: entry_for(module) for name, module in modules.items()}, path)


def main(argv: list[str] | None = None) -> int:
    """``python -m rlkernel.conformance.manifest --update [--op OP ...] [--manifest PATH]``.

    A contract module whose cases cannot be generated is reported and left as it was in the
    manifest; the others are written; the exit status is 1 if any failed.
    """
    from rlkernel.contracts import load_contracts

    parser = argparse.ArgumentParser(prog="python -m rlkernel.conformance.manifest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help="regenerate entries from the reference")
    parser.add_argument("--op", action="append",
                        help="contract module to regenerate (repeatable; default: all present)")
    parser.add_argument("--manifest", type=Path, default=MANIFEST_PATH,
                        help="manifest file (default: the committed one)")
    args = parser.parse_args(argv)
    if not args.update:
        parser.error("nothing to do: pass --update to regenerate entries from the reference")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    broken: dict[str, BaseException] = {}
    modules, missing = load_contracts(args.op, errors=broken)
    if args.op and missing:
        parser.error(f"contract module(s) {missing} do not exist yet")
    entries: dict[str, dict[str, Any]] = {}
    failed: list[str] = list(broken)
    for name, exc in broken.items():
        print(f"{name}: FAILED to import, entry left as it was: {type(exc).__name__}: {exc}")
    for name, module in modules.items():
        t0 = time.perf_counter()
        try:
            entries[name] = entry_for(module)
        except Exception as exc:  # reported; this op's entry stays as it was
            failed.append(name)
            print(f"{name}: FAILED, entry left as it was: {type(exc).__name__}: {exc}")
            continue
        print(f"{name}: version {entries[name]['version']}, {len(entries[name]['cases'])} cases "
              f"({time.perf_counter() - t0:.1f} s)")
    write_entries(entries, args.manifest)
    if missing:
        print(f"not present (entries kept as they were): {', '.join(missing)}")
    print(f"wrote {args.manifest}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
