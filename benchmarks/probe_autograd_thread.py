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


class PyNode(torch.autograd.Function):
    """y = x; backward: OPS small ops from Python (six: a wide train step's count), then
    BUSY iterations of a pure-Python loop (no ops, no GIL release). Set both before a
    call."""

    OPS = 0
    BUSY = 0

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        for _ in range(PyNode.OPS):
            g = g * 1.0
        n = 0
        for i in range(PyNode.BUSY):
            n += i
        return g


def _py_node(x, ops, busy):
    PyNode.OPS, PyNode.BUSY = ops, busy
    return PyNode.apply(x)


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

    # a loop of ~100 us on the calling thread
    t, iters = time.perf_counter(), 1000
    for _ in range(100):
        n = 0
        for i in range(iters):
            n += i
    busy = int(iters * 100e-6 / ((time.perf_counter() - t) / 100))

    def py_one():
        torch.autograd.grad(_py_node(x, 0, 0) * 1.0, [x], gy)

    def py_six():
        torch.autograd.grad(_py_node(x, 6, 0) * 1.0, [x], gy)

    def py_busy():
        torch.autograd.grad(_py_node(x, 0, busy) * 1.0, [x], gy)

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
