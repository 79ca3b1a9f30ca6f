"""Nothing silently wrong under autograd: every public op either has its own correct backward or
refuses, at the call, inputs that require grad.

The walk takes every public op's inputs from the contract modules' golden cases, with every
floating tensor set to ``requires_grad``. Each call must either raise ``BackwardNotDefined`` (naming
the op, the inputs that require grad and how to proceed) or return outputs whose ``grad_fn`` is
one the op defines; no float output may come back silently detached. Under ``torch.no_grad()``,
``torch.inference_mode()`` and with detached inputs every op runs and gives the bits of the plain
call. The backwards that exist (``linear``, ``ppo_loss``, ``rms_norm``, ``silu_mul``, ``rope``, ``kl_k3``,
``masked_mean``, ``token_logprobs``) are checked against float64 autograd of the same math: accuracy tests, with the
tolerance in their names and docstrings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import rlkernel.ops as ops
from rlkernel import rl
from rlkernel.conformance.cases import bit_cases, op_of
from rlkernel.conformance.hashing import first_difference
from rlkernel.contracts import load_contracts
from rlkernel.dispatch import BackwardNotDefined
from rlkernel.public import public_op

#: The autograd nodes each op with a backward defines; any other grad_fn on an output is a bug.
DEFINED_GRAD_FNS = {"linear": {"LinearFunctionBackward"}, "ppo_loss": {"PPOLossFunctionBackward"},
                    "embedding": {"EmbeddingFunctionBackward", "ViewBackward0"},  # its output reshaped to ids.shape
                    "rms_norm": {"RMSNormFunctionBackward"}, "silu_mul": {"SiluMulFunctionBackward"},
                    "rope": {"RopeFunctionBackward"}, "kl_k3": {"KLK3FunctionBackward"},
                    "masked_mean": {"MaskedMeanFunctionBackward"}, "token_logprobs": {"TokenLogprobsFunctionBackward"},
                    "attention": {"AttentionFunctionBackward"},
                    "token_entropy": {"TokenEntropyFunctionBackward"}}


def _golden() -> list[tuple[str, str, Callable[[], dict[str, Any]]]]:
    modules, _ = load_contracts()
    out = []
    for name, module in modules.items():
        for case in bit_cases(module, full=False):
            if case.kind == "golden":
                out.append((op_of(module, case), f"{name}/{case.name}", case.make))
    return out


GOLDEN = _golden()


def _map(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(o, fn) for o in obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


def _requiring_grad(inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` with every floating tensor a fresh leaf that requires grad."""
    return _map(inputs, lambda t: t.detach().clone().requires_grad_(True) if t.is_floating_point() else t)


def _assert_bits(expected: Any, actual: Any, what: str) -> None:
    diff = first_difference(_map(expected, torch.Tensor.detach), _map(actual, torch.Tensor.detach))
    assert diff is None, f"{what}: {diff}"


def test_every_public_op_is_walked() -> None:
    """The walk below covers every name of rlkernel.ops.__all__ (a new op needs a golden case)."""
    assert set(ops.__all__) <= {op for op, _, _ in GOLDEN}


@pytest.mark.parametrize(("op", "make"), [(op, make) for op, _, make in GOLDEN], ids=[i for _, i, _ in GOLDEN])
def test_inputs_requiring_grad_raise_at_the_call_or_get_the_ops_own_backward(op: str, make: Any) -> None:
    inputs = _requiring_grad(make())
    wanting = sorted(name for name, value in inputs.items() if any(t.requires_grad for t in _tensors(value)))
    fn = public_op(op)
    try:
        out = fn(**inputs)
    except BackwardNotDefined as exc:
        message = str(exc)
        assert message.startswith(f"rlkernel.ops.{op}: "), message
        assert "backward is not defined yet" in message or "backward is defined for" in message, message
        assert any(name in message for name in wanting), (wanting, message)
        assert ".detach()" in message and "torch.no_grad()" in message and "torch.inference_mode()" in message
        return
    for t in _tensors(out):
        if t.grad_fn is not None:
            assert type(t.grad_fn).__name__ in DEFINED_GRAD_FNS.get(op, set()), (
                f"{op} returned a tensor with grad_fn {type(t.grad_fn).__name__}, which it does not define")
        else:
            # only integer outputs (token ids, exponents, exact partials) may come back without a graph
            assert not (t.is_floating_point() and wanting), f"{op}: float output silently detached from {wanting}"


@pytest.mark.parametrize(("op", "make"), [(op, make) for op, _, make in GOLDEN], ids=[i for _, i, _ in GOLDEN])
def test_every_op_runs_without_grad_and_with_detached_inputs(op: str, make: Any) -> None:
    fn = public_op(op)
    plain = fn(**make())  # detached inputs, grad mode on
    assert all(t.grad_fn is None for t in _tensors(plain)), op
    with torch.no_grad():
        no_grad = fn(**_requiring_grad(make()))
    with torch.inference_mode():
        inference = fn(**_requiring_grad(make()))
    assert all(t.grad_fn is None for t in _tensors(no_grad)), op
    _assert_bits(plain, no_grad, f"{op} under no_grad")
    _assert_bits(plain, inference, f"{op} under inference_mode")


