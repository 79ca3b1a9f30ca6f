"""The engine: schedule -> run -> postprocess until every sample is done (nano-vllm's ``llm_engine.py``)."""

from __future__ import annotations

import logging
import math
import numbers
import random
import sys
import time
from collections.abc import Sequence as SequenceOf
from typing import Literal

import torch

from rlkernel.model import Qwen3ForCausalLM
from rlkernel.rollout.block_manager import BlockManager
from rlkernel.rollout.model_runner import ModelRunner
from rlkernel.rollout.native_ops import NATIVE
from rlkernel.rollout.sampling_params import SamplingParams, sample_seed
from rlkernel.rollout.scheduler import Scheduler
from rlkernel.rollout.sequence import RolloutOutput, Sequence
from rlkernel.rollout.weight_exponents import digits_bytes, reads_digits

__all__ = ["LLM"]

logger = logging.getLogger(__name__)

#: Share of the free CUDA memory (measured when the engine is built) given to the KV cache by default.
GPU_MEMORY_FRACTION = 0.85
#: Cache budget on devices other than CUDA when neither num_blocks nor kv_cache_memory is given.
HOST_KV_CACHE_BYTES = 1 << 30


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"LLM: {name} = {value!r}; expected an int >= 1")
    return int(value)


def _eos_ids(model: Qwen3ForCausalLM) -> frozenset[int]:
    """``eos_token_id`` of config.json (an int or a list), or none."""
    eos = model.config.extra.get("eos_token_id")
    if eos is None:
        return frozenset()
    ids = eos if isinstance(eos, list) else [eos]
    return frozenset(int(e) for e in ids)


