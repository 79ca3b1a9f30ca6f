"""Contract ``embedding``: ``out[..., :] = weight[ids[...], :]``, a row gather.

Bitwise semantics (version 1)
-----------------------------
- ``out[p, :]`` holds the bits of ``weight[ids[p], :]`` exactly: no arithmetic, so -0,
  subnormals and infinities are copied as they are; every NaN becomes the canonical NaN of
  the dtype (P8: fp32 0x7FC00000, bf16 0x7FC0, fp16 0x7E00).
- ``ids`` must lie in ``[0, V)``; any other value raises ``ValueError`` naming it and V
  (negative ids are not wrapped).
- ``ids`` of any shape (including 0-d and empty) give ``[*ids.shape, H]``.

Each output row depends only on its own id, so the op is invariant to batch composition,
order, and repeats.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import canonicalize
from rlkernel.contracts._gen import from_bits, integers, normal, seed_of, special_values, uniform

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

CONTRACT = Contract(
    name="embedding",
    version=1,
    summary="``out[..., :] = weight[ids[...], :]`` (bit copy, canonical NaN)",
    # no "autograd": embedding has no backward in v1, so the public op refuses a weight that
    # requires grad (at the call) instead of computing a forward under autograd
    invariances=("batch", "permutation", "repeat"),
    dtypes={"ids": (torch.int64, torch.int32), "weight": (FP32, BF16, FP16)},
    # A bit copy has no width, rounding or table; what a one-step change can break are the
    # special values it must carry unchanged. (Its NaN rule, canonical NaN out, is not listed:
    # conformance compares outputs after NaN canonicalisation, so no case can observe it.)
    parameters={
        "signed_zero": "-0 entries are copied as -0 (no arithmetic on the rows)",
        "subnormals": "subnormal entries are copied, not flushed to zero",
    },
)


def reference(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Gather rows of ``weight`` (the definition of contract ``embedding`` v1).

    Parameters
    ----------
    ids : Tensor, int64/int32, [*]
        Row indices in ``[0, V)``.
    weight : Tensor, float32/bfloat16/float16, [V, H]

    Returns
    -------
    Tensor, weight.dtype, [*, H]

    Bitwise semantics
    -----------------
    The bits of ``weight[ids]``, NaNs canonicalised; out-of-range ids raise ``ValueError``.
    """
    vocab, hidden = weight.shape
    flat = ids.reshape(-1).to(torch.int64)
    bad = (flat < 0) | (flat >= vocab)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"embedding: id {int(flat[i])} at flat index {i} is outside [0, V) with V = {vocab}")
    rows = [weight[int(i)] for i in flat.tolist()]
    out = torch.stack(rows) if rows else torch.zeros((0, hidden), dtype=weight.dtype)
    return canonicalize(out).reshape(*ids.shape, hidden)


# ----------------------------------------------------------------------------- cases


def _seed(*parts: object) -> int:
    return seed_of("embedding", *parts)


def _make(name: str, shape: tuple[int, ...], vocab: int, hidden: int, dtype: torch.dtype,
          id_dtype: torch.dtype = torch.int64) -> dict[str, Any]:
    return {"ids": integers(_seed(name, "ids"), shape, 0, vocab).to(id_dtype),
            "weight": normal(_seed(name, "w"), (vocab, hidden), 0.02, dtype)}


def golden_cases() -> list[Case]:
    """Token batches over small vocabularies and the Qwen3 vocabulary (151936) with a narrow H."""
    specs = [
        ("v1000_h64_bf16_3x17", (3, 17), 1000, 64, BF16, torch.int64),
        ("v1000_h64_fp16_int32_ids", (1, 33), 1000, 64, FP16, torch.int32),
        ("v4096_h128_fp32_2x64", (2, 64), 4096, 128, FP32, torch.int64),
        ("v151936_h8_bf16_64", (64,), 151936, 8, BF16, torch.int64),
        ("v300_h96_bf16_single", (1,), 300, 96, BF16, torch.int32),
    ]
    return [Case(name=n, kind="golden", make=lambda n=n, s=s, vv=vv, h=h, d=d, i=i: _make(n, s, vv, h, d, i))
            for n, s, vv, h, d, i in specs]


def _special_weight(dtype: torch.dtype) -> torch.Tensor:
    """Rows of special values, including non-canonical NaN payloads and signs."""
    sv = special_values(dtype)
    if dtype == FP32:
        nans = [0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFFFFFF]
    elif dtype == BF16:
        nans = [0x7FC1, 0xFFC0, 0x7F81, 0xFFFF]
    else:
        nans = [0x7E01, 0xFE00, 0x7C01, 0xFFFF]
    row = torch.cat([sv, from_bits(nans, dtype)])  # 16 values
    w = normal(_seed("special", str(dtype)), (6, 16), 1.0, dtype)
    w[1] = row
    w[3] = row.flip(0)
    return w


