"""Experiment (issue 12, attention prefill past 4 096 keys): the chunked fp64 path at 32 or 16 rows a block.

Not part of the product. Sequences longer than ``F64_KEYS`` keys run the chunked path (fp64
accumulators folded into int64 sums every 4 096 keys), which spills more at 32 rows than the
one-chunk path (``CHUNKS_BLOCK_M`` in backends/triton/attention.py, 16 since c349312's run of this
tool). For causal prefill of one Qwen3-8B-shaped sequence (32 query heads, 8 KV heads, D 128, bf16;
``rlkernel bench``'s inputs) at T = 2 048 (one chunk: the reference point) and past it, times
``attention`` at 32-row blocks (the c349312 JSON calls them ``launcher``) and at 16
(``triton.testing.do_bench``, median) next to SDPA flash as the bench calls it, and checks that both
tiles give the same bytes (each row's arithmetic is its own). Writes JSON::

    python tools/exp_attention_chunks.py OUT.json [T ...]
"""

# ruff: noqa: B023  (each closure is timed inside its own loop iteration)
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton


def main() -> None:
    from rlkernel import ops
    from rlkernel.backends.triton import attention as A
    from rlkernel.contracts import attention as contract

    out = Path(sys.argv[1])
    lengths = [int(t) for t in sys.argv[2:]] or [2048, 6144, 8192]
    rows = []
    for t in lengths:
        g = torch.Generator(device="cuda").manual_seed(t)
        q = torch.randn(t, 32, 128, generator=g, device="cuda").to(torch.bfloat16)
        k = torch.randn(t, 8, 128, generator=g, device="cuda").to(torch.bfloat16)
        v = torch.randn(t, 8, 128, generator=g, device="cuda").to(torch.bfloat16)
        cu = torch.tensor([0, t], device="cuda", dtype=torch.int32)
        args = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "scale": None, "causal": True}
        row: dict[str, object] = {"T": t, "chunked": t > A.F64_KEYS}
        row["native_ms"] = float(triton.testing.do_bench(lambda: contract._sdpa_varlen_prefill(**args),
                                                         warmup=5, rep=50, return_mode="median"))
        outputs = {}
        saved = A.CHUNKS_BLOCK_M
        for label, bm in (("rows32", None), ("rows16", 16)):  # None: _tiles' 32 rows
            A.CHUNKS_BLOCK_M = bm
            outputs[label] = ops.attention(**args)
            ms = float(triton.testing.do_bench(lambda: ops.attention(**args), warmup=1, rep=50,
                                               return_mode="median"))
            row[f"{label}_ms"] = ms
            row[f"{label}_ratio"] = row["native_ms"] / ms
        A.CHUNKS_BLOCK_M = saved
        row["bitwise_equal"] = bool(torch.equal(outputs["rows32"].view(torch.int16),
                                                outputs["rows16"].view(torch.int16)))
        rows.append(row)
        print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
