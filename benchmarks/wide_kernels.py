"""Where the wide train steps spend device time: wide-gelu and wide-swiglu (bf16, M 8192 by
default) under torch.profiler, kernel by kernel, for ours, eager and the bare matmuls
(bench_wide.bare_fns), device time per step summed over each kernel name.

    PYTHONPATH=. python3 benchmarks/wide_kernels.py --out wide-kernels.json

The bench says how far a step is from the bare matmuls; this says which kernels make the
difference. Profiler times include its own overhead per kernel (a few us), the same for
every backend; steps are run back to back after a warm-up. On a GPU each row also has the
step's time by device events without the profiler (``step_ms``, the median of 5 batches
of STEPS steps) and, from the profile, the span from the first kernel's start to the last
one's end (``span_ms``): where the span exceeds the kernels' sum, the device waited
between kernels; where the events exceed the span, the card ran slower unprofiled (its
clock drops at the 700 W power limit under long matmul runs).
"""
from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from fusedmlp_xpu.bench import wide as bench_wide
from fusedmlp_xpu.bench.tools import calls_ms, environment, save_run

STEPS = 5


def _short(name: str) -> str:
    for cut in ("(", "<"):
        name = name.split(cut)[0]
    return name[:70]


def kernel_ms(fn, device) -> dict[str, float]:
    """Device ms per step of each kernel name fn() launches (STEPS steps profiled; on a
    CPU, for a smoke run, the self time of each op)."""
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for _ in range(3):
        fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(STEPS):
            fn()
        sync()
    out: dict[str, float] = collections.defaultdict(float)
    span = [float("inf"), 0.0]
    for e in prof.events():
        if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
            out[_short(e.name)] += e.device_time / 1e3 / STEPS
            span = [min(span[0], e.time_range.start), max(span[1], e.time_range.end)]
        elif not cuda and e.self_cpu_time_total > 0:
            out[_short(e.name)] += e.self_cpu_time_total / 1e3 / STEPS
    out = dict(sorted(out.items(), key=lambda kv: -kv[1]))
    # first kernel's start to last kernel's end, per step: minus the kernels' sum, the
    # time the device sat idle between kernels while profiled
    return out, ((span[1] - span[0]) / 1e3 / STEPS if cuda and span[1] else None)


def step_ms(fn, device) -> float | None:
    """Device-event ms per step of fn(), STEPS back to back, median of 5 batches (None
    on a CPU)."""
    if device.type != "cuda":
        return None
    return sorted(calls_ms(device, lambda i: fn(), STEPS) for _ in range(5))[2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="the results table to append to (.jsonl)")
    ap.add_argument("--run", default=None, help="the run's id in the table")
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--configs", default="wide-gelu,wide-swiglu")
    ap.add_argument("--inference", action="store_true", help="forward only")
    ap.add_argument("--tiny", action="store_true",
                    help="bench_wide.TINY shapes on the CPU (TRITON_INTERPRET=1): a smoke run")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.tiny else "cuda")
    dt = torch.float16 if args.tiny else torch.bfloat16
    rows = []
    for config in args.configs.split(","):
        dims = (bench_wide.TINY if args.tiny else bench_wide.CONFIGS)[config]
        torch.manual_seed(0)
        eager = bench_wide.eager_model(config, dims, dev, dt)
        ours, _ = bench_wide.ours_model(eager, dims[3], dev, [])
        infer, train = bench_wide.bare_fns(eager, dims[3])
        x = torch.randn(args.m, dims[0], device=dev, dtype=dt, requires_grad=True)
        gy = torch.randn(args.m, dims[0], device=dev, dtype=dt)

        def step(model):
            def run():
                if args.inference:
                    with torch.no_grad():
                        model(x)
                    return
                x.grad = None
                for p in eager.parameters():
                    p.grad = None
                model(x).backward(gy)
            return run

        fns = {"ours": step(ours), "eager": step(eager),
               "bare": (lambda: infer(x.detach())) if args.inference
               else (lambda: train(x.detach(), gy))}
        for backend, fn in fns.items():
            ks, span = kernel_ms(fn, dev)
            total = sum(ks.values())
            wall = step_ms(fn, dev)
            print(f"\n{config} M {args.m} {'inference' if args.inference else 'train'} "
                  f"{backend}: {total:.3f} ms of kernels a step"
                  + (f" in a {span:.3f} ms span" if span is not None else "")
                  + (f", {wall:.3f} ms by events" if wall is not None else ""))
            for k, ms in ks.items():
                print(f"  {ms:8.3f}  {k}")
            rows.append(dict(config=config, m=args.m, backend=backend, total_ms=total, span_ms=span, step_ms=wall,
                             inference=args.inference, kernels_ms=ks))
        del eager, ours, x, gy
        torch.cuda.empty_cache()
    if args.out:
        save_run(args.out, {"env": environment(dev), "rows": rows}, args.run,
                 "benchmarks/wide_kernels.py" + (" --inference" if args.inference else ""),
                 "wide-kernels")


if __name__ == "__main__":
    main()
