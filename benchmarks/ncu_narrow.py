"""The narrow kernels of the bench configs once each, inside NVTX ranges, for Nsight Compute:
the inference forward of narrow-w32 and narrow-w64 (--nets) on each of --backends (triton;
cuda: the CUDA C++ forward), and the train step's backward of each net on triton (the one
kernel, recomputing z, then the reduction; not with --forward-only). Every
kernel is compiled and run before the ranges; 2^22 rows, fp16, as the bench. The backward
runs on the calling thread (autograd's device threads off): NVTX ranges are per thread.

    ncu --clock-control none --nvtx --nvtx-include "measure/" --section SpeedOfLight ... \\
        python3 benchmarks/ncu_narrow.py
"""
import argparse

import torch

from fusedmlp_xpu.bench import configs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2 ** 22)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test (TRITON_INTERPRET=1)")
    ap.add_argument("--nets", nargs="+", default=["narrow-w32", "narrow-w64"])
    ap.add_argument("--backends", nargs="+", default=["triton"],
                    help="cuda: its inference forward beside triton's (training is triton's)")
    ap.add_argument("--forward-only", action="store_true")
    args = ap.parse_args()
    dev, dt, rows = torch.device(args.device), torch.float16, args.rows
    gpu = dev.type == "cuda"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    nvtx = torch.cuda.nvtx if gpu else None
    torch.manual_seed(0)
    cases = {}
    for name in args.nets:
        for backend in args.backends:
            m = configs.CONFIGS[name].make(device=dev, dtype=dt, backend=backend)
            x = torch.randn(rows, m.in_features, device=dev, dtype=dt)

            def fwd(m=m, x=x):
                with torch.no_grad():
                    m(x)
            cases[f"fwd_{name}_{backend}"] = (fwd, False)
        if args.forward_only:
            continue
        m = configs.CONFIGS[name].make(device=dev, dtype=dt, backend="triton")
        x = torch.randn(rows, m.in_features, device=dev, dtype=dt)
        xg = x.clone().requires_grad_()
        gy = torch.randn(rows, m.out_features, device=dev, dtype=dt)

        def train(m=m, xg=xg, gy=gy):  # returns the backward to time
            xg.grad = None
            y = m(xg)
            return lambda: y.backward(gy)

        cases[f"bwd_{name}"] = (train, True)
    for fn, two_part in cases.values():  # compile, warm up
        for _ in range(3):
            out = fn()
            if two_part:
                out()
    sync()
    for name, (fn, two_part) in cases.items():
        bwd = fn() if two_part else None
        sync()
        if nvtx:
            nvtx.range_push("measure")
            nvtx.range_push(name)
        if two_part:
            bwd()
        else:
            fn()
        if nvtx:
            nvtx.range_pop()
            nvtx.range_pop()
        sync()


if __name__ == "__main__":
    with torch.autograd.set_multithreading_enabled(False):
        main()
