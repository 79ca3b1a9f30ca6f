"""token_entropy and token_entropy_backward: input errors, generic == reference bit for bit (random,
special values, forced small blocks), autograd through the public op (per sequence units, exact
accumulation), the model's entropy, and labelled accuracy against float64 next to torch's bf16."""

from __future__ import annotations

import pytest
import torch

import rlkernel
from rlkernel import grads
from rlkernel.backends.generic import token_entropy as gen
from rlkernel.conformance.accuracy.ops.token_entropy import (
    entropy_of_logits,
    native_backward,
    truth_backward,
    truth_forward,
)
from rlkernel.contracts import token_entropy as con
from rlkernel.contracts import token_entropy_backward as conb
from rlkernel.contracts._gen import normal, seed_of, special_values, with_outlier_channels
from rlkernel.dispatch import BackwardNotDefined
from rlkernel.ops import token_entropy, token_entropy_backward


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def assert_bits(expected: torch.Tensor | None, actual: torch.Tensor | None, what: str = "") -> None:
    if expected is None or actual is None:
        assert expected is None and actual is None, what
        return
    assert expected.dtype == actual.dtype and expected.shape == actual.shape, (what, expected.shape, actual.shape)
    diff = (bits(expected) != bits(actual)).nonzero()
    assert not len(diff), f"{what}: {len(diff)} of {expected.numel()} differ, first at {diff[0].tolist()}"


def inputs(t: int = 6, h: int = 24, v: int = 37, dtype: torch.dtype = torch.bfloat16, tag: str = "t",
           w_std: float = 0.3) -> dict:
    s = seed_of("test_token_entropy", tag, t, h, v)
    return {"hidden": normal(s, (t, h), dtype=dtype), "weight": normal(s + 1, (v, h), std=w_std, dtype=dtype)}


def grad_of(t: int, tag: str = "g") -> torch.Tensor:
    return normal(seed_of("test_token_entropy", tag, t), (t,), dtype=torch.float32)


# --- errors -------------------------------------------------------------------------------------

def test_rejects_bad_inputs():
    a = inputs()
    with pytest.raises(TypeError, match="hidden"):
        token_entropy(a["hidden"].float(), a["weight"])
    with pytest.raises(TypeError, match="same dtype|weight"):
        token_entropy(a["hidden"], a["weight"].half())
    with pytest.raises(ValueError, match="same H"):
        token_entropy(a["hidden"], a["weight"][:, :5])
    with pytest.raises(ValueError, match="vocab = 0"):
        token_entropy(a["hidden"], a["weight"][:0])
    with pytest.raises(ValueError, match="temperature"):
        token_entropy(a["hidden"], a["weight"], 0.0)
    g = grad_of(6)
    with pytest.raises(ValueError, match=r"grad has shape \(5,\)"):
        token_entropy_backward(g[:5], a["hidden"], a["weight"])
    with pytest.raises(TypeError, match="grad"):
        token_entropy_backward(g.double(), a["hidden"], a["weight"])
    with pytest.raises(TypeError, match="need_weight must be a bool"):
        token_entropy_backward(g, a["hidden"], a["weight"], need_weight=1)  # type: ignore[arg-type]
    with pytest.raises(BackwardNotDefined, match=r"^rlkernel.ops.token_entropy_backward: backward is not defined"):
        token_entropy_backward(g.requires_grad_(True), a["hidden"], a["weight"])


# --- bits ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tau", [1.0, 0.6, 1.7])
def test_generic_equals_reference(dtype: torch.dtype, tau: float):
    a = inputs(7, 40, 211, dtype, tag=f"{dtype}{tau}")
    assert_bits(con.reference(**a, temperature=tau), gen.token_entropy(**a, temperature=tau), "forward")
    g = grad_of(7, f"{dtype}{tau}")
    ref = conb.reference(g, **a, temperature=tau)
    got = gen.token_entropy_backward(g, **a, temperature=tau)
    assert_bits(ref[0], got[0], "d_hidden")
    assert_bits(ref[1], got[1], "d_weight")


def test_special_values_equal_reference():
    a = inputs(14, 16, 53, tag="specials")
    h = a["hidden"].clone()
    sv = special_values(torch.bfloat16)
    for i in range(min(len(sv), 12)):
        h[i, i] = sv[i]
    g = grad_of(14, "specials")
    g[12], g[13] = 0.0, float("inf")
    assert_bits(con.reference(h, a["weight"]), gen.token_entropy(h, a["weight"]), "forward")
    ref, got = conb.reference(g, h, a["weight"]), gen.token_entropy_backward(g, h, a["weight"])
    assert_bits(ref[0], got[0], "d_hidden")
    assert_bits(ref[1], got[1], "d_weight")


def test_need_flags_and_forced_small_blocks(monkeypatch: pytest.MonkeyPatch):
    """Several token chunks (pass B recomputes the logits) and small vocabulary chunks give the bits."""
    a = inputs(9, 32, 300, tag="blocks")
    g = grad_of(9, "blocks")
    whole = gen.token_entropy_backward(g, **a)
    fwd = gen.token_entropy(**a)
    assert gen.token_entropy_backward(g, **a, need_weight=False)[1] is None
    assert gen.token_entropy_backward(g, **a, need_hidden=False)[0] is None
    assert_bits(whole[1], gen.token_entropy_backward(g, **a, need_hidden=False)[1], "need_hidden=False")
    monkeypatch.setattr(gen, "LOGITS_BYTES", 8 * 300 * 2)  # two tokens per chunk
    monkeypatch.setattr(gen, "WORK_BYTES", 4096)
    monkeypatch.setattr(gen, "VOCAB_CHUNK", 7)
    small = gen.token_entropy_backward(g, **a)
    assert_bits(whole[0], small[0], "d_hidden, small blocks")
    assert_bits(whole[1], small[1], "d_weight, small blocks")
    assert_bits(fwd, gen.token_entropy(**a), "forward, small blocks")


