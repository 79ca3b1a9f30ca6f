"""Layer-by-layer: the rollout path's activations against the trainer path's, per layer and per op.

Rollout path: whole prompts prefilled into a paged KV cache (blocks from a shuffled free list;
or in chunks of ``prefill_chunk`` tokens through the paged mode), then token-by-token batched
decode, as the rollout engine runs the model. Trainer path: the same whole sequences in one
packed forward, in another order. Forward hooks on the model's submodules record every op's
output for every token; each op is compared on its bits at the tokens both paths computed (the
rollout never feeds a sequence's last token), in execution order, and the first layer and op
whose outputs differ is named: everything before it agrees, so the difference starts there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from rlkernel.model import AttentionMetadata, Qwen3ForCausalLM

__all__ = ["LayerReport", "OpDiff", "compare_layers", "op_keys", "rollout_activations", "trainer_activations"]

#: Ops of one decoder layer, in execution order: (op name, submodule path or a pseudo-op).
LAYER_OPS: tuple[tuple[str, str], ...] = (
    ("input_layernorm", "input_layernorm"),
    ("qkv_proj", "self_attn.qkv_proj"),
    ("q_norm", "self_attn.q_norm"),
    ("k_norm", "self_attn.k_norm"),
    ("rotary_q", "self_attn.rotary_emb"),
    ("rotary_k", "self_attn.rotary_emb"),
    ("attn", "self_attn.attn"),
    ("o_proj", "self_attn.o_proj"),
    ("attn_residual", "post_attention_layernorm"),  # its input: hidden + attention, the residual add
    ("post_attention_layernorm", "post_attention_layernorm"),
    ("gate_up_proj", "mlp.gate_up_proj"),
    ("act", "mlp.act_fn"),
    ("down_proj", "mlp.down_proj"),
    ("mlp_residual", ""),  # the decoder layer's output: hidden + MLP
)

Key = tuple[int | None, str]  # (layer index or None for embed/norm/logprobs, op)


def op_keys(num_layers: int) -> list[Key]:
    """Every compared (layer, op), in execution order."""
    keys: list[Key] = [(None, "embed")]
    keys += [(i, op) for i in range(num_layers) for op, _ in LAYER_OPS]
    return keys + [(None, "norm"), (None, "logprobs")]


class _Recorder:
    """Writes each hooked output into a [tokens, ...] buffer per op, at the rows of the current forward."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.rows = torch.zeros(0, dtype=torch.int64)
        self.store: dict[Key, torch.Tensor] = {}
        self.filled = torch.zeros(total, dtype=torch.bool)

    def put(self, key: Key, out: torch.Tensor) -> None:
        t = out.detach()
        buf = self.store.get(key)
        if buf is None:
            buf = self.store[key] = torch.zeros((self.total, *t.shape[1:]), dtype=t.dtype, device=t.device)
        buf[self.rows.to(buf.device)] = t

    def hook(self, key: Key) -> Callable[..., None]:
        def after(module: nn.Module, inputs: Any, output: Any) -> None:
            self.put(key, output)
        return after


@contextmanager
def _hooks(model: Qwen3ForCausalLM, rec: _Recorder) -> Iterator[None]:
    handles = [model.model.embed_tokens.register_forward_hook(rec.hook((None, "embed"))),
               model.model.norm.register_forward_hook(rec.hook((None, "norm")))]
    for i, layer in enumerate(model.model.layers):
        for op, path in LAYER_OPS:
            module = layer.get_submodule(path) if path else layer
            if op == "attn_residual":
                def before(m: nn.Module, inputs: Any, key: Key = (i, op)) -> None:
                    rec.put(key, inputs[0])
                handles.append(module.register_forward_pre_hook(before))
            elif op in ("rotary_q", "rotary_k"):
                def rope(m: nn.Module, inputs: Any, output: Any, key: Key = (i, op)) -> None:
                    rec.put(key, output[0 if key[1] == "rotary_q" else 1])
                handles.append(module.register_forward_hook(rope))
            else:
                handles.append(module.register_forward_hook(rec.hook((i, op))))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _offsets(sequences: list[list[int]]) -> list[int]:
    cu = [0]
    for s in sequences:
        cu.append(cu[-1] + len(s))
    return cu


def _logprobs(model: Qwen3ForCausalLM, rec: _Recorder, hidden: torch.Tensor, local: list[int],
              canon: list[int], targets: list[int], temperature: float) -> None:
    """Record the log-prob head's output of the rows that predict a next token."""
    if not local:
        return
    device = hidden.device
    lp = model.logprobs(hidden[torch.tensor(local, device=device)], torch.tensor(targets, device=device),
                        temperature)
    rec.rows = torch.tensor(canon, dtype=torch.int64)
    rec.put((None, "logprobs"), lp)


