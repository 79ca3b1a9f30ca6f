"""Contract ``sample``: next-token sampling with temperature, top-k and top-p, bit-exact everywhere.

The same logits, parameters, seed and position give the same token on every backend, in any
batch. Randomness is Philox4x32-10 with a pinned counter layout (R7, P9); the Gumbel noise uses
the contract log (P6); the top-p cut is decided on exact integers; every comparison follows R5.

The algorithm (the definition; ``reference`` below executes it), per row b
---------------------------------------------------------------------------
Inputs: logits ``x`` [V] (fp32; bf16/fp16 upcast exactly), ``tau`` (fp32), ``k`` (int64,
0 = off), ``p`` (fp32, >= 1 = off), ``seed`` (int64, read as a uint64 bit pattern),
``pos`` (int64 >= 0).

1. ``tau == 0``: greedy. token = ``argmax_j x_j`` (R5: the first NaN if any, else the lowest
   index among the maxima). k and p are ignored.
2. Otherwise ``z_j = x_j / tau`` (one IEEE fp32 division).
3. Special rows (decided before any filtering): if some ``z_j`` is NaN, token = the first NaN
   index; else if some ``z_j`` is +inf, token = the first +inf index; else if every ``z_j`` is
   -inf, token = 0. (These are exactly what steps 4-8 would give if NaN ranked above every
   number and ``z_j - m`` were not needed.)
4. Rank: order the tokens by the key ``(-z_j, j)`` (largest z first, ties to the lower index;
   -0 and +0 are equal). ``rank_j`` in [0, V).
5. top-k: survivors are ``rank_j < k`` (all tokens when k = 0 or k >= V).
6. top-p (only when p < 1): ``m = max_j z_j``; ``q_j = RNE(exp_c(z_j - m) * 2**40)`` (an int64
   in [0, 2**40]); over the survivors in rank order, ``cum_before_j`` = the exact sum of ``q``
   of the survivors ranked before j and ``total`` = the sum over all survivors;
   ``pnum = RNE(p * 2**24)`` (an integer in [0, 2**24], exact from the fp32 p);
   ``P = (total >> 24) * pnum + (((total & (2**24 - 1)) * pnum) >> 24)``, which equals
   ``floor(total * pnum / 2**24)`` exactly in int64 (total <= V * 2**40 <= 2**58). A survivor
   is kept iff it is ranked first or ``cum_before_j < P``.
7. Gumbel noise for every kept j: Philox4x32-10 with key ``(seed & 0xFFFFFFFF,
   (seed >> 32) & 0xFFFFFFFF)`` and counter ``(j >> 2, pos & 0xFFFFFFFF,
   (pos >> 32) & 0xFFFFFFFF, 0)``; ``r`` = output word ``j & 3``;
   ``u_j = (2 * (r >> 9) + 1) * 2**-24`` (exact, in (0, 1));
   ``g_j = -log_c(-log_c(u_j))`` (fp32; negation is exact).
8. ``score_j = z_j + g_j`` (one fp32 addition) for kept j, -inf otherwise;
   token = ``argmax_j score_j`` (R5, ties to the lower index).

V <= 2**18 (so ``total`` and P stay exact in int64). The noise of token j at position pos
depends only on (seed, pos, j), so a request draws the same token alone or in any batch, and
the sampled distribution is softmax(z) restricted to the kept set (up to the 2**-24 grid of u
and the accuracy of log_c).
"""

from __future__ import annotations

from typing import Any

import torch

from ._contract import BenchCase, Case, Contract, InvarianceCase, Runner
from ._exact.fixed import F_SUM, quantize
from ._exact.fp32 import argmax_r5
from ._exact.philox import philox4x32, uniform_from_u32
from ._exact.transcendental import exp_c, log_c
from ._gen import from_bits, integers, normal, seed_of, special_values

CONTRACT = Contract(
    name="sample",
    version=1,
    summary="token = argmax_j over kept j of (x_j / tau + g_j), g_j = -log_c(-log_c(u_j)), u from Philox(seed, pos, j)",
    invariances=("batch", "permutation", "repeat"),
    dtypes={"logits": (torch.float32, torch.bfloat16, torch.float16), "temperature": (torch.float32,),
            "top_k": (torch.int64,), "top_p": (torch.float32,), "seed": (torch.int64,),
            "position": (torch.int64,)},
)

