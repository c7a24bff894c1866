"""Which packages the wheel holds; everything else is in pyproject.toml.

The kernel sources stay at the repository's top (``kernels/``) and are shipped as the
package ``fusedmlp_xpu.kernels`` (``package-dir`` in pyproject.toml). pyproject's package
discovery cannot add a package from outside the package's own directory, hence this file:
the discovered packages plus ``kernels/`` and each directory below it, so a kernel family
or subdirectory added later is carried without an edit here.
"""
from pathlib import Path

from setuptools import find_packages, setup


def kernel_packages() -> list[str]:
    root = Path(__file__).resolve().parent / "kernels"
    parts = [d.relative_to(root).parts for d in sorted(root.rglob("*")) if d.is_dir()]
    return ["fusedmlp_xpu.kernels"] + [
        ".".join(("fusedmlp_xpu.kernels",) + p) for p in parts
        if all(s.isidentifier() for s in p) and "__pycache__" not in p]


setup(packages=find_packages(include=["fusedmlp_xpu", "fusedmlp_xpu.*"]) + kernel_packages())