def rollout_activations(model: Qwen3ForCausalLM, sequences: list[list[int]], prompt_lens: list[int], *,
                        block_size: int = 16, prefill_chunk: int | None = None, seed: int = 0,
                        temperature: float = 1.0) -> _Recorder:
    """Every op's output for every token of ``sequences`` through prefill + decode over a paged KV cache.

    Each sequence's prompt is prefilled (all prompts in one batch, or ``prefill_chunk`` tokens
    per step through the paged mode), then its completion is fed one token per decode step in
    a batch of all unfinished sequences. A sequence's last token is never fed (as in a rollout).
    """
    device = model.lm_head.weight.device
    cu = _offsets(sequences)
    rec = _Recorder(cu[-1])
    need = [-(-len(s) // block_size) for s in sequences]
    free = list(range(sum(need) + 1))
    random.Random(seed).shuffle(free)
    tables = [[free.pop() for _ in range(n)] for n in need]
    cache = model.allocate_kv_cache(sum(need) + 1, block_size)
    pos = [0] * len(sequences)
    with torch.no_grad(), _hooks(model, rec):
        while True:
            running = [b for b, s in enumerate(sequences) if pos[b] < len(s) - 1]
            if not running:
                break
            q_lens = []
            for b in running:
                p = prompt_lens[b]
                q_lens.append(min(prefill_chunk or p, p - pos[b]) if pos[b] < p else 1)
            width = max(need[b] for b in running)
            table = torch.tensor([tables[b] + [-1] * (width - len(tables[b])) for b in running], dtype=torch.int32,
                                 device=device)
            if all(pos[b] == 0 and q == prompt_lens[b] for b, q in zip(running, q_lens)):
                meta = AttentionMetadata.prefill(q_lens, table, block_size, device)
            else:
                meta = AttentionMetadata.paged(q_lens, [pos[b] + q for b, q in zip(running, q_lens)], table,
                                               block_size, device)
            ids = [t for b, q in zip(running, q_lens) for t in sequences[b][pos[b]:pos[b] + q]]
            canon = [cu[b] + p for b, q in zip(running, q_lens) for p in range(pos[b], pos[b] + q)]
            rec.rows = torch.tensor(canon, dtype=torch.int64)
            rec.filled[rec.rows] = True
            hidden = model(torch.tensor(ids, dtype=torch.int64, device=device), meta.positions(), meta, cache)
            local, canon_lp, targets, r = [], [], [], 0
            for b, q in zip(running, q_lens):
                for p in range(pos[b], pos[b] + q):
                    if prompt_lens[b] - 1 <= p < len(sequences[b]) - 1:  # rows predicting a completion token
                        local.append(r)
                        canon_lp.append(cu[b] + p)
                        targets.append(sequences[b][p + 1])
                    r += 1
            _logprobs(model, rec, hidden, local, canon_lp, targets, temperature)
            for b, q in zip(running, q_lens):
                pos[b] += q
    return rec


def trainer_activations(model: Qwen3ForCausalLM, sequences: list[list[int]], prompt_lens: list[int], *,
                        order: list[int] | None = None, temperature: float = 1.0) -> _Recorder:
    """Every op's output for every token of ``sequences`` in one packed forward (the trainer's), in ``order``."""
    device = model.lm_head.weight.device
    cu = _offsets(sequences)
    rec = _Recorder(cu[-1])
    order = list(range(len(sequences)))[::-1] if order is None else order
    ids = [t for b in order for t in sequences[b]]
    rec.rows = torch.tensor([cu[b] + p for b in order for p in range(len(sequences[b]))], dtype=torch.int64)
    rec.filled[rec.rows] = True
    meta = AttentionMetadata.packed([len(sequences[b]) for b in order], device)
    with torch.no_grad(), _hooks(model, rec):
        hidden = model(torch.tensor(ids, dtype=torch.int64, device=device), meta.positions(), meta)
        local, canon, targets, r = [], [], [], 0
        for b in order:
            for p in range(len(sequences[b])):
                if prompt_lens[b] - 1 <= p < len(sequences[b]) - 1:
                    local.append(r)
                    canon.append(cu[b] + p)
                    targets.append(sequences[b][p + 1])
                r += 1
        _logprobs(model, rec, hidden, local, canon, targets, temperature)
    return rec


@dataclass
class OpDiff:
    """One (layer, op) compared on its bits over the tokens both paths computed.

    Attributes
    ----------
    layer : int or None
        Decoder layer (None: the embedding, the final norm, the log-prob head).
    op : str
    tokens : int
        Tokens compared.
    elements : int
        Values compared (tokens x the op's output width).
    differing_elements, differing_tokens : int
    first_token : (sequence, position) or None
        The first token (in sequence order) with a differing value.
    max_abs_diff : float
        Largest ``|rollout - trainer|`` in float64 (0.0 when equal; NaN where one side is NaN).
    """

    layer: int | None
    op: str
    tokens: int
    elements: int
    differing_elements: int
    differing_tokens: int
    first_token: tuple[int, int] | None
    max_abs_diff: float

    @property
    def name(self) -> str:
        return self.op if self.layer is None else f"layer {self.layer} {self.op}"


@dataclass
class LayerReport:
    """The result of :func:`compare_layers`: every op, and the first one that differs (None: all equal)."""

    sequences: int
    tokens: int
    ops: list[OpDiff] = field(default_factory=list)
    first_difference: OpDiff | None = None

    @property
    def ok(self) -> bool:
        return self.first_difference is None

    def as_dict(self) -> dict[str, Any]:
        return {"sequences": self.sequences, "tokens": self.tokens, "ok": self.ok,
                "first_difference": None if self.first_difference is None else asdict(self.first_difference),
                "ops": [asdict(o) for o in self.ops]}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _diff(key: Key, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor, cu: list[int]) -> OpDiff:
    x, y = a[rows.to(a.device)].cpu(), b[rows.to(b.device)].cpu()
    if x.dtype != y.dtype or x.shape != y.shape:
        raise RuntimeError(f"compare_layers: {key}: rollout {x.dtype}{list(x.shape)} vs trainer "
                           f"{y.dtype}{list(y.shape)}; the two paths computed different shapes")
    neq = (_bits(x) != _bits(y)).reshape(x.shape[0], -1)
    per_token = neq.any(dim=1)
    first = None
    if bool(per_token.any()):
        row = int(rows[int(per_token.nonzero()[0, 0])])
        seq = max(i for i in range(len(cu) - 1) if cu[i] <= row)
        first = (seq, row - cu[seq])
    max_abs = float((x.double() - y.double()).abs().max()) if x.numel() and first else 0.0
    return OpDiff(key[0], key[1], int(x.shape[0]), int(x.numel()), int(neq.sum()), int(per_token.sum()), first,
                  max_abs)


def compare_layers(model: Qwen3ForCausalLM, sequences: list[list[int]], prompt_lens: list[int], *,
                   trainer_model: Qwen3ForCausalLM | None = None, block_size: int = 16,
                   prefill_chunk: int | None = None, seed: int = 0, temperature: float = 1.0) -> LayerReport:
    """Compare the rollout path's and the trainer path's activations of ``sequences``, per layer and op.

    Parameters
    ----------
    model : Qwen3ForCausalLM
        Runs the rollout path (and the trainer path unless ``trainer_model`` is given).
    sequences : list of list of int
        Whole sequences (prompt + completion).
    prompt_lens : list of int
        Each sequence's prompt length (>= 1): prefilled; the rest is decoded one token at a time.
    trainer_model : Qwen3ForCausalLM, optional
        A second model for the trainer path (a deliberately perturbed copy, in tests).
    block_size : int
        KV cache block size of the rollout path.
    prefill_chunk : int, optional
        Prefill prompts in chunks of this many tokens (paged mode) instead of whole.
    seed : int
        Shuffles the KV block free list and the trainer's packing order.
    temperature : float
        Of the compared log-prob head.

    Returns
    -------
    LayerReport
        Every op's :class:`OpDiff` in execution order; ``first_difference`` is the first that
        differs anywhere, or None when every op has the same bits on both paths.
    """
    if len(sequences) != len(prompt_lens) or any(not 1 <= p <= len(s) for s, p in zip(sequences, prompt_lens)):
        raise ValueError(f"compare_layers: {len(sequences)} sequences and prompt lengths {prompt_lens}; expected "
                         f"one prompt length per sequence, each between 1 and its sequence's length")
    roll = rollout_activations(model, sequences, prompt_lens, block_size=block_size, prefill_chunk=prefill_chunk,
                               seed=seed, temperature=temperature)
    order = list(range(len(sequences)))
    random.Random(seed + 1).shuffle(order)
    train = trainer_activations(trainer_model or model, sequences, prompt_lens, order=order, temperature=temperature)
    cu = _offsets(sequences)
    both = roll.filled & train.filled
    report = LayerReport(len(sequences), int(both.sum()))
    for key in op_keys(model.config.num_hidden_layers):
        if key not in roll.store or key not in train.store:
            raise RuntimeError(f"compare_layers: no output recorded for {key} on the "
                               f"{'rollout' if key not in roll.store else 'trainer'} path; the model's modules "
                               f"are not the Qwen3 ones this check hooks")
        if key == (None, "logprobs"):
            rows = [cu[b] + p for b, s in enumerate(sequences) for p in range(prompt_lens[b] - 1, len(s) - 1)]
            idx = torch.tensor(rows, dtype=torch.int64)
        else:
            idx = both.nonzero()[:, 0]
        d = _diff(key, roll.store[key], train.store[key], idx, cu)
        report.ops.append(d)
        if report.first_difference is None and d.differing_elements:
            report.first_difference = d
    return report
