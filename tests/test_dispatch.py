"""Registry and dispatch: clear errors, no fallback, and a record of every kernel that ran.

Fake backends are registered by replacing ``rlkernel.registry._backends``; their kernels live in
a fake package inserted into ``sys.modules``.
"""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import pytest
import torch

import rlkernel
from rlkernel import dispatch, registry
from rlkernel.backend import Backend, KernelNotFound

PKG = "_rlkernel_test_fake_kernels"


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _double_int8_path(x: torch.Tensor) -> torch.Tensor:
    dispatch.note_kernel("int8")
    return x * 2


def _triple(x: torch.Tensor) -> torch.Tensor:
    return x * 3


class FakeCpu(Backend):
    name = "fakecpu"
    device_types = ("cpu",)
    package = PKG
    kernels: ClassVar[dict[str, str]] = {"double": "ops:double", "double_path": "ops:double_int8_path"}
    priority = 10


class SlowCpu(Backend):
    name = "slowcpu"
    device_types = ("cpu",)
    package = PKG
    kernels: ClassVar[dict[str, str]] = {"double": "ops:double", "triple": "ops:triple"}
    priority = 20


class ForcedOnly(Backend):
    name = "forcedonly"
    device_types = ("cpu",)
    package = PKG
    kernels: ClassVar[dict[str, str]] = {"double": "ops:double"}
    priority = -1


class FakeGpu(Backend):
    name = "fakegpu"
    device_types = ("meta",)  # any real torch device type that no other fake serves
    package = PKG
    kernels: ClassVar[dict[str, str]] = {"triple": "ops:triple"}

    def probe(self) -> tuple[bool, str]:
        return False, "fake driver not installed"


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Backend]:
    pkg = types.ModuleType(PKG)
    pkg.__path__ = []
    ops = types.ModuleType(f"{PKG}.ops")
    ops.double, ops.double_int8_path, ops.triple = _double, _double_int8_path, _triple  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, PKG, pkg)
    monkeypatch.setitem(sys.modules, f"{PKG}.ops", ops)
    backends: dict[str, Backend] = {b.name: b for b in (FakeCpu(), SlowCpu(), ForcedOnly(), FakeGpu())}
    monkeypatch.setattr(registry, "_backends", backends)
    monkeypatch.setattr(registry, "_probes", {name: b.probe() for name, b in backends.items()})
    monkeypatch.delenv("RLKERNEL_BACKEND", raising=False)
    return backends


def test_unknown_backend_names_the_known_ones(fakes: dict[str, Backend]) -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'nope'.*fakecpu"):
        registry.get_backend("nope")
    with rlkernel.use_backend("nope"), pytest.raises(ValueError, match="unknown backend 'nope'"):
        dispatch.call("double", torch.device("cpu"), x=torch.ones(2))


def test_forced_backend_that_cannot_serve_the_device_raises(fakes: dict[str, Backend]) -> None:
    # fakegpu is unusable here: forcing it is an error, never a fallback to a CPU backend
    with pytest.raises(RuntimeError, match="not usable here: fake driver not installed"):
        registry.backend_for("cpu", forced="fakegpu")
    with pytest.raises(RuntimeError, match=r"serves \('cpu',\), not 'meta'"):
        registry.backend_for("meta", forced="fakecpu")


def test_environment_variable_forces_a_backend(fakes: dict[str, Backend], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKERNEL_BACKEND", "slowcpu")
    assert registry.backend_for("cpu").name == "slowcpu"
    monkeypatch.setenv("RLKERNEL_BACKEND", "fakegpu")
    with pytest.raises(RuntimeError, match="RLKERNEL_BACKEND='fakegpu'"):
        registry.backend_for("cpu")


def test_default_choice_is_lowest_priority_and_never_a_forced_only_backend(fakes: dict[str, Backend]) -> None:
    assert registry.backend_for("cpu").name == "fakecpu"
    assert registry.backend_for("cpu", forced="forcedonly").name == "forcedonly"
    with pytest.raises(RuntimeError, match="no usable rlkernel backend serves 'meta'"):
        registry.backend_for("meta")


def test_missing_kernel_names_the_backends_that_have_it(fakes: dict[str, Backend]) -> None:
    with pytest.raises(KernelNotFound) as info:
        dispatch.call("triple", torch.device("cpu"), x=torch.ones(2))
    message = str(info.value)
    assert "backend 'fakecpu' has no kernel for 'triple'" in message
    assert "slowcpu" in message and "fakegpu" in message
    assert registry.backends_with("triple") == ["slowcpu", "fakegpu"]


def test_trace_and_last_kernel_record_what_ran(fakes: dict[str, Backend]) -> None:
    x = torch.arange(3.0)
    with rlkernel.trace() as outer:
        out = dispatch.call("double", x.device, x=x)
        with rlkernel.use_backend("slowcpu"), rlkernel.trace() as inner:
            dispatch.call("triple", x.device, x=x)
        assert rlkernel.last_kernel() == "slowcpu:ops.triple"
        dispatch.call("double_path", x.device, x=x)
    assert torch.equal(out.view(torch.int32), (x * 2).view(torch.int32))
    assert inner == [("triple", "slowcpu:ops.triple")]
    assert outer == [
        ("double", "fakecpu:ops.double"),
        ("triple", "slowcpu:ops.triple"),
        ("double_path", "fakecpu:ops.double_int8_path[int8]"),
    ]
    assert rlkernel.last_kernel() == "fakecpu:ops.double_int8_path[int8]"


def test_use_backend_restores_the_previous_choice(fakes: dict[str, Backend]) -> None:
    cpu = torch.device("cpu")
    with rlkernel.use_backend("slowcpu"):
        with rlkernel.use_backend("fakecpu"):
            assert dispatch.select("double", cpu).name == "fakecpu"
        assert dispatch.select("double", cpu).name == "slowcpu"
    assert dispatch.select("double", cpu).name == "fakecpu"


def test_package_exports() -> None:
    assert callable(rlkernel.trace) and callable(rlkernel.last_kernel) and callable(rlkernel.use_backend)
    assert isinstance(rlkernel.__version__, str)
    assert "ops" in dir(rlkernel)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        rlkernel.nonexistent  # noqa: B018
