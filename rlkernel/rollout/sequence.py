"""One sample's state while it is generated (nano-vllm's ``sequence.py``), and its output."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto
from typing import Literal

import torch

from rlkernel.rollout.sampling_params import SamplingParams

__all__ = ["RolloutOutput", "Sequence", "SequenceStatus"]


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Tokens, KV blocks and progress of one sample (one of a request's ``n``).

    ``token_ids`` is prompt + completion so far. ``num_computed_tokens`` of them have their keys
    and values in the cache blocks of ``block_table``; the next forward feeds some of the rest.
    When all are fed, the last row predicts the next token: it is sampled and appended. A
    preempted sequence loses its blocks (``num_computed_tokens = 0``) and is recomputed from its
    tokens later: same tokens, same positions, so the same bits.
    """

    def __init__(self, request_id: int, prompt_index: int, sample_index: int, prompt: list[int],
                 params: SamplingParams, seed: int) -> None:
        self.request_id, self.prompt_index, self.sample_index = request_id, prompt_index, sample_index
        self.params, self.seed = params, seed
        self.token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.logprobs: list[torch.Tensor] = []  # fp32 [1] CPU slices, one per completion token
        self.finish_reason: Literal["stop", "length"] | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens not yet fed through the model (the prompt, a chunk's rest, or the last sampled token)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Feeding prompt tokens (or recomputing after preemption), rather than its last sampled token."""
        return self.num_computed_tokens < len(self.token_ids) - 1 or self.num_completion_tokens == 0

    def output(self) -> RolloutOutput:
        logprobs = torch.cat(self.logprobs) if self.logprobs else torch.zeros(0, dtype=torch.float32)
        return RolloutOutput(self.request_id, self.prompt_index, self.sample_index,
                             self.token_ids[:self.num_prompt_tokens], self.token_ids[self.num_prompt_tokens:],
                             logprobs, self.finish_reason or "length", self.seed)


@dataclass
class RolloutOutput:
    """One completion of one prompt.

    Attributes
    ----------
    request_id : int
        The request (prompt) id, counted over the engine's lifetime; its n samples share it.
    prompt_index : int
        Index of the prompt in the ``generate`` call.
    sample_index : int
        ``j`` in ``0 .. n - 1``.
    prompt_token_ids : list of int
    token_ids : list of int
        The completion, including the stop token if one ended it.
    logprobs : Tensor, float32, [len(token_ids)], CPU
        ``logprobs[i] = model.logprobs(row, token_ids[i], T)`` of the row that predicted token i:
        the full temperature-scaled distribution (no top-k/top-p truncation); ``T = 1.0`` for
        greedy requests. Equal bit for bit to ``rlkernel.rl.packed_logprobs(model, prompt +
        completion, cu_seqlens, temperature=T)`` at the completion's positions.
    finish_reason : "stop" or "length"
        ``"stop"``: a stop token or the model's eos; ``"length"``: ``max_tokens`` or ``max_model_len``.
    seed : int
        The 64-bit seed this sample drew with (:func:`~rlkernel.rollout.sampling_params.sample_seed`);
        ``SamplingParams(seed=seed, n=1, ...)`` with the same prompt and other params replays it.
    """

    request_id: int
    prompt_index: int
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: torch.Tensor
    finish_reason: Literal["stop", "length"]
    seed: int
