"""The ``fusedmlp`` command: info (more subcommands register themselves in ``COMMANDS``)."""
from __future__ import annotations

import argparse
import platform
import sys

import torch


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except Exception as e:  # an optional dependency that fails to import is reported, not raised
        return f"not usable ({type(e).__name__})"


def cmd_info(args) -> int:
    import fusedmlp_xpu as fm

    print(f"fusedmlp_xpu {fm.__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, "
          f"triton {_version('triton')}, dpctl {_version('dpctl')}")
    print("devices:")
    print(f"  cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"  cuda:{i}: {p.name}, sm_{p.major}{p.minor}, {p.total_memory / 2**30:.0f} GiB")
    else:
        print("  cuda: none")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        for i in range(torch.xpu.device_count()):
            print(f"  xpu:{i}: {torch.xpu.get_device_name(i)}")
    else:
        print("  xpu: none")
    print("backends:")
    for b in fm.backends():
        mark = "yes" if b.available else "no "
        print(f"  {b.name:<10} {mark}  [{', '.join(b.device_types)}]  {b.reason}")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = fm.FusedMLP(64, 64, 64, 4, device=dev, dtype=torch.float16 if dev != "cpu" else None)
    x = torch.randn(1, 64, device=dev, dtype=m.weights()[0].dtype)
    print("example: FusedMLP(64, 64, 64, 4) on", dev)
    print("  " + str(fm.explain(m, x)).replace("\n", "\n  "))
    return 0


def _bench(args) -> int:
    from .bench import cmd_bench

    return cmd_bench(args)


def _bench_arguments(p):
    from .bench import cmd_bench

    cmd_bench.add_arguments(p)


_bench.add_arguments = _bench_arguments

COMMANDS = {
    "info": (cmd_info, "devices, versions and the backends table with reasons"),
    "bench": (_bench, "benchmark sweeps (BENCHMARKS.md) -> JSON with the environment"),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fusedmlp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        getattr(fn, "add_arguments", lambda p: None)(p)
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
