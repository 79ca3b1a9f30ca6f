"""Selection of the rocm, ascend and musa backends on a CPU machine, with the vendor simulated.

No AMD, Ascend or MUSA device is here. What is simulated is only what the backends look at: a
ROCm build of torch (``torch.version.hip``, ``gcnArchName``), and the torch_npu / torch_musa
plugins (a module that installs ``torch.npu`` / ``torch.musa`` reporting a device). The ops
themselves are never faked: forced onto CPU tensors, the ascend and musa backends run the real
device-generic kernels, compared bit for bit with the contract's reference.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from typing import Any

import pytest
import torch

from rlkernel import registry
from rlkernel.backend import Backend
from rlkernel.backends.ascend import AscendBackend
from rlkernel.backends.musa import MusaBackend
from rlkernel.backends.rocm import RocmBackend
from rlkernel.backends.triton.targets import CUDA, ROCM
from rlkernel.dispatch import trace, use_backend


def _fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe every backend again under the simulated facts (restored after the test)."""
    monkeypatch.setattr(registry, "_backends", None)
    monkeypatch.setattr(registry, "_probes", {})
    monkeypatch.delenv("RLKERNEL_BACKEND", raising=False)


def _fake_plugin(monkeypatch: pytest.MonkeyPatch, plugin: str, device_type: str, *, devices: int = 1,
                 name: str = "Fake 910B") -> None:
    """A ``plugin`` module whose import installs ``torch.<device_type>`` with ``devices`` devices."""
    module = types.ModuleType(plugin)
    module.__spec__ = importlib.machinery.ModuleSpec(plugin, None)
    device = types.SimpleNamespace(is_available=lambda: devices > 0, device_count=lambda: devices,
                                   get_device_name=lambda index=None: name)
    monkeypatch.setitem(sys.modules, plugin, module)
    monkeypatch.setattr(torch, device_type, device, raising=False)


def _as_rocm_build(monkeypatch: pytest.MonkeyPatch, arch: str = "gfx942:sramecc+:xnack-") -> None:
    monkeypatch.setattr(torch.version, "hip", "6.3.42131", raising=False)
    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    props = types.SimpleNamespace(gcnArchName=arch, name="AMD Instinct MI300X", multi_processor_count=304)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)


# ------------------------------------------------------------------------------------------- rocm


def test_rocm_build_selects_rocm_not_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    _as_rocm_build(monkeypatch)
    _fresh_registry(monkeypatch)
    probes = registry.probe_results()
    assert probes["rocm"][0], probes["rocm"]
    assert not probes["cuda"][0] and "ROCm" in probes["cuda"][1], probes["cuda"]
    assert [b.name for b in registry.default_backends("cuda")] == ["rocm"]
    assert registry.select("linear", "cuda").name == "rocm"


def test_cuda_build_selects_cuda_not_rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8", raising=False)
    _fresh_registry(monkeypatch)
    probes = registry.probe_results()
    assert probes["cuda"][0] and not probes["rocm"][0], probes
    assert "not a ROCm build" in probes["rocm"][1]
    assert [b.name for b in registry.default_backends("cuda")] == ["cuda"]


@pytest.mark.parametrize(("gcn", "arch", "level"), [("gfx942:sramecc+:xnack-", "gfx942", "compiled"),
                                                    ("gfx90a:sramecc+:xnack-", "gfx90a", "compiled"),
                                                    ("gfx950", "gfx950", "compiled"),
                                                    ("gfx1100", "gfx1100", "unverified")])
def test_rocm_architecture_and_level(monkeypatch: pytest.MonkeyPatch, gcn: str, arch: str, level: str) -> None:
    _as_rocm_build(monkeypatch, gcn)
    backend = RocmBackend()
    device = torch.device("cuda", 0)
    assert backend.architecture(device) == arch
    assert backend.level(device) == level


