"""The result of a conformance run: one record per case, and the counts derived from them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "not_supported", "error"]
RecordKind = Literal["golden", "adversarial", "invariance", "static"]

STATUSES: tuple[str, ...] = ("pass", "fail", "not_supported", "error")
KINDS: tuple[str, ...] = ("golden", "adversarial", "invariance", "static")


@dataclass
class Record:
    """One case's outcome. ``op`` is the contract module (the manifest's key)."""

    op: str
    case: str
    kind: str
    status: str
    expected_sha256: str | None = None
    actual_sha256: str | None = None
    detail: str = ""
    #: one-line command that re-runs only this case
    repro: str = ""
    #: kernels (``backend:module.function``) that ran for this case
    kernels: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def failed(self) -> bool:
        """Whether this record counts as a failure (anything but ``pass``)."""
        return self.status != "pass"


@dataclass
class RunResult:
    """Everything a report needs about one run."""

    backend: str
    device: str
    architecture: str
    records: list[Record]
    contract_versions: dict[str, int]
    missing_contracts: list[str]
    suite_version: int
    manifest_sha256: str | None
    environment: dict[str, Any]
    mode: str = "quick"
    #: cases planned but not run because the run was interrupted (SIGINT/SIGTERM), plus 1 when
    #: the static checks were due and did not finish; a run with steps not run is never ``ok``
    not_run: int = 0

    def summary(self) -> dict[str, Any]:
        """Counts: passed, failed (= fail + error + not_supported), fail, not_supported, error, and
        ``by_op[op][kind][status]``."""
        counts = {s: sum(r.status == s for r in self.records) for s in STATUSES}
        by_op: dict[str, dict[str, dict[str, int]]] = {}
        for r in self.records:
            kinds = by_op.setdefault(r.op, {})
            statuses = kinds.setdefault(r.kind, {s: 0 for s in STATUSES})
            statuses[r.status] += 1
        return {
            "passed": counts["pass"],
            "failed": counts["fail"] + counts["error"] + counts["not_supported"],
            "fail": counts["fail"],
            "not_supported": counts["not_supported"],
            "error": counts["error"],
            "by_op": by_op,
        }

    def final_line(self) -> str:
        """``N passed, N failed``: the last line the CLI prints."""
        s = self.summary()
        line = f"{s['passed']} passed, {s['failed']} failed"
        return line + (f" (interrupted: {self.not_run} cases or phases not run)" if self.not_run else "")

    @property
    def ok(self) -> bool:
        return not self.not_run and all(not r.failed for r in self.records)
