"""The wide-MLP benchmark: wide-gelu and wide-swiglu (configs: benchmarks/README.md), one command.

    fusedmlp bench --suite wide            # on a CUDA GPU, ~3-4 min on an H200
    python -m fusedmlp_xpu.bench.wide [--rows 16 8192] [--configs ...] [--out T.jsonl]
    TRITON_INTERPRET=1 python -m fusedmlp_xpu.bench.wide --tiny --out w.jsonl  # CPU smoke run

It prints its table; with --out the run is appended to that results table
(benchmarks/results/<machine>.jsonl in a checkout) under its run id (--run).

Per config, row count M (16, 8192), mode (inference, train = forward + backward for x
and every weight and bias) and backend (eager, compile, triton = ours, bare = the same
matmuls with no bias/activation), it checks the output and gradients against an fp32
reference (ours with NaN-poisoned outputs), then times with device events (warm-up,
median of >= 7 repeats of back-to-back calls, rotating inputs past the 60 MB L2) and
records peak memory per train step. Each config is timed in two passes (the card
throttles under long matmul runs); within a pass the backends' timed batches take turns
(bare, eager, ours, bare, ...), so that x_bare compares times taken close together, and
x_bare_paired is the median of the batch-by-batch ratios; ceilings (copy GB/s, 8192^3
matmul TFLOP/s) are measured in the same run. Writes fusedmlp-bench/1 JSON and prints a table.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
import time

import torch
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch
from fusedmlp_xpu.backends import Backend
from . import results
from .tools import calls_ms, environment, lean_launches_note, peak_mb

SCHEMA = "fusedmlp-bench/1"
L2_BYTES = 60 * 2**20  # H200; inputs rotate over at least twice this
TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-5}  # tests' table

# name: (d, hidden, bias, gated)
CONFIGS = {"wide-gelu": (4096, 16384, True, False), "wide-swiglu": (4096, 14336, False, True)}
TINY = {"wide-gelu": (32, 160, True, False), "wide-swiglu": (32, 144, False, True)}
# --sweep: the d / hidden pairs of released models (TinyLlama 1.1B, Llama-3.2 1B,
# Llama-3.2 3B, Llama-2 7B, Llama-3 8B / Mistral 7B, Llama-2 13B) and the token counts
# between a decode step and a long prefill
REAL_DIMS = ((2048, 5632), (2048, 8192), (3072, 8192), (4096, 11008), (4096, 14336),
             (5120, 13824))
SWEEP_M = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


# --- the models ---------------------------------------------------------------------
class LlamaMLP(nn.Module):
    """The eager baseline for wide-swiglu: Llama's MLP block."""

    def __init__(self, d, hidden, device, dtype):
        super().__init__()
        kw = dict(bias=False, device=device, dtype=dtype)
        self.gate_proj, self.up_proj = nn.Linear(d, hidden, **kw), nn.Linear(d, hidden, **kw)
        self.down_proj = nn.Linear(hidden, d, **kw)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def eager_model(config, dims, device, dtype) -> nn.Module:
    d, hidden, bias, gated = dims
    if gated:
        return LlamaMLP(d, hidden, device, dtype)
    return nn.Sequential(nn.Linear(d, hidden, bias=bias, device=device, dtype=dtype),
                         nn.GELU(approximate="tanh"),
                         nn.Linear(hidden, d, bias=bias, device=device, dtype=dtype))


class _WideShim(Backend):
    """Until the 'triton' backend is registered, run fused_mlp's wide layers on the wide
    kernels through a benchmark-only backend with the same interface."""

    name = "triton-wide"
    device_types = ("cuda", "xpu", "cpu")

    def available(self):
        from ..backends.triton import wide
        return wide.available()

    def supports(self, spec, device):
        from ..backends.triton import wide
        return wide.supports_device(device), "wide kernels"

    def forward(self, x, weights, biases, spec, save):
        from ..backends.triton import wide
        return wide.forward(x, weights, biases, spec, save)

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        from ..backends.triton import wide
        return wide.backward(grad_y, x, weights, biases, saved, spec, needs)


