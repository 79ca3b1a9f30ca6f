"""Device-generic sampling: exact integer ranking, integer top-p cut, Philox Gumbel-max.

Rows are independent and processed in chunks of at most ``WORK_BYTES`` of temporaries (about
``_ROW_BYTES`` per logit), so a [256, 151936] batch never needs more than that at once. The
ranking sorts unique int64 keys ``(order(z) << 18) + (V - 1 - j)`` (``order`` maps fp32 bits to
a monotone integer), so the sort is exact and deterministic on every device; the top-p prefix
sums are int64 cumulative sums (exact in any order).
"""

from __future__ import annotations

import torch

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


def _uniforms(seed: torch.Tensor, position: torch.Tensor, v: int) -> torch.Tensor:
    """``u [rows, V]`` = ``(2 * (r >> 9) + 1) * 2**-24`` from Philox (key = seed, counter =
    (j >> 2, position lo, position hi, 0), word j & 3)."""
    rows = seed.shape[0]
    blocks = (v + 3) // 4
    dev = seed.device
    shape = (rows, blocks)
    counter = torch.stack([torch.arange(blocks, dtype=torch.int64, device=dev).expand(shape),
                           (position & _MASK32).view(-1, 1).expand(shape),
                           ((position >> 32) & _MASK32).view(-1, 1).expand(shape),
                           torch.zeros(shape, dtype=torch.int64, device=dev)], dim=-1)
    key = torch.stack([seed & _MASK32, (seed >> 32) & _MASK32], dim=-1).view(rows, 1, 2)
    words = philox4x32(counter, key, check=False).reshape(rows, 4 * blocks)[:, :v]  # block j >> 2, word j & 3
    return uniform_from_u32(words, check=False)


def _keep(z: torch.Tensor, k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Kept set of each row (top-k by rank, then the integer top-p cut): bool [rows, V]."""
    rows, v = z.shape
    dev = z.device
    order = torch.sort(_order_key(z), dim=-1, descending=True).indices
    zs = z.gather(1, order)
    rank = torch.arange(v, device=dev).expand(rows, v)
    keep = rank < k.view(-1, 1)
    use_p = top_p < 1.0
    if bool(use_p.any()):
        q = to_fixed(exp_c(zs - zs[:, :1]), torch.zeros((), dtype=torch.int64, device=dev), F_SUM)
        q = torch.where(keep, q, 0)
        cum = torch.cumsum(q, dim=-1)
        before = cum - q
        total = cum[:, -1:]
        pnum = to_fixed(top_p.clamp(max=1.0), torch.zeros((), dtype=torch.int64, device=dev), _P_BITS).view(-1, 1)
        cut = (total >> _P_BITS) * pnum + (((total & ((1 << _P_BITS) - 1)) * pnum) >> _P_BITS)
        keep = keep & ((rank == 0) | ~use_p.view(-1, 1) | (before < cut))
    return torch.zeros_like(keep).scatter_(1, order, keep)


def _rows(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
          seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    v = x.shape[1]
    greedy = temperature == 0
    one = torch.ones((), dtype=torch.float32, device=x.device)
    z = x / torch.where(greedy, one, temperature).view(-1, 1)  # IEEE division of two fp32 tensors
    nan = torch.isnan(z)
    pinf = z == float("inf")
    has_nan, has_pinf = nan.any(dim=-1), pinf.any(dim=-1)
    all_ninf = (z == float("-inf")).all(dim=-1)
    special = has_nan | has_pinf | all_ninf
    special_tok = torch.where(has_nan, _first(nan), torch.where(has_pinf, _first(pinf), 0))

    k = torch.where((top_k == 0) | (top_k > v), v, top_k)
    filtered = ((k < v) | (top_p < 1.0)) & ~greedy & ~special
    keep = torch.ones(z.shape, dtype=torch.bool, device=x.device)
    if bool(filtered.any()):
        idx = filtered.nonzero().view(-1)
        keep[idx] = _keep(z[idx], k[idx], top_p[idx])
    g = -log_c(-log_c(_uniforms(seed, position, v)))
    score = torch.where(keep, z + g, float("-inf"))
    tok = first_argmax(score)
    tok = torch.where(special, special_tok, tok)
    return torch.where(greedy, first_argmax(x), tok)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
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

    Returns
    -------
    Tensor, int64, [B]
    """
    b, v = logits.shape
    out = torch.empty(b, dtype=torch.int64, device=logits.device)
    rc = max(1, WORK_BYTES // (_ROW_BYTES * max(v, 1)))
    for r0 in range(0, b, rc):
        r1 = min(r0 + rc, b)
        out[r0:r1] = _rows(logits[r0:r1].to(torch.float32), temperature[r0:r1], top_k[r0:r1], top_p[r0:r1],
                           seed[r0:r1], position[r0:r1])
    return out
