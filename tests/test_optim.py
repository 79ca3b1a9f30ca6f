"""AdamW through contract ``adamw``, its host scalars, and exact-norm gradient clipping (rlkernel.rl.optim)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch
from qwen3_tiny import assert_same_bits

from rlkernel.contracts import adamw as contract
from rlkernel.ops import _optim_scalars, adamw, sgd
from rlkernel.rl import SGD, AdamW, clip_grad_norm_, grad_norm

NAMES = ("b1", "c1", "b2", "c2", "eps", "decay", "step_size", "bc2_sqrt")


def test_host_scalars_are_the_exact_values_rounded_once() -> None:
    """The product's integer/interval arithmetic against the reference's exact fractions."""
    r = random.Random(7)
    for _ in range(400):
        step = r.choice([1, 2, 3, 10, 999, r.randrange(1, 5000)])
        args = (step, r.choice([1e-6, 3e-4, r.random() * 1e-2, r.random() * 10]), r.choice([0.9, 0.0, r.random()]),
                r.choice([0.999, 0.95, r.random(), 1 - 2**-53]), r.choice([1e-8, r.random() * 1e-5]),
                r.choice([0.0, 0.01, r.random() * 2]))
        ours = _optim_scalars.host_scalars(*args)
        ref = contract.host_scalars(*args)
        assert list(ours) == [ref[n] for n in NAMES], args


def test_rounding_helpers_at_ties_subnormals_and_overflow() -> None:
    rn32 = _optim_scalars.rn32
    assert rn32(1 + 2**24, 2**24) == 1.0  # halfway between 1 and 1 + 2**-23: even
    assert rn32(2**24 + 3, 2**24) == 1 + 2**-22  # halfway, rounds up to even
    assert rn32(1, 2**149) == 2.0**-149 and rn32(1, 2**150) == 0.0 and rn32(3, 2**151) == 2.0**-149
    assert rn32(2**128 - 2**103, 1) == math.inf and rn32(2**128 - 2**103 - 1, 1) == (2 - 2**-23) * 2.0**127
    assert rn32(-3, 2) == -1.5
    assert _optim_scalars.rn32_sqrt(9, 4) == 1.5
    for n, d in ((2, 1), (1, 3), (10**30 + 7, 3), (5, 10**20)):
        y = Fraction(_optim_scalars.rn32_sqrt(n, d))
        ulp = Fraction(2) ** (math.frexp(float(y))[1] - 24)
        assert abs(y * y - Fraction(n, d)) <= 2 * y * ulp / 2 + ulp * ulp  # within half an ulp of the root


def test_step_at_huge_step_counts_is_fast_and_exact() -> None:
    s = _optim_scalars.host_scalars(2**31 - 1, 1e-3, 0.9, 0.999, 1e-8, 0.01)
    assert s[6] == float(torch.tensor(1e-3, dtype=torch.float32)) and s[7] == 1.0


def _state(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 0.02, torch.randn(n, generator=g) * 1e-3,
            torch.randn(n, generator=g) * 1e-4, (torch.randn(n, generator=g) * 1e-3) ** 2)


def test_op_is_close_to_torch_adamw() -> None:
    """Labelled accuracy check (not bits): the same algorithm as torch's, rounded in a fixed order."""
    p, g, m, v = _state(4096, 0)
    tp = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([tp], lr=1e-3, weight_decay=0.1)
    opt.state[tp] = {"step": torch.tensor(4.0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    tp.grad = g.clone()
    opt.step()
    p2, m2, v2 = adamw(p, g, m, v, step=5, lr=1e-3, weight_decay=0.1)
    upd, t_upd = p2.double() - p.double(), tp.detach().double() - p.double()
    assert float((upd - t_upd).norm() / t_upd.norm()) < 1e-5
    assert torch.allclose(m2, opt.state[tp]["exp_avg"], rtol=1e-6, atol=1e-6 * float(m2.abs().max()))  # cancellation
    assert torch.allclose(v2, opt.state[tp]["exp_avg_sq"], rtol=1e-6, atol=0)


def test_optimizer_matches_the_op_and_keeps_fp32_masters_for_bf16() -> None:
    torch.manual_seed(0)
    w32 = torch.nn.Parameter(torch.randn(8, 16) * 0.02)
    w16 = torch.nn.Parameter((torch.randn(32) * 0.02).to(torch.bfloat16))
    opt = AdamW([w32, w16], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    master = w16.detach().float()
    p32, m32, v32 = w32.detach().clone(), torch.zeros(8, 16), torch.zeros(8, 16)
    m16, v16 = torch.zeros(32), torch.zeros(32)
    for step in range(1, 4):
        g32, g16 = torch.randn(8, 16) * 1e-2, (torch.randn(32) * 1e-2).to(torch.bfloat16)
        w32.grad, w16.grad = g32.clone(), g16.clone()
        opt.step()
        p32, m32, v32 = adamw(p32, g32, m32, v32, step=step, lr=1e-3, beta2=0.95, weight_decay=0.1)
        master, m16, v16 = adamw(master, g16, m16, v16, step=step, lr=1e-3, beta2=0.95, weight_decay=0.1)
    assert_same_bits(p32, w32.detach(), "fp32 parameter")
    assert_same_bits(master, opt.state[w16]["master"], "bf16 parameter's fp32 master")
    assert_same_bits(master.to(torch.bfloat16), w16.detach(), "bf16 parameter = its master rounded")
    assert opt.state[w16]["step"] == 3
    # a parameter without a gradient is skipped; state_dict round trip
    w32.grad = w16.grad = None
    before = (w32.detach().clone(), w16.detach().clone())
    opt.step()
    assert torch.equal(before[0], w32.detach()) and torch.equal(before[1], w16.detach())
    opt2 = AdamW([torch.nn.Parameter(w32.detach().clone()), torch.nn.Parameter(w16.detach().clone())], lr=1e-3)
    opt2.load_state_dict(opt.state_dict())
    assert opt2.state_dict()["state"][1]["step"] == 3


def test_grad_norm_is_exact_and_order_free() -> None:
    g = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (1000, 7, 4096)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * torch.logspace(-6, 6, p.numel())
    norm = grad_norm(params)
    truth = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in params))
    assert abs(norm - truth) / truth < 2**-23
    # the same values in other tensors and orders give the same fp32 bits
    flat = torch.cat([p.grad for p in params])
    perm = torch.randperm(flat.numel(), generator=g)
    pieces = [torch.nn.Parameter(torch.zeros(k)) for k in (3000, 2103)]
    pieces[0].grad, pieces[1].grad = flat[perm][:3000].clone(), flat[perm][3000:].clone()
    assert grad_norm(pieces) == norm and grad_norm(list(reversed(params))) == norm


def test_grad_norm_row_layout_changes_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradients are summed in rows of NORM_ROW squares and a shorter tail row: any row length gives the same bits."""
    import rlkernel.rl.optim as optim_mod

    g = torch.Generator().manual_seed(5)
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (1000, 7, 4096, 64)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * torch.logspace(-20, 20, p.numel())
    norm = grad_norm(params)
    for row in (64, 7, 1):
        monkeypatch.setattr(optim_mod, "NORM_ROW", row)
        assert grad_norm(params) == norm
    # small gradients go through concatenated buckets: any bucket size (each alone, some joined, all in one)
    for bucket in (1, 1100, 5000, 1 << 30):
        monkeypatch.setattr(optim_mod, "NORM_BUCKET", bucket)
        assert grad_norm(params) == norm


def test_clip_grad_norm_scales_like_torch() -> None:
    g = torch.Generator().manual_seed(4)
    ours = [torch.nn.Parameter(torch.zeros(300)) for _ in range(2)]
    theirs = [torch.nn.Parameter(torch.zeros(300)) for _ in range(2)]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn(300, generator=g)
        b.grad = a.grad.clone()
    norm = clip_grad_norm_(ours, 1.0)
    tnorm = torch.nn.utils.clip_grad_norm_(theirs, 1.0)
    assert abs(norm - float(tnorm)) / norm < 1e-6
    for a, b in zip(ours, theirs):
        assert torch.allclose(a.grad, b.grad, rtol=1e-6, atol=0)
    assert abs(grad_norm(ours) - 1.0) < 1e-6
    # below the bound nothing changes
    before = [p.grad.clone() for p in ours]
    clip_grad_norm_(ours, 10.0)
    assert all(torch.equal(b, p.grad) for b, p in zip(before, ours))
    with pytest.raises(ValueError, match="max_norm"):
        clip_grad_norm_(ours, 0.0)


def test_clip_scales_each_gradient_by_one_rounding() -> None:
    """fp32 gradients (scaled in one multi-tensor call) and bf16 ones: RN_dtype(RN32(fp32(g) * coef)), bit for bit."""
    from rlkernel.rl.optim import clip_coefficient

    g = torch.Generator().manual_seed(6)
    params = [torch.nn.Parameter(torch.zeros(n, dtype=dt)) for n, dt in
              ((300, torch.float32), (77, torch.bfloat16), (5, torch.float32), (40, torch.float16))]
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * torch.logspace(-30, 3, p.numel())).to(p.dtype)
    before = [p.grad.clone() for p in params]
    norm = clip_grad_norm_(params, 0.5)
    coef = clip_coefficient(norm, 0.5)
    assert coef < 1.0
    for b, p in zip(before, params):
        assert torch.equal(p.grad, torch.mul(b.to(torch.float32), coef).to(b.dtype))


@pytest.mark.parametrize(("kw", "match"), [
    ({"step": 0}, "step = 0"), ({"lr": -1.0}, "lr = -1.0"), ({"beta1": 1.0}, "beta1 = 1.0"),
    ({"eps": 0.0}, "eps = 0.0"), ({"weight_decay": float("nan")}, "weight_decay = nan"),
])
def test_bad_hyper_parameters_say_what_is_expected(kw: dict, match: str) -> None:
    p, g, m, v = _state(8, 1)
    args = {"step": 1, "lr": 1e-3, **kw}
    with pytest.raises(ValueError, match=match):
        adamw(p, g, m, v, **args)


def test_bad_tensors_say_what_is_expected() -> None:
    p, g, m, v = _state(8, 1)
    with pytest.raises(TypeError, match="param has dtype bfloat16"):
        adamw(p.bfloat16(), g, m, v, step=1, lr=1e-3)
    with pytest.raises(ValueError, match="exp_avg has shape"):
        adamw(p, g, m[:4], v, step=1, lr=1e-3)


def test_sgd_optimizer_matches_the_op_and_torch() -> None:
    """Bits against the op; a labelled closeness check against torch.optim.SGD (Nesterov, decay)."""
    torch.manual_seed(1)
    w = torch.nn.Parameter(torch.randn(500) * 0.02)
    tw = torch.nn.Parameter(w.detach().clone())
    opt = SGD([w], lr=1e-2, momentum=0.9, weight_decay=1e-4, nesterov=True)
    topt = torch.optim.SGD([tw], lr=1e-2, momentum=0.9, weight_decay=1e-4, nesterov=True)
    p, buf = w.detach().clone(), torch.zeros(500)
    for step in range(1, 5):
        g = torch.randn(500) * 1e-3
        w.grad, tw.grad = g.clone(), g.clone()
        opt.step()
        topt.step()
        p, buf = sgd(p, g, buf, step=step, lr=1e-2, momentum=0.9, weight_decay=1e-4, nesterov=True)
    assert_same_bits(p, w.detach(), "SGD parameter")
    assert_same_bits(buf, opt.state[w]["momentum_buffer"], "SGD momentum buffer")
    upd, t_upd = p.double() - tw.detach().double(), tw.detach().double()
    assert float(upd.norm() / t_upd.norm()) < 1e-6
    with pytest.raises(ValueError, match="nesterov needs momentum > 0"):
        sgd(p, p, p, step=1, lr=0.1, nesterov=True)


def test_adamw_in_chunks_keeps_every_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The generic kernel splits large tensors (bounded temporaries); elementwise, so no bit moves."""
    from rlkernel.backends.generic import optim

    p, g, m, v = _state(10_000, 5)
    whole = adamw(p, g, m, v, step=3, lr=1e-3)
    monkeypatch.setattr(optim, "CHUNK", 999)
    chunked = adamw(p, g, m, v, step=3, lr=1e-3)
    for a, b, name in zip(whole, chunked, ("param", "exp_avg", "exp_avg_sq")):
        assert_same_bits(a, b, f"chunked {name}")
