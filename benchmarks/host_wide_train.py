"""Where the host time of the wide-gelu train step at 16 rows goes (GPU machine): the
step's Python parts timed with perf_counter around each (launches by caller, torch.mm,
sums, allocations, the op's forward and backward), per step, next to the whole step.

Usage: PYTHONPATH=. python benchmarks/host_wide_train.py [--steps 300]
"""
import argparse
import collections
import sys
import time

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import op
from fusedmlp_xpu.backends import memory
from fusedmlp_xpu.backends.triton import launch

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    a = ap.parse_args()
    dt, dev = torch.bfloat16, "cuda"
    seq = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU("tanh"),
                              torch.nn.Linear(16384, 4096)).to(dev, dt)
    ws, bs = [seq[0].weight, seq[2].weight], [seq[0].bias, seq[2].bias]
    x = torch.randn(16, 4096, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn(16, 4096, device=dev, dtype=dt)

    def step():
        y = fm.fused_mlp(x, ws, bs, "gelu_tanh", backend="triton")
        torch.autograd.grad(y, [x, *ws, *bs], gy)

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
    op._EagerMLP.forward = staticmethod(timed("op forward", op._EagerMLP.forward))
    op._EagerMLP.backward = staticmethod(timed("op backward", op._EagerMLP.backward))
    tstep = timed("whole step", step)
    for _ in range(20):
        tstep()
    SPENT.clear()
    CALLS.clear()
    torch.cuda.synchronize()
    for _ in range(a.steps):
        tstep()
    torch.cuda.synchronize()
    print(f"step without the timers: {whole:.1f} us")
    for k, v in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        print(f"{v / a.steps * 1e6:9.1f} us a step  {CALLS[k] / a.steps:4.1f} calls  {k}")


if __name__ == "__main__":
    main()
