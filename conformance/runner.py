"""The conformance runner: every case of every contract, against one target, no tolerances.

Driven entirely by the contract modules (docs/design.md, "Conformance"): golden and adversarial cases are hashed
and compared with the manifest; invariance cases compare two backend computations bit for
bit; a backend's ``static_checks()`` adds static records. The runner returns a
:class:`~rlkernel.conformance.records.RunResult`; reports and printing are elsewhere.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import torch

from rlkernel.backend import KernelNotFound
from rlkernel.conformance import manifest as manifest_mod
from rlkernel.conformance import static
from rlkernel.conformance.cases import (
    bit_cases,
    contract_version,
    invariance_cases,
    op_of,
    reference_of,
)
from rlkernel.conformance.hashing import first_difference, sha256_of
from rlkernel.conformance.records import Record, RunResult
from rlkernel.conformance.targets import BackendTarget, OpResolver, ReferenceTarget, Target
from rlkernel.contracts import load_contracts
from rlkernel.contracts._contract import Case, InvarianceCase
from rlkernel.environment import describe

logger = logging.getLogger(__name__)


class Progress(Protocol):
    def start(self, total: int) -> None: ...
    def update(self, record: Record) -> None: ...
    def finish(self) -> None: ...


class _NoProgress:
    def start(self, total: int) -> None:
        pass

    def update(self, record: Record) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class RunConfig:
    """What to run. ``backend="reference"`` checks the reference against the manifest."""

    backend: str | None = None
    device: str | None = None
    ops: list[str] | None = None
    cases: list[str] | None = None
    full: bool = False
    manifest_path: Path | None = None
    static: bool = True
    #: stop at the first case that does not pass (the rest count as not run, so the run fails)
    fail_fast: bool = False
    #: run the bit and invariance cases (False with ``static``: the static phase alone, which
    #: ``rlkernel conformance --jobs`` runs beside the processes that run the cases)
    cases_phase: bool = True


def default_device() -> torch.device:
    """``cuda`` when torch sees a CUDA device, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def choose_target(backend: str | None, device: str | None, resolve: OpResolver | None = None) -> Target:
    """The target for ``--backend``/``--device``.

    No backend: the one serving ``device`` (default :func:`default_device`). A backend without a
    device: the default device if the backend serves it, else its first device type.

    Raises
    ------
    ValueError
        Unknown backend name.
    RuntimeError
        The backend is not usable here or does not serve the device.
    """
    from rlkernel.registry import backend_for, get_backend

    if backend == "reference":
        if device not in (None, "cpu"):
            raise ValueError(f"--backend reference runs on the CPU only, got --device {device}; drop --device")
        return ReferenceTarget()
    if device is not None:
        dev = torch.device(device)
    elif backend is None:
        dev = default_device()
    else:
        b = get_backend(backend)
        dev = default_device() if b.serves(default_device()) else torch.device(b.device_types[0])
    chosen = backend_for(dev.type, forced=backend, source="--backend" if backend else None)
    return BackendTarget(chosen.name, dev, chosen.architecture(dev), resolve)


def _describe_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = f"{type(exc).__name__}: {exc}{where}"
    cause = exc.__cause__  # explicit chaining only (``raise ... from``), not unrelated context
    if cause is not None:  # e.g. a Triton CompilationError: the reason is in the cause's last lines
        reason = str(cause).strip().splitlines()[-3:]
        text += f"; caused by {type(cause).__name__}: {' / '.join(reason)}"
    return text


def _given(record: Record) -> Record:
    return record


class _Run:
    """State of one run: target, manifest, filters, records."""

    def __init__(self, config: RunConfig, target: Target, manifest: dict[str, Any], progress: Progress):
        self.config = config
        self.target = target
        self.manifest = manifest
        self.progress = progress
        self.records: list[Record] = []

    def repro(self, op: str, case: str, full_only: bool) -> str:
        dev = "" if self.target.is_reference else f" --device {self.target.device}"
        full = " --full" if full_only else ""
        return (f"rlkernel conformance --backend {self.target.name}{dev} --op {op} --case {case}{full} "
                f"--out conformance-repro")

    def add(self, record: Record) -> None:
        self.records.append(record)
        if record.failed:
            logger.info("conformance: %s/%s %s: %s", record.op, record.case, record.status, record.detail)
        self.progress.update(record)

    def bit_case(self, name: str, module: ModuleType, case: Case) -> Record:
        op = op_of(module, case)
        expected, why = manifest_mod.expected_hash(self.manifest, name, contract_version(module), case.name)
        rec = Record(op=name, case=case.name, kind=case.kind, status="error", expected_sha256=expected,
                     repro=self.repro(name, case.name, case.full_only))
        t0 = time.perf_counter()
        try:
            out = self.target.call(module, op, case.make())
        except KernelNotFound as exc:
            rec.status, rec.detail = "not_supported", str(exc)
            return rec
        except Exception as exc:
            rec.detail = _describe_error(exc)
            return rec
        finally:
            rec.kernels = list(self.target.last_kernels)
            rec.seconds = time.perf_counter() - t0
        rec.actual_sha256 = sha256_of(out)
        if expected is None:
            rec.detail = why
        elif rec.actual_sha256 == expected:
            rec.status = "pass"
        else:
            rec.status = "fail"
            rec.detail = self.golden_difference(module, op, case, out, expected)
        return rec

    def golden_difference(self, module: ModuleType, op: str, case: Case, out: Any, expected: str) -> str:
        """Why a golden case failed: the first differing element against the reference's output."""
        if self.target.is_reference:
            return (f"the reference gives {sha256_of(out)[:16]}…, the manifest holds {expected[:16]}…: the "
                    f"reference drifted (torch version, CPU instruction set) or the manifest is stale. If the "
                    f"contract changed on purpose, bump its version and regenerate the manifest")
        try:
            ref_out = reference_of(module, op)(**case.make())
        except Exception as exc:
            return f"output hash differs from the manifest; the reference raised {_describe_error(exc)}"
        diff = first_difference(ref_out, out)
        if sha256_of(ref_out) == expected:
            return diff or "output hash differs from the manifest"  # unreachable unless hashing itself changed
        stale = ("the reference itself no longer matches the manifest: the reference drifted, or the contract "
                 "changed without a version bump (see `rlkernel conformance --backend reference`)")
        return f"{diff}; and {stale}" if diff else f"the bits equal the reference's output, but {stale}"

    def invariance_case(self, name: str, module: ModuleType, case: InvarianceCase) -> Record:
        rec = Record(op=name, case=case.name, kind="invariance", status="error",
                     repro=self.repro(name, case.name, case.full_only),
                     detail=f"invariance {case.invariance}")
        kernels: set[str] = set()

        def run(op_name: str, **inputs: Any) -> Any:
            try:
                return self.target.call(module, op_name, inputs)
            finally:
                kernels.update(self.target.last_kernels)

        t0 = time.perf_counter()
        try:
            expected, actual = case.check(run)
            rec.expected_sha256, rec.actual_sha256 = sha256_of(expected), sha256_of(actual)
            diff = first_difference(expected, actual)
        except KernelNotFound as exc:
            rec.status, rec.detail = "not_supported", str(exc)
            return rec
        except Exception as exc:
            rec.detail = f"invariance {case.invariance}: {_describe_error(exc)}"
            return rec
        finally:
            rec.kernels = sorted(kernels)
            rec.seconds = time.perf_counter() - t0
        if diff is None:
            rec.status = "pass"
        else:
            rec.status, rec.detail = "fail", f"invariance {case.invariance} broken: {diff}"
        return rec

    def wanted(self, case_name: str) -> bool:
        return not self.config.cases or case_name in self.config.cases


