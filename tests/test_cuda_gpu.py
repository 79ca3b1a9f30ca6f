"""The CUDA backend on a real NVIDIA GPU: each op's quick conformance cases, and cross-path checks.

Marked ``gpu``; skipped where torch sees no CUDA device. Run on the H200 by
``tools/device_run.sh`` (``pytest -m gpu tests -q``). The conformance run
(``rlkernel conformance --backend cuda --device cuda --full``) is the authoritative record; the
per-op tests run the quick cases through the same runner and check that every kernel that ran
was a CUDA one; the others are checks a conformance case cannot express: the decode and
prefill paths of ``linear`` agree, ``token_logprobs`` never allocates the [T, V] logits, the
split-K decode ``linear`` replays from a CUDA graph with eager's bits.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None,
                       reason="needs an NVIDIA CUDA device"),
]


def _assert_bitwise(expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    assert expected.shape == actual.shape and expected.dtype == actual.dtype, what
    if not torch.equal(expected.reshape(-1).contiguous().view(torch.uint8),
                       actual.reshape(-1).contiguous().view(torch.uint8)):  # 0-d tensors have no byte view
        raise AssertionError(f"{what}: bytes differ")


def _cuda_modules() -> list[str]:
    import importlib.util

    from rlkernel.backends.cuda import KERNELS
    from rlkernel.contracts import CONTRACT_MODULES

    return [m for m in CONTRACT_MODULES if importlib.util.find_spec(f"rlkernel.contracts.{m}") is not None
            and (m in KERNELS or any(op.startswith(m) for op in KERNELS))]


@pytest.mark.parametrize("module", _cuda_modules())
def test_cuda_quick_conformance(module: str) -> None:
    """The quick conformance cases of one op on the GPU, through the conformance runner itself
    (the full run is ``rlkernel conformance --backend cuda --full``); every kernel that ran is a
    CUDA one."""
    from rlkernel.conformance import runner

    result = runner.run(runner.RunConfig(backend="cuda", device="cuda", ops=[module], full=False,
                                             static=False))
    bad = [f"{r.case} ({r.kind}): {r.status}: {r.detail}" for r in result.records if r.failed]
    assert result.records and not bad, "\n".join(bad)
    foreign = {k for r in result.records for k in (r.kernels or []) if not k.startswith("cuda:")}
    assert not foreign, f"{module}: kernels outside the cuda backend ran: {sorted(foreign)}"


def test_triton_primitives_on_the_gpu() -> None:
    """The Triton primitives (exp_c, log_c, the grids, P3' to fp32 / bf16 / fp16 through fp64
    round-to-odd, ...) compiled for the GPU give the reference's values on the interpreter's
    inputs: the hardware's own conversions (int64 -> fp64, fp64 -> fp32) are where they could
    differ from numpy's."""
    from test_cuda_interpreter import run_primitive_checks

    failed = [f"{r['case']}: {r['detail']}" for r in run_primitive_checks("cuda") if r["status"] != "pass"]
    assert not failed, "\n".join(failed)


def test_all_reduce_overflow_count_on_the_gpu() -> None:
    """all_reduce's per-block overflow count (an int32 atomic) and the host's one read raise on the
    GPU as under the interpreter; an intermediate overflow whose total fits does not."""
    from test_cuda_interpreter import _all_reduce_overflow_check

    rec = _all_reduce_overflow_check("cuda")
    assert rec["status"] == "pass", rec["detail"]


@pytest.mark.parametrize("n, k", [(4096, 4096), (1024, 2048), (1024, 3072)])
def test_linear_decode_and_prefill_paths_agree(n: int, k: int) -> None:
    """M = 256 takes the prefill path (N = 1024: 32 output tiles, K split over programs with int64
    atomics), M <= 64 the decode path: the same bits."""
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn(256, k, generator=g, device="cuda").to(torch.bfloat16)
    x[:, 7] *= 300.0  # an outlier channel
    whole = L.linear(x, w, target=CUDA)  # prefill path (M > 64)
    for m in (1, 3, 16, 64):
        part = L.linear(x[:m], w, target=CUDA)  # decode path
        _assert_bitwise(whole[:m], part, f"linear M={m} (decode) vs M=256 (prefill)")


@pytest.mark.parametrize("m, k, n", [(16384, 1024, 4096), (1000, 1040, 1000), (77, 2064, 4097), (130, 16, 33),
                                     (300, 3072, 1024)])
