"""``fusedmlp profile``: eager nn.Linear vs torch.compile vs FusedMLP under torch.profiler.

The point of the package in one table: the same MLP run three ways on one device, with
what the profiler sees -- device time, how many kernels (or ops) one call costs, where
the time goes, the working memory and, on a GPU, how long the device sat idle waiting
for the host. Timing is a quick look (wall clock around back-to-back calls); the
protocol-grade numbers come from ``fusedmlp bench``. The three are timed after all are
profiled, their repeats in turn, so the speed-up column compares them under the same host
load.
"""
from __future__ import annotations

import contextlib
import datetime
import glob
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from . import configs

#: the record_function name around each profiled call; its children are "one call"
STEP = "fusedmlp.profile.step"

#: CPU defaults: big enough that the matmuls, not Python, dominate the eager row, small
#: enough that the whole command (torch.compile included, ~20 s of it) stays under a
#: minute on 2 cores.
CPU_BATCH = 4096
#: GPU default: 2^20 rows, the batch where the narrow targets (targets.py) start.
GPU_BATCH = 2**20

# Wall-clock budget per timed repeat: long enough to hide timer and launch jitter.
_REPEAT_S = 0.05
_REPEATS = 5
_PROFILED_STEPS = 5
#: repeats of one timing further apart than this (``_spread``) are flagged as untrustworthy
SPREAD_LIMIT = 0.25


@dataclass
class Row:
    """One variant's measurements; times in ms, memory in MB, fractions in [0, 1]."""

    name: str                      # eager | compile | fused
    label: str                     # what ran, e.g. "fused[reference]"
    ok: bool = True
    reason: str = ""               # why it failed, when ok is False
    warmup_s: float | None = None  # first call (torch.compile compiles here)
    fwd_ms: float | None = None
    train_ms: float | None = None
    spread: float | None = None    # _spread of the timed repeats of the profiled mode
    device_ms: float | None = None
    profiled_ms: float | None = None  # wall time per profiled call: device_ms's yardstick
    launches: float | None = None
    top_ops: list[tuple[str, float]] = field(default_factory=list)  # (name, share of self time)
    peak_mb: float | None = None
    idle: float | None = None
    rel_err: float | None = None   # vs eager, same dtype, same input
    speedup: float | None = None   # eager time / this time, in the profiled mode


@dataclass
class ProfileResult:
    config: str
    widths: tuple[int, ...]
    batch: int
    device: str
    dtype: str
    train: bool
    rows: list[Row]
    traces: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    threads: int = field(default_factory=torch.get_num_threads)

    def to_dict(self) -> dict:
        return asdict(self)


