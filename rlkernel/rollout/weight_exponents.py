"""The row exponents of a model's linear weights, held in fixed buffers for the decode graphs.

``rlkernel.ops.linear`` puts each weight row on a 21-bit grid relative to the row's exponent, so
every call reads the whole weight once for the exponents before its GEMM reads it again. The
weights do not change during a rollout, so the captured decode graphs read the exponents from
buffers instead (``weight_exponents=``): one read of every weight per refresh, not per step
(about 1.2 GB a step for Qwen3-0.6B's 28 layers).

The buffers are a copy of what the weights imply, so they are refreshed whenever the weights may
have changed: at every :meth:`~rlkernel.rollout.LLM.generate` call and
:meth:`~rlkernel.rollout.LLM.refresh_weights`, and before a replay when any weight's version
counter moved (an in-place update through autograd-visible ops: optimizer steps, ``copy_`` under
``no_grad``). Outside a capture the op checks given exponents against the weight, so an eager
forward with stale buffers raises rather than computing on the wrong grid.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rlkernel.nn.linear import LinearBase
from rlkernel.ops import linear_exponents

__all__ = ["WeightExponents"]


class WeightExponents:
    """Exponent buffers of every one-rank linear layer of ``model`` (``tp_size == 1``).

    Parameters
    ----------
    model : torch.nn.Module
        Its :class:`~rlkernel.nn.linear.LinearBase` layers with ``tp_size == 1`` get a buffer
        each (int64 ``[out_features]``, on the weight's device), filled at construction.

    Bitwise semantics
    -----------------
    The buffers hold ``linear_exponents(., weight)[1]`` of each weight as of the last refresh;
    a forward inside :meth:`active` gives the bits of one without them as long as the weights
    have not changed since (checked by the op outside a capture; by the version counters and the
    refresh points above for the graphs).
    """

    def __init__(self, model: nn.Module) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, LinearBase) and m.tp_size == 1]
        self.buffers = [torch.empty(m.weight.shape[0], dtype=torch.int64, device=m.weight.device)
                        for m in self.layers]
        self._versions: list[int] = []
        #: How many times the buffers were recomputed.
        self.refreshes = 0
        self.refresh()

    def _current_versions(self) -> list[int]:
        return [m.weight._version for m in self.layers]

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute every buffer in place from the weights as they are now (one read of each)."""
        for m, buf in zip(self.layers, self.buffers):
            buf.copy_(linear_exponents(m.weight[:0], m.weight)[1])
        self._versions = self._current_versions()
        self.refreshes += 1

    def refresh_if_changed(self) -> bool:
        """:meth:`refresh` if any weight's version counter moved since the last one; returns whether it did.

        Writes through ``.data`` or raw pointers (a loader's ``param.data.copy_``) do not move
        the counters: after those, call :meth:`refresh` (``LLM.refresh_weights``)."""
        if self._current_versions() == self._versions:
            return False
        self.refresh()
        return True

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block, every layer's forward passes its buffer to ``rlkernel.ops.linear``."""
        for m, buf in zip(self.layers, self.buffers):
            m.weight_exponents = buf
        try:
            yield
        finally:
            for m in self.layers:
                m.weight_exponents = None
