"""Where the host time of a wide block's train step at 16 rows goes (GPU machine); with
a narrow config (--config narrow-w32 --rows 65536), of a FusedMLP's train step (fp16).

1. Ours and eager interleaved (overhead.interleaved): the whole step; the forward alone
   under grad; the step with the autograd engine's device threads off
   (set_multithreading_enabled(False): backward runs on the calling thread).
2. Device time a step: K steps queued behind a long torch.cuda._sleep, timed with events
   from the sleep's end; the host's enqueue of the K steps must finish inside the sleep
   (printed), else something in the step waited for the device.
3. The step's Python parts timed with perf_counter around each (launches by caller,
   torch.mm, sums, allocations, the op's forward and backward, autograd.grad), next to
   the whole step, ours and eager, with the device threads on and off.

Usage: PYTHONPATH=. python benchmarks/host_wide_train.py [--steps 300] [--config wide-swiglu]
       [--rows 16]
"""
import argparse
import collections
import sys
import time

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import configs, gated, op
from fusedmlp_xpu.backends import memory
from fusedmlp_xpu.backends.triton import launch
from fusedmlp_xpu.bench_wide import CONFIGS, eager_model
from overhead import interleaved  # benchmarks/, this script's folder

SPENT = collections.defaultdict(float)
CALLS = collections.Counter()


def timed(name, fn, where=False):
    def wrapper(*args, **kwargs):
        key = name
        if where:  # the calling function in this package, and its line
            f = sys._getframe(1)
            while f is not None and "fusedmlp_xpu" not in f.f_code.co_filename:
                f = f.f_back
            key = f"{name} from {f.f_code.co_name}:{f.f_lineno}" if f else name
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[key] += time.perf_counter() - t
            CALLS[key] += 1
    return wrapper


def models(config, rows, narrow, dev="cuda"):
    """(ours, eager, ours' parameters, eager's parameters, x, grad_y) on CUDA: a narrow
    config's FusedMLP (fp16) and its nn.Sequential, each with its own weights; a wide
    one's block (bf16) and fused_mlp or GatedMLP on the block's own weights."""
    if config in narrow:
        cfg, dt = configs.CONFIGS[config], torch.float16
        ours = cfg.make(device=dev, dtype=dt, backend="triton")
        seq = ours.to_sequential()
        params, eager_params = list(ours.parameters()), list(seq.parameters())
        d_in, d_out = cfg.in_features, cfg.out_features
    else:
        dims, dt = CONFIGS[config], torch.bfloat16
        seq = eager_model(config, dims, dev, dt)
        d_in = d_out = dims[0]
        if dims[3]:  # gated: the GatedMLP sharing the Llama block's weights
            ours = fm.GatedMLP.from_module(seq, backend="triton")
            params = [seq.gate_proj.weight, seq.up_proj.weight, seq.down_proj.weight]
        else:
            ws, bs = [seq[0].weight, seq[2].weight], [seq[0].bias, seq[2].bias]
            params = [*ws, *bs]

            def ours(xx):
                return fm.fused_mlp(xx, ws, bs, "gelu_tanh", backend="triton")
        eager_params = params
    x = torch.randn(rows, d_in, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn(rows, d_out, device=dev, dtype=dt)
    return ours, seq, params, eager_params, x, gy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    narrow = [n for n, c in configs.CONFIGS.items() if c.regime == "narrow"]
    ap.add_argument("--config", choices=list(CONFIGS) + narrow, default="wide-gelu")
    ap.add_argument("--rows", type=int, default=16)
    a = ap.parse_args()
    ours, seq, params, eager_params, x, gy = models(a.config, a.rows, narrow)

    def step():
        y = ours(x)
        torch.autograd.grad(y, [x, *params], gy)

    def eager_step():
        y = seq(x)
        torch.autograd.grad(y, [x, *eager_params], gy)

    def forward_only():
        ours(x)

    def eager_forward_only():
        seq(x)

    us = interleaved({"ours": step, "eager": eager_step, "ours forward": forward_only,
                      "eager forward": eager_forward_only}, n=1400)
    torch.autograd.set_multithreading_enabled(False)
    us.update(interleaved({"ours one thread": step, "eager one thread": eager_step}, n=1400))
    torch.autograd.set_multithreading_enabled(True)
    for k, v in us.items():
        print(f"host a step (interleaved, median of 7): {k:<18} {v:7.1f} us")
    for name, fn in (("ours", step), ("eager", eager_step)):
        d_us, host, sleep = device_per_step(fn)
        print(f"device a step: {name:<6} {d_us:7.1f} us (enqueue of the steps {host:.0f} us "
              f"inside a {sleep:.0f} us sleep: {'ok' if host < sleep else 'NOT hidden'})")

    for _ in range(50):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    whole = (time.perf_counter() - t) / a.steps * 1e6
    torch.cuda.synchronize()
    launch._direct = timed("launch", launch._direct, where=True)
    torch.mm = timed("torch.mm", torch.mm, where=True)
    torch.sum = timed("torch.sum", torch.sum, where=True)
    memory.new_empty = timed("new_empty", memory.new_empty)
    for fn in (op._EagerMLP, gated._EagerGated):
        fn.forward = staticmethod(timed("op forward", fn.forward))
        fn.backward = staticmethod(timed("op backward", fn.backward))
    torch.autograd.grad = timed("autograd.grad", torch.autograd.grad)
    print(f"step without the timers: {whole:.1f} us")
    for threads in (True, False):  # the backward on autograd's device thread, or not
        torch.autograd.set_multithreading_enabled(threads)
        for name, fn in (("ours", step), ("eager", eager_step)):
            tstep = timed("whole step", fn)
            for _ in range(20):
                tstep()
            torch.cuda.synchronize()
            SPENT.clear()
            CALLS.clear()
            for _ in range(a.steps):
                tstep()
            torch.cuda.synchronize()
            print(f"-- {name}, backward on {'the device' if threads else 'the calling'} thread")
            for k, v in sorted(SPENT.items(), key=lambda kv: -kv[1]):
                print(f"{v / a.steps * 1e6:9.1f} us a step  {CALLS[k] / a.steps:4.1f} calls  {k}")
    torch.autograd.set_multithreading_enabled(True)


def device_per_step(fn, k=40, sleep_cycles=200_000_000):
    """(device us a step, host us to enqueue the k steps, sleep us): the steps queued
    behind a sleep kernel, timed on the device from the sleep's end."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    e0.record()
    torch.cuda._sleep(sleep_cycles)
    e1.record()
    t = time.perf_counter()
    for _ in range(k):
        fn()
    host = (time.perf_counter() - t) * 1e6
    e2.record()
    torch.cuda.synchronize()
    return e1.elapsed_time(e2) * 1e3 / k, host, e0.elapsed_time(e1) * 1e3


if __name__ == "__main__":
    main()
