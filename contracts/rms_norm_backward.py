"""The gradients of ``rms_norm`` (v1) in x and in the gain, bit-exact.

``dx, dweight_terms = rms_norm_backward(grad, x, weight, eps)``. The scale ``r`` and the
normalised row ``h`` are recomputed exactly as the forward makes them (the same exact sum of
squares, the same divisions), so the backward differentiates the function the forward ran. The
one reduction of dx, ``c = sum_j w_j dy_j x_j``, is the exact superaccumulator sum (P10): its
terms have both signs and cancel (c is the component of ``w * dy`` along x that the
normalisation removes), so it is rounded once from its exact value, whatever its size relative to
the largest term, in any order of the hidden axis. The weight gradient is not summed here: the op
returns its per-token fp32 terms, which :func:`rlkernel.grads.weight_grad` sums exactly over every
token (and micro-batch), so no split of the tokens can change it.
"""

from __future__ import annotations

from typing import Any

import torch

from rlkernel.contracts._contract import BenchCase, Case, Contract, InvarianceCase
from rlkernel.contracts._exact import superacc
from rlkernel.contracts._exact.fixed import F_SUM, fixed_sum
from rlkernel.contracts._exact.fp32 import canonicalize, round_to, sqrt_rn
from rlkernel.contracts._gen import normal, seed_of, special_values, with_outlier_channels
from rlkernel.contracts.rms_norm import MAX_HIDDEN, _pin_sum_rows

CONTRACT = Contract(
    name="rms_norm_backward",
    version=1,
    summary=("dx = RN(RN32(r*g) - RN32(h32*u)), g = RN32(w*dy), u = RN32(RN32(RN32(c ÷ H)*r)*r), "
             "c = RN32(exact sum g*x); dweight_terms = RN32(dy*h), r and h as rms_norm v1"),
    invariances=("batch", "permutation", "reduction_order", "repeat"),
    dtypes={
        "grad": (torch.bfloat16, torch.float16, torch.float32),
        "x": (torch.bfloat16, torch.float16, torch.float32),
        "weight": (torch.bfloat16, torch.float16, torch.float32),
    },
    parameters={
        "forward_r": "r recomputed as rms_norm v1 steps 1-3: S = sum of RN32(xf*xf) on the max grid (F = 40), "
                     "mean = RN32(S ÷ fp32(H)), r = RN32(1 ÷ sqrt_rn(RN32(mean + fp32(eps))))",
        "h_values": "h32 = RN32(xf * r) (the forward's step 4 in fp32) in dx; h = RN_dtype(h32) (the value the "
                    "gain multiplied) in the weight terms",
        "gain_product": "g = RN32(fp32(w) * fp32(dy)), kept in fp32 (not rounded to x's dtype)",
        "row_sum": "c = RN32(exact sum_j RN32(g_j * xf_j)): each product rounded, the sum exact (P10 "
                   "superaccumulator), rounded once to nearest even",
        "coefficient": "u = RN32(RN32(RN32(c ÷ fp32(H)) * r) * r): divide by H first, then r twice",
        "dx_terms": "dx32 = RN32(RN32(r * g) - RN32(h32 * u)): two products rounded, then one subtraction",
        "output_rounding": "dx = RN_dtype(dx32) to x's dtype, nearest even (overflow to inf); NaN canonical",
        "weight_terms": "dweight_terms = RN32(fp32(dy) * fp32(h)) per token, fp32, not summed",
    },
)


