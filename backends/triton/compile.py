"""Compile the shared kernels ahead of time, without a GPU, for a target's architectures.

``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget(...))`` needs neither the
device nor its toolkit: Triton ships ptxas for NVIDIA and LLVM's AMDGPU backend and ld.lld for
AMD, so a CPU machine compiles sm_90 PTX/cubins and gfx942 AMDGCN/hsaco alike. The static checks
of each backend (``backends/cuda/static_checks.py``, ``backends/rocm/static_checks.py``) scan what
this produces.

Each op module exposes ``static_specs(target)`` -> ``[(op, case, kernel, signature, constexprs[,
options])]``: every specialisation the launchers use on that target, ``options`` the launch's
``num_warps``/``num_stages`` where they are not the defaults.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .targets import TritonTarget

#: (op, case, kernel, signature, constexprs, launch options)
Spec = tuple[str, str, Callable[..., Any], dict[str, str], dict[str, Any], dict[str, Any]]

#: modules of this package that contribute static specs besides the op modules of KERNELS
_EXTRA_MODULES = ("_prims",)


def triton_version() -> tuple[int, int]:
    import triton

    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def make_source(fn: Any, signature: dict[str, str], constexprs: dict[str, Any],
                aligned: tuple[str, ...] = ()) -> Any:
    """A ``triton.compiler.ASTSource`` for ``fn`` in the format of the installed Triton.

    ``signature`` maps every argument name to a type string (``"*fp32"``, ``"i32"``) or
    ``"constexpr"``; ``constexprs`` maps constexpr names to values. ``aligned`` names arguments
    (pointers, integers) given the ``tt.divisibility`` 16 a launch gets from 16-byte aligned
    tensors and integers divisible by 16 (Triton >= 3.3 only; the static specs name none).
    """
    from triton.compiler import ASTSource

    names = list(fn.arg_names)
    missing = [n for n in names if n not in signature]
    if missing:
        raise ValueError(f"static check of {fn.__name__}: signature lacks arguments {missing}")
    if triton_version() >= (3, 3):
        # Triton >= 3.3 (3.6 on the H200, 3.9 in CI): every argument is in the signature (a
        # constexpr as "constexpr"); constexpr values are keyed by argument-index tuples.
        sig = {n: signature[n] for n in names}
        consts = {(names.index(k),): v for k, v in constexprs.items()}
        attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in aligned}
        return ASTSource(fn, sig, consts, attrs)
    if aligned:
        raise ValueError(f"aligned arguments need Triton >= 3.3 (this is {triton_version()})")
    # Triton 3.0-3.2: the signature lists the non-constexpr arguments by index; constants by index
    sig = {i: signature[n] for i, n in enumerate(names) if signature[n] != "constexpr"}
    consts = {names.index(k): v for k, v in constexprs.items()}
    return ASTSource(fn, sig, consts)


def compile_for(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], *, compiler: str,
                arch: int | str, warp_size: int, options: dict[str, Any], aligned: tuple[str, ...] = ()) -> Any:
    """``triton.compile`` of one specialisation for ``GPUTarget(compiler, arch, warp_size)``.

    ``options`` are Triton compile options (``num_warps``, ``num_stages``, ``enable_fp_fusion``);
    every caller here passes ``enable_fp_fusion=False`` as the launches do (R1); ``aligned`` as in
    ``make_source``.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    src = make_source(fn, signature, constexprs, aligned)
    return triton.compile(src, target=GPUTarget(compiler, arch, warp_size), options=options)


def all_specs(target: TritonTarget) -> list[Spec]:
    """Every (op, case, kernel, signature, constexprs, options) the launchers use on ``target``."""
    from . import KERNELS

    modules = list(_EXTRA_MODULES)
    for entry in KERNELS.values():
        mod = entry.split(":")[0]
        if mod not in modules:
            modules.append(mod)
    specs: list[Spec] = []
    for mod in modules:
        module = importlib.import_module(f"{__package__}.{mod}")
        fn = getattr(module, "static_specs", None)
        if fn is None:
            continue
        for spec in fn(target):
            op, case, kernel, signature, constexprs, *rest = spec
            specs.append((op, case, kernel, signature, constexprs, dict(rest[0]) if rest else {}))
    return specs
