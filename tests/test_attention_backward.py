"""attention_backward and autograd through rlkernel.ops.attention: generic == reference bit for bit,
autograd gives the op's bits, input errors and exact-sum bounds, gradients through nn.Attention, and
accuracy against float64 next to SDPA's bf16 backward (``test_accuracy_*``, the only tolerances)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import rlkernel.ops as ops
from rlkernel.backends.generic.attention_backward import attention_backward as generic
from rlkernel.conformance.hashing import first_difference
from rlkernel.contracts import attention_backward as contract
from rlkernel.nn.attention import Attention
from rlkernel.nn.metadata import AttentionMetadata

CASES = {c.name: c for c in contract.golden_cases() + contract.adversarial_cases()}


@pytest.mark.parametrize("name", ["prefill_h4_2_d64_bf16", "noncausal_h4_2_d64_bf16", "specials_fp16",
                                  "sink_gap20_zero_value_bf16", "wide_rows_bf16", "empty_segments_bf16"])
def test_generic_equals_reference_bits(name: str) -> None:
    inputs = CASES[name].make()
    diff = first_difference(list(contract.reference(**inputs)), list(generic(**inputs)))
    assert diff is None, f"{name}: {diff}"


@pytest.mark.parametrize("name", ["chunked_h4_2_d64_bf16", "noncausal_h4_2_d64_bf16", "decode_rows_h4_1_d32_fp16"])
def test_batching_of_sequences_changes_no_bit(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generic backward pads sequences of different lengths into one batch; budgets that give one
    sequence a batch, or one KV head a batch, give the same bits (and the reference's)."""
    import rlkernel.backends.generic.attention_backward as module

    inputs = CASES[name].make()
    batched = generic(**inputs)
    for budget in (1, 1000):  # 1: every sequence alone, one KV head at a time; 1000: a few small ones together
        monkeypatch.setattr(module, "BLOCK_ELEMENTS", budget)
        diff = first_difference(list(batched), list(generic(**inputs)))
        assert diff is None, f"{name}, budget {budget}: {diff}"
    assert first_difference(list(contract.reference(**inputs)), list(batched)) is None
    assert module._batches([(0, 5, 0, 20), (5, 17, 20, 50), (17, 18, 50, 53)], 4, 1000) == [
        [(17, 18, 50, 53), (0, 5, 0, 20)], [(5, 17, 20, 50)]]


