"""Probe: the wide forward GEMMs with TMA descriptors (persistent, wide._linear_fwd_tma_kernel
and wide._gated_fwd_tma_kernel) against the pointer kernels and cuBLAS, tile by tile.

Per shape (bf16, M 8192): cuBLAS without an epilogue ("bare"), eager torch, the pointer
kernels (FUSEDMLP_WIDE_TMA=0, autotuned), and the TMA kernels at several tiles (the
package's choice, wide._tma_config_nvidia, first). Every result is checked against torch
in fp32 before it is timed; a tile that does not fit is reported, not timed.

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
LINEAR_TILES = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
                (128, 128, 128, 8, 3)]
GATED_TILES = [(128, 128, 64, 8, 3), (256, 64, 64, 8, 3), (128, 64, 64, 4, 4),
               (64, 128, 64, 4, 4)]


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

    def variants(shape, flop, ref, call, tiles, dual):
        os.environ[wide.TMA_ENV] = "0"
        rec(shape, flop, ref, "pointer kernels (autotuned)", call)
        os.environ[wide.TMA_ENV] = "1"
        for t in [tuned(dual)] + [t for t in tiles if t != tuned(dual)]:
            wide._tma_config_nvidia = lambda dual, t=t: t
            rec(shape, flop, ref, "tma {}x{}x{} w{} st{}".format(*t), call)
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
        variants(shape, flop, ref, lambda: wide.linear(x, w, b, "gelu_tanh", False)[0],
                 LINEAR_TILES, False)
        del x, w, b, ref
    d, hdim = 4096, 14336
    x = torch.randn(args.m, d, device=dev, dtype=dt)
    wg, wu = (torch.randn(hdim, d, device=dev, dtype=dt) / d ** 0.5 for _ in range(2))
    wgu = torch.cat([wg, wu])
    gf, uf = x.float() @ wg.float().t(), x.float() @ wu.float().t()
    ref = F.silu(gf) * uf
    shape, flop = f"gated {args.m}x{hdim}x{d} silu", 4 * args.m * hdim * d
    rec(shape, flop, torch.cat([gf, uf], 1), "cuBLAS x@[Wg;Wu]^T (bare)", lambda: x @ wgu.t())
    rec(shape, flop, ref, "eager silu(x Wg^T) * x Wu^T",
        lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu))
    variants(shape, flop, ref, lambda: wide.gated_hidden(x, wg, wu, "silu", False)[0],
             GATED_TILES, True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(dev), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
