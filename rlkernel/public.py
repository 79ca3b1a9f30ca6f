"""Find a public op by name: ``rlkernel.ops.<op>``.

Used by the conformance suite and ``rlkernel bench``, which call ops by their contract name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any


def public_op(op: str) -> Callable[..., Any]:
    """The public function ``rlkernel.ops.<op>``.

    ``rlkernel.ops`` may define it directly or hold a submodule ``rlkernel.ops.<op>`` that
    defines a function of the same name; both are found.

    Raises
    ------
    LookupError
        Neither defines ``op``.
    """
    ops = importlib.import_module("rlkernel.ops")
    fn = getattr(ops, op, None)
    if isinstance(fn, ModuleType):  # the submodule rlkernel.ops.<op>, already imported
        fn = getattr(fn, op, None)
    if fn is None:
        try:
            fn = getattr(importlib.import_module(f"rlkernel.ops.{op}"), op, None)
        except ModuleNotFoundError as exc:
            if exc.name != f"rlkernel.ops.{op}":
                raise
    if not callable(fn):
        raise LookupError(f"rlkernel.ops has no op {op!r}; expected a function rlkernel.ops.{op}")
    return fn  # type: ignore[no-any-return]
