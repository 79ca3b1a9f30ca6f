"""Mutants of the generic ``token_logprobs_backward``.

The coefficients come from the forward's exact p and L (``q = p / L``, the target's exact
complement, ``s = grad / tau``, one fp32 product, one cast); ``d_hidden`` and ``d_weight`` are
linear v2 digit products (28-bit coefficient grids, 21-bit operand grids), the vocabulary sum
carried in two int64 words.
"""

from __future__ import annotations

from typing import Any

import torch

from mutations import ORDER_BATCH, ORDER_FLOAT_SUM, mutation, original, patch
from mutations._roundings import int64_to_float_ftz, int64_to_float_rounding, ties_away, toward_zero
from rlkernel.backends.generic._exact import fp32

OP = "token_logprobs_backward"
M = "token_logprobs_backward"
_coefficients = original(M, "_coefficients")
_exponents = original(M, "_exponents")
_nan_max = original(M, "nan_max")
_pair = original(M, "int64_pair_to_float")
_grid_f64 = original(M, "_grid_f64")


def _reciprocal_divide(p: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return p * (torch.ones_like(total) / total)


def _one_minus_q(rest: torch.Tensor, p_y: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    return 1.0 - p_y / total


def _grad_reciprocal(grad: torch.Tensor, tau: torch.Tensor | None) -> torch.Tensor:
    return grad if tau is None else grad * (torch.ones_like(tau) / tau)


def _product_toward_zero(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    exact = s.to(torch.float64) * a.to(torch.float64)
    r = exact.to(torch.float32)
    return torch.where(r.to(torch.float64).abs() > exact.abs(), torch.nextafter(r, torch.zeros_like(r)), r)


def _product_to_bf16(s: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """c cast to bf16, as the grad_logits of a bf16 autograd."""
    return (s * a).to(torch.bfloat16).to(torch.float32)


def _all_rows_finite(z: torch.Tensor, m0: torch.Tensor, total: torch.Tensor, a_y: torch.Tensor, s: torch.Tensor,
                     local_y: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    return _coefficients(z, m0, total, a_y, s, local_y, torch.ones_like(finite))


def _target_clamped(z: torch.Tensor, m0: torch.Tensor, total: torch.Tensor, a_y: torch.Tensor, s: torch.Tensor,
                    local_y: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """Every shard places a_y: a target outside the shard lands on its first or last row."""
    return _coefficients(z, m0, total, a_y, s, local_y.clamp(0, z.shape[1] - 1), finite)


def _half_away(t: torch.Tensor) -> torch.Tensor:
    return torch.sign(t) * torch.floor(t.abs() + 0.5)


def _exponent_plus_one(t: torch.Tensor) -> torch.Tensor:
    e = _exponents(t)
    return torch.where((e != original(M, "SENTINEL")) & (e != original(M, "ZERO_EXP")), e + 1, e)


def _no_nan_mask(ex: torch.Tensor, ew: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ex0 = torch.where(ex == original(M, "SENTINEL"), torch.zeros_like(ex), ex)
    ew0 = torch.where(ew == original(M, "SENTINEL"), torch.zeros_like(ew), ew)
    k = ex0.unsqueeze(1) + ew0.unsqueeze(0) - original(M, "C_BITS") - original(M, "O_BITS")
    return k, torch.zeros(k.shape, dtype=torch.bool, device=k.device)


def _one_word(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk partials added in one int64 word (wraps past 2**63)."""
    return torch.zeros_like(part), part


def _pair_via_fp32(hi: torch.Tensor, lo: torch.Tensor, shift: int, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return _pair(hi, lo, shift, k, torch.float32).to(dtype)


def _pair_ftz(hi: torch.Tensor, lo: torch.Tensor, shift: int, k: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = _pair(hi, lo, shift, k, dtype)
    return torch.where(out.abs() < torch.finfo(dtype).tiny, out * 0.0, out)


def _float_product(x: torch.Tensor, w: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor) -> torch.Tensor:
    """The grids multiplied and summed in fp32 (rounded partial sums), then back to integers."""
    if x.shape[0] == 0 or w.shape[0] == 0 or x.shape[1] == 0:
        return torch.zeros((x.shape[0], w.shape[0]), dtype=torch.int64, device=x.device)
    xg = _grid_f64(x, ex, original(M, "C_BITS")).to(torch.float32)
    wg = _grid_f64(w, ew, original(M, "O_BITS")).to(torch.float32)
    return torch.round((xg.flip(-1) @ wg.flip(-1).T).to(torch.float64)).to(torch.int64)


def _batch_max(x: torch.Tensor, dim: int, keepdim: bool = False) -> Any:
    """The row max taken over every row of the token chunk (a batch-wide shift)."""
    m = _nan_max(x, dim=dim, keepdim=keepdim)
    return _nan_max(m.reshape(1, -1), dim=-1).expand_as(m) if m.numel() > 1 else m


MUTATIONS = [
    mutation(OP, "forward_rules", "logits: hidden grid H_BITS 27 -> 26", patch(M, "H_BITS", 26)),
    mutation(OP, "forward_rules", "probability grid F 40 -> 39", patch(M, "F_SUM", 39)),
    mutation(OP, "softmax_division", "p * (1 / L)", patch(M, "_softmax_divide", _reciprocal_divide)),
    mutation(OP, "target_complement", "a_y = 1 - p_y / L", patch(M, "_target_coef", _one_minus_q)),
    mutation(OP, "grad_scale", "grad * (1 / tau)", patch(M, "_grad_scale", _grad_reciprocal)),
    mutation(OP, "coef_product", "s * a rounded toward zero", patch(M, "_coef_product", _product_toward_zero)),
    mutation(OP, "coef_product", "c cast to bf16 (torch's grad_logits)", patch(M, "_coef_product", _product_to_bf16)),
    mutation(OP, "nonfinite_max", "rows with a non-finite max kept finite",
             patch(M, "_coefficients", _all_rows_finite)),
    mutation(OP, "c_grid_bits", "C_BITS 27 -> 26", patch(M, "C_BITS", 26)),
    mutation(OP, "operand_grid_bits", "O_BITS 20 -> 19", patch(M, "O_BITS", 19)),
    mutation(OP, "grid_rounding", "ties to even -> ties away", patch("linear", "_round_grid", _half_away)),
    mutation(OP, "row_exponent", "expo + 1", patch(M, "_exponents", _exponent_plus_one)),
    mutation(OP, "nonfinite_rows", "sentinel rows not NaN", patch(M, "_scale", _no_nan_mask)),
    mutation(OP, "vocab_sum", "chunk partials added in one int64 word", patch(M, "_split", _one_word)),
    mutation(OP, "hidden_rounding", "through fp32 first (double rounding)",
             patch(M, "int64_pair_to_float", _pair_via_fp32)),
    mutation(OP, "weight_rounding", "to nearest -> toward zero",
             patch(M, "int64_to_float", int64_to_float_rounding(toward_zero))),
    mutation(OP, "weight_rounding", "ties to even -> ties away",
             patch(M, "int64_to_float", int64_to_float_rounding(ties_away))),
    mutation(OP, "subnormal_results", "d_weight flushed to zero", patch(M, "int64_to_float", int64_to_float_ftz)),
    mutation(OP, "subnormal_results", "d_hidden flushed to zero", patch(M, "int64_pair_to_float", _pair_ftz)),
    mutation(OP, "shard_rules", "non-owner shards place the target's coefficient",
             patch(M, "_coefficients", _target_clamped)),
    mutation(OP, "shard_rules", "two words split at bit 31", patch(M, "WORD_SHIFT", 31)),
    mutation(OP, "shard_rules", "all-zero rows get exponent -148", patch("linear", "ZERO_EXP", -148)),
    mutation(OP, ORDER_FLOAT_SUM, "products summed in fp32", patch(M, "_product", _float_product)),
    mutation(OP, ORDER_BATCH, "row max over the whole token chunk", patch(M, "nan_max", _batch_max)),
]

__all__ = ["MUTATIONS", "fp32"]