def adversarial_cases() -> list[Case]:
    """Special values and NaN payloads, repeated and boundary ids, empty and 0-d ids, views."""
    cases = []
    for dtype in (FP32, BF16, FP16):
        tag = str(dtype).replace("torch.", "")
        cases.append(Case(name=f"special_values_{tag}", kind="adversarial",
                          make=lambda d=dtype: {"ids": torch.tensor([[1, 3, 0], [5, 1, 1]]),
                                                "weight": _special_weight(d)}))
    cases += [
        Case(name="special_rows_many_ids_bf16", kind="adversarial", make=lambda: {
            "ids": integers(_seed("special_many", "ids"), (48,), 0, 6), "weight": _special_weight(BF16)}),
        Case(name="boundary_and_repeated_ids", kind="adversarial", make=lambda: {
            "ids": torch.tensor([0, 999, 999, 0, 500, 999], dtype=torch.int32),
            "weight": normal(_seed("boundary", "w"), (1000, 24), 0.02, BF16)}),
        Case(name="vocab_1", kind="adversarial", make=lambda: {
            "ids": torch.zeros((4,), dtype=torch.int64), "weight": normal(_seed("v1", "w"), (1, 7), 1.0, FP16)}),
        Case(name="empty_ids", kind="adversarial", make=lambda: {
            "ids": torch.zeros((0,), dtype=torch.int64), "weight": normal(_seed("empty", "w"), (10, 8), 1.0, BF16)}),
        Case(name="empty_batch_2x0", kind="adversarial", make=lambda: {
            "ids": torch.zeros((2, 0), dtype=torch.int32), "weight": normal(_seed("empty2", "w"), (10, 8), 1.0, FP32)}),
        Case(name="scalar_id", kind="adversarial", make=lambda: {
            "ids": torch.tensor(7), "weight": normal(_seed("scalar", "w"), (10, 8), 1.0, BF16)}),
        Case(name="noncontiguous_ids_and_weight", kind="adversarial", make=lambda: {
            "ids": integers(_seed("nc", "ids"), (17, 3), 0, 50).t(),  # [3, 17] transposed view
            "weight": normal(_seed("nc", "w"), (40, 50), 0.02, BF16).t()}),  # [50, 40] transposed view
        Case(name="h1_fp16", kind="adversarial", make=lambda: _make("h1", (5, 2), 9, 1, FP16)),
    ]
    return cases


def _perm(seed: int, n: int) -> torch.Tensor:
    return torch.from_numpy(uniform(seed, (n,)).argsort(kind="stable"))


def invariance_cases() -> list[InvarianceCase]:
    """A sequence alone vs inside batches; permuted ids; repeats."""

    def batch(run: Any) -> tuple[Any, Any]:
        d = _make("batch", (8, 33), 2000, 64, BF16)
        row = d["ids"][3:4]
        alone = run("embedding", ids=row, weight=d["weight"])
        expected, actual = [], []
        for size, pos in ((1, 0), (3, 2), (8, 5)):
            ids = d["ids"][:size].clone()
            ids[pos] = row[0]
            expected.append(alone[0])
            actual.append(run("embedding", ids=ids, weight=d["weight"])[pos])
        flat = run("embedding", ids=d["ids"].reshape(-1), weight=d["weight"]).reshape(8, 33, 64)
        return (*expected, run("embedding", **d)), (*actual, flat)

    def permutation(run: Any) -> tuple[Any, Any]:
        d = _make("perm", (40,), 700, 32, FP16)
        p = _perm(_seed("perm", "p"), 40)
        return run("embedding", **d)[p], run("embedding", ids=d["ids"][p], weight=d["weight"])

    def repeat(run: Any) -> tuple[Any, Any]:
        d = _make("repeat", (4, 9), 500, 48, FP32)
        first = run("embedding", **d)
        return (first, first), (run("embedding", **d), run("embedding", **d))

    return [
        InvarianceCase(name="sequence_alone_vs_batches", invariance="batch", check=batch),
        InvarianceCase(name="permuted_ids", invariance="permutation", check=permutation),
        InvarianceCase(name="repeated_runs", invariance="repeat", check=repeat),
    ]


def _native(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.embedding(ids, weight)


def bench_cases() -> list[BenchCase]:
    """Token embedding (vocab 151936, bf16). large: Qwen3-8B (hidden 4096), 1, 64, 8192 tokens;
    small: Qwen3-0.6B (hidden 1024), 1 and 64 tokens."""
    vocab = 151936
    cases = []
    for model, hidden, tokens, size in (("qwen3_8b", 4096, (1, 64, 8192), "large"),
                                        ("qwen3_0.6b", 1024, (1, 64), "small")):
        for n in tokens:
            def make(device: torch.device, n: int = n, hidden: int = hidden) -> dict[str, Any]:
                block = normal(_seed("bench", "w"), (64, hidden), 0.02, BF16).to(device)
                weight = block.repeat(vocab // 64 + 1, 1)[:vocab].contiguous()
                return {"ids": integers(_seed("bench", "ids", n), (n,), 0, vocab).to(device), "weight": weight}

            cases.append(BenchCase(name=f"{model}_tokens{n}", make=make, native=_native, flops=0.0,
                                   bytes=float(2 * n * hidden * 2 + 8 * n), sizes=(size,), graph=n <= 64))
    return cases
