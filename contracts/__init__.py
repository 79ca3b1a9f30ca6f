"""Op contracts: one module per op, each the executable definition of that op's bits.

Installed as ``rlkernel.contracts``; always import it under that name. Each module
``rlkernel.contracts.<op>`` defines ``CONTRACT``, ``reference(**inputs)`` and the case
generators of :mod:`rlkernel.contracts._contract`. This package imports nothing from the
rest of rlkernel (import-linter enforces it).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: Every op contract module, in the order reports and docs list them.
CONTRACT_MODULES: tuple[str, ...] = (
    "embedding",
    "linear",
    "rms_norm",
    "rms_norm_backward",
    "rope",
    "rope_backward",
    "silu_mul",
    "silu_mul_backward",
    "softmax",
    "log_softmax",
    "token_logprobs",
    "token_logprobs_backward",
    "token_entropy",
    "token_entropy_backward",
    "attention",
    "attention_backward",
    "all_reduce",
    "sample",
    "group_advantages",
    "ppo_loss",
    "kl_k3",
    "kl_k3_backward",
    "masked_mean",
    "masked_mean_backward",
    "adamw",
    "sgd",
    "exact_sum",
)


def load_contracts(
    names: list[str] | tuple[str, ...] | None = None,
    errors: dict[str, BaseException] | None = None,
) -> tuple[dict[str, ModuleType], list[str]]:
    """Import the contract modules that exist.

    Parameters
    ----------
    names : sequence of str, optional
        Module names to load (default: :data:`CONTRACT_MODULES`). A name outside
        :data:`CONTRACT_MODULES` raises ``ValueError``.
    errors : dict, optional
        If given, a module that exists but fails to import is recorded here (name -> exception)
        instead of raising, so that a runner can report it and go on with the others.

    Returns
    -------
    loaded : dict of str to module
        ``name -> rlkernel.contracts.<name>`` for every module that exists, in list order.
    missing : list of str
        Names whose module file does not exist (yet). A module that exists but fails to
        import raises (or goes to ``errors``): a broken contract is never reported as missing.
    """
    wanted = CONTRACT_MODULES if names is None else tuple(names)
    unknown = [n for n in wanted if n not in CONTRACT_MODULES]
    if unknown:
        raise ValueError(f"unknown contract module(s) {unknown}; known: {list(CONTRACT_MODULES)}")
    loaded: dict[str, ModuleType] = {}
    missing: list[str] = []
    for name in wanted:
        full = f"{__name__}.{name}"
        if importlib.util.find_spec(full) is None:
            missing.append(name)
            continue
        if errors is None:
            loaded[name] = importlib.import_module(full)
            continue
        try:
            loaded[name] = importlib.import_module(full)
        except Exception as exc:  # handed to the caller, which reports it
            errors[name] = exc
    return loaded, missing
