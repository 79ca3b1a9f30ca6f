"""Shared helpers of the model tests: tiny Qwen3 checkpoints and a small paged-KV driver.

- :func:`random_weights` / :func:`write_checkpoint`: Hugging Face-named random tensors written
  with ``safetensors`` directly (not through rlkernel's saver), in one file or several with an
  index, exactly as transformers lays them out.
- :func:`rollout`: plays a continuous-batching engine (batched or chunked prefill, token-by-token
  decode, requests joining when others leave, blocks from a shuffled free list) and records
  each token's log-prob the way a rollout does; new tokens are sampled with the ``sample``
  op when the sequence runs past its given tokens.
- :func:`assert_same_bits`: byte equality with the first differing index in hex.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from rlkernel.model import AttentionMetadata, Qwen3ForCausalLM
from rlkernel.ops import sample

#: 2 layers, hidden 64, 4 query heads / 2 KV heads of 16, vocabulary 256.
TINY = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "vocab_size": 256, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    "attention_bias": False, "torch_dtype": "bfloat16",
}


def tiny_config(**overrides: object) -> dict:
    return {**TINY, **overrides}


def hf_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a Hugging Face Qwen3 checkpoint with its shape, in transformers' order."""
    h, i, d, v = config["hidden_size"], config["intermediate_size"], config["head_dim"], config["vocab_size"]
    hq, hkv = config["num_attention_heads"], config["num_key_value_heads"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (hq * d, h),
            p + "self_attn.k_proj.weight": (hkv * d, h),
            p + "self_attn.v_proj.weight": (hkv * d, h),
            p + "self_attn.o_proj.weight": (h, hq * d),
            p + "self_attn.q_norm.weight": (d,),
            p + "self_attn.k_norm.weight": (d,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        })
        if config.get("attention_bias"):
            shapes.update({p + f"self_attn.{x}_proj.bias": s for x, s in
                           (("q", (hq * d,)), ("k", (hkv * d,)), ("v", (hkv * d,)), ("o", (h,)))})
    shapes["model.norm.weight"] = (h,)
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    return shapes


