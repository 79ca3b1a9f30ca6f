"""softmax's split plan keeps the sum kernel's per-lane fp64 sums exact (host code: no GPU needed).

``_split_sum_kernel`` adds each lane's terms (integers <= 2**40, exp_c(x - m) <= 1 on the 2**-40 grid)
in fp64 and reads the lane back as the significand of ``acc + 2**52``: exact only while a lane adds
fewer than 2**12 terms, i.e. while a program takes at most ``PROGRAM_TILES`` tiles. The opt-in
one-launch split's plan (``fused_plan``) keeps the same bound, and its launcher refuses a plan whose
int32 ticket counter would overflow.
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


@pytest.mark.parametrize("max_block, item_tiles, per_sm", [(4096, 4, 4), (32, 2, 4), (4096, 1, 2), (2048, 8, 1)])
def test_fused_plan_covers_every_row_and_gives_each_program_work(monkeypatch: pytest.MonkeyPatch, max_block: int,
                                                                 item_tiles: int, per_sm: int) -> None:
    """``fused_plan`` (the opt-in one-launch split): items of whole tiles within ``PROGRAM_TILES``
    covering each row, batches of 1..rows rows, no more programs than items in a step, and items
    shrunk (never below one tile) when a step would leave programs without one."""
    monkeypatch.setattr(softmax, "MAX_BLOCK", max_block)
    monkeypatch.setattr(softmax, "FUSED_ITEM_TILES", item_tiles)
    monkeypatch.setattr(softmax, "FUSED_PROGRAMS_PER_SM", per_sm)
    tile = min(softmax.SPLIT_TILE, max_block)
    for sms in (2, 132):
        for rows in (1, 3, 64, 256, 2048):
            for n in (max_block + 1, 151936, 1 << 20):
                for itemsize in (2, 4):
                    chunk, parts, batch, programs = softmax.fused_plan(rows, n, itemsize, sms)
                    case = (sms, rows, n, itemsize, chunk, parts, batch, programs)
                    assert chunk % tile == 0 and 1 <= chunk // tile <= min(item_tiles, softmax.PROGRAM_TILES), case
                    assert (parts - 1) * chunk < n <= parts * chunk, case
                    assert 1 <= batch <= rows, case
                    assert batch == 1 or batch * n * itemsize <= softmax.FUSED_BATCH_BYTES, case
                    assert 1 <= programs <= min(rows * parts, sms * per_sm), case
                    if chunk > tile:  # items of several tiles only while a step still has one for every program
                        assert rows * parts >= sms * per_sm, case


def test_fused_launch_refuses_a_ticket_count_beyond_int32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused split's int32 ticket counter runs to ``3 * rows * S`` plus two a program: a plan
    beyond int32 launches nothing and returns False (the three-launch path runs instead)."""
    import torch

    # 2 * 2**30 programs alone pass the bound (a plan whose buffers stay tiny if the check ever goes)
    monkeypatch.setattr(softmax, "fused_plan", lambda rows, n, itemsize, sms: (8192, 1, 1, 1 << 30))
    x = torch.zeros(2, 5000)
    assert softmax._launch_fused(x, torch.empty_like(x), 5000, False, torch.float32) is False
