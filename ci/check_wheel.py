"""The wheel a user installs, checked from outside the checkout.

    python ci/check_wheel.py

Builds the sdist and the wheel (``python -m build``: the wheel is built from the sdist,
so a file the sdist forgets is missing from the wheel too) into a temporary directory,
runs ``twine check`` on both, installs the wheel (no dependencies, not editable) into a
fresh venv that sees this interpreter's site-packages (torch, dpctl, cuda-bindings come
from there, nothing is downloaded; from a system Python or from inside a venv alike, and
without an editable install of the checkout), and from that venv, in a directory outside the
checkout and with an empty kernel cache, checks that:

- ``fusedmlp_xpu`` is imported from the venv, not from the checkout, and its kernel
  sources are the wheel's, every one of the checkout's ``kernels/`` files present;
- the sycl backend builds its host shim and runs forward + backward on ``opencl:cpu``
  against the reference (ci/check_sycl.py);
- the cuda backend's NVRTC compiles one forward and one backward configuration for
  sm_90a from the wheel's sources (no GPU needed);
- ``fusedmlp info`` runs.

Needs ``build`` and ``twine`` (pip install build twine). Exits 1 on any failure.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
INSIDE = "--inside-venv"


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def see_parent_packages(python: Path) -> None:
    """Give the venv this interpreter's packages, after its own.

    Not ``venv --system-site-packages``: run from inside a venv, that gives the base
    interpreter's packages, not this environment's (no torch there). A .pth file instead:
    plain paths, whose own .pth files are not run (so an editable install of the checkout
    here stays out of the venv), and this prefix added to ``site.PREFIXES``, so that
    ``site.getsitepackages()`` lists these folders too (cuda-pathfinder looks for NVRTC's
    library there, as it would in a venv made with --system-site-packages)."""
    import site

    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    if site.ENABLE_USER_SITE and site.getusersitepackages() in sys.path:
        dirs.append(site.getusersitepackages())
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True).stdout.strip()
    lines = dirs + [f"import site; site.PREFIXES.append({sys.prefix!r})"]
    Path(purelib, "_fusedmlp_parent_env.pth").write_text("".join(f"{ln}\n" for ln in lines))


def build_and_install(work: Path) -> Path:
    """Build, check and install the wheel into ``work/venv``; return the venv's python."""
    dist = work / "dist"
    try:  # quiet unless it fails
        run([sys.executable, "-m", "build", "--outdir", dist, REPO], capture_output=True,
            text=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"python -m build failed:\n{e.stdout[-4000:]}\n{e.stderr[-4000:]}")
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise SystemExit(f"expected one wheel and one sdist in {dist}, got "
                         f"{[p.name for p in dist.iterdir()]}")
    run([sys.executable, "-m", "twine", "check", "--strict", *wheels, *sdists])
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    see_parent_packages(python)
    # the system's pip, run by the venv's interpreter, installs into the venv
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheels[0]])
    return python


def check_installed() -> int:
    """Run inside the venv (cwd outside the checkout): 0 when everything passes."""
    import importlib

    import torch

    import fusedmlp_xpu as fm

    pkg = Path(fm.__file__).resolve().parent
    if not pkg.is_relative_to(Path(sys.prefix).resolve()) or pkg.is_relative_to(REPO):
        print(f"fusedmlp_xpu imported from {pkg}, not from the venv {sys.prefix}")
        return 1
    kernel_files = importlib.import_module("fusedmlp_xpu.backends.kernel_files")
    sources, missing = [], []
    for family in kernel_files.FAMILIES:
        installed, checkout = kernel_files.kernel_dir(family), REPO / "kernels" / family
        if not installed.is_relative_to(pkg):
            print(f"{family} kernel sources found at {installed}, outside the installed package")
            return 1
        for p in sorted(checkout.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                sources.append(p)
                if not (installed / p.relative_to(checkout)).is_file():
                    missing.append(str(p.relative_to(REPO)))
    print(f"fusedmlp_xpu {fm.__version__} from {pkg}: "
          f"{len(sources) - len(missing)} of the checkout's {len(sources)} kernel files installed")
    if missing:
        print(f"  missing from the installed package: {missing}")
        return 1

    import check_sycl  # ci/check_sycl.py, beside this file (sys.path[0])

    if check_sycl.check():
        return 1

    cb = importlib.import_module("fusedmlp_xpu.backends.cuda_build")
    spec = fm.MLPSpec((64,) * 6, "relu", "none", False, torch.float16)  # narrow-w64
    fwd, why_f = cb.forward_config(spec, family="wgmma")
    bwd, why_b = cb.backward_config(spec, True, True)
    if fwd is None or bwd is None:
        print(f"cuda: no configuration for narrow-w64: {why_f or why_b}")
        return 1
    for name, cfg, compile_ in (("forward", fwd, cb.compile_forward),
                                ("backward", bwd, cb.compile_backward)):
        t0 = time.perf_counter()
        try:
            built = compile_(cfg, "sm_90a")
        except cb.CudaToolchainError as e:
            print(f"cuda: NVRTC failed on the {name} {cfg.describe()}: {e}")
            return 1
        if built.cached:
            print(f"cuda: the {name} came from the disk cache, not NVRTC (clear the cache)")
            return 1
        print(f"cuda: NVRTC compiled the {name} {cfg.describe()} for sm_90a in "
              f"{time.perf_counter() - t0:.1f} s, {len(built.cubin)} B cubin")
    return 0


def main() -> int:
    if INSIDE in sys.argv:
        return check_installed()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fusedmlp-wheel-") as tmp:
        work = Path(tmp)
        python = build_and_install(work)
        away = work / "elsewhere"
        away.mkdir()
        # a fresh kernel cache, so the shim and the cubins are built from the wheel's files
        env = dict(os.environ, FUSEDMLP_CACHE_DIR=str(work / "cache"))
        env.pop("PYTHONPATH", None)
        checks = [[python, Path(__file__).resolve(), INSIDE],
                  [python.parent / "fusedmlp", "info"]]
        for cmd in checks:
            try:
                run(cmd, cwd=away, env=env)
            except subprocess.CalledProcessError as e:
                print(f"FAILED ({e.returncode}): {' '.join(str(c) for c in cmd)}")
                return 1
    print(f"wheel checks passed in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
