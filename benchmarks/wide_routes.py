"""Which wide cases of a sweep run fall below eager, and the row ranges a route table
would need for them.

    python benchmarks/wide_routes.py TABLE.jsonl RUN [RUN...] [--below 0.98]

Reads the runs of ``fusedmlp bench --suite wide --sweep`` from a results table and prints,
for every (config, d x hidden, M, dtype, mode), the fused ('triton') row's speed against
eager, paired per batch (``eager_over_paired``: eager ms / ours ms, > 1 is faster), the
path it took (``route``: the kernels or torch ops), and the cases below ``--below``. The
routes in ``fusedmlp_xpu/backends/triton/routes.py`` are written from this table, naming
the run."""
from __future__ import annotations

import argparse
import sys

from fusedmlp_xpu.bench import results


def cases(records: list[dict]) -> list[dict]:
    """The fused rows of a wide run with their speed against eager and the path taken."""
    out = []
    for r in records:
        if r.get("backend") != "triton" or r.get("timing") != "python":
            continue
        x = r.get("eager_over_paired")
        if x is None:
            continue
        config, _, dims = str(r["config"]).partition(":")
        d, _, hidden = dims.partition("x")
        out.append({"config": config, "d": int(d or 0), "hidden": int(hidden or 0),
                    "N": r["N"], "dtype": r["dtype"], "mode": r["mode"], "x_eager": x,
                    "ms": r["median_ms"], "torch_ops": "torch ops" in str(r.get("route", "")),
                    "work": r["N"] * int(d or 0) * int(hidden or 0)})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("table", help="a results table (.jsonl)")
    p.add_argument("runs", nargs="+", metavar="RUN", help="sweep run ids in the table")
    p.add_argument("--below", type=float, default=0.98,
                   help="list the cases under this multiple of eager's speed (default 0.98)")
    args = p.parse_args(argv)
    docs = results.documents(results.read(args.table))
    missing = [r for r in args.runs if r not in docs]
    if missing:
        p.error(f"RUN: {', '.join(missing)} not in {args.table}")
    rows = [c for run in args.runs for c in cases(docs[run].get("records", []))]
    if not rows:
        p.error("RUN: no fused wide rows with a paired eager time in these runs")
    slow = [c for c in rows if c["x_eager"] < args.below]
    print(f"{len(rows)} cases, {len(slow)} below {args.below}x eager; worst "
          f"{min(c['x_eager'] for c in rows):.3f}x")
    print(f"{'config':<12}{'d':>6}{'hidden':>7}{'M':>7} {'dtype':<9}{'mode':<10}{'x eager':>8}"
          f"{'ms':>10}{'work':>10}  path")
    for c in sorted(slow, key=lambda c: (c["config"], c["mode"], c["dtype"], c["d"], c["N"])):
        print(f"{c['config']:<12}{c['d']:>6}{c['hidden']:>7}{c['N']:>7} {c['dtype']:<9}"
              f"{c['mode']:<10}{c['x_eager']:>8.3f}{c['ms']:>10.4f}{c['work']:>10.1e}  "
              f"{'torch ops' if c['torch_ops'] else 'kernels'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
