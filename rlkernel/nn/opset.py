"""Which functions the layers call for each op: the exact ``rlkernel.ops``, or a baseline with the same signatures.

The layers of :mod:`rlkernel.nn` call their ops through ``self.ops``, an :class:`OpSet`. Every
layer and every model is built with :data:`EXACT` (``rlkernel.ops``, bitwise). The rollout
engine's performance baseline, ``LLM(model, ops="native")``, runs the same model code, scheduler,
KV cache and CUDA graphs over torch's own ops (:data:`rlkernel.rollout.native_ops.NATIVE`): an
op set with ``bitwise=False``, which the trainer refuses and nothing selects by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import rlkernel.ops as exact

__all__ = ["EXACT", "OpSet", "OpsUser"]

Op = Callable[..., Any]


@dataclass(frozen=True)
class OpSet:
    """The forward ops of the model and the rollout engine, each with ``rlkernel.ops``' signature.

    Attributes
    ----------
    name : str
        ``"rlkernel"`` (exact) or ``"native"`` (torch's ops; the rollout engine's baseline).
    bitwise : bool
        True only for :data:`EXACT`: the results are the contracts' bits. A set with False is a
        measurement baseline: its results depend on the batch, the library and the device.
    embedding, linear, rms_norm, rope, silu_mul, attention, attention_paged, token_logprobs, log_softmax, sample
        Functions with the signatures of ``rlkernel.ops.<name>``.
    """

    name: str
    bitwise: bool
    embedding: Op
    linear: Op
    rms_norm: Op
    rope: Op
    silu_mul: Op
    attention: Op
    attention_paged: Op
    token_logprobs: Op
    log_softmax: Op
    sample: Op


#: The exact ops (``rlkernel.ops``): what every layer and model uses unless built otherwise.
EXACT = OpSet(name="rlkernel", bitwise=True, embedding=exact.embedding, linear=exact.linear,
              rms_norm=exact.rms_norm, rope=exact.rope, silu_mul=exact.silu_mul, attention=exact.attention,
              attention_paged=exact.attention_paged, token_logprobs=exact.token_logprobs,
              log_softmax=exact.log_softmax, sample=exact.sample)


class OpsUser:
    """Mixin of the layers that call ops: ``self.ops`` is :data:`EXACT` unless the model was built
    with another set (:class:`~rlkernel.model.qwen3.Qwen3ForCausalLM` ``ops=``)."""

    ops: OpSet = EXACT
