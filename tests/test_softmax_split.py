"""softmax's split plan keeps the sum kernel's per-lane fp64 sums exact (host code: no GPU needed).

``_split_sum_kernel`` adds each lane's terms (integers <= 2**40, exp_c(x - m) <= 1 on the 2**-40 grid)
in fp64 and reads the lane back as the significand of ``acc + 2**52``: exact only while a lane adds
fewer than 2**12 terms, i.e. while a program takes at most ``PROGRAM_TILES`` tiles.
"""

from __future__ import annotations

import pytest

softmax = pytest.importorskip("rlkernel.backends.triton.softmax")


@pytest.mark.parametrize("max_block, programs", [(4096, 1024), (32, 3), (32, 1024), (2048, 1)])
def test_split_plan_keeps_every_lane_below_2_52(monkeypatch: pytest.MonkeyPatch, max_block: int,
                                                programs: int) -> None:
    monkeypatch.setattr(softmax, "MAX_BLOCK", max_block)
    monkeypatch.setattr(softmax, "SPLIT_PROGRAMS", programs)
    assert softmax.PROGRAM_TILES * 2**40 < 2**52
    for rows in (1, 3, 64, 256, 2048, 1 << 16):
        for n in (max_block + 1, 151936, 1 << 20, softmax.MAX_N):
            tile, chunk, parts = softmax.split_plan(rows, n)
            assert tile <= max_block and chunk % tile == 0, (rows, n, tile, chunk)
            assert chunk // tile <= softmax.PROGRAM_TILES, (rows, n, tile, chunk)
            assert (parts - 1) * chunk < n <= parts * chunk, (rows, n, chunk, parts)
