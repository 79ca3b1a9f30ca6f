"""Facts about the machine a run happened on, for reports (conformance, bench, ``rlkernel info``).

Nothing here initialises a device other than the one asked about: CUDA facts are read only
when ``device`` is a CUDA device, and no other vendor's module is imported.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch


def package_version(name: str) -> str | None:
    """Installed version of distribution ``name`` (without importing it), or ``None``."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (Linux), else :func:`platform.processor`."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cuda_facts(device: torch.device) -> dict[str, Any]:
    """Name, capability, driver and runtime of a CUDA (or ROCm-as-cuda) device."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    facts: dict[str, Any] = {
        "gpu_name": torch.cuda.get_device_name(index),
        "gpu_capability": f"{major}.{minor}",
        "cuda_runtime": torch.version.cuda,
        "hip_runtime": getattr(torch.version, "hip", None),
        "gpu_driver": gpu_driver(),
    }
    return facts


def gpu_driver() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``, if present."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def git_commit(cwd: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the working directory, or ``None`` outside a repository.

    ``RLKERNEL_COMMIT`` overrides it: a copy of the tree without ``.git`` (a device machine) is
    told the commit it was copied from (tools/device_run.sh).
    """
    if os.environ.get("RLKERNEL_COMMIT"):
        return os.environ["RLKERNEL_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=20,
                             check=True, cwd=cwd).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() or None


def describe(device: torch.device) -> dict[str, Any]:
    """Versions and hardware of this run: python, torch, triton, numpy, platform, CPU, GPU."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "numpy": package_version("numpy"),
        "rlkernel": package_version("rlkernel"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
    }
    if os.environ.get("RLKERNEL_GENERIC_INT"):  # the generic sums forced onto int32 limbs (or int64)
        env["generic_int"] = os.environ["RLKERNEL_GENERIC_INT"]
    if device.type == "cuda":
        env.update(cuda_facts(device))
    return env


def device_name(device: torch.device) -> str:
    """A human name for ``device``: the GPU name on CUDA, the CPU model on the CPU."""
    if device.type == "cuda":
        return str(torch.cuda.get_device_name(device.index if device.index is not None else 0))
    if device.type == "cpu":
        return cpu_model()
    return str(device)
