"""Backends: kernels only, one package per vendor (``cpu``, ``generic``, ``cuda``, ...).

Installed as ``rlkernel.backends``. A backend never imports ``rlkernel.contracts`` or
``rlkernel.conformance`` (import-linter enforces it): the reference is the thing a backend is
compared with, never a part of it. See ``docs/adding-a-backend.md``.
"""
