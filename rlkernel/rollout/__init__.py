"""``rlkernel.rollout``: a small vLLM-like rollout engine whose log-probs are the trainer's bits.

Shaped like nano-vllm: :mod:`~rlkernel.rollout.sampling_params` (what to draw, per-sample
seeds), :mod:`~rlkernel.rollout.sequence` (one sample's state and output),
:mod:`~rlkernel.rollout.block_manager` (KV blocks), :mod:`~rlkernel.rollout.scheduler` (waiting
and running queues, chunked prefill, preemption), :mod:`~rlkernel.rollout.model_runner` (batch
tensors, forward, sampling, log-probs), :mod:`~rlkernel.rollout.cuda_graph` (captured decode
steps; :mod:`~rlkernel.rollout.weight_exponents`, the exponent buffers they read) and
:mod:`~rlkernel.rollout.llm_engine` (the loop). See docs/rollout.md.

Usage::

    from rlkernel.rollout import LLM, SamplingParams
    llm = LLM(model, num_blocks=1024)
    outs = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=256, n=8))
    outs[0].token_ids, outs[0].logprobs   # == packed_logprobs(model, prompt + completion, ...) bits
"""

from __future__ import annotations

from rlkernel.rollout.llm_engine import LLM
from rlkernel.rollout.sampling_params import SamplingParams, sample_seed
from rlkernel.rollout.sequence import RolloutOutput

__all__ = ["LLM", "RolloutOutput", "SamplingParams", "sample_seed"]
