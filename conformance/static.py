"""Static kernel checks contributed by a backend (docs/design.md, "Conformance").

The suite does not know how a backend compiles its kernels. A backend that can check its
compiled code without the hardware (PTX/AMDGCN scanned for ``ex2.approx``, ``div.full``,
``.ftz``, contracted ``fma``, float atomics, ...) defines a method::

    def static_checks(self, ops=None) -> list[tuple[str, str, bool, str]]:
        # (op, case, passed, detail) per check, e.g.
        # ("rms_norm", "sm_90/no-approx-div", True, "")

and the runner turns each tuple into a record of kind ``static``. A check that raises is an
``error`` record, never a silent pass. ``--op`` filters by the tuple's op; a method that takes
``ops`` gets the filter too, so it compiles only those ops' kernels (``static_checks(self)``
without it works, and compiles everything).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: One static check result: (op, case, passed, detail).
StaticResult = tuple[str, str, bool, str]


def provider(backend: Any) -> Callable[..., list[StaticResult]] | None:
    """The backend's ``static_checks`` method, or ``None`` if it has none."""
    fn = getattr(backend, "static_checks", None)
    return fn if callable(fn) else None


def collect(backend: Any, ops: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the backend's static checks; records ``{op, case, status, detail}`` (status pass|fail|error).

    Parameters
    ----------
    backend : rlkernel.backend.Backend
        The backend under test.
    ops : list of str, optional
        Keep only checks of these ops.
    """
    fn = provider(backend)
    if fn is None:
        return []
    try:
        # a provider that takes ``ops`` compiles only those ops' kernels (a cold compile of every
        # kernel takes minutes); one without it is filtered below
        takes_ops = bool(inspect.signature(fn).parameters)
        results = list(fn(ops) if takes_ops else fn())
    except Exception as exc:  # a crashing checker is a reported error, not a pass
        logger.exception("static checks of backend %s raised", getattr(backend, "name", backend))
        return [{"op": "*", "case": "static_checks", "status": "error", "detail": f"{type(exc).__name__}: {exc}"}]
    records = []
    for item in results:
        if not (isinstance(item, tuple) and len(item) == 4):
            records.append({"op": "*", "case": "static_checks", "status": "error",
                            "detail": f"static_checks() returned {item!r}; expected (op, case, passed, detail)"})
            continue
        op, case, passed, detail = item
        if ops and op not in ops:
            continue
        status = "pass" if passed else "fail"
        records.append({"op": str(op), "case": str(case), "status": status, "detail": str(detail)})
    return records


def render_markdown(report: dict[str, Any], command: str) -> str:
    """The Markdown of a static-check report (``report()`` of a backend's static checks module)."""
    lines = [f"# Static checks: backend `{report['backend']}` (compiled on a CPU machine, no GPU)", "",
             f"Triton {report['triton']}; produced by `{command}`.", "",
             "| architecture | compiled | passed | failed |", "| --- | --- | --- | --- |"]
    for arch, counts in report["archs"].items():
        lines.append(f"| {arch} | {counts['compiled']} | {counts['passed']} | {counts['failed']} |")
    lines += ["", "Every specialisation, with its findings (empty when it conforms), the LDS it takes, the "
              "matrix instructions it uses and the SHA-256 of its code (instructions and kernel descriptor, "
              "without source locations):", "",
              "| arch | op | case | status | LDS B | scratch B | MFMA | code sha256 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k in report["kernels"]:
        status = k["status"] if k["status"] == "pass" else f"**{k['status']}**: {'; '.join(k['findings'][:3])}"
        if k.get("error"):
            status = f"**fail**: {k['error'][:200]}"
        lines.append(f"| {k['arch']} | {k['op']} | {k['case']} | {status} | {k['lds_bytes']} | {k['scratch_bytes']} "
                     f"| {', '.join(k['mfma'])} | `{k['code_sha256'][:16]}` |")
    return "\n".join(lines) + "\n"
