"""Which packages and files the wheel holds; the metadata is in pyproject.toml.

The kernel sources stay at the repository's top: each directory ``kernels/<family>``
(cuda, sycl) is shipped as the package ``fusedmlp_xpu.kernels.<family>``, its sources as
package data. pyproject.toml cannot say this (its package discovery finds no package
outside the package's own directory), hence this file. It lists every directory under
``kernels/``, so a file, a subdirectory or a family added later is carried with no edit
here. A ``kernels/`` that is not itself a package matters: a top-level ``kernels``
package in a checkout would shadow Hugging Face's ``kernels`` wherever the checkout is
on ``sys.path``.
"""
from pathlib import Path

from setuptools import find_packages, setup

KERNELS = "kernels"
#: every kernel source kind; tests/test_packaging.py checks that none is left out
KERNEL_SOURCES = ["*.cpp", "*.hpp", "*.h", "*.cu", "*.cuh", "*.md"]


def kernel_packages() -> dict[str, str]:
    """Package name -> directory, for each directory below kernels/."""
    root = Path(__file__).resolve().parent / KERNELS
    out = {}
    for d in sorted(p for p in root.rglob("*") if p.is_dir()):
        parts = d.relative_to(root).parts
        if "__pycache__" not in parts and all(s.isidentifier() for s in parts):
            out[".".join(("fusedmlp_xpu.kernels",) + parts)] = "/".join((KERNELS,) + parts)
    return out


kernels = kernel_packages()
setup(
    packages=find_packages(include=["fusedmlp_xpu", "fusedmlp_xpu.*"]) + sorted(kernels),
    package_dir=kernels,
    package_data={name: KERNEL_SOURCES for name in kernels},
)