def test_uniform_row_has_log_v_entropy_and_zero_gradient():
    h = torch.zeros((1, 8), dtype=torch.bfloat16)
    w = normal(3, (100, 8), dtype=torch.bfloat16)
    out = token_entropy(h, w)
    assert abs(float(out) - torch.log(torch.tensor(100.0)).item()) < 1e-6
    dh, dw = token_entropy_backward(torch.ones(1), h, w)
    assert dh is not None and dw is not None and not dh.any() and not dw.any()


# --- autograd -----------------------------------------------------------------------------------

def test_autograd_runs_the_backward_op_bit_for_bit():
    a = inputs(6, 24, 40, tag="autograd")
    h = a["hidden"].clone().requires_grad_(True)
    w = a["weight"].clone().requires_grad_(True)
    out = token_entropy(h, w, 0.8)
    assert type(out.grad_fn).__name__ == "TokenEntropyFunctionBackward"
    assert_bits(token_entropy(a["hidden"], a["weight"], 0.8), out.detach(), "forward under autograd")
    g = grad_of(6, "autograd")
    out.backward(g)
    dh, dw = token_entropy_backward(g, a["hidden"], a["weight"], 0.8)
    assert_bits(dh, h.grad, "d_hidden")
    assert dw is not None and w.grad is not None
    assert_bits(dw.to(torch.bfloat16), w.grad, "d_weight")


def test_lm_head_gradient_is_micro_batch_and_order_invariant():
    """Per-sequence units summed exactly: one packed call and two micro-batches (sequences in another
    order) give the same bits of the head's gradient under ExactGradients."""
    a = inputs(10, 16, 30, tag="units")
    lens = [3, 4, 3]
    g = grad_of(10, "units")
    w = torch.nn.Parameter(a["weight"].clone())

    def run(seqs: list[list[int]]) -> torch.Tensor:
        acc = grads.ExactGradients([w])
        starts = [0, 3, 7]
        for batch in seqs:
            rows = torch.cat([torch.arange(starts[s], starts[s] + lens[s]) for s in batch])
            cu = [0]
            for s in batch:
                cu.append(cu[-1] + lens[s])
            with grads.sequence_units(cu):
                out = token_entropy(a["hidden"][rows], w)
            out.backward(g[rows])
        acc.finish()
        return w.main_grad  # type: ignore[attr-defined]

    assert_bits(run([[0, 1, 2]]), run([[2], [1, 0]]), "head gradient")


# --- model --------------------------------------------------------------------------------------

def test_lm_head_entropy_tp1_and_refuses_tp2():
    from rlkernel.nn.embed_head import ParallelLMHead

    head = ParallelLMHead(37, 24, dtype=torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(inputs(tag="head")["weight"])
    h = inputs(tag="head")["hidden"]
    assert_bits(token_entropy(h, head.weight.detach(), 0.9), head.entropy(h, 0.9).detach(), "head.entropy")
    head.tp_size = 2
    with pytest.raises(NotImplementedError, match="tensor parallelism"):
        head.entropy(h)


# --- accuracy (labelled: against float64, not bits) ----------------------------------------------

@pytest.mark.parametrize("factor", [0.0, 1000.0])
def test_accuracy_vs_float64_no_worse_than_torch_bf16(factor: float):
    """Accuracy, not bits: the entropy's max abs error and both gradients' relative L2 error against
    float64 are no worse than torch's bf16-logits entropy (verl's entropy_from_logits) and its autograd."""
    a = inputs(8, 64, 512, tag=f"acc{factor}", w_std=0.05)
    h = a["hidden"]
    if factor:
        h = with_outlier_channels(h, seed_of("test_token_entropy", "ch"), 4, factor)
    w = a["weight"]
    g = grad_of(8, f"acc{factor}")
    t = truth_forward(h, w)
    ours = token_entropy(h, w)
    torch_bf16 = entropy_of_logits(torch.nn.functional.linear(h, w).float())
    assert (ours.double() - t).abs().max() <= (torch_bf16.double() - t).abs().max()
    assert (ours.double() - t).abs().max() < 1e-5
    t_dh, t_dw = truth_backward(g, h, w)
    o_dh, o_dw = token_entropy_backward(g, h, w)
    n_dh, n_dw = native_backward(g, h, w)

    def rel(x: torch.Tensor, y: torch.Tensor) -> float:
        return float((x.double() - y).norm() / y.norm())

    assert o_dh is not None and o_dw is not None
    assert rel(o_dh, t_dh) <= rel(n_dh, t_dh) and rel(o_dh, t_dh) < 1e-2
    assert rel(o_dw, t_dw) <= rel(n_dw, t_dw) and rel(o_dw, t_dw) < 1e-5


def test_dispatch_names_the_kernel():
    a = inputs(tag="trace")
    with rlkernel.trace() as tr:
        token_entropy(**a)
    assert any("token_entropy" in str(x) for x in tr), tr