def ours_model(eager: nn.Module, gated: bool, device, notes) -> tuple[nn.Module, str]:
    """Our fused module sharing the eager model's parameters."""
    if device.type == "cpu":
        from ..backends.triton import wide
        if not wide.interpreting():
            _note(notes, "cpu without TRITON_INTERPRET=1: 'triton' rows ran the reference")
            name = "reference"
        else:
            name = "triton"
    else:
        name = "triton"
    # on a GPU the dispatcher's own choice (what a user gets): the wide Triton kernels,
    # but plain eager calls of the row counts in backends/triton/routes.py as torch ops
    call_name = name
    if device.type != "cpu":
        call_name = None
        from ..backends.triton import routes_note
        _note(notes, "'triton' rows on the GPU: the package's automatic choice, i.e. the "
                     "wide Triton kernels" + (routes_note(device, gated) or "") +
                     "; each row's 'route' says which path it took")
        from ..backends.triton.wide import hopper_gemm
        _note(notes, "train steps' activation input gradient and gated dh GEMM: " + (
            "the warp-specialized Gluon kernel (wide/hopper_gemm.py)"
            if hopper_gemm.available(device, torch.bfloat16) else "the wide Triton kernels"))
    _note(notes, "ours: the package's modules sharing the eager model's parameters, "
                 "fm.FusedMLP (wide-gelu) and fm.GatedMLP (wide-swiglu); wide-gelu results "
                 "before run h200-wide-small-20261201f called fm.fused_mlp instead")
    if gated:
        return fm.GatedMLP.from_module(eager, backend=call_name), name
    mlp_name = call_name
    if name == "triton" and ("triton" not in dispatch.REGISTRY
                             or not dispatch.availability("triton")[0]):
        dispatch.register(_WideShim())
        mlp_name = _WideShim.name
        _note(notes, "fused_mlp ran through a benchmark-only backend over backends/triton/wide/"
                     " ('triton' backend not registered in this checkout)")
    # the package's module, as a user swaps it in for the nn.Sequential, holding the
    # eager model's own Parameters (the train steps take gradients with respect to them)
    ours = fm.FusedMLP.from_sequential(eager, backend=mlp_name)
    for lin, src in zip(ours.linears, (eager[0], eager[2])):
        lin.weight, lin.bias = src.weight, src.bias
    return ours, name


def _route(ours, x, mode) -> str:
    """What the package ran for this call: its backend and, for wide layers, the path for
    this many rows (fm.explain)."""
    ex = fm.explain(ours, x)
    return f"{ex.backend}: {ex.route(x, train=mode == 'train')}"


def _note(notes, text):
    if text not in notes:
        notes.append(text)


def bare_fns(eager: nn.Module, gated: bool):
    """The same matmuls as the model, no bias, activation or gate product: inference and
    a hand-written train step (forward + backward GEMMs, no autograd, no reductions)."""
    if gated:
        wg, wu, wd = eager.gate_proj.weight, eager.up_proj.weight, eager.down_proj.weight

        def infer(x):
            g, u = x.mm(wg.t()), x.mm(wu.t())
            return u.mm(wd.t()), g

        def train(x, gy):
            g, u = x.mm(wg.t()), x.mm(wu.t())
            y = u.mm(wd.t())
            dh = gy.mm(wd)
            return y, torch.addmm(dh.mm(wg), dh, wu), gy.t().mm(u), dh.t().mm(x), dh.t().mm(x)
    else:
        w1, w2 = eager[0].weight, eager[2].weight

        def infer(x):
            return x.mm(w1.t()).mm(w2.t())

        def train(x, gy):
            h = x.mm(w1.t())
            y = h.mm(w2.t())
            dh = gy.mm(w2)
            return y, dh.mm(w1), gy.t().mm(h), dh.t().mm(x)
    return infer, train


# --- measuring ----------------------------------------------------------------------
class _Clock:
    """Times fn(i) on one device (tools.calls_ms: events where there are some)."""

    def __init__(self, device):
        self.device = device

    def time(self, fn, n):
        """ms per call of ``fn(i)`` for i in range(n), back to back, behind one untimed
        call (calls_ms's ``lead``)."""
        return calls_ms(self.device, fn, n, lead=True)


WARMUP = 3  # calls before timing (the first one autotunes/compiles)


