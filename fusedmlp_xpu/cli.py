"""The ``fusedmlp`` command: info, profile, report (subcommands register in ``COMMANDS``)."""
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

def cmd_profile(args) -> int:
    import json

    from . import profiling

    result = profiling.run_profile(args.config, args.batch, args.device, args.dtype, args.train,
                                   args.trace_dir, args.compile_mode,
                                   log=lambda s: print(s, file=sys.stderr, flush=True))
    print(profiling.format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result.to_dict(), f, indent=1)
    # a failed compile row is a finding, not an error; a failed eager or fused row is
    return 0 if result.rows[0].ok and result.rows[2].ok else 1


def _profile_arguments(parser) -> None:
    from . import profiling

    profiling.add_arguments(parser)


cmd_profile.add_arguments = _profile_arguments


def cmd_report(args) -> int:
    from . import report

    path = report.write_report(args.results, args.out)
    print(f"wrote {path}")
    return 0


def _report_arguments(parser) -> None:
    parser.add_argument("results", nargs="+", help="bench JSON files (fusedmlp-bench/1)")
    parser.add_argument("--out", required=True, help="folder for report.md and its PNG plots")


cmd_report.add_arguments = _report_arguments


COMMANDS = {
    "info": (cmd_info, "devices, versions and the backends table with reasons"),
    "profile": (cmd_profile, "eager vs torch.compile vs FusedMLP under torch.profiler"),
    "bench": (_bench, "benchmark sweeps (BENCHMARKS.md) -> JSON with the environment"),
    "report": (cmd_report, "bench JSON from one or more machines -> report.md with plots"),
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