def test_wgmma_digit_gemm_equals_triton(m: int, k: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """linear's sm_90 wgmma digit GEMM writes the Triton digit GEMM's int64 C, byte for byte, into
    a poisoned output (tails in M and N, odd N, K % 128 != 0), and the op through it (its own P3'
    epilogue) equals the op through Triton's kernels (RLKERNEL_WGMMA=0) for bf16 / fp16 / fp32
    outputs, biases of the three dtypes or none, non-finite rows."""
    from rlkernel import dispatch
    from rlkernel.backends.cuda import digit_gemm as D
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma digit GEMM runs on sm_90 only")
    monkeypatch.setenv(D.ENV, "1")  # on, whatever its default
    assert D.usable(torch.device("cuda"), k)
    g = torch.Generator(device="cuda").manual_seed(m + k + n)
    x = torch.randn(m, k, generator=g, device="cuda")
    x[:, :4] *= 300.0
    x = x.to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    xd, ex = L._digits(x)
    wd, ew = L._digits(w, activation=False)
    ref = torch.empty(m, n, dtype=torch.int64, device="cuda")
    L._launch_gemm(xd, ex, w, wd, ew, None, ref, k, CUDA.linear_prefill, w_digits=True, finish=False, atomic=False,
                   out_code=0)
    out = torch.full((m, n), -(2**62), dtype=torch.int64, device="cuda")
    D.digit_gemm(xd, wd, out)
    _assert_bitwise(ref, out, f"wgmma C vs Triton C, M={m} K={k} N={n}")
    if m > 256:  # the prefill path (x rows with NaN and inf, a bias, three output dtypes)
        x[1, 3], x[2, 5] = float("nan"), float("inf")
        bias16 = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)
        runs = [(torch.bfloat16, bias16), (torch.float16, bias16), (torch.float32, bias16), (torch.bfloat16, None),
                (torch.float16, None), (torch.float32, None), (torch.bfloat16, bias16.float() * 1e3),
                (torch.float32, bias16.half())]
        for out_dtype, bias in runs:
            monkeypatch.setenv(D.ENV, "1")
            got = L.linear(x, w, bias, out_dtype, target=CUDA)
            assert (dispatch.last_kernel() or "").endswith("[cuda-wgmma-int8]"), dispatch.last_kernel()
            monkeypatch.setenv(D.ENV, "0")
            want = L.linear(x, w, bias, out_dtype, target=CUDA)
            assert (dispatch.last_kernel() or "").endswith("[triton-int8]"), dispatch.last_kernel()
            what = f"linear {out_dtype}, bias {None if bias is None else bias.dtype}, through wgmma vs Triton"
            _assert_bitwise(want, got, f"{what}, M={m} K={k} N={n}")


def test_wgmma_digit_gemm_from_a_new_thread() -> None:
    """The driver-API launch works from a thread that has made no CUDA call yet (no current
    context there), on torch's stream of that thread, and gives the same C."""
    import threading

    from rlkernel.backends.cuda import digit_gemm as D

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma digit GEMM runs on sm_90 only")
    g = torch.Generator(device="cuda").manual_seed(5)
    xd = torch.randint(-64, 65, (4, 200, 256), generator=g, device="cuda", dtype=torch.int8)
    wd = torch.randint(-64, 65, (3, 96, 256), generator=g, device="cuda", dtype=torch.int8)
    here = torch.empty(200, 96, dtype=torch.int64, device="cuda")
    D.digit_gemm(xd, wd, here)
    there = torch.full((200, 96), -1, dtype=torch.int64, device="cuda")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            D.digit_gemm(xd, wd, there)
            torch.cuda.synchronize()
        except BaseException as e:  # reported by the test's thread
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    xc, wc = xd.cpu().long(), wd.cpu().long()  # torch has no integer matmul on CUDA
    want = sum((xc[a] @ wc[b].T) << (7 * (a + b)) for a in range(4) for b in range(3))
    _assert_bitwise(want, here.cpu(), "wgmma C vs int64 matmul of the planes (CPU)")
    _assert_bitwise(here, there, "wgmma C from a new thread")


