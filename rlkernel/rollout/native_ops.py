"""torch's own ops behind ``rlkernel.ops``' signatures: the rollout engine's performance baseline. NOT bitwise.

``LLM(model, ops="native")`` runs the same model code, scheduler, block manager, KV cache layout
and CUDA graphs as the exact engine with these functions in place of the exact ops, so that an
end-to-end ratio (``tools/e2e_bench.py``) compares the ops and nothing else. Each is what a plain
PyTorch / Hugging Face stack computes:

=================  ===================================================================================
op                 native computation
=================  ===================================================================================
embedding          ``F.embedding``
linear             ``F.linear`` in the weights' dtype (cuBLAS bf16 on CUDA), cast to ``out_dtype``
rms_norm           transformers' ``Qwen3RMSNorm``: fp32 ``x * rsqrt(mean(x**2) + eps)``, cast, ``* weight``
rope               transformers' default RoPE: fp32 ``cos``/``sin`` of ``p * theta**(-2i/D)`` (a cached
                   table), cast to x's dtype, ``x * cos + rotate_half(x) * sin``
silu_mul           ``F.silu(gate) * up``
attention          packed causal GQA: one padded batch of ``F.scaled_dot_product_attention``
attention_paged    each query row gathers its sequence's K/V blocks (the block table, padded to its
                   width) and runs SDPA with a mask from the device context lengths: graph-capturable;
                   rows of a multi-token chunk (eager steps only) run per sequence
token_logprobs     ``log_softmax(F.linear(h, W).float() / T)[target]``
log_softmax        ``torch.log_softmax`` (the rollout's log-probs of the sampled tokens, from the logits)
sample             torch's softmax sampling: ``/ T``, top-k / top-p by sort (vLLM's torch sampler),
                   exponential race (``argmax(p / Exp(1))``, a multinomial draw); greedy = ``argmax``
=================  ===================================================================================

Grouped-query attention folds the query heads of a KV head into the query axis, so SDPA sees
``Hkv`` heads of ``G * Lq`` rows and never needs its ``enable_gqa`` backend support.

Not bitwise by design: cuBLAS and SDPA choose kernels (and summation orders) by shape, so a
token's bits depend on the batch; and ``sample`` ignores the per-sample seeds and positions
(it draws from torch's default generator of the device). A model built with :data:`NATIVE`
is refused by the trainer. torch 2.13 also has ``torch.nn.attention.varlen.varlen_attn`` (with
``enable_gqa``, ``window_size`` and a paged ``block_table``); it is not used here because the
torch on the measuring host may predate it and the padded SDPA costs little at rollout shapes.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from rlkernel.nn.opset import OpSet

__all__ = ["NATIVE", "attention", "attention_paged", "embedding", "linear", "log_softmax", "rms_norm", "rope",
           "sample", "silu_mul", "token_logprobs"]

#: RoPE tables: (head_dim, theta, device) -> (cos, sin), float32 [rows, head_dim].
_rope_cache: dict[tuple[int, float, str], tuple[torch.Tensor, torch.Tensor]] = {}
_rope_lock = threading.Lock()
#: Smallest table built (rows); tables grow by doubling.
_MIN_ROWS = 4096


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``weight[ids]`` (``F.embedding``): ``[*]`` int -> ``[*, H]``, the weight's dtype."""
    return F.embedding(ids, weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, *, weight_exponents: torch.Tensor | None = None,
           weight_digits: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in the operands' dtype (cuBLAS), then cast to ``out_dtype``
    (``weight_exponents`` and ``weight_digits``, which the exact op can be given, are not used:
    cuBLAS has neither)."""
    y = F.linear(x, weight, bias)
    return y if out_dtype is None or out_dtype == y.dtype else y.to(out_dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """transformers' ``Qwen3RMSNorm``: ``weight * RN_dtype(x32 * rsqrt(mean(x32**2) + eps))`` over the last axis."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` in the inputs' dtype."""
    return F.silu(gate) * up


def _rope_tables(head_dim: int, theta: float, device: torch.device, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' default RoPE ``cos``/``sin`` (float32 ``[rows >= rows, head_dim]``), cached per device."""
    key = (head_dim, float(theta), str(device))
    with _rope_lock:
        have = _rope_cache.get(key)
        if have is not None and have[0].shape[0] >= rows:
            return have
        n = max(rows, 2 * (0 if have is None else have[0].shape[0]), _MIN_ROWS)
        with torch.inference_mode(False):
            exponent = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
            inv_freq = 1.0 / (float(theta) ** exponent)
            freqs = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            tables = (emb.cos(), emb.sin())
        _rope_cache[key] = tables
        return tables


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Rotate-half RoPE as transformers computes it: ``x * cos + rotate_half(x) * sin`` in x's dtype.

    ``x`` ``[T, heads, D]`` or ``[T, D]``; ``positions`` int ``[T]``. Eagerly the cached table is
    grown to the largest position (a host read, as the exact op does); while a CUDA graph is
    captured it is used as it is (the engine grows it first with a call at its longest position).
    """
    rows = 1
    if not _capturing(x.device) and positions.numel():
        rows = int(positions.max()) + 1
    cos, sin = _rope_tables(x.shape[-1], theta, x.device, rows)
    pos = positions.to(torch.int64)
    c, s = cos[pos].to(x.dtype), sin[pos].to(x.dtype)
    if x.dim() == 3:
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * c + rotated * s


def _sdpa_grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  scale: float | None) -> torch.Tensor:
    """Batched SDPA: q ``[B, Lq, Hq, D]``, k/v ``[B, Lk, Hkv, D]``, bool mask ``[B, Lq, Lk]`` -> ``[B, Lq, Hq, D]``.

    Query head ``h`` reads KV head ``h // G`` (``G = Hq / Hkv``): the G query heads of a KV head
    become ``G * Lq`` query rows of that head (row ``g * Lq + i`` takes mask row ``i``).
    """
    b, lq, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qg = q.reshape(b, lq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * lq, d)
    m = mask.unsqueeze(1).repeat(1, 1, g, 1)
    o = F.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=m, scale=scale)
    return o.reshape(b, hkv, g, lq, d).permute(0, 3, 1, 2, 4).reshape(b, lq, hq, d)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, scale: float | None = None, causal: bool = True) -> torch.Tensor:
    """Packed (varlen) attention of whole sequences: one padded SDPA batch.

    q ``[T, Hq, D]``, k/v ``[T, Hkv, D]`` packed by ``cu_seqlens_q`` (read on the host; the keys'
    offsets must be the same: self-attention of whole sequences, what the model asks for).
    """
    cu = [int(c) for c in cu_seqlens_q.tolist()]
    if cu_seqlens_k is not cu_seqlens_q and [int(c) for c in cu_seqlens_k.tolist()] != cu:
        raise ValueError("native attention: cu_seqlens_k differs from cu_seqlens_q; the baseline implements "
                         "self-attention of whole packed sequences only")
    lens = [b - a for a, b in zip(cu, cu[1:])]
    if not lens or max(lens) == 0:
        return q.new_empty(q.shape)
    width = max(lens)
    device = q.device
    i = torch.arange(width, device=device)
    start = cu_seqlens_q[:-1].to(device=device, dtype=torch.int64)
    valid = i.unsqueeze(0) < torch.tensor(lens, device=device).unsqueeze(1)  # [B, L]
    rows = torch.where(valid, start.unsqueeze(1) + i, torch.zeros((), dtype=torch.int64, device=device))
    mask = valid.unsqueeze(1)  # [B, 1, L]: real keys only
    if causal:
        mask = mask & (i.unsqueeze(0) <= i.unsqueeze(1)).unsqueeze(0)  # [B, L, L]
    else:
        mask = mask.expand(-1, width, -1)
    out = _sdpa_grouped(q[rows], k[rows], v[rows], mask, scale)
    return out[valid]


def attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    context_lens: torch.Tensor, cu_seqlens_q: torch.Tensor, scale: float | None = None,
                    causal: bool = True) -> torch.Tensor:
    """Attention of new tokens over their sequences' paged K/V, gathered through the block table.

    q ``[T, Hq, D]``; caches ``[num_blocks, block_size, Hkv, D]``; ``block_table`` ``[B, W]``;
    ``context_lens`` ``[B]``; ``cu_seqlens_q`` ``[B + 1]``. When ``T == B`` (a decode step: what
    the engine captures) every row gathers its sequence's whole table row (``W * block_size`` key
    slots, entries past the context masked by the device context lengths): no host read, so it
    can be captured. Otherwise (prefill chunks, eager) each sequence runs on its own with its
    lengths read on the host. A row at position ``p`` sees keys ``0 .. p`` (causal).
    """
    t, b = q.shape[0], block_table.shape[0]
    bs, hkv, d = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if t == b:
        row = torch.arange(t, device=q.device, dtype=cu_seqlens_q.dtype)
        seq = torch.searchsorted(cu_seqlens_q[1:].contiguous(), row, right=True)
        ctx = context_lens.to(torch.int64)[seq]
        pos = ctx - (cu_seqlens_q[1:].to(torch.int64)[seq] - row.to(torch.int64))
        table = block_table.to(torch.int64)[seq].clamp(min=0)  # unused entries (-1) read block 0, masked
        keys = k_cache[table].reshape(t, -1, hkv, d)
        values = v_cache[table].reshape(t, -1, hkv, d)
        j = torch.arange(keys.shape[1], device=q.device)
        mask = j.unsqueeze(0) < ctx.unsqueeze(1)
        if causal:
            mask = mask & (j.unsqueeze(0) <= pos.unsqueeze(1))
        return _sdpa_grouped(q.unsqueeze(1), keys, values, mask.unsqueeze(1), scale).squeeze(1)
    if _capturing(q.device):
        raise RuntimeError("native attention_paged: a captured step must feed one token per sequence (T == B); "
                           "multi-token chunks run eagerly")
    cu = [int(c) for c in cu_seqlens_q.tolist()]
    lens = [int(c) for c in context_lens.tolist()]
    out = q.new_empty(q.shape)
    for s, (a, e, c) in enumerate(zip(cu, cu[1:], lens)):
        if e == a:
            continue
        blocks = block_table[s, :-(-c // bs)].to(torch.int64)
        keys = k_cache[blocks].reshape(-1, hkv, d)[:c]
        values = v_cache[blocks].reshape(-1, hkv, d)[:c]
        j = torch.arange(c, device=q.device)
        mask = torch.ones(e - a, c, dtype=torch.bool, device=q.device)
        if causal:
            mask = j.unsqueeze(0) <= torch.arange(c - (e - a), c, device=q.device).unsqueeze(1)
        out[a:e] = _sdpa_grouped(q[a:e].unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), mask.unsqueeze(0),
                                 scale).squeeze(0)
    return out


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(F.linear(hidden, weight).float() / T)[targets]``: float32 ``[T]`` (full logits, as HF/vLLM)."""
    logits = F.linear(hidden, weight).float()
    if float(temperature) != 1.0:
        logits = logits / float(temperature)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.to(torch.int64).unsqueeze(-1)).squeeze(-1)


