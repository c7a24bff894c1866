"""`fusedmlp bench`: the benchmark harness (protocol: docs/benchmarks.md). It prints a
table; with ``--out`` it appends its records, tagged with the environment, to that results
table (results.py).

Per config x batch x dtype x mode it times eager nn.Sequential, torch.compile and the fused
op (the backend the dispatcher picks, named; or each of ``--backends`` forced, side by
side), after checking the fused output against a
float64 reference on fresh random data with poisoned outputs. Device events around
back-to-back calls (20 ms of them a repeat by default), warm-up first, median of >= 7
repeats, inputs rotated to exceed the L2 cache, ceilings (copy
bandwidth, matmul rate) measured in the same run, each time reported as a multiple of the
roofline floor. Small batches are also timed replayed from a CUDA graph.
"""
from __future__ import annotations

import copy
import gc
import importlib
import math
import os
import statistics
import sys
import time

import torch

import fusedmlp_xpu as fm
from . import configs, results
from .tools import calls_ms, environment, lean_launches_note, peak_mb
from .tools import sync as _sync

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


#: every config `fusedmlp profile` takes (bench/configs.py), wide-gelu included; the
#: suites below name the narrow ones
CONFIGS = configs.CONFIGS
SUITES = {
    "narrow": ["narrow-w32", "narrow-w64", "narrow-w128", "paper-table1", "nerf-density",
               "odd-batch"],
    "quick": ["narrow-w64"],
}
CHECK_TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3}  # tests/conftest.py
#: at or below this, also time CUDA-graph replay (launch-bound sizes): up to 2^20 rows a
#: narrow train step's host work (autograd, the op's Python: 0.3-0.7 ms on the H200's
#: hosts) is longer than its kernels (~0.23 ms at narrow-w32; NOTES.md narrow history 34)
GRAPH_MAX_N = 2 ** 20
#: what one timed train step is (in every JSON's notes)
TRAIN_STEP = ("train step: x.grad = None, forward, backward of a given grad_y (x's gradient "
              "new each step; parameter gradients accumulate; no optimizer step)")
L2_ROTATE_BYTES = 256 * 2 ** 20  # rotate inputs until their total exceeds 4x a 60 MB L2


# --- environment and ceilings ----------------------------------------------------------
class Timer:
    """Median/min/max milliseconds per call of fn(i): device events on GPUs, a host clock
    (after a sync) on the CPU. Each repeat times ``inner`` back-to-back calls."""

    def __init__(self, device, warmup=3, repeats=9, min_repeat_ms=1.0):
        self.device, self.warmup, self.repeats, self.min_repeat_ms = device, warmup, repeats, min_repeat_ms

    def _one(self, fn, inner, start_i):
        return calls_ms(self.device, fn, inner, start_i)

    def __call__(self, fn) -> tuple[float, float, float]:
        for i in range(self.warmup):
            fn(i)
        _sync(self.device)
        first = self._one(fn, 1, 0)
        inner = max(1, min(200, math.ceil(self.min_repeat_ms / max(first, 1e-3))))
        times = [self._one(fn, inner, r * inner) for r in range(self.repeats)]
        return statistics.median(times), min(times), max(times)


def ceilings(device, dtypes) -> dict:
    """Measured in this run: device copy bandwidth (read + write) and the matmul rate."""
    if device.type == "cpu":
        return {"copy_GBps": None, "matmul_TFLOPs": {}}
    timer = Timer(device, repeats=7)
    n = 2 ** 30  # 1 GiB each way
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms, _, _ = timer(lambda i: dst.copy_(src))
    out = {"copy_GBps": 2 * n / ms / 1e6, "matmul_TFLOPs": {}}
    del src, dst
    for name in dtypes:
        a = torch.randn(8192, 8192, device=device, dtype=DTYPES[name])
        b = torch.randn(8192, 8192, device=device, dtype=DTYPES[name])
        ms, _, _ = timer(lambda i: a @ b)
        out["matmul_TFLOPs"][name] = 2 * 8192 ** 3 / ms / 1e9
    return out


