"""Where the kernel sources are, for the backends that compile them at run time.

Each family's sources are the package data of ``fusedmlp_xpu.kernels.<family>`` (setup.py
maps the repository's ``kernels/<family>`` to it), found through ``importlib.resources``:
a wheel answers with its installed copy, an editable install with the checkout's
directory. A source tree used with no install at all (``PYTHONPATH=.``) has no such
package; there the ``kernels/`` beside the package directory is the answer.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

PACKAGE = "fusedmlp_xpu.kernels"
#: kernel families, one directory (and package) each
FAMILIES = ("cuda", "sycl")


def kernel_dir(family: str) -> Path:
    """The directory of ``family``'s kernel sources: ``"cuda"`` or ``"sycl"``."""
    if family not in FAMILIES:
        raise ValueError(f"kernel_dir: family must be one of {FAMILIES}, got {family!r}")
    try:
        found = importlib.resources.files(f"{PACKAGE}.{family}")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "kernels" / family
    # NVRTC and the C++ compiler read real files and take -I directories: a package
    # imported from a zip archive has none; its path then names no file, and the
    # backends' available() reports the missing sources under that path
    return found if isinstance(found, Path) else Path(str(found))