def time_calls(clock, fn, repeats, target_ms, warmup=None):
    """(median, min, max) ms of fn(i) over ``repeats`` timed batches, after warm-up."""
    ts = time_interleaved(clock, {None: fn}, repeats, target_ms, warmup)[None]
    return statistics.median(ts), min(ts), max(ts)


def time_interleaved(clock, fns: dict, repeats, target_ms, warmup=None) -> dict:
    """Each of ``fns`` (name -> fn(i)) timed in ``repeats`` batches taken in turn (the
    order reversed every other round), after warm-up: name -> list of ms per call, the
    i-th batches of all names seconds apart at most, so a drifting clock (throttling)
    moves them together."""
    inner = {}
    for name, fn in fns.items():
        for i in range(WARMUP if warmup is None else warmup):
            fn(i)
        est = clock.time(fn, 1)
        inner[name] = max(1, min(50, math.ceil(target_ms / max(est, 1e-3))))
    ts = {name: [] for name in fns}
    for r in range(repeats):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            ts[name].append(clock.time(fns[name], inner[name]))
    return ts


def ceilings(device, dtype, tiny):
    """Device copy GB/s (read + write bytes) and an n^3 matmul's TFLOP/s, measured now."""
    clock = _Clock(device)
    n = 2**24 if tiny else 2**29  # 512 MiB (uint8): ~9x the H200's 60 MB L2
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms, _, _ = time_calls(clock, lambda i: dst.copy_(src), 7, 20)
    copy = 2 * n / (ms * 1e-3) / 1e9
    m = 512 if tiny else 8192
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    ms, _, _ = time_calls(clock, lambda i: a.mm(b), 7, 50)
    del src, dst
    return copy, 2 * m**3 / (ms * 1e-3) / 1e12


def flops_bytes(dims, m, mode, esize):
    d, hidden, _, gated = dims
    mats = 3 if gated else 2
    f = 2 * m * d * hidden * mats
    w = mats * d * hidden * esize
    io = 2 * m * d * esize  # x read, y written
    if mode == "train":
        return 3 * f, 2 * w + 2 * io  # + weights' grads written, grad_y read, grad_x written
    return f, w + io


def rel(a, b):
    a, b = a.detach().float(), b.detach().float()
    if torch.isnan(a).any():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


@contextlib.contextmanager
def poisoned():
    """Outputs our kernels allocate start as NaN (an unwritten element cannot pass)."""
    from ..backends import memory
    real = memory.new_empty

    def nan_empty(*shape, like, dtype=None):
        t = real(*shape, like=like, dtype=dtype)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    memory.new_empty = nan_empty
    try:
        yield
    finally:
        memory.new_empty = real