# --- device helpers ------------------------------------------------------------------
def resolve_device(name: str = "auto") -> torch.device:
    """"auto": the first of cuda, xpu, cpu that is present; otherwise the named one."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if hasattr(torch, "xpu") and torch.xpu.is_available():
            return torch.device("xpu")
        return torch.device("cpu")
    dev = torch.device(name)
    if dev.type not in ("cpu", "cuda", "xpu"):
        raise ValueError(f"device: expected auto, cpu, cuda or xpu, got {name!r}")
    if dev.type != "cpu":
        mod = getattr(torch, dev.type, None)
        if mod is None or not mod.is_available():
            raise ValueError(f"device: {name!r} requested but torch sees no {dev.type} device")
    return dev


def _devmod(device: torch.device):
    """torch.cuda / torch.xpu for a GPU device, None on the CPU."""
    return None if device.type == "cpu" else getattr(torch, device.type)


def _sync(device: torch.device) -> None:
    mod = _devmod(device)
    if mod is not None:
        mod.synchronize(device)


def default_dtype(device: torch.device) -> torch.dtype:
    # fp16 is the GPU operating point of every target; CPU matmuls in fp16 are emulated
    # and slow, so the CPU default is float32.
    return torch.float32 if device.type == "cpu" else torch.float16


def default_batch(device: torch.device, cfg: configs.MLPConfig | None = None) -> int:
    if cfg is not None and cfg.regime == "wide":
        # the wide benchmark's two token counts: 16 (launch-bound) on the CPU, where one
        # 8192-token step of a 4096x16384 FFN takes minutes; 8192 on a GPU
        return min(cfg.batches) if device.type == "cpu" else max(cfg.batches)
    return CPU_BATCH if device.type == "cpu" else GPU_BATCH


# --- the three variants --------------------------------------------------------------
def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def _step_fn(module: Callable, x: torch.Tensor, params: list[torch.Tensor], train: bool,
             grad_y: torch.Tensor | None):
    """One call of the profiled mode: a forward under inference_mode, or forward + backward
    for the input and every parameter (no optimizer step, as the benchmark's train mode)."""
    if not train:
        def step():
            with torch.inference_mode():
                return module(x)
        return step
    xg = x.detach().requires_grad_(True)

    def step():
        y = module(xg)
        return torch.autograd.grad(y, [xg, *params], grad_y)
    return step


def _forward_fn(module: Callable, x: torch.Tensor):
    def fwd():
        with torch.inference_mode():
            return module(x)
    return fwd


def _time_ms(fns: dict[str, Callable], device: torch.device) -> dict[str, tuple[float, float]]:
    """name -> (median wall-clock ms per call over back-to-back calls, the repeats' spread
    (``_spread``)), the device synced per repeat. The functions' repeats are taken in
    turn, the order rotating each round: a host's speed drifts over seconds (on a 2-core
    CPU the same ops ran 0.80x eager timed after it and 1.17x in the next run), and
    interleaved the drift lands on every variant alike."""
    calls = {}
    for name, fn in fns.items():
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        once = max(time.perf_counter() - t0, 1e-6)
        calls[name] = max(1, min(1000, int(_REPEAT_S / once)))
    per_call: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(_REPEATS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn, n = fns[name], calls[name]
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            _sync(device)
            per_call[name].append((time.perf_counter() - t0) * 1e3 / n)
    return {name: (statistics.median(v), _spread(v)) for name, v in per_call.items()}


def _spread(times: list[float]) -> float:
    """How far apart the repeats that decide the median are: max / min - 1 over all but
    the fastest and the slowest (five repeats or more), over all of them below that. One
    repeat stalled by a descheduled thread moves neither the median nor this; repeats
    that disagree among themselves move both."""
    v = sorted(times)
    if len(v) >= 5:
        v = v[1:-1]
    return v[-1] / v[0] - 1


# --- reading the profiler ------------------------------------------------------------
def _is_device_event(e) -> bool:
    return e.device_type != torch.autograd.DeviceType.CPU


def _is_kernel(e) -> bool:
    # copies and fills are device activity but not compute kernels of the MLP; the step's
    # record_function also shows up on the GPU timeline (a user annotation, not a kernel:
    # counting it doubled 'device ms' and added one launch per step on the H200)
    return _is_device_event(e) and e.name != STEP \
        and not e.name.startswith(("Memcpy", "Memset", "[memory]", "ProfilerStep"))


def _short(name: str) -> str:
    if "CompiledFxGraph" in name:
        # inductor's generated kernels run inside this call and are invisible to the
        # CPU profiler, so its self time is their time
        return "inductor graph"
    # GPU kernel names are C++ signatures: the return type and the argument list
    # carry nothing a reader needs to tell kernels apart
    name = name.removeprefix("void ").split("(")[0] or name
    return name if len(name) <= 40 else name[:37] + "..."


def _under_step(e) -> bool:
    p = e.cpu_parent
    while p is not None:
        if p.name == STEP:
            return True
        p = p.cpu_parent
    return False


def _outermost_aten(events) -> int:
    """aten ops that no other aten op encloses, inside the profiled steps."""
    n = 0
    for e in events:
        if not e.name.startswith("aten::") or not _under_step(e):
            continue
        p, nested = e.cpu_parent, False
        while p is not None and p.name != STEP:
            if p.name.startswith("aten::"):
                nested = True
                break
            p = p.cpu_parent
        n += not nested
    return n


def _top_ops(events, on_gpu: bool, k: int = 3) -> tuple[list[tuple[str, float]], float]:
    """Top-k names by self time (device self time on a GPU), and that total, in us."""
    totals: dict[str, float] = {}
    for e in events:
        if on_gpu:
            if not _is_kernel(e):
                continue
            # a kernel has no children: its self time is its duration (read directly,
            # since the *_device_time_* property names changed across torch releases)
            t = e.time_range.elapsed_us()
        else:
            if _is_device_event(e) or e.name == STEP or not _under_step(e):
                continue
            t = e.self_cpu_time_total
        totals[_short(e.name)] = totals.get(_short(e.name), 0.0) + t
    whole = sum(totals.values())
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:k]
    # wrappers with ~0 self time (aten::linear around aten::mm) say nothing about cost
    return [(n, t / whole) for n, t in top if whole and t / whole >= 0.01], whole


def _cpu_op_us(events) -> float:
    """CPU 'device time': self time of the aten ops and of inductor's graph call (whose
    self time is its C++ kernels), i.e. the step minus Python and dispatch overhead."""
    return sum(e.self_cpu_time_total for e in events
               if _under_step(e) and (e.name.startswith("aten::") or "CompiledFxGraph" in e.name))


def _idle_fraction(events) -> float | None:
    """1 - (union of kernel intervals) / (first step start .. last kernel or step end)."""
    steps = [e.time_range for e in events if e.name == STEP]
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events if _is_kernel(e))
    if not steps or not kernels:
        return None
    start = min(s.start for s in steps)
    end = max(max(s.end for s in steps), kernels[-1][1])
    busy, cur_s, cur_e = 0.0, None, None
    for s, t in kernels:
        s, t = max(s, start), min(t, end)
        if t <= s:  # wholly before the first step (a leftover from the warm-up)
            continue
        if cur_e is None or s > cur_e:
            busy += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, t
        else:
            cur_e = max(cur_e, t)
    busy += (cur_e - cur_s) if cur_e is not None else 0.0
    window = end - start
    return max(0.0, 1.0 - busy / window) if window > 0 else None


