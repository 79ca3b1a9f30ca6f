"""The shape of a contract: metadata, conformance cases and benchmark shapes.

Every ``contracts/<op>.py`` defines ``CONTRACT`` (a :class:`Contract`), ``reference(**inputs)``
(the executable definition, plain PyTorch on the CPU), and the generators the conformance
suite runs: ``golden_cases()``, ``adversarial_cases()``, ``invariance_cases()``; plus
``bench_cases()`` for ``rlkernel bench``. The runner is generic: it never knows an op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

Kind = Literal["golden", "adversarial"]

#: Invariance names a contract may declare (docs/numerics.md R9).
INVARIANCES = (
    "batch",  # a row alone equals the same row inside batches of several sizes and positions
    "permutation",  # permuting the batch permutes the output and nothing else
    "reduction_order",  # permuting the terms of a reduction (K, keys, vocab) leaves the bits alone
    "chunking",  # a sequence processed in chunks equals it processed whole
    "prefill_decode",  # prefill + token-by-token decode equals one forward
    "kv_split",  # splitting the keys into blocks/pages of any size leaves the bits alone
    "tp_degree",  # tensor-parallel shards 1/2/4 give the bits of TP=1
    "repeat",  # repeated runs give identical bits
    "micro_batch",  # reductions split over micro-batches and merged give the full-batch bits
    "autograd",  # forward inside autograd equals plain forward
)


@dataclass(frozen=True)
class Contract:
    """Facts about one op's bitwise contract.

    Attributes
    ----------
    name : str
        The op name, the same in every layer (``rms_norm``).
    version : int
        Bumped by any change that alters an output bit (R10); golden hashes are keyed by it.
    summary : str
        One line, with the formula.
    invariances : tuple of str
        Names from :data:`INVARIANCES` that conformance checks metamorphically.
    dtypes : mapping of str to tuple of torch.dtype
        Accepted dtypes per argument.
    parameters : mapping of str to str
        Every numeric parameter of the contract (fixed-point widths, digit base and count,
        exponent rules, rounding modes and points, table sizes and coefficients, Philox rounds
        and key schedule, clamp bounds, special-value rules), name -> what it is and its value.
        Each one is pinned: some golden case fails when it changes by the smallest step, and
        the mutation test (``tests/test_mutations.py``) proves it on the generic backend.
    """

    name: str
    version: int
    summary: str
    invariances: tuple[str, ...]
    dtypes: Mapping[str, tuple[torch.dtype, ...]] = field(default_factory=dict)
    parameters: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [i for i in self.invariances if i not in INVARIANCES]
        if unknown:
            raise ValueError(f"{self.name}: unknown invariances {unknown}; known: {INVARIANCES}")


@dataclass(frozen=True)
class Case:
    """A golden or adversarial case: deterministic CPU inputs for ``op(**inputs)``.

    ``make()`` must return the same tensors on every machine and torch version (build them
    from :func:`contracts._gen.generator` or explicit bit patterns, never torch's global RNG).
    Inputs are CPU tensors; the runner moves every tensor to the device under test.
    """

    name: str
    kind: Kind
    make: Callable[[], dict[str, Any]]
    #: the op called; defaults to the contract's name (a module may hold sibling ops)
    op: str | None = None
    #: run only with ``--full`` (large shapes)
    full_only: bool = False


#: ``run(op_name, **inputs)`` calls the backend under test on the device under test and
#: returns its output(s) on the CPU. Inputs may be CPU tensors: ``run`` moves them.
Runner = Callable[..., Any]


@dataclass(frozen=True)
class InvarianceCase:
    """A metamorphic check: two ways to compute the same thing with the backend under test.

    ``check(run)`` returns ``(expected, actual)``: outputs (tensors or tuples of tensors) that
    the invariance says must be bitwise equal. Both sides come from the backend under test;
    the golden cases tie the backend to the reference.
    """

    name: str
    invariance: str
    check: Callable[[Runner], tuple[Any, Any]]
    op: str | None = None
    full_only: bool = False


#: Shape sets of ``rlkernel bench --shapes``: ``large`` are the model shapes an accelerator is
#: measured on (Qwen3-8B, the H200 reports); ``small`` keep a whole CPU run within minutes.
BENCH_SIZES = ("small", "large")


@dataclass(frozen=True)
class BenchCase:
    """A benchmark shape: ``make(device)`` builds the inputs on ``device``.

    ``native`` is the plain PyTorch op computing the same function (the baseline the ratio is
    taken against); ``flops`` and ``bytes`` are the declared work formulas for the roofline.
    ``sizes`` names the shape sets (:data:`BENCH_SIZES`) the case belongs to: ``("large",)``
    unless a contract says otherwise; a shape cheap enough for a CPU and still realistic
    belongs to both. ``graph`` marks a decode-step shape (one token per sequence), which the bench
    also times replayed from a CUDA graph, as rollout engines run decode steps.
    """

    name: str
    make: Callable[[torch.device], dict[str, Any]]
    native: Callable[..., Any]
    flops: float
    bytes: float
    op: str | None = None
    sizes: tuple[str, ...] = ("large",)
    graph: bool = False

    def __post_init__(self) -> None:
        unknown = [s for s in self.sizes if s not in BENCH_SIZES]
        if unknown or not self.sizes:
            raise ValueError(f"bench case {self.name}: sizes={self.sizes!r}; expected a non-empty tuple of "
                             f"{BENCH_SIZES}")


def as_tensors(out: Any) -> Sequence[torch.Tensor]:
    """Flatten an op output (tensor, tuple or list of tensors) to a list of tensors."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        flat: list[torch.Tensor] = []
        for item in out:
            flat.extend(as_tensors(item))
        return flat
    raise TypeError(f"op output must be a tensor or a tuple of tensors, got {type(out).__name__}")
