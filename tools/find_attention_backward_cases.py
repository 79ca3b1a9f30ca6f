"""Search the inputs of the designed ``attention_backward`` cases (contracts/attention_backward.py).

Several contract parameters (the reference max, exp_c, the P grid and its rounding, the dO grid,
the rounding of D and dP, the two roundings of dS, the dS cast) move an fp32 intermediate by
about one ulp, which the casts of dS and pn to bf16 absorb unless the value sits on (or a hair
from) a bf16 rounding midpoint. The designed cases are single decode rows (one query, a few keys,
one head, D = 4, scale 1) where every dS_j and pn_j reaches an output alone:

* ``q = dO = [1, 2**-8, 2**-16, 0]``, so ``dK_j = dS_j q`` and ``dV_j = pn_j dO`` are exact:
  a flip of the bf16 ``dS_j`` or ``pn_j`` flips ``dK_j[0]`` / ``dV_j[0]``;
* key j's score is ``k_j0 + k_j1 2**-8 + k_j2 2**-16`` (three bf16 digits of any fp32 value);
* ``dP_j = V_j0 + V_j1 2**-8 + V_j2 2**-16`` likewise, so ``x_j = RN32(dP_j - D)`` can be set
  to any fp32 value: given the fp32 ``pn_j`` of the contract and of a mutant, a value of ``x_j``
  is chosen so that ``RN32(pn_j x_j)`` lands on a bf16 midpoint for one and not the other; V is
  solved together with ``out`` (the forward's output on these inputs, iterated to a fixed point).

The search runs the generic backend with and without each mutant of
tests/mutations/attention_backward.py and prints the found inputs (as exact Python floats) to
bake into the contract's cases. Usage: ``python tools/find_attention_backward_cases.py``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mutations.attention_backward import MUTATIONS  # noqa: E402

from rlkernel.backends.generic import attention_backward as A  # noqa: E402
from rlkernel.backends.generic._exact.digits import grid_rows  # noqa: E402
from rlkernel.backends.generic._exact.transcendental import exp_c  # noqa: E402
from rlkernel.contracts.attention import reference as forward  # noqa: E402

BF16 = torch.bfloat16
STEP = (1.0, 2.0**-8, 2.0**-16, 0.0)


def mutant(change: str) -> Any:
    return next(m for m in MUTATIONS if m.change == change)


@contextmanager
def patched(mut: Any) -> Iterator[None]:
    saved = []
    for p in (mut.patches if mut is not None else ()):
        target = p.target()
        saved.append((target, p.attribute, getattr(target, p.attribute)))
        setattr(target, p.attribute, p.value)
    try:
        yield
    finally:
        for target, attr, value in reversed(saved):
            setattr(target, attr, value)


def digits(x: float) -> list[float] | None:
    """Three bf16 values a, b, c with a + b 2**-8 + c 2**-16 == x exactly (None if there are none)."""
    out, r = [], float(x)
    for w in (1.0, 2.0**-8, 2.0**-16):
        d = float(torch.tensor(r / w, dtype=torch.float64).to(BF16))
        out.append(d)
        r -= d * w
    return out if r == 0.0 else None


def case(scores: list[float], v0: list[list[float]], go: tuple[float, ...] = STEP) -> dict[str, Any]:
    """One decode row: keys with the given fp32 scores (exact digits), V rows [n, 4], dO row."""
    ks = []
    for s in scores:
        d = digits(s)
        assert d is not None, s
        ks.append(d + [0.0])
    q = torch.tensor([[STEP]], dtype=torch.float64).to(BF16)
    k = torch.tensor(ks, dtype=torch.float64).unsqueeze(1).to(BF16)
    v = torch.tensor(v0, dtype=torch.float64).unsqueeze(1).to(BF16)
    cu_q = torch.tensor([0, 1], dtype=torch.int32)
    cu_k = torch.tensor([0, len(scores)], dtype=torch.int32)
    out = forward(q, k, v, cu_q, cu_k, scale=1.0, causal=True)
    go_t = torch.tensor([[go]], dtype=torch.float64).to(BF16)
    return {"grad_out": go_t, "q": q, "k": k, "v": v, "out": out, "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k,
            "scale": 1.0, "causal": True}


def intermediates(inp: dict[str, Any], mut: Any) -> dict[str, torch.Tensor]:
    """pn, dP, D, dS (fp32) of the generic backend (hq = hkv = 1, one sequence) under ``mut``."""
    with patched(mut):
        q, k, v, go, out = inp["q"], inp["k"], inp["v"], inp["grad_out"], inp["out"]
        lk = k.shape[0]
        kk, vv = k[:, 0], v[:, 0]
        scale_t = torch.tensor(1.0, dtype=torch.float32)
        s = A._scores(q[:, 0:1].transpose(0, 1), kk, A.row_exponents(q)[:, 0:1].T, A.row_exponents(k)[:, 0],
                      scale_t)
        allowed = A._causal_allowed(1, lk, True, torch.device("cpu"))
        pn, _ = A._probabilities(s, allowed, vv)
        do, o = go[:, 0], out[:, 0]
        edo, eo, ev = A.row_exponents(do), A.row_exponents(o), A.row_exponents(vv)
        dp = A._to_fp32(A._exact_product(do, vv, edo, ev, A.DO_BITS, A.OV_BITS),
                        edo.unsqueeze(1) + ev.unsqueeze(0) - A.DO_BITS - A.OV_BITS)
        c_d = (grid_rows(do, edo, A.DO_BITS) * grid_rows(o, eo, A.OV_BITS)).sum(dim=-1)
        delta = A._to_fp32(c_d, edo + eo - A.DO_BITS - A.OV_BITS)
        ds = A._ds(pn[0], dp, delta.unsqueeze(1))
        return {"pn": pn[0, 0], "dp": dp[0], "delta": delta[0], "ds": ds[0], "s": s[0, 0]}


def outputs(inp: dict[str, Any], mut: Any) -> tuple[torch.Tensor, ...]:
    with patched(mut):
        return A.attention_backward(**inp)


def differs(inp: dict[str, Any], mut: Any) -> bool:
    a, b = outputs(inp, None), outputs(inp, mut)
    return any(not torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(a, b))


def f32(x: float) -> np.float32:
    return np.float32(x)


def window(target: float, pn: float, delta: float, count: int = 2048, spread: int = 8) -> torch.Tensor:
    """Candidate dP values: for ``count`` bf16 midpoints M of dS near ``pn (target - delta)``, the fp32
    values within ``spread`` ulps of ``M / pn + delta``."""
    t = pn * (target - delta)
    e = math.frexp(t)[1]
    k = np.arange(-count // 2, count // 2, dtype=np.float64)
    mids = (math.floor(t * 2.0 ** (8 - e)) + k + 0.5) * 2.0 ** (e - 8)
    x = (mids / pn + delta).astype(np.float32)
    bits = x.view(np.int32)[:, None] + np.arange(-spread, spread + 1, dtype=np.int32)[None, :]
    return torch.from_numpy(bits.reshape(-1).view(np.float32).copy())


def solve(scores: list[float], v0: list[list[float]], j: int, mut: Any, target: float,
          go: tuple[float, ...] = STEP) -> dict[str, Any] | None:
    """Set key j's V row (its dP_j = V_j0 + V_j1 2**-8 + V_j2 2**-16, V_j3 = 0) so that the bf16 dS_j
    of the contract and of ``mut`` differ; ``out`` is the forward's output, iterated to a fixed point."""
    v = [list(r) for r in v0]
    for _ in range(24):
        inp = case(scores, v, go)
        o, m = intermediates(inp, None), intermediates(inp, mut)
        cand = window(target, float(o["pn"][j]), float(o["delta"]))
        ds_o = A._cast_ds(A._ds(o["pn"][j].expand_as(cand), cand, o["delta"]), BF16)
        with patched(mut):
            ds_m = A._cast_ds(A._ds(m["pn"][j].expand_as(cand), cand, m["delta"]), BF16)
        idx = torch.nonzero(ds_o.view(torch.int16) != ds_m.view(torch.int16)).flatten().tolist()
        idx = sorted(idx, key=lambda i: abs(i - cand.numel() // 2))
        chosen = next((float(cand[i]) for i in idx if digits(float(cand[i])) is not None), None)
        if chosen is None:  # no flip on this D: move key 0's tail column (the low bits of D), if it has one
            if v[0][3] == 0.0:
                return None
            v[0][3] = float(torch.tensor(v[0][3] * 1.0625, dtype=torch.float64).to(BF16))
            continue
        v[j] = digits(chosen) + [0.0]  # type: ignore[operator]
        inp = case(scores, v, go)
        if differs(inp, mut):
            return {"scores": scores, "v": v, "grad_out": list(go)}
    return None


def scan_scores(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Every fp32 score in [lo, hi] (both negative) and exp_c of it."""
    b0 = np.array([f32(hi)]).view(np.int32)[0]
    b1 = np.array([f32(lo)]).view(np.int32)[0]
    s = np.arange(b0, b1 + 1, dtype=np.int32).view(np.float32)
    return s, exp_c(torch.from_numpy(s.copy())).double().numpy()


def main() -> None:
    torch.set_num_threads(1)
    found: dict[str, Any] = {}
    # 1. the P grid: a top key (score 0, p = 1, P = 2**39) and a key with P ~ 2**15, so that
    #    L = 2**39 + P1 sits on the fp32 midpoint of l = L 2**-39 = 1 + 2**-24.
    s, p = scan_scores(-16.70, -16.55)
    big = p * 2.0**39
    frac = big - np.floor(big)
    up = [float(s[i]) for i in np.where((np.floor(big) == 32768) & (frac > 0.5) & (frac < 1))[0]]
    up = [x for x in up if digits(x) is not None]
    print("P1 in (32768.5, 32769):", up[:4])
    # an exact .5 fraction (even integer part) plus an exact integer P2 making the total the tie
    # (L = 2**39 + P2 + P1 = (2k + 1/2) 2**17: l rounds down to even, one more unit rounds it up)
    halves = [(float(s[i]), big[i]) for i in np.where(frac == 0.5)[0]
              if int(big[i]) % 2 == 0 and digits(float(s[i])) is not None]
    s2, p2 = scan_scores(-11.09, -10.40)
    big2 = p2 * 2.0**39
    tie_pair = None
    for s1, b1 in halves:
        need = (32768 - int(b1)) % 131072  # the tie with an even quotient: rounds down to even
        hit = np.where((big2 == np.floor(big2)) & (np.mod(big2, 131072) == need))[0]
        hit = [i for i in hit if digits(float(s2[i])) is not None]
        if hit:
            tie_pair = (s1, float(s2[hit[0]]))
            break
    print("P1 = n + 0.5 and P2:", tie_pair)
    v_base = [[1.0, 0.0, 0.0, 0.5], [3.0, 0.0, 0.0, -1.0], [-2.0, 0.0, 0.0, 0.25]]
    tail = (1.0, 2.0**-8, 2.0**-16, 2.0**-24)  # dO: D = dO . out has bits below dP's ulp
    # a score where exp_c and the mutant's exp_c differ
    se, pe = scan_scores(-3.0, -2.9)
    with patched(mutant("coefficient E0 + 1 ulp")):
        pe_m = exp_c(torch.from_numpy(se.copy())).double().numpy()
    s_e0 = next(float(x) for x, a, b in zip(se, pe, pe_m) if a != b and digits(float(x)) is not None)
    jobs = [
        ("P_BITS 40 -> 39", [0.0, up[0]], v_base[:2], STEP, 1, 1.5),
        ("to nearest -> toward zero", [0.0, up[0]], v_base[:2], STEP, 1, 1.5),
        ("P_BITS 40 -> 41", [0.0, *tie_pair], v_base, STEP, 1, 1.5),
        ("ties to even -> ties away", [0.0, *tie_pair], v_base, STEP, 1, 1.5),
        ("MAX_GAP 64 -> 63", [0.0, -70.0, -71.25, -69.5, -72.75, -68.25],
         [[0.0] * 4, [3.0, 0, 0, -1.0], [-2.0, 0, 0, 0.25], [1.0, 0, 0, 0], [0.5, 0, 0, 0], [-1.0, 0, 0, 0]], STEP, 0,
         1.5),
        ("coefficient E0 + 1 ulp", [0.0, s_e0], v_base[:2], STEP, 1, 0.1),
        ("DO_BITS 27 -> 26", [0.0, -1.0], [[1.0, 0, 0, 64.0], [3.0, 0, 0, -1.0]],
         (1.0, 2.0**-8, 2.0**-16, 1.5 * 2.0**-27), 1, 1.5),
        ("to nearest -> toward zero@row", [0.0, -4.0], [[1.0, 0, 0, 1.7109375], [3.0, 0, 0, 0]], tail, 1, 1.5),
        ("pn * (dP - D) in one rounding", [0.0, -4.0], [[1.0, 0, 0, 0.7109375], [3.0, 0, 0, 0]], tail, 1, 5.3),
        ("ties to even -> ties away@cast", [0.0, -4.0], [[1.0, 0, 0, 0], [3.0, 0, 0, 0]], STEP, 1, 1.5),
    ]
    params = {"to nearest -> toward zero": "p_rounding", "ties to even -> ties away": "p_rounding",
              "to nearest -> toward zero@row": "row_products", "ties to even -> ties away@cast": "ds_cast"}
    for change, scores, v, go, j, target in jobs:
        name = change.split("@")[0]
        want = params.get(change)
        mut = next(m for m in MUTATIONS if m.change == name and (want is None or m.parameter == want))
        res = None
        for jj in ([j] if j else range(1, len(scores))):
            res = res or solve(scores, v, jj, mut, target, go)
        print(f"{mut.parameter}: {name}: {res}")
        found[change] = res
    print(found)


if __name__ == "__main__":
    main()
