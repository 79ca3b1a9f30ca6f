"""How to draw a request's completions (nano-vllm's ``sampling_params.py``), and the per-sample seeds."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SamplingParams", "sample_seed"]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment: 2**64 / golden ratio, odd


def sample_seed(seed: int, sample_index: int) -> int:
    """The seed that sample ``j`` of a request with seed ``s`` draws its tokens with.

    ``sample_seed(s, 0) = s mod 2**64`` (so ``SamplingParams(seed=out.seed, n=1)`` replays any
    sample) and, for ``j >= 1``, the SplitMix64 finaliser of ``(s + j * 0x9E3779B97F4A7C15) mod
    2**64`` (a bijection of its input, so the n samples of one request get n different seeds).

    Parameters
    ----------
    seed : int
        The request's seed (any Python int; read modulo 2**64).
    sample_index : int
        ``j`` in ``0 .. n - 1``.

    Returns
    -------
    int in ``[0, 2**64)``: the 64-bit pattern given to ``rlkernel.ops.sample`` (as int64).
    """
    z = seed & _MASK64
    if sample_index == 0:
        return z
    z = (z + sample_index * _GOLDEN) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _int(name: str, value: object, low: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
        raise ValueError(f"SamplingParams: {name} = {value!r}; expected an int >= {low} ({what})")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling of one request: n completions drawn by ``rlkernel.ops.sample`` (contract ``sample``).

    Parameters
    ----------
    temperature : float
        >= 0 and finite; 0 = greedy (argmax; ``top_k``/``top_p`` are then ignored).
    top_k : int
        >= 0; 0 = off. Keep the k most likely tokens.
    top_p : float
        In [0, 1]; 1 = off. Keep the smallest most-likely prefix whose mass reaches ``top_p``.
    max_tokens : int
        >= 1: completion tokens at most (finish reason ``"length"``).
    stop_token_ids : sequence of int
        Ids that end a completion (kept as its last token; finish reason ``"stop"``), whatever
        ``ignore_eos`` says.
    n : int
        >= 1: completions of the prompt (a GRPO group).
    seed : int, optional
        The request's seed; sample ``j`` draws with :func:`sample_seed` ``(seed, j)``. None: the
        engine draws one from its own generator (``LLM(..., seed=...)``).
    ignore_eos : bool
        Do not stop on the model's ``eos_token_id`` (config.json).

    Bitwise semantics
    -----------------
    Token ``i`` of a sample is ``sample(logits, T, top_k, top_p, seed_j, position)`` where
    ``position`` is the token's position in prompt + completion: a function of the request's own
    tokens only, so the same (prompt, params, seed) gives the same tokens in every batch. The
    recorded log-probs are of the full temperature-scaled distribution (no top-k/top-p
    truncation), at ``T`` or at 1.0 for greedy requests.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    stop_token_ids: Sequence[int] = ()
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t) or t < 0:
            raise ValueError(f"SamplingParams: temperature = {t!r}; expected a finite float >= 0 (0 = greedy)")
        if 0 < t and float(t) < 1.401298464324817e-45:
            raise ValueError(f"SamplingParams: temperature = {t!r} rounds to 0 in fp32; pass 0 (greedy) or a "
                             f"value >= 1.4e-45")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0 <= p <= 1:
            raise ValueError(f"SamplingParams: top_p = {p!r}; expected a float in [0, 1] (1 = off)")
        _int("top_k", self.top_k, 0, "0 = off")
        _int("max_tokens", self.max_tokens, 1, "completion tokens at most")
        _int("n", self.n, 1, "samples per prompt")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)):
            raise ValueError(f"SamplingParams: seed = {self.seed!r}; expected an int (read modulo 2**64) or None "
                             f"(the engine draws one)")
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Sequence) or any(
                isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in self.stop_token_ids):
            raise ValueError(f"SamplingParams: stop_token_ids = {self.stop_token_ids!r}; expected a sequence of "
                             f"int token ids")
        object.__setattr__(self, "stop_token_ids", tuple(int(s) for s in self.stop_token_ids))
        object.__setattr__(self, "ignore_eos", bool(self.ignore_eos))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the recorded log-probs: ``temperature``, or 1.0 for greedy requests."""
        return 1.0 if self.greedy else float(self.temperature)
