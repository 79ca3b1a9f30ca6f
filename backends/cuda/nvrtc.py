"""Raw CUDA kernels of the ``cuda`` backend: built by NVRTC, loaded and launched through the driver API.

For kernels Triton cannot write (``digit_gemm.py``: int8 ``wgmma`` products kept in flight). No
extra dependency: ``libnvrtc`` comes with torch's CUDA wheels (``nvidia/*/lib`` beside torch) or
the CUDA toolkit on the loader's path, ``libcuda`` with the driver; both are reached through
ctypes. A build is cached on disk (``$RLKERNEL_CACHE_DIR``, default ``~/.cache/rlkernel``), keyed
by the source, the options and NVRTC's version, so a process pays NVRTC's ~1 s once per
configuration and machine. Launches go to torch's current stream, so they are ordered with
torch's work and can be captured in CUDA graphs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import hashlib
import os
import site
import threading
from pathlib import Path

import torch

_LOCK = threading.Lock()
_NVRTC: ctypes.CDLL | None = None
_CUDA: ctypes.CDLL | None = None


def _nvrtc() -> ctypes.CDLL:
    """libnvrtc from the CUDA wheels beside torch (nvidia/*/lib), or the loader's path."""
    global _NVRTC
    if _NVRTC is not None:
        return _NVRTC
    roots = [*site.getsitepackages(), site.getusersitepackages(), str(Path(torch.__file__).parent.parent)]
    major = (torch.version.cuda or "").split(".")[0]

    def found(root: str, stem: str) -> list[str]:
        # torch's own CUDA major first: a newer NVRTC's cubins need a newer driver than torch's
        paths = [p for p in glob.glob(os.path.join(root, "nvidia", "*", "lib", f"{stem}.so*")) if ".alt." not in p]
        return sorted(paths, key=lambda p: (not (major and p.endswith(f".so.{major}")), p))

    for root in roots:
        libs = found(root, "libnvrtc")
        if libs:
            for b in found(root, "libnvrtc-builtins"):  # libnvrtc dlopens its builtins by name: load them first
                ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
            _NVRTC = ctypes.CDLL(libs[0])
            return _NVRTC
    found = ctypes.util.find_library("nvrtc")
    if found is None:
        raise RuntimeError("libnvrtc not found: install torch's CUDA wheels (they bring nvidia-cuda-nvrtc) or put "
                           "the CUDA toolkit's lib64 on LD_LIBRARY_PATH")
    _NVRTC = ctypes.CDLL(found)
    return _NVRTC


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC that builds the kernels."""
    major, minor = ctypes.c_int(), ctypes.c_int()
    _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


def _driver() -> ctypes.CDLL:
    global _CUDA
    if _CUDA is None:
        _CUDA = ctypes.CDLL("libcuda.so.1")
    return _CUDA


def _check(status: int, what: str) -> None:
    if status:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(status, ctypes.byref(msg))
        raise RuntimeError(f"{what}: CUDA driver error {status} ({(msg.value or b'').decode()})")


def _cache_dir() -> Path:
    return Path(os.environ.get("RLKERNEL_CACHE_DIR") or Path.home() / ".cache" / "rlkernel") / "cubin"


def compile_program(source: str, name: str, options: list[str]) -> tuple[bytes, str, str]:
    """``source`` built by NVRTC with ``options`` (which name the architecture, e.g.
    ``--gpu-architecture=sm_90a``): (cubin, PTX, NVRTC's log, where ``--ptxas-options=-v`` puts
    ptxas's resource report). A failed build raises with the log."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None):
        raise RuntimeError(f"{name}: nvrtcCreateProgram failed")
    try:
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(prog, len(options), opts)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        if status:
            raise RuntimeError(f"{name}: NVRTC {nvrtc_version()} failed (status {status}) with {options}:\n"
                               f"{log.value.decode(errors='replace')[-3000:]}")
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        ptx = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, ptx)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw, ptx.value.decode(), log.value.decode(errors="replace")


def compile_cubin(source: str, name: str, options: list[str]) -> bytes:
    """``source``'s cubin (:func:`compile_program`), cached on disk by source, options and NVRTC version."""
    key = hashlib.sha256("\0".join([source, *options, repr(nvrtc_version())]).encode()).hexdigest()[:32]
    path = _cache_dir() / f"{name}-{key}.cubin"
    if path.is_file():
        return path.read_bytes()
    cubin = compile_program(source, name, options)[0]
    try:  # the cache is an optimisation: a read-only home still builds
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        tmp.replace(path)
    except OSError:
        pass
    return cubin


def _ensure_context(device: int) -> None:
    """Make ``device``'s primary context (torch's) current on this thread if no context is: a thread
    that has made no CUDA runtime call yet has none, and the driver API needs one."""
    cuda = _driver()
    ctx = ctypes.c_void_p()
    _check(cuda.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if ctx.value is None:
        dev = ctypes.c_int()
        _check(cuda.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class CudaKernel:
    """One ``extern "C"`` kernel of a cubin, loaded into each device's primary context on first use."""

    def __init__(self, cubin: bytes, function: str, shared_bytes: int) -> None:
        self.cubin, self.function, self.shared_bytes = cubin, function, shared_bytes
        self._loaded: dict[int, ctypes.c_void_p] = {}

    def _function(self, device: int) -> ctypes.c_void_p:
        fn = self._loaded.get(device)
        if fn is not None:
            return fn
        with _LOCK, torch.cuda.device(device):
            _ensure_context(device)
            cuda = _driver()
            module, fn = ctypes.c_void_p(), ctypes.c_void_p()
            _check(cuda.cuModuleLoadData(ctypes.byref(module), self.cubin), f"cuModuleLoadData({self.function})")
            _check(cuda.cuModuleGetFunction(ctypes.byref(fn), module, self.function.encode()),
                   f"cuModuleGetFunction({self.function})")
            # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
            _check(cuda.cuFuncSetAttribute(fn, 8, self.shared_bytes), f"cuFuncSetAttribute({self.function})")
            self._loaded[device] = fn
        return fn

    def launch(self, device: torch.device, grid: tuple[int, int, int], threads: int, args: list) -> None:
        """Launch on ``device``'s current torch stream; ``args`` are ctypes values in the kernel's order."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        fn = self._function(index)
        # the address of each argument's value (the ctypes objects in ``args`` outlive the call)
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        stream = ctypes.c_void_p(torch.cuda.current_stream(index).cuda_stream)
        with torch.cuda.device(index):  # the launch needs the module's (the device's primary) context current
            _ensure_context(index)
            _check(_driver().cuLaunchKernel(fn, grid[0], grid[1], grid[2], threads, 1, 1, self.shared_bytes, stream,
                                            params, None), f"cuLaunchKernel({self.function})")


#: CUtensorMap: 16 64-bit words (CU_TENSOR_MAP_NUM_QWORDS), passed to a kernel by value
TensorMap = ctypes.c_uint64 * 16


def tensor_map_u8(ptr: int, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...]) -> TensorMap:
    """A TMA descriptor (``cuTensorMapEncodeTiled``) of an int8/uint8 tensor at ``ptr``: ``dims``
    innermost first (elements), ``strides`` of the outer dimensions (bytes, multiples of 16), a
    ``box`` whose innermost extent is 128 bytes, loaded with the 128-byte swizzle (16-byte chunk c
    of row r at chunk c ^ (r % 8)); elements outside the tensor load as zeros."""
    rank = len(dims)
    tmap = TensorMap()
    u64s, u32s = ctypes.c_uint64 * rank, ctypes.c_uint32 * rank
    # data type UINT8 = 0, interleave NONE = 0, swizzle 128B = 3, L2 promotion 128B = 2, OOB fill NONE = 0
    _check(_driver().cuTensorMapEncodeTiled(ctypes.byref(tmap), 0, rank, ctypes.c_void_p(ptr), u64s(*dims),
                                            (ctypes.c_uint64 * (rank - 1))(*strides), u32s(*box), u32s(*[1] * rank),
                                            0, 3, 2, 0), f"cuTensorMapEncodeTiled(dims={dims}, box={box})")
    return tmap

