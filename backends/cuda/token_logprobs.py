"""``token_logprobs`` on Triton: fused LM head + log-softmax + gather (contract ``token_logprobs`` v1).

The [T, V] logits never exist in memory. The vocabulary is cut into ``splits`` ranges; a program
owns (a block of BLOCK_M tokens, one vocabulary range) and walks it in BLOCK_N tiles, each tile
of logits made exactly as in ``linear`` (int8 digit products of the hidden digit planes with the
bf16/fp16 weight tile, whose digits are made in registers on the weight-row grids of a
pre-pass), then ``z = z ÷ fp32(tau)`` (IEEE division):

- pass 1 keeps each token's R5 max as an integer order key plus a NaN flag; the keys of the
  ranges are combined with an integer max (exact, any order);
- pass 2 recomputes the tiles and adds ``RNE(exp_c(z - m) * 2**40)`` into an int64 per token
  and picks the target logit's bit pattern (int32 sum: exactly one tile holds it); range
  partials are added as integers;
- a finish kernel computes ``(z_t - m) - log_c(ldexp_c(int_to_fp32(S), -40))``.

Extra memory: O(splits * T) integers. The same kernels serve the vocabulary-sharded sub-ops
``token_logprobs_partial`` (phase 1 / phase 2) and ``token_logprobs_finish``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch

from . import _tl_exact as E
from . import linear as L
from ._common import LAUNCH, f32_bits

MAX_VOCAB = 1 << 22
#: target number of programs (2 per SM on an H100/H200)
TARGET_PROGRAMS = 264
INT32_MIN_KEY = -2147483647


@triton.jit
def _tlp_pass_kernel(xd_ptr, w_ptr, ex_ptr, ew_ptr, tgt_ptr, m_ptr, key_ptr, nan_ptr, sum_ptr, zt_ptr, bad_ptr,
                     T, V, K, x_plane, stride_wn, stride_wk, vocab_start, tau_bits, v_per_split,
                     PHASE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     K_CHUNK: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = rm < T
    ex = tl.load(ex_ptr + rm, mask=m_ok, other=0).to(tl.int32)
    x_live = ex != 1048576
    tau = tau_bits.to(tl.float32, bitcast=True)
    lo = pid_s * v_per_split
    hi = tl.minimum(lo + v_per_split, V)
    out_offs = pid_s * T + rm
    if PHASE == 1:
        best = tl.full([BLOCK_M], -2147483647, tl.int32)
        nanf = tl.zeros([BLOCK_M], tl.int32)
    else:
        m = tl.load(m_ptr + rm, mask=m_ok, other=0.0)
        finite = E.is_finite(m)
        m_safe = tl.where(finite, m, 0.0)
        local = tl.load(tgt_ptr + rm, mask=m_ok, other=0) - vocab_start
        s = tl.zeros([BLOCK_M], tl.int64)
        zt = tl.zeros([BLOCK_M], tl.int32)
        badf = tl.zeros([BLOCK_M], tl.int32)
    for v0 in range(lo, hi, BLOCK_N):
        rn = v0 + tl.arange(0, BLOCK_N)
        n_ok = rn < hi
        ew = tl.load(ew_ptr + rn, mask=n_ok, other=0).to(tl.int32)
        w_live = ew != 1048576
        acc = L._digit_tile(xd_ptr, x_plane, rm, m_ok, w_ptr, 0, rn, n_ok, tl.where(w_live, ew, 0), w_live, K,
                            stride_wn, stride_wk, False, BLOCK_M, BLOCK_N, BLOCK_K, K_CHUNK, 0, K)
        z = tl.math.div_rn(L._logit_tile(acc, ex, ew, x_live, w_live), tau)
        valid = m_ok[:, None] & n_ok[None, :]
        nan = E.is_nan(z)
        if PHASE == 1:
            keys = tl.where(valid & ~nan, E.max_key(z), -2147483647)
            best = tl.maximum(best, tl.max(keys, axis=1))
            nanf = tl.maximum(nanf, tl.max((valid & nan).to(tl.int32), axis=1))
        else:
            p = E.exp_c(z - m_safe[:, None])
            s += tl.sum(tl.where(valid, E.to_fixed(p, 0, 40), 0), axis=1)
            above = valid & finite[:, None] & ~(z <= m_safe[:, None])
            badf = tl.maximum(badf, tl.max(above.to(tl.int32), axis=1))
            hit = valid & (rn[None, :] == local[:, None])
            zt += tl.sum(tl.where(hit, E.f32_bits(z), 0), axis=1)
    if PHASE == 1:
        tl.store(key_ptr + out_offs, best, mask=m_ok)
        tl.store(nan_ptr + out_offs, nanf, mask=m_ok)
    else:
        tl.store(sum_ptr + out_offs, s, mask=m_ok)
        tl.store(zt_ptr + out_offs, zt, mask=m_ok)
        tl.store(bad_ptr + out_offs, badf, mask=m_ok)


@triton.jit
def _tlp_finish_kernel(zt_ptr, m_ptr, sum_ptr, owner_ptr, out_ptr, T, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """MODE 0: the whole op; MODE 1: phase-2 ``target_d``; MODE 2: ``token_logprobs_finish``."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < T
    zt = tl.load(zt_ptr + offs, mask=mask, other=0.0)
    if MODE == 2:
        d = zt
    else:
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        d = tl.where(E.is_finite(m), zt - m, E.canonical_nan_f32(zt))
    if MODE == 1:
        owner = tl.load(owner_ptr + offs, mask=mask, other=0)
        tl.store(out_ptr + offs, E.nan_to_canonical(tl.where(owner != 0, d, 0.0)), mask=mask)
    else:
        s = tl.load(sum_ptr + offs, mask=mask, other=0)
        total = E.ldexp_c(E.int64_to_f32(s), -40)
        tl.store(out_ptr + offs, E.nan_to_canonical(d - E.log_c(total)), mask=mask)