#: Largest vocabulary: the top-p total (<= V * 2**40) times pnum (<= 2**24) / 2**24 stays in int64.
MAX_VOCAB = 1 << 18
#: Fraction bits of top_p: pnum = RNE(top_p * 2**24).
P_BITS = 24
_MASK32 = 0xFFFFFFFF


def uniforms(seed: int, position: int, index: torch.Tensor) -> torch.Tensor:
    """``u_j = (2 * (r_j >> 9) + 1) * 2**-24`` for token ids ``index`` (int64 [n]); fp32 [n].

    ``r_j`` is word ``j & 3`` of Philox4x32-10 with key ``(seed lo, seed hi)`` and counter
    ``(j >> 2, pos lo, pos hi, 0)``; seed and position are read as 64-bit patterns.
    """
    n = index.shape[0]
    key = torch.tensor([seed & _MASK32, (seed >> 32) & _MASK32], dtype=torch.int64)
    counter = torch.stack([index >> 2, torch.full((n,), position & _MASK32, dtype=torch.int64),
                           torch.full((n,), (position >> 32) & _MASK32, dtype=torch.int64),
                           torch.zeros(n, dtype=torch.int64)], dim=-1)
    words = philox4x32(counter, key)  # [n, 4], values in [0, 2**32)
    r = words.gather(1, (index & 3).view(-1, 1)).view(-1)
    return uniform_from_u32(r)


def gumbel(seed: int, position: int, index: torch.Tensor) -> torch.Tensor:
    """``g_j = -log_c(-log_c(u_j))`` for token ids ``index``; fp32 [n]."""
    return -log_c(-log_c(uniforms(seed, position, index)))


def _top_p_keep(z_ranked: torch.Tensor, p: float) -> torch.Tensor:
    """Step 6 on the survivors in rank order (z_ranked[0] is the max): bool keep mask."""
    q = quantize(exp_c(z_ranked - z_ranked[0]), torch.zeros((), dtype=torch.int64), F_SUM)
    cum_before = torch.cumsum(q, dim=0) - q
    total = int(q.sum())
    pnum = int(torch.round(torch.tensor(p, dtype=torch.float64) * 2.0**P_BITS))  # exact: fp32 p
    cut = (total >> P_BITS) * pnum + (((total & ((1 << P_BITS) - 1)) * pnum) >> P_BITS)
    assert cut == (total * pnum) >> P_BITS  # the int64 formula is the exact floor
    first = torch.arange(z_ranked.shape[0]) == 0
    return first | (cum_before < cut)


def _row(x: torch.Tensor, tau: torch.Tensor, k: int, p: float, seed: int, position: int) -> int:
    """One row, steps 1-8."""
    v = x.shape[0]
    if float(tau) == 0.0:
        return int(argmax_r5(x))
    z = x / tau
    for special in (torch.isnan(z), z == float("inf")):
        if bool(special.any()):
            return int(special.nonzero()[0])
    if bool((z == float("-inf")).all()):
        return 0
    order = torch.sort(z + 0.0, descending=True, stable=True).indices  # (-z, j); +0.0 makes -0 equal to +0
    survivors = order[: v if k == 0 else min(k, v)]
    if p < 1.0:
        survivors = survivors[_top_p_keep(z[survivors], p)]
    score = torch.full((v,), float("-inf"), dtype=torch.float32)
    score[survivors] = z[survivors] + gumbel(seed, position, survivors)
    return int(argmax_r5(score))