def random_weights(config: dict, seed: int, std: float = 0.2,
                   dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Random tensors for every checkpoint name: N(0, std) weights, norm gains 1 + N(0, 0.2)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in hf_shapes(config).items():
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        out[name] = (1 + 0.2 * t if name.endswith("norm.weight") else std * t).to(dtype)
    return out


def write_checkpoint(path: Path, config: dict, tensors: dict[str, torch.Tensor], files: int = 1) -> Path:
    """config.json + ``model.safetensors`` (files = 1) or ``files`` shards with an index, like transformers."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    names = list(tensors)
    if files == 1:
        save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
        return path
    per = -(-len(names) // files)
    weight_map = {}
    for k in range(files):
        file = f"model-{k + 1:05d}-of-{files:05d}.safetensors"
        part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
        save_file(part, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return path


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_same_bits(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, \
        f"{what}: expected {expected.dtype}{list(expected.shape)}, got {actual.dtype}{list(actual.shape)}"
    e, a = bits(expected).reshape(-1), bits(actual).reshape(-1)
    diff = (e != a).nonzero()
    if diff.numel():
        i = int(diff[0])
        raise AssertionError(f"{what}: {diff.numel()} of {e.numel()} elements differ; first at flat index {i}: "
                             f"expected {expected.reshape(-1)[i].item()!r} ({int(e[i]) & 0xFFFFFFFF:#x}), "
                             f"got {actual.reshape(-1)[i].item()!r} ({int(a[i]) & 0xFFFFFFFF:#x})")


@dataclass
class _Running:
    seq: int
    pos: int = 0  # tokens already in the cache
    blocks: list[int] = field(default_factory=list)


def rollout(model: Qwen3ForCausalLM, tokens: list[list[int]], prompt_lens: list[int], total_lens: list[int], *,
            max_batch: int, chunk: int | None, block_size: int, num_blocks: int, seed: int = 0,
            order: list[int] | None = None, packed_prefill: bool = True,
            temperature: float = 1.0) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Generate/teacher-force sequences through the paged KV cache, as a rollout engine would.

    Sequence b starts with ``tokens[b]`` (at least its prompt) and runs to ``total_lens[b]``
    tokens; a token past the given ones is drawn with ``rlkernel.ops.sample`` (seed b, its
    position). At most ``max_batch`` sequences run at once, taken from ``order``; a finished
    sequence frees its blocks and the next waiting one joins in the next step. A prompt is fed
    in chunks of ``chunk`` tokens (None = whole), afterwards one token per step. A step made
    only of whole fresh prompts uses packed attention (``AttentionMetadata.prefill``) if
    ``packed_prefill``; every other step is paged.

    Returns
    -------
    (logprobs, tokens): per sequence, the fp32 log-probs of its tokens 1 .. n-1 (from the row
    before each, as recorded while generating), and its final token ids.
    """
    toks = [list(t) for t in tokens]
    n_seq = len(toks)
    logps = [torch.zeros(total_lens[b] - 1, dtype=torch.float32) for b in range(n_seq)]
    cache = model.allocate_kv_cache(num_blocks, block_size)
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    waiting = list(order if order is not None else range(n_seq))
    running: list[_Running] = []
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append(_Running(waiting.pop(0)))
        q_lens, ids = [], []
        for st in running:
            b = st.seq
            q = min(chunk or prompt_lens[b], prompt_lens[b] - st.pos) if st.pos < prompt_lens[b] else 1
            q_lens.append(q)
            ids += toks[b][st.pos:st.pos + q]
            while len(st.blocks) * block_size < st.pos + q:
                st.blocks.append(free.pop())
        ctx = [st.pos + q for st, q in zip(running, q_lens)]
        width = max(len(st.blocks) for st in running)
        table = torch.tensor([st.blocks + [-1] * (width - len(st.blocks)) for st in running], dtype=torch.int32)
        if packed_prefill and all(st.pos == 0 and q == prompt_lens[st.seq] for st, q in zip(running, q_lens)):
            meta = AttentionMetadata.prefill(q_lens, table, block_size)
        else:
            meta = AttentionMetadata.paged(q_lens, ctx, table, block_size)
        hidden = model(torch.tensor(ids, dtype=torch.int64), meta.positions(), meta, cache)
        # rows whose next token is to be drawn: the last row of a sequence that has run out of tokens
        rows, row_seq, row_pos, r = [], [], [], 0
        for st, q in zip(running, q_lens):
            for p in range(st.pos, st.pos + q):
                if p + 1 < total_lens[st.seq]:
                    rows.append(r)
                    row_seq.append(st.seq)
                    row_pos.append(p)
                r += 1
        draw = [k for k, (b, p) in enumerate(zip(row_seq, row_pos)) if p + 1 == len(toks[b])]
        if draw:
            logits = model.compute_logits(hidden[[rows[k] for k in draw]])
            new = sample(logits, temperature, 0, 1.0, torch.tensor([row_seq[k] for k in draw]),
                         torch.tensor([row_pos[k] + 1 for k in draw]))
            for k, t in zip(draw, new.tolist()):
                toks[row_seq[k]].append(int(t))
        if rows:
            targets = torch.tensor([toks[b][p + 1] for b, p in zip(row_seq, row_pos)], dtype=torch.int64)
            lp = model.logprobs(hidden[rows], targets, temperature)
            for k, (b, p) in enumerate(zip(row_seq, row_pos)):
                logps[b][p] = lp[k]
        for st, q in zip(running, q_lens):
            st.pos += q
        for st in [s for s in running if s.pos >= total_lens[s.seq] - 1]:
            free += st.blocks
            running.remove(st)
    return logps, toks


@contextmanager
def forward_only_one_thread() -> Iterator[None]:
    """``torch.no_grad()`` (the ops have no backward contract yet) with one intra-op thread: the tiny
    model's ops are too small to gain from more and lose much to thread wake-ups on a busy machine.
    The bits cannot depend on it (every reduction is exact)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)