def per_call(events, calls: int) -> dict:
    """What one call costs, read from the events of a profile whose ``calls`` calls each
    ran under ``record_function(STEP)``: ``launches`` (kernels on a GPU; outermost aten
    ops on the CPU, whose own kernels the profiler does not see), ``device_ms`` (kernel
    time; on the CPU the ops' self time), ``idle`` (the share of the window with no kernel
    running; None on the CPU) and ``top_ops`` ((name, share of that time), the top 3)."""
    on_gpu = any(_is_kernel(e) for e in events)
    top, total_us = _top_ops(events, on_gpu)
    if on_gpu:
        launches, idle = sum(_is_kernel(e) for e in events), _idle_fraction(events)
    else:
        launches, idle, total_us = _outermost_aten(events), None, _cpu_op_us(events)
    return {"launches": launches / calls, "device_ms": total_us / calls / 1e3,
            "idle": idle, "top_ops": top}


def _profiler_peak_bytes(prof) -> float | None:
    """Peak of live CPU bytes the profiler saw allocated during the session, relative to
    its start (so: working memory, not weights or inputs). The CPU allocator keeps no
    peak statistic of its own, and process RSS never goes down, so it cannot be per variant."""
    try:
        raw = prof.profiler.kineto_results.events()
    except Exception:  # private attribute; absent in some torch builds
        return None
    cpu = torch.autograd.DeviceType.CPU
    mem = sorted((e.start_ns(), e.nbytes()) for e in raw
                 if e.name() == "[memory]" and e.device_type() == cpu)
    live = peak = 0
    for _, nbytes in mem:
        live += nbytes
        peak = max(peak, live)
    return float(peak)


def _export_chrome(prof, trace_dir: str, name: str) -> str:
    """A Chrome/Perfetto trace beside the TensorBoard one the handler wrote for ``name``."""
    path = os.path.join(trace_dir, f"{name}.chrome_trace.json")
    try:
        # kineto saves its own trace only once (the TensorBoard handler did); the Python
        # exporter writes the same events from the results already in memory
        prof.export_chrome_trace(path, use_python_export=True)
    except TypeError:  # a torch without the Python exporter: the handler's file is the same format
        tb = glob.glob(os.path.join(trace_dir, f"{name}.*.pt.trace.json"))
        shutil.copyfile(max(tb, key=os.path.getmtime), path)
    return path


#: kineto's own status lines (``USDT: ... profiler_start``, ``STAGE: ...``), written to
#: stderr on every profiler start and stop; KINETO_LOG_LEVEL only counts when it is set
#: before torch is imported, which a library cannot do
_KINETO_CHATTER = re.compile(rb"^(USDT|STAGE):.*\] ")


@contextlib.contextmanager
def _quiet_kineto():
    """Hold back kineto's status lines from file descriptor 2 (where the C++ library
    writes, whatever sys.stderr is); anything else written there passes."""
    fd = 2
    sys.stderr.flush()
    try:
        saved = os.dup(fd)
    except OSError:  # no stderr at all: nothing to hold back
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            kept = [ln for ln in tmp.read().splitlines(keepends=True)
                    if not _KINETO_CHATTER.match(ln)]
            if kept:
                os.write(fd, b"".join(kept))