class LLM:
    """A rollout engine over a :class:`~rlkernel.model.qwen3.Qwen3ForCausalLM`: vLLM's ``LLM`` at small scale.

    Parameters
    ----------
    model : Qwen3ForCausalLM
        With or without a tensor-parallel group: every rank builds the same engine and calls
        ``generate`` with the same inputs; every rank returns the same outputs.
    num_blocks : int, optional
        KV cache blocks. Default: from ``kv_cache_memory``; else on CUDA ``GPU_MEMORY_FRACTION``
        (0.85) of the free device memory when the engine is built (the minimum over the TP
        ranks); else ``HOST_KV_CACHE_BYTES`` (1 GiB), at most what ``max_num_seqs`` sequences of
        ``max_model_len`` tokens need.
    block_size : int
        Token slots per block (16).
    max_num_seqs : int
        Sequences per step at most (the decode batch; 64).
    max_num_batched_tokens : int
        Tokens per step at most (2048); a longer prompt is prefilled in chunks over several steps.
    max_model_len : int, optional
        Longest prompt + completion; default and upper bound the model's ``max_position_embeddings``.
    enforce_eager : bool
        Never capture CUDA graphs (by default decode steps on CUDA replay graphs when the model
        has no tensor-parallel group; TP > 1 runs eagerly).
    kv_cache_memory : int, optional
        Bytes of KV cache (per rank), when ``num_blocks`` is not given.
    seed : int
        Seeds the engine's generator, which draws the seed of every request whose
        ``SamplingParams.seed`` is None (in the order the requests are added).
    ops : "rlkernel" or "native"
        ``"rlkernel"`` (default): the exact ops; everything below under *Bitwise semantics*
        holds. ``"native"``: a performance baseline, NOT bitwise: the same scheduler, block
        manager, KV cache layout and CUDA graphs over torch's own ops
        (:mod:`rlkernel.rollout.native_ops`: cuBLAS bf16 matmuls, SDPA, torch sampling that
        ignores the per-sample seeds), on this model's weights (shared, not copied;
        :meth:`~rlkernel.model.qwen3.Qwen3ForCausalLM.with_ops`). One device only. It exists to
        measure what the exact ops cost end to end (``tools/e2e_bench.py``); it is never chosen
        for you, and the trainer refuses it.
    weight_digits : bool, optional
        The decode graphs also hold every linear weight's int8 digit planes
        (``rlkernel.ops.linear_weight_digits``: 3 bytes a weight element, 1.5x the bf16 weights,
        taken from the KV cache's share when ``num_blocks`` is not given), which ``linear``'s sm_90
        wgmma kernel reads at a decode step's 65-256 rows instead of making the digits every step.
        Default (None): on where that kernel runs (NVIDIA sm_90); False saves the memory. The
        same bits either way. Only with CUDA graphs (ignored by eager engines and ``ops='native'``).

    Attributes
    ----------
    stats : dict
        Totals over the engine's life: ``prefill_tokens`` / ``prefill_seconds`` (tokens fed and
        wall time of the steps that feed any prompt or recomputed tokens), ``decode_tokens`` /
        ``decode_seconds`` (of the steps that only feed sampled tokens), ``generated_tokens``,
        ``steps``, ``preemptions``.

    Bitwise semantics
    -----------------
    A sample's tokens are drawn by ``rlkernel.ops.sample`` from ``(logits row, its seed, the
    token's position)`` and its log-probs are ``model.logprobs`` of the row that predicted each
    token; every op on the way is per row or per query, so both are the same bits whatever the
    batching, chunking, ``max_num_seqs``, request order, block assignment, preemption and
    recomputation, CUDA graph or eager, and TP degree, and equal the trainer's
    ``rlkernel.rl.packed_logprobs`` of prompt + completion at the same temperature.
    """

    def __init__(self, model: Qwen3ForCausalLM, *, num_blocks: int | None = None, block_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048, max_model_len: int | None = None,
                 enforce_eager: bool = False, kv_cache_memory: int | None = None, seed: int = 0,
                 ops: Literal["rlkernel", "native"] = "rlkernel", weight_digits: bool | None = None) -> None:
        if not isinstance(model, Qwen3ForCausalLM):
            raise TypeError(f"LLM: model is a {type(model).__name__}; expected a rlkernel.model.Qwen3ForCausalLM")
        if not model.ops.bitwise:
            raise ValueError(f"LLM: the model runs the {model.ops.name!r} op set; pass the model built with the "
                             f"exact ops and choose the baseline with LLM(model, ops='native')")
        if ops == "native":
            if model.tp_size > 1:
                raise ValueError(f"LLM: ops='native' is a one-device baseline; this model is tensor-parallel "
                                 f"(tp_size = {model.tp_size})")
            model = model.with_ops(NATIVE)
            logger.warning("rollout engine: ops='native' (torch's own ops): a performance baseline, NOT bitwise; "
                           "its tokens and log-probs are not the trainer's bits")
        elif ops != "rlkernel":
            raise ValueError(f"LLM: ops = {ops!r}; expected 'rlkernel' (the exact ops, default) or 'native' (torch's "
                             f"own ops: a performance baseline, not bitwise)")
        #: The op set the engine runs (``"rlkernel"`` or ``"native"``) and whether its results are bitwise.
        self.ops, self.bitwise = ops, model.ops.bitwise
        self.model = model
        self.block_size = _positive_int("block_size", block_size)
        self.max_num_seqs = _positive_int("max_num_seqs", max_num_seqs)
        self.max_num_batched_tokens = _positive_int("max_num_batched_tokens", max_num_batched_tokens)
        limit = model.config.max_position_embeddings
        self.max_model_len = limit if max_model_len is None else _positive_int("max_model_len", max_model_len)
        if self.max_model_len > limit:
            raise ValueError(f"LLM: max_model_len = {self.max_model_len} exceeds the model's max_position_embeddings "
                             f"= {limit}; pass max_model_len <= {limit}")
        device = model.lm_head.weight.device
        graphs = device.type == "cuda" and not enforce_eager and model.tp_size == 1
        #: Whether the decode graphs hold the linear weights' digit planes.
        self.weight_digits = bool(graphs and model.ops.bitwise
                                  and (reads_digits(device) if weight_digits is None else weight_digits))
        self.num_blocks = self._num_blocks(num_blocks, kv_cache_memory,
                                           digits_bytes(model) if self.weight_digits else 0)
        self.vocab_size = model.config.vocab_size
        self.eos_token_ids = _eos_ids(model)
        self.block_manager = BlockManager(self.num_blocks, self.block_size)
        self.scheduler = Scheduler(self.block_manager, self.max_num_seqs, self.max_num_batched_tokens)
        self.model_runner = ModelRunner(model, self.num_blocks, self.block_size, self.max_num_seqs,
                                        self.max_model_len, bool(enforce_eager), self.weight_digits)
        self._rng = random.Random(seed)
        self._next_request_id = 0
        self.stats: dict[str, float] = dict.fromkeys(
            ("prefill_tokens", "prefill_seconds", "decode_tokens", "decode_seconds", "generated_tokens", "steps",
             "preemptions"), 0)
        logger.info("rollout engine: ops %s, %d KV blocks of %d tokens, max_num_seqs %d, max_num_batched_tokens "
                    "%d, max_model_len %d, CUDA graphs %s", self.ops, self.num_blocks, self.block_size,
                    self.max_num_seqs, self.max_num_batched_tokens, self.max_model_len,
                    "on" if self.model_runner.graphs is not None else "off")

    # ------------------------------------------------------------------ setup
    def _num_blocks(self, num_blocks: int | None, kv_cache_memory: int | None, reserved: int = 0) -> int:
        if num_blocks is not None:
            return _positive_int("num_blocks", num_blocks)
        per_block = self.model.kv_cache_bytes_per_block(self.block_size)
        device = self.model.lm_head.weight.device
        if kv_cache_memory is not None:
            memory = _positive_int("kv_cache_memory", kv_cache_memory)
            if memory < per_block:
                raise ValueError(f"LLM: kv_cache_memory = {memory} bytes is below one KV block ({per_block} bytes "
                                 f"at block_size {self.block_size}); give more memory or a smaller block_size")
            return memory // per_block
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            blocks = int(max(free - reserved, 0) * GPU_MEMORY_FRACTION) // per_block
            if self.model.group is not None:  # the ranks must agree, or their schedules would differ
                import torch.distributed as dist

                t = torch.tensor([blocks], dtype=torch.int64, device=device)
                dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.model.group)  # type: ignore[arg-type]
                blocks = int(t)
        else:
            need = self.max_num_seqs * -(-self.max_model_len // self.block_size)
            blocks = min(need, HOST_KV_CACHE_BYTES // per_block)
        if blocks < 1:
            raise ValueError(f"LLM: no room for one KV block ({per_block} bytes) on {device}; free memory or pass "
                             f"num_blocks / kv_cache_memory")
        return blocks

    # ------------------------------------------------------------------ requests
    def _check_request(self, index: int, prompt: object, params: SamplingParams) -> list[int]:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"LLM.generate: sampling_params[{index}] is a {type(params).__name__}; expected "
                            f"rlkernel.rollout.SamplingParams")
        if isinstance(prompt, torch.Tensor):
            prompt = prompt.tolist()
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, SequenceOf) or any(
                isinstance(t, bool) or not isinstance(t, numbers.Integral) for t in prompt):
            raise TypeError(f"LLM.generate: prompt {index} is {type(prompt).__name__}; expected a list of int token "
                            f"ids (tokenize text first)")
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError(f"LLM.generate: prompt {index} is empty; expected at least one token id (a BOS or "
                             f"chat-template token)")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"LLM.generate: prompt {index} holds token id {bad[0]}; expected ids in [0, "
                             f"{self.vocab_size}) (the model's vocab_size); check the tokenizer")
        stops = [t for t in params.stop_token_ids if not 0 <= t < self.vocab_size]
        if stops:
            raise ValueError(f"LLM.generate: sampling_params[{index}].stop_token_ids holds {stops[0]}; expected ids "
                             f"in [0, {self.vocab_size}) (the model's vocab_size)")
        if len(ids) + 1 > self.max_model_len:
            raise ValueError(f"LLM.generate: prompt {index} has {len(ids)} tokens; with one completion token that "
                             f"exceeds max_model_len = {self.max_model_len}; shorten the prompt or raise "
                             f"max_model_len (at most max_position_embeddings = "
                             f"{self.model.config.max_position_embeddings})")
        # the most tokens whose keys the cache must hold at once (the last sampled token is never fed)
        fed = min(len(ids) + params.max_tokens, self.max_model_len) - 1
        need = self.block_manager.blocks_for(fed)
        if need > self.num_blocks:
            raise ValueError(f"LLM.generate: prompt {index} ({len(ids)} tokens, max_tokens {params.max_tokens}) may "
                             f"need {need} KV blocks of {self.block_size} tokens but the cache has {self.num_blocks}; "
                             f"pass a larger num_blocks or kv_cache_memory, or lower max_tokens")
        return ids

    def generate(self, prompts: list[list[int]], sampling_params: SamplingParams | list[SamplingParams],
                 use_tqdm: bool = False) -> list[RolloutOutput]:
        """Complete every prompt ``n`` times.

        Parameters
        ----------
        prompts : list of list of int
            Token ids (each non-empty, in ``[0, vocab_size)``).
        sampling_params : SamplingParams or list of SamplingParams
            One for all prompts, or one per prompt.
        use_tqdm : bool
            Show a one-line progress report on stderr (finished samples, tokens/s).

        Returns
        -------
        list of RolloutOutput
            Prompt 0's n samples (sample_index 0 .. n-1), then prompt 1's, ...: ``sum(n)`` outputs.

        Raises
        ------
        ValueError, TypeError
            Before any work: an empty prompt, token ids or stop ids outside the vocabulary, a prompt
            that leaves no room for one token in ``max_model_len``, a request that cannot fit the
            KV cache alone, a sampling_params list of the wrong length.
        """
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"LLM.generate: {len(params)} sampling_params for {len(prompts)} prompts; pass one "
                                 f"SamplingParams for all or one per prompt")
        checked = [self._check_request(i, p, sp) for i, (p, sp) in enumerate(zip(prompts, params))]
        seqs: list[Sequence] = []
        for i, (ids, sp) in enumerate(zip(checked, params)):
            seed = sp.seed if sp.seed is not None else self._rng.getrandbits(63)
            request_id = self._next_request_id
            self._next_request_id += 1
            for j in range(sp.n):
                seqs.append(Sequence(request_id, i, j, ids, sp, sample_seed(seed, j)))
        for seq in seqs:
            self.scheduler.add(seq)
        self.refresh_weights()  # the weights may have changed since the last call (a training step)
        progress = _Progress(len(seqs), self.stats) if use_tqdm and self.model.tp_rank == 0 else None
        try:
            with torch.inference_mode():
                while not self.scheduler.is_finished():
                    finished = self.step()
                    if progress is not None:
                        progress.update(finished)
        except BaseException:
            self.scheduler.abort_all()  # leave the engine usable (every block free) for the next call
            raise
        finally:
            if progress is not None:
                progress.close()
        return [seq.output() for seq in seqs]

    def refresh_weights(self) -> None:
        """Re-read what the engine holds of the model's weights: the decode graphs' copies of their
        row exponents (``rlkernel.rollout.weight_exponents``).

        :meth:`generate` does this at its start, and each decode step does it when a weight's
        version counter moved. Call it yourself only when you drive :meth:`step` directly and
        change weights in place between steps through ``.data`` or raw copies (a checkpoint
        loader's ``param.data.copy_``, a collective writing into the storage), which leave the
        counters alone.
        """
        with torch.no_grad():
            self.model_runner.refresh_weights()

    # ------------------------------------------------------------------ the loop
    def step(self) -> int:
        """One scheduled forward; returns how many samples finished in it."""
        start = time.perf_counter()
        preemptions = self.scheduler.num_preemptions
        batch = self.scheduler.schedule()
        prefill = any(seq.is_prefill for seq, _ in batch)
        drawn, tokens, logprobs = self.model_runner.run(batch)
        for seq, n in batch:
            seq.num_computed_tokens += n
        finished = 0
        for k, (seq, token) in enumerate(zip(drawn, tokens)):
            seq.token_ids.append(token)
            seq.logprobs.append(logprobs[k:k + 1])
            reason = self._finish_reason(seq, token)
            if reason is not None:
                seq.finish_reason = reason
                self.scheduler.finish(seq)
                finished += 1
        seconds = time.perf_counter() - start
        fed = sum(n for _, n in batch)
        kind = "prefill" if prefill else "decode"
        self.stats[f"{kind}_tokens"] += fed
        self.stats[f"{kind}_seconds"] += seconds
        self.stats["generated_tokens"] += len(drawn)
        self.stats["steps"] += 1
        self.stats["preemptions"] += self.scheduler.num_preemptions - preemptions
        return finished

    def _finish_reason(self, seq: Sequence, token: int) -> Literal["stop", "length"] | None:
        p = seq.params
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            return "stop"
        if seq.num_completion_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None


class _Progress:
    """``use_tqdm``: one line on stderr, redrawn at most ten times a second (no tqdm dependency)."""

    def __init__(self, total: int, stats: dict[str, float]) -> None:
        self.total, self.done, self.stats = total, 0, stats
        self.base = dict(stats)
        self.last = 0.0

    def _rate(self, kind: str) -> float:
        seconds = self.stats[f"{kind}_seconds"] - self.base[f"{kind}_seconds"]
        return (self.stats[f"{kind}_tokens"] - self.base[f"{kind}_tokens"]) / seconds if seconds > 0 else math.nan

    def update(self, finished: int) -> None:
        self.done += finished
        now = time.perf_counter()
        if now - self.last >= 0.1 or self.done == self.total:
            self.last = now
            sys.stderr.write(f"\rrollout: {self.done}/{self.total} samples, prefill {self._rate('prefill'):.0f} "
                             f"tok/s, decode {self._rate('decode'):.0f} tok/s")
            sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()