def _per_row(value: Any, b: int, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to("cpu")
    return torch.full((b,), value, dtype=dtype)


def reference(logits: torch.Tensor, temperature: Any, top_k: Any, top_p: Any, seed: torch.Tensor,
              position: torch.Tensor) -> torch.Tensor:
    """Sample one token per row: Gumbel-max over the top-k/top-p kept set of ``logits / temperature``.

    Parameters
    ----------
    logits : Tensor, float32 (bfloat16/float16 upcast exactly), [B, V], V <= 2**18
    temperature : Tensor float32 [B], or a Python float (broadcast); >= 0, 0 = greedy
    top_k : Tensor int64 [B], or a Python int; >= 0, 0 = off
    top_p : Tensor float32 [B], or a Python float; >= 0, >= 1 = off
    seed : Tensor, int64, [B] (a uint64 bit pattern)
    position : Tensor, int64, [B], >= 0

    Returns
    -------
    Tensor, int64, [B]

    Bitwise semantics
    -----------------
    Steps 1-8 of the module docstring. Each row depends only on its own inputs (batch and
    permutation invariant). Contract ``sample`` version 1.
    """
    x = logits.to(torch.float32)
    b = x.shape[0]
    tau = _per_row(temperature, b, torch.float32)
    k = _per_row(top_k, b, torch.int64)
    p = _per_row(top_p, b, torch.float32)
    out = torch.empty(b, dtype=torch.int64)
    for i in range(b):
        out[i] = _row(x[i], tau[i], int(k[i]), float(p[i]), int(seed[i]), int(position[i]))
    return out


# --- conformance cases ------------------------------------------------------------------------

def _logits(name: str, b: int, v: int, std: float = 2.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return normal(seed_of("sample", name, "logits"), (b, v), std=std, dtype=dtype)


def _params(name: str, b: int, v: int, temperature: Any = 1.0, top_k: Any = 0, top_p: Any = 1.0,
            dtype: torch.dtype = torch.float32, std: float = 2.0) -> dict[str, Any]:
    s = seed_of("sample", name)
    return {"logits": _logits(name, b, v, std, dtype), "temperature": temperature, "top_k": top_k, "top_p": top_p,
            "seed": integers(s, (b,), -(2**62), 2**62) * 2 + 1, "position": integers(s + 1, (b,), 0, 1 << 20)}


def _mixed(name: str, b: int, v: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Per-row parameters: greedy rows, top-k only, top-p only, both, neither."""
    s = seed_of("sample", name, "params")
    inputs = _params(name, b, v, dtype=dtype)
    temps = torch.tensor([0.0, 1.0, 0.7, 1.3, 1.0, 0.5, 2.0, 1.0], dtype=torch.float32)
    ks = torch.tensor([5, 0, 20, 0, 50, 1, 0, v + 3], dtype=torch.int64)
    ps = torch.tensor([0.5, 1.0, 1.0, 0.9, 0.8, 1.0, 0.3, 1.5], dtype=torch.float32)
    pick = integers(s, (b,), 0, 8)
    inputs.update(temperature=temps[pick], top_k=ks[pick], top_p=ps[pick])
    return inputs


def golden_cases() -> list[Case]:
    """Vocabularies of realistic size with per-row parameter mixes; scalar-parameter forms."""
    return [
        Case("mixed_b16_v1000", "golden", lambda: _mixed("mixed_b16_v1000", 16, 1000)),
        Case("mixed_b8_v32000_bf16", "golden", lambda: _mixed("mixed_b8_v32000_bf16", 8, 32000, torch.bfloat16)),
        Case("scalars_b4_v5000_topk50_topp0.95", "golden",
             lambda: _params("scalars_b4_v5000_topk50_topp0.95", 4, 5000, 0.8, 50, 0.95)),
        Case("plain_b6_v777_fp16", "golden", lambda: _params("plain_b6_v777_fp16", 6, 777, dtype=torch.float16)),
        Case("top_p_only_b6_v4096", "golden", lambda: _params("top_p_only_b6_v4096", 6, 4096, 1.0, 0, 0.6, std=4.0)),
        Case("mixed_b64_v151936", "golden", lambda: _mixed("mixed_b64_v151936", 64, 151936), full_only=True),
    ]


def _specials(name: str) -> dict[str, Any]:
    """Rows holding NaN, +inf, -inf (some, all), -0/+0 maxima, subnormals, and greedy rows with them."""
    v = 12
    rows = []
    sv = special_values(torch.float32)  # +0 -0 +inf -inf nan sub sub normal max -max 1+ 1-
    base = _logits(name, 1, v)[0]
    for i in range(len(sv)):
        r = base.clone()
        r[(3 * i + 1) % v] = sv[i]
        rows.append(r)
    rows.append(torch.full((v,), float("-inf")))  # every logit -inf -> token 0
    r = torch.full((v,), float("-inf"))
    r[7] = -(2.0**-149)
    rows.append(r)  # one finite logit
    rows.append(torch.tensor([-0.0, 0.0, -0.0] + [-1.0] * (v - 3)))  # max ties at zero, both signs
    r = base.clone()
    r[2] = float("nan")
    r[9] = float("nan")
    rows.append(r)  # first NaN wins
    logits = torch.stack(rows)
    b = logits.shape[0]
    s = seed_of("sample", name)
    temps = torch.ones(b, dtype=torch.float32)
    temps[::3] = 0.0  # greedy rows see the specials too
    return {"logits": logits, "temperature": temps, "top_k": integers(s, (b,), 0, 4),
            "top_p": torch.where(torch.arange(b) % 2 == 0, 0.5, 1.0).to(torch.float32),
            "seed": integers(s + 1, (b,), 0, 2**62), "position": integers(s + 2, (b,), 0, 1000)}


def _ties(name: str) -> dict[str, Any]:
    """Many equal logits: top-k and top-p cuts fall inside a tie block (lower index wins)."""
    v = 64
    logits = torch.zeros((6, v), dtype=torch.float32)
    logits[:, ::2] = 1.0
    logits[:, 5] = 3.0
    s = seed_of("sample", name)
    return {"logits": logits, "temperature": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.25, 1.0]),
            "top_k": torch.tensor([3, 17, 0, 0, 2, 33]), "top_p": torch.tensor([1.0, 1.0, 1.0, 0.4, 1.0, 0.05]),
            "seed": integers(s, (6,), 0, 2**62), "position": torch.arange(6, dtype=torch.int64)}


def _extremes(name: str) -> dict[str, Any]:
    """Temperatures that overflow (1e-40) or flatten (3e38) the logits; top_p = 0 and just below 1;
    top_k = 1 and > V; the largest seeds and positions (all 64 bits)."""
    v = 50
    b = 8
    inputs = _params(name, b, v)
    inputs["temperature"] = torch.tensor([1e-40, 3e38, 1.0, 1.0, 1.0, 1.0, 0.9, 1e-3], dtype=torch.float32)
    inputs["top_k"] = torch.tensor([0, 0, 1, 1000, 0, 0, 2, 0])
    inputs["top_p"] = from_bits([0x3F800000, 0x3F7FFFFF, 0x3F7FFFFF, 0x00000000, 0x00000001, 0x3F000000,
                                 0x7F800000, 0x3DCCCCCD], torch.float32)
    inputs["seed"] = torch.tensor([-1, 0, 2**63 - 1, -(2**63), 1, 0x0123456789ABCDEF, -2, 12345])
    inputs["position"] = torch.tensor([0, 2**63 - 1, 2**32, 2**32 - 1, 7, 1, 2**40 + 3, 99])
    return inputs


def _non_contiguous(name: str) -> dict[str, Any]:
    inputs = _mixed(name, 5, 300)
    wide = torch.zeros((300, 10), dtype=torch.float32)
    wide[:, ::2] = inputs["logits"].t()
    inputs["logits"] = wide[:, ::2].t()
    big = torch.zeros(10, dtype=torch.int64)
    big[::2] = inputs["position"]
    inputs["position"] = big[::2]
    return inputs


def adversarial_cases() -> list[Case]:
    """Specials, ties, extreme parameters, one-token vocabulary, empty batch, strided inputs."""

    def case(name: str, make: Any) -> Case:
        return Case(name, "adversarial", make)

    return [
        case("specials", lambda: _specials("specials")),
        case("ties", lambda: _ties("ties")),
        case("extremes", lambda: _extremes("extremes")),
        case("v1", lambda: _params("v1", 3, 1, torch.tensor([0.0, 1.0, 1.0]), 0, torch.tensor([1.0, 0.5, 0.0]))),
        case("b1_v3_bf16", lambda: _params("b1_v3_bf16", 1, 3, 0.7, 2, 0.9, dtype=torch.bfloat16)),
        case("b0_empty", lambda: _params("b0_empty", 0, 17)),
        case("non_contiguous", lambda: _non_contiguous("non_contiguous")),
        case("flat_logits_b4_v257", lambda: _params("flat_logits_b4_v257", 4, 257, 1.0, 0, 0.5, std=1e-30)),
    ]


# --- invariance cases -------------------------------------------------------------------------

def _row_of(inputs: dict[str, Any], i: int) -> dict[str, Any]:
    return {k: (v[i:i + 1] if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}


def _check_batch(run: Runner) -> tuple[Any, Any]:
    """Request 2 alone vs the same request at row 4 of a batch of 7 (other rows differ)."""
    a = _mixed("inv_batch", 7, 2000)
    other = _mixed("inv_batch_other", 7, 2000)
    for key, val in a.items():
        other[key] = other[key].clone()
        other[key][4] = val[2]
    alone = run("sample", **_row_of(a, 2))
    batch = run("sample", **other)
    return alone, batch[4:5]


def _check_every_row(run: Runner) -> tuple[Any, Any]:
    """Each of 7 requests alone vs all 7 together."""
    a = _mixed("inv_batch_all", 7, 1500)
    alone = torch.cat([run("sample", **_row_of(a, i)) for i in range(7)])
    return alone, run("sample", **a)


def _check_permutation(run: Runner) -> tuple[Any, Any]:
    a = _mixed("inv_permutation", 9, 1200)
    perm = torch.tensor([3, 8, 0, 5, 1, 7, 2, 6, 4])
    whole = run("sample", **a)
    permuted = run("sample", **{k: v[perm] for k, v in a.items()})
    return whole[perm], permuted


def _check_repeat(run: Runner) -> tuple[Any, Any]:
    a = _mixed("inv_repeat", 8, 3000)
    return run("sample", **a), run("sample", **a)


def invariance_cases() -> list[InvarianceCase]:
    return [
        InvarianceCase("batch_row_alone_vs_in_7", "batch", _check_batch),
        InvarianceCase("batch_each_row_alone", "batch", _check_every_row),
        InvarianceCase("permutation_batch", "permutation", _check_permutation),
        InvarianceCase("repeat", "repeat", _check_repeat),
    ]


# --- benchmarks -------------------------------------------------------------------------------

def _native(logits: torch.Tensor, temperature: Any, top_k: Any, top_p: Any, seed: torch.Tensor,
            position: torch.Tensor) -> torch.Tensor:
    """The plain PyTorch baseline: multinomial over softmax(logits / T) (no top-k/top-p)."""
    probs = torch.softmax(logits.float() / temperature.unsqueeze(-1), dim=-1)
    return torch.multinomial(probs, 1).view(-1)


def _bench(b: int, v: int = 151936, sizes: tuple[str, ...] = ("large",)) -> BenchCase:
    def make(device: torch.device) -> dict[str, Any]:
        # Timing inputs only: torch's RNG on the device is fine here.
        g = torch.Generator(device=device).manual_seed(b)
        return {"logits": torch.randn((b, v), generator=g, device=device) * 3.0,
                "temperature": torch.full((b,), 0.8, device=device),
                "top_k": torch.zeros(b, dtype=torch.int64, device=device),
                "top_p": torch.ones(b, device=device),
                "seed": torch.arange(b, dtype=torch.int64, device=device),
                "position": torch.full((b,), 100, dtype=torch.int64, device=device)}

    return BenchCase(f"qwen3_vocab_b{b}", make, _native, flops=0.0, bytes=4.0 * b * v + 8.0 * b, sizes=sizes)


def bench_cases() -> list[BenchCase]:
    """B = 1, 64, 256 (large), B = 1, 4 (small) at the Qwen3 vocabulary (151936), fp32 logits,
    temperature 0.8.

    bytes = logits (fp32) + output (int64); flops = 0 (memory- and RNG-bound).
    """
    return [_bench(1, sizes=("small", "large")), _bench(64), _bench(256), _bench(4, sizes=("small",))]
