"""The ``cuda`` backend: Triton kernels for NVIDIA GPUs (CuPy only where Triton lacks something).

The probe is cheap: it checks that torch was built for CUDA (not ROCm, which also presents
``cuda`` devices) and that Triton is importable, without initialising a device.
"""

from __future__ import annotations

import importlib.util
from typing import ClassVar

import torch

from rlkernel.backend import Backend

#: op -> "module:function" in this package. An op without a kernel here is absent: dispatch then
#: raises an error naming the backends that have it (never a silent fallback). Ops under
#: ``torch_exact`` are exact device code in torch operations rather than Triton kernels.
KERNELS: dict[str, str] = {
    "all_reduce": "all_reduce:all_reduce",
    "attention": "attention:attention",
    "attention_paged": "attention:attention_paged",
    "embedding": "embedding:embedding",
    "kl_k3": "rl:kl_k3",
    "linear": "linear:linear",
    "linear_exponents": "linear:linear_exponents",
    "linear_partial": "linear:linear_partial",
    "linear_finish": "linear:linear_finish",
    "rms_norm": "rms_norm:rms_norm",
    "rope": "rope:rope",
    "silu_mul": "silu_mul:silu_mul",
    "token_logprobs": "token_logprobs:token_logprobs",
    "token_logprobs_partial": "token_logprobs:token_logprobs_partial",
    "token_logprobs_finish": "token_logprobs:token_logprobs_finish",
    "softmax": "softmax:softmax",
    "log_softmax": "softmax:log_softmax",
    "sample": "torch_exact:sample",
    "group_advantages": "torch_exact:group_advantages",
    "ppo_loss": "torch_exact:ppo_loss",
    "masked_mean": "torch_exact:masked_mean",
    "adamw": "torch_exact:adamw",
    "sgd": "torch_exact:sgd",
}


class CudaBackend(Backend):
    """Triton kernels on NVIDIA GPUs."""

    name = "cuda"
    device_types = ("cuda",)
    package = "rlkernel.backends.cuda"
    kernels = KERNELS
    #: sm_90: the full conformance suite ran on an H200 with 0 failures
    #: (conformance/results/cuda-sm_90-H200/report.json: 681 passed, commit 6bbfc61, v2 contracts)
    verification: ClassVar[dict[str, str]] = {"sm_90": "verified"}
    priority = 10

    def probe(self) -> tuple[bool, str]:
        # when using hip devices, the device string in pytorch is "cuda": that is the rocm backend
        if getattr(torch.version, "hip", None):
            return False, "torch is a ROCm build; the rocm backend serves its cuda devices"
        if torch.version.cuda is None:  # an rlkernel extra cannot fix this: torch itself must change
            return False, (f"the installed torch {torch.__version__} was built without CUDA; install a CUDA build "
                           f"of torch (https://pytorch.org/get-started/locally/)")
        if importlib.util.find_spec("triton") is None:
            return False, "triton is not installed (pip install 'rlkernel[cuda]')"
        return True, f"torch CUDA {torch.version.cuda}, triton available"

    def architecture(self, device: torch.device) -> str:
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"

    def static_checks(self, ops: list[str] | None = None) -> list[tuple[str, str, bool, str]]:
        """Compile the kernels of ``ops`` (default: every kernel) for sm_90 without a GPU and scan
        the PTX (``static_checks.py``)."""
        from .static_checks import static_checks

        return static_checks(ops)
