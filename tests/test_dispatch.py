"""Registry and dispatch: per-op selection, forced backends that never fall through, clear errors,
and a record of every kernel that ran.

Fake backends are registered by replacing ``rlkernel.registry._backends``; their kernels live in
a fake package inserted into ``sys.modules``.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
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


def test_each_op_goes_to_the_best_backend_that_has_it(fakes: dict[str, Backend]) -> None:
    # fakecpu (priority 10) lacks "triple": the op goes to slowcpu (20), the next cpu backend that has it,
    # while "double" stays on fakecpu. (Before per-op selection, "triple" raised KernelNotFound.)
    x = torch.arange(3.0)
    with rlkernel.trace() as calls:
        tripled = dispatch.call("triple", x.device, x=x)
        doubled = dispatch.call("double", x.device, x=x)
    assert torch.equal(tripled.view(torch.int32), (x * 3).view(torch.int32))
    assert torch.equal(doubled.view(torch.int32), (x * 2).view(torch.int32))
    assert calls == [("triple", "slowcpu:ops.triple"), ("double", "fakecpu:ops.double")]
    assert registry.select("triple", "cpu").name == "slowcpu"
    assert registry.select("double", "cpu").name == "fakecpu"


def test_an_op_no_usable_backend_of_the_device_has_names_the_backends_that_do(fakes: dict[str, Backend]) -> None:
    with pytest.raises(KernelNotFound) as info:
        dispatch.call("quadruple", torch.device("cpu"), x=torch.ones(2))
    message = str(info.value)
    assert "no usable backend for 'cpu' tensors has a kernel for 'quadruple'" in message
    assert "backends that do: none" in message
    assert registry.backends_with("triple") == ["slowcpu", "fakegpu"]


def test_a_forced_backend_never_falls_through(fakes: dict[str, Backend], monkeypatch: pytest.MonkeyPatch) -> None:
    with rlkernel.use_backend("fakecpu"), pytest.raises(KernelNotFound) as info:
        dispatch.call("triple", torch.device("cpu"), x=torch.ones(2))
    message = str(info.value)
    assert message.startswith("rlkernel.use_backend('fakecpu'): backend 'fakecpu' has no kernel for 'triple'")
    assert "backends that do: ['slowcpu', 'fakegpu']" in message and "never falls through" in message
    monkeypatch.setenv("RLKERNEL_BACKEND", "fakecpu")
    with pytest.raises(KernelNotFound, match=r"^RLKERNEL_BACKEND='fakecpu': backend 'fakecpu' has no kernel"):
        dispatch.call("triple", torch.device("cpu"), x=torch.ones(2))
    with pytest.raises(KernelNotFound, match=r"^--backend fakecpu: backend 'fakecpu' has no kernel"):
        registry.select("triple", "cpu", forced="fakecpu", source="--backend")


def test_errors_name_the_forcing_the_user_used(fakes: dict[str, Backend], monkeypatch: pytest.MonkeyPatch) -> None:
    # --backend fakegpu must not be reported as RLKERNEL_BACKEND='fakegpu' (it used to be)
    with pytest.raises(RuntimeError) as info:
        registry.backend_for("cpu", forced="fakegpu", source="--backend")
    assert str(info.value).startswith("--backend fakegpu: backend 'fakegpu' is not usable here: fake driver")
    assert "RLKERNEL_BACKEND" not in str(info.value)
    with rlkernel.use_backend("fakegpu"), pytest.raises(RuntimeError, match=r"^rlkernel.use_backend\('fakegpu'\)"):
        dispatch.call("triple", torch.device("cpu"), x=torch.ones(2))


def test_the_per_op_choice_follows_probe_and_device_changes(fakes: dict[str, Backend]) -> None:
    # the default choice is cached per (op, device type); a changed probe or device list must show
    assert registry.select("double", "cpu").name == "fakecpu"
    registry._probes["fakecpu"] = (False, "driver gone")  # in place, as tests and tools do
    assert registry.select("double", "cpu").name == "slowcpu"
    fakes["fakegpu"].device_types = ("meta", "cpu")  # type: ignore[misc]
    registry._probes["fakegpu"] = (True, "now usable")
    assert registry.select("triple", "cpu").name == "slowcpu"  # priority 20 beats fakegpu's 100
    registry._probes["slowcpu"] = (False, "driver gone")
    assert registry.select("triple", "cpu").name == "fakegpu"


def test_serving_table_shows_which_backend_runs_each_op(fakes: dict[str, Backend]) -> None:
    table = registry.serving_table()
    assert table == {"cpu": {"double": "fakecpu", "double_path": "fakecpu", "triple": "slowcpu"}}
    assert registry.describe_serving(table["cpu"]) == "fakecpu: double, double_path; slowcpu: triple"


def test_serving_is_logged_once_at_info(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    module = types.ModuleType("_rlkernel_test_fake_backends")
    module.FakeCpu, module.SlowCpu = FakeCpu, SlowCpu  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(registry, "_BUILTINS", (f"{module.__name__}:FakeCpu", f"{module.__name__}:SlowCpu"))
    monkeypatch.setattr(registry, "entry_points", lambda group: [])
    monkeypatch.setattr(registry, "_backends", None)
    monkeypatch.setattr(registry, "_probes", {})
    with caplog.at_level("INFO", logger="rlkernel.registry"):
        registry.all_backends()
        registry.all_backends()
    lines = [r.getMessage() for r in caplog.records if "ops:" in r.getMessage()]
    assert lines == ["rlkernel: cpu ops: fakecpu: double, double_path; slowcpu: triple"]


def test_no_usable_cuda_backend_names_the_torch_build_not_an_extra() -> None:
    # A CPU-only torch cannot be fixed by pip install 'rlkernel[cuda]': the message must say so.
    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA; the message under test is for a CPU-only torch")
    with pytest.raises(RuntimeError) as info:
        registry.backend_for("cuda")
    message = str(info.value)
    assert "was built without CUDA; install a CUDA build of torch" in message
    assert "rlkernel[cuda]" not in message


def test_trace_and_last_kernel_record_what_ran(fakes: dict[str, Backend]) -> None:
    x = torch.arange(3.0)
    with rlkernel.trace() as outer:
        out = dispatch.call("double", x.device, x=x)
        with rlkernel.use_backend("slowcpu"), rlkernel.trace() as inner:
            dispatch.call("triple", x.device, x=x)  # forced: slowcpu
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
    assert "ops" in dir(rlkernel) and "rl" in dir(rlkernel)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        rlkernel.nonexistent  # noqa: B018


def test_every_name_rlkernel_lists_imports() -> None:
    # dir(rlkernel) used to list nn and model, whose import raised ModuleNotFoundError.
    import subprocess

    code = ("import importlib, rlkernel\n"
            "for name in dir(rlkernel):\n"
            "    getattr(rlkernel, name)\n"
            "for name in rlkernel._LAZY:\n"
            "    importlib.import_module(f'rlkernel.{name}')\n"
            "for name in rlkernel.__all__:\n"
            "    assert name in dir(rlkernel), name\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert rlkernel.KernelNotFound is KernelNotFound and rlkernel.BackwardNotDefined is dispatch.BackwardNotDefined


def test_info_lists_per_device_which_backend_serves_which_ops(fakes: dict[str, Backend],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from rlkernel import cli

    cli.main(["info"])
    out = capsys.readouterr().out
    section = out[out.index("dispatch (per op"):out.index("contracts:")].splitlines()
    assert section[1:] == ["  cpu:", "    fakecpu    double, double_path", "    slowcpu    triple"]
    assert "  rms_norm " in out  # the contracts are still listed (imported lazily by the command)


def test_cli_names_the_backend_flag_the_user_passed(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # `rlkernel conformance --backend cuda` on a CPU-only torch printed "RLKERNEL_BACKEND='cuda' is not usable"
    if torch.version.cuda is not None:
        pytest.skip("this torch has CUDA; the message under test is for a CPU-only torch")
    from rlkernel import cli

    monkeypatch.delenv("RLKERNEL_BACKEND", raising=False)
    assert cli.main(["conformance", "--backend", "cuda", "--op", "rms_norm", "--out", str(tmp_path)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--backend cuda: backend 'cuda' is not usable here" in err and "RLKERNEL_BACKEND" not in err
    assert "install a CUDA build of torch" in err and "rlkernel[cuda]" not in err
