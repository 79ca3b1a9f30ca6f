"""Named, deterministic inputs for the accuracy suite: the data real LLMs feed these ops.

Normal values come from torch's CPU generator seeded by the data set's name (a few seconds for
the 600M entries of a Qwen3 LM head, where the bit-exact SplitMix64 generator of the conformance
cases takes minutes), integers from :mod:`rlkernel.contracts._gen`: the same inputs on every
machine with the same torch version. Accuracy is a measurement, not a golden hash, so that is
enough. Shapes have two sizes: ``small`` (CI, the CPU, seconds) and ``full`` (Qwen3-sized
widths, long context: the H200 run).
"""

from __future__ import annotations

import torch

from rlkernel.contracts._gen import integers, seed_of

SIZES = ("small", "full")

#: Outlier-channel factors measured (LLM activations: a few channels 100-3000x the rest).
OUTLIER_FACTORS = (100.0, 1000.0, 3000.0)
#: Outlier channels per row.
OUTLIER_COUNT = 6


def randn(name: str, shape: tuple[int, ...], std: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Normal values N(0, std**2), seeded by ``name``, rounded once to ``dtype``."""
    g = torch.Generator().manual_seed(seed_of("accuracy", name) % (1 << 63))
    return (torch.randn(shape, generator=g, dtype=torch.float32) * std).to(dtype)


def randint(name: str, shape: tuple[int, ...], low: int, high: int) -> torch.Tensor:
    return integers(seed_of("accuracy", name), shape, low, high)


def outlier_channels(x: torch.Tensor, name: str, factor: float, count: int = OUTLIER_COUNT) -> torch.Tensor:
    """``x`` with ``count`` channels of the last axis (the same in every row) scaled by ``factor``."""
    channels = randint(f"{name}/channels", (count,), 0, x.shape[-1])
    y = x.to(torch.float64).clone()
    y[..., channels] *= factor
    return y.to(x.dtype)


def massive_tokens(x: torch.Tensor, name: str, factor: float = 1000.0, count: int = 2) -> torch.Tensor:
    """``x`` [T, H] with ``count`` whole rows scaled by ``factor`` (massive activations of a few
    tokens, e.g. the first token and a delimiter)."""
    rows = randint(f"{name}/rows", (count,), 0, x.shape[0])
    y = x.to(torch.float64).clone()
    y[rows] *= factor
    return y.to(x.dtype)


def halfway_rows(name: str, rows: int, k: int, n: int,
                 dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [rows, k]`` and ``w [n, k]`` such that every exact ``(x @ w.T)_ij`` lies just off the
    midpoint of two adjacent ``dtype`` values, by less than half an fp32 ulp.

    Row i of x is ``[a_i, h_i, d_i, 0, ...]`` and every row of w is ``[1, 1, 1, 0, ...]``: ``a_i``
    a ``dtype`` value, ``h_i`` half its ulp, ``d_i = +-2**-(fp32 gap + 2)`` of that ulp. The
    correctly rounded output is decided by the sign of ``d_i``; rounding to fp32 first drops
    ``d_i`` and leaves an exact tie, which round-half-even then breaks the wrong way half the
    time. Needs k >= 3.
    """
    if k < 3:
        raise ValueError(f"halfway_rows: k = {k}; need k >= 3")
    mant_bits = {torch.bfloat16: 8, torch.float16: 11}[dtype]  # significand bits incl. the implicit one
    a_int = randint(f"{name}/a", (rows,), 1 << (mant_bits - 1), 1 << mant_bits).to(torch.float64)
    ulp = torch.pow(2.0, randint(f"{name}/e", (rows,), -4, 5).to(torch.float64) - (mant_bits - 1))
    sign = torch.where(randint(f"{name}/s", (rows,), 0, 2) == 0, -1.0, 1.0)
    x = torch.zeros(rows, k, dtype=torch.float64)
    x[:, 0] = a_int * ulp
    x[:, 1] = ulp / 2
    x[:, 2] = sign * ulp * 2.0 ** -(24 - mant_bits + 2)
    w = torch.zeros(n, k, dtype=torch.float64)
    w[:, :3] = 1.0
    return x.to(dtype), w.to(dtype)
