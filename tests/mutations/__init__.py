"""Single-parameter mutations of the generic backend, one module per contract.

Each ``tests/mutations/<contract>.py`` defines ``MUTATIONS``: a list of :class:`Mutation`, each
changing one numeric parameter of that contract by its smallest step (a fixed-point width by
one bit, a digit count by one, a rounding mode to its neighbour, a polynomial coefficient by
one ulp, a clamp bound by one ulp, one Philox round fewer, ...) in the generic backend only.
``tests/test_mutations.py`` applies each one and proves that the contract's conformance cases
fail. Every key of ``CONTRACT.parameters`` must be mutated at least once; contracts that
declare the ``reduction_order`` invariance also get an :data:`ORDER_FLOAT_SUM` mutant (sum in
floating point instead of on the grid) and those that declare ``batch`` a :data:`ORDER_BATCH`
mutant (results that depend on the batch size).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Pseudo-parameter: a reduction summed in floating point (order-dependent) instead of exactly.
ORDER_FLOAT_SUM = "order: float sum"
#: Pseudo-parameter: a kernel whose result depends on the batch size (rows computed together).
ORDER_BATCH = "order: batch-dependent"

GENERIC = "rlkernel.backends.generic"


@dataclass(frozen=True)
class Patch:
    """Replace ``module.attribute`` (a module of the generic backend) by ``value``."""

    module: str
    attribute: str
    value: Any

    def target(self) -> Any:
        return importlib.import_module(self.module)


@dataclass(frozen=True)
class Mutation:
    """One mutant of the generic backend.

    Attributes
    ----------
    op : str
        The contract module whose conformance cases must catch it (``softmax``).
    parameter : str
        The key of ``CONTRACT.parameters`` it changes, or :data:`ORDER_FLOAT_SUM` /
        :data:`ORDER_BATCH`.
    change : str
        What changed, for the report (``"F_SUM 40 -> 39"``).
    patches : tuple of Patch
        The attribute replacements that make the mutant (usually one).
    """

    op: str
    parameter: str
    change: str
    patches: tuple[Patch, ...]

    @property
    def id(self) -> str:
        return f"{self.op}:{self.parameter}:{self.change}"


def patch(module: str, attribute: str, value: Any) -> Patch:
    """A :class:`Patch`; ``module`` may be relative to the generic backend (``"softmax"``,
    ``"_exact.fixed"``)."""
    full = module if module.startswith("rlkernel.") else f"{GENERIC}.{module}"
    return Patch(full, attribute, value)


def mutation(op: str, parameter: str, change: str, *patches: Patch) -> Mutation:
    if not patches:
        raise ValueError(f"mutation {op}:{parameter}:{change} has no patch")
    return Mutation(op, parameter, change, tuple(patches))


def original(module: str, attribute: str) -> Any:
    """The unmutated value of a generic-backend attribute (to build a mutant from it)."""
    full = module if module.startswith("rlkernel.") else f"{GENERIC}.{module}"
    return getattr(importlib.import_module(full), attribute)


def wrap(module: str, attribute: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Patch:
    """Replace function ``module.attribute`` by ``make(original_function)``."""
    return patch(module, attribute, make(original(module, attribute)))