def _leaves(inputs: dict[str, Any]) -> list[torch.Tensor]:
    return [inputs[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v")]


def test_autograd_runs_the_backward_op() -> None:
    """loss.backward() through rlkernel.ops.attention gives attention_backward's bits on the saved output."""
    inputs = CASES["chunked_h4_2_d64_bf16"].make()
    q, k, v = _leaves(inputs)
    out = ops.attention(q, k, v, inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])
    assert type(out.grad_fn).__name__ == "AttentionFunctionBackward"
    assert first_difference(out.detach(), inputs["out"]) is None
    out.backward(inputs["grad_out"])
    expected = ops.attention_backward(**inputs)
    assert first_difference(list(expected), [q.grad, k.grad, v.grad]) is None


def test_autograd_hands_the_backward_the_forward_offsets_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward gets the offsets the forward read, as CPU tensors (a read of device offsets would
    wait for every queued kernel): the same bits as the offsets given, and an in-place change of the
    offset tensors after the forward does not reach its backward."""
    import rlkernel.backends.generic.attention_backward as module

    inputs = CASES["chunked_h4_2_d64_bf16"].make()
    q, k, v = _leaves(inputs)
    cu_q, cu_k = inputs["cu_seqlens_q"].clone(), inputs["cu_seqlens_k"].clone()
    out = ops.attention(q, k, v, cu_q, cu_k)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    real = module.backward_with

    def spy(steps: Any, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            out: torch.Tensor, cq: torch.Tensor, ck: torch.Tensor, *rest: Any) -> Any:
        seen.append((cq, ck))
        return real(steps, grad_out, q, k, v, out, cq, ck, *rest)

    monkeypatch.setattr(module, "backward_with", spy)
    cu_q.fill_(0)  # after the forward: its backward keeps the offsets the forward ran with
    cu_k.fill_(0)
    out.backward(inputs["grad_out"])
    assert len(seen) == 1 and all(t.device.type == "cpu" and t.dtype == torch.int64 for t in seen[0])
    assert [t.tolist() for t in seen[0]] == [inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()]
    assert first_difference(list(ops.attention_backward(**inputs)), [q.grad, k.grad, v.grad]) is None


def test_grad_only_for_the_inputs_that_require_it() -> None:
    inputs = CASES["mha_h3_3_d16_bf16"].make()
    q = inputs["q"].clone().requires_grad_(True)
    out = ops.attention(q, inputs["k"], inputs["v"], inputs["cu_seqlens_q"], inputs["cu_seqlens_k"])
    out.backward(inputs["grad_out"])
    assert first_difference(q.grad, ops.attention_backward(**inputs)[0]) is None


def test_nn_attention_packed_path_is_differentiable() -> None:
    """The training path of the Attention module (packed, no KV cache) passes gradients to q, k and v."""
    inputs = CASES["prefill_h4_2_d64_bf16"].make()
    q, k, v = _leaves(inputs)
    cu = inputs["cu_seqlens_q"]
    meta = AttentionMetadata(cu_seqlens_q=cu)
    out = Attention(4, 2, 64)(q, k, v, meta)
    out.backward(inputs["grad_out"])
    expected = ops.attention_backward(**inputs)
    assert first_difference(list(expected), [q.grad, k.grad, v.grad]) is None


def test_paged_attention_stays_forward_only() -> None:
    from rlkernel.dispatch import BackwardNotDefined

    q = torch.zeros(1, 2, 8, dtype=torch.bfloat16, requires_grad=True)
    cache = torch.zeros(1, 4, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(BackwardNotDefined, match="attention_paged"):
        ops.attention_paged(q, cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.tensor([2]),
                            torch.tensor([0, 1]))


def test_input_errors_and_bounds() -> None:
    inputs = CASES["prefill_h4_2_d64_bf16"].make()
    with pytest.raises(TypeError, match="grad_out"):
        ops.attention_backward(**{**inputs, "grad_out": inputs["grad_out"].to(torch.float16)})
    with pytest.raises(ValueError, match="out has shape"):
        ops.attention_backward(**{**inputs, "out": inputs["out"][:-1]})
    n = 1 << 16  # one key past the bound of dQ's exact sum
    q = torch.zeros(1, 1, 4, dtype=torch.bfloat16)
    k = torch.zeros(n, 1, 4, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 1]), torch.tensor([0, n])
    with pytest.raises(ValueError, match="65535"):
        ops.attention_backward(q, q, k, k, q, cu_q, cu_k)
    with pytest.raises(ValueError, match="65535"):  # refused at the forward call when grad is wanted
        ops.attention(q.requires_grad_(True), k, k, cu_q, cu_k)
    lq = 1 << 15  # 2 query heads per KV head x 2**15 queries = 2**16 terms in dK, dV
    q2 = torch.zeros(lq, 2, 4, dtype=torch.bfloat16)
    k2 = torch.zeros(lq, 1, 4, dtype=torch.bfloat16)
    cu = torch.tensor([0, lq])
    with pytest.raises(ValueError, match="query heads per KV head"):
        ops.attention_backward(q2, q2, k2, k2, q2, cu, cu)


def _f64_grads(inputs: dict[str, Any]) -> list[torch.Tensor]:
    """float64 autograd of causal softmax attention of the same inputs (per sequence, GQA repeated)."""
    q, k, v = (inputs[n].to(torch.float64).requires_grad_(True) for n in ("q", "k", "v"))
    cq, ck = inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()
    group = q.shape[1] // k.shape[1]
    scale = inputs["scale"] if inputs["scale"] is not None else 1 / math.sqrt(q.shape[2])
    outs = []
    for b in range(len(cq) - 1):
        qi = q[cq[b]:cq[b + 1]].transpose(0, 1)
        ki = k[ck[b]:ck[b + 1]].repeat_interleave(group, 1).transpose(0, 1)
        vi = v[ck[b]:ck[b + 1]].repeat_interleave(group, 1).transpose(0, 1)
        s = qi @ ki.transpose(1, 2) * scale
        mask = torch.ones(s.shape[1:], dtype=torch.bool).tril(s.shape[2] - s.shape[1])
        outs.append((torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vi).transpose(0, 1))
    torch.cat(outs).backward(inputs["grad_out"].to(torch.float64))
    return [t.grad for t in (q, k, v)]  # type: ignore[misc]


def _sdpa_grads(inputs: dict[str, Any]) -> list[torch.Tensor]:
    """torch's bf16/fp16 SDPA backward on the same inputs (one causal call per sequence)."""
    q, k, v = _leaves(inputs)
    cq, ck = inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist()
    outs = []
    for b in range(len(cq) - 1):
        qi, ki, vi = (t[c[b]:c[b + 1]].transpose(0, 1)[None] for t, c in ((q, cq), (k, ck), (v, ck)))
        assert qi.shape[2] == ki.shape[2], "accuracy cases are prefills"
        o = torch.nn.functional.scaled_dot_product_attention(qi, ki, vi, is_causal=True, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
    torch.cat(outs).backward(inputs["grad_out"])
    return [q.grad, k.grad, v.grad]  # type: ignore[list-item]


def _rel(a: torch.Tensor, truth: torch.Tensor) -> float:
    return float((a.to(torch.float64) - truth).norm() / truth.norm())


@pytest.mark.parametrize("name", ["prefill_h4_2_d64_bf16", "prefill_h8_2_d128_fp16", "outlier_channels_bf16",
                                  "sink_gap20_zero_value_bf16"])
def test_accuracy_vs_float64_no_worse_than_sdpa_backward_within_0_5_percent(name: str) -> None:
    """Accuracy, not bits: relative L2 error of dq, dk, dv against float64 autograd is at most torch
    SDPA's bf16/fp16 backward error on the same inputs (+0.5 %, the accuracy suite's EQUAL_MARGIN)."""
    inputs = CASES[name].make()
    if not all(bool((inputs[n][:, :, :] == inputs[n][:, :, :]).all()) for n in ("q", "k", "v")):
        pytest.skip("non-finite inputs")
    if any(a != b for a, b in zip(inputs["cu_seqlens_q"].tolist(), inputs["cu_seqlens_k"].tolist())):
        pytest.skip("SDPA baseline here covers prefills only")
    truth = _f64_grads(inputs)
    ours = ops.attention_backward(**inputs)
    native = _sdpa_grads(inputs)
    for what, o, n, t in zip(("dq", "dk", "dv"), ours, native, truth):
        err, ref = _rel(o, t), _rel(n, t)
        assert err <= ref * 1.005, f"{name} {what}: rlkernel {err:.3e} > SDPA {ref:.3e}"
