"""Measure the contract exp_c/log_c against float64 truth and check reference == generic bits.

Accuracy is a separate, clearly labelled report (docs/design.md, "Conformance"): truth is NumPy's float64
``exp``/``log`` of the float64-converted input; the error of a result ``y`` is
``|y - truth| / ulp(truth)`` in float64, with ``ulp(t) = 2**(floor(log2|t|) - 23)`` bounded
below by 2**-149 (the subnormal spacing) and above by 2**104 (the top binade). "Correctly
rounded" means ``y == fp32(truth)``: float64 then fp32 is a double rounding, which differs
from the true correctly rounded result only when the float64 value lands exactly on an fp32
halfway point, and that did not affect any reported figure (such a case would show as an
error of exactly 0.5 ulp, never above).

Bitwise agreement needs no truth: the reference (``rlkernel.contracts``) and the
device-generic implementation (``rlkernel.backends``) are compared on the raw bits of every
input swept, including NaNs, infinities, zeros and subnormals.

Usage::

    python tools/measure_transcendentals.py sample --n 4000000
    python tools/measure_transcendentals.py exhaustive --workers 2     # all 2**32 inputs
    python tools/measure_transcendentals.py exhaustive --workers 16 --generic-device cuda
    python tools/measure_transcendentals.py exhaustive --start 0x3F000000 --stop 0x40000000

Each run prints one JSON record per function (and a Markdown summary with ``--markdown``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
import rlkernel  # noqa: E402

try:
    import rlkernel.contracts  # noqa: F401
except ModuleNotFoundError:  # a source tree that was never pip-installed: map the layers by hand
    rlkernel.__path__.append(_ROOT)

FUNCS = ("exp_c", "log_c")

#: Bit-pattern ranges (inclusive) of the "relevant finite range" of each function.
RELEVANT = {
    "exp_c": ((0x00000000, 0x42B20000), (0x80000000, 0xC2D00000)),  # x in [-104, 89]
    "log_c": ((0x00000001, 0x7F7FFFFF),),  # every positive finite x, subnormals included
}


def ulp_error(y: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``|y - truth| / ulp(truth)`` in float64; 0 where both are the same infinity.

    Parameters
    ----------
    y : ndarray, float32, the results under test
    truth : ndarray, float64, same shape

    Returns
    -------
    ndarray, float64, same shape (inf where y is infinite and fp32(truth) is not)
    """
    _, ex = np.frexp(np.abs(truth))  # |truth| = m * 2**ex, m in [0.5, 1)
    ulp = np.ldexp(1.0, np.clip(ex - 24, -149, 104))
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(y.astype(np.float64) - truth) / ulp
        t32 = truth.astype(np.float32)
    same_inf = np.isinf(y) & (y == t32)
    err[same_inf] = 0.0
    return err


def truth_of(name: str, x: np.ndarray) -> np.ndarray:
    """Float64 truth of ``name`` at the fp32 inputs ``x`` (NumPy's float64 exp/log)."""
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return np.exp(x64) if name == "exp_c" else np.log(x64)


@dataclass
class Stats:
    """Running accuracy and agreement figures for one function."""

    name: str
    inputs: int = 0  # every input swept (all bit patterns in exhaustive mode)
    mismatches: int = 0  # reference vs generic, bitwise
    first_mismatch: str = ""
    measured: int = 0  # inputs in the relevant finite range
    correctly_rounded: int = 0
    over_half: int = 0  # measured inputs with error > 0.5 ulp
    over_one: int = 0  # measured inputs with error > 1 ulp
    max_ulp: float = 0.0
    max_at: str = ""
    max_result: str = ""
    max_truth: float = 0.0
    max_ulp_normal: float = 0.0  # over inputs whose truth is a normal fp32 magnitude (>= 2**-126)
    max_normal_at: str = ""
    special_failures: list[str] = field(default_factory=list)

    def merge(self, other: Stats) -> None:
        self.inputs += other.inputs
        self.mismatches += other.mismatches
        self.first_mismatch = self.first_mismatch or other.first_mismatch
        self.measured += other.measured
        self.correctly_rounded += other.correctly_rounded
        self.over_half += other.over_half
        self.over_one += other.over_one
        if other.max_ulp > self.max_ulp:
            self.max_ulp, self.max_at = other.max_ulp, other.max_at
            self.max_result, self.max_truth = other.max_result, other.max_truth
        if other.max_ulp_normal > self.max_ulp_normal:
            self.max_ulp_normal, self.max_normal_at = other.max_ulp_normal, other.max_normal_at
        self.special_failures += other.special_failures


