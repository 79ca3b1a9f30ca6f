"""Device-generic sampling: exact integer ranking, integer top-p cut, Philox Gumbel-max.

Rows are independent and processed in chunks of at most ``WORK_BYTES`` of temporaries (about
``_ROW_BYTES`` per logit; times :func:`~rlkernel.backends.generic._exact.budget.budget_scale` on an
accelerator), so a [256, 151936] batch never needs more than that at once. The
ranking sorts (or ``topk``s, when only the first k ranks matter) unique int64 keys
``(order(z) << 18) + (V - 1 - j)`` (``order`` maps fp32 bits to a monotone integer), so it is
exact and deterministic on every device; the top-p prefix sums are int64 cumulative sums
(exact in any order). The kept set is a prefix of the rank order, so with top-k the Philox
noise is computed for the kept candidates only; the noise of token j depends on (seed,
position, j) alone, so that changes no bit. Greedy and special rows draw no noise.
"""

from __future__ import annotations

import torch

from rlkernel.backends.generic._exact.budget import budget_scale
from rlkernel.backends.generic._exact.fixed import F_SUM, to_fixed
from rlkernel.backends.generic._exact.fp32 import first_argmax
from rlkernel.backends.generic._exact.philox import philox4x32, uniform_from_u32
from rlkernel.backends.generic._exact.transcendental import exp_c, log_c

#: Bytes of temporaries per row chunk.
WORK_BYTES = 128 << 20
#: Approximate bytes of temporaries per logit (sort keys, exp_c and Philox intermediates).
_ROW_BYTES = 160
#: log2 of the largest vocabulary (the index field of the sort key).
_INDEX_BITS = 18
_P_BITS = 24
_MASK32 = 0xFFFFFFFF


