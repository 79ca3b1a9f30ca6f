"""The accuracy suite: every op against float64 truth, next to the native kernel it replaces.

Bitwise conformance says every backend gives the contract's bits; this suite says how good
those bits are. ``rlkernel accuracy`` runs :mod:`.runner` over the measurements of
:mod:`.ops` (one module per op) on named, deterministic data sets (:mod:`.data`: outlier
channels, massive activations, attention sinks, long context, Qwen3 widths, rounding
traps), computes :mod:`.metrics` against float64, and writes :mod:`.report`. Tolerances and
float64 live here, never in the conformance suite.
"""