def run(
    config: RunConfig,
    *,
    modules: dict[str, ModuleType] | None = None,
    resolve: OpResolver | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Run the suite.

    Parameters
    ----------
    config : RunConfig
        Backend, device, op and case filters, mode, manifest.
    modules : dict of str to module, optional
        Contract modules by name (default: :func:`rlkernel.contracts.load_contracts`).
    resolve : callable, optional
        ``op -> function`` (default: the public ``rlkernel.ops.<op>``).
    progress : Progress, optional
        Receives ``start(total)``, ``update(record)`` and ``finish()``.

    Raises
    ------
    ValueError
        ``--op`` names an unknown or absent contract module; bad backend or device.
    """
    missing: list[str] = []
    broken: dict[str, BaseException] = {}
    if modules is None:
        modules, missing = load_contracts(config.ops, errors=broken)
        if config.ops and missing:
            raise ValueError(f"contract module(s) {missing} do not exist yet; present: {sorted(modules)}")
    elif config.ops:
        unknown = [o for o in config.ops if o not in modules]
        if unknown:
            raise ValueError(f"unknown op(s) {unknown}; known: {sorted(modules)}")
        modules = {k: v for k, v in modules.items() if k in config.ops}
    target = choose_target(config.backend, config.device, resolve)
    manifest = manifest_mod.load(config.manifest_path)
    state = _Run(config, target, manifest, progress or _NoProgress())

    plan: list[Callable[[], Record]] = []
    for name, exc in broken.items() if config.cases_phase else ():  # a module that fails to import is an error
        error = Record(op=name, case="<import>", kind="golden", status="error", detail=_describe_error(exc))
        plan.append(functools.partial(_given, error))
    for name, module in modules.items() if config.cases_phase else ():
        try:
            contract_version(module)  # a module without a valid CONTRACT is an error record
            cases = bit_cases(module, full=config.full)
            inv = [] if target.is_reference else invariance_cases(module, full=config.full)
        except Exception as exc:
            error = Record(op=name, case="<cases>", kind="golden", status="error", detail=_describe_error(exc))
            plan.append(functools.partial(_given, error))
            continue
        plan += [functools.partial(state.bit_case, name, module, c) for c in cases if state.wanted(c.name)]
        plan += [functools.partial(state.invariance_case, name, module, c) for c in inv if state.wanted(c.name)]

    state.progress.start(len(plan))
    done = 0
    try:
        for step in plan:
            record = step()
            state.add(record)
            done += 1
            if config.fail_fast and record.failed:
                break
    except KeyboardInterrupt:  # SIGINT, or SIGTERM (the CLI maps it): report what ran, fail the run
        pass
    # the static checks compile kernels (minutes on a cold cache): an interruption there still
    # reports the cases that ran, and the unfinished static phase counts as one step not run
    static_pending = config.static and isinstance(target, BackendTarget)
    if static_pending and done == len(plan):
        from rlkernel.registry import get_backend

        try:
            for item in static.collect(get_backend(target.name), config.ops):
                if state.wanted(item["case"]):
                    state.add(Record(kind="static", repro=state.repro(item["op"], item["case"], False), **item))
            static_pending = False
        except KeyboardInterrupt:
            pass
    state.progress.finish()

    return RunResult(
        backend=target.name,
        device=str(target.device),
        architecture=target.architecture,
        records=state.records,
        contract_versions={name: m.CONTRACT.version for name, m in modules.items() if hasattr(m, "CONTRACT")},
        missing_contracts=missing,
        suite_version=manifest_mod.SUITE_VERSION,
        manifest_sha256=manifest_mod.file_sha256(config.manifest_path),
        environment=describe(target.device),
        mode="full" if config.full else "quick",
        not_run=len(plan) - done + int(static_pending),
    )
