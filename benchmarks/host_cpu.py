"""Host time of the Python path on a CPU-only machine, every kernel launch a no-op.

The GPU machine is scarce; the host work in front of a launch (argument checks, plans,
keys, allocations) is plain Python and can be measured anywhere. This runs the Triton
backend's code on CPU tensors with the lean launch path switched on and the compiled
kernel's launcher replaced by a no-op, so nothing is computed: outputs are garbage, only
the time means anything. Numbers are this CPU's, not the H200 host's (that one was ~2x
slower on the same calls); compare before/after on one machine.

Usage: PYTHONPATH=. python benchmarks/host_cpu.py [--profile]
"""
import argparse
import inspect
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")  # the first launch of each shape runs once

import torch  # noqa: E402

import fusedmlp_xpu as fm  # noqa: E402
from fusedmlp_xpu.backends import triton as tb  # noqa: E402
from fusedmlp_xpu.backends.triton import launch  # noqa: E402


def stub_launches():
    """The lean path on for CPU tensors, its launches recorded as done, nothing run."""
    launch.enabled = lambda device: True
    launch._direct = lambda entry, grid, args, device_index: None
    launch._entry = lambda ck, names, values: ("run", "function", "metadata", ())
    torch.cuda.current_device = lambda: None  # a CPU device's index

    def prepare(self):  # the interpreter's kernels carry no Triton parameter list
        fn = getattr(self.fn, "fn", self.fn)
        self._names, self._arg_names = (), list(inspect.signature(fn).parameters)
        if hasattr(self, "tune"):
            self._tune = tuple(self._arg_names.index(n) for n in self.tune
                               if n in self._arg_names)
    launch.Launcher._prepare = prepare
    launch.TunedLauncher._prepare = prepare


def per_call_us(fn, n=5000, rounds=5):
    for _ in range(200):
        fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n // rounds):
            fn()
        times.append((time.perf_counter() - t) / (n // rounds) * 1e6)
    return sorted(times)[rounds // 2]


def cases():
    dt = torch.float16
    narrow = fm.FusedMLP(64, 64, 64, 4, bias=False, dtype=dt, backend="triton")
    x1 = torch.randn(1, 64, dtype=dt)
    l1, l2 = torch.nn.Linear(64, 256).to(dt), torch.nn.Linear(256, 64).to(dt)
    ws, bs = [l1.weight, l2.weight], [l1.bias, l2.bias]
    x16 = torch.randn(16, 64, dtype=dt)
    gated = fm.GatedMLP(64, 256, dtype=dt, backend="triton")
    xg = x16.clone().requires_grad_()
    gy = torch.randn(16, 64, dtype=dt)

    def wide():
        return fm.fused_mlp(x16, ws, bs, "gelu_tanh", backend="triton")

    def wide_train():
        y = fm.fused_mlp(xg, ws, bs, "gelu_tanh", backend="triton")
        torch.autograd.grad(y, [xg, *ws, *bs], gy)

    # the narrow train step as on the H200 (CUDA's split backward for CPU tensors too):
    # the backward in one kernel, z recomputed
    tb._split_backward = lambda device, spec: tb._split_cached(spec, tb.ONE_KERNEL_BACKWARD)
    narrow_t = fm.FusedMLP(64, 64, 32, 4, bias=False, dtype=dt, backend="triton")
    xt = x16.clone().requires_grad_()

    def narrow_train():
        xt.grad = None
        narrow_t(xt).backward(gy)

    # (what, call, grad enabled)
    return [("narrow FusedMLP(64, 64, 64, 4), 1 row, no grad", lambda: narrow(x1), False),
            ("narrow FusedMLP(64, 64, 32, 4), 16 rows, train step", narrow_train, True),
            ("wide fused_mlp 64 -> 256 -> 64, 16 rows, no grad", wide, False),
            ("GatedMLP(64, 256), 16 rows, no grad", lambda: gated(x16), False),
            ("wide fused_mlp, 16 rows, train step", wide_train, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", action="store_true", help="cProfile each case")
    args = ap.parse_args()
    stub_launches()
    for name, fn, grad in cases():
        with torch.set_grad_enabled(grad):
            print(f"{name:<52} {per_call_us(fn):8.1f} us")
            if args.profile:
                import cProfile
                import pstats
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(2000):
                    fn()
                pr.disable()
                pstats.Stats(pr).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