def _hexf(v: np.float32) -> str:
    return f"{float(v)!r} (0x{int(np.float32(v).view(np.uint32)):08X})"


def _implementations(name: str, generic_device: str) -> tuple[Callable, Callable]:
    import torch

    from rlkernel.backends.generic._exact import transcendental as generic
    from rlkernel.contracts._exact import transcendental as reference

    ref_fn = getattr(reference, name)
    gen_raw = getattr(generic, name)
    if generic_device == "cpu":
        gen_fn = gen_raw
    else:

        def gen_fn(x: torch.Tensor) -> torch.Tensor:
            return gen_raw(x.to(generic_device)).cpu()

    return ref_fn, gen_fn


def measure_bits(name: str, bits: np.ndarray, generic_device: str = "cpu", relevant_only: bool = False) -> Stats:
    """Stats of ``name`` on the fp32 inputs with encodings ``bits`` (uint32 array)."""
    import torch

    ref_fn, gen_fn = _implementations(name, generic_device)
    st = Stats(name)
    x = bits.view(np.float32)
    xt = torch.from_numpy(x)
    y_ref = ref_fn(xt)
    y_gen = gen_fn(xt)
    b_ref = y_ref.view(torch.int32).numpy()
    b_gen = y_gen.view(torch.int32).numpy()
    st.inputs = int(bits.size)
    diff = b_ref != b_gen
    st.mismatches = int(diff.sum())
    if st.mismatches:
        i = int(np.argmax(diff))
        st.first_mismatch = (
            f"x=0x{int(bits[i]):08X}: reference 0x{int(b_ref[i]) & 0xFFFFFFFF:08X}, "
            f"generic 0x{int(b_gen[i]) & 0xFFFFFFFF:08X}"
        )
    keep = np.zeros(bits.shape, dtype=bool)
    for lo, hi in RELEVANT[name]:
        keep |= (bits >= lo) & (bits <= hi)
    if not keep.any():
        return st
    xs = x[keep]
    ys = y_ref.numpy()[keep]
    truth = truth_of(name, xs)
    err = ulp_error(ys, truth)
    with np.errstate(over="ignore"):
        st.correctly_rounded = int((ys == truth.astype(np.float32)).sum())
    st.measured = int(xs.size)
    st.over_half = int((err > 0.5).sum())
    st.over_one = int((err > 1.0).sum())
    j = int(np.argmax(err))
    st.max_ulp = float(err[j])
    st.max_at = _hexf(xs[j])
    st.max_result = _hexf(ys[j])
    st.max_truth = float(truth[j])
    normal = np.abs(truth) >= 2.0**-126
    if normal.any():
        jn = int(np.argmax(np.where(normal, err, -1.0)))
        st.max_ulp_normal = float(err[jn])
        st.max_normal_at = _hexf(xs[jn])
    return st


def _chunk_job(args: tuple[str, int, int, str]) -> Stats:
    name, start, stop, device = args
    import torch

    torch.set_num_threads(1)
    bits = np.arange(start, stop, dtype=np.uint64).astype(np.uint32)
    return measure_bits(name, bits, device)


