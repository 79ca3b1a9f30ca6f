"""The conformance kit: everything a vendor sends back from new hardware, in one archive.

``rlkernel conformance --backend X --full --kit --out DIR`` writes, next to the run's
``report.json``/``report.md``/``junit.xml``:

- ``primitives.json``: the primitive probes (``rlkernel.conformance.primitives``) on the device;
- ``environment.json``: driver, toolkit, device name, architecture, versions, commit;
- ``kernels.json``: every Triton kernel compiled in the run (the ones that ran), with the SHA-256
  of its code: for AMD the hash of :func:`rlkernel.backends.rocm.static_checks.code_sha256`, the
  one ``conformance/results/rocm-static/report.json`` lists per kernel and architecture; for
  NVIDIA the hash of the PTX without source locations (as ``tools/ptx_identity.py`` compares);
- ``MANIFEST.sha256``: the SHA-256 of every file above (``sha256sum -c`` format);

and packs the directory into ``DIR.tar.gz``. How a maintainer checks a submission:
docs/conformance-kit.md.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import tarfile
from pathlib import Path
from typing import Any


def compiled_kernels() -> list[dict[str, Any]]:
    """The Triton kernels of ``rlkernel.backends.triton`` compiled in this process, with code hashes."""
    try:
        from rlkernel.backends.triton import KERNELS
    except ImportError:
        return []
    found: list[dict[str, Any]] = []
    modules = sorted({"_prims", *(entry.split(":")[0] for entry in KERNELS.values())})
    for mod in modules:
        try:
            module = importlib.import_module(f"rlkernel.backends.triton.{mod}")
        except ImportError:
            continue
        for attr, fn in sorted(vars(module).items()):
            caches = getattr(fn, "device_caches", None)
            if not isinstance(caches, dict) or not attr.endswith("_kernel"):
                continue
            for device, entry in caches.items():
                cache = entry[0] if isinstance(entry, tuple) else entry
                for compiled in getattr(cache, "values", lambda: [])():
                    found.append(_describe(mod, attr, device, compiled))
    return found


def _describe(module: str, name: str, device: Any, compiled: Any) -> dict[str, Any]:
    asm = getattr(compiled, "asm", {}) or {}
    meta = getattr(compiled, "metadata", None)
    constants = {str(k): repr(v) for k, v in (getattr(meta, "constants", None) or {}).items()} if meta else {}
    if "amdgcn" in asm:
        from rlkernel.backends.rocm.static_checks import code_sha256

        kind, digest = "amdgcn", code_sha256(asm["amdgcn"])
    elif "ptx" in asm:
        from rlkernel.backends.cuda.static_checks import ptx_code_sha256

        kind, digest = "ptx", ptx_code_sha256(asm["ptx"])
    else:
        kind, digest = "none", ""
    binary = asm.get("hsaco") or asm.get("cubin") or b""
    return {"module": module, "kernel": name, "device": str(device), "code": kind, "code_sha256": digest,
            "binary_sha256": hashlib.sha256(binary if isinstance(binary, bytes) else binary.encode()).hexdigest(),
            "target": str(getattr(meta, "target", "")), "constants": constants,
            "num_warps": getattr(meta, "num_warps", None), "num_stages": getattr(meta, "num_stages", None)}


def write(out_dir: Path, environment: dict[str, Any], primitives: list[dict[str, Any]]) -> Path:
    """Write the kit files into ``out_dir`` (beside the reports) and pack ``out_dir.tar.gz``; its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "environment.json").write_text(json.dumps(environment, indent=1, default=str) + "\n")
    (out_dir / "primitives.json").write_text(json.dumps(primitives, indent=1) + "\n")
    (out_dir / "kernels.json").write_text(json.dumps(compiled_kernels(), indent=1) + "\n")
    files = sorted(p for p in out_dir.rglob("*") if p.is_file() and p.name != "MANIFEST.sha256")
    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out_dir)}" for p in files]
    (out_dir / "MANIFEST.sha256").write_text("\n".join(lines) + "\n")
    archive = out_dir.with_name(out_dir.name + ".tar.gz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out_dir, arcname=out_dir.name)
    return archive


def verify(directory: Path) -> list[str]:
    """Problems with an unpacked kit (empty when every file matches MANIFEST.sha256 and nothing is missing)."""
    manifest = directory / "MANIFEST.sha256"
    if not manifest.exists():
        return ["MANIFEST.sha256 is missing"]
    problems = []
    for line in manifest.read_text().splitlines():
        digest, _, name = line.partition("  ")
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problems.append(f"{name}: SHA-256 differs from the manifest")
    for required in ("report.json", "report.md", "junit.xml", "environment.json", "primitives.json", "kernels.json"):
        if not (directory / required).exists():
            problems.append(f"{required}: missing")
    return problems
