"""Find RoPE table entries closest to an fp32 rounding midpoint (for the ``rope_table_rows`` cases).

Such entries are where a correctly rounded table is hardest: a float64 evaluation alone cannot
tell which way they round, so both the contract and the product must take their slow paths.
Scans positions ``[start, stop)`` of one ``(head_dim, theta)`` with the contract's float64 fast
path and prints the entries whose value lies nearest a midpoint, in units of the fp32 ulp, with
the exact distance from mpmath at 60 digits.

Usage: python tools/find_rope_midpoints.py HEAD_DIM THETA [START STOP] [--top N]
"""

from __future__ import annotations

import argparse

import mpmath
import numpy as np

from rlkernel.contracts import rope


def scan(head_dim: int, theta: float, start: int, stop: int, top: int) -> list[tuple[float, int, int, str]]:
    limbs = rope._turn_limbs(rope._frequencies(head_dim, theta))
    best: list[tuple[float, int, int, str]] = []
    block = 1 << 14
    for lo in range(start, stop, block):
        positions = np.arange(lo, min(lo + block, stop), dtype=np.int64)
        cos, sin = rope._fast(positions, limbs)
        for values, which in ((cos, "cos"), (sin, "sin")):
            r = values.astype(np.float32)
            up = np.nextafter(r, np.float32(np.inf)).astype(np.float64)
            dn = np.nextafter(r, np.float32(-np.inf)).astype(np.float64)
            rd = r.astype(np.float64)
            ulp = (up - dn) / 2
            dist = np.minimum(np.abs(values - (rd + up) / 2), np.abs(values - (rd + dn) / 2)) / ulp
            flat = np.argsort(dist, axis=None)[:top]
            for f in flat:
                row, col = np.unravel_index(f, dist.shape)
                if positions[row]:
                    best.append((float(dist[row, col]), int(positions[row]), int(col), which))
        best = sorted(best)[:top]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("head_dim", type=int)
    parser.add_argument("theta", type=float)
    parser.add_argument("start", type=int, nargs="?", default=0)
    parser.add_argument("stop", type=int, nargs="?", default=1 << 24)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    freqs = rope._frequencies(args.head_dim, args.theta)
    for dist, p, col, which in scan(args.head_dim, args.theta, args.start, args.stop, args.top):
        with mpmath.workdps(60):
            exact = (mpmath.cos if which == "cos" else mpmath.sin)(p * freqs[col])
            r = np.float32(float(exact))
            neighbours = [np.nextafter(r, np.float32(-np.inf)), r, np.nextafter(r, np.float32(np.inf))]
            mids = [(mpmath.mpf(float(a)) + mpmath.mpf(float(b))) / 2 for a, b in zip(neighbours, neighbours[1:])]
            ulp = mpmath.mpf(float(neighbours[2])) - mpmath.mpf(float(r))
            true = min(abs(exact - m) for m in mids) / ulp
        print(f"position {p:>8} column {col:>3} {which}: float64 distance {dist:.3e} ulp, exact {float(true):.3e} ulp")


if __name__ == "__main__":
    main()