def log_softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.log_softmax``."""
    return torch.log_softmax(x, dim=dim, dtype=dtype)


def _top_k_top_p(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """vLLM's torch ``apply_top_k_top_p``: -inf outside each row's top-k, then outside its top-p nucleus."""
    v = x.shape[-1]
    ascending, index = x.sort(dim=-1)
    k = torch.where(top_k > 0, top_k, v).clamp(max=v)
    kth = ascending.gather(1, (v - k).unsqueeze(1))
    ascending = ascending.masked_fill(ascending < kth, float("-inf"))
    mass = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop = mass <= (1 - top_p).unsqueeze(1)
    drop[:, -1] = False  # the most likely token always stays
    ascending = ascending.masked_fill(drop, float("-inf"))
    return torch.empty_like(x).scatter_(1, index, ascending)


def sample(logits: torch.Tensor, temperature: torch.Tensor | float, top_k: torch.Tensor | int,
           top_p: torch.Tensor | float, seed: torch.Tensor | int, position: torch.Tensor | int) -> torch.Tensor:
    """torch sampling of one token per row: int64 ``[B]``. ``seed`` and ``position`` are ignored.

    Greedy rows (``temperature == 0``) take ``argmax``; the others ``softmax(logits / T)`` after
    top-k / top-p (skipped when no row asks for them: one host read), drawn by the exponential
    race from torch's default generator of the device.
    """
    b, v = logits.shape
    dev = logits.device
    t = torch.as_tensor(temperature, dtype=torch.float32, device=dev).expand(b)
    k = torch.as_tensor(top_k, dtype=torch.int64, device=dev).expand(b)
    p = torch.as_tensor(top_p, dtype=torch.float32, device=dev).expand(b)
    greedy = t == 0
    x = logits.float() / torch.where(greedy, torch.ones_like(t), t).unsqueeze(1)
    if bool(((k > 0) & (k < v)).any() | (p < 1).any()):
        x = _top_k_top_p(x, k, p)
    probs = torch.softmax(x, dim=-1)
    drawn = probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), drawn)


#: torch's own ops under rlkernel.ops' signatures: ``LLM(model, ops="native")``. ``bitwise=False``.
NATIVE = OpSet(name="native", bitwise=False, embedding=embedding, linear=linear, rms_norm=rms_norm, rope=rope,
               silu_mul=silu_mul, attention=attention, attention_paged=attention_paged,
               token_logprobs=token_logprobs, log_softmax=log_softmax, sample=sample)
