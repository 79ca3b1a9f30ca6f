"""Exact primitives of the contracts (docs/numerics.md): the reference definitions."""
