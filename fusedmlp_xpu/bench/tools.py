"""What the benchmark harnesses share (narrow.py's suite, wide.py's FFN blocks, steps.py,
and the scripts in benchmarks/): the environment a record is tagged with, a script's run
appended to the results table, back-to-back call timing with device events, and the
lean-launch counts."""
from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import platform
import time

import torch

import fusedmlp_xpu as fm

from . import results


def environment(device: torch.device) -> dict:
    """What a run's records are tagged with: versions, date, commit, the device."""
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.machine(), "fusedmlp_xpu": fm.__version__,
           "commit": results.commit_here()}
    with contextlib.suppress(Exception):
        env["triton"] = importlib.import_module("triton").__version__
    # the package's switches set for the run (a forced tuning, a backend off, ...)
    env["switches"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith("FUSEDMLP_")}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(device=p.name, vendor="nvidia", capability=f"{p.major}.{p.minor}",
                   sm_count=p.multi_processor_count, memory_GB=round(p.total_memory / 1e9, 1))
        with contextlib.suppress(Exception):
            import subprocess
            q = "driver_version,clocks.sm,clocks.mem,clocks.max.sm,power.limit"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
            env["driver"], env["clocks"] = out.split(",")[0].strip(), out
    elif device.type == "xpu":
        env.update(device=torch.xpu.get_device_name(device), vendor="intel")
    else:
        env.update(device=platform.processor() or platform.machine(), vendor="cpu",
                   threads=torch.get_num_threads())
    return env


def add_output_arguments(p) -> None:
    """``--out`` (the results table a run is appended to) and ``--run`` (its id), as the
    scripts in benchmarks/ take them."""
    p.add_argument("--out", default=None, help="the results table to append to (.jsonl; "
                   "default benchmarks/results/<machine>.jsonl)")
    p.add_argument("--run", default=None, metavar="ID",
                   help="the run's id in the table (default <machine>-<script>-<date>-<time>)")


def save_run(out: str | None, result: dict, run: str | None, what: str,
             prefix: str = "run") -> str:
    """Append a script's whole ``result`` to the results table ``out`` (default: the
    machine's) as run ``run`` (default ``<machine>-<prefix>-<date>-<time>``); returns the
    run id. Scripts that write as they go use ``results.RunWriter`` itself."""
    writer = results.RunWriter(out, run, what, prefix)
    writer.write(result, final=True)
    print(f"appended run {writer.run} to {writer.path}")
    return writer.run


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def peak_mb(step, device) -> float | None:
    """MiB a train step ``step(i)`` allocates at its peak above what was allocated before
    it (CUDA; None elsewhere), after one warm step so that compiles and autotuning are not
    counted."""
    if device.type != "cuda":
        return None
    step(0)
    sync(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step(1)
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def calls_ms(device, fn, n: int, start: int = 0, lead: bool = False) -> float:
    """ms per call of fn(i) for i in start..start+n-1, back to back: device events on GPUs,
    a host clock between two synchronizations elsewhere. ``lead``: one untimed call first
    (GPUs), so that the device is busy when the first event is recorded and the timed
    calls are queued behind it: the host's latency to the first timed kernel (an idle
    device waiting for it) is then not timed."""
    if device.type in ("cuda", "xpu"):
        mod = torch.cuda if device.type == "cuda" else torch.xpu
        a, b = mod.Event(enable_timing=True), mod.Event(enable_timing=True)
        if lead:
            fn(start + n)
        a.record()
        for i in range(start, start + n):
            fn(i)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / n
    sync(device)
    t = time.perf_counter()
    for i in range(start, start + n):
        fn(i)
    sync(device)
    return (time.perf_counter() - t) * 1e3 / n


def lean_launches_note() -> str:
    """How many Triton launches took the lean path (backends/triton/launch.py), per kernel."""
    try:
        from ..backends.triton import launch
    except Exception as e:  # noqa: BLE001 -- no Triton: nothing launched
        return f"lean launches: none (Triton backend not importable: {type(e).__name__})"
    counts = launch.stats()
    return "lean launches: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                                or "none")
