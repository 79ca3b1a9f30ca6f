"""What a contract module offers the suite: its cases, the op each case calls, its reference.

The runner and the manifest tool both read contract modules through these helpers, so the
rules (which op a case calls, which reference defines it, which cases ``--quick`` runs) are
written once.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from rlkernel.contracts._contract import Case, InvarianceCase


def contract_name(module: ModuleType) -> str:
    """The op name of the module's ``CONTRACT``."""
    return str(module.CONTRACT.name)


def contract_version(module: ModuleType) -> int:
    """The version of the module's ``CONTRACT`` (R10)."""
    return int(module.CONTRACT.version)


def op_of(module: ModuleType, case: Case | InvarianceCase) -> str:
    """The op a case calls: ``case.op``, defaulting to ``CONTRACT.name``."""
    return case.op or contract_name(module)


def reference_of(module: ModuleType, op: str) -> Callable[..., Any]:
    """The reference of ``op``: ``module.REFERENCES[op]`` when the module has that dict, else
    ``module.reference``.

    Raises
    ------
    LookupError
        The module has ``REFERENCES`` but no entry for ``op``.
    """
    table = getattr(module, "REFERENCES", None)
    if isinstance(table, dict):
        if op not in table:
            raise LookupError(
                f"{module.__name__}.REFERENCES has no entry for op {op!r} (has {sorted(table)}); "
                f"add one, or fix the case's op"
            )
        return table[op]  # type: ignore[no-any-return]
    return module.reference  # type: ignore[no-any-return]


def bit_cases(module: ModuleType, full: bool = True) -> list[Case]:
    """Golden then adversarial cases (``full=False`` drops ``full_only`` ones).

    Raises
    ------
    ValueError
        Two cases share a name (the manifest keys cases by name), or a case's kind does not
        match the list it came from.
    """
    cases: list[Case] = []
    for kind, getter in (("golden", "golden_cases"), ("adversarial", "adversarial_cases")):
        fn = getattr(module, getter, None)
        for case in fn() if fn is not None else []:
            if case.kind != kind:
                raise ValueError(
                    f"{module.__name__}.{getter}() returned case {case.name!r} of kind {case.kind!r}; "
                    f"expected kind {kind!r}"
                )
            cases.append(case)
    names = [c.name for c in cases]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"{module.__name__}: duplicate case names {duplicates}; case names key the manifest")
    return [c for c in cases if full or not c.full_only]


def invariance_cases(module: ModuleType, full: bool = True) -> list[InvarianceCase]:
    """The module's invariance cases (``full=False`` drops ``full_only`` ones)."""
    fn = getattr(module, "invariance_cases", None)
    cases: list[InvarianceCase] = list(fn()) if fn is not None else []
    return [c for c in cases if full or not c.full_only]