def test_token_logprobs_memory_is_bounded() -> None:
    """Never the [T, V] logits: the extra memory is one token chunk's fp32 logits (each freed before the
    next is made), its hidden planes and O(T) integers (16 MiB allowed for both), and on sm_90 the
    weight's digit planes made once for the chunks (``linear.logits_weight``: 3 bytes a weight
    element, independent of T)."""
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton import token_logprobs as TL
    from rlkernel.backends.triton.targets import CUDA
    from rlkernel.backends.triton.token_logprobs import token_logprobs

    g = torch.Generator(device="cuda").manual_seed(1)
    t, h, v = 2048, 1024, 151936
    hidden = torch.randn(t, h, generator=g, device="cuda").to(torch.bfloat16)
    weight = (torch.randn(v, h, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, v, (t,), generator=g, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = token_logprobs(hidden, weight, targets, target=CUDA)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    logits_bytes = t * v * 4
    chunk = TL._token_chunk(t, v)
    planes = L.logits_planes(weight.device, v, h, chunk, -(-t // chunk), target=CUDA)  # on sm_90
    bound = chunk * v * 4 + (3 * v * h if planes else 0) + (16 << 20)
    assert extra < bound < logits_bytes, f"extra memory {extra} bytes vs bound {bound}, fp32 logits {logits_bytes}"
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("op", ["token_logprobs", "token_entropy"])
def test_logits_weight_planes_made_once_equal_the_triton_gemm(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Token chunks of more than 64 rows on sm_90 take the wgmma GEMM on the weight's digit planes made
    once for the call (``linear.logits_weight``); the same bits as every chunk through the Triton GEMM
    (digits made in registers: ``LOGITS_PLANES_MIN_CALLS`` None) and as the device-generic
    code on the GPU. Chunks of 128, 128 and 44 tokens (the last one on the decode tile), an odd
    vocabulary, outlier channels, a NaN row, temperature 0.7."""
    from rlkernel.backends.cuda import digit_gemm as D
    from rlkernel.backends.generic import token_entropy as GE
    from rlkernel.backends.generic import token_logprobs as GL
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton import token_entropy as TE
    from rlkernel.backends.triton import token_logprobs as TL
    from rlkernel.backends.triton.targets import CUDA

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma digit GEMM runs on sm_90 only")
    monkeypatch.setenv(D.ENV, "1")
    monkeypatch.setattr(L, "LOGITS_PLANES_MIN_CALLS", 2)  # on, whatever its default
    t, h, v = 300, 1024, 20001
    monkeypatch.setattr(TL, "LOGITS_BUDGET", 128 * v * 4)  # 128-token chunks
    assert TL._token_chunk(t, v) == 128
    g = torch.Generator(device="cuda").manual_seed(11)
    hidden = torch.randn(t, h, generator=g, device="cuda")
    hidden[:, :4] *= 300.0
    hidden[5, 7] = float("nan")
    hidden = hidden.to(torch.bfloat16)
    weight = (torch.randn(v, h, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    targets = torch.randint(0, v, (t,), generator=g, device="cuda")
    wd, _ = L.logits_weight(weight, 128, 3, target=CUDA)
    assert wd is not None and wd.shape == (3, v, h)
    if op == "token_logprobs":
        def run() -> torch.Tensor:
            return TL.token_logprobs(hidden, weight, targets, 0.7, target=CUDA)
        want = GL.token_logprobs(hidden, weight, targets, 0.7)
    else:
        def run() -> torch.Tensor:
            return TE.token_entropy(hidden, weight, 0.7, target=CUDA)
        want = GE.token_entropy(hidden, weight, 0.7)
    got = run()
    monkeypatch.setattr(L, "LOGITS_PLANES_MIN_CALLS", None)
    triton_only = run()
    _assert_bitwise(triton_only, got, f"{op}: weight planes + wgmma vs the Triton GEMM")
    _assert_bitwise(want, got, f"{op}: weight planes + wgmma vs the device-generic code")


def _graph_replay(fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``fn()`` captured in a CUDA graph and replayed: its output tensor after the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    return out


def test_linear_decode_captures_in_cuda_graphs() -> None:
    """The split-K decode path of ``linear`` launches without host syncs (vLLM captures decode
    steps in CUDA graphs) and replays from a graph with eager's bits."""
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    g = torch.Generator(device="cuda").manual_seed(2)
    w = (torch.randn(4096, 4096, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn(1, 4096, generator=g, device="cuda").to(torch.bfloat16)
    _assert_bitwise(L.linear(x, w, target=CUDA), _graph_replay(lambda: L.linear(x, w, target=CUDA)),
                    "linear M=1 graph replay")


def _decode_cases() -> list[tuple[str, object]]:
    from rlkernel.bench import plan
    from rlkernel.contracts import load_contracts

    cases, _ = plan(load_contracts()[0], "small")
    return [(op, case) for op, case in cases if getattr(case, "graph", False)]


@pytest.mark.parametrize("op,case", _decode_cases(), ids=lambda c: getattr(c, "name", str(c)))
def test_decode_step_ops_capture_in_cuda_graphs(op: str, case: object) -> None:
    """Every decode-step bench case (``BenchCase.graph``: the ops a rollout engine runs per decode
    step) through the public op captures in a CUDA graph (no host reads of device values, no
    syncs) and the replay gives eager's bits."""
    from rlkernel.public import public_op

    inputs = case.make(torch.device("cuda"))  # type: ignore[attr-defined]
    fn = public_op(op)
    eager = fn(**inputs)
    replayed = _graph_replay(lambda: fn(**inputs))
    pairs = zip(eager, replayed) if isinstance(eager, tuple) else [(eager, replayed)]
    for i, (e, r) in enumerate(pairs):
        _assert_bitwise(e, r, f"{op} {case.name} output {i} graph replay")  # type: ignore[attr-defined]

def _sample_rows(b: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    """[B, 151936] logits and per-row parameters cycling through greedy, plain, top-k, top-p, both,
    top-p on a row masked to 700 tokens (these finish from the gathered keys: top-k 50 and the masked
    row in the 1024-key tile, top-p 0.9 in the 4096-key one), top-p 0.999 (its set reaches past the
    4096 gathered keys) and top-k 5000 + top-p (k beyond the tile): the last two run the selection
    passes; rows 5, 6, 7 hold a NaN, a +inf, and only -inf (B >= 8)."""
    kinds = torch.arange(b, device="cuda") % 10
    x = torch.randn((b, 151936), generator=g, device="cuda") * 3.0
    x[kinds == 5, 700:] = float("-inf")
    tau = torch.where(kinds == 0, 0.0, 0.8).to(torch.float32)
    k = torch.where(kinds == 2, 50, torch.where(kinds == 4, 1000, torch.where(kinds == 9, 5000, 0))).to(torch.int64)
    p = torch.where(kinds == 3, 0.9, torch.where((kinds == 4) | (kinds == 5), 0.5, torch.where(
        kinds == 8, 0.999, torch.where(kinds == 9, 0.95, 1.0)))).to(torch.float32)
    if b >= 8:
        x[5, 7777] = float("nan")
        x[6, 100000] = float("inf")
        x[7] = float("-inf")
    seed = torch.randint(-(2**62), 2**62, (b,), generator=g, device="cuda")
    pos = torch.randint(0, 1 << 40, (b,), generator=g, device="cuda")
    return x, tau, k, p, seed, pos


def test_sample_captures_in_cuda_graphs_and_matches_generic() -> None:
    """The Triton ``sample`` launches without host syncs and replays from a CUDA graph with eager's
    bits, at the Qwen3 vocabulary with every row kind in one batch (greedy, plain, top-k, top-p,
    both, NaN / +inf / all -inf rows); the device-generic code on the GPU gives the same tokens, and so
    does the launch hint ``filtered=False`` (which only a batch without filtered rows should get)."""
    from rlkernel.backends.generic.sample import sample as generic_sample
    from rlkernel.backends.triton import sample as S

    g = torch.Generator(device="cuda").manual_seed(12)
    for b in (1, 5, 10, 64, 256):
        args = _sample_rows(b, g)
        eager = S.sample(*args)
        _assert_bitwise(generic_sample(*args), eager, f"sample B={b} vs generic")
        # the launch hint skips the hist and gather kernels: filtered rows then take the selection passes
        _assert_bitwise(eager, S.sample(*args, filtered=False), f"sample B={b} filtered=False")
        _assert_bitwise(eager, _graph_replay(lambda a=args: S.sample(*a)), f"sample B={b} graph")


def test_membound_ops_capture_in_cuda_graphs() -> None:
    """softmax / log_softmax over a vocabulary (the three-launch split path), silu_mul and
    embedding launch without host reads under capture and replay with the reference's bits."""
    from rlkernel import ops
    from rlkernel.contracts import embedding as ce
    from rlkernel.contracts import log_softmax as cl
    from rlkernel.contracts import silu_mul as cm
    from rlkernel.contracts import softmax as cs

    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(2, 151936, generator=g, device="cuda") * 3
    x[1, 7] = float("nan")
    for fn, ref, what in ((ops.softmax, cs.reference, "softmax"), (ops.log_softmax, cl.reference, "log_softmax")):
        _assert_bitwise(ref(x.cpu()), _graph_replay(lambda fn=fn: fn(x)).cpu(), f"{what} graph replay")
    gate = torch.randn(1, 12288, generator=g, device="cuda").to(torch.bfloat16)
    up = torch.randn(1, 12288, generator=g, device="cuda").to(torch.bfloat16)
    _assert_bitwise(cm.reference(gate.cpu(), up.cpu()), _graph_replay(lambda: ops.silu_mul(gate, up)).cpu(),
                    "silu_mul graph replay")
    w = torch.randn(1000, 256, generator=g, device="cuda").to(torch.bfloat16)
    ids = torch.randint(0, 1000, (5,), generator=g, device="cuda")
    _assert_bitwise(ce.reference(ids.cpu(), w.cpu()), _graph_replay(lambda: ops.embedding(ids, w)).cpu(),
                    "embedding graph replay")


def _fused_split_check() -> None:
    """softmax / log_softmax on the one-launch split (``FUSED_SPLIT``) against the three-launch split
    and, on a small case, the reference; eager and replayed from a CUDA graph. Run in a child
    process by the test below (its waits between programs are spin loops)."""
    from rlkernel.backends.triton import softmax as S
    from rlkernel.contracts import log_softmax as cl
    from rlkernel.contracts import softmax as cs

    g = torch.Generator(device="cuda").manual_seed(11)
    for rows, n, dtype in ((256, 151936, torch.float32), (64, 151936, torch.bfloat16), (3, 5000, torch.float16),
                           (1, 151936, torch.float32), (1000, 4097, torch.float32), (37, 40000, torch.bfloat16)):
        x = torch.randn(rows, n, generator=g, device="cuda") * 4
        x[:, :3] *= 30.0  # outlier columns
        x[rows // 2, 100] = float("nan")
        x[rows - 1, :] = float("-inf")
        x[0, n - 1] = float("inf") if rows > 2 else x[0, n - 1]
        x = x.to(dtype)
        for fn in (S.softmax, S.log_softmax):
            S.FUSED_SPLIT = False
            want = fn(x)
            S.FUSED_SPLIT = True
            what = f"{fn.__name__} fused [{rows}, {n}] {dtype}"
            _assert_bitwise(want, fn(x), what)
            _assert_bitwise(want, _graph_replay(lambda fn=fn, x=x: fn(x)), f"{what} graph")
    S.FUSED_SPLIT = True
    x = torch.randn(4, 70000, generator=g, device="cuda") * 5
    x[2, 9] = float("nan")
    _assert_bitwise(cs.reference(x.cpu()), S.softmax(x).cpu(), "softmax fused vs reference")
    _assert_bitwise(cl.reference(x.cpu()), S.log_softmax(x).cpu(), "log_softmax fused vs reference")
    print("fused split: ok")


def test_softmax_fused_split_equals_the_three_launch_split() -> None:
    """The one-launch split of softmax / log_softmax (opt-in ``FUSED_SPLIT``) gives the three-launch
    split's bytes (Qwen3's vocabulary at T 1-256, fp32 / bf16 / fp16, NaN / +-inf rows, CUDA-graph
    replay). In a child process with a time limit: a wait that never ends fails this test only."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import test_cuda_gpu as t; t._fused_split_check()"
    try:
        # -P: the working directory (a checkout's root on the GPU machine) must not shadow the package
        done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the fused split did not finish in 300 s (a wait that never ends?)")
    assert done.returncode == 0 and "fused split: ok" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:]


@pytest.mark.parametrize("rows", [None, 32, 16])
def test_attention_past_f64_keys_equals_the_generic_backend(rows: int | None) -> None:
    """Sequences of more than ``F64_KEYS`` keys run the chunked fp64 path (int64 sums every 4096 keys),
    which no conformance case reaches: against the device-generic backend (conformance-checked against
    the reference), at the default block rows and both ``CHUNKS_BLOCK_M`` values. A causal prefill of
    4 700 tokens and 40 query tokens at the end of 9 000 keys (three chunks), GQA 8 / 2 heads, D 64,
    with an attention-sink key, outlier channels and a zero V row."""
    from rlkernel import ops
    from rlkernel.backends.generic import attention as generic
    from rlkernel.backends.triton import attention as A

    g = torch.Generator(device="cuda").manual_seed(5)
    lq, lk = (4700, 40), (4700, 9000)
    q = torch.randn(sum(lq), 8, 64, generator=g, device="cuda")
    k = torch.randn(sum(lk), 2, 64, generator=g, device="cuda")
    v = torch.randn(sum(lk), 2, 64, generator=g, device="cuda")
    q[:, :, 3] *= 20.0  # outlier channels
    k[:, :, 3] *= 8.0
    k[0] = 6.0 * q[:8].mean(dim=(0, 1))  # a sink: every early query scores it high
    k[lk[0]] = k[0]
    v[5] = 0.0  # a zero V row among the allowed keys
    q, k, v = (t.to(torch.bfloat16) for t in (q, k, v))
    cu_q = torch.tensor([0, lq[0], sum(lq)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, lk[0], sum(lk)], dtype=torch.int32, device="cuda")
    assert max(lk) > A.F64_KEYS
    want = generic.attention(q, k, v, cu_q, cu_k, None, True)
    saved = A.CHUNKS_BLOCK_M
    try:
        if rows is not None:
            A.CHUNKS_BLOCK_M = rows
        _assert_bitwise(want, ops.attention(q, k, v, cu_q, cu_k, None, True), f"attention chunked, rows {rows}")
    finally:
        A.CHUNKS_BLOCK_M = saved


def test_attention_takes_offsets_and_tables_on_the_cpu() -> None:
    """The public attention ops take their offsets, lengths and block tables on q's device or on the CPU
    (their docstrings); the Triton launchers move CPU ones to the GPU, and attention's autograd hands the
    backward CPU offsets (``backward_offsets``). Against the device-generic backend on device metadata:
    varlen prefill, its gradients, and a paged decode step."""
    from rlkernel import ops
    from rlkernel.backends.generic import attention as generic
    from rlkernel.backends.generic import attention_backward as generic_backward

    g = torch.Generator(device="cuda").manual_seed(11)
    lens = [37, 5, 64]
    tq = sum(lens)
    q = torch.randn(tq, 8, 64, generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn(tq, 2, 64, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn(tq, 2, 64, generator=g, device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 37, 42, tq], dtype=torch.int32)
    want = generic.attention(q, k, v, cu.cuda(), cu.cuda(), None, True)
    _assert_bitwise(want, ops.attention(q, k, v, cu, cu), "attention, CPU offsets")
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = ops.attention(qg, kg, vg, cu.cuda(), cu.cuda())
    grad = torch.randn(out.shape, generator=g, device="cuda").to(torch.bfloat16)
    out.backward(grad)
    wants = generic_backward.attention_backward(grad, q, k, v, out.detach(), cu.cuda(), cu.cuda(), None, True)
    for name, w, t in zip("qkv", wants, (qg, kg, vg)):
        _assert_bitwise(w, t.grad, f"attention backward d{name}, the forward's offsets on the host")
    # a decode step of the three sequences through a paged cache of 16-slot blocks
    bs, blocks = 16, [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9, 10]]
    k_cache = torch.zeros(11, bs, 2, 64, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    for b, (n, table) in enumerate(zip(lens, blocks)):
        rows = k[sum(lens[:b]):sum(lens[:b]) + n]
        for j in range(n):
            k_cache[table[j // bs], j % bs] = rows[j]
            v_cache[table[j // bs], j % bs] = v[sum(lens[:b]) + j]
    table = torch.tensor([t + [0] * (5 - len(t)) for t in blocks], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    cu_q = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    qd = q[:3].contiguous()
    want = generic.attention_paged(qd, k_cache, v_cache, table.cuda(), seq_lens.cuda(), cu_q.cuda(), None, True)
    _assert_bitwise(want, ops.attention_paged(qd, k_cache, v_cache, table, seq_lens, cu_q),
                    "attention_paged, CPU block table, lengths and offsets")


def test_embedding_bad_id_is_a_value_error_on_the_gpu() -> None:
    """The id range check runs in the kernel (no host pre-check): the error still names the id."""
    from rlkernel import ops

    w = torch.zeros(10, 4, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match=r"ids holds 12 at index \(1, 0\); expected 0 <= id < V = 10"):
        ops.embedding(torch.tensor([[0, 3], [12, -1]], device="cuda"), w)
    assert ops.embedding(torch.tensor([1, 2], device="cuda"), w).shape == (2, 4)  # the context is usable

def test_rl_reductions_capture_in_cuda_graphs() -> None:
    """The Triton RL reductions (``masked_mean`` every mode and its partial, ``ppo_loss``,
    ``group_advantages``, ``masked_mean_backward``) launch without host reads, replay from a CUDA
    graph with eager's bits, and agree with the multi-program small-tile paths."""
    from rlkernel.backends.triton import rl

    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(64, 4096, generator=g, device="cuda")
    x[3, 7] = 3.0e38
    x[5, 9] = -3.0e38
    lens = torch.randint(0, 4097, (64, 1), generator=g, device="cuda")
    mask = torch.arange(4096, device="cuda").unsqueeze(0) < lens
    old = -torch.rand(64, 4096, generator=g, device="cuda") * 8.0
    logp = old + 0.1 * torch.randn(64, 4096, generator=g, device="cuda")
    adv = torch.randn(64, 4096, generator=g, device="cuda")
    rewards = torch.randn(512, 16, generator=g, device="cuda")
    grad = torch.tensor(0.75, device="cuda")
    calls: list[tuple[str, Callable[[], torch.Tensor]]] = []
    for mode in rl.MODES:
        calls.append((f"masked_mean {mode}", lambda m=mode: rl.masked_mean(x, mask, mode=m)))
        calls.append((f"masked_mean {mode} partial", lambda m=mode: rl.masked_mean(x, mask, mode=m, partial=True)))
        calls.append((f"ppo_loss {mode}", lambda m=mode: rl.ppo_loss(logp, old, adv, mask, 0.8, 1.28, 3.0, mode=m)))
        calls.append((f"masked_mean_backward {mode}", lambda m=mode: rl.masked_mean_backward(grad, mask, mode=m)))
    calls.append(("group_advantages", lambda: rl.group_advantages(rewards, 1e-6)))
    for what, fn in calls:
        eager = fn()
        _assert_bitwise(eager, _graph_replay(fn), f"{what} graph replay")
        rl.SMALL_TILES = True
        try:
            _assert_bitwise(eager, fn(), f"{what} small tiles")
        finally:
            rl.SMALL_TILES = False


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_of_logits_equal_token_logprobs_on_the_gpu(temperature: float) -> None:
    """The rollout scores its samples from the sampling logits (``ParallelLMHead.logprobs_of_logits``):
    on the GPU too the bits of ``token_logprobs`` (Qwen3's vocabulary, outlier channels)."""
    import rlkernel.ops as ops
    from rlkernel.nn.embed_head import ParallelLMHead

    g = torch.Generator(device="cuda").manual_seed(7)
    head = ParallelLMHead(151936, 1024, device="cuda")
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=g, device="cuda") * 0.02)
    hidden = torch.randn(64, 1024, generator=g, device="cuda")
    hidden[:, :4] *= 200.0
    hidden = hidden.to(head.weight.dtype)
    targets = torch.randint(0, 151936, (64,), generator=g, device="cuda")
    with torch.no_grad():
        want = ops.token_logprobs(hidden, head.weight, targets, temperature)
        got = head.logprobs_of_logits(head.logits(hidden), targets, temperature)
    _assert_bitwise(want, got, f"logprobs_of_logits at temperature {temperature}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_residual_add_is_the_fp32_add_rounded_once_on_the_gpu(dtype: torch.dtype) -> None:
    """The model's ``residual_add`` (torch's one-kernel half add on CUDA) against the spelled-out
    ``RN(fp32(a) + fp32(b))`` on the GPU, random bit patterns and near-cancelling pairs."""
    from rlkernel.model.qwen3 import residual_add

    g = torch.Generator(device="cuda").manual_seed(11)
    a = torch.randint(-(1 << 15), 1 << 15, (1 << 22,), dtype=torch.int16, generator=g, device="cuda").view(dtype)
    b = torch.randint(-(1 << 15), 1 << 15, a.shape, dtype=torch.int16, generator=g, device="cuda").view(dtype)
    near = (a.view(torch.int16) + torch.randint(-300, 300, a.shape, dtype=torch.int16, generator=g,
                                                device="cuda")).view(dtype)
    for other in (b, near, -near):
        _assert_bitwise((a.float() + other.float()).to(dtype), residual_add(a, other), f"residual_add {dtype}")


@pytest.mark.parametrize("m, n", [(256, 1024), (128, 4096), (65, 16384), (200, 20001)])
def test_wgmma_mid_rows_equal_the_mid_kernel(m: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows between the decode and prefill sizes (a decode step of many sequences) run the
    wgmma kernel on weight planes made per call from MID_MIN_N output columns (the LM head), the
    mid kernel (bf16 weight, digits in registers) below: the same bits either way, with the
    exponents given as the decode graphs give them."""
    from rlkernel import dispatch
    from rlkernel.backends.cuda import digit_gemm as D
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma digit GEMM runs on sm_90 only")
    g = torch.Generator(device="cuda").manual_seed(m + n)
    x = torch.randn(m, 1024, generator=g, device="cuda")
    x[:, 9] *= 500.0
    x[m // 2, 11] = float("nan")
    x = x.to(torch.bfloat16)
    w = (torch.randn(n, 1024, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    ew = L.linear_exponents(x[:0], w)[1]
    monkeypatch.setenv(D.ENV, "0")
    want = L.linear(x, w, None, torch.float32, ew, target=CUDA)
    assert (dispatch.last_kernel() or "").endswith("[triton-int8-decode]"), dispatch.last_kernel()
    monkeypatch.setenv(D.ENV, "1")
    got = L.linear(x, w, None, torch.float32, ew, target=CUDA)
    path = "[cuda-wgmma-int8]" if D.usable_mid(n) else "[triton-int8-decode]"
    assert (dispatch.last_kernel() or "").endswith(path), dispatch.last_kernel()
    _assert_bitwise(want.view(torch.int32), got.view(torch.int32), f"linear M={m} N={n}: {path} vs mid kernel")


@pytest.mark.parametrize("m, n", [(256, 4096), (100, 6144), (65, 4097), (256, 1024), (300, 4096)])
def test_given_weight_digits_equal_the_op_without_them(m: int, n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``linear`` given the weight's exponents and digit planes (as the decode graphs hold them): the
    wgmma kernel reads the planes at 65-256 rows from CACHED_MID_MIN_N columns, the mid kernel runs
    below that width, the prefill path reads them above 256 rows; the bytes of the op without them,
    with the kernel on and off, through the public op (which checks the planes) with a bias."""
    import rlkernel
    from rlkernel import dispatch
    from rlkernel.backends.cuda import digit_gemm as D

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma digit GEMM runs on sm_90 only")
    g = torch.Generator(device="cuda").manual_seed(7 * m + n)
    x = torch.randn(m, 1024, generator=g, device="cuda")
    x[:, 5] *= 700.0
    x[m // 3, 2] = float("inf")
    x = x.to(torch.bfloat16)
    w = (torch.randn(n, 1024, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
    w[3] = 0.0
    w[n - 2, 100] = float("nan")
    b = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16)
    ew, wd = rlkernel.ops.linear_weight_digits(w)
    for flag in ("1", "0"):
        monkeypatch.setenv(D.ENV, flag)
        want = rlkernel.ops.linear(x, w, b)
        got = rlkernel.ops.linear(x, w, b, weight_exponents=ew, weight_digits=wd)
        ran = dispatch.last_kernel() or ""
        if flag == "1" and 64 < m <= 256:
            path = "[cuda-wgmma-int8]" if D.usable_mid(n, True) else "[triton-int8-decode]"
            assert ran.endswith(path), ran
        _assert_bitwise(want.view(torch.int16), got.view(torch.int16), f"M={m} N={n} {D.ENV}={flag}: {ran}")


def _wgmma_candidates() -> list:
    from rlkernel.backends.cuda import digit_gemm as D

    return D.CANDIDATES


# last in this file: a configuration that hangs (an mbarrier never completing) stops only this test
@pytest.mark.parametrize("cfg", _wgmma_candidates(), ids=lambda c: "w{}_n{}_s{}_l{}_p{}".format(*c))
def test_wgmma_candidate_configs_equal_triton(cfg: tuple[int, int, int, int, int]) -> None:
    """Every configuration the experiment times (``digit_gemm.CANDIDATES``: the level split, the
    TMA producer warpgroup, ...) writes the Triton digit GEMM's int64 C into a poisoned output, and
    its fused P3' epilogue the Triton finish's bytes, on ragged shapes (M and N off the tiles, odd
    N, K off the 128-deep step, fewer rows than a tile) and the decode step's M = 256."""
    from rlkernel.backends.cuda import digit_gemm as D
    from rlkernel.backends.triton import linear as L
    from rlkernel.backends.triton.targets import CUDA

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma digit GEMM runs on sm_90 only")
    for m, k, n in [(1000, 1040, 1000), (77, 2064, 4097), (130, 16, 33), (256, 3072, 1024), (5, 256, 200)]:
        g = torch.Generator(device="cuda").manual_seed(m * 7 + n)
        x = torch.randn(m, k, generator=g, device="cuda")
        x[:, :4] *= 300.0
        x[1 % m, 3] = float("inf")
        x = x.to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g, device="cuda") * 0.02).to(torch.bfloat16)
        bias = torch.randn(n, generator=g, device="cuda")
        xd, ex = L._digits(x)
        wd, ew = L._digits(w, activation=False)
        ref = torch.empty(m, n, dtype=torch.int64, device="cuda")
        L._launch_gemm(xd, ex, w, wd, ew, None, ref, k, CUDA.linear_prefill, w_digits=True, finish=False,
                       atomic=False, out_code=0)
        out = torch.full((m, n), -(2**62), dtype=torch.int64, device="cuda")
        D.digit_gemm(xd, wd, out, cfg)
        _assert_bitwise(ref, out, f"{D.name(cfg)} C vs Triton C, M={m} K={k} N={n}")
        y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        D.digit_gemm_finish(xd, wd, ex, ew, bias, y, cfg)
        want = L._finish(ref, ex, ew, bias, torch.bfloat16)
        _assert_bitwise(want.view(torch.int16), y.view(torch.int16), f"{D.name(cfg)} fused bf16, M={m} K={k} N={n}")


def test_exact_sum_total_fp64_blocks_equal_the_generic_state_path() -> None:
    """``exact_sum_total`` of four terms an element (a trainer's per-unit weight gradients) over 2**20
    elements whose magnitudes mix close terms (the fp64 blocks) with spreads beyond fp64 and specials
    (the state blocks), against the device-generic superaccumulator on the same GPU; and with the
    fp64 path off (``FAST_TERMS = 0``), the same bytes."""
    from rlkernel.backends.generic.exact_sum import exact_sum_total as generic_total
    from rlkernel.backends.triton import exact_sum as es

    g = torch.Generator(device="cuda").manual_seed(7)
    n = 1 << 20
    terms = torch.randn(4, n, generator=g, device="cuda")
    spread = torch.randint(-12, 12, (4, n), generator=g, device="cuda").float()
    far = torch.rand(n, generator=g, device="cuda") < 1e-3  # ~1 element in 1000: exponents 2**-100 .. 2**100
    spread[:, far] = torch.randint(-100, 100, (4, int(far.sum())), generator=g, device="cuda").float()
    terms = terms * torch.exp2(spread)
    terms[1, 12345] = float("nan")
    terms[2, 54321] = float("inf")
    terms[:, 777] = torch.tensor([1.0, 2.0 ** -24, 0.0, 0.0])  # a tie: to even
    want = generic_total(terms)
    _assert_bitwise(want, es.exact_sum_total(terms), "exact_sum_total (fp64 blocks) vs generic")
    saved = es.FAST_TERMS
    es.FAST_TERMS = 0
    try:
        _assert_bitwise(want, es.exact_sum_total(terms), "exact_sum_total (state path) vs generic")
    finally:
        es.FAST_TERMS = saved