def test_the_facade_follows_the_same_rule() -> None:
    """rlkernel.rl (verl's names) re-exports the ops; its partial helpers give integers without grad."""
    for name in ("group_advantages", "kl_k3", "masked_mean", "ppo_loss"):
        assert getattr(rl, name) is getattr(ops, name)
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    mask = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(BackwardNotDefined, match=r"rlkernel.ops.kl_k3: the backward is defined for logp only"):
        rl.kl_k3(x.detach(), x)
    assert type(rl.kl_k3(x, x.detach()).grad_fn).__name__ == "KLK3FunctionBackward"
    assert type(rl.masked_mean(x, mask).grad_fn).__name__ == "MaskedMeanFunctionBackward"
    part = rl.masked_mean_partial(x, mask)
    assert part.dtype == torch.int64 and part.grad_fn is None
    assert rl.ppo_loss_partial(x, x.detach(), torch.ones(2), mask).grad_fn is None
    acc = rl.ExactMean().add(part)
    _assert_bits(rl.masked_mean(x.detach(), mask), acc.value(), "ExactMean of the partial")


def test_silent_detach_of_ppo_constants_is_refused() -> None:
    """old_logp or advantages that require grad used to be detached silently; now the call refuses."""
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(2, 4, generator=g).requires_grad_(True)
    adv = torch.randn(2, generator=g).requires_grad_(True)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(BackwardNotDefined, match="defined for logp only, and advantages requires grad"):
        ops.ppo_loss(logp, logp.detach() - 0.1, adv, mask)
    loss = ops.ppo_loss(logp, logp.detach() - 0.1, adv.detach(), mask)
    assert type(loss.grad_fn).__name__ == "PPOLossFunctionBackward"


def test_old_silently_wrong_ops_now_refuse() -> None:
    """log_softmax and softmax used to return a graph with gradients 9-110 % off; they refuse until their
    backward contracts exist (rms_norm and silu_mul have theirs now)."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(2)).requires_grad_(True)
    for call, name in ((lambda: ops.log_softmax(x), "log_softmax"), (lambda: ops.softmax(x), "softmax")):
        with pytest.raises(BackwardNotDefined, match=rf"^rlkernel.ops.{name}: backward is not defined yet"):
            call()


def test_backward_ops_refuse_double_backward() -> None:
    """The backward ops themselves have no backward: inputs that require grad are refused at the call."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    with pytest.raises(BackwardNotDefined, match=r"^rlkernel.ops.rms_norm_backward: backward is not defined yet"):
        ops.rms_norm_backward(x, x.detach(), torch.ones(16))
    with pytest.raises(BackwardNotDefined, match=r"^rlkernel.ops.silu_mul_backward: backward is not defined yet"):
        ops.silu_mul_backward(x, x.detach(), x.detach())


# --------------------------------------------------------------------------- accuracy vs float64


def _rel_l2(actual: torch.Tensor, truth: torch.Tensor) -> float:
    truth = truth.to(torch.float64)
    return float((actual.to(torch.float64) - truth).norm() / truth.norm().clamp(min=1e-300))


def _finite(inputs: dict[str, Any]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in _tensors(inputs) if t.is_floating_point())


LINEAR_CASES = [(i, make) for op, i, make in GOLDEN if op == "linear"]
PPO_CASES = [(i, make) for op, i, make in GOLDEN if op == "ppo_loss"]


@pytest.mark.parametrize(("name", "make"), LINEAR_CASES, ids=[i for i, _ in LINEAR_CASES])
def test_accuracy_linear_backward_vs_float64_within_1e_2_rel_l2(name: str, make: Any) -> None:
    """Accuracy, not bits: dX, dW, dbias of linear against float64 autograd of x @ w.T + b.

    Tolerance: relative L2 error <= 1e-2 per gradient. The contract rounds dY to the input dtype
    (bf16: 2**-9 relative) and each gradient to its dtype (another 2**-9), so bf16 gradients sit
    near 4e-3; the digit matmul itself is ~1e-6.
    """
    inputs = make()
    if not _finite(inputs):
        pytest.skip("non-finite inputs: no float64 truth to compare with")
    x, w, b = inputs["x"], inputs["weight"], inputs.get("bias")
    leaves = [t.detach().clone().requires_grad_(True) for t in (x, w) + ((b,) if b is not None else ())]
    y = ops.linear(leaves[0], leaves[1], leaves[2] if b is not None else None, inputs.get("out_dtype"))
    assert type(y.grad_fn).__name__ == "LinearFunctionBackward"
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7)).to(y.dtype)
    y.backward(gy)
    truth = [t.detach().to(torch.float64).requires_grad_(True) for t in leaves]
    y64 = torch.nn.functional.linear(truth[0], truth[1], truth[2] if b is not None else None)
    y64.backward(gy.to(torch.float64))
    for leaf, ref, what in zip(leaves, truth, ("dX", "dW", "dbias")):
        assert leaf.grad is not None and leaf.grad.dtype == leaf.dtype
        if ref.grad is not None and float(ref.grad.norm()) > 0:
            err = _rel_l2(leaf.grad, ref.grad)
            assert err <= 1e-2, f"{name} {what}: relative L2 error {err:.2e} > 1e-2"


