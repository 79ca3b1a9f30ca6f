"""Run one spawned rank's test body inside a gloo process group and tear the group down cleanly.

Used by the tests that spawn CPU ranks (``test_distributed``, ``test_model_tp``,
``test_train_tp``). The teardown order matters: a process group that is still referenced when
the interpreter exits is destroyed during finalisation, where gloo aborted natively now and then
("terminate called without an active exception", SIGABRT after the rank's last line ran; 2 runs
in 20 of ``test_train_tp`` on 2 cores, and one CI run). Such references outlive the body through
reference cycles: the first ``torch.optim.Optimizer`` of a process imports ``torch._dynamo``,
and that import keeps its callers' frames -- the trainer, the model, the group -- in a cycle
that only the cyclic collector frees. So the body runs in its own frame, every rank passes a
barrier (no rank tears gloo down while another still talks), ``gc.collect()`` frees what the
body left in cycles, and only then is the group destroyed.
"""

from __future__ import annotations

import datetime
import gc
from collections.abc import Callable
from typing import Any

import torch.distributed as dist


def run_in_gloo_group(rank: int, world: int, init_file: str, body: Callable[..., Any], *args: Any,
                      timeout_s: float = 300.0) -> None:
    """Initialise gloo for ``rank`` of ``world`` (file rendezvous), run ``body(*args)``, tear down.

    The barrier runs only when the body returned: a rank whose body raised goes straight to the
    teardown, and ``mp.spawn`` reports its exception (the other ranks then fail on their next
    collective, or are terminated by ``mp.spawn``).
    """
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        body(*args)
        dist.barrier()
    finally:
        gc.collect()
        dist.destroy_process_group()