# --- one config ---------------------------------------------------------------------
def run_config(config, dims, m, args, device, dtype, ceil, notes, t_start, backends):
    """Check, then time, each of ``backends`` on this config and M, both modes."""
    d, hidden, bias, gated = dims
    torch.manual_seed(0)
    eager = eager_model(config, dims, device, dtype)
    ours, ours_name = ours_model(eager, gated, device, notes)
    bare_infer, bare_train = bare_fns(eager, gated)
    params = list(eager.parameters())
    x_bytes = m * d * dtype.itemsize
    n_sets = max(2, min(16, math.ceil(2 * L2_BYTES / max(x_bytes, 1))))
    xs = [torch.randn(m, d, device=device, dtype=dtype) for _ in range(n_sets)]
    gys = [torch.randn(m, d, device=device, dtype=dtype) for _ in range(n_sets)]

    fns = {"eager": eager, "triton": ours}
    if "compile" in backends:
        fns["compile"] = torch.compile(eager, mode="max-autotune-no-cudagraphs", dynamic=False)
    records = []
    for mode in ("inference", "train"):
        flops, nbytes = flops_bytes(dims, m, mode, dtype.itemsize)
        floor = max(flops / (ceil["matmul"] * 1e12), nbytes / (ceil["copy"] * 1e9)) * 1e3
        # the fp32 reference (same bf16 parameters, upcast), and its gradients
        x0 = xs[0].float().requires_grad_(mode == "train")
        ref_params = [p.detach().float().requires_grad_(mode == "train") for p in params]
        y_ref = torch.func.functional_call(eager, dict(zip(
            [n for n, _ in eager.named_parameters()], ref_params)), (x0,))
        ref = [y_ref]
        if mode == "train":
            ref += list(torch.autograd.grad(y_ref, [x0, *ref_params], gys[0].float()))
        steps, errs, peaks = {}, {}, {}  # the backends that passed their check
        for backend in backends:
            if backend == "compile" and (args.compile == "inference" and mode == "train"):
                continue
            if backend == "compile" and time.perf_counter() - t_start > args.budget_s:
                notes.append(f"{config} M {m} {mode}: compile skipped, past --budget-s")
                continue
            if backend == "bare":
                step = (lambda i: bare_infer(xs[i % n_sets])) if mode == "inference" else \
                    (lambda i: bare_train(xs[i % n_sets], gys[i % n_sets]))
                err = None
            else:
                fn = fns[backend]
                if mode == "inference":
                    def step(i, fn=fn):
                        with torch.inference_mode():
                            return [fn(xs[i % n_sets])]
                else:
                    def step(i, fn=fn):
                        x = xs[i % n_sets].detach().requires_grad_()
                        y = fn(x)
                        return [y, *torch.autograd.grad(y, [x, *params], gys[i % n_sets])]
                with poisoned() if backend == "triton" else contextlib.nullcontext():
                    outs = step(0)
                err = max(rel(o, r) for o, r in zip(outs, ref))
                del outs
                if not err <= args.check_tol:
                    notes.append(f"{config} M {m} {mode} {backend}: CHECK FAILED, max rel error "
                                 f"{err:.3e} > {args.check_tol}; not timed")
                    records.append(_record(config, m, dtype, mode, backend, "python", 0, None,
                                           floor, flops, err, None))
                    continue
            peak = peak_mb(step, device) if mode == "train" else None
            steps[backend], errs[backend], peaks[backend] = step, err, peak
        # each pass takes the backends' batches in turn (time_interleaved), so that x_bare
        # compares times taken within a second or so, and a clock that drifts
        # (throttling) moves every backend alike; x_bare_paired is the median of the
        # batch-by-batch ratios to bare
        for p in range(1, args.passes + 1):
            order = list(steps) if p % 2 else list(steps)[::-1]
            ts = time_interleaved(_Clock(device), {b: steps[b] for b in order}, args.repeats,
                                  args.target_ms)
            for backend in order:
                v = ts[backend]
                r = _record(config, m, dtype, mode, backend, "python", p,
                            (statistics.median(v), min(v), max(v)), floor, flops,
                            errs[backend], peaks[backend])
                if "bare" in ts:
                    r["x_bare_paired"] = statistics.median(a / b for a, b in zip(v, ts["bare"]))
                if backend != "eager" and "eager" in ts:  # > 1: faster than eager
                    r["eager_over_paired"] = statistics.median(
                        e / a for a, e in zip(v, ts["eager"]))
                if backend == "triton":
                    r["route"] = _route(ours, xs[0], mode)
                records.append(r)
        if m <= 64 and mode == "inference" and device.type == "cuda" and not args.no_graphs:
            for backend, step in steps.items():
                if backend == "compile":
                    continue
                t = _graph_time(step, device, args, notes, f"{config} M {m} {backend}")
                if t is not None:
                    records.append(_record(config, m, dtype, mode, backend, "graph", 1, t,
                                           floor, flops, errs[backend], peaks[backend]))
    del xs, gys, eager, ours, fns
    return records


def _graph_time(step, device, args, notes, what):
    """Small batches are launch-bound: device time alone, replayed from a CUDA graph."""
    try:
        step(0)
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            step(0)
        torch.cuda.current_stream(device).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(10):
                step(i)
        t = time_calls(_Clock(device), lambda i: g.replay(), args.repeats, args.target_ms)
        return tuple(v / 10 for v in t)
    except Exception as e:  # record why, keep the python-timed rows
        notes.append(f"{what}: CUDA-graph timing failed: {type(e).__name__}: {e}")
        return None


