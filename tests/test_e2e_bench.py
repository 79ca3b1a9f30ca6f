"""``tools/e2e_bench.py`` at tiny sizes on the CPU: both rollout sides and both trainer sides run and report."""

from __future__ import annotations

import json

import pytest
import torch
from tool_module import load_tool


def _load():
    return load_tool("e2e_bench")


def test_e2e_bench_tiny_on_cpu(tmp_path) -> None:
    pytest.importorskip("transformers")  # the trainer's plain side
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = _load().main(["--config", "tiny", "--prompts", "3", "--prompt-len", "5", "--new-tokens", "3",
                               "--top-k", "20", "--train-seqs", "2", "--train-len", "8", "--device", "cpu",
                               "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    saved = json.loads((tmp_path / "e2e.json").read_text())
    assert saved["rollout"]["ratio"] == result["rollout"]["ratio"] > 0
    for side in ("rlkernel", "native"):
        r = saved["rollout"][side]
        assert r["ops"] == side and r["tokens"] == 3 * 3 and r["tokens_per_s"] > 0 and not r["cuda_graphs"]
    tr = saved["trainer"]
    assert tr["ratio"] > 0 and tr["rlkernel"]["median_s"] > 0 and tr["plain"]["median_s"] > 0
    md = (tmp_path / "e2e.md").read_text()
    assert "Ratio rlkernel / native tokens/s" in md and "Ratio plain / rlkernel step" in md
