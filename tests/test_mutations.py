"""Mutation test: every numeric parameter of every contract is pinned by a conformance case.

Each mutant (``tests/mutations/<contract>.py``) changes one parameter of the generic backend
by its smallest step — or makes a reduction order- or batch-dependent — and the contract's
conformance cases (quick suite, golden + adversarial + invariance, ``--fail-fast``) must fail.
The unmutated generic backend passes the same cases (checked here too), so a caught mutant is
caught by the mutation and nothing else. The terminal summary lists every mutant with the
case that caught it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

import mutations
import pytest
from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, Mutation

import rlkernel.backends.generic as generic_pkg
from rlkernel.conformance import runner
from rlkernel.contracts import load_contracts
from rlkernel.registry import all_backends

CONTRACTS, _ = load_contracts()


def _all_mutations() -> list[Mutation]:
    found: list[Mutation] = []
    for info in pkgutil.iter_modules(mutations.__path__):
        module = importlib.import_module(f"{mutations.__name__}.{info.name}")
        found += list(getattr(module, "MUTATIONS", []))
    return found


MUTATIONS = _all_mutations()
#: (mutation id, caught by "op/case (status)" or None) for the terminal summary
RESULTS: list[tuple[str, str | None]] = []


def _run(op: str) -> runner.RunResult:
    config = runner.RunConfig(backend="generic", device="cpu", ops=[op], static=False, fail_fast=True)
    return runner.run(config)


@pytest.fixture
def fresh_kernels() -> Iterator[None]:
    """Drop the backends' cached kernel functions before and after a mutant runs."""
    for backend in all_backends().values():
        backend._cache.clear()
    yield
    for backend in all_backends().values():
        backend._cache.clear()


@pytest.mark.parametrize("op", sorted(CONTRACTS))
def test_unmutated_generic_backend_passes(op: str, fresh_kernels: None) -> None:
    result = _run(op)
    bad = [f"{r.case}: {r.status} {r.detail}" for r in result.records if r.failed]
    assert not bad and result.not_run == 0, f"the unmutated generic backend fails {op}: {bad[:3]}"


@pytest.mark.parametrize("mut", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_mutation_is_caught(mut: Mutation, monkeypatch: pytest.MonkeyPatch, fresh_kernels: None) -> None:
    for p in mut.patches:
        target = p.target()
        before = getattr(target, p.attribute)  # raises if the attribute does not exist
        assert before is not p.value, f"{mut.id}: patch of {p.module}.{p.attribute} changes nothing"
        monkeypatch.setattr(target, p.attribute, p.value)
    result = _run(mut.op)
    caught = [r for r in result.records if r.failed]
    RESULTS.append((mut.id, f"{caught[0].op}/{caught[0].case} ({caught[0].status})" if caught else None))
    assert caught, (f"mutant {mut.id} passed all {len(result.records)} quick cases of {mut.op}: add a golden case "
                    f"that depends on {mut.parameter!r}")


def test_every_contract_parameter_is_mutated() -> None:
    problems = []
    for name, module in CONTRACTS.items():
        contract = module.CONTRACT
        declared = set(contract.parameters)
        mutated = {m.parameter for m in MUTATIONS if m.op == name}
        if not declared:
            problems.append(f"{name}: CONTRACT.parameters is empty")
        if declared - mutated:
            problems.append(f"{name}: parameters without a mutant: {sorted(declared - mutated)}")
        unknown = mutated - declared - {ORDER_FLOAT_SUM, ORDER_BATCH}
        if unknown:
            problems.append(f"{name}: mutants of undeclared parameters: {sorted(unknown)}")
        if "reduction_order" in contract.invariances and ORDER_FLOAT_SUM not in mutated:
            problems.append(f"{name}: declares reduction_order but has no {ORDER_FLOAT_SUM!r} mutant")
        if "batch" in contract.invariances and ORDER_BATCH not in mutated:
            problems.append(f"{name}: declares batch but has no {ORDER_BATCH!r} mutant")
    assert not problems, "\n".join(problems)


#: Host-side contract values the public op computes once for every backend (the optimizers'
#: exact-real scalars, handed to each kernel as fp32 numbers): a mutant there changes what every
#: backend receives, and the cases must catch it as they catch a kernel's.
HOST_MODULES = ("rlkernel.ops._optim_scalars",)


def test_mutants_patch_the_generic_backend_only() -> None:
    """A mutant of the reference would prove nothing; one of the public layer only where it
    computes contract values for the kernels (:data:`HOST_MODULES`)."""
    prefix = generic_pkg.__name__ + "."
    wrong = [f"{m.id}: {p.module}" for m in MUTATIONS for p in m.patches
             if not p.module.startswith(prefix) and p.module not in HOST_MODULES]
    assert not wrong, wrong
