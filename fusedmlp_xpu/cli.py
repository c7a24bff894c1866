"""The ``fusedmlp`` command. Subcommands register in ``COMMANDS``; ``DESCRIPTION`` is what
``fusedmlp --help`` opens with."""
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
            if not args.out:
                raise ValueError("argument --run: a run id names a run in a results table: "
                                 "give the table with --out")
            if args.run in results.run_ids(args.out):
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


def _widths(text: str) -> tuple[int, ...]:
    """--widths: in,hidden...,out as whole numbers, e.g. 64,64,64,16."""
    from .spec import MAX_WIDTH

    try:
        widths = tuple(int(w) for w in text.split(","))
    except ValueError:
        widths = ()
    if len(widths) < 2 or not all(1 <= w <= MAX_WIDTH for w in widths):
        raise argparse.ArgumentTypeError(
            f"expected at least two comma-separated widths in [1, {MAX_WIDTH}] "
            f"(in,hidden...,out, e.g. 64,64,64,16), got {text!r}")
    return widths


def cmd_explain(args) -> int:
    import fusedmlp_xpu as fm
    from .bench import configs
    from .bench.profiling import resolve_device

    check_device(args.device)
    device = resolve_device(args.device)
    if args.config and args.widths:
        raise UsageError("argument --widths: not with --config (which gives the widths)")
    if args.config:
        for arg, value in (("--activation", args.activation),
                           ("--output-activation", args.output_activation),
                           ("--bias", args.bias or None)):
            if value is not None:
                raise UsageError(f"argument {arg}: --config {args.config} sets it; give a "
                                 "net of your own with --widths")
        cfg = configs.get(args.config)
        widths, act, out_act, bias = cfg.widths, cfg.activation, cfg.output_activation, cfg.bias
    else:
        widths = args.widths or configs.get(configs.DEFAULT_CONFIG).widths
        act, out_act = args.activation or "relu", args.output_activation or "none"
        bias = args.bias
    names = [b.name for b in fm.backends()]
    if args.backend and args.backend not in names:
        raise UsageError(f"argument --backend: expected one of {', '.join(names)}, "
                         f"got {args.backend!r}")
    dtype = configs.DTYPES[args.dtype] if args.dtype else (
        torch.float32 if device.type == "cpu" else torch.float16)
    spec = fm.MLPSpec(tuple(widths), act, out_act, bias, dtype)
    x = torch.empty(1, widths[0], device=device, dtype=dtype)
    print(fm.explain(spec, x, args.backend, train=args.train))
    return 0


def _explain_arguments(p) -> None:
    from . import activations
    from .bench import configs

    acts = sorted(activations.ACTIVATIONS)
    p.add_argument("--config", choices=list(configs.CONFIGS), metavar="NAME",
                   help="a standard config (one of: " + ", ".join(configs.CONFIGS) + "); "
                        f"default without --widths: {configs.DEFAULT_CONFIG}")
    p.add_argument("--widths", type=_widths, metavar="IN,H,...,OUT",
                   help="a net of your own: every layer's width, e.g. 64,64,64,64,16")
    p.add_argument("--activation", choices=acts, metavar="NAME",
                   help=f"hidden activation with --widths (default relu; one of: {', '.join(acts)})")
    p.add_argument("--output-activation", choices=acts, metavar="NAME",
                   help="output activation with --widths (default none)")
    p.add_argument("--bias", action="store_true", help="with --widths: layers with bias")
    p.add_argument("--dtype", choices=list(configs.DTYPES),
                   help="default: float16 on a GPU, float32 on the CPU")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "xpu"],
                   help="default: %(default)s (a GPU when present, else the CPU)")
    p.add_argument("--train", action="store_true",
                   help="the choice for training calls (forward and backward)")
    p.add_argument("--backend", metavar="NAME",
                   help="ask about this backend only, as FUSEDMLP_BACKEND=NAME would force it")


cmd_explain.add_arguments = _explain_arguments

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
        docs = report.read(args.results, args.run, args.history)
    except (OSError, ValueError) as e:
        what = f"{e.strerror}: {e.filename!r}" if isinstance(e, OSError) and e.strerror else e
        if str(what).startswith("--run: "):
            raise UsageError(f"argument {what}") from None
        raise UsageError(f"argument results: {what}") from None
    check_writable(args.out, "--out", folder=True)
    path = report.write(docs, args.out, args.run, args.history)
    print(f"wrote {path}" + ("" if args.history else
                             f" (one page; every record: {report.APPENDIX} beside it)"))
    return 0


def _report_arguments(parser) -> None:
    parser.add_argument("results", nargs="+",
                        help="results tables (benchmarks/results/<machine>.jsonl) or bench "
                             "JSON files (fusedmlp-bench/1)")
    parser.add_argument("--run", action="append", default=None, metavar="ID",
                        help="choose from these runs only (repeat; a Max 1550 model or ISA "
                             "run of pvc.jsonl too); default: per machine, config, mode and "
                             "dtype the newest complete run")
    parser.add_argument("--history", action="store_true",
                        help="every run, each a column of its own (report.md as before the "
                             "one-page report: long)")
    parser.add_argument("--out", required=True,
                        help="folder for report.md, report-full.md (the appendix) and the "
                             "PNG plots")


cmd_report.add_arguments = _report_arguments


COMMANDS = {
    "info": (cmd_info, "devices, versions, and every backend: usable here or why not"),
    "explain": (cmd_explain, "which backend runs a given MLP on this device, and why not "
                             "the others"),
    "profile": (cmd_profile, "eager nn.Linear vs torch.compile vs FusedMLP under "
                             "torch.profiler, in one table"),
    "bench": (_bench, "timed benchmark sweeps, checked against float64 (protocol: "
                      "docs/benchmarks.md); --out appends them to a results table"),
    "report": (cmd_report, "bench runs from one or more results tables -> a one-page "
                           "vendor comparison (report.md) with plots and an appendix"),
}

DESCRIPTION = ("fusedmlp_xpu's command line: fused MLPs on cuda, xpu and cpu. What runs "
               "here, which kernel a net gets and why, and how fast it is against eager "
               "PyTorch and torch.compile. Commands: " + ", ".join(COMMANDS) + "; "
               "'fusedmlp COMMAND --help' for each.")


def main(argv=None) -> int:
    parser = _Parser(prog="fusedmlp", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (fn, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
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
