"""Where torch's AOTInductor loader crashes: tests/test_deploy.py's package (every FusedMLP
and GatedMLP case and the PatchTST forecaster, decomposed to standard ops, compiled once
for the CPU) loaded and run from Python in child processes that differ in one thing each.
test_aoti_package_runs_from_python died with SIGSEGV inside aoti_load_package under torch
2.11 on the H100 and H200 hosts (Python 3.12), while the same torch ran it on a CPU-only
machine (Python 3.11 and 3.12) and the C++ runner loads the same package on the GPU hosts.
Records each child's exit status and last output, the compiler, the package's shared
libraries and what they link, and a native backtrace (gdb) of the first child that dies.

    python benchmarks/aoti_probe.py [--out TABLE.jsonl] [--run ID]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import zipfile

import torch

from fusedmlp_xpu.bench.tools import add_output_arguments, environment, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_LOAD = """
import sys, torch
run = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded", flush=True)
if sys.argv[2] != "-":
    out = [[t.shape for t in run(*c)] for c in torch.load(sys.argv[2])]
    print("ran", len(out), "calls", flush=True)
"""

# (name, environment changes, run the package after loading it)
VARIANTS = [
    ("as the test", {}, True),
    ("load only", {}, False),
    ("no GPU visible", {"CUDA_VISIBLE_DEVICES": ""}, True),
    ("one OpenMP thread", {"OMP_NUM_THREADS": "1"}, True),
]


def _tail(text: str, n: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-n:]).replace(ROOT + os.sep, "")


def _status(rc: int) -> str:
    return f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"


def build(tmp: str) -> tuple[str, str]:
    """The test's package and its inputs (two calls) -> (package path, inputs path)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import test_deploy as td  # the zoo, its inputs and dynamic batch dims, as the test has them

    import fusedmlp_xpu as fm

    zoo = td.Zoo()
    ep = torch.export.export(zoo, td.inputs(5),
                             dynamic_shapes=({0: td.batch_dim("b")}, {0: td.batch_dim("s")}))
    ep = ep.run_decompositions(fm.export_decompositions())
    package = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(tmp,
                                                                                     "zoo.pt2"))
    calls = os.path.join(tmp, "in.pt")
    torch.save([list(td.inputs(b, seed=7)) for b in (3, 64)], calls)
    return package, calls


def libraries(package: str, tmp: str) -> dict:
    """The package's shared libraries and ``ldd``'s view of each (trimmed)."""
    out = {}
    with zipfile.ZipFile(package) as z:
        for name in z.namelist():
            if name.endswith(".so"):
                path = z.extract(name, os.path.join(tmp, "unzipped"))
                ldd = shutil.which("ldd")
                text = (subprocess.run([ldd, path], capture_output=True, text=True).stdout
                        if ldd else "no ldd")
                out[name] = [ln.strip() for ln in text.splitlines()
                             if any(k in ln for k in ("gomp", "omp", "stdc++", "torch", "c10",
                                                      "cuda", "not found"))]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arguments(p)
    args = p.parse_args(argv)
    result = {"env": environment(torch.device("cuda" if torch.cuda.is_available() else "cpu")),
              "python": sys.version.split()[0], "children": []}
    cxx = shutil.which("g++") or shutil.which("c++")
    result["compiler"] = (subprocess.run([cxx, "--version"], capture_output=True,
                                         text=True).stdout.splitlines()[0] if cxx else None)
    with tempfile.TemporaryDirectory() as tmp:
        package, calls = build(tmp)
        result["libraries"] = libraries(package, tmp)
        crashed = None
        for name, env_change, run in VARIANTS:
            env = {**os.environ, **env_change}
            r = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _LOAD, package,
                                calls if run else "-"], capture_output=True, text=True,
                               env=env, timeout=300)
            child = {"variant": name, "env": env_change, "status": _status(r.returncode),
                     "output": _tail(r.stdout + r.stderr)}
            result["children"].append(child)
            print(f"{name:<20} {child['status']:<16} {r.stdout.strip().splitlines()[-1:]}",
                  flush=True)
            if r.returncode < 0 and crashed is None:
                crashed = (env, run)
        gdb = shutil.which("gdb")
        if crashed is not None and gdb:
            env, run = crashed
            r = subprocess.run([gdb, "-batch", "-ex", "run", "-ex", "bt 40", "--args",
                                sys.executable, "-c", _LOAD, package, calls if run else "-"],
                               capture_output=True, text=True, env=env, timeout=600)
            result["backtrace"] = _tail(r.stdout + r.stderr, 60)
            print(result["backtrace"])
        elif crashed is not None:
            result["backtrace"] = "no gdb on this machine"
    for name, deps in result["libraries"].items():
        print(name, *deps, sep="\n    ")
    print("compiler:", result["compiler"])
    if args.out or args.run:
        save_run(args.out, result, args.run, "benchmarks/aoti_probe.py", "aoti-probe")
    return 0


if __name__ == "__main__":
    sys.exit(main())
