"""Probe: the wide forward GEMM with TMA descriptors (persistent, wide._linear_fwd_tma_kernel)
against the pointer kernel and cuBLAS, tile by tile, for inference and for the training
forward (which also stores z).

Per shape (bf16, M 8192): cuBLAS without an epilogue ("bare"), eager torch, the pointer
kernel (FUSEDMLP_WIDE_TMA=0, autotuned), and the TMA kernel at several tiles (the
package's choice, wide._tma_config_nvidia, first; a tile whose shared memory the device
refuses runs with fewer stages, and the row says how many fitted). Every result is
checked against torch in fp32 before it is timed.

    PYTHONPATH=. python3 benchmarks/probe_tma_gemm.py --out probe.json
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton

from fusedmlp_xpu.backends.triton import wide
from fusedmlp_xpu.bench import environment

F = torch.nn.functional
TILES = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
         (128, 128, 128, 8, 3)]


def _time(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = getattr(torch, args.dtype)
    rows = []
    tuned = wide._tma_config_nvidia

    def rec(shape, flop, ref, name, fn):
        try:
            err = ((fn().float() - ref).abs().max() / ref.abs().max()).item()
            ms = _time(fn)
        except Exception as e:  # noqa: BLE001 -- out of resources: say so, go on
            print(f"[{shape}] {name}: {type(e).__name__} {str(e)[:100]}", flush=True)
            return
        ok = err < 2e-2
        print(f"[{shape}] {name:40s} {ms:.4f} ms {flop / ms / 1e9:6.0f} TFLOP/s "
              f"err {err:.1e}{'' if ok else ' WRONG'}", flush=True)
        rows.append(dict(shape=shape, m=args.m, variant=name, ms=ms, err=err, ok=ok,
                         tflops=flop / ms / 1e9))

    def variants(shape, flop, ref, call, save):
        tag = " +z" if save else ""
        os.environ[wide.TMA_ENV] = "0"
        rec(shape, flop, ref, "pointer kernel (autotuned)" + tag, call)
        os.environ[wide.TMA_ENV] = "1"
        for t in [tuned()] + [t for t in TILES if t != tuned()]:
            wide._tma_config_nvidia = lambda t=t: t
            wide._TMA_FIT.clear()
            name = "tma {}x{}x{} w{} st{}".format(*t) + tag
            rec(shape, flop, ref, name, call)
            if wide._TMA_FIT and rows[-1]["variant"] == name:
                rows[-1]["stages_that_fit"] = min(wide._TMA_FIT.values())
                print(f"    (ran with {min(wide._TMA_FIT.values())} stages)")
        wide._tma_config_nvidia = tuned

    torch.manual_seed(0)
    for n, k in ((16384, 4096), (4096, 16384)):
        x = torch.randn(args.m, k, device=dev, dtype=dt)
        w = torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5
        b = torch.randn(n, device=dev, dtype=dt)
        ref = F.gelu(x.float() @ w.float().t() + b.float(), approximate="tanh")
        shape, flop = f"linear {args.m}x{n}x{k} gelu_tanh", 2 * args.m * n * k
        rec(shape, flop, x.float() @ w.float().t(), "cuBLAS x@W^T (bare)",
            lambda: x @ w.t())
        rec(shape, flop, ref, "eager F.linear + gelu",
            lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
        for save in (False, True):
            variants(shape, flop, ref, lambda save=save: wide.linear(
                x, w, b, "gelu_tanh", save)[0], save)
        del x, w, b, ref
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(dev), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
