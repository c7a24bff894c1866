"""What a Python autograd node costs on the autograd engine's device thread (GPU machine).

A train step's backward on CUDA tensors runs on the engine's device thread; a Python
node (torch.autograd.Function) there takes the GIL and runs Python on that thread. This
times small backward graphs of C++ nodes against Python nodes doing the same ops, with
the engine's device threads on (the default) and off (set_multithreading_enabled(False):
backward on the calling thread), interleaved (overhead.interleaved). A Python node
running ~100 us of pure Python (timed on the calling thread) shows whether Python itself
runs slower on the device thread.

Usage: PYTHONPATH=. python benchmarks/probe_autograd_thread.py
"""
import time

import torch

from overhead import interleaved  # benchmarks/, this script's folder


class PyIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


class PySixOps(torch.autograd.Function):
    """y = x; backward: six small ops from Python (the count of a wide train step's)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        for _ in range(5):
            g = g * 1.0
        return g * 1.0


class PyBusy(torch.autograd.Function):
    """y = x; backward: BUSY iterations of a pure-Python loop (no ops, no GIL release)."""

    BUSY = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        n = 0
        for i in range(PyBusy.BUSY):
            n += i
        return g


def main():
    x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn_like(x)

    def cpp_one():
        torch.autograd.grad(x * 1.0, [x], gy)

    def cpp_six():
        y = x
        for _ in range(6):
            y = y * 1.0
        torch.autograd.grad(y, [x], gy)

    def py_one():
        torch.autograd.grad(PyIdentity.apply(x) * 1.0, [x], gy)

    def py_six():
        torch.autograd.grad(PySixOps.apply(x) * 1.0, [x], gy)

    def py_busy():
        torch.autograd.grad(PyBusy.apply(x) * 1.0, [x], gy)

    # a loop of ~100 us on the calling thread
    PyBusy.BUSY = 1000
    t = time.perf_counter()
    for _ in range(100):
        n = 0
        for i in range(PyBusy.BUSY):
            n += i
    PyBusy.BUSY = int(PyBusy.BUSY * 100e-6 / ((time.perf_counter() - t) / 100))
    fns = {"C++ node": cpp_one, "Python node": py_one, "6 C++ nodes": cpp_six,
           "Python node, 6 ops": py_six, "Python node, ~100 us loop": py_busy}
    for threads in (True, False):
        torch.autograd.set_multithreading_enabled(threads)
        us = interleaved(fns, n=2100)
        for k, v in us.items():
            print(f"{'device thread' if threads else 'calling thread':<15} {k:<26} {v:7.1f} us")
    torch.autograd.set_multithreading_enabled(True)


if __name__ == "__main__":
    main()