# --- one measurement -------------------------------------------------------------------
def _floor_ms(cfg, spec, N, dtype_name, mode, ceil) -> float | None:
    if not ceil.get("copy_GBps") or dtype_name not in ceil["matmul_TFLOPs"]:
        return None
    es = torch.tensor([], dtype=DTYPES[dtype_name]).element_size()
    flops = spec.flops(N) * (3 if mode == "train" else 1)
    wbytes = sum(a * b for a, b in zip(spec.widths[:-1], spec.widths[1:])) * es
    io = N * (spec.in_features + spec.out_features) * es * (2 if mode == "train" else 1)
    if mode == "train":
        wbytes *= 2  # the weight gradients are written too
    return max(flops / (ceil["matmul_TFLOPs"][dtype_name] * 1e9),
               (io + wbytes) / (ceil["copy_GBps"] * 1e6))


def _check(model, backend_name, x, dtype) -> float:
    """Fused output vs float64 reference on (up to) 4096 fresh rows, outputs poisoned."""
    mem = importlib.import_module("fusedmlp_xpu.backends.memory")
    real = mem.new_empty

    def poisoned(*shape, like, dtype=None):
        return real(*shape, like=like, dtype=dtype).fill_(float("nan"))

    mem.new_empty = poisoned
    try:
        xs = torch.randn_like(x[:4096])
        with torch.no_grad():
            y = model(xs).double()
    finally:
        mem.new_empty = real
    h = xs.double()
    lins = model.linears
    for i, lin in enumerate(lins):
        h = h @ lin.weight.double().t()
        if lin.bias is not None:
            h = h + lin.bias.double()
        h = fm.activations.get(model.output_activation if i == len(lins) - 1
                               else model.activation).fn(h)
    if torch.isnan(y).any():
        return float("inf")
    return ((y - h).norm() / h.norm().clamp_min(1e-30)).item()


def _inputs(N, width, dtype, device, requires_grad):
    per = N * width * torch.tensor([], dtype=dtype).element_size()
    n = max(1, min(8, math.ceil(L2_ROTATE_BYTES / max(per, 1))))
    if device.type == "cpu":
        n = 1
    return [torch.randn(N, width, device=device, dtype=dtype, requires_grad=requires_grad)
            for _ in range(n)]


def _runner(model, xs, mode, grads):
    if mode == "inference":
        def run(i):
            with torch.inference_mode():
                model(xs[i % len(xs)])
    else:
        def run(i):
            x = xs[i % len(xs)]
            x.grad = None  # a fresh input each step, as in training: its gradient is new,
            # not added to the last one's (that would time an [N, in] add kernel, ~0.37 ms
            # at 2^22 x 64 fp16 on the H200, for every baseline alike)
            model(x).backward(grads[i % len(grads)])
    return run


