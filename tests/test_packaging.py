"""The package as a user installs it: the wheel carries every kernel source and every
module, the version is written in one place, and the kernel locator finds real files.

The sdist is built with setuptools' build backend and the wheel from the unpacked sdist
(as ``python -m build`` does), all in a temporary directory: nothing is built inside the
checkout. ci/check_wheel.py goes further in CI: it installs the wheel in a fresh venv and
compiles and runs the kernels from there.
"""
from __future__ import annotations

import importlib
import os
import importlib.resources
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import fusedmlp_xpu
from fusedmlp_xpu._version import __version__

REPO = Path(__file__).resolve().parent.parent
kernel_files = importlib.import_module("fusedmlp_xpu.backends.kernel_files")


def _kernel_sources() -> list[str]:
    """Every file of the checkout's kernel families, relative to kernels/ (family/...)."""
    root = REPO / "kernels"
    return sorted(str(p.relative_to(root).as_posix()) for family in kernel_files.FAMILIES
                  for p in (root / family).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel) built from the checkout."""
    pytest.importorskip("setuptools", reason="setuptools, the build backend, builds the wheel")
    out = tmp_path_factory.mktemp("dist")
    name = subprocess.run(
        [sys.executable, "-c", "import sys, setuptools.build_meta as b; "
         "print(b.build_sdist(sys.argv[1]))", str(out)],
        cwd=REPO, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    sdist = out / name
    with tarfile.open(sdist) as tar:
        # the "data" filter where this Python has it (3.10.12+, 3.11.4+): plain files only
        kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(out / "src", **kw)
    (unpacked,) = (out / "src").iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(out), str(unpacked)],
                   check=True, capture_output=True)
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_wheel_carries_every_kernel_source(built):
    sdist, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = _kernel_sources()
    assert len(sources) >= 10, sources
    missing = [s for s in sources if f"fusedmlp_xpu/kernels/{s}" not in names]
    assert not missing, f"kernel sources missing from {wheel.name}: {missing}"
    with tarfile.open(sdist) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    missing = [s for s in sources if f"kernels/{s}" not in in_sdist]
    assert not missing, f"kernel sources missing from {sdist.name}: {missing}"


def test_wheel_carries_every_module(built):
    """A subpackage the package list forgets would be missing from the wheel only."""
    names = set(zipfile.ZipFile(built[1]).namelist())
    modules = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "fusedmlp_xpu").rglob("*.py"))
    missing = [m for m in modules if m not in names]
    assert not missing, f"modules missing from {built[1].name}: {missing}"


def test_version_has_one_source(built):
    pyproject = (REPO / "pyproject.toml").read_text()
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M), \
        "pyproject.toml sets a version: it is read from fusedmlp_xpu/_version.py"
    assert re.search(r'^dynamic\s*=\s*\[[^\]]*"version"', project, re.M), project
    assert 'version = {attr = "fusedmlp_xpu._version.__version__"}' in pyproject
    metadata = zipfile.ZipFile(built[1]).read(
        f"fusedmlp_xpu-{__version__}.dist-info/METADATA").decode()
    assert re.search(rf"^Version: {re.escape(__version__)}$", metadata, re.M), metadata[:300]
    assert fusedmlp_xpu.__version__ == __version__


def test_kernel_locator_finds_the_sources():
    sycl = importlib.import_module("fusedmlp_xpu.backends.sycl")
    cuda_build = importlib.import_module("fusedmlp_xpu.backends.cuda_build")
    assert sycl.KERNEL_DIR == kernel_files.kernel_dir("sycl")
    assert cuda_build.KERNEL_DIR == kernel_files.kernel_dir("cuda")
    for path in (sycl.KERNEL_SOURCE, sycl.PARAMS_HEADER, sycl.SHIM_SOURCE,
                 cuda_build.FORWARD_SOURCE, cuda_build.FORWARD_SM90_SOURCE,
                 cuda_build.BACKWARD_SM90_SOURCE, *cuda_build.HEADERS):
        assert path.is_file(), path
    for source in _kernel_sources():
        family, rel = source.split("/", 1)
        assert (kernel_files.kernel_dir(family) / rel).is_file(), source
    if Path(fusedmlp_xpu.__file__).resolve().parent == REPO / "fusedmlp_xpu":
        # an editable install (or the source tree) reads the checkout's files, not a copy
        for family in kernel_files.FAMILIES:
            assert kernel_files.kernel_dir(family).resolve() == REPO / "kernels" / family


@pytest.mark.parametrize("family", kernel_files.FAMILIES)
def test_kernel_locator_through_importlib_resources(family):
    """An editable install maps fusedmlp_xpu.kernels.<family> to kernels/<family> as a
    wheel installs it: the locator's answer is importlib.resources's."""
    assert (REPO / "kernels" / family / "__init__.py").is_file(), \
        f"kernels/{family} needs an __init__.py to be the package {kernel_files.PACKAGE}.{family}"
    try:
        found = importlib.resources.files(f"{kernel_files.PACKAGE}.{family}")
    except ModuleNotFoundError:
        pytest.skip("the source tree is not installed (pip install -e . maps the kernels)")
    assert kernel_files.kernel_dir(family) == found


def test_kernels_is_no_top_level_package():
    """A kernels/__init__.py would make the checkout's kernels/ shadow Hugging Face's
    ``kernels`` package wherever the checkout is on sys.path."""
    assert not (REPO / "kernels" / "__init__.py").exists()
    assert kernel_files.FAMILIES == tuple(sorted(
        d.name for d in (REPO / "kernels").iterdir() if (d / "__init__.py").is_file()))


def test_kernel_locator_without_an_install(monkeypatch):
    """A source tree on sys.path with no install has no fusedmlp_xpu.kernels.<family>."""
    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib.resources, "files", missing)
    assert kernel_files.kernel_dir("sycl") == \
        Path(kernel_files.__file__).resolve().parents[2] / "kernels" / "sycl"


def test_kernel_dir_names_the_bad_family():
    with pytest.raises(ValueError, match="family must be one of .*'rocm'"):
        kernel_files.kernel_dir("rocm")


def _venv(path: Path, python: str | Path = sys.executable) -> Path:
    subprocess.run([str(python), "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def _purelib(python: Path) -> Path:
    return Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip())


def test_check_wheel_venv_sees_the_calling_venv(tmp_path):
    """ci/check_wheel.py run from inside a venv: its fresh venv sees that venv's packages
    (`venv --system-site-packages` saw the base interpreter's: no torch), its
    ``site.getsitepackages()`` lists them (NVRTC is looked up there), and an editable
    install of the checkout stays out. The calling venv is one made here, holding a
    module of its own, on top of this interpreter's packages."""
    sys.path.insert(0, str(REPO / "ci"))
    try:
        check_wheel = importlib.import_module("check_wheel")
    finally:
        sys.path.remove(str(REPO / "ci"))
    outer = _venv(tmp_path / "outer")
    check_wheel.see_parent_packages(outer)  # the outer venv: torch from this interpreter
    (_purelib(outer) / "outer_only_module.py").write_text("WHERE = 'outer'\n")
    inner = tmp_path / "inner"
    subprocess.run([str(outer), "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "import check_wheel, pathlib, subprocess; "
                    "subprocess.run([sys.executable, '-m', 'venv', '--without-pip', sys.argv[2]], "
                    "check=True); "
                    "check_wheel.see_parent_packages(pathlib.Path(sys.argv[2], 'bin', 'python'))",
                    str(REPO / "ci"), str(inner)], check=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [str(inner / "bin" / "python"), "-c",
         "import site, sys, importlib.util, outer_only_module, torch; "
         "print(sys.prefix); print(repr(site.getsitepackages())); "
         "print(importlib.util.find_spec('fusedmlp_xpu') is not None)"],
        cwd=tmp_path, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, f"the inner venv lacks the outer's packages:\n{probe.stderr}"
    prefix, sitepackages, finds_package = probe.stdout.splitlines()
    assert Path(prefix) == inner
    assert str(_purelib(outer)) in sitepackages, sitepackages
    if Path(fusedmlp_xpu.__file__).resolve().is_relative_to(REPO):  # editable or the tree
        assert finds_package == "False", "the checkout's fusedmlp_xpu leaked into the venv"
