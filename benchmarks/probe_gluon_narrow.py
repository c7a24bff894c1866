"""Probe: the Gluon narrow inference forward (fusedmlp_xpu/backends/triton/gluon_narrow.py)
at other tunings than the package's, against the Triton kernel (FUSEDMLP_GLUON=0), same
process, passes in turn: each variant is (rows per block, x-pair stages, programs per
SM, warps), forced through ``gluon_narrow.tuning``. A net W -> W x hidden_layers -> W, fp16, no
biases (the narrow bench's shape at W 64). Checked against float64 before timing.

The first run (NOTES.md, narrow history 32; `h200-probe-gluon-narrow-20261201.txt`) timed
this script's own copy of the kernel for square nets, before it moved into the package
(commit a4f9d2a has it).

    python benchmarks/probe_gluon_narrow.py --out F.json [--rows 20 22] [--width 64 128]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import triton as tb
from fusedmlp_xpu.backends.triton import gluon_narrow
from fusedmlp_xpu.bench import environment


def _use(variant, m=None):
    """Make the next plans (and ``m``'s next binding) take ``variant``: "triton",
    "package" or (bm, stages, per_sm, warps)."""
    os.environ["FUSEDMLP_GLUON"] = "0" if variant == "triton" else "1"
    gluon_narrow.tuning = (_own_tuning if variant in ("triton", "package")
                           else (lambda spec, v=variant: v))
    tb._gluon_plan.cache_clear()
    tb._forward_plan.cache_clear()
    if m is not None:
        m._bound = None


_own_tuning = gluon_narrow.tuning


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, nargs="+", default=[20, 22])
    ap.add_argument("--width", type=int, nargs="+", default=[64])
    ap.add_argument("--hidden-layers", type=int, default=4)
    ap.add_argument("--variants", default="64,2,2,4;64,1,3,4;128,1,2,8;128,2,1,8",
                    help="bm,stages,per_sm,warps;...")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    variants = ["triton", "package"] + [tuple(int(t) for t in v.split(","))
                                        for v in args.variants.split(";")]
    for W in args.width:
        torch.manual_seed(0)
        m = fm.FusedMLP(W, W, W, args.hidden_layers, bias=False, device=dev,
                        dtype=torch.float16, backend="triton")
        for lg in args.rows:
            x = torch.randn(2 ** lg, W, device=dev, dtype=torch.float16)
            xt = x[: 2 ** lg - 37]  # rows that are no multiple of a pair of blocks
            with torch.no_grad():
                ref = m.to_sequential().double()(xt[:300000].double())
                m.to(torch.float16)
            ok = []
            for v in variants:
                _use(v, m)
                try:
                    with torch.no_grad():
                        err = ((m(xt)[:300000].double() - ref).norm() / ref.norm()).item()
                except Exception as e:  # out of resources, compile errors
                    print(f"W{W} 2^{lg} {v}: {type(e).__name__} {str(e)[:300]}", flush=True)
                    continue
                print(f"W{W} 2^{lg} {v}: rel err {err:.2e} {'ok' if err < 5e-3 else 'WRONG'}",
                      flush=True)
                if err < 5e-3:
                    ok.append(v)
            floor_ms = 2 * x.numel() * 2 / 4.16e12 * 1e3  # x and y at a 4.16 TB/s copy
            for p in range(args.passes):
                for v in ok:
                    _use(v, m)

                    def fn():
                        with torch.no_grad():
                            m(x)

                    ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
                    rows.append(dict(width=W, rows=x.shape[0], case=str(v), p=p, ms=ms,
                                     copy_floor_x=ms / floor_ms))
                    print(f"W{W} 2^{lg} pass {p} {v}: {ms:.4f} ms "
                          f"({ms / floor_ms:.2f}x copy floor)", flush=True)
    _use("package")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(dev), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
