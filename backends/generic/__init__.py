"""The device-generic backend: plain tensor ops that are exact on any IEEE device.

Digit GEMMs run on the device's own matmul (exact per R4), sums are integer sums, and
elementwise math is R1 operations and the contract exp/log built from them. It never calls a
contract's reference. As ``cpu`` it serves CPU tensors by default; as ``generic`` it can be
forced (``RLKERNEL_BACKEND=generic``) onto any device, e.g. CUDA, Ascend NPU or MUSA. For a
new device type, :func:`generic_backend` makes a backend class that serves it by default.
"""

from __future__ import annotations

import platform
from typing import ClassVar

import torch

from rlkernel.backend import Backend

#: op -> "module:function" inside this package; the same table serves ``cpu`` and ``generic``.
KERNELS = {
    "embedding": "embedding:embedding",
    "linear": "linear:linear",
    "linear_exponents": "linear:linear_exponents",
    "linear_weight_digits": "linear:linear_weight_digits",
    "linear_partial": "linear:linear_partial",
    "linear_finish": "linear:linear_finish",
    "rms_norm": "rms_norm:rms_norm",
    "rms_norm_backward": "rms_norm_backward:rms_norm_backward",
    "rope": "rope:rope",
    "rope_backward": "rope_backward:rope_backward",
    "silu_mul": "silu_mul:silu_mul",
    "silu_mul_backward": "silu_mul_backward:silu_mul_backward",
    "softmax": "softmax:softmax",
    "log_softmax": "softmax:log_softmax",
    "token_logprobs": "token_logprobs:token_logprobs",
    "token_logprobs_partial": "token_logprobs:token_logprobs_partial",
    "token_logprobs_finish": "token_logprobs:token_logprobs_finish",
    "token_logprobs_backward": "token_logprobs_backward:token_logprobs_backward",
    "token_logprobs_backward_partial": "token_logprobs_backward:token_logprobs_backward_partial",
    "token_logprobs_backward_finish": "token_logprobs_backward:token_logprobs_backward_finish",
    "token_entropy": "token_entropy:token_entropy",
    "token_entropy_backward": "token_entropy:token_entropy_backward",
    "attention": "attention:attention",
    "attention_paged": "attention:attention_paged",
    "attention_backward": "attention_backward:attention_backward",
    "all_reduce": "all_reduce:all_reduce",
    "sample": "sample:sample",
    "group_advantages": "rl:group_advantages",
    "ppo_loss": "rl:ppo_loss",
    "kl_k3": "rl:kl_k3",
    "kl_k3_backward": "rl_backward:kl_k3_backward",
    "masked_mean": "rl:masked_mean",
    "masked_mean_backward": "rl_backward:masked_mean_backward",
    "adamw": "optim:adamw",
    "sgd": "optim:sgd",
    "exact_sum_partial": "exact_sum:exact_sum_partial",
    "exact_sum_merge": "exact_sum:exact_sum_merge",
    "exact_sum_finish": "exact_sum:exact_sum_finish",
    "exact_sum_accumulate": "exact_sum:exact_sum_accumulate",
    "exact_sum_total": "exact_sum:exact_sum_total",
}


class GenericBackend(Backend):
    """Device-generic exact kernels on any device type (forced only)."""

    name = "generic"
    device_types = ("cpu", "cuda", "npu", "musa", "xpu")
    package = "rlkernel.backends.generic"
    kernels = KERNELS
    #: sm_90: the full suite passed on an H200 (conformance/results/generic-cuda-sm_90-H200/report.json);
    #: on the CPU the same kernels serve the ``cpu`` backend, whose level is its own
    verification: ClassVar[dict[str, str]] = {"sm_90": "verified"}
    priority = -1  # never chosen by default: it must be asked for

    def architecture(self, device: torch.device) -> str:
        if device.type == "cuda" and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device)
            return f"sm_{major}{minor}"
        if device.type == "cpu":
            return platform.machine()
        return device.type


def generic_backend(device_type: str, name: str | None = None, priority: int = 100,
                    verification: dict[str, str] | None = None) -> type[GenericBackend]:
    """A backend class running the generic kernels on ``device_type`` tensors, for a vendor to register.

    The quickest way to run every op on a new device type: register the returned class
    through the entry-point group ``rlkernel.backends``, run the conformance suite, then add
    fast kernels in a backend of your own with a lower priority: dispatch is per op, so your
    kernels take the ops they have and the generic ones keep the rest.

    Parameters
    ----------
    device_type : str
        The torch device type served (``"npu"``, ``"musa"``, a renamed PrivateUse1 type).
    name : str, optional
        Unique backend name (``RLKERNEL_BACKEND``, ``--backend``, reports); default
        ``"generic-<device_type>"``.
    priority : int
        Per op, the usable backend with the lowest priority that has the op runs it; ``< 0``:
        used only when forced. Default 100 (the built-in ``cpu`` backend's).
    verification : dict of str to str, optional
        Architecture -> ``verified`` / ``compiled`` / ``unverified``; default ``{"*": "unverified"}``
        (``verified`` only with a committed conformance report for that architecture).

    Returns
    -------
    type[GenericBackend]
        A new subclass; subclass it again to override ``probe()`` or ``architecture()``.

    Raises
    ------
    ValueError
        ``device_type`` or ``name`` is empty, or ``device_type`` holds an index (``"npu:0"``).

    Examples
    --------
    In the vendor package (``rlkernel_acme/__init__.py``)::

        from rlkernel.backends.generic import generic_backend

        AcmeGeneric = generic_backend("acme", name="acme-generic")

    and in its ``pyproject.toml``::

        [project.entry-points."rlkernel.backends"]
        acme-generic = "rlkernel_acme:AcmeGeneric"
    """
    if not isinstance(device_type, str) or not device_type or ":" in device_type:
        raise ValueError(f"generic_backend: device_type = {device_type!r}; expected a torch device type without "
                         f"an index, e.g. 'npu'")
    backend_name = f"generic-{device_type}" if name is None else name
    if not isinstance(backend_name, str) or not backend_name:
        raise ValueError(f"generic_backend: name = {name!r}; expected a non-empty backend name")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"generic_backend: priority must be an int, got {type(priority).__name__}")
    attrs = {
        "__doc__": f"The generic kernels on {device_type!r} tensors (made by generic_backend).",
        "name": backend_name,
        "device_types": (device_type,),
        "priority": priority,
        "verification": dict(verification) if verification is not None else {"*": "unverified"},
    }
    cls_name = "".join(part.capitalize() for part in f"generic_{device_type}".replace("-", "_").split("_"))
    return type(f"{cls_name}Backend", (GenericBackend,), attrs)
