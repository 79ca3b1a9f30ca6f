"""The gradient of ``rope`` (v1) in x: the transposed rotation, bit-exact.

``dx = rope_backward(grad, positions, theta)``. RoPE is a rotation of each (x1_i, x2_i) pair by
``+p * theta**(-2i/D)``; its gradient is the rotation by the opposite angle applied to dy, with
the forward's correctly rounded fp32 tables (R8, :func:`rlkernel.contracts.rope.rope_tables`)
and the forward's roundings: two products rounded, one add or subtract rounded, then the cast.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact.fp32 import round_to
from rlkernel.contracts._gen import integers, normal, seed_of, special_values
from rlkernel.contracts.rope import QWEN3_MAX_POSITION, table_rows

CONTRACT = Contract(
    name="rope_backward",
    version=1,
    summary="dx1 = RN(RN(dy1*c) + RN(dy2*s)), dx2 = RN(RN(dy2*c) - RN(dy1*s)), c/s the rope v1 tables",
    invariances=("batch", "permutation", "chunking", "repeat"),
    dtypes={"grad": (torch.bfloat16, torch.float16, torch.float32), "positions": (torch.int64, torch.int32)},
    # As in rope: the table entries are host constants (R8) handed to every backend.
    parameters={
        "layout": "rotate-half (NeoX): dy1 = dy[..., :D/2] pairs with dy2 = dy[..., D/2:], as the forward",
        "rotation": "the transpose: dx1 = dy1 c + dy2 s, dx2 = dy2 c - dy1 s (rotation by -p * theta**(-2i/D))",
        "product_rounding": "each of the four products rounded to fp32, then one rounded add/sub (no FMA)",
        "table_precision": "c, s used as the forward's fp32 table entries (not rounded to grad's dtype)",
        "output_rounding": "dx rounded to grad's dtype (x's dtype), nearest even (overflow to inf)",
    },
)


def reference(grad: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """Gradient of ``y = rope(x, positions, theta)`` in x (the definition of ``rope_backward``'s bits).

    ``dx1 = dy1 * c + dy2 * s``, ``dx2 = dy2 * c - dy1 * s``, ``c, s = cos[p], sin[p]``

    Parameters
    ----------
    grad : Tensor, bfloat16/float16/float32, [T, n_heads, D] or [T, D]
        ``dy``, the gradient of the forward's output (x's dtype and shape); D even.
    positions : Tensor, int64 or int32, [T]
        The forward's positions, in [0, 2**24).
    theta : float
        The forward's RoPE base.

    Returns
    -------
    Tensor, grad's dtype, grad's shape

    Bitwise semantics
    -----------------
    ``c, s`` are the forward's tables (:func:`rlkernel.contracts.rope.rope_tables`: exact cos/sin
    correctly rounded to fp32). With ``dyf = fp32(grad)``, per token, head and ``i < D/2``:
    ``dx1 = RN32(RN32(dy1 * c) + RN32(dy2 * s))``, ``dx2 = RN32(RN32(dy2 * c) - RN32(dy1 * s))``
    (no FMA), then ``RN_dtype``; NaN canonical. Specials follow IEEE (at p = 0, ``s = +0``: an inf
    in the other half gives NaN, as the forward). Each token depends only on its own gradient and
    position: batch, permutation, chunking, repeat.

    Contract ``rope_backward`` version 1.
    """
    if grad.dim() not in (2, 3):
        raise ValueError(f"rope_backward: grad has shape {tuple(grad.shape)}; expected [T, n_heads, D] or [T, D]")
    head_dim = grad.shape[-1]
    half = head_dim // 2
    if grad.numel() == 0:
        return torch.empty(grad.shape, dtype=grad.dtype)
    unique, inverse = torch.unique(positions.to(torch.int64), return_inverse=True)
    cos_u, sin_u = table_rows(unique.numpy(), head_dim, theta)
    c, s = cos_u[inverse], sin_u[inverse]
    if grad.dim() == 3:
        c, s = c.unsqueeze(1), s.unsqueeze(1)
    dy = grad.to(torch.float32)
    dy1, dy2 = dy[..., :half], dy[..., half:]
    return round_to(torch.cat([dy1 * c + dy2 * s, dy2 * c - dy1 * s], dim=-1), grad.dtype)


# --------------------------------------------------------------------------- cases


def _inputs(case: str, shape: tuple[int, ...], dtype: torch.dtype, positions: torch.Tensor,
            theta: float = 1e6, std: float = 1.0) -> dict[str, Any]:
    return {"grad": normal(seed_of("rope_backward", case, "grad"), shape, std=std, dtype=dtype),
            "positions": positions, "theta": theta}


def _positions(case: str, count: int, high: int = QWEN3_MAX_POSITION) -> torch.Tensor:
    return integers(seed_of("rope_backward", case, "positions"), (count,), 0, high)


def golden_cases() -> list[Case]:
    """Qwen3 heads (head_dim 128, theta 1e6) and smaller shapes, every dtype."""
    return [
        Case("q_bf16", "golden", lambda: _inputs("q_bf16", (7, 32, 128), torch.bfloat16, _positions("q_bf16", 7))),
        Case("k_fp16", "golden", lambda: _inputs("k_fp16", (5, 8, 128), torch.float16, torch.arange(1000, 1005))),
        Case("q_fp32_theta1e4", "golden",
             lambda: _inputs("q_fp32_theta1e4", (6, 4, 64), torch.float32, _positions("q_fp32_theta1e4", 6, 4096),
                             theta=10000.0)),
        Case("prefill64_k_bf16", "golden",
             lambda: _inputs("prefill64_k_bf16", (64, 8, 128), torch.bfloat16, torch.arange(64))),
        Case("two_d_bf16", "golden", lambda: _inputs("two_d_bf16", (9, 128), torch.bfloat16, torch.arange(9))),
        Case("d7x2_fp16", "golden",
             lambda: _inputs("d7x2_fp16", (4, 3, 14), torch.float16, _positions("d7x2_fp16", 4))),
        Case("prefill2048_q_bf16", "golden",
             lambda: _inputs("prefill2048_q_bf16", (2048, 32, 128), torch.bfloat16, torch.arange(2048)),
             full_only=True),
    ]


def _specials(dtype: torch.dtype) -> dict[str, Any]:
    """Every special value in each half of a head, at position 0 (c = 1, s = 0) and others."""
    sv = special_values(dtype)
    n, head_dim = sv.numel(), 16
    g = normal(seed_of("rope_backward", "specials", dtype), (2 * n, 1, head_dim), dtype=dtype)
    for i in range(n):
        g[i, 0, i % 8] = sv[i]
        g[n + i, 0, 8 + (i % 8)] = sv[i]
    positions = torch.tensor([0, 1, 2, 3, 7, 100, 40959, 0, 5, 12345, 1, 0] * 2)
    return {"grad": g, "positions": positions, "theta": 1e6}


def _ties_bf16() -> dict[str, Any]:
    """Powers of two and bf16 grid points: at p = 0 dx = dy exactly; elsewhere sums near ties."""
    head_dim = 32
    ks = torch.arange(head_dim, dtype=torch.float64)
    rows = [torch.pow(2.0, ks - 16.0), 1.0 + ks / 128.0, -(1.0 + ks / 256.0), torch.full((head_dim,), 3.0)]
    g = torch.stack(rows).to(torch.bfloat16).reshape(4, 1, head_dim).repeat(3, 2, 1)
    positions = torch.tensor([0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    return {"grad": g, "positions": positions, "theta": 1e6}


def _noncontiguous() -> dict[str, Any]:
    """The q part of a fused qkv gradient [T, (32 + 8 + 8) * 128] (row stride 6144)."""
    qkv = normal(seed_of("rope_backward", "noncontiguous"), (5, 48 * 128), dtype=torch.bfloat16)
    return {"grad": qkv[:, : 32 * 128].view(5, 32, 128), "positions": torch.tensor([9, 3, 3, 40000, 0]),
            "theta": 1e6}


def adversarial_cases() -> list[Case]:
    """Specials, ties, fp32 products, strided views, smallest heads, large and unsorted positions, empty.

    (The table entries themselves, midpoint-hard ones included, are pinned by rope's table cases;
    positions near 2**24 here would make the public op build tables of that many rows.)
    """
    return [
        Case("specials_bf16", "adversarial", lambda: _specials(torch.bfloat16)),
        Case("specials_fp16", "adversarial", lambda: _specials(torch.float16)),
        Case("specials_fp32", "adversarial", lambda: _specials(torch.float32)),
        Case("ties_bf16", "adversarial", _ties_bf16),
        Case("noncontiguous_qkv_bf16", "adversarial", _noncontiguous),
        Case("head_dim2_fp32", "adversarial",
             lambda: _inputs("head_dim2_fp32", (3, 2, 2), torch.float32, torch.tensor([0, 1, 40000]))),
        Case("single_token_fp16", "adversarial",
             lambda: _inputs("single_token_fp16", (1, 1, 6), torch.float16, torch.tensor([31]))),
        Case("repeated_unsorted_int32_positions_bf16", "adversarial",
             lambda: _inputs("repeated_unsorted_positions_bf16", (8, 4, 128), torch.bfloat16,
                             torch.tensor([5, 5, 0, 65535, 5, 17, 0, 65535], dtype=torch.int32))),
        Case("large_positions_fp32", "adversarial",
             lambda: _inputs("large_positions_fp32", (4, 2, 128), torch.float32,
                             torch.tensor([65535, 65534, 32768, 40959]))),
        Case("theta_one_bf16", "adversarial",
             lambda: _inputs("theta_one_bf16", (3, 2, 8), torch.bfloat16, torch.tensor([0, 1, 2]), theta=1.0)),
        Case("huge_values_fp16", "adversarial",
             lambda: _inputs("huge_values_fp16", (4, 2, 64), torch.float16, torch.arange(4) * 997, std=3.0e4)),
        Case("subnormal_values_bf16", "adversarial",
             lambda: _inputs("subnormal_values_bf16", (4, 2, 64), torch.bfloat16, torch.arange(4) * 31,
                             std=2.0**-130)),
        Case("empty_batch_bf16", "adversarial",
             lambda: {"grad": torch.empty(0, 8, 128, dtype=torch.bfloat16),
                      "positions": torch.empty(0, dtype=torch.int64), "theta": 1e6}),
    ]


def invariance_cases() -> list[InvarianceCase]:
    """Packed sequences, permuted tokens, chunked sequences, repeated runs."""
    heads, head_dim, theta, op = 8, 128, 1e6, "rope_backward"

    def seq(case: str, count: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = normal(seed_of(op, case), (count, heads, head_dim), dtype=torch.bfloat16)
        return g, torch.arange(start, start + count)

    def batch(run: Any) -> tuple[Any, Any]:
        ga, pa = seq("inv_batch_a", 5, 100)
        gb, pb = seq("inv_batch_b", 9, 0)
        gc, pc = seq("inv_batch_c", 3, 7000)
        alone = run(op, grad=ga, positions=pa, theta=theta)
        packed = run(op, grad=torch.cat([gb, ga, gc]), positions=torch.cat([pb, pa, pc]), theta=theta)
        first = run(op, grad=torch.cat([ga, gc]), positions=torch.cat([pa, pc]), theta=theta)
        return [alone, alone], [packed[9:14], first[:5]]

    def permutation(run: Any) -> tuple[Any, Any]:
        g, pos = seq("inv_perm", 9, 40)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        return run(op, grad=g, positions=pos, theta=theta)[perm], run(op, grad=g[perm], positions=pos[perm],
                                                                      theta=theta)

    def chunking(run: Any) -> tuple[Any, Any]:
        g, pos = seq("inv_chunk", 37, 0)
        whole = run(op, grad=g, positions=pos, theta=theta)
        bounds = [0, 3, 16, 17, 37]
        return whole, torch.cat([run(op, grad=g[a:b], positions=pos[a:b], theta=theta)
                                 for a, b in zip(bounds, bounds[1:])])

    def repeat(run: Any) -> tuple[Any, Any]:
        g, pos = seq("inv_repeat", 33, 500)
        first = run(op, grad=g, positions=pos, theta=theta)
        return [first, first], [run(op, grad=g, positions=pos, theta=theta) for _ in range(2)]

    return [
        InvarianceCase("packed_sequences", "batch", batch),
        InvarianceCase("permuted_tokens", "permutation", permutation),
        InvarianceCase("chunked_sequence", "chunking", chunking),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_autograd(grad: torch.Tensor, positions: torch.Tensor, theta: float = 1e6) -> torch.Tensor:
    """torch autograd of Hugging Face's rotary embedding (tables cast to the dtype): the native baseline."""
    head_dim = grad.shape[-1]
    with torch.enable_grad():
        x = torch.zeros_like(grad).requires_grad_(True)
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=grad.device).float() / head_dim))
        emb = torch.cat([positions.float()[:, None] * inv[None, :]] * 2, dim=-1)
        cos, sin = emb.cos().to(grad.dtype), emb.sin().to(grad.dtype)
        if grad.dim() == 3:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2:]
        y = x * cos + torch.cat((-x2, x1), dim=-1) * sin
        (dx,) = torch.autograd.grad(y, (x,), grad)
    return dx


def bench_cases() -> list[BenchCase]:
    """Query-head gradients [T, H, 128] bf16, positions 0..T-1. large: Qwen3-8B (H = 32), T = 2048;
    small: Qwen3-0.6B (H = 16), T = 64."""
    head_dim = 128
    cases = []
    for model, heads, size, tokens in (("qwen3_8b", 32, "large", 2048), ("qwen3_0.6b", 16, "small", 64)):

        def make(device: torch.device, t: int = tokens, heads: int = heads) -> dict[str, Any]:
            gen = torch.Generator(device=device).manual_seed(t)
            g = torch.randn(t, heads, head_dim, generator=gen, device=device).to(torch.bfloat16)
            return {"grad": g, "positions": torch.arange(t, device=device), "theta": 1e6}

        elems = tokens * heads * head_dim
        cases.append(BenchCase(
            name=f"{model}_q_T{tokens}_bf16",
            make=make,
            native=torch_autograd,
            flops=3.0 * elems,
            bytes=2.0 * 2 * elems + 8.0 * tokens + 2 * 4.0 * tokens * head_dim // 2,
            sizes=(size,),
        ))
    return cases
