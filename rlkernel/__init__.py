"""rlkernel: bitwise-reproducible kernels for RL post-training across GPU vendors.

The same inputs give the same bits on every backend, batch composition, chunking and
tensor-parallel degree (docs/design.md, docs/numerics.md). Public entry points:

- :mod:`rlkernel.ops`: the functional ops (imported on first attribute access).
- :mod:`rlkernel.rl`: PPO/GRPO losses under verl's names, with exact micro-batch partials;
  AdamW/SGD on fp32 master weights.
- :mod:`rlkernel.nn`, :mod:`rlkernel.model`: modules and the Qwen3 model (trainer and rollout).
- :mod:`rlkernel.grads`: exact weight gradients (micro-batch invariant accumulation).
- :mod:`rlkernel.rollout`, :mod:`rlkernel.train`: the rollout engine and the GRPO loop.
- :func:`trace`, :func:`last_kernel`: which backend and kernel ran.
- :func:`use_backend`: force a backend for the calls in a block.
- :class:`KernelNotFound`, :class:`BackwardNotDefined`: the errors of dispatch.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

from rlkernel.backend import KernelNotFound
from rlkernel.dispatch import BackwardNotDefined, last_kernel, trace, use_backend

try:
    __version__ = version("rlkernel")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

# Subpackages loaded on first access, so `import rlkernel` stays cheap and an op module
# that imports `rlkernel` back cannot form an import cycle. Only what exists: a name listed
# here shows in dir(rlkernel) and must import.
_LAZY = ("grads", "model", "nn", "ops", "rl", "rollout", "train")

__all__ = ["BackwardNotDefined", "KernelNotFound", "__version__", "grads", "last_kernel", "model", "nn", "ops", "rl",
           "rollout", "trace", "train", "use_backend"]


def __getattr__(name: str) -> ModuleType:
    if name in _LAZY:
        module = importlib.import_module(f"rlkernel.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'rlkernel' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
