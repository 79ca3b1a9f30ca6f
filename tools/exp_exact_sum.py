"""Experiment (issue 12, trainer): the Triton exact_sum kernels at weight-gradient sizes, against the
bytes floor and the device-generic torch code. Not part of the product; JSON to argv[1]."""

from __future__ import annotations

import json
import sys

import torch
import triton


def main() -> None:
    from rlkernel.backends.generic import exact_sum as G
    from rlkernel.backends.triton import exact_sum as T

    n = 1 << 24
    g = torch.Generator(device="cuda").manual_seed(0)
    terms = torch.randn(1, n, generator=g, device="cuda")
    part = T.exact_sum_partial(terms)
    two = torch.stack([part, T.exact_sum_partial(terms * 3)])
    row = {"elements": n, "state_gb": n * 160 / 1e9}
    row["partial_S1_ms"] = triton.testing.do_bench(lambda: T.exact_sum_partial(terms))
    row["merge_K2_ms"] = triton.testing.do_bench(lambda: T.exact_sum_merge(two))
    row["finish_ms"] = triton.testing.do_bench(lambda: T.exact_sum_finish(part))
    row["equal_generic"] = bool(torch.equal(G.exact_sum_merge(two), T.exact_sum_merge(two))
                                and torch.equal(G.exact_sum_partial(terms), part)
                                and torch.equal(G.exact_sum_finish(two[1]).view(torch.int32),
                                                T.exact_sum_finish(two[1]).view(torch.int32)))
    row["generic_partial_S1_ms"] = triton.testing.do_bench(lambda: G.exact_sum_partial(terms), rep=200)
    row["generic_merge_K2_ms"] = triton.testing.do_bench(lambda: G.exact_sum_merge(two), rep=200)
    row["floor_partial_ms"] = (n * 164) / 4.8e9
    row["floor_merge_ms"] = (n * 480) / 4.8e9
    print(json.dumps(row), flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(row, f, indent=1)


if __name__ == "__main__":
    main()