def _graph_ms(run, device, timer) -> float | None:
    if device.type != "cuda":
        return None
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(3):
                run(0)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            run(0)
        return timer(lambda i: g.replay())[0]
    except Exception as e:  # noqa: BLE001 -- reported, never fatal
        print(f"  graph capture failed: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def profile_text(fn, calls: int, device, top: int = 28) -> str:
    """cProfile of ``calls`` calls of ``fn`` (the device synced inside the window): the
    ``top`` functions by their own time, as the report's text (the probes' host-time
    breakdowns)."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    _sync(device)
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue().strip()


def interleaved_us(fns: dict, device, n=2100, rounds=7, warm=50) -> dict:
    """Host us per call of each function: the median of ``rounds`` rounds of n / rounds
    calls, the functions' rounds taken in turn (a host's speed drifts by tens of us over
    seconds; interleaved, the drift lands on every function alike), after ``warm`` calls
    of each and a garbage collection (a collection of a benchmark's leftovers inside one
    short window once added ~10 us a call to whichever was measured first)."""
    for fn in fns.values():
        for _ in range(warm):
            fn()
    _sync(device)
    gc.collect()
    per = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(n // rounds):
                fn()
            per[k].append((time.perf_counter() - t) / (n // rounds) * 1e6)
            _sync(device)
    return {k: statistics.median(v) for k, v in per.items()}


def host_overhead_us(model, device, dtype, n=2100, rounds=7) -> tuple[float, float]:
    """Host time of one eager no-grad call at 1 row (the GPU keeps up, so the host bounds),
    and of one ``F.linear`` (the model's first layer, same input) as this host's yardstick,
    interleaved (``interleaved_us``)."""
    x = torch.randn(1, model.in_features, device=device, dtype=dtype)
    w0 = model.weights()[0]
    with torch.no_grad():
        us = interleaved_us({"model": lambda: model(x),
                             "linear": lambda: torch.nn.functional.linear(x, w0)},
                            device, n, rounds)
    return us["model"], us["linear"]


def _fused_models(fused, backends, x0, log, train: bool) -> dict:
    """name -> the fused module to time: the dispatcher's choice (``backends`` empty), else
    each named backend forced on a copy with the same parameters (a backend that cannot
    run the config, or cannot train when ``train``, is left out, saying why)."""
    if not backends:
        return {fm.explain(fused, x0, train=train).backend: fused}
    out = {}
    for name in backends:
        ex = fm.explain(fused, x0, backend=name, train=train)
        if ex.backend is None:
            log(f"  {name}: cannot run this config: {ex.considered[0].reason}")
            continue
        model = copy.deepcopy(fused)
        model.backend = name
        out[name] = model
    return out


def bench_one(cfg, N, dtype_name, mode, device, ceil, compile_ok, passes, timer, log,
              backends=None):
    """Time one case: eager, the fused op (the dispatcher's backend, or each of
    ``backends`` forced, side by side) and, if ``compile_ok``, torch.compile."""
    dtype = DTYPES[dtype_name]
    fused = cfg.make(device, dtype)
    seq = fused.to_sequential()
    spec = fused.spec(dtype)
    x0 = torch.randn(2, cfg.in_features, device=device, dtype=dtype)
    xs = _inputs(N, cfg.in_features, dtype, device, mode == "train")
    grads = [torch.randn(N, cfg.out_features, device=device, dtype=dtype)
             for _ in range(min(2, len(xs)))]
    floor = _floor_ms(cfg, spec, N, dtype_name, mode, ceil)
    models, errs = {"eager": seq}, {}
    for backend, model in _fused_models(fused, backends, x0, log, mode == "train").items():
        try:
            err = _check(model, backend, xs[0], dtype)
        except Exception as e:  # noqa: BLE001 -- a forced backend that fails is reported
            log(f"  {backend} failed its check: {type(e).__name__}: {str(e)[:200]}")
            continue
        if not err <= CHECK_TOLERANCE[dtype_name]:
            log(f"  {backend} output WRONG (relative error {err:.2e}): not timed")
            continue
        models[backend], errs[backend] = model, err
    if compile_ok:
        models["compile"] = torch.compile(seq, mode=os.environ.get(
            "FUSEDMLP_COMPILE_MODE", "max-autotune-no-cudagraphs"))
    records = []
    for name, model in models.items():
        run = _runner(model, xs, mode, grads)
        try:
            peak = peak_mb(run, device) if mode == "train" else None
            for p in range(1, passes + 1):
                med, lo, hi = timer(run)
                records.append(_record(cfg, N, dtype_name, mode, name, "python", p, med, lo, hi,
                                       spec, floor, errs.get(name), peak))
            if N <= GRAPH_MAX_N and device.type == "cuda" and name != "compile":
                gms = _graph_ms(run, device, timer)
                if gms is not None:
                    records.append(_record(cfg, N, dtype_name, mode, name, "graph", 1, gms, gms,
                                           gms, spec, floor, errs.get(name)))
        except Exception as e:  # noqa: BLE001 -- one failing baseline must not end the run
            log(f"  {name} failed: {type(e).__name__}: {str(e)[:200]}")
    del xs, grads
    return records


def _record(cfg, N, dtype_name, mode, backend, timing, p, med, lo, hi, spec, floor, err,
            peak=None):
    flops = spec.flops(N) * (3 if mode == "train" else 1)
    return {"config": cfg.name, "N": N, "dtype": dtype_name, "mode": mode, "backend": backend,
            "timing": timing, "pass": p, "median_ms": med, "min_ms": lo, "max_ms": hi,
            "rows_per_s": N / med * 1e3, "tflops": flops / med / 1e9,
            "floor_ms": floor, "x_floor": (med / floor) if floor else None,
            "max_rel_error": err, "peak_mem_MB": peak}


def run_bench(args, checkpoint=None) -> dict:
    """Time the plan's cases; ``checkpoint(result)``, if given, gets the result so far
    after each case (marked partial), so a run cut by a time limit keeps what it timed."""
    device = torch.device(args.device if args.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    dtypes = args.dtype or (["float16", "bfloat16"] if device.type != "cpu" else ["float32"])
    modes = args.mode or ["inference", "train"]
    names = args.config or SUITES[args.suite]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    env = environment(device)
    log(f"device: {env.get('device')}; measuring ceilings")
    ceil = ceilings(device, dtypes)
    log(f"ceilings: {ceil}")
    # each repeat times >= target_ms of back-to-back calls: a repeat of ONE call also
    # times the host's latency to its first kernel (events on an idle stream)
    timer = Timer(device, repeats=args.repeats, min_repeat_ms=args.target_ms)
    plan = [(CONFIGS[n], N, d, m) for n in names for N in (args.batch or CONFIGS[n].batches)
            for d in dtypes for m in modes]
    if device.type == "cpu":
        plan = list(dict.fromkeys((c, min(N, 2 ** 12), d, m) for c, N, d, m in plan))
    records, notes = [], []
    for i, (cfg, N, d, m) in enumerate(plan, 1):
        compile_ok = args.compile == "all" or (args.compile == "largest" and N == max(cfg.batches)
                                                and d == dtypes[0])
        log(f"[{i}/{len(plan)}] {cfg.name} N={N} {d} {m}{' +compile' if compile_ok else ''}")
        recs = bench_one(cfg, N, d, m, device, ceil, compile_ok, args.passes, timer, log,
                         getattr(args, "backends", None))
        for r in recs:
            log(f"    {r['backend']:<10} {r['timing']:<6} {r['median_ms']:.4f} ms"
                + (f"  {r['x_floor']:.2f}x floor" if r['x_floor'] else ""))
        records += recs
        _sync(device)
        torch._dynamo.reset()
        if checkpoint is not None and i < len(plan):
            checkpoint(_result(env, ceil, records, [
                f"partial: {i} of {len(plan)} cases timed; the run stopped before the rest"]))
    for cfg_name in names:
        cfg = CONFIGS[cfg_name]
        if cfg.regime != "narrow":  # host time a call matters where kernels are short
            continue
        for d in dtypes:
            m = cfg.make(device, DTYPES[d])
            us, linear_us = host_overhead_us(m, device, DTYPES[d])
            records.append({"config": cfg.name, "N": 1, "dtype": d, "mode": "inference",
                            "backend": fm.explain(m, torch.empty(1, cfg.in_features, device=device,
                                                                   dtype=DTYPES[d])).backend,
                            "timing": "host", "pass": 1, "median_ms": us / 1e3, "min_ms": None,
                            "max_ms": None, "rows_per_s": None, "tflops": None,
                            "floor_ms": None, "x_floor": None, "max_rel_error": None,
                            "peak_mem_MB": None, "host_us": us,
                            "host_us_one_linear": linear_us})
            log(f"host overhead {cfg.name} {d}: {us:.1f} us/call (one F.linear: "
                f"{linear_us:.1f} us)")
    notes += _pass_disagreements(records)
    notes.append(lean_launches_note())
    notes.append(TRAIN_STEP)
    notes.append(f"each repeat: back-to-back calls for >= {args.target_ms:g} ms (at most 200 "
                 f"calls), events around them")
    notes.append(f"compile timed for: {args.compile}; mode "
                 f"{os.environ.get('FUSEDMLP_COMPILE_MODE', 'max-autotune-no-cudagraphs')}")
    return _result(env, ceil, records, notes)


def _result(env, ceil, records, notes) -> dict:
    return {"schema": "fusedmlp-bench/1", "env": env, "ceilings": ceil, "records": records,
            "notes": notes}


def _pass_disagreements(records) -> list[str]:
    by = {}
    for r in records:
        if r["timing"] == "python":
            by.setdefault((r["config"], r["N"], r["dtype"], r["mode"], r["backend"]), []).append(
                r["median_ms"])
    out = []
    for k, v in by.items():
        if len(v) > 1 and max(v) > 1.05 * min(v):
            out.append(f"passes disagree by {100 * (max(v) / min(v) - 1):.0f}% for {k}")
    return out


def summary(result) -> str:
    rows = [r for r in result["records"] if r["timing"] in ("python", "graph") and r["pass"] == 1]
    lines = [f"{'config':<13} {'N':>8} {'dtype':<8} {'mode':<9} {'backend':<9} {'timing':<6} "
             f"{'ms':>9} {'x floor':>8} {'err':>8}"]
    for r in rows:
        xf = f"{r['x_floor']:.2f}" if r["x_floor"] else "-"
        err = f"{r['max_rel_error']:.1e}" if r["max_rel_error"] is not None else ""
        lines.append(f"{r['config']:<13} {r['N']:>8} {r['dtype']:<8} {r['mode']:<9} "
                     f"{r['backend']:<9} {r['timing']:<6} {r['median_ms']:>9.4f} {xf:>8} {err:>8}")
    return "\n".join(lines)


def cmd_bench(args) -> int:
    if args.suite == "wide":  # transformer FFN blocks: their own harness (bench/wide.py)
        from .wide import main as wide_main

        argv = ([] if args.device == "auto" else ["--device", args.device])
        argv += (["--out", args.out] if args.out else []) + (["--run", args.run] if args.run else [])
        if args.compile == "none":
            argv += ["--compile", "none"]
        if getattr(args, "sweep", False):
            argv += ["--sweep", "--llama"]
        wide_dtypes = [d for d in (args.dtype or []) if d in ("bfloat16", "float16")]
        if wide_dtypes:
            argv += ["--dtype", *wide_dtypes]
        return wide_main(argv)
    what = f"fusedmlp bench --suite {args.suite}" + "".join(
        f" --{k} {' '.join(map(str, v))}" for k, v in
        (("config", args.config), ("batch", args.batch), ("dtype", args.dtype),
         ("mode", args.mode), ("backends", getattr(args, "backends", None))) if v)
    writer = results.run_writer(args.out, args.run, what, args.suite)
    write = writer.write  # after each case too: a run cut short keeps what it timed

    result = run_bench(args, checkpoint=write)
    write(result, final=True)
    print(summary(result))
    print(results.where_written(writer))
    return 0


def _add_arguments(p):
    pos = configs.positive_int
    p.add_argument("--suite", default="narrow", choices=sorted(SUITES) + ["steps", "wide"],
                   help="narrow: the narrow configs (this harness); quick: narrow-w64 only; "
                        "wide: wide-gelu and wide-swiglu (their own harness); steps: whole "
                        "training steps (default: %(default)s)")
    p.add_argument("--config", action="append", choices=sorted(CONFIGS), metavar="NAME",
                   help="a config to time (repeat for more; default: the suite's). One of: "
                        f"{', '.join(CONFIGS)} (docs/benchmarks.md: The configs)")
    p.add_argument("--batch", action="append", type=pos, metavar="ROWS",
                   help="rows per call (repeat for more; default: each config's own, e.g. "
                        "2^16-2^22 for narrow-w64; at most 4096 on the CPU)")
    p.add_argument("--dtype", action="append", choices=sorted(DTYPES),
                   help="repeat for more (default: float16 and bfloat16 on a GPU, float32 on "
                        "the CPU)")
    p.add_argument("--mode", action="append", choices=["inference", "train"],
                   help="inference: forward under inference_mode; train: forward + backward "
                        "(repeat for both; default: both)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "xpu"],
                   help="default: %(default)s (a GPU when present, else the CPU)")
    p.add_argument("--compile", default="largest", choices=["none", "largest", "all"],
                   help="which cases also time torch.compile: it compiles per shape "
                        "(default: %(default)s, each config's largest batch in the first dtype)")
    p.add_argument("--passes", type=pos, default=2, metavar="N",
                   help="time each case this many times; passes more than 5%% apart are "
                        "noted (default: %(default)s)")
    p.add_argument("--repeats", type=pos, default=9, metavar="N",
                   help="timed repeats a pass, their median reported (default: %(default)s)")
    p.add_argument("--target-ms", type=float, default=20.0, metavar="MS",
                   help="length of one timed repeat: back-to-back calls, at most 200 "
                        "(default: %(default)s)")
    p.add_argument("--backends", nargs="+", metavar="NAME",
                   help="time these backends forced, side by side, instead of the "
                        "dispatcher's choice (e.g. --backends triton cuda); each record "
                        "names its backend")
    p.add_argument("--out", metavar="TABLE.jsonl",
                   help="append the run to this results table (in a checkout: "
                        "benchmarks/results/<machine>.jsonl); default: print the table only")
    p.add_argument("--run", default=None, metavar="ID",
                   help="with --out: the run's id in the table (default "
                        "<machine>-<suite>-<date>-<time>)")
    p.add_argument("--sweep", action="store_true",
                   help="--suite wide: M 1-16384 on the d/hidden of six released models "
                        "and a HF Llama prefill (bench/wide.py --sweep --llama)")


cmd_bench.add_arguments = _add_arguments