def _ppo_float64(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip_low: float,
                 clip_high: float, dual_clip: float | None, mode: str, denominator: float | None) -> torch.Tensor:
    """The PPO clipped objective in float64 (the math of the contract, without its roundings)."""
    a = adv.unsqueeze(1) if adv.dim() == 1 else adv
    ratio = torch.exp(logp - old_logp)
    tok = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high))
    if dual_clip is not None:
        tok = torch.where(a < 0, torch.minimum(tok, -a * dual_clip), tok)
    m = mask.to(torch.float64)
    if mode == "token-mean":
        return (tok * m).sum() / (denominator or m.sum())
    count = m.sum(-1)
    seq = (tok * m).sum(-1)
    if mode == "seq-mean-token-mean":
        seq = torch.where(count > 0, seq / count.clamp(min=1), seq)
    return seq.sum() / (denominator or (count > 0).sum())


@pytest.mark.parametrize(("name", "make"), PPO_CASES, ids=[i for i, _ in PPO_CASES])
def test_accuracy_ppo_loss_backward_vs_float64_within_1e_5_rel_l2(name: str, make: Any) -> None:
    """Accuracy, not bits: d loss / d logp against float64 autograd of the same objective.

    Tolerance: relative L2 error <= 1e-5 (fp32 ratio through the contract exp, one product and
    one division per token: a few fp32 ulps).
    """
    inputs = make()
    if inputs.get("partial") or inputs.get("grad_output") is not None:
        pytest.skip("partial / grad_output cases have no autograd graph (covered by the walk)")
    kw = {k: inputs.get(k, d) for k, d in (("clip_low", 0.2), ("clip_high", 0.2), ("dual_clip", None),
                                           ("mode", "token-mean"), ("denominator", None))}
    logp = inputs["logp"].detach().clone().requires_grad_(True)
    loss = ops.ppo_loss(logp, inputs["old_logp"], inputs["advantages"], inputs["mask"], **kw)
    assert type(loss.grad_fn).__name__ == "PPOLossFunctionBackward"
    loss.backward()
    lp64 = inputs["logp"].to(torch.float64).requires_grad_(True)
    _ppo_float64(lp64, inputs["old_logp"].to(torch.float64), inputs["advantages"].to(torch.float64),
                 inputs["mask"], **kw).backward()
    assert logp.grad is not None and lp64.grad is not None
    if float(lp64.grad.norm()) == 0:
        assert float(logp.grad.abs().max()) == 0
        return
    err = _rel_l2(logp.grad, lp64.grad)
    assert err <= 1e-5, f"{name}: relative L2 error {err:.2e} > 1e-5"


def _elementwise_float64(op: str, inputs: dict[str, Any]) -> tuple[Any, list[str]]:
    """(the float64 function of the leaves, the differentiable input names) for the row-wise ops."""
    if op == "rms_norm":
        eps = inputs.get("eps", 1e-6)
        return (lambda x, weight: weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)), ["x", "weight"]
    if op == "silu_mul":
        return (lambda gate, up: gate * torch.sigmoid(gate) * up), ["gate", "up"]
    return (lambda logp: torch.exp(inputs["ref_logp"].double() - logp) - (inputs["ref_logp"].double() - logp) - 1,
            ["logp"])


ELEMENTWISE_CASES = [(op, i, make) for op, i, make in GOLDEN if op in ("rms_norm", "silu_mul", "kl_k3")]


@pytest.mark.parametrize(("op", "name", "make"), ELEMENTWISE_CASES, ids=[i for _, i, _ in ELEMENTWISE_CASES])
def test_accuracy_rowwise_backwards_vs_float64_within_1e_2_rel_l2(op: str, name: str, make: Any) -> None:
    """Accuracy, not bits: the gradients of rms_norm, silu_mul and kl_k3 through autograd against float64
    autograd of the same math. Tolerance: relative L2 <= 1e-2 (bf16 outputs sit near 2e-3; fp32 near 1e-7)."""
    inputs = make()
    fn64, names = _elementwise_float64(op, inputs)
    leaves = {n: inputs[n].detach().clone().requires_grad_(True) for n in names}
    out = public_op(op)(**{**inputs, **leaves})
    gy = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.dtype)
    out.backward(gy)
    truth = {n: inputs[n].detach().to(torch.float64).requires_grad_(True) for n in names}
    fn64(**truth).backward(gy.to(torch.float64))
    for n in names:
        got, ref = leaves[n].grad, truth[n].grad
        assert got is not None and ref is not None and got.dtype == leaves[n].dtype
        err = _rel_l2(got, ref)
        assert err <= 1e-2, f"{name} d{n}: relative L2 error {err:.2e} > 1e-2"