def forward_values(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``xf``, ``r`` [*, 1] and ``h32`` of rms_norm v1 (its steps 1-4, before the dtype cast of h)."""
    hidden = x.shape[-1]
    xf = x.to(torch.float32)
    s = fixed_sum(xf * xf, dim=-1, frac_bits=F_SUM, op="rms_norm_backward")
    mean = s / torch.tensor(float(hidden), dtype=torch.float32)
    eps32 = torch.tensor(eps, dtype=torch.float32)
    r = (torch.tensor(1.0, dtype=torch.float32) / sqrt_rn(mean + eps32)).unsqueeze(-1)
    return xf, r, xf * r


def reference(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
              eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``y = rms_norm(x, weight, eps)`` (the definition of ``rms_norm_backward``'s bits).

    ``dx = r * (w * dy) - x * r**3 / H * sum_j(w_j * dy_j * x_j)``; ``dweight`` terms ``dy * h``.

    Parameters
    ----------
    grad : Tensor, x's dtype, [*, H]
        ``dy``, the gradient of the forward's output.
    x : Tensor, bfloat16/float16/float32, [*, H]
        The forward's input.
    weight : Tensor, x's dtype or float32, [H]
        The forward's gain.
    eps : float
        The forward's eps (rounded once to fp32).

    Returns
    -------
    dx : Tensor, x's dtype, [*, H]
    dweight_terms : Tensor, float32, [*, H]
        Per-token terms of the gain's gradient, ``dweight = sum over tokens``; the autograd
        Function hands them, reshaped to ``[S, H]``, to :func:`rlkernel.grads.weight_grad`,
        which sums them exactly (for Qwen3's q/k norms ``[T, heads, H]``: S = T * heads).

    Bitwise semantics
    -----------------
    Per row, ``xf = fp32(x)``, ``dy = fp32(grad)``, ``w = fp32(weight)``, every fp32 operation
    one IEEE round-to-nearest-even rounding, no FMA:

    1. ``r`` exactly as the forward: ``S = fixed_sum(RN32(xf * xf))`` (max grid, F = 40),
       ``mean = RN32(S ÷ fp32(H))``, ``r = RN32(1 ÷ sqrt_rn(RN32(mean + fp32(eps))))``;
       ``h32 = RN32(xf * r)``; ``h = RN_dtype(h32)`` (the forward's normalised value).
    2. ``g = RN32(w * dy)``; ``c = RN32(exact sum_j RN32(g_j * xf_j))`` (P10 superaccumulator:
       correctly rounded, order-free; a NaN term, or +inf and -inf terms, give NaN, an infinite
       term that infinity).
    3. ``u = RN32(RN32(RN32(c ÷ fp32(H)) * r) * r)`` (``c r**2 / H``).
    4. ``dx = RN_dtype(RN32(RN32(r * g) - RN32(h32 * u)))``: ``x r**3 c / H`` as ``(x r) (c r**2 / H)``.
    5. ``dweight_terms = RN32(dy * fp32(h))``.

    Outputs NaN-canonical. Special values follow from the steps: a NaN or inf in the row makes
    c NaN/inf and the row of dx NaN (where the forward gave ±0 or NaN); with eps > 0 a zero row
    gives ``dx = r * g`` (c = 0). Empty rows or H = 0 give empty outputs. H <= 2**22.

    Invariances: batch, permutation (rows are independent), reduction_order (permuting the hidden
    axis of grad, x and weight together permutes both outputs), repeat. The weight terms of a
    token depend on that token only, so any split of the tokens gives the same terms.

    Contract ``rms_norm_backward`` version 1.
    """
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(f"rms_norm_backward: hidden size {hidden} exceeds the exact-sum bound {MAX_HIDDEN}")
    if x.numel() == 0:
        return torch.empty(x.shape, dtype=x.dtype), torch.empty(x.shape, dtype=torch.float32)
    xf, r, h32 = forward_values(x, eps)
    h = h32.to(x.dtype).to(torch.float32)
    dy = grad.to(torch.float32)
    g = weight.to(torch.float32) * dy
    c = superacc.exact_sum(g * xf, dim=-1).unsqueeze(-1)
    u = ((c / torch.tensor(float(hidden), dtype=torch.float32)) * r) * r
    dx = r * g - h32 * u
    return round_to(dx, x.dtype), canonicalize(dy * h)


# --------------------------------------------------------------------------- cases


def _weight(seed: int, hidden: int, dtype: torch.dtype) -> torch.Tensor:
    z = normal(seed, (hidden,), std=0.1, dtype=torch.float64)
    return (1.0 + z).to(dtype)


def _inputs(case: str, shape: tuple[int, ...], dtype: torch.dtype, w_dtype: torch.dtype | None = None,
            std: float = 1.0, eps: float = 1e-6, grad_std: float = 1.0) -> dict[str, Any]:
    x = normal(seed_of("rms_norm_backward", case, "x"), shape, std=std, dtype=dtype)
    g = normal(seed_of("rms_norm_backward", case, "grad"), shape, std=grad_std, dtype=dtype)
    w = _weight(seed_of("rms_norm_backward", case, "w"), shape[-1], w_dtype or dtype)
    return {"grad": g, "x": x, "weight": w, "eps": eps}


def golden_cases() -> list[Case]:
    """Qwen3 shapes: hidden 1024/4096 rows, QK-norm heads of 128; odd widths; every dtype."""
    specs: list[tuple[str, tuple[int, ...], torch.dtype, torch.dtype | None, bool]] = [
        ("hidden4096_bf16", (5, 4096), torch.bfloat16, None, False),
        ("hidden4096_fp16", (3, 4096), torch.float16, None, False),
        ("hidden1024_fp32", (4, 1024), torch.float32, None, False),
        ("hidden1024_bf16_fp32_weight", (4, 1024), torch.bfloat16, torch.float32, False),
        ("qknorm_q_bf16", (3, 16, 128), torch.bfloat16, None, False),
        ("qknorm_k_fp16", (3, 8, 128), torch.float16, None, False),
        ("h1_bf16", (6, 1), torch.bfloat16, None, False),
        ("h7_fp32", (4, 7), torch.float32, None, False),
        ("h129_fp16", (9, 129), torch.float16, None, False),
        ("prefill1024_bf16", (1024, 4096), torch.bfloat16, None, True),
    ]
    return [
        Case(name, "golden", lambda n=name, s=shape, d=dt, w=wdt: _inputs(n, s, d, w), full_only=full)
        for name, shape, dt, wdt, full in specs
    ]


def _specials(dtype: torch.dtype) -> dict[str, Any]:
    """One special value per row in x, then in grad; a zero row; rows of subnormals."""
    hidden = 33
    sv = special_values(dtype)
    xs, gs = [], []
    for i in range(sv.numel()):
        x = normal(seed_of("rms_norm_backward", "specials_x", dtype, i), (hidden,), dtype=dtype)
        g = normal(seed_of("rms_norm_backward", "specials_g", dtype, i), (hidden,), dtype=dtype)
        x_special, g_special = x.clone(), g.clone()
        x_special[i % hidden] = sv[i]
        g_special[(i + 5) % hidden] = sv[i]
        xs += [x_special, x]
        gs += [g, g_special]
    one = normal(seed_of("rms_norm_backward", "specials_g_rest", dtype), (hidden,), dtype=dtype)
    xs += [torch.zeros(hidden, dtype=dtype), sv[5].repeat(hidden), sv[8].repeat(hidden)]
    gs += [one, one, one]
    return {"grad": torch.stack(gs), "x": torch.stack(xs),
            "weight": _weight(seed_of("rms_norm_backward", "specials_w", dtype), hidden, dtype), "eps": 1e-6}


def _outliers(dtype: torch.dtype, tag: str) -> dict[str, Any]:
    """Activation rows with a few channels 300-3000x larger (LLM outlier channels)."""
    d = _inputs(f"outliers_{tag}", (6, 4096), dtype)
    d["x"] = with_outlier_channels(d["x"], seed_of("rms_norm_backward", "outliers_ch", tag), count=4,
                                   factor=300.0 if dtype == torch.float16 else 3000.0)
    return d


def _cancelling_sum() -> dict[str, Any]:
    """fp32 rows where ``sum_j w dy x`` cancels to a few ulps of its largest term: dy = x with the
    sign flipped on a half-point, plus a tiny remainder (the row sum's rounding shows)."""
    hidden = 64
    x = normal(seed_of("rms_norm_backward", "cancel_x"), (5, hidden), dtype=torch.float32)
    flip = torch.ones(hidden)
    flip[hidden // 2:] = -1.0
    x[:, hidden // 2:] = x[:, :hidden // 2]  # paired values
    tiny = normal(seed_of("rms_norm_backward", "cancel_tiny"), (5, hidden), std=2.0**-20, dtype=torch.float32)
    grad = (x * flip + tiny).to(torch.float32)
    return {"grad": grad, "x": x, "weight": torch.ones(hidden, dtype=torch.float32), "eps": 1e-6}


def _pin_sum() -> dict[str, Any]:
    """The forward's knife-edge rows (r sits beside a rounding boundary of S): dy = 1."""
    x = _pin_sum_rows().clone()
    return {"grad": torch.ones_like(x), "x": x, "weight": torch.ones(x.shape[-1], dtype=torch.float32), "eps": 0.0}


def adversarial_cases() -> list[Case]:
    """Specials in x and in grad, outliers, cancelling row sums, r knife edges, eps, odd, strided, empty."""
    cases = [
        Case("pin_sum_knife_edge_fp32", "adversarial", _pin_sum),
        Case("cancelling_row_sum_fp32", "adversarial", _cancelling_sum),
    ]
    cases += [Case(f"specials_{tag}", "adversarial", lambda d=dt: _specials(d))
              for tag, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32))]
    cases += [
        Case("outliers_bf16", "adversarial", lambda: _outliers(torch.bfloat16, "bf16")),
        Case("outliers_fp16", "adversarial", lambda: _outliers(torch.float16, "fp16")),
        Case("outliers_fp32", "adversarial", lambda: _outliers(torch.float32, "fp32")),
        Case("len1_fp32", "adversarial", lambda: _inputs("len1_fp32", (1, 1), torch.float32)),
        Case("len3_bf16", "adversarial", lambda: _inputs("len3_bf16", (5, 3), torch.bfloat16)),
        Case("tiny_values_bf16", "adversarial",
             lambda: _inputs("tiny_values_bf16", (4, 129), torch.bfloat16, std=2.0**-70)),
        Case("subnormal_grad_fp16", "adversarial",
             lambda: _inputs("subnormal_grad_fp16", (4, 129), torch.float16, grad_std=2.0**-20)),
        Case("huge_values_fp16", "adversarial",
             lambda: _inputs("huge_values_fp16", (4, 129), torch.float16, std=3.0e4)),
        Case("eps_zero_fp32", "adversarial", lambda: _inputs("eps_zero_fp32", (3, 65), torch.float32, eps=0.0)),
        Case("eps_large_bf16", "adversarial", lambda: _inputs("eps_large_bf16", (3, 65), torch.bfloat16, eps=0.5)),
        Case("pin_eps_1e-7_fp32", "adversarial",
             lambda: _inputs("pin_eps_1e-7_fp32", (16, 64), torch.float32, std=3.0e-4, eps=1e-7)),
        Case("noncontiguous_bf16", "adversarial", _noncontiguous),
        Case("empty_batch_bf16", "adversarial",
             lambda: {"grad": torch.empty(0, 128, dtype=torch.bfloat16), "x": torch.empty(0, 128, dtype=torch.bfloat16),
                      "weight": torch.ones(128, dtype=torch.bfloat16), "eps": 1e-6}),
        Case("vector_1d_fp16", "adversarial", lambda: _inputs("vector_1d_fp16", (257,), torch.float16)),
    ]
    return cases


def _noncontiguous() -> dict[str, Any]:
    """x and grad taken from transposed tensors (stride 1 along the batch)."""
    base = normal(seed_of("rms_norm_backward", "noncontiguous"), (256, 9), dtype=torch.bfloat16)
    g = normal(seed_of("rms_norm_backward", "noncontiguous_g"), (256, 9), dtype=torch.bfloat16)
    return {"grad": g.T, "x": base.T, "weight": _weight(seed_of("rms_norm_backward", "nc_w"), 256, torch.bfloat16),
            "eps": 1e-6}


def invariance_cases() -> list[InvarianceCase]:
    """Row alone vs inside batches, permuted batch, permuted hidden axis, repeated runs."""
    hidden = 1024
    w = _weight(seed_of("rms_norm_backward", "inv_w"), hidden, torch.bfloat16)
    op = "rms_norm_backward"

    def data(tag: str, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = normal(seed_of(op, tag, "x"), (rows, hidden), dtype=torch.bfloat16)
        x = with_outlier_channels(x, seed_of(op, tag, "ch"))
        return normal(seed_of(op, tag, "g"), (rows, hidden), dtype=torch.bfloat16), x

    def batch(run: Any) -> tuple[Any, Any]:
        g, x = data("inv_batch", 20)
        alone = run(op, grad=g[3:4], x=x[3:4], weight=w, eps=1e-6)
        inside = []
        for size, pos in ((2, 1), (7, 3), (13, 0), (4, 3)):
            dx, terms = run(op, grad=g[3 - pos:3 - pos + size], x=x[3 - pos:3 - pos + size], weight=w, eps=1e-6)
            inside.append((dx[pos:pos + 1], terms[pos:pos + 1]))
        return [alone] * len(inside), inside

    def permutation(run: Any) -> tuple[Any, Any]:
        g, x = data("inv_perm", 9)
        perm = torch.tensor([4, 0, 8, 2, 7, 1, 6, 3, 5])
        dx, terms = run(op, grad=g, x=x, weight=w, eps=1e-6)
        return (dx[perm], terms[perm]), run(op, grad=g[perm], x=x[perm], weight=w, eps=1e-6)

    def reduction_order(run: Any) -> tuple[Any, Any]:
        g, x = data("inv_red", 5)
        perms = [torch.arange(hidden - 1, -1, -1), torch.roll(torch.arange(hidden), 300),
                 torch.arange(hidden).reshape(32, 32).T.reshape(-1)]
        dx, terms = run(op, grad=g, x=x, weight=w, eps=1e-6)
        expected = [(dx[:, p], terms[:, p]) for p in perms]
        actual = [run(op, grad=g[:, p].contiguous(), x=x[:, p].contiguous(), weight=w[p].contiguous(), eps=1e-6)
                  for p in perms]
        return expected, actual

    def repeat(run: Any) -> tuple[Any, Any]:
        g, x = data("inv_repeat", 33)
        first = run(op, grad=g, x=x, weight=w, eps=1e-6)
        return [first, first], [run(op, grad=g, x=x, weight=w, eps=1e-6) for _ in range(2)]

    return [
        InvarianceCase("batch_row_positions", "batch", batch),
        InvarianceCase("permuted_batch", "permutation", permutation),
        InvarianceCase("permuted_hidden", "reduction_order", reduction_order),
        InvarianceCase("repeat", "repeat", repeat),
    ]


# --------------------------------------------------------------------------- bench


def torch_autograd(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                   eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """torch autograd of Hugging Face's ``Qwen3RMSNorm`` in the inputs' dtype: (dx, dweight).

    The native baseline (its dweight is summed over the tokens by autograd; ours returns the
    per-token terms that the exact weight_grad sums).
    """
    with torch.enable_grad():
        xl = x.detach().requires_grad_(True)
        wl = weight.detach().requires_grad_(True)
        xf = xl.float()
        y = wl * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        dx, dw = torch.autograd.grad(y, (xl, wl), grad)
    return dx, dw


def bench_cases() -> list[BenchCase]:
    """Hidden norms, bf16. large: Qwen3-8B, T in 64, 2048 rows of 4096; small: Qwen3-0.6B, 64 rows of 1024."""
    cases = []
    shapes = [("qwen3_8b", 4096, "large", t) for t in (64, 2048)] + [("qwen3_0.6b", 1024, "small", 64)]
    for model, hidden, size, rows in shapes:

        def make(device: torch.device, t: int = rows, hidden: int = hidden) -> dict[str, Any]:
            gen = torch.Generator(device=device).manual_seed(t)
            x = torch.randn(t, hidden, generator=gen, device=device).to(torch.bfloat16)
            g = torch.randn(t, hidden, generator=gen, device=device).to(torch.bfloat16)
            w = (1.0 + 0.1 * torch.randn(hidden, generator=gen, device=device)).to(torch.bfloat16)
            return {"grad": g, "x": x, "weight": w, "eps": 1e-6}

        cases.append(BenchCase(
            name=f"{model}_T{rows}_bf16",
            make=make,
            native=torch_autograd,
            flops=10.0 * rows * hidden,  # squares, the row sum, the gain and x products, dx, the weight terms
            bytes=2.0 * 3 * rows * hidden + 4.0 * rows * hidden,  # read dy, x; write dx (bf16), terms (fp32)
            sizes=(size,),
        ))
    return cases
