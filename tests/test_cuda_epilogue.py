"""linear's P3' epilogue in CUDA C (``backends/cuda/linear_epilogue.cuh``), built for the host.

The header uses integer and IEEE round-to-nearest operations only, so g++ (FMA contraction off)
gives the bits NVRTC's build gives on the GPU; here they are compared byte for byte with the
contract's ``linear_finish`` on adversarial values: every magnitude of C from 0 to 2**63 - 1,
exponents that put results on fp32 / bf16 / fp16 ties, subnormals, overflow and signed zeros,
non-finite rows (the sentinel), with and without a bias of each dtype.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from rlkernel.contracts.linear import SENTINEL, reference_finish

HEADER = Path(__file__).resolve().parent.parent / "backends" / "cuda" / "linear_epilogue.cuh"

WRAPPER = r"""
#include "linear_epilogue.cuh"
extern "C" void linear_finish_host(const long long* acc, const long long* ex, const long long* ew,
                                   const float* bias, int has_bias, int out, int m, int n, void* y) {
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            const rlk_u32 r = rlk_linear_out(acc[(long long)i * n + j], ex[i], ew[j], has_bias ? bias[j] : 0.0f,
                                             has_bias, out);
            if (out == 0) ((rlk_u32*)y)[(long long)i * n + j] = r;
            else ((unsigned short*)y)[(long long)i * n + j] = (unsigned short)r;
        }
}
extern "C" void upcast_host(const unsigned short* h, float* f, int n, int bf16) {
    for (int i = 0; i < n; ++i) f[i] = bf16 ? rlk_bf16_bits_to_f32(h[i]) : rlk_f16_bits_to_f32(h[i]);
}
"""


@pytest.fixture(scope="module")
def host_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on this machine")
    d = tmp_path_factory.mktemp("epilogue")
    src = d / "wrapper.cpp"
    src.write_text(WRAPPER)
    lib = d / "libepilogue.so"
    subprocess.run([cxx, "-O2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC", f"-I{HEADER.parent}",
                    str(src), "-o", str(lib)], check=True, capture_output=True)
    return ctypes.CDLL(str(lib))


def _finish_host(lib: ctypes.CDLL, acc: torch.Tensor, ex: torch.Tensor, ew: torch.Tensor,
                 bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    m, n = acc.shape
    out = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}[out_dtype]
    y = torch.empty((m, n), dtype=out_dtype)
    b = bias.float().contiguous() if bias is not None else torch.zeros(n)
    lib.linear_finish_host(ctypes.c_void_p(acc.data_ptr()), ctypes.c_void_p(ex.data_ptr()),
                           ctypes.c_void_p(ew.data_ptr()), ctypes.c_void_p(b.data_ptr()), int(bias is not None),
                           out, m, n, ctypes.c_void_p(y.data_ptr()))
    return y


def _adversarial(seed: int, m: int = 96, n: int = 80) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 64, size=(m, n))  # every magnitude 0 .. 2**63 - 1
    mag = rng.integers(0, 2**62, size=(m, n), dtype=np.int64, endpoint=True)
    acc = np.where(bits < 63, mag >> (62 - np.minimum(bits, 62)), mag * 2 + rng.integers(0, 2, size=(m, n)))
    # patterns that sit on a rounding boundary: a run of ones or a single one below a kept bit
    ties = (np.int64(1) << rng.integers(8, 60, size=(m, n))) * (2 * rng.integers(1, 1 << 10, size=(m, n)) + 1)
    acc = np.where(rng.random((m, n)) < 0.25, ties, acc)
    acc = np.where(rng.random((m, n)) < 0.05, 0, acc)
    acc = acc * np.where(rng.random((m, n)) < 0.5, -1, 1)
    # exponents: the contract's range (zero rows' -149 up to 128), biased towards the edges where
    # results land on fp16/bf16/fp32 subnormals, the fp16 maximum and fp32 overflow
    ex = rng.integers(-149, 129, size=m)
    ew = np.concatenate([rng.integers(-149, 129, size=n // 2), rng.integers(-60, 20, size=n - n // 2)])
    ex[rng.random(m) < 0.05] = SENTINEL
    ew[rng.random(n) < 0.05] = SENTINEL
    return (torch.from_numpy(acc.astype(np.int64)), torch.from_numpy(ex.astype(np.int64)),
            torch.from_numpy(ew.astype(np.int64)))


def _traps(seed: int, significant: int, m: int = 64, n: int = 48) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Double-rounding traps for a format of ``significant`` bits (8 bf16, 11 fp16): C = (a tie of that
    format) + (a one below fp32's 24 bits), the tie's kept part even, so rounding to fp32 first lands
    on the tie and nearest-even then goes down where the value lies above it. Column j shifts by
    s_j; ew_j puts the results near 2**5 (inside every format's normal range)."""
    rng = np.random.default_rng(1000 + seed)
    s = rng.integers(26, 45, size=n)
    a = 2 * rng.integers(1 << (significant - 2), 1 << (significant - 1), size=(m, n))  # even, `significant` bits
    base = ((a << 1) | 1) << s[None, :]
    t = rng.integers(0, s[None, :] - (24 - significant) - 1, size=(m, n))
    acc = (base + (np.int64(1) << t)) * np.where(rng.random((m, n)) < 0.5, -1, 1)
    ex = np.zeros(m, dtype=np.int64)
    ew = 47 - (s + significant + 1) + 5
    return torch.from_numpy(acc.astype(np.int64)), torch.from_numpy(ex), torch.from_numpy(ew.astype(np.int64))


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Adversarial rows, then bf16 and fp16 double-rounding traps (each block its own rows/columns:
    the blocks are stacked on the diagonal, the off-diagonal C zero)."""
    blocks = [_adversarial(seed), _traps(seed, 8), _traps(seed, 11)]
    m, n = sum(b[0].shape[0] for b in blocks), sum(b[0].shape[1] for b in blocks)
    acc = torch.zeros(m, n, dtype=torch.int64)
    i = j = 0
    for c, _, _ in blocks:
        acc[i:i + c.shape[0], j:j + c.shape[1]] = c
        i, j = i + c.shape[0], j + c.shape[1]
    return acc, torch.cat([b[1] for b in blocks]), torch.cat([b[2] for b in blocks])


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias_dtype", [None, torch.float32, torch.bfloat16, torch.float16])
def test_cuda_c_epilogue_matches_the_contract(host_lib: ctypes.CDLL, out_dtype: torch.dtype,
                                              bias_dtype: torch.dtype | None) -> None:
    for seed in range(4):
        acc, ex, ew = _inputs(seed)
        bias = None
        if bias_dtype is not None:
            g = torch.Generator().manual_seed(seed)
            bias = (torch.randn(acc.shape[1], generator=g) * torch.tensor([1e-30, 1.0, 1e4, 6e4])[seed]).to(bias_dtype)
        want = reference_finish(acc, ex, ew, bias, out_dtype)
        got = _finish_host(host_lib, acc, ex, ew, bias, out_dtype)
        if not _bytes_equal(want, got):
            bad = (want.view(torch.int16 if out_dtype != torch.float32 else torch.int32)
                   != got.view(torch.int16 if out_dtype != torch.float32 else torch.int32)).nonzero()
            i, j = (int(v) for v in bad[0])
            raise AssertionError(f"seed {seed}: {len(bad)} elements differ, first [{i}, {j}]: C={int(acc[i, j])} "
                                 f"ex={int(ex[i])} ew={int(ew[j])}: contract {want[i, j].item()!r}, "
                                 f"CUDA C {got[i, j].item()!r}")


def test_cuda_c_epilogue_catches_a_wrong_rounding(host_lib: ctypes.CDLL, tmp_path: Path) -> None:
    """The comparison can fail: the same header with the round-to-odd step taken out (a double
    rounding) differs from the contract on these inputs."""
    broken = HEADER.read_text().replace("| (fd != y ? 1u : 0u)", "")
    assert broken != HEADER.read_text()
    (tmp_path / "linear_epilogue.cuh").write_text(broken)
    (tmp_path / "wrapper.cpp").write_text(WRAPPER)
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx is not None
    subprocess.run([cxx, "-O2", "-ffp-contract=off", "-shared", "-fPIC", f"-I{tmp_path}", str(tmp_path / "wrapper.cpp"),
                    "-o", str(tmp_path / "lib.so")], check=True, capture_output=True)
    lib = ctypes.CDLL(str(tmp_path / "lib.so"))
    acc, ex, ew = _inputs(0)
    for out_dtype in (torch.bfloat16, torch.float16):
        assert not _bytes_equal(reference_finish(acc, ex, ew, None, out_dtype),
                                _finish_host(lib, acc, ex, ew, None, out_dtype)), out_dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_c_bias_upcast_is_exact(host_lib: ctypes.CDLL, dtype: torch.dtype) -> None:
    """Every fp16 / bf16 bit pattern (the bias the fused epilogue reads) to the fp32 torch gives."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    got = torch.empty(bits.shape, dtype=torch.float32)
    host_lib.upcast_host(ctypes.c_void_p(bits.data_ptr()), ctypes.c_void_p(got.data_ptr()), bits.numel(),
                         int(dtype == torch.bfloat16))
    assert _bytes_equal(bits.view(dtype).float(), got)