def _tiles(t: int) -> tuple[int, int, int, int]:
    if L.SMALL_TILES:
        return 16, 16, 32, 1
    if t <= 16:
        return 16, 64, 128, 4
    return 64, 64, 128, 4


def _key_to_f32(key: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """Integer glue: order key -> fp32 bits (a zero key is +0), canonical NaN where flagged."""
    bits = torch.where(key < 0, (-key) | torch.iinfo(torch.int32).min, key)
    bits = torch.where(nan != 0, torch.full_like(bits, 0x7FC00000), bits)
    return bits.view(torch.float32)


class _Plan:
    """Digits of the hidden rows, exponents of the weight rows, and the launch geometry."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, temperature: float):
        self.t, self.k = hidden.shape
        self.v = weight.shape[0]
        self.hidden, self.weight = hidden, weight
        self.xd, self.ex = L._digits(hidden)
        _, self.ew = L._digits(weight, write=False)
        self.tau_bits = f32_bits(temperature)
        self.bm, self.bn, self.bk, self.warps = _tiles(self.t)
        m_blocks = triton.cdiv(self.t, self.bm)
        v_tiles = max(1, triton.cdiv(self.v, self.bn))
        self.splits = max(1, min(v_tiles, triton.cdiv(TARGET_PROGRAMS, m_blocks)))
        self.v_per_split = triton.cdiv(v_tiles, self.splits) * self.bn
        self.splits = triton.cdiv(max(self.v, 1), self.v_per_split)
        self.grid = (m_blocks, self.splits)

    def launch(self, phase: int, targets: torch.Tensor | None = None, m: torch.Tensor | None = None,
               vocab_start: int = 0) -> tuple[torch.Tensor, ...]:
        dev = self.hidden.device
        shape = (self.splits, self.t)
        if phase == 1:
            key = torch.empty(shape, dtype=torch.int32, device=dev)
            nan = torch.empty(shape, dtype=torch.int32, device=dev)
            outs = (key, nan, key, key, key)
        else:
            s = torch.empty(shape, dtype=torch.int64, device=dev)
            zt = torch.empty(shape, dtype=torch.int32, device=dev)
            bad = torch.empty(shape, dtype=torch.int32, device=dev)
            outs = (s, s, s, zt, bad)
        tgt = targets if targets is not None else self.ex
        mm = m if m is not None else self.ex
        _tlp_pass_kernel[self.grid](
            self.xd, self.weight, self.ex, self.ew, tgt, mm, outs[0], outs[1], outs[2], outs[3], outs[4],
            self.t, self.v, self.k, self.t * self.k, self.weight.stride(0), self.weight.stride(1), vocab_start,
            self.tau_bits, self.v_per_split, PHASE=phase, BLOCK_M=self.bm, BLOCK_N=self.bn, BLOCK_K=self.bk,
            K_CHUNK=L.K_CHUNK, num_warps=self.warps, num_stages=2, **LAUNCH)
        if phase == 1:
            return (_key_to_f32(outs[0].amax(dim=0), outs[1].amax(dim=0)),)
        return outs[0].sum(dim=0), outs[3].sum(dim=0, dtype=torch.int32).view(torch.float32), outs[4].amax(dim=0)


def _finish(mode: int, zt: torch.Tensor, m: torch.Tensor | None, s: torch.Tensor | None,
            owner: torch.Tensor | None) -> torch.Tensor:
    t = zt.shape[0]
    out = torch.empty(t, dtype=torch.float32, device=zt.device)
    if t == 0:
        return out
    block = 1024
    _tlp_finish_kernel[(triton.cdiv(t, block),)](
        zt.contiguous(), m if m is not None else zt, s.contiguous() if s is not None else zt,
        owner if owner is not None else zt, out, t, MODE=mode, BLOCK=block, num_warps=4, **LAUNCH)
    return out


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """Kernel ``token_logprobs``: hidden [T, H], weight [V, H] (bf16/fp16), targets int64 [T] -> fp32 [T]."""
    t, v = hidden.shape[0], weight.shape[0]
    if v > MAX_VOCAB:
        raise ValueError(f"token_logprobs: vocab={v} exceeds the exact-sum bound 2**22 for int64 accumulation; "
                         f"shard the vocabulary (token_logprobs_partial)")
    if t == 0:
        return torch.empty(0, dtype=torch.float32, device=hidden.device)
    dispatch.note_kernel("triton-fused-int8")
    plan = _Plan(hidden, weight, temperature)
    (m,) = plan.launch(1)
    s, zt, _ = plan.launch(2, targets=targets.contiguous(), m=m)
    return _finish(0, zt, m, s, None)


def token_logprobs_partial(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                           vocab_start: int, temperature: float = 1.0,
                           row_max: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``token_logprobs_partial``: phase 1 (row_max None) the shard's R5 row max fp32 [T];
    phase 2 ``(sum_int int64 [T], target_d fp32 [T])`` for the global row max."""
    t, vs = hidden.shape[0], weight_shard.shape[0]
    dev = hidden.device
    if t == 0 or vs == 0:
        if row_max is None:
            return torch.zeros(t, dtype=torch.float32, device=dev)
        return torch.zeros(t, dtype=torch.int64, device=dev), torch.zeros(t, dtype=torch.float32, device=dev)
    dispatch.note_kernel("triton-fused-int8")
    plan = _Plan(hidden, weight_shard, temperature)
    if row_max is None:
        return plan.launch(1)[0]
    m = row_max.to(torch.float32).contiguous()
    s, zt, bad = plan.launch(2, targets=targets.contiguous(), m=m, vocab_start=vocab_start)
    if bool(bad.any()):
        raise ValueError("token_logprobs_partial: row_max is below a logit of this shard (or a logit is NaN while "
                         "row_max is finite); pass the R5 max over all shards of phase 1's outputs")
    finite = torch.isfinite(m)
    s = torch.where(finite, s, torch.zeros_like(s))
    local = targets - vocab_start
    owner = ((local >= 0) & (local < vs)).to(torch.int32)
    return s, _finish(1, zt, m, None, owner)


def token_logprobs_finish(sum_int: torch.Tensor, target_d: torch.Tensor) -> torch.Tensor:
    """Kernel ``token_logprobs_finish``: ``target_d - log_c(ldexp_c(int_to_fp32(sum_int), -40))``."""
    return _finish(2, target_d.to(torch.float32), None, sum_int, None)


def static_specs():
    specs = []
    for dt in ("bf16", "fp16"):
        for phase in (1, 2):
            ints = "*i32" if phase == 1 else "*i64"  # phase 1 stores int32 keys, phase 2 int64 sums
            specs.append(("token_logprobs", f"{dt}_pass{phase}", _tlp_pass_kernel,
                          {"xd_ptr": "*i8", "w_ptr": f"*{dt}", "ex_ptr": "*i64", "ew_ptr": "*i64", "tgt_ptr": "*i64",
                           "m_ptr": "*fp32", "key_ptr": ints, "nan_ptr": ints, "sum_ptr": ints, "zt_ptr": "*i32",
                           "bad_ptr": "*i32", "T": "i32", "V": "i32", "K": "i32", "x_plane": "i64",
                           "stride_wn": "i64", "stride_wk": "i64", "vocab_start": "i64", "tau_bits": "i32",
                           "v_per_split": "i32", "PHASE": "constexpr", "BLOCK_M": "constexpr",
                           "BLOCK_N": "constexpr", "BLOCK_K": "constexpr", "K_CHUNK": "constexpr"},
                          {"PHASE": phase, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "K_CHUNK": L.K_CHUNK}))
    for mode in (0, 1, 2):
        specs.append(("token_logprobs", f"finish_mode{mode}", _tlp_finish_kernel,
                      {"zt_ptr": "*fp32", "m_ptr": "*fp32", "sum_ptr": "*i64", "owner_ptr": "*i32",
                       "out_ptr": "*fp32", "T": "i32", "MODE": "constexpr", "BLOCK": "constexpr"},
                      {"MODE": mode, "BLOCK": 1024}))
    return specs
