"""The ordinary PyTorch path, side by side: transformers' ``Qwen3ForCausalLM`` on the same weights.

Rollout: ``generate`` with its KV cache, prompts batched (left-padded), sampling, and the raw
logits of every step (``output_logits``) turned into the sampled tokens' log-probs of the
temperature-scaled distribution (``log_softmax(logits / T)`` in float32). Trainer: whole
sequences (prompt + completion) in a shuffled order, right-padded micro-batches, one forward
each, the same log-probs taken from the full logits. Nothing here is bitwise by design: cuBLAS
or CPU BLAS pick other reductions for other shapes (a decode step's GEMM is not a prefill's),
SDPA picks kernels by shape, padding changes the batch: the mismatch count and the ratio
distribution show how far apart an ordinary rollout and trainer are.

transformers is an optional dependency (the ``test`` extra).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from rlkernel.model import Qwen3ForCausalLM, state_dict_hf
from rlkernel.validate.replay import compare_logprobs, synchronize

__all__ = ["BaselineResult", "hf_model", "run_baseline"]

INSTALL_HINT = ("--baseline transformers needs transformers: pip install 'rlkernel[test]' (or pip install "
                "transformers); --baseline none skips the side-by-side")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(f"validate: {INSTALL_HINT} ({exc})") from exc
    return transformers


def hf_model(model: Qwen3ForCausalLM, dtype: torch.dtype, attn_implementation: str = "sdpa") -> Any:
    """transformers' ``Qwen3ForCausalLM`` with ``model``'s weights, cast to ``dtype`` (exact from bf16 to fp32).

    Built from the configuration (no download, no checkpoint on disk) on ``model``'s device.

    Raises
    ------
    ImportError
        transformers is not installed (the message says how to install it).
    """
    tf = _transformers()
    c = model.config
    config = tf.Qwen3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        rope_theta=c.rope_theta, max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.attention_bias,
        attn_implementation=attn_implementation, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    device = model.lm_head.weight.device
    with torch.random.fork_rng(devices=[]), torch.device(device):  # initialised where it runs, then overwritten
        hf = tf.Qwen3ForCausalLM(config).to(dtype).eval()
    weights = {name: t.to(dtype) for name, t in state_dict_hf(model)}
    result = hf.load_state_dict(weights, strict=False)
    missing = [k for k in result.missing_keys if not (c.tie_word_embeddings and k == "lm_head.weight")]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"validate: transformers' Qwen3 does not take these weights: missing {missing[:4]}, "
                           f"unexpected {result.unexpected_keys[:4]}")
    if c.tie_word_embeddings:
        hf.tie_weights()
    return hf


@dataclass
class BaselineResult:
    """The transformers path's rollout and trainer forward, compared like ours.

    Attributes
    ----------
    dtype, attn_implementation : str
    sequences, tokens : int
        Completions generated and their tokens.
    rollout_seconds : float
        Wall time of the ``generate`` calls.
    tokens_per_s : float or None
        Completion tokens per second of ``generate``.
    replays : list of dict
        Per trainer micro-batch size: ``micro_batch_size``, ``mismatches`` (bitwise), ``ratio``
        (``|exp(trainer - rollout) - 1|``: max, p50, p99, mean), ``seconds`` of the forward,
        ``first_mismatches``.
    """

    dtype: str
    attn_implementation: str
    sequences: int
    tokens: int
    rollout_seconds: float
    tokens_per_s: float | None
    replays: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _chunks(params: list[dict[str, Any]], per_call: int) -> list[list[int]]:
    """Consecutive prompt indices, at most ``per_call`` per chunk, one set of sampling parameters per chunk."""
    chunks: list[list[int]] = []
    for i, p in enumerate(params):
        if not chunks or len(chunks[-1]) >= per_call or params[chunks[-1][0]] != p:
            chunks.append([])
        chunks[-1].append(i)
    return chunks


def _generate(hf: Any, prompts: list[list[int]], p: dict[str, Any], seed: int,
              eos: list[int]) -> list[tuple[list[int], torch.Tensor]]:
    """One batched ``generate`` call: per prompt, its ``n`` (completion, log-probs) in order.

    Generation stops at ``stop_token_ids`` and, unless ``ignore_eos``, at the model's ``eos`` ids,
    as rlkernel's engine does.
    """
    tf = _transformers()
    device = hf.device
    width = max(len(x) for x in prompts)
    ids = torch.tensor([[0] * (width - len(x)) + x for x in prompts], dtype=torch.int64, device=device)
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in prompts], dtype=torch.int64, device=device)
    temperature = float(p["temperature"])
    stop = list(dict.fromkeys([*(p.get("stop_token_ids") or []), *([] if p.get("ignore_eos") else eos)]))
    greedy = temperature == 0
    gen = tf.GenerationConfig(
        max_new_tokens=int(p["max_tokens"]), min_new_tokens=0, do_sample=not greedy,
        temperature=None if greedy else temperature, top_k=None if greedy else int(p.get("top_k") or 0),
        top_p=None if greedy else float(p.get("top_p", 1.0)), num_return_sequences=int(p.get("n", 1)),
        eos_token_id=stop or None, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        use_cache=True)
    torch.manual_seed(seed)  # transformers samples from the global generator
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
    new = out.sequences[:, width:].cpu()
    t = temperature if temperature > 0 else 1.0
    steps = [torch.log_softmax(step.float() / t, dim=-1).gather(-1, new[:, k, None].to(step.device))[:, 0]
             for k, step in enumerate(out.logits)]  # one [rows, V] step at a time: never [rows, steps, V] twice
    logp = torch.stack(steps, dim=1).cpu()
    result = []
    for r in range(new.shape[0]):
        toks = new[r].tolist()
        end = len(toks)
        for k, tok in enumerate(toks):
            if tok in stop:
                end = k + 1
                break
        result.append((toks[:end], logp[r, :end].clone()))
    return result


def _train_forward(hf: Any, sequences: list[list[int]], starts: list[int], temperatures: list[float],
                   micro_batch_size: int, order: list[int]) -> list[torch.Tensor]:
    """Log-probs of tokens ``starts[j]:`` of each sequence from right-padded full-sequence forwards."""
    device = hf.device
    out: list[torch.Tensor] = [torch.zeros(0)] * len(sequences)
    for k in range(0, len(order), micro_batch_size):
        batch = order[k:k + micro_batch_size]
        width = max(len(sequences[j]) for j in batch)
        ids = torch.tensor([sequences[j] + [0] * (width - len(sequences[j])) for j in batch], device=device)
        mask = torch.tensor([[1] * len(sequences[j]) + [0] * (width - len(sequences[j])) for j in batch],
                            device=device)
        with torch.no_grad():
            logits = hf(input_ids=ids, attention_mask=mask).logits
        for r, j in enumerate(batch):
            s, n = starts[j], len(sequences[j])
            if s >= n:
                out[j] = torch.zeros(0, dtype=torch.float32)
                continue
            t = temperatures[j] if temperatures[j] > 0 else 1.0
            rows = torch.log_softmax(logits[r, s - 1:n - 1].float() / t, dim=-1)
            out[j] = rows.gather(-1, ids[r, s:n, None])[:, 0].cpu()
    return out


def run_baseline(model: Qwen3ForCausalLM, prompts: list[list[int]], params: list[dict[str, Any]], *,
                 dtype: torch.dtype, engine_batch: int, micro_batch_sizes: list[int], seed: int = 0,
                 attn_implementation: str = "sdpa", warmup: bool = False) -> BaselineResult:
    """Generate with transformers, then replay through its full-sequence forward in each micro-batch size.

    Parameters
    ----------
    model : Qwen3ForCausalLM
        Its weights (and device) are used.
    prompts : list of list of int
    params : list of dict
        Sampling parameters per prompt (:func:`~rlkernel.validate.record.sampling_dict` fields).
    dtype : torch.dtype
        The transformers model's dtype (float32, bfloat16, float16).
    engine_batch : int
        Sequences per ``generate`` call (prompts per call: ``max(1, engine_batch // n)``).
    micro_batch_sizes : list of int
        Trainer micro-batch sizes; each packing order is shuffled with ``seed + index``.
    seed : int
        ``torch.manual_seed(seed + call)`` before each ``generate`` call.
    attn_implementation : str
        ``"sdpa"`` (default) or ``"eager"``.
    warmup : bool
        One small untimed ``generate`` and forward first (CUDA).
    """
    hf = hf_model(model, dtype, attn_implementation)
    device = hf.device
    eos = model.config.extra.get("eos_token_id")
    eos_ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    n = max(int(p.get("n", 1)) for p in params) if params else 1
    chunks = _chunks(params, max(1, engine_batch // n))
    if warmup and prompts:
        short = {**params[0], "max_tokens": min(4, int(params[0]["max_tokens"])), "n": 1}
        _generate(hf, prompts[:1], short, seed, eos_ids)
    completions: list[tuple[int, list[int], torch.Tensor]] = []
    synchronize(device)
    start = time.perf_counter()
    for call, chunk in enumerate(chunks):
        outs = _generate(hf, [prompts[i] for i in chunk], params[chunk[0]], seed + call, eos_ids)
        per = len(outs) // len(chunk)
        completions += [(chunk[r // per], toks, lp) for r, (toks, lp) in enumerate(outs)]
    synchronize(device)
    rollout_seconds = time.perf_counter() - start
    tokens = sum(len(c[1]) for c in completions)
    result = BaselineResult(str(dtype).removeprefix("torch."), attn_implementation, len(completions), tokens,
                            rollout_seconds, tokens / rollout_seconds if rollout_seconds > 0 else None)
    sequences = [prompts[i] + toks for i, toks, _ in completions]
    starts = [len(prompts[i]) for i, _, _ in completions]
    temps = [float(params[i]["temperature"]) for i, _, _ in completions]
    if warmup and sequences:
        _train_forward(hf, sequences[:1], starts[:1], temps[:1], 1, [0])
    for k, mb in enumerate(micro_batch_sizes):
        order = list(range(len(sequences)))
        random.Random(seed + k).shuffle(order)
        synchronize(device)
        start = time.perf_counter()
        trainer = _train_forward(hf, sequences, starts, temps, mb, order)
        synchronize(device)
        seconds = time.perf_counter() - start
        stats, first = compare_logprobs([c[2] for c in completions], trainer, [c[1] for c in completions])
        result.replays.append({"micro_batch_size": mb, "mismatches": stats["mismatches"], "tokens": stats["tokens"],
                               "ratio": {k2: stats[k2] for k2 in ("max", "p50", "p99", "mean")},
                               "seconds": seconds, "first_mismatches": [m.describe() for m in first[:3]]})
    del hf
    return result
