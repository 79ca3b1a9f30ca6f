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

With ``digits=True`` the buffers also hold each weight's int8 digit planes
(``rlkernel.ops.linear_weight_digits``, 3 bytes a weight element), which the decode graphs pass as
``weight_digits=``: on NVIDIA sm_90 linear's wgmma kernel then takes a decode step of 65-256
sequences from 4096 output columns on them instead of the kernel that makes the weight's digits
in registers at every step (:func:`reads_digits`: where that kernel runs).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rlkernel.nn.linear import LinearBase
from rlkernel.ops import linear_exponents, linear_weight_digits

__all__ = ["WeightExponents", "digits_bytes", "one_rank_linears", "reads_digits"]


def one_rank_linears(model: nn.Module) -> list[LinearBase]:
    """The :class:`~rlkernel.nn.linear.LinearBase` layers of ``model`` with ``tp_size == 1``."""
    return [m for m in model.modules() if isinstance(m, LinearBase) and m.tp_size == 1]


def digits_bytes(model: nn.Module) -> int:
    """Bytes the digit planes of ``model``'s one-rank linear weights take (3 a weight element)."""
    return sum(3 * m.weight.numel() for m in one_rank_linears(model))


def reads_digits(device: torch.device) -> bool:
    """Whether linear's kernels on ``device`` read given weight digits at a decode step's rows: an
    NVIDIA sm_90 GPU, where the wgmma digit GEMM runs. Elsewhere they would take memory for nothing;
    so they would with ``RLKERNEL_WGMMA=0`` (the kernel off), which this does not look at: pass
    ``LLM(weight_digits=False)`` then."""
    return (device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device) == (9, 0))


class WeightExponents:
    """Exponent buffers of every one-rank linear layer of ``model`` (``tp_size == 1``).

    Parameters
    ----------
    model : torch.nn.Module
        Its :class:`~rlkernel.nn.linear.LinearBase` layers with ``tp_size == 1`` get a buffer
        each (int64 ``[out_features]``, on the weight's device), filled at construction.
    digits : bool
        Also hold each weight's digit planes (int8 ``[3, out_features, in_features]``).

    Bitwise semantics
    -----------------
    The buffers hold ``linear_exponents(., weight)[1]`` (and ``linear_weight_digits(weight)[1]``)
    of each weight as of the last refresh; a forward inside :meth:`active` gives the bits of one
    without them as long as the weights have not changed since (checked by the op outside a
    capture; by the version counters and the refresh points above for the graphs).
    """

    def __init__(self, model: nn.Module, digits: bool = False) -> None:
        self.layers = one_rank_linears(model)
        self.buffers = [torch.empty(m.weight.shape[0], dtype=torch.int64, device=m.weight.device)
                        for m in self.layers]
        #: The digit planes (``digits=True``), else None.
        self.digits = [torch.empty((3, *m.weight.shape), dtype=torch.int8, device=m.weight.device)
                       for m in self.layers] if digits else None
        self._versions: list[int] = []
        #: How many times the buffers were recomputed.
        self.refreshes = 0
        self.refresh()

    def _current_versions(self) -> list[int]:
        return [m.weight._version for m in self.layers]

    @torch.no_grad()
    def refresh(self) -> None:
        """Recompute every buffer in place from the weights as they are now (one read of each)."""
        for i, (m, buf) in enumerate(zip(self.layers, self.buffers)):
            if self.digits is None:
                buf.copy_(linear_exponents(m.weight[:0], m.weight)[1])
            else:
                ew, planes = linear_weight_digits(m.weight)
                buf.copy_(ew)
                self.digits[i].copy_(planes)
                del planes
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
        for i, (m, buf) in enumerate(zip(self.layers, self.buffers)):
            m.weight_exponents = buf
            m.weight_digits = self.digits[i] if self.digits is not None else None
        try:
            yield
        finally:
            for m in self.layers:
                m.weight_exponents = m.weight_digits = None
