"""Prompts and a recorded rollout through rlkernel's engine (:mod:`rlkernel.rollout`)."""

from __future__ import annotations

import gc
import time
from typing import Any

import torch

from rlkernel.model import Qwen3ForCausalLM
from rlkernel.validate.record import Record, Sample, sampling_dict
from rlkernel.validate.replay import synchronize

__all__ = ["make_prompts", "record_rollout"]

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def make_prompts(num_prompts: int, min_len: int, max_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    """``num_prompts`` random prompts, lengths uniform in ``[min_len, max_len]``, ids uniform in ``[0, vocab_size)``.

    Drawn on the CPU from one ``torch.Generator`` seeded with ``seed``: the same on every machine.
    """
    if not 1 <= min_len <= max_len:
        raise ValueError(f"make_prompts: prompt lengths {min_len}:{max_len}; expected 1 <= MIN <= MAX")
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, max_len + 1, (num_prompts,), generator=g).tolist()
    return [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lens]


def record_rollout(model: Qwen3ForCausalLM, prompts: list[list[int]], params: list[Any], *, model_sha256: str,
                   config_sha256: str, engine_batch: int, block_size: int = 16, max_model_len: int | None = None,
                   max_num_batched_tokens: int = 2048, enforce_eager: bool = False,
                   kv_cache_memory: int | None = None, warmup: bool = False) -> Record:
    """Generate with :class:`rlkernel.rollout.LLM` and return the rollout as a :class:`Record`.

    Parameters
    ----------
    model : Qwen3ForCausalLM
    prompts : list of list of int
    params : list of SamplingParams
        One per prompt.
    model_sha256, config_sha256 : str
        The model's hashes, stored in the record.
    engine_batch : int
        The engine's ``max_num_seqs`` (sequences per decode step).
    block_size, max_model_len, max_num_batched_tokens, enforce_eager, kv_cache_memory
        Passed to the engine.
    warmup : bool
        Generate a few tokens first, untimed (CUDA: kernel compilation and graph capture are
        not the rollout's throughput).

    Returns
    -------
    Record
        ``meta["engine"]`` holds the settings, ``seconds`` (the timed ``generate`` call),
        ``tokens_per_s`` (completion tokens per second) and the engine's ``stats``.
    """
    from rlkernel.rollout import LLM, SamplingParams

    device = model.lm_head.weight.device
    llm = LLM(model, block_size=block_size, max_num_seqs=engine_batch, max_num_batched_tokens=max_num_batched_tokens,
              max_model_len=max_model_len, enforce_eager=enforce_eager, kv_cache_memory=kv_cache_memory)
    if warmup:
        k = min(len(prompts), engine_batch)
        llm.generate(prompts[:k], [SamplingParams(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                                  max_tokens=min(4, p.max_tokens), seed=p.seed) for p in params[:k]])
    synchronize(device)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    synchronize(device)
    seconds = time.perf_counter() - start
    stats = dict(getattr(llm, "stats", {}) or {})
    del llm
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    samples = [Sample(o.prompt_index, o.sample_index, list(o.token_ids), o.logprobs.to("cpu", torch.float32),
                      o.finish_reason, int(o.seed)) for o in outs]
    tokens = sum(len(s.token_ids) for s in samples)
    engine = {"max_num_seqs": engine_batch, "block_size": block_size, "max_model_len": max_model_len,
              "max_num_batched_tokens": max_num_batched_tokens, "enforce_eager": enforce_eager,
              "seconds": seconds, "tokens_per_s": tokens / seconds if seconds > 0 else None,
              "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}}
    return Record(prompts, samples, [sampling_dict(p) for p in params], model_sha256, config_sha256,
                  {k: v for k, v in vars(model.config).items() if k != "extra"},
                  _DTYPE_NAMES.get(model.dtype, str(model.dtype)), {"engine": engine, "device": str(device)})