def test_rocm_and_cuda_bind_their_own_target() -> None:
    """The same launcher, each backend's configuration: nothing of one target leaks into the other."""
    from rlkernel.backends.cuda import CudaBackend

    rocm, cuda = RocmBackend().kernel("linear"), CudaBackend().kernel("linear")
    assert rocm.keywords == {"target": ROCM} and cuda.keywords == {"target": CUDA}  # type: ignore[attr-defined]
    assert rocm.func is cuda.func  # type: ignore[attr-defined]
    assert RocmBackend().kernel_name("linear") == "rocm:linear.linear"
    assert RocmBackend().kernel("rms_norm") is CudaBackend().kernel("rms_norm")  # no target: the same function


def test_rocm_prefill_tile_fits_amd_lds() -> None:
    bm, bn, bk, _, _ = ROCM.linear_prefill
    assert (4 * bm * bk + 3 * bn * bk) <= 64 << 10
    assert ROCM.warp_size == 64 and ROCM.compiler == "hip"


def test_fp64_attention_products_only_where_exact() -> None:
    """CUDA's attention takes fp64 products (Triton 3.6 cannot lower them for gfx942, so ROCm keeps the
    int8 digits); a head dim whose q.k sums could pass 2**53 is refused with the bound, not rounded."""
    from rlkernel.backends.triton.attention import F64_KEYS, F64_MAX_D, check_head_dim

    assert CUDA.attention_f64 and not ROCM.attention_f64
    assert F64_MAX_D * 2**40 <= 2**52 and F64_KEYS * 2**40 <= 2**52  # |operands| <= 2**20 each
    check_head_dim("attention", F64_MAX_D, CUDA)
    check_head_dim("attention", 2 * F64_MAX_D, ROCM)  # int8 digits fold into int64: no such bound
    with pytest.raises(ValueError, match=r"head_dim D=8192 exceeds 4096.*split the heads"):
        check_head_dim("attention", 2 * F64_MAX_D, CUDA)


def test_paged_cache_beyond_32_bit_slots_is_refused() -> None:
    """The paged kernels index cache rows in 32-bit unsigned arithmetic: a cache of more slots is
    refused with the count and the bound, before any kernel (a zero-stride view: no memory)."""
    import torch

    from rlkernel.backends.triton.attention_paged import attention_paged

    cache = torch.zeros(1, dtype=torch.bfloat16).expand(2**28, 32, 1, 8)  # 2**33 slots
    q = torch.zeros(1, 2, 8, dtype=torch.bfloat16)
    one = torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"8589934592 token slots.*at most 2\*\*32 - 1"):
        attention_paged(q, cache, cache, torch.zeros(1, 1, dtype=torch.int32), one, torch.tensor([0, 1]),
                        target=CUDA)


# ------------------------------------------------------------------------------------------- ascend, musa


VENDORS = [(AscendBackend, "torch_npu", "npu"), (MusaBackend, "torch_musa", "musa")]


@pytest.mark.parametrize(("cls", "plugin", "device_type"), VENDORS)
def test_vendor_unusable_without_its_plugin(monkeypatch: pytest.MonkeyPatch, cls: type[Backend], plugin: str,
                                            device_type: str) -> None:
    monkeypatch.setitem(sys.modules, plugin, None)  # `import plugin` fails, find_spec finds nothing
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == plugin else
                        importlib.machinery.PathFinder.find_spec(name))
    ok, reason = cls().probe()
    assert not ok and f"{plugin} is not installed" in reason, reason


@pytest.mark.parametrize(("cls", "plugin", "device_type"), VENDORS)
def test_vendor_unusable_without_a_device(monkeypatch: pytest.MonkeyPatch, cls: type[Backend], plugin: str,
                                          device_type: str) -> None:
    _fake_plugin(monkeypatch, plugin, device_type, devices=0)
    ok, reason = cls().probe()
    assert not ok and "no" in reason and device_type in reason, reason


