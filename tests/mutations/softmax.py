"""Mutants of softmax's parameters; also the shared exp_c/log_c, grid-sum and output-cast mutants.

The other contracts built on the same primitives (log_softmax, rms_norm, silu_mul, kl_k3,
sample, ...) import the builders below, so a parameter of a shared primitive is changed the
same way wherever it is pinned.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from mutations import GENERIC, ORDER_BATCH, ORDER_FLOAT_SUM, Mutation, mutation, original, patch, wrap

TRANSCENDENTAL = "_exact.transcendental"

# --------------------------------------------------------------------------- exp_c / log_c

#: exp_c constants: parameter key -> name in the generic transcendental module
EXP_CONSTANTS = {"exp_log2e": "_LOG2E", "ln2_hi": "_LN2_HI", "ln2_lo": "_LN2_LO", "exp_q0": "_E0",
                 "exp_q1": "_E1", "exp_q2": "_E2", "exp_q3": "_E3", "exp_q4": "_E4"}
#: log_c constants (ln2_hi / ln2_lo are shared with exp_c)
LOG_CONSTANTS = {"ln2_hi": "_LN2_HI", "ln2_lo": "_LN2_LO", "log_sqrt_half": "_SQRT_HALF",
                 **{f"log_r{i}": f"_L{i}" for i in range(8)}}


def _module(name: str) -> Any:
    return importlib.import_module(name if name.startswith("rlkernel.") else f"{GENERIC}.{name}")


@contextlib.contextmanager
def swapped(module: str, attribute: str, value: Any) -> Iterator[None]:
    """Within the block, ``module.attribute`` (a generic-backend module) is ``value``."""
    mod = _module(module)
    saved = getattr(mod, attribute)
    setattr(mod, attribute, value)
    try:
        yield
    finally:
        setattr(mod, attribute, saved)


def with_constants(**values: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``make`` for :func:`wrap`: the wrapped function runs with the generic transcendental
    module's constants replaced by ``values`` (so one use of a shared constant can be mutated)."""

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        def mutant(*args: Any, **kwargs: Any) -> Any:
            mod = _module(TRANSCENDENTAL)
            saved = {k: getattr(mod, k) for k in values}
            for k, v in values.items():
                setattr(mod, k, v)
            try:
                return fn(*args, **kwargs)
            finally:
                for k, v in saved.items():
                    setattr(mod, k, v)

        return mutant

    return make


def ulp_steps(op: str, key: str, const: str, where: tuple[str, str] | None = None) -> list[Mutation]:
    """``const`` one ulp up and one ulp down (its binary32 encoding +-1). With ``where``
    (module, function binding) only that use is mutated, else the module constant itself."""
    bits = original(TRANSCENDENTAL, const)
    muts = []
    for step, sign in ((1, "+"), (-1, "-")):
        label = f"{const.lstrip('_')} {sign}1 ulp" + (f" in {where[1]}" if where else "")
        if where is None:
            p = patch(TRANSCENDENTAL, const, bits + step)
        else:
            p = wrap(where[0], where[1], with_constants(**{const: bits + step}))
        muts.append(mutation(op, key, label, p))
    return muts


