"""Vendor plugins on the real ops: a partial plugin takes only its ops, and ``generic_backend``
makes a backend of the generic kernels for any device type."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

import rlkernel
from rlkernel import registry
from rlkernel.backend import Backend, KernelNotFound
from rlkernel.backends.generic import KERNELS, GenericBackend, generic_backend


class PartialPlugin(Backend):
    """A CPU plugin with one kernel (the generic rms_norm), undercutting the built-in cpu backend."""

    name = "partial"
    device_types = ("cpu",)
    package = "rlkernel.backends.generic"
    kernels: ClassVar[dict[str, str]] = {"rms_norm": "rms_norm:rms_norm"}
    priority = 50


def _register(monkeypatch: pytest.MonkeyPatch, *extra: Backend) -> None:
    backends = dict(registry.all_backends())
    probes = registry.probe_results()
    for backend in extra:
        backends[backend.name] = backend
        probes[backend.name] = backend.probe()
    monkeypatch.setattr(registry, "_backends", backends)
    monkeypatch.setattr(registry, "_probes", probes)
    monkeypatch.delenv("RLKERNEL_BACKEND", raising=False)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_partial_plugin_takes_its_ops_and_the_rest_stay_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _register(monkeypatch, PartialPlugin())
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = torch.ones(64, dtype=torch.bfloat16)
    with rlkernel.trace() as calls:
        y = rlkernel.ops.rms_norm(x, w)
        p = rlkernel.ops.softmax(x)
    assert calls == [("rms_norm", "partial:rms_norm.rms_norm"), ("softmax", "cpu:softmax.softmax")]
    with rlkernel.use_backend("cpu"):
        assert torch.equal(_bits(y), _bits(rlkernel.ops.rms_norm(x, w)))
        assert torch.equal(_bits(p), _bits(rlkernel.ops.softmax(x)))
    assert registry.serving_table()["cpu"]["rms_norm"] == "partial"
    with rlkernel.use_backend("partial"), pytest.raises(KernelNotFound, match="backends that do: .*'cpu'"):
        rlkernel.ops.softmax(x)


def test_generic_backend_serves_the_device_type_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = generic_backend("xpu", name="acme-generic")
    assert issubclass(cls, GenericBackend) and cls.__name__ == "GenericXpuBackend"
    backend = cls()
    assert (backend.name, backend.device_types, backend.priority) == ("acme-generic", ("xpu",), 100)
    assert backend.serves(torch.device("xpu")) and not backend.serves(torch.device("cpu"))
    assert backend.level(torch.device("xpu")) == "unverified"
    assert dict(backend.kernels) == KERNELS
    assert GenericBackend.device_types != ("xpu",)  # the built-in class is left alone
    _register(monkeypatch, backend)
    assert registry.serving_table()["xpu"] == {op: "acme-generic" for op in sorted(KERNELS)}
    assert registry.select("rms_norm", "xpu").name == "acme-generic"


def test_generic_backend_runs_the_generic_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    # On the CPU (the one device here) a generic_backend class undercutting cpu gives cpu's bits.
    _register(monkeypatch, generic_backend("cpu", name="cpu-generic", priority=5)())
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with rlkernel.trace() as calls:
        y = rlkernel.ops.log_softmax(x)
    assert calls == [("log_softmax", "cpu-generic:softmax.log_softmax")]
    with rlkernel.use_backend("cpu"):
        assert torch.equal(_bits(y), _bits(rlkernel.ops.log_softmax(x)))


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"device_type": ""}, "device_type = ''"),
    ({"device_type": "npu:0"}, "without an index"),
    ({"device_type": "npu", "name": ""}, "non-empty backend name"),
])
def test_generic_backend_rejects_bad_arguments(kwargs: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        generic_backend(**kwargs)
