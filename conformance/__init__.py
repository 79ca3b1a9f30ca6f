"""The conformance suite (docs/design.md, "Conformance"): golden bits, adversarial values, invariances, static checks.

Installed as ``rlkernel.conformance``. It is generic: every case comes from a contract module
(``rlkernel.contracts.<op>``) or from a backend's ``static_checks()``; nothing here knows an op.
Run it with ``rlkernel conformance --backend NAME``.
"""
