"""The ``fusedmlp`` command: info, profile, report (subcommands register in ``COMMANDS``)."""
from __future__ import annotations

import argparse
import os
import platform
import sys

import torch


class UsageError(Exception):
    """A mistake in the command line or its files: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line naming the argument (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def check_device(name: str) -> None:
    """--device: cuda or xpu only where torch sees one."""
    from .bench.profiling import resolve_device

    try:
        resolve_device(name)
    except ValueError as e:
        raise UsageError(f"argument --device: {str(e).removeprefix('device: ')}") from None


def check_writable(path: str | None, arg: str, folder: bool = False) -> None:
    """--out, --json, --trace-dir: the folder (made if missing) must take new files."""
    if not path:
        return
    where = path if folder else (os.path.dirname(path) or ".")
    try:
        os.makedirs(where, exist_ok=True)
    except OSError as e:
        raise UsageError(f"argument {arg}: cannot create {where!r} ({e.strerror})") from None
    if not os.access(where, os.W_OK | os.X_OK):
        raise UsageError(f"argument {arg}: {where!r} is not writable")
    if not folder and os.path.isdir(path):
        raise UsageError(f"argument {arg}: {path!r} is a folder, expected a file path")


def _version(module: str) -> str:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", "installed")
    except Exception as e:  # an optional dependency that fails to import is reported, not raised
        return f"not usable ({type(e).__name__})"


def _device_types_here() -> list[str]:
    here = ["cpu"]
    if torch.cuda.is_available():
        here.append("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        here.append("xpu")
    return here


def _backend_line(b, spec_by_device: dict) -> str:
    """One backend: usable on which device present here, and why (not), as the
    dispatcher would decide for the example MLP when that backend is forced
    (triton on cpu: only in Triton's interpreter, TRITON_INTERPRET=1)."""
    from . import dispatch

    if not b.available:
        return f"  {b.name:<10} no   {b.reason}"
    where, usable = [], False
    for dev, spec in spec_by_device.items():
        if dev not in b.device_types:
            continue
        ex = dispatch.explain_choice(torch.device(dev), spec, b.name)
        usable |= ex.backend is not None
        if ex.backend:
            interp = dev == "cpu" and b.name == "triton"
            where.append(f"{dev}" + (" (Triton's interpreter: testing only)" if interp else ""))
        else:
            where.append(f"{dev}: no, {ex.considered[0].reason}")
    mark = "yes" if usable else "no "
    return f"  {b.name:<10} {mark}  {b.reason}; here: {'; '.join(where) or 'no device it runs on'}"


def cmd_info(args) -> int:
    import fusedmlp_xpu as fm
    from . import dispatch

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
    bad_env = None
    try:
        dispatch.requested()
    except ValueError as e:  # a bad FUSEDMLP_BACKEND: every call of the op would raise
        bad_env = str(e)
    examples = {}
    for dev in _device_types_here():
        m = fm.FusedMLP(64, 64, 64, 4, device=dev, dtype=torch.float16 if dev != "cpu" else None)
        x = torch.randn(1, 64, device=dev, dtype=m.weights()[0].dtype)
        examples[dev] = (m, x, fm.explain(m, x, backend="auto").spec)
    print("backends (for the example below, each forced on each device here):")
    for b in fm.backends():
        print(_backend_line(b, {d: spec for d, (_, _, spec) in examples.items()}))
    if bad_env:
        print(f"  {dispatch.ENV_VAR}: INVALID, every call of the op raises until it is "
              f"fixed or unset: {bad_env}")
    dev = "cuda" if "cuda" in examples else "cpu"
    m, x, _ = examples[dev]
    print("example: FusedMLP(64, 64, 64, 4) on", dev)
    ex = fm.explain(m, x, backend="auto" if bad_env else None)
    print("  " + str(ex).replace("\n", "\n  "))
    trains = fm.explain(m, x, backend="auto" if bad_env else None, train=True).backend
    if trains != ex.backend:  # an inference-only backend chosen above
        print(f"  training calls: {trains or 'NONE'} (explain(..., train=True) says why)")
    if bad_env:
        raise UsageError(bad_env)
    return 0


def _bench(args) -> int:
    from .bench import results
    from .bench.narrow import cmd_bench

    check_device(args.device)
    check_writable(args.out, "--out")
    try:  # the table and the run id, before minutes of timing
        if args.out:
            results.check_table_path(args.out, "argument --out")
        if args.run:
            results.check_run_id(args.run, "argument --run")
            if args.out and args.run in results.run_ids(args.out):
                raise ValueError(f"argument --run: {args.run!r} is already in {args.out} "
                                 "(run ids are unique)")
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.suite == "steps":  # whole training steps: their own harness (bench/steps.py)
        from .bench.steps import cmd_steps

        return cmd_steps(args)
    return cmd_bench(args)


def _bench_arguments(p):
    from .bench import steps as bench_steps
    from .bench.narrow import cmd_bench

    cmd_bench.add_arguments(p)
    bench_steps.add_arguments(p)


_bench.add_arguments = _bench_arguments

def cmd_profile(args) -> int:
    import json

    from .bench import profiling

    check_device(args.device)
    check_writable(args.json, "--json")
    check_writable(args.trace_dir, "--trace-dir", folder=True)
    if args.threads:
        torch.set_num_threads(args.threads)

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
    from .bench import profiling

    profiling.add_arguments(parser)


cmd_profile.add_arguments = _profile_arguments


def cmd_report(args) -> int:
    from .bench import report

    try:
        report.load(args.results, args.run)
    except (OSError, ValueError) as e:
        what = f"{e.strerror}: {e.filename!r}" if isinstance(e, OSError) and e.strerror else e
        if str(what).startswith("--run: "):
            raise UsageError(f"argument {what}") from None
        raise UsageError(f"argument results: {what}") from None
    check_writable(args.out, "--out", folder=True)
    path = report.write_report(args.results, args.out, args.run)
    print(f"wrote {path}")
    return 0


def _report_arguments(parser) -> None:
    parser.add_argument("results", nargs="+",
                        help="results tables (benchmarks/results/<machine>.jsonl) or bench "
                             "JSON files (fusedmlp-bench/1)")
    parser.add_argument("--run", action="append", default=None, metavar="ID",
                        help="only these runs, in this order (repeat; default every "
                             "fusedmlp bench run in the tables)")
    parser.add_argument("--out", required=True, help="folder for report.md and its PNG plots")


cmd_report.add_arguments = _report_arguments


COMMANDS = {
    "info": (cmd_info, "devices, versions and the backends table with reasons"),
    "profile": (cmd_profile, "eager vs torch.compile vs FusedMLP under torch.profiler"),
    "bench": (_bench, "benchmark sweeps (protocol: README.md) -> the machine's results table"),
    "report": (cmd_report, "bench runs from one or more machines' tables -> report.md with plots"),
}


def main(argv=None) -> int:
    parser = _Parser(prog="fusedmlp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        getattr(fn, "add_arguments", lambda p: None)(p)
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"fusedmlp {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
