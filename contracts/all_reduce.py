"""Contract ``all_reduce``: the exact int64 all-reduce of tensor parallelism, simulated in one process.

``out = sum_r partials[r]`` (or ``max_r``) over the world axis, exactly in int64. This is the
collective that row-parallel ``linear`` (and every exact sum split over devices) relies on:
integer addition is associative, so any reduction order, tree, ring or device gives the same
bits. :func:`rlkernel.distributed.all_reduce_exact` is the same reduction over
``torch.distributed``.

Bitwise semantics (version 1)
-----------------------------
- ``op="sum"``: the exact integer sum over axis 0. If the exact sum of some element lies
  outside int64 ``[-2**63, 2**63)``, the op raises ``ValueError`` (never a wrapped value).
  Intermediate sums may leave the int64 range in some order: only the total matters.
- ``op="max"``: the integer maximum over axis 0.
- Float tensors are refused: a float sum depends on its order. Reduce int64 partials (for
  example ``linear_partial``) and round once afterwards.
- ``partials`` [world, *] with world >= 1 gives [*]; empty trailing shapes give empty outputs.

Invariant to the order of the world axis (``reduction_order``: permuted ranks, tree or
hierarchical reduction), to permuting the elements (``permutation``), and across repeats.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._gen import integers, seed_of, uniform

CONTRACT = Contract(
    name="all_reduce",
    version=1,
    summary="``out = sum_r partials[r]`` (or max) exactly in int64; overflow of the total raises",
    invariances=("permutation", "reduction_order", "repeat"),
    dtypes={"partials": (torch.int64,)},
    parameters={
        "int64_range": "the exact total of each element must lie in int64 [-2**63, 2**63 - 1], both ends "
                       "included; outside it the op raises ValueError (never a wrapped value)",
        "intermediate_wrap": "running sums may leave int64 in some order (two's-complement wrap-around, no "
                             "saturation): only the exact total matters",
        "max_order": "op='max' is the maximum in the signed int64 order",
    },
)

OPS = ("sum", "max")
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def reference(partials: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """The exact reduction over axis 0 (the definition, with Python integers).

    Parameters
    ----------
    partials : Tensor, int64, [world, *], world >= 1
    op : {"sum", "max"}

    Returns
    -------
    Tensor, int64, [*]

    Raises
    ------
    ValueError
        An exact sum outside int64, an unknown ``op`` or ``world == 0``.

    Bitwise semantics
    -----------------
    ``sum``: the mathematical integer sum, which must fit int64. ``max``: the maximum.
    """
    if op not in OPS:
        raise ValueError(f"all_reduce: op={op!r}; expected one of {OPS}")
    if partials.dim() < 1 or partials.shape[0] < 1:
        raise ValueError(f"all_reduce: partials has shape {tuple(partials.shape)}; expected [world, *] with world >= 1")
    world = partials.shape[0]
    elements = 1
    for s in partials.shape[1:]:
        elements *= int(s)
    rows = partials.reshape(world, elements).tolist()
    totals = [max(col) if op == "max" else sum(col) for col in zip(*rows)] if rows[0] else []
    for i, t in enumerate(totals):
        if not INT64_MIN <= t <= INT64_MAX:
            raise ValueError(f"all_reduce: the exact sum at flat index {i} is {t}, outside int64")
    return torch.tensor(totals, dtype=torch.int64).reshape(partials.shape[1:])


# ----------------------------------------------------------------------------- cases


def _seed(*parts: object) -> int:
    return seed_of("all_reduce", *parts)


def _partials(name: str, world: int, shape: tuple[int, ...], bits: int) -> torch.Tensor:
    """Signed integers of up to ``bits`` magnitude bits, spread over many binades."""
    v = integers(_seed(name, "v"), (world, *shape), -(1 << bits), 1 << bits)
    return v >> integers(_seed(name, "s"), (world, *shape), 0, bits)


def golden_cases() -> list[Case]:
    """Worlds 1/2/4/8, linear-partial-sized magnitudes (|v| < 2**52), sum and max."""
    cases: list[Case] = []
    for world in (1, 2, 4, 8):
        for shape in ((17, 96), (64, 32)):
            for op in OPS:
                name = f"world{world}_{shape[0]}x{shape[1]}_{op}"
                cases.append(Case(name=name, kind="golden",
                                  make=lambda name=name, w=world, s=shape, op=op: {
                                      "partials": _partials(name, w, s, 52), "op": op}))
    cases.append(Case(name="world4_3d_sum", kind="golden",
                      make=lambda: {"partials": _partials("3d", 4, (2, 5, 7), 60), "op": "sum"}))
    return cases


def adversarial_cases() -> list[Case]:
    """int64 extremes, totals that fit only after cancellation, empty and scalar shapes, views."""
    big = 1 << 62

    def cancel() -> dict[str, Any]:
        # Running sums in rank order leave int64 (2**62 + 2**62), the total fits.
        col = [[big, big, -big, -big], [INT64_MAX, 1, -1, -1], [INT64_MIN, -1, 1, 1], [big, big, -big, -1]]
        t = torch.tensor(col, dtype=torch.int64).T.contiguous()  # [world=4, 4]
        return {"partials": t, "op": "sum"}

    def extremes_max() -> dict[str, Any]:
        t = torch.tensor([[INT64_MIN, INT64_MAX, 0, -1, INT64_MIN],
                          [INT64_MIN, 0, -1, -1, INT64_MIN + 1]], dtype=torch.int64)
        return {"partials": t, "op": "max"}

    def at_limits() -> dict[str, Any]:
        # Totals exactly INT64_MAX and INT64_MIN (the ends of the accepted range), reached directly,
        # from two halves, and after running sums that leave int64 (in rank order).
        cols = [[INT64_MAX, 0, 0, 0], [INT64_MAX - 1, 1, 0, 0], [big, big - 1, 0, 0],
                [INT64_MAX, INT64_MAX, INT64_MIN, 1],
                [INT64_MIN, 0, 0, 0], [INT64_MIN + 5, -5, 0, 0], [-big, -big, 0, 0],
                [INT64_MIN, INT64_MIN, INT64_MAX, 1]]
        return {"partials": torch.tensor(cols, dtype=torch.int64).T.contiguous(), "op": "sum"}  # [world=4, 8]

    def noncontig() -> dict[str, Any]:
        t = _partials("nc", 3, (7, 5), 50).transpose(1, 2)  # [3, 5, 7] view
        return {"partials": t, "op": "sum"}

    return [
        Case(name="cancellation_near_int64_limits", kind="adversarial", make=cancel),
        Case(name="int64_extremes_max", kind="adversarial", make=extremes_max),
        Case(name="world1_sum", kind="adversarial",
             make=lambda: {"partials": _partials("w1", 1, (9,), 62), "op": "sum"}),
        Case(name="scalar_elements", kind="adversarial",
             make=lambda: {"partials": _partials("scalar", 5, (), 58), "op": "sum"}),
        Case(name="empty_elements", kind="adversarial",
             make=lambda: {"partials": torch.zeros((4, 0, 3), dtype=torch.int64), "op": "sum"}),
        Case(name="empty_elements_max", kind="adversarial",
             make=lambda: {"partials": torch.zeros((2, 3, 0), dtype=torch.int64), "op": "max"}),
        Case(name="noncontiguous_view", kind="adversarial", make=noncontig),
        Case(name="totals_at_int64_limits", kind="adversarial", make=at_limits),
        Case(name="world8_full_range_sum", kind="adversarial",
             make=lambda: {"partials": _partials("wide", 8, (33,), 59), "op": "sum"}),
    ]


def _perm(seed: int, n: int) -> torch.Tensor:
    return torch.from_numpy(uniform(seed, (n,)).argsort(kind="stable"))


def invariance_cases() -> list[InvarianceCase]:
    """Permuted world axis, tree reduction, permuted elements, repeats."""

    def world_order(run: Any) -> tuple[Any, Any]:
        p = _partials("order", 8, (9, 11), 59)
        outs = []
        for op in OPS:
            whole = run("all_reduce", partials=p, op=op)
            shuffled = run("all_reduce", partials=p[_perm(_seed("order", op), 8)], op=op)
            outs.append((whole, shuffled))
        return tuple(o[0] for o in outs), tuple(o[1] for o in outs)

    def tree(run: Any) -> tuple[Any, Any]:
        p = _partials("tree", 8, (6, 10), 59)
        whole = run("all_reduce", partials=p, op="sum")
        pairs = [run("all_reduce", partials=p[i:i + 2], op="sum") for i in range(0, 8, 2)]
        quads = [run("all_reduce", partials=torch.stack(pairs[i:i + 2]), op="sum") for i in (0, 2)]
        root = run("all_reduce", partials=torch.stack(quads), op="sum")
        chain = run("all_reduce", partials=p[:1], op="sum")
        for r in range(1, 8):
            chain = run("all_reduce", partials=torch.stack([chain, p[r]]), op="sum")
        return (whole, whole), (root, chain)

    def elements(run: Any) -> tuple[Any, Any]:
        p = _partials("elements", 4, (40,), 60)
        q = _perm(_seed("elements", "q"), 40)
        return run("all_reduce", partials=p, op="sum")[q], run("all_reduce", partials=p[:, q], op="sum")

    def repeat(run: Any) -> tuple[Any, Any]:
        p = _partials("repeat", 4, (16, 16), 60)
        first = run("all_reduce", partials=p, op="sum")
        return (first, first), (run("all_reduce", partials=p, op="sum"), run("all_reduce", partials=p, op="sum"))

    return [
        InvarianceCase(name="permuted_world_axis", invariance="reduction_order", check=world_order),
        InvarianceCase(name="tree_and_chain_reduction", invariance="reduction_order", check=tree),
        InvarianceCase(name="permuted_elements", invariance="permutation", check=elements),
        InvarianceCase(name="repeated_runs", invariance="repeat", check=repeat),
    ]


def _native(partials: torch.Tensor, op: str = "sum") -> torch.Tensor:
    return partials.sum(0) if op == "sum" else partials.amax(0)


def bench_cases() -> list[BenchCase]:
    """Row-parallel partial sums of Qwen3-8B projections (int64 [world, M, 4096]); all but M = 2048
    are cheap enough for the small (CPU) set too."""
    cases = []
    both = ("small", "large")
    for world, m, sizes in ((2, 8, both), (4, 64, both), (8, 64, both), (2, 2048, ("large",))):
        def make(device: torch.device, world: int = world, m: int = m) -> dict[str, Any]:
            block = _partials(f"bench{world}_{m}", world, (min(m, 8), 4096), 52).to(device)
            return {"partials": block.repeat(1, -(-m // block.shape[1]), 1)[:, :m].contiguous(), "op": "sum"}

        cases.append(BenchCase(name=f"sum_world{world}_m{m}_n4096", make=make, native=_native,
                               flops=float(world * m * 4096), bytes=8.0 * (world + 1) * m * 4096, sizes=sizes))
    return cases