def _k_half_away(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    t64 = t.to(torch.float64)
    k = torch.sign(t64) * torch.floor(t64.abs() + 0.5)
    return k.to(torch.int32), k.to(torch.float32)


def _k_floor(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.floor(t.to(torch.float64))
    return k.to(torch.int32), k.to(torch.float32)


def select_result(cond: Callable[[torch.Tensor], torch.Tensor], value: float) -> Callable[..., Any]:
    """``make``: exp_c whose special rule ``cond`` is dropped, i.e. the stand-in result ``value``
    (exp_c(0) = 1) comes out where the rule would have selected its special value."""

    def make(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda x: torch.where(cond(x), torch.full_like(x, value), fn(x))

    return make


def exp_mutants(op: str, binding: str, separate_ln2: bool = False, k_half_away: bool = True) -> list[Mutation]:
    """Every exp_c parameter of ``op``, whose kernel module ``binding`` calls ``exp_c``.

    ``separate_ln2``: the ln2 constants are also used by log_c in this op, so mutate their use
    inside exp_c only (through the binding). ``k_half_away``: include k rounded half away from
    zero (it changes exp_c only where RN(x * log2e) is exactly a half-integer).
    """
    muts: list[Mutation] = []
    for key, const in EXP_CONSTANTS.items():
        where = (binding, "exp_c") if separate_ln2 and key.startswith("ln2") else None
        muts += ulp_steps(op, key, const, where)
    if k_half_away:
        muts.append(mutation(op, "exp_k_rounding", "k = round half away from zero",
                             patch(TRANSCENDENTAL, "_round_k", _k_half_away)))
    muts.append(mutation(op, "exp_k_rounding", "k = floor(t)", patch(TRANSCENDENTAL, "_round_k", _k_floor)))
    muts.append(mutation(op, "exp_underflow_rule", "x < -104 -> +0 dropped (stand-in result 1)",
                         wrap(binding, "exp_c", select_result(lambda x: x < -104.0, 1.0))))
    muts.append(mutation(op, "exp_nan_rule", "NaN -> NaN dropped (stand-in result 1)",
                         wrap(binding, "exp_c", select_result(torch.isnan, 1.0))))
    return muts


def exp_representative(op: str) -> list[Mutation]:
    """One exp_c mutant (the highest polynomial coefficient one ulp up) for contracts that list
    exp_c as a single parameter; softmax and log_softmax pin every constant."""
    return [mutation(op, "exp_c", "Q4 +1 ulp", patch(TRANSCENDENTAL, "_E4", original(TRANSCENDENTAL, "_E4") + 1))]


def log_mutants(op: str, binding: str, separate_ln2: bool = True, sqrt_half_up: bool = True) -> list[Mutation]:
    """Every log_c parameter reachable in ``op`` (kernel module ``binding`` calls ``log_c``)."""
    muts: list[Mutation] = []
    for key, const in LOG_CONSTANTS.items():
        where = (binding, "log_c") if separate_ln2 and key.startswith("ln2") else None
        steps = ulp_steps(op, key, const, where)
        if key == "log_sqrt_half" and not sqrt_half_up:
            steps = steps[1:]
        muts += steps
    for bits, mask in ((11, -8192), (13, -2048)):
        muts.append(mutation(op, "log_f_head_bits", f"f head 12 -> {bits} bits",
                             patch(TRANSCENDENTAL, "_F_HEAD_MASK", mask)))
    return muts


# --------------------------------------------------------------------------- grid sums

def _half_away(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return rem >= half


def _truncate(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(rem, dtype=torch.bool)


def term_rounding_mutants(op: str, key: str = "sum_term_rounding") -> list[Mutation]:
    """Each term's grid rounding: half to even -> half away from zero / toward zero."""
    return [mutation(op, key, "half to even -> half away from zero", patch("_exact.fixed", "_rounds_up", _half_away)),
            mutation(op, key, "half to even -> toward zero", patch("_exact.fixed", "_rounds_up", _truncate))]


def total_rounding_mutants(op: str, key: str = "sum_total_rounding") -> list[Mutation]:
    """The exact integer total rounded to fp32 (P3): half to even -> half away / toward zero."""
    return [mutation(op, key, "half to even -> half away from zero",
                     patch("_exact.fp32", "_int_rounds_up", _half_away)),
            mutation(op, key, "half to even -> toward zero", patch("_exact.fp32", "_int_rounds_up", _truncate))]


def _no_specials(t: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    z = torch.zeros_like(t.sum(dim=dim, keepdim=keepdim), dtype=torch.float32)
    return z


def sum_specials_mutant(op: str, key: str = "sum_specials") -> Mutation:
    """Non-finite terms ignored (counted as 0) instead of giving the IEEE sum's NaN/inf."""
    return mutation(op, key, "non-finite terms dropped from the sum",
                    patch("_exact.fixed", "nonfinite_total", _no_specials))


def float_sum(t: torch.Tensor, dim: int = -1, e: Any = None, frac_bits: int = 0, op: str = "", keepdim: bool = False
              ) -> torch.Tensor:
    """An ``exact_sum`` stand-in that adds fp32 terms in floating point, in reversed order."""
    return torch.sum(t.flip(dim), dim=dim, keepdim=keepdim, dtype=torch.float32)


# --------------------------------------------------------------------------- output casts

def cast_truncating(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cast_out`` rounding toward zero instead of to nearest even (fp32 -> bf16/fp16)."""
    r = y.to(dtype)
    if dtype != torch.float32:
        over = r.to(torch.float32).abs() > y.abs()
        r = torch.where(over & torch.isfinite(y), torch.nextafter(r, torch.zeros_like(r)), r)
    return original("_exact.fp32", "canonical_nan")(r)


def cast_mutants(op: str, binding: str, attribute: str = "cast_out") -> list[Mutation]:
    """The output cast ``binding.attribute(y, dtype)`` rounding toward zero.

    (Its NaN canonicalisation has no mutant: conformance compares outputs after canonicalising
    NaNs, conformance/hashing.py, so no case can observe it.)
    """
    return [mutation(op, "output_rounding", "RNE -> toward zero", patch(binding, attribute, cast_truncating))]


# --------------------------------------------------------------------------- softmax

def sum_mutants(op: str) -> list[Mutation]:
    """The probability sum L of softmax and log_softmax (kernel module ``softmax``)."""
    exact_sum = original("softmax", "exact_sum")

    def max_grid(t: torch.Tensor, dim: int = -1, e: Any = None, frac_bits: int = 40, op: str = "sum",
                 keepdim: bool = False) -> torch.Tensor:
        return exact_sum(t, dim=dim, e=None, frac_bits=frac_bits, op=op, keepdim=keepdim)

    return [
        mutation(op, "sum_frac_bits", "F 40 -> 39", patch("softmax", "F_SUM", 39)),
        mutation(op, "sum_frac_bits", "F 40 -> 41", patch("softmax", "F_SUM", 41)),
        mutation(op, "sum_grid_exponent", "absolute E = 0 -> max grid E = expo(max p)",
                 patch("softmax", "exact_sum", max_grid)),
        *term_rounding_mutants(op),
        *total_rounding_mutants(op),
        mutation(op, ORDER_FLOAT_SUM, "L summed in fp32, reversed order", patch("softmax", "exact_sum", float_sum)),
    ]


def batch_max_mutant(op: str) -> Mutation:
    """The row max taken over every row of the chunk (a batch-dependent shift)."""
    nan_max = original("softmax", "nan_max")

    def batch_max(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
        m = nan_max(x, dim=dim, keepdim=True)
        return m.amax(dim=0, keepdim=True).expand_as(m) if keepdim else m.amax().expand(m.shape[:-1])

    return mutation(op, ORDER_BATCH, "row max over the whole batch", patch("softmax", "nan_max", batch_max))


def _reciprocal_softmax(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    rows = original("softmax", "_rows")
    one = torch.ones((), dtype=torch.float32)
    return rows(x, dtype, "softmax", lambda d, p, big_l: p * (one / big_l))


MUTATIONS: list[Mutation] = [
    *sum_mutants("softmax"),
    *exp_mutants("softmax", "softmax"),
    mutation("softmax", "division", "p / L -> p * RN(1 / L)", patch("softmax", "softmax", _reciprocal_softmax)),
    *cast_mutants("softmax", "softmax"),
    batch_max_mutant("softmax"),
]