@pytest.mark.parametrize(("cls", "plugin", "device_type"), VENDORS)
def test_vendor_selected_for_its_device_type(monkeypatch: pytest.MonkeyPatch, cls: type[Backend], plugin: str,
                                             device_type: str) -> None:
    _fake_plugin(monkeypatch, plugin, device_type, devices=2, name="Fake Device X1")
    _fresh_registry(monkeypatch)
    backend = registry.get_backend(cls.name)
    ok, reason = registry.probe_results()[cls.name]
    assert ok and "2" in reason, reason
    assert registry.serving_table()[device_type]["linear"] == cls.name
    assert backend.verification == {"*": "unverified"}
    assert backend.architecture(torch.device("cpu")) == "Fake_Device_X1"
    assert backend.level(torch.device("cpu")) == "unverified"


@pytest.mark.parametrize(("cls", "plugin", "device_type"), VENDORS)
def test_vendor_declares_its_integer_width(monkeypatch: pytest.MonkeyPatch, cls: type[Backend], plugin: str,
                                           device_type: str) -> None:
    """ascend: ``auto`` (int64 on the AI Core is the known risk: the int64 probes decide on first use and
    the generic sums move to int32 limbs if one fails); musa follows CUDA: int64."""
    from rlkernel.backends.generic._exact import intpath

    monkeypatch.setattr(intpath, "_declared", {})
    _fake_plugin(monkeypatch, plugin, device_type)
    ok, reason = cls().probe()
    expected = "auto" if cls is AscendBackend else "int64"
    assert ok and f"integer sums: {expected}" in reason, reason
    assert intpath._declared == {device_type: expected}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.int8}[t.element_size()])


@pytest.mark.parametrize(("cls", "plugin", "device_type"), VENDORS)
def test_vendor_backend_runs_the_generic_kernels(monkeypatch: pytest.MonkeyPatch, cls: type[Backend], plugin: str,
                                                 device_type: str) -> None:
    """Forced onto CPU tensors (the device being simulated), the backend runs the real generic code;
    its bits are the reference's and the cpu backend's, and the trace names the vendor backend."""
    from rlkernel.backends.generic import linear as generic_linear
    from rlkernel.contracts import linear as linear_contract
    from rlkernel.contracts import rms_norm as rms_contract

    _fake_plugin(monkeypatch, plugin, device_type)
    monkeypatch.setattr(cls, "device_types", (device_type, "cpu"))
    # the path an NPU/MUSA device takes (CPU tensors take the float64 one): fp32 digit GEMMs
    monkeypatch.setattr(generic_linear, "_path", lambda device: "digits")
    _fresh_registry(monkeypatch)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    nw = torch.randn(64, generator=g).to(torch.bfloat16)
    import rlkernel

    with use_backend(cls.name), trace() as calls:
        y = rlkernel.ops.linear(x, w)
        r = rlkernel.ops.rms_norm(x, nw, eps=1e-6)
    names = [name for _, name in calls]  # the generic linear notes its path
    assert names == [f"{cls.name}:linear.linear[digits]", f"{cls.name}:rms_norm.rms_norm"], names
    refs: dict[str, Any] = {"linear": linear_contract.reference(x, w), "rms_norm": rms_contract.reference(x, nw, 1e-6)}
    assert torch.equal(_bits(y), _bits(refs["linear"]))
    assert torch.equal(_bits(r), _bits(refs["rms_norm"]))
    with use_backend("cpu"):
        assert torch.equal(_bits(rlkernel.ops.linear(x, w)), _bits(y))


def test_info_names_the_backend_and_level_of_a_rocm_device(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from rlkernel import cli

    _as_rocm_build(monkeypatch)
    _fresh_registry(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "AMD Instinct MI300X")
    cli.main(["info"])
    out = capsys.readouterr().out
    assert "cuda:0: AMD Instinct MI300X (gfx942:sramecc+:xnack-) -> rocm (gfx942: compiled)" in out, out