def _record(config, m, dtype, mode, backend, timing, p, t, floor, flops, err, peak):
    r = {"config": config, "N": m, "dtype": str(dtype).replace("torch.", ""), "mode": mode,
         "backend": backend, "timing": timing, "pass": p, "median_ms": None, "min_ms": None,
         "max_ms": None, "rows_per_s": None, "tflops": None, "floor_ms": floor,
         "x_floor": None, "x_bare": None, "max_rel_error": err, "peak_mem_MB": peak}
    if t is not None:
        med, lo, hi = t
        r.update(median_ms=med, min_ms=lo, max_ms=hi, rows_per_s=m / (med * 1e-3),
                 tflops=flops / (med * 1e-3) / 1e12, x_floor=med / floor if floor else None)
    return r


def _relate(records, notes):
    """x_bare against the bare row of the same config, N, mode, timing and pass; flag
    passes that disagree by more than 5%."""
    bare = {(r["config"], r["N"], r["dtype"], r["mode"], r["timing"], r["pass"]): r["median_ms"]
            for r in records if r["backend"] == "bare"}
    for r in records:
        b = bare.get((r["config"], r["N"], r["dtype"], r["mode"], r["timing"], r["pass"]))
        if b and r["median_ms"]:
            r["x_bare"] = r["median_ms"] / b
    by = {}
    for r in records:
        if r["median_ms"]:
            by.setdefault((r["config"], r["N"], r["dtype"], r["mode"], r["backend"], r["timing"]),
                          []).append(r["median_ms"])
    for k, v in by.items():
        if len(v) > 1 and max(v) > 1.05 * min(v):
            notes.append(f"{' '.join(map(str, k))}: passes disagree by "
                         f"{100 * (max(v) / min(v) - 1):.1f}% (throttling or noise)")


def table(records) -> str:
    lines = [f"{'config':<12}{'N':>6} {'dtype':<9}{'mode':<10}{'backend':<9}{'timing':<7}"
             f"{'pass':>4}{'median ms':>12}{'x bare':>9}{'paired':>8}{'eager/':>8}{'x floor':>9}"
             f"{'TFLOP/s':>10}{'peak MB':>10}{'rel err':>10}"]
    for r in records:
        def f(k, fmt):
            width = int(fmt.split(".")[0])
            return format(r[k], fmt) if r.get(k) is not None else "-".rjust(width)
        lines.append(f"{r['config']:<12}{r['N']:>6} {r['dtype']:<9}{r['mode']:<10}"
                     f"{r['backend']:<9}{r['timing']:<7}{r['pass']:>4} {f('median_ms', '11.4f')}"
                     f" {f('x_bare', '8.3f')} {f('x_bare_paired', '7.3f')}"
                     f" {f('eager_over_paired', '7.3f')} {f('x_floor', '8.2f')} {f('tflops', '9.1f')} {f('peak_mem_MB', '9.0f')}"
                     f" {f('max_rel_error', '9.1e')}")
    return "\n".join(lines)