def _temper(x: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """``z = x ÷ tau``: the IEEE division of two fp32 tensors (not a multiply by 1 / tau)."""
    return x / tau


def _first(mask: torch.Tensor) -> torch.Tensor:
    """Index of the first True per row (V if none)."""
    v = mask.shape[-1]
    pos = torch.arange(v, device=mask.device)
    return torch.where(mask, pos, v).amin(dim=-1)


def _order_key(z: torch.Tensor) -> torch.Tensor:
    """Unique int64 keys, larger for larger z and, among equal z, for the lower index."""
    b = (z + 0.0).view(torch.int32).to(torch.int64)  # +0.0: -0 and +0 get one key
    mono = torch.where(b < 0, b ^ 0x7FFFFFFF, b)  # negative floats: flip the magnitude bits
    v = z.shape[-1]
    return (mono << _INDEX_BITS) + (v - 1 - torch.arange(v, device=z.device))


def _counter_words(seed: torch.Tensor, position: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 words [rows, n, 4] for counters ``(blocks, position lo, position hi, 0)`` and
    key ``(seed lo, seed hi)``; ``blocks`` is int64 [rows, n] (the token id >> 2)."""
    shape = blocks.shape
    counter = torch.stack([blocks, (position & _MASK32).view(-1, 1).expand(shape),
                           ((position >> 32) & _MASK32).view(-1, 1).expand(shape),
                           torch.zeros(shape, dtype=torch.int64, device=blocks.device)], dim=-1)
    key = torch.stack([seed & _MASK32, (seed >> 32) & _MASK32], dim=-1).view(-1, 1, 2)
    return philox4x32(counter, key, check=False)


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    """``g = -log_c(-log_c(u))`` (negation is exact)."""
    return -log_c(-log_c(u))


def _gumbel_all(seed: torch.Tensor, position: torch.Tensor, v: int) -> torch.Tensor:
    """Noise of every token id 0..V-1: fp32 [rows, V] (one Philox block serves 4 ids)."""
    rows, blocks = seed.shape[0], (v + 3) // 4
    ids = torch.arange(blocks, dtype=torch.int64, device=seed.device).expand(rows, blocks)
    words = _counter_words(seed, position, ids).reshape(rows, 4 * blocks)[:, :v]  # block j >> 2, word j & 3
    return _gumbel(uniform_from_u32(words, check=False))


def _gumbel_at(seed: torch.Tensor, position: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Noise of the token ids ``ids`` (int64 [rows, n]) only: fp32 [rows, n]."""
    words = _counter_words(seed, position, ids >> 2)
    r = words.gather(-1, (ids & 3).unsqueeze(-1)).squeeze(-1)
    return _gumbel(uniform_from_u32(r, check=False))


def _cut(total: torch.Tensor, pnum: torch.Tensor) -> torch.Tensor:
    """``floor(total * pnum / 2**P)`` exactly in int64 (total < 2**58, pnum <= 2**P)."""
    return (total >> _P_BITS) * pnum + (((total & ((1 << _P_BITS) - 1)) * pnum) >> _P_BITS)


def _top_p_keeps(rank: torch.Tensor, before: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
    """The top-p rule: the first-ranked token, and every token whose predecessors sum below the cut."""
    return (rank == 0) | (before < cut)


def _kept_prefix(z: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept set of each row as a prefix of the rank order: ``(ids [rows, n], count [rows])``.

    Top-k keeps ranks < k and the top-p cut keeps a prefix of those, so the kept set is always
    the first ``count`` tokens of the order ``(-z, j)``. Only the first ``max k`` ranks are
    needed: ``topk`` of the unique keys when that is below V, else a full sort.
    """
    rows, v = z.shape
    dev = z.device
    n = int(k.max())
    keys = _order_key(z)
    if n < v:
        ids = torch.topk(keys, n, dim=-1, largest=True, sorted=True).indices  # unique keys: deterministic
    else:
        ids = torch.sort(keys, dim=-1, descending=True).indices
    rank = torch.arange(n, device=dev).expand(rows, n)
    keep = rank < k.view(-1, 1)
    use_p = top_p < 1.0
    if bool(use_p.any()):
        zs = z.gather(1, ids)
        q = to_fixed(exp_c(zs - zs[:, :1]), torch.zeros((), dtype=torch.int64, device=dev), F_SUM)
        q = torch.where(keep, q, 0)
        cum = torch.cumsum(q, dim=-1)  # int64: exact in any order
        before = cum - q
        total = cum[:, -1:]
        pnum = to_fixed(top_p.clamp(max=1.0), torch.zeros((), dtype=torch.int64, device=dev), _P_BITS).view(-1, 1)
        keep = keep & (~use_p.view(-1, 1) | _top_p_keeps(rank, before, _cut(total, pnum)))
    return ids, keep.sum(dim=-1)


def _draw_filtered(z: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor, seed: torch.Tensor,
                   position: torch.Tensor) -> torch.Tensor:
    """Gumbel-max over each row's kept prefix; ties to the lowest token id."""
    v = z.shape[1]
    ids, count = _kept_prefix(z, k, top_p)
    n = int(count.max())
    ids = ids[:, :n]
    if 4 * n < v:  # few candidates: Philox only where needed (one block per candidate)
        g = _gumbel_at(seed, position, ids)
    else:
        g = _gumbel_all(seed, position, v).gather(1, ids)
    valid = torch.arange(n, device=z.device).view(1, -1) < count.view(-1, 1)
    score = torch.where(valid, z.gather(1, ids) + g, float("-inf"))
    best = torch.amax(score, dim=-1, keepdim=True)
    return torch.where(score == best, ids, v).amin(dim=-1)


def _rows(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
          seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    v = x.shape[1]
    greedy = temperature == 0
    one = torch.ones((), dtype=torch.float32, device=x.device)
    z = _temper(x, torch.where(greedy, one, temperature).view(-1, 1))
    nan = torch.isnan(z)
    pinf = z == float("inf")
    has_nan, has_pinf = nan.any(dim=-1), pinf.any(dim=-1)
    all_ninf = (z == float("-inf")).all(dim=-1)
    special = has_nan | has_pinf | all_ninf
    tok = torch.where(has_nan, _first(nan), torch.where(has_pinf, _first(pinf), 0))
    tok = torch.where(greedy, first_argmax(x), tok)

    k = torch.where((top_k == 0) | (top_k > v), v, top_k)
    sampling = ~greedy & ~special
    filtered = sampling & ((k < v) | (top_p < 1.0))
    plain = sampling & ~filtered
    if bool(plain.any()):  # every token kept: noise for the whole vocabulary
        i = plain.nonzero().view(-1)
        tok[i] = first_argmax(z[i] + _gumbel_all(seed[i], position[i], v))
    if bool(filtered.any()):
        i = filtered.nonzero().view(-1)
        tok[i] = _draw_filtered(z[i], k[i], top_p[i], seed[i], position[i])
    return tok


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seed: torch.Tensor, position: torch.Tensor, filtered: bool = True) -> torch.Tensor:
    """One token per row: greedy where temperature is 0, else Gumbel-max over the top-k/top-p set.

    Parameters
    ----------
    logits : Tensor, float32/bfloat16/float16, [B, V], contiguous
    temperature : Tensor, float32, [B]
    top_k : Tensor, int64, [B]
    top_p : Tensor, float32, [B]
    seed : Tensor, int64, [B]
    position : Tensor, int64, [B]
        All validated and broadcast by the public op.
    filtered : bool, default True
        A launch hint: False when the public op read every parameter and no row has top-k
        (0 < k < V) or top-p (p < 1) on. Never changes a token; unused here (this code finds
        the filtered rows itself).

    Returns
    -------
    Tensor, int64, [B]
    """
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    rc = max(1, WORK_BYTES * budget_scale(logits.device) // (_ROW_BYTES * max(v, 1)))
    for r0 in range(0, b, rc):
        r1 = min(r0 + rc, b)
        out[r0:r1] = _rows(logits[r0:r1].to(torch.float32), temperature[r0:r1], top_k[r0:r1], top_p[r0:r1],
                           seed[r0:r1], position[r0:r1])
    return out