def exhaustive(
    name: str, workers: int, device: str, start: int = 0, stop: int = 1 << 32, chunk: int = 1 << 22
) -> Stats:
    """Every fp32 bit pattern in [start, stop) (default: all 2**32), in chunks over ``workers`` processes."""
    jobs = [(name, s, min(s + chunk, stop), device) for s in range(start, stop, chunk)]
    total = Stats(name)
    t0 = time.time()
    if workers <= 1:
        for st in map(_chunk_job, jobs):
            total.merge(st)
        return total
    # spawn, not fork, when workers use an accelerator: CUDA cannot be re-initialised in a fork
    ctx = multiprocessing.get_context("fork" if device == "cpu" else "spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        for i, st in enumerate(pool.map(_chunk_job, jobs, chunksize=1), 1):
            total.merge(st)
            if i % 128 == 0:
                print(f"  {name}: {i}/{len(jobs)} chunks, {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    return total


def sample_bits(name: str, n: int, seed: int = 20240601) -> np.ndarray:
    """``n`` encodings drawn uniformly from the bit patterns of the relevant finite range."""
    rng = np.random.default_rng(seed)
    spans = RELEVANT[name]
    sizes = np.array([hi - lo + 1 for lo, hi in spans], dtype=np.int64)
    idx = rng.integers(0, int(sizes.sum()), n, dtype=np.int64)
    out = np.empty(n, dtype=np.int64)
    base = 0
    for (lo, _), size in zip(spans, sizes):
        sel = (idx >= base) & (idx < base + size)
        out[sel] = lo + (idx[sel] - base)
        base += size
    return out.astype(np.uint32)


def special_bits() -> np.ndarray:
    """Special and boundary encodings: zeros, infinities, NaNs, subnormals, thresholds."""
    # fmt: off
    vals = [
        0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF,  # NaNs, quiet and signalling
        0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000,  # subnormal edges
        0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000, 0x3F7FFFFF, 0x3F800001,  # max, +-1, 1 +- ulp
        0x42B17217, 0x42B17218, 0x42B20000, 0x42B20001,  # exp overflow edge, 89
        0xC2AEAC4F, 0xC2AEAC50, 0xC2CE8ED0, 0xC2CFF1B4, 0xC2CFF1B5, 0xC2D00000, 0xC2D00001,  # underflow
        0x3F3504F3, 0x3F3504F2, 0x3FB504F3, 0x3FB504F2, 0x3F317218, 0x40000000, 0x3F000000,
    ]
    # fmt: on
    return np.array(vals, dtype=np.uint64).astype(np.uint32)


def expected_special(name: str, bits: int) -> int | None:
    """The contract's value for non-finite-result inputs; None where accuracy decides."""
    x = np.array([bits], dtype=np.uint32).view(np.float32)[0]
    nan = 0x7FC00000
    if np.isnan(x):
        return nan
    if name == "exp_c":
        if x > 89:
            return 0x7F800000
        if x < -104:
            return 0x00000000
        if x == 0:
            return 0x3F800000
        return None
    if x < 0:
        return nan
    if x == 0:
        return 0xFF800000
    if np.isinf(x):
        return 0x7F800000
    if x == 1:
        return 0x00000000
    return None


def check_specials(name: str, generic_device: str = "cpu") -> Stats:
    """Specials: both implementations agree, hit the contract's special values, and are <= 1 ulp."""
    st = measure_bits(name, special_bits(), generic_device)
    import torch

    ref_fn, _ = _implementations(name, generic_device)
    bits = special_bits()
    y = ref_fn(torch.from_numpy(bits.view(np.float32))).view(torch.int32).numpy().view(np.uint32)
    for b, yb in zip(bits, y):
        want = expected_special(name, int(b))
        if want is not None and int(yb) != want:
            st.special_failures.append(f"x=0x{int(b):08X}: got 0x{int(yb):08X}, want 0x{want:08X}")
    return st


def report(st: Stats) -> dict:
    rec = asdict(st)
    if st.measured:
        rec["fraction_correctly_rounded"] = st.correctly_rounded / st.measured
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=("sample", "exhaustive", "specials"))
    ap.add_argument("--n", type=int, default=4_000_000, help="sample size (sample mode)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--generic-device", default="cpu", help="device for the generic implementation")
    ap.add_argument("--funcs", default=",".join(FUNCS))
    ap.add_argument("--json", default="", help="also write the records to this file")
    ap.add_argument("--start", type=lambda v: int(v, 0), default=0, help="exhaustive: first encoding")
    ap.add_argument("--stop", type=lambda v: int(v, 0), default=1 << 32, help="exhaustive: end encoding")
    args = ap.parse_args(argv)

    records = []
    ok = True
    for name in args.funcs.split(","):
        t0 = time.time()
        if args.mode == "sample":
            st = measure_bits(name, sample_bits(name, args.n), args.generic_device)
        elif args.mode == "exhaustive":
            st = exhaustive(name, args.workers, args.generic_device, args.start, args.stop)
        sp = check_specials(name, args.generic_device)
        if args.mode == "specials":
            st = sp
        else:
            st.mismatches += sp.mismatches
            st.first_mismatch = st.first_mismatch or sp.first_mismatch
            st.special_failures += sp.special_failures
        rec = report(st)
        rec["mode"] = args.mode
        rec["generic_device"] = args.generic_device
        rec["specials_checked"] = int(special_bits().size)
        rec["specials_max_ulp"] = sp.max_ulp
        rec["seconds"] = round(time.time() - t0, 1)
        records.append(rec)
        print(json.dumps(rec), flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(records, fh, indent=1)
        ok &= st.mismatches == 0 and not st.special_failures and st.over_one == 0 and sp.over_one == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