def llama_prefill(shape, device, dtype, notes) -> list[dict]:
    """A HF Llama decoder stack (transformers' LlamaModel from its config, random weights)
    prefilling 4 sequences: eager against a deep copy after fm.fuse_gated_mlps, outputs
    checked against each other, the two timed in turn (no-grad forward, sdpa attention)."""
    import copy as _copy

    try:
        import transformers
    except ImportError as e:
        notes.append(f"llama prefill skipped: {e}")
        return []
    d, hidden, layers, tokens = shape
    cfg = transformers.LlamaConfig(hidden_size=d, intermediate_size=hidden,
                                   num_hidden_layers=layers, num_attention_heads=d // 128,
                                   num_key_value_heads=max(1, d // 512), vocab_size=32000,
                                   max_position_embeddings=max(4096, tokens))
    torch.manual_seed(0)
    with torch.device(device):
        eager = transformers.LlamaModel(cfg).to(dtype).eval()
    fused = _copy.deepcopy(eager)
    report = fm.fuse_gated_mlps(fused, report=True)[1]
    ids = torch.randint(0, cfg.vocab_size, (4, tokens), device=device)
    label = f"llama-prefill:{d}x{hidden}x{layers}L"
    fns = {}
    for name, model in (("eager", eager), ("triton", fused)):
        def step(i, model=model):
            with torch.inference_mode():
                return model(input_ids=ids, use_cache=False).last_hidden_state
        fns[name] = step
    err = rel(fns["triton"](0), fns["eager"](0))
    ts = time_interleaved(_Clock(device), fns, 9, 20.0)
    out = []
    for name, v in ts.items():
        r = _record(label, 4 * tokens, dtype, "inference", name, "python", 1,
                    (statistics.median(v), min(v), max(v)), None, 0, err if name == "triton"
                    else None, None)
        r["mlps_swapped"] = len(report.swapped)
        out.append(r)
    med = {r["backend"]: r["median_ms"] for r in out}
    notes.append(f"{label} {str(dtype)[6:]}: 4 x {tokens} tokens, eager {med['eager']:.3f} ms, "
                 f"fused MLPs {med['triton']:.3f} ms ({med['eager'] / med['triton']:.3f}x), "
                 f"{len(report.swapped)} MLPs swapped, rel error vs eager {err:.1e}")
    del eager, fused
    return out


def _parse_dims(p, specs):
    """--dims: None (each config's own) or a list of (d, hidden)."""
    if not specs:
        return None
    out = []
    for s in specs:
        if s == "real":
            out += REAL_DIMS
            continue
        try:
            d, h = (int(v) for v in s.lower().split("x"))
        except ValueError:
            p.error(f"--dims: {s!r} is not DxH (e.g. 2048x5632) or 'real'")
        if d <= 0 or h <= 0:
            p.error(f"--dims: {s!r}: both sizes must be positive")
        out.append((d, h))
    return out


def _shapes(config, dims_list, tiny):
    """(label, (d, hidden, bias, gated)) for one config: its own shape, or each pair of
    --dims (labelled config:DxH)."""
    d, hidden, bias, gated = (TINY if tiny else CONFIGS)[config]
    if dims_list is None:
        return [(config, (d, hidden, bias, gated))]
    return [(f"{config}:{dd}x{hh}", (dd, hh, bias, gated)) for dd, hh in dims_list]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="the results table to append the run to "
                   "(.jsonl, e.g. benchmarks/results/<machine>.jsonl; default: print only)")
    p.add_argument("--run", default=None, metavar="ID",
                   help="with --out: the run's id in the table (default "
                        "<machine>-wide-<date>-<time>)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU smoke test)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--rows", nargs="+", type=int, default=None, help="M values (default 16 8192)")
    p.add_argument("--compile", choices=("none", "inference", "all"), default="inference",
                   help="torch.compile(max-autotune-no-cudagraphs) baseline: its autotuning "
                        "takes minutes, so by default only for inference")
    p.add_argument("--passes", type=int, default=2, help="timing passes per case")
    p.add_argument("--repeats", type=int, default=9, help="timed batches per pass (median)")
    p.add_argument("--target-ms", type=float, default=20.0, help="length of one timed batch")
    p.add_argument("--check-tol", type=float, default=None,
                   help="max rel error vs fp32 accepted before timing (default: tests' table)")
    p.add_argument("--budget-s", type=float, default=180.0,
                   help="skip compile cases once this much time has passed")
    p.add_argument("--stop-s", type=float, default=float("inf"),
                   help="time no further shapes once this much time has passed (the JSON "
                        "keeps what was timed)")
    p.add_argument("--no-graphs", action="store_true", help="skip CUDA-graph rows at M <= 64")
    p.add_argument("--device", default=None)
    p.add_argument("--dims", nargs="+", default=None, metavar="DxH",
                   help="d x hidden pairs instead of each config's own (e.g. 2048x5632); "
                        "'real' = the pairs of released models (REAL_DIMS)")
    p.add_argument("--sweep", action="store_true",
                   help="every M in SWEEP_M and d/hidden in REAL_DIMS (unless --rows/--dims "
                        "say otherwise), one pass of 7 batches, no graphs, no compile")
    p.add_argument("--dtype", nargs="+", default=["bfloat16"], choices=sorted(DTYPES))
    p.add_argument("--llama", action="store_true",
                   help="also time a HF Llama prefill (transformers, random weights), eager "
                        "against fuse_gated_mlps, at --llama-shape")
    p.add_argument("--llama-shape", nargs=4, type=int, default=[2048, 5632, 4, 512],
                   metavar=("D", "H", "LAYERS", "TOKENS"), help="4 sequences of TOKENS")
    args = p.parse_args(argv)
    try:
        if args.out:
            results.check_table_path(args.out)
        if args.run:
            results.check_run_id(args.run, "--run")
            if not args.out:
                raise ValueError("--run: a run id names a run in a results table: give the "
                                 "table with --out")
    except ValueError as e:
        p.error(str(e))
    if args.sweep:
        args.rows = args.rows or list(SWEEP_M)
        args.dims = args.dims or ["real"]
        # 7 batches, the protocol's least: with 5, train calls of 0.3-0.6 ms (host-bound)
        # had eager's batch medians swing 30% in one run (h100-wide-sweep-*-20261205a)
        args.passes, args.repeats = 1, min(args.repeats, 7)
        args.target_ms = min(args.target_ms, 10.0)
        args.no_graphs, args.compile = True, "none"
    dims_list = _parse_dims(p, args.dims)
    t_start = time.perf_counter()
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else
                                          "xpu" if hasattr(torch, "xpu") and torch.xpu.is_available()
                                          else "cpu"))
    if device.type == "cpu" and not args.tiny:
        p.error("no GPU: use --tiny on the CPU")
    if device.type != "cpu":
        mod = getattr(torch, device.type)
        if device.index is None:
            device = torch.device(device.type, mod.current_device())
        mod.set_device(device)
    dtypes = [DTYPES[n] for n in args.dtype]
    dtype = dtypes[0]
    if args.tiny:
        global WARMUP
        args.passes, args.repeats, args.target_ms, WARMUP = min(args.passes, 1), 7, 1.0, 1
    rows = args.rows or ([16, 40] if args.tiny else [16, 8192])
    notes = []
    tol = args.check_tol
    copy, mm = ceilings(device, dtype, args.tiny)
    ceil = {"copy": copy, "matmul": mm}
    records = []
    cases = [(dt, label, dims, m) for dt in dtypes for config in args.configs
             for label, dims in _shapes(config, dims_list, args.tiny) for m in rows]
    for dt, label, dims, m in cases:
        if time.perf_counter() - t_start > args.stop_s:
            notes.append(f"stopped before {label} M {m} {dt}: past --stop-s")
            break
        args.check_tol = tol or TOL[dt]
        records += run_config(label, dims, m, args, device, dt, ceil, notes, t_start,
                              ("bare", "eager", "triton"))
    if args.llama and device.type == "cuda":
        for dt in dtypes:
            records += llama_prefill(args.llama_shape, device, dt, notes)
    args.check_tol = tol or TOL[dtype]
    # torch.compile's max-autotune takes ~1 min a shape: it runs last, largest M first (the
    # targets), within --budget-s; its x_bare is against the bare rows timed earlier
    if args.compile != "none" and device.type != "cpu":
        for m in sorted(rows, reverse=True):
            for config in args.configs:
                for label, dims in _shapes(config, dims_list, args.tiny):
                    records += run_config(label, dims, m, args, device, dtype, ceil, notes,
                                          t_start, ("compile",))
    _relate(records, notes)
    notes.append(lean_launches_note())
    notes.append("peak_mem_MB: torch.cuda.max_memory_allocated during one train step minus "
                 "the memory allocated before it (parameters and inputs excluded)")
    notes.append("bare train: the forward and backward GEMMs of the same shapes by hand "
                 "(no bias, activation, gate product or bias-gradient reductions)")
    if args.tiny:
        notes.append("--tiny: toy shapes, not a performance result")
    out = {"schema": SCHEMA, "env": environment(device),
           "ceilings": {"copy_GBps": copy, "matmul_TFLOPs": {"bfloat16": mm}},
           "records": records, "notes": notes}
    what = ("fusedmlp bench --suite wide" + (" --sweep" if args.sweep else "")
            + f" --configs {' '.join(args.configs)} --dtype {' '.join(args.dtype)}"
            + (" --tiny" if args.tiny else ""))
    writer = results.run_writer(args.out, args.run, what, "wide-sweep" if args.sweep else "wide")
    writer.write(out, final=True)
    print(table(records))
    print(f"ceilings: copy {copy:.0f} GB/s, bf16 matmul {mm:.1f} TFLOP/s")
    for n in notes:
        print("note:", n)
    print(f"{results.where_written(writer)} ({time.perf_counter() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