def new_trace_dir(parent: str, config: str) -> str:
    """A fresh folder under ``parent`` for one run's traces (``<date>-<time>-<config>``),
    so that runs never mix (the TensorBoard handler names its files per run)."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = os.path.join(parent, f"{stamp}-{config}")
    for i in range(1, 100):
        if not os.path.exists(path):
            break
        path = os.path.join(parent, f"{stamp}-{config}-{i}")
    os.makedirs(path)
    return path


# --- one variant ---------------------------------------------------------------------
def _measure(row: Row, module, x, params, device, train, grad_y, trace_dir, traces,
             log: Callable[[str], None] = lambda s: None):
    """Warm ``module`` up and profile it into ``row`` -> (its forward, its step) for the
    timing that follows every variant's profile (``_time_ms``)."""
    step, fwd = _step_fn(module, x, params, train, grad_y), _forward_fn(module, x)
    t0 = time.perf_counter()
    step()  # warm-up; torch.compile compiles here, and may fail here
    if train:
        fwd()  # a forward under inference_mode compiles its own graph
    _sync(device)
    row.warmup_s = time.perf_counter() - t0
    log(f"  first call {row.warmup_s:.1f} s; profiling {_PROFILED_STEPS} "
        f"{'steps' if train else 'calls'} ...")

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    elif device.type == "xpu" and hasattr(ProfilerActivity, "XPU"):
        activities.append(ProfilerActivity.XPU)
    handler = None
    if trace_dir:
        handler = torch.profiler.tensorboard_trace_handler(trace_dir, worker_name=row.name)
    mod = _devmod(device)
    if mod is not None:
        _sync(device)
        mod.reset_peak_memory_stats(device)
        base = mod.memory_allocated(device)
    with _quiet_kineto(), profile(activities=activities, profile_memory=True,
                                  on_trace_ready=handler) as prof:
        t0 = time.perf_counter()
        for _ in range(_PROFILED_STEPS):
            with record_function(STEP):
                step()
        _sync(device)
        # the wall time of the profiled calls, measured under the same profiler as the
        # device time it bounds (the profiler slows each op: on a 2-core CPU, eager's ops
        # took 2.4 ms a call under it and 1.1 ms without, so the unprofiled wall time
        # is no yardstick for device ms)
        row.profiled_ms = (time.perf_counter() - t0) * 1e3 / _PROFILED_STEPS
    if mod is not None:
        row.peak_mb = (mod.max_memory_allocated(device) - base) / 2**20
    else:
        peak = _profiler_peak_bytes(prof)
        row.peak_mb = None if peak is None else peak / 2**20
    if trace_dir:
        traces.append(_export_chrome(prof, trace_dir, row.name))

    s = per_call(prof.events(), _PROFILED_STEPS)
    row.top_ops, row.device_ms, row.launches, row.idle = (
        s["top_ops"], s["device_ms"], s["launches"], s["idle"])
    return fwd, step


