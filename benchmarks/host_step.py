"""Where the time of one training step from Python goes (`loop-image` or `sdf-eikonal`
of `fusedmlp bench --suite steps`): ms per step by device events, back to back, for the
fused and the eager net, then the fused step under cProfile (top functions by own time
and by cumulative time), torch.profiler's CPU-side table and, on CUDA, its table of
device time by kernel for the fused and the eager step. Writes JSON.

    python benchmarks/host_step.py --out host.json [--config sdf-eikonal] [--batch 262144]
        [--out-features 3]

Environment switches (FUSEDMLP_GLUON=0, FUSEDMLP_FAST_LAUNCH=0, ...) apply as usual: run
it once per switch to see which part of the package a step's host time sits in."""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
from dataclasses import replace

import torch

from fusedmlp_xpu.bench import steps as bench_steps
from fusedmlp_xpu.bench.tools import add_output_arguments, calls_ms, environment, save_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arguments(p)
    p.add_argument("--config", default="loop-image", choices=sorted(bench_steps.CONFIGS))
    p.add_argument("--batch", type=int, default=2 ** 18)
    p.add_argument("--dtype", default="float16", choices=sorted(bench_steps.DTYPES))
    p.add_argument("--out-features", type=int, default=None)
    p.add_argument("--steps", type=int, default=200, help="steps profiled")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = bench_steps.DTYPES[args.dtype]
    cfg = bench_steps.CONFIGS[args.config]
    if args.out_features:
        cfg = replace(cfg, out_features=args.out_features)
    task = bench_steps.Task(cfg, args.batch, device)
    fused, seq = bench_steps.make_nets(cfg, device, dtype)
    out = {"env": environment(device), "config": cfg.name, "batch": args.batch, "dtype": args.dtype,
           "out_features": cfg.out_features,
           "switches": {k: v for k, v in os.environ.items() if k.startswith("FUSEDMLP_")}}
    trainers = {"fused": bench_steps.Trainer(fused, dtype, device),
                "eager": bench_steps.Trainer(seq, dtype, device)}
    for name, tr in trainers.items():
        for _ in range(20):
            tr.step(task)
        ts = [calls_ms(device, lambda i, tr=tr: tr.step(task), 50, lead=True) for _ in range(7)]
        out[f"{name}_ms"] = statistics.median(ts)
        print(f"{name}: {out[f'{name}_ms']:.4f} ms a step from Python", flush=True)
    tr = trainers["fused"]
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        tr.step(task)
    prof.disable()
    if device.type == "cuda":
        torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(25)
        # file names relative to the repository (no machine's paths in the results)
        text = s.getvalue().replace(ROOT + os.sep, "")
        out[f"cprofile_{key}"] = text
        print(f"-- cProfile, {args.steps} fused steps, by {key}\n{text}", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        for _ in range(20):
            tr.step(task)
    table = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    out["torch_profiler_cpu"] = table
    print(table, flush=True)
    if device.type == "cuda":
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        for name, tr in trainers.items():
            with torch.profiler.profile(activities=acts) as tp:
                for _ in range(10):
                    tr.step(task)
                torch.cuda.synchronize()
            table = tp.key_averages().table(sort_by="self_cuda_time_total", row_limit=30,
                                            max_name_column_width=70)
            out[f"torch_profiler_device_{name}"] = table
            print(f"-- device time by kernel, 10 {name} steps\n{table}", flush=True)
    save_run(args.out, out, args.run, f"benchmarks/host_step.py --config {args.config} "
             f"--batch {args.batch} --dtype {args.dtype}", "host-step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
