"""Mutants of sample's parameters: Philox4x32-10 and its counter layout, the uniform map, the
Gumbel noise's log_c, the temperature, the top-k and top-p rules, the tie and special-row rules."""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, Mutation, mutation, original, patch, wrap
from mutations.softmax import TRANSCENDENTAL, swapped

OP = "sample"
PHILOX = "_exact.philox"
_MASK32 = 0xFFFFFFFF


def _plus_one(name: str, key: str) -> Mutation:
    return mutation(OP, key, f"{name.lstrip('_')} + 1", patch(PHILOX, name, original(PHILOX, name) + 1))


def _swap_halves(v: torch.Tensor) -> torch.Tensor:
    """The two 32-bit halves of an int64 exchanged."""
    return ((v & _MASK32) << 32) | ((v >> 32) & _MASK32)


def _counter(transform: Any) -> Any:
    """``_counter_words(seed, position, blocks)`` called with ``transform``-ed arguments."""
    counter_words = original("sample", "_counter_words")

    def mutant(seed: torch.Tensor, position: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
        return counter_words(*transform(seed, position, blocks))

    return mutant


def _counter_word3_one(seed: torch.Tensor, position: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The counter's fourth word 1 instead of 0."""
    shape = blocks.shape
    counter = torch.stack([blocks, (position & _MASK32).view(-1, 1).expand(shape),
                           ((position >> 32) & _MASK32).view(-1, 1).expand(shape),
                           torch.ones(shape, dtype=torch.int64, device=blocks.device)], dim=-1)
    key = torch.stack([seed & _MASK32, (seed >> 32) & _MASK32], dim=-1).view(-1, 1, 2)
    return original(PHILOX, "philox4x32")(counter, key, check=False)


def _key_bumped_first(fn: Any) -> Any:
    """The key bumped before the first round too (rounds keyed k + W .. k + 10 W)."""
    w = torch.tensor([original(PHILOX, "_W0"), original(PHILOX, "_W1")], dtype=torch.int64)

    def mutant(counter: torch.Tensor, key: torch.Tensor, check: bool = True) -> torch.Tensor:
        return fn(counter, (key + w) & _MASK32, check=check)

    return mutant


def _word_rotated(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Gumbel noise of token j from output word (j + 1) & 3 of its block instead of j & 3."""
    words = original("sample", "_counter_words")(seed, position, ids >> 2)
    r = words.gather(-1, ((ids + 1) & 3).unsqueeze(-1)).squeeze(-1)
    return original("sample", "_gumbel")(original(PHILOX, "uniform_from_u32")(r, check=False))


def _word_rotated_all(seed: torch.Tensor, position: torch.Tensor, v: int) -> torch.Tensor:
    ids = torch.arange(v, dtype=torch.int64).expand(seed.shape[0], v)
    return _word_rotated(seed, position, ids)


def _to_fixed_for(bits: int, rounds_up: Any) -> Any:
    """``to_fixed`` whose rounding is ``rounds_up`` when called with ``bits`` fraction bits only."""
    to_fixed = original("sample", "to_fixed")

    def mutant(t: torch.Tensor, e: torch.Tensor, frac_bits: int = 40) -> torch.Tensor:
        if frac_bits != bits:
            return to_fixed(t, e, frac_bits)
        with swapped("_exact.fixed", "_rounds_up", rounds_up):
            return to_fixed(t, e, frac_bits)

    return mutant


def _half_away(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return rem >= half


def _truncate(q: torch.Tensor, rem: torch.Tensor, half: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(rem, dtype=torch.bool)


_CUT = original("sample", "_cut")
_FIRST_ARGMAX = original("sample", "first_argmax")


def _cut_rounded(total: torch.Tensor, pnum: torch.Tensor) -> torch.Tensor:
    """total * pnum / 2**24 rounded half up instead of down: the floor, plus 1 when the
    fraction (low 24 bits of (total mod 2**24) * pnum) is at least 1/2."""
    return _CUT(total, pnum) + ((((total & ((1 << 24) - 1)) * pnum) >> 23) & 1)


def _keeps_at_or_below(rank: torch.Tensor, before: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    return (rank == 0) | (before <= cut)


def _keeps_without_first(rank: torch.Tensor, before: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    return before < cut


def _top_k_plus_one(fn: Any) -> Any:
    def mutant(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, *rest: Any) -> torch.Tensor:
        return fn(x, temperature, torch.where(top_k > 0, top_k + 1, top_k), *rest)

    return mutant


def _last_argmax(x: torch.Tensor) -> torch.Tensor:
    """Argmax with ties (and NaNs) going to the highest index."""
    n = x.shape[-1]
    return n - 1 - _FIRST_ARGMAX(x.flip(-1))


def _last(mask: torch.Tensor) -> torch.Tensor:
    v = mask.shape[-1]
    pos = torch.arange(v, device=mask.device)
    return torch.where(mask.any(dim=-1), torch.where(mask, pos, -1).amax(dim=-1), v)


def _order_key_high_ties(z: torch.Tensor) -> torch.Tensor:
    """Rank ties to the higher token id."""
    b = (z + 0.0).view(torch.int32).to(torch.int64)
    mono = torch.where(b < 0, b ^ 0x7FFFFFFF, b)
    return (mono << 18) + torch.arange(z.shape[-1], device=z.device)


def _temper_reciprocal(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    return x * (torch.ones_like(tau) / tau)


def _batch_k(fn: Any) -> Any:
    """Every row of a batch cut at the batch's largest top_k (a batch-dependent top-k)."""

    def mutant(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, *rest: Any) -> torch.Tensor:
        v = x.shape[1]
        k = torch.where((top_k == 0) | (top_k > v), v, top_k)
        return fn(x, temperature, torch.where(top_k > 0, k.max(), top_k), *rest)

    return mutant


MUTATIONS: list[Mutation] = [
    # Philox4x32-10 (R7, P9) and the counter/key layout of the contract
    mutation(OP, "philox_rounds", "10 -> 9 rounds", patch(PHILOX, "_ROUNDS", 9)),
    mutation(OP, "philox_rounds", "10 -> 11 rounds", patch(PHILOX, "_ROUNDS", 11)),
    _plus_one("_M0", "philox_m0"),
    _plus_one("_M1", "philox_m1"),
    _plus_one("_W0", "philox_w0"),
    _plus_one("_W1", "philox_w1"),
    mutation(OP, "philox_key_schedule", "key bumped before the first round too",
             wrap("sample", "philox4x32", _key_bumped_first)),
    mutation(OP, "counter_block", "block j >> 2 -> (j >> 2) + 1",
             patch("sample", "_counter_words", _counter(lambda s, p, b: (s, p, b + 1)))),
    mutation(OP, "counter_position", "position words (lo, hi) -> (hi, lo)",
             patch("sample", "_counter_words", _counter(lambda s, p, b: (s, _swap_halves(p), b)))),
    mutation(OP, "counter_word3", "fourth counter word 0 -> 1", patch("sample", "_counter_words", _counter_word3_one)),
    mutation(OP, "counter_output_word", "word j & 3 -> (j + 1) & 3",
             patch("sample", "_gumbel_at", _word_rotated), patch("sample", "_gumbel_all", _word_rotated_all)),
    mutation(OP, "key_layout", "key (seed lo, seed hi) -> (seed hi, seed lo)",
             patch("sample", "_counter_words", _counter(lambda s, p, b: (_swap_halves(s), p, b)))),
    # uint32 -> fp32
    mutation(OP, "uniform_bits", "u from r >> 9 -> r >> 10", patch(PHILOX, "_U_SHIFT", 10)),
    mutation(OP, "uniform_bits", "u from r >> 9 -> r >> 8", patch(PHILOX, "_U_SHIFT", 8)),
    mutation(OP, "uniform_offset", "(2j + 1) * 2**-24 -> 2j * 2**-24", patch(PHILOX, "_HALF_ULP_BITS", 0)),
    # the noise's logarithm (every log_c constant is pinned by log_softmax)
    mutation(OP, "log_c", "R0 +1 ulp", patch(TRANSCENDENTAL, "_L0", original(TRANSCENDENTAL, "_L0") + 1)),
    mutation(OP, "exp_c", "Q4 +1 ulp", patch(TRANSCENDENTAL, "_E4", original(TRANSCENDENTAL, "_E4") + 1)),
    # temperature, ranking, top-k, top-p
    mutation(OP, "temperature_division", "x / tau -> x * RN(1 / tau)", patch("sample", "_temper", _temper_reciprocal)),
    mutation(OP, "top_k_rule", "k highest ranks -> k + 1", wrap("sample", "_rows", _top_k_plus_one)),
    mutation(OP, "top_p_frac_bits", "F 40 -> 39", patch("sample", "F_SUM", 39)),
    mutation(OP, "top_p_frac_bits", "F 40 -> 41", patch("sample", "F_SUM", 41)),
    mutation(OP, "top_p_q_rounding", "q: half to even -> toward zero",
             patch("sample", "to_fixed", _to_fixed_for(40, _truncate))),
    mutation(OP, "top_p_q_rounding", "q: half to even -> half away from zero",
             patch("sample", "to_fixed", _to_fixed_for(40, _half_away))),
    mutation(OP, "top_p_p_bits", "pnum = RNE(p * 2**24) -> 2**23", patch("sample", "_P_BITS", 23)),
    mutation(OP, "top_p_p_bits", "pnum = RNE(p * 2**24) -> 2**25", patch("sample", "_P_BITS", 25)),
    mutation(OP, "top_p_p_rounding", "pnum: half to even -> toward zero",
             patch("sample", "to_fixed", _to_fixed_for(24, _truncate))),
    mutation(OP, "top_p_p_rounding", "pnum: half to even -> half away from zero",
             patch("sample", "to_fixed", _to_fixed_for(24, _half_away))),
    mutation(OP, "top_p_cut", "floor(total * pnum / 2**24) -> rounded to nearest",
             patch("sample", "_cut", _cut_rounded)),
    mutation(OP, "top_p_compare", "kept iff before < cut -> before <= cut",
             patch("sample", "_top_p_keeps", _keeps_at_or_below)),
    mutation(OP, "top_p_first_kept", "the first-ranked token always kept -> dropped rule",
             patch("sample", "_top_p_keeps", _keeps_without_first)),
    # ties and special rows (R5)
    mutation(OP, "argmax_ties", "greedy and Gumbel max: lowest index -> highest",
             patch("sample", "first_argmax", _last_argmax)),
    mutation(OP, "rank_ties", "rank ties: lower id first -> higher id first",
             patch("sample", "_order_key", _order_key_high_ties)),
    mutation(OP, "special_rows", "NaN / +inf rows: first such index -> last", patch("sample", "_first", _last)),
    mutation(OP, ORDER_BATCH, "top-k at the batch's largest k", wrap("sample", "_rows", _batch_k)),
]
