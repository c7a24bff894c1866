"""Host time of the Gluon narrow forward against the Triton kernel's (FUSEDMLP_GLUON=0):
back-to-back calls timed on the wall clock (one sync at the end), no-grad and train
steps, then a cProfile of the Gluon calls.

    python benchmarks/probe_gluon_host.py [--rows 16 18]
"""
import argparse
import os
import time

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import triton as tb
from fusedmlp_xpu.bench import profile_text


def per_call_us(fn, n=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 18])
    args = ap.parse_args()
    dev = torch.device("cuda")
    m = fm.FusedMLP(64, 64, 64, 4, bias=False, device=dev, dtype=torch.float16,
                    backend="triton")
    for lg in args.rows:
        x = torch.randn(2 ** lg, 64, device=dev, dtype=torch.float16)
        xg = x.clone().requires_grad_()
        gy = torch.randn_like(x)

        def inf():
            with torch.no_grad():
                m(x)

        def train():
            m(xg).backward(gy)

        for env in ("0", "1"):
            os.environ["FUSEDMLP_GLUON"] = env
            tb._gluon_plan.cache_clear()
            tb._forward_plan.cache_clear()
            m._bound = None
            print(f"2^{lg} FUSEDMLP_GLUON={env}: inference {per_call_us(inf):.1f} us, "
                  f"train step {per_call_us(train, 50):.1f} us", flush=True)
        for name, fn in (("inference", inf), ("train", train)):
            print(f"--- cProfile 2^{lg} {name}, 50 calls")
            print(profile_text(fn, 50, torch.device("cuda"), top=14))


if __name__ == "__main__":
    main()
