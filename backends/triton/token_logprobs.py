"""``token_logprobs`` on Triton: LM head + log-softmax + gather (contract ``token_logprobs`` v1).

The [T, V] logits are never held whole: tokens are taken in chunks whose fp32 logits
[chunk, V] fit in ``LOGITS_BUDGET`` bytes (128 MiB: 128 tokens of a 151936-word vocabulary).
Per chunk:

- ``linear.logits``: the chunk's logits exactly as ``linear`` makes them (int8 digit products
  of the hidden rows' digit planes with the bf16/fp16 weight, whose digits are made in
  registers on the weight-row exponents of a pre-pass; or (``linear.LOGITS_PLANES_MIN_CALLS``, 2),
  where the target's vendor GEMM takes the chunks and there are several
  (``linear.logits_weight``: sm_90, more than 128 tokens at Qwen3's vocabulary), with the weight's
  digit planes made once in that pre-pass), fp32;
- ``_tlp_rows_kernel``, one program per token: ``z = y ÷ fp32(tau)`` (IEEE division); the R5
  max as an integer order key plus a NaN flag; then ``S = sum RNE(exp_c(z - m) * 2**40)`` in
  int64 and the target logit's bit pattern (an int32 sum: exactly one column holds it);
- a finish kernel computes ``(z_t - m) - log_c(ldexp_c(int_to_fp32(S), -40))``.

Each logit is computed once (the whole op runs both passes over the stored row, PHASE 3).
Extra memory: the chunk's logits, its hidden digit planes and O(T) integers; with the vendor GEMM,
the weight's digit planes too (3 bytes a weight element, whatever T). The same kernels
serve the vocabulary-sharded sub-ops ``token_logprobs_partial`` (PHASE 1, then PHASE 2 with the
global max: the logits are made once per phase) and ``token_logprobs_finish``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlkernel import dispatch

from . import _tl_exact as E
from . import linear as L
from ._common import LAUNCH, cdiv, f32_bits, next_pow2
from .targets import TritonTarget

MAX_VOCAB = 1 << 22
#: bytes of fp32 logits one token chunk may hold ([chunk, V])
LOGITS_BUDGET = 128 << 20
#: (BLOCK, num_warps) of the per-token pass over a stored logits row: wide, because a short chunk
#: (decode: one token) is a handful of programs, each streaming a 600 KB row twice (eb11ee3)
ROW_TILE = (4096, 16)


@triton.jit
def row_max_key(y_row, V, tau, BLOCK: tl.constexpr):
    """``(key, nan)`` of a stored logits row ``÷ tau``: the R5 max of its non-NaN entries as an integer order
    key (``_tl_exact.max_key``) and 1 if an entry is NaN, else 0 (int32 scalars)."""
    cols = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -2147483647, tl.int32)
    nanf = tl.zeros([BLOCK], tl.int32)
    for v0 in range(0, V, BLOCK):
        valid = v0 + cols < V
        z = tl.math.div_rn(tl.load(y_row + v0 + cols, mask=valid, other=0.0), tau)
        nan = E.is_nan(z)
        best = tl.maximum(best, tl.where(valid & ~nan, E.max_key(z), -2147483647))
        nanf = tl.maximum(nanf, (valid & nan).to(tl.int32))
    return tl.max(best, axis=0), tl.max(nanf, axis=0)


@triton.jit
def _tlp_rows_kernel(y_ptr, stride_y, tgt_ptr, m_ptr, key_ptr, nan_ptr, sum_ptr, zt_ptr, bad_ptr,
                     row0, V, vocab_start, tau_bits, PHASE: tl.constexpr, BLOCK: tl.constexpr):
    """One token of a chunk: its stored logits row (``linear``'s fp32 epilogue) ``÷ fp32(tau)``.

    PHASE 1: the R5 max as an integer order key and a NaN flag. PHASE 2: for the given max ``m``,
    ``S = sum RNE(exp_c(z - m) * 2**40)`` (int64), the target logit's bits (an int32 sum: one
    column holds it) and whether a logit lies above a finite ``m``. PHASE 3: both (the max is
    written as fp32 to ``m_ptr``). Outputs are indexed by the global token ``row0 + program``.
    """
    r = tl.program_id(0)
    row = row0 + r
    y_row = y_ptr + r.to(tl.int64) * stride_y
    tau = tau_bits.to(tl.float32, bitcast=True)
    cols = tl.arange(0, BLOCK)
    if PHASE != 2:
        key, flag = row_max_key(y_row, V, tau, BLOCK)
        if PHASE == 1:
            tl.store(key_ptr + row, key)
            tl.store(nan_ptr + row, flag)
        m = E.key_to_f32(key)
        m = tl.where(flag != 0, E.canonical_nan_f32(m), m)
        if PHASE == 3:
            tl.store(m_ptr + row, m)
    else:
        m = tl.load(m_ptr + row)
    if PHASE != 1:
        finite = E.is_finite(m)
        m_safe = tl.where(finite, m, 0.0)
        local = tl.load(tgt_ptr + row) - vocab_start
        s = tl.zeros([BLOCK], tl.int64)
        zt = tl.zeros([BLOCK], tl.int32)
        badf = tl.zeros([BLOCK], tl.int32)
        for v0 in range(0, V, BLOCK):
            rn = v0 + cols
            valid = rn < V
            z = tl.math.div_rn(tl.load(y_row + rn, mask=valid, other=0.0), tau)
            p = E.exp_c(z - m_safe)
            s += tl.where(valid, E.to_fixed(p, 0, 40), 0)
            above = valid & finite & ~(z <= m_safe)
            badf = tl.maximum(badf, above.to(tl.int32))
            zt += tl.where(valid & (rn == local), E.f32_bits(z), 0)
        tl.store(sum_ptr + row, tl.sum(s, axis=0))
        tl.store(zt_ptr + row, tl.sum(zt, axis=0))
        tl.store(bad_ptr + row, tl.max(badf, axis=0))


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


def _token_chunk(t: int, v: int) -> int:
    """Tokens per chunk: the chunk's fp32 logits [chunk, V] stay within LOGITS_BUDGET bytes;
    a multiple of the GEMM's 128-row tile where the budget allows."""
    if L.SMALL_TILES:
        return 16
    rows = max(16, LOGITS_BUDGET // max(1, 4 * v))
    rows = rows // 128 * 128 if rows >= 128 else rows // 16 * 16
    return max(16, min(rows, next_pow2(t)))


def _key_to_f32(key: torch.Tensor, nan: torch.Tensor) -> torch.Tensor:
    """Integer glue: order key -> fp32 bits (a zero key is +0), canonical NaN where flagged."""
    bits = torch.where(key < 0, (-key) | torch.iinfo(torch.int32).min, key)
    bits = torch.where(nan != 0, torch.full_like(bits, 0x7FC00000), bits)
    return bits.view(torch.float32)


class _Plan:
    """The weight rows' exponents, the token chunking, and the passes over each chunk's logits."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, temperature: float, target: TritonTarget):
        self.t, self.k = hidden.shape
        self.v = weight.shape[0]
        self.hidden, self.weight = hidden, weight
        self.target = target
        self.tau_bits = f32_bits(temperature)
        self.chunk = _token_chunk(self.t, self.v)
        self.wd, self.ew = L.logits_weight(weight, min(self.chunk, self.t), cdiv(self.t, self.chunk), target=target)

    def launch(self, phase: int, targets: torch.Tensor | None = None, m: torch.Tensor | None = None,
               vocab_start: int = 0) -> tuple[torch.Tensor, ...]:
        """PHASE 1 -> (row max fp32,); 2 -> (S int64, target logit fp32, above-max flags);
        3 -> (row max, S, target logit)."""
        dev = self.hidden.device
        i32 = torch.int32
        key = torch.empty(self.t, dtype=i32, device=dev) if phase == 1 else None
        nan = torch.empty(self.t, dtype=i32, device=dev) if phase == 1 else None
        s = torch.empty(self.t, dtype=torch.int64, device=dev) if phase != 1 else None
        zt = torch.empty(self.t, dtype=i32, device=dev) if phase != 1 else None
        bad = torch.empty(self.t, dtype=i32, device=dev) if phase != 1 else None
        if phase == 3:
            m = torch.empty(self.t, dtype=torch.float32, device=dev)
        any_out = next(x for x in (key, s) if x is not None)
        tgt = targets if targets is not None else any_out
        block, warps = (32, 1) if L.SMALL_TILES else ROW_TILE
        for t0 in range(0, self.t, self.chunk):
            rows = min(self.chunk, self.t - t0)
            y = L.logits(self.hidden[t0:t0 + rows], self.weight, self.ew, target=self.target,
                         wd=self.wd)  # [rows, V] fp32
            _tlp_rows_kernel[(rows,)](
                y, y.stride(0), tgt, m if m is not None else y, key if key is not None else any_out,
                nan if nan is not None else any_out, s if s is not None else any_out,
                zt if zt is not None else any_out, bad if bad is not None else any_out,
                t0, self.v, vocab_start, self.tau_bits, PHASE=phase, BLOCK=block, num_warps=warps, **LAUNCH)
            del y  # the next chunk reuses its memory: one chunk of logits at a time
        if phase == 1:
            assert key is not None and nan is not None
            return (_key_to_f32(key, nan),)
        assert s is not None and zt is not None and bad is not None and m is not None
        if phase == 2:
            return s, zt.view(torch.float32), bad
        return m, s, zt.view(torch.float32)


def _finish(mode: int, zt: torch.Tensor, m: torch.Tensor | None, s: torch.Tensor | None,
            owner: torch.Tensor | None) -> torch.Tensor:
    t = zt.shape[0]
    out = torch.empty(t, dtype=torch.float32, device=zt.device)
    if t == 0:
        return out
    block = 1024
    _tlp_finish_kernel[(cdiv(t, block),)](
        zt.contiguous(), m if m is not None else zt, s.contiguous() if s is not None else zt,
        owner if owner is not None else zt, out, t, MODE=mode, BLOCK=block, num_warps=4, **LAUNCH)
    return out


def token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                   temperature: float = 1.0, *, target: TritonTarget) -> torch.Tensor:
    """Kernel ``token_logprobs``: hidden [T, H], weight [V, H] (bf16/fp16), targets int64 [T] -> fp32 [T]."""
    t, v = hidden.shape[0], weight.shape[0]
    if v > MAX_VOCAB:
        raise ValueError(f"token_logprobs: vocab={v} exceeds the exact-sum bound 2**22 for int64 accumulation; "
                         f"shard the vocabulary (token_logprobs_partial)")
    if t == 0:
        return torch.empty(0, dtype=torch.float32, device=hidden.device)
    dispatch.note_kernel("triton-fused-int8")
    m, s, zt = _Plan(hidden, weight, temperature, target).launch(3, targets=targets.contiguous())
    return _finish(0, zt, m, s, None)


def token_logprobs_partial(hidden: torch.Tensor, weight_shard: torch.Tensor, targets: torch.Tensor,
                           vocab_start: int, temperature: float = 1.0, row_max: torch.Tensor | None = None, *,
                           target: TritonTarget) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Kernel ``token_logprobs_partial``: phase 1 (row_max None) the shard's R5 row max fp32 [T];
    phase 2 ``(sum_int int64 [T], target_d fp32 [T])`` for the global row max."""
    t, vs = hidden.shape[0], weight_shard.shape[0]
    dev = hidden.device
    if t == 0 or vs == 0:
        if row_max is None:
            return torch.zeros(t, dtype=torch.float32, device=dev)
        return torch.zeros(t, dtype=torch.int64, device=dev), torch.zeros(t, dtype=torch.float32, device=dev)
    dispatch.note_kernel("triton-fused-int8")
    plan = _Plan(hidden, weight_shard, temperature, target)
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


def static_specs(target: TritonTarget):
    specs = []
    for phase in (1, 2, 3):
        specs.append(("token_logprobs", f"rows_phase{phase}", _tlp_rows_kernel,
                      {"y_ptr": "*fp32", "stride_y": "i64", "tgt_ptr": "*i64", "m_ptr": "*fp32", "key_ptr": "*i32",
                       "nan_ptr": "*i32", "sum_ptr": "*i64", "zt_ptr": "*i32", "bad_ptr": "*i32", "row0": "i32",
                       "V": "i32", "vocab_start": "i64", "tau_bits": "i32", "PHASE": "constexpr",
                       "BLOCK": "constexpr"},
                      {"PHASE": phase, "BLOCK": ROW_TILE[0]}, {"num_warps": ROW_TILE[1]}))
    for mode in (0, 1, 2):
        specs.append(("token_logprobs", f"finish_mode{mode}", _tlp_finish_kernel,
                      {"zt_ptr": "*fp32", "m_ptr": "*fp32", "sum_ptr": "*i64", "owner_ptr": "*i32",
                       "out_ptr": "*fp32", "T": "i32", "MODE": "constexpr", "BLOCK": "constexpr"},
                      {"MODE": mode, "BLOCK": 1024}))
    return specs