def _host_load() -> str | None:
    """A warning when other processes compete for the cores: with every core taken, one
    descheduled OpenMP thread stalls a whole parallel matmul, and timings swing 10-100x
    (seen on a shared 2-core machine)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on every platform
        return None
    cores = os.cpu_count() or 1
    if load < 0.75 * cores:
        return None
    return (f"the host was busy before this run (1-min load average {load:.1f} on {cores} "
            "cores): timings, CPU ones above all, may be inflated and vary between runs; "
            "on a shared CPU, --threads 1 (or OMP_NUM_THREADS=1) avoids most of the stalls.")


def _untrusted(r: ProfileResult) -> list[str]:
    """Notes on numbers that cannot be trusted: device time above the wall time of the
    same profiled calls it is part of (both measured under the profiler, so the
    profiler's own cost cannot set them apart: only a broken measurement can), or timed
    repeats far apart (a busy host)."""
    out = []
    for row in r.rows:
        if not row.ok:
            continue
        why = []
        if _device_above_wall(row):
            why.append(f"device ms ({row.device_ms:.3f}) above the wall time of the same "
                       f"profiled calls ({row.profiled_ms:.3f} per call)")
        if row.spread is not None and row.spread > SPREAD_LIMIT:
            why.append(f"timed repeats {row.spread:.0%} apart (more than {SPREAD_LIMIT:.0%})")
        if why:
            out.append(f"UNTRUSTED {row.label}: {'; '.join(why)}: a busy host or too many "
                       "threads; rerun with --threads 1 on a quiet machine.")
    return out


def _compile(module, mode: str):
    """torch.compile, in one place so tests can swap in a cheaper backend."""
    return torch.compile(module, mode=mode)


def _rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.detach().double(), ref.detach().double()
    den = ref.norm().item()
    return (y - ref).norm().item() / (den if den > 0 else 1.0)


def run_profile(config: str = configs.DEFAULT_CONFIG, batch: int | None = None,
                device: str = "auto", dtype: str | None = None, train: bool = False,
                trace_dir: str | None = None, compile_mode: str = "default",
                log: Callable[[str], None] | None = None) -> ProfileResult:
    """Profile ``config`` three ways on one device; see the module docstring."""
    cfg = configs.get(config)
    dev = resolve_device(device)
    if dtype is None:
        dt = default_dtype(dev)
    elif dtype in configs.DTYPES:
        dt = configs.DTYPES[dtype]
    else:
        raise ValueError(f"dtype: expected one of {', '.join(configs.DTYPES)}, got {dtype!r}")
    n = default_batch(dev, cfg) if batch is None else batch
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"batch: expected a positive int, got {n!r}")
    log = log or (lambda s: None)
    if trace_dir:
        trace_dir = new_trace_dir(trace_dir, cfg.name)
        log(f"traces go to {trace_dir}")
    busy = _host_load()  # before we add our own load

    import fusedmlp_xpu as fm

    # seeded for repeatable runs, without moving the caller's random state
    with torch.random.fork_rng(devices=[dev] if dev.type != "cpu" else [],
                               device_type=dev.type if dev.type != "cpu" else "cuda"):
        torch.manual_seed(0)
        fused = cfg.make(device=dev, dtype=dt)
        eager = fused.to_sequential()  # the same parameter values, as plain nn.Linear layers
        x = torch.randn(n, cfg.in_features, device=dev, dtype=dt)
        grad_y = torch.randn(n, cfg.out_features, device=dev, dtype=dt) if train else None
    backend = fm.explain(fused, x, train=train).backend or "none"

    result = ProfileResult(cfg.name, cfg.widths, n, str(dev), str(dt).replace("torch.", ""),
                           train, [])
    with torch.inference_mode():
        ref = eager(x)
    variants = [
        ("eager", "eager nn.Linear", lambda: (eager, list(eager.parameters()))),
        ("compile", f"torch.compile({compile_mode})",
         lambda: (_compile(eager, compile_mode), list(eager.parameters()))),
        ("fused", f"FusedMLP[{backend}]", lambda: (fused, list(fused.parameters()))),
    ]
    timed = {}  # name -> (forward, train step) of each variant that ran
    for name, label, build in variants:
        row = Row(name, label)
        log(f"profiling {label} ...")
        try:
            module, params = build()
            fns = _measure(row, module, x, params, dev, train, grad_y, trace_dir,
                           result.traces, log)
            with torch.inference_mode():
                row.rel_err = _rel_err(module(x), ref)
            timed[name] = fns
        except Exception as e:  # one variant failing (compile without a compiler) is a result
            row.ok, row.reason = False, _first_line(e)
        result.rows.append(row)
    log(f"timing {', '.join(timed)}, their repeats in turn ...")
    rows = {row.name: row for row in result.rows}
    for name, (ms, spread) in _time_ms({k: f for k, (f, _) in timed.items()}, dev).items():
        rows[name].fwd_ms, rows[name].spread = ms, spread
    if train:
        for name, (ms, spread) in _time_ms({k: s for k, (_, s) in timed.items()}, dev).items():
            rows[name].train_ms, rows[name].spread = ms, spread

    base = result.rows[0]
    for row in result.rows:
        t, t0 = (row.train_ms, base.train_ms) if train else (row.fwd_ms, base.fwd_ms)
        if row.ok and base.ok and t and t0:
            row.speedup = t0 / t
    if dev.type == "cpu":
        result.notes.append(
            "CPU: 'device ms' is the self time of aten ops (and of inductor's compiled graph) "
            "per call, measured under the profiler, which slows each op (it can exceed "
            "'fwd ms', timed without the profiler); 'launches' counts outermost aten ops per call (inductor's own C++ "
            "kernels run inside its graph call and are not seen); peak memory is the most "
            "live tensor memory the profiler saw allocated during the profiled calls.")
        if backend == "reference":
            result.notes.append(
                "FusedMLP runs the 'reference' backend on CPU (composite torch ops), so it is "
                "not expected to beat eager here; the fused kernels are GPU backends.")
    else:
        result.notes.append(
            "GPU: 'device ms' is kernel time per call, 'launches' counts kernels per call, "
            "peak memory is max_memory_allocated above what was allocated before, 'idle' "
            "is the share of the profiled window with no kernel running.")
    if busy:
        result.notes.append(busy)
    result.notes += _untrusted(result)
    comp = result.rows[1]
    if comp.ok and comp.warmup_s is not None:
        result.notes.append(f"torch.compile's first call (compilation) took {comp.warmup_s:.1f} s.")
    return result


# --- the table -----------------------------------------------------------------------
def _fmt(v, spec: str, na: str = "n/a") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return na
    return format(v, spec)


def _device_above_wall(row: Row) -> bool:
    """Device time per call above the wall time per call of the same profiled calls (5%
    for the clocks' granularity)."""
    return (row.device_ms is not None and row.profiled_ms is not None
            and row.device_ms > 1.05 * row.profiled_ms)


def format_table(r: ProfileResult) -> str:
    """The comparison table, as aligned plain text (also valid Markdown)."""
    per = "step" if r.train else "fwd"
    threads = f" threads={r.threads}" if r.device == "cpu" else ""
    head = [f"{r.config} widths={list(r.widths)} batch={r.batch} device={r.device}{threads} "
            f"dtype={r.dtype} mode={'train' if r.train else 'inference'}"]
    cols = ["variant", "fwd ms"] + (["train ms"] if r.train else []) + [
        f"device ms/{per}", f"launches/{per}", "peak MB", "idle", "vs eager", "rel err",
        "top ops by self time"]
    rows = []
    for row in r.rows:
        if not row.ok:
            rows.append([row.label, "FAILED"] + [""] * (len(cols) - 3) + [row.reason])
            continue
        tops = ", ".join(f"{n} {s:.0%}" for n, s in row.top_ops)
        rows.append([row.label, _fmt(row.fwd_ms, ".3f")]
                    + ([_fmt(row.train_ms, ".3f")] if r.train else [])
                    + [_fmt(row.device_ms, ".3f") + ("!" if _device_above_wall(row) else ""),
                       _fmt(row.launches, ".0f"),
                       _fmt(row.peak_mb, ".1f"), _fmt(row.idle, ".0%"),
                       _fmt(row.speedup, ".2f") + ("x" if row.speedup else ""),
                       _fmt(row.rel_err, ".1e"), tops])
    widths = [max(len(c), *(len(x[i]) for x in rows)) for i, c in enumerate(cols)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = head + ["", line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(x) for x in rows]
    out += [""] + [f"note: {n}" for n in r.notes]
    if r.traces:
        out.append("traces (Chrome/Perfetto; TensorBoard's *.pt.trace.json beside them): "
                   + ", ".join(r.traces))
    return "\n".join(out)


def add_arguments(parser) -> None:
    parser.add_argument("--config", default=configs.DEFAULT_CONFIG, choices=list(configs.CONFIGS),
                        help="a standard config (fusedmlp_xpu/bench/configs.py; default %(default)s)")
    parser.add_argument("--batch", type=configs.positive_int, default=None,
                        help=f"rows (default {CPU_BATCH} on CPU, {GPU_BATCH} on a GPU; "
                             "wide configs 16 on CPU, 8192 on a GPU)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "xpu"],
                        help="auto: cuda, then xpu, then cpu (default)")
    parser.add_argument("--dtype", default=None, choices=list(configs.DTYPES),
                        help="default float32 on CPU, float16 on a GPU")
    parser.add_argument("--train", action="store_true",
                        help="also time and profile forward+backward (input and weight grads)")
    parser.add_argument("--trace-dir", default=None,
                        help="write TensorBoard and Chrome/Perfetto traces into a new folder "
                             "<date>-<time>-<config> under this one")
    parser.add_argument("--threads", type=configs.positive_int, default=None,
                        help="CPU threads for torch (default: torch's, one per core); 1 gives "
                             "steadier numbers on a shared machine")
    parser.add_argument("--compile-mode", default="default",
                        help="torch.compile mode (default: torch's default mode; bench "
                             "uses max-autotune-no-cudagraphs, which autotunes for minutes)")
    parser.add_argument("--json", default=None, help="also write the measurements as JSON here")
