"""Package layout: four top-level directories installed under one ``rlkernel`` namespace.

``rlkernel/`` -> ``rlkernel``, ``contracts/`` -> ``rlkernel.contracts``, ``backends/`` ->
``rlkernel.backends``, ``conformance/`` -> ``rlkernel.conformance`` (docs/design.md, "Layers"). The package
list is computed so new subpackages need no edit here; everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

_DIRS = {"rlkernel": "rlkernel", "rlkernel.contracts": "contracts", "rlkernel.backends": "backends",
         "rlkernel.conformance": "conformance"}

packages = []
for name, path in _DIRS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(path)]

setup(packages=packages, package_dir=_DIRS)
