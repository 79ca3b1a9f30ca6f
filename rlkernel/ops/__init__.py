"""Public functional ops: validate the inputs, dispatch by device, run the backend kernel.

Every op has the same name in every layer: ``contracts/<op>.py`` defines it bitwise,
``backends/<vendor>/<op>.py`` implements it, and ``rlkernel.ops.<op>`` is what users call.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public op name -> module under rlkernel.ops that defines it
_OPS = {
    "embedding": "embedding",
    "linear": "linear",
    "linear_exponents": "linear",
    "linear_partial": "linear",
    "linear_finish": "linear",
    "rms_norm": "rms_norm",
    "rope": "rope",
    "rope_tables": "rope",
    "silu_mul": "silu_mul",
    "softmax": "softmax",
    "log_softmax": "softmax",
    "token_logprobs": "token_logprobs",
    "token_logprobs_partial": "token_logprobs",
    "token_logprobs_finish": "token_logprobs",
    "attention": "attention",
    "attention_paged": "attention",
    "all_reduce": "all_reduce",
    "sample": "sample",
    "group_advantages": "rl",
    "ppo_loss": "rl",
    "kl_k3": "rl",
    "masked_mean": "rl",
}

__all__ = sorted(_OPS)


def __getattr__(name: str) -> Any:
    module = _OPS.get(name)
    if module is None:
        raise AttributeError(f"rlkernel.ops has no op {name!r}; ops: {', '.join(sorted(_OPS))}")
    return getattr(importlib.import_module(f"rlkernel.ops.{module}"), name)


def __dir__() -> list[str]:
    return __all__
