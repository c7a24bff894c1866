"""Probe: the Gluon recomputing backward (fusedmlp_xpu/backends/triton/gluon_backward.py)
against the Triton one-kernel backward (FUSEDMLP_GLUON_BACKWARD=0), same process, passes
in turn: the backward call alone (TritonBackend.backward, nothing saved) and FusedMLP's
train step (forward + backward). A net 64 -> hidden x hidden_layers -> 64, fp16, no
biases unless --bias (the narrow bench's narrow-w64; --hidden 32 its narrow-w32). The
first runs (NOTES.md, narrow history 33) also timed the Gluon kernel without warp
specialization ("gluon-step", commit 94a244d has it). Before timing, each variant's
gradients are compared with the Triton kernels' (both are checked against float64 by the
test suite).

    python benchmarks/probe_gluon_backward.py --out F.json [--rows 20 22] [--passes 2]
"""
from __future__ import annotations

import argparse
import json
import os

import torch
import triton

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import triton as tb
from fusedmlp_xpu.backends.triton import gluon_backward
from fusedmlp_xpu.bench import environment


def _use(variant):
    """"triton", "gluon" (the package's kernel and tuning) or "gluon-c<C>s<S>" (C chains,
    S x stages)."""
    os.environ["FUSEDMLP_GLUON_BACKWARD"] = "0" if variant == "triton" else "1"
    forced = variant[6:] if variant.startswith("gluon-c") else ""
    chains_stages = tuple(map(int, forced[1:].split("s"))) if forced else None
    gluon_backward.tuning = (_own_tuning if not forced else
                             (lambda spec, t=chains_stages: t))
    tb._gluon_backward_plan.cache_clear()


_own_tuning = gluon_backward.tuning


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, nargs="+", default=[20, 22])
    ap.add_argument("--hidden-layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64, help="hidden width")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--bias", action="store_true", help="a net with biases")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--variants", default="triton,gluon",
                    help="triton, gluon, gluon-c2s1, gluon-c3s1, ... (chains and x stages "
                         "forced)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = getattr(torch, args.dtype)
    torch.manual_seed(0)
    m = fm.FusedMLP(64, 64, args.hidden, args.hidden_layers, bias=args.bias, device=dev,
                    dtype=dt, backend="triton")
    spec = m.spec(dt)
    be = tb.TritonBackend()
    print(be.supports(spec, dev)[1], flush=True)
    rows = []
    for lg in args.rows:
        x = torch.randn(2 ** lg, 64, device=dev, dtype=dt)
        gy = torch.randn(2 ** lg, 64, device=dev, dtype=dt)
        ws = [w.detach() for w in m.weights()]
        bs = [b.detach() for b in m.biases()] if args.bias else None
        needs = (True, True, args.bias)
        variants = args.variants.split(",")
        _use("triton")
        gx, gws, gbs = be.backward(gy, x, ws, bs, None, spec, needs)
        want = [gx.double()] + [g.double() for g in gws + gbs]
        errs = {}
        for v in variants:
            _use(v)
            gx, gws, gbs = be.backward(gy, x, ws, bs, None, spec, needs)
            errs[v] = max(((a.double() - b).norm() / b.norm()).item()
                          for a, b in zip([gx] + gws + gbs, want))
            print(f"2^{lg} {v}: largest rel diff from the Triton kernels' gradients "
                  f"{errs[v]:.1e}", flush=True)
        xg = x.clone().requires_grad_()
        for p in range(args.passes):
            for v in variants:
                _use(v)
                bwd = triton.testing.do_bench(
                    lambda: be.backward(gy, x, ws, bs, None, spec, needs),
                    warmup=50, rep=300, return_mode="median")

                def step():
                    xg.grad = None
                    m(xg).backward(gy)

                st = triton.testing.do_bench(step, warmup=20, rep=300, return_mode="median")
                rows.append(dict(rows=x.shape[0], hidden=args.hidden, bias=args.bias, case=v,
                                 p=p, backward_ms=bwd, step_ms=st, max_rel_diff=errs[v]))
                print(f"2^{lg} pass {p} {v}: backward {bwd:.4f} ms, train step {st:.4f} ms",
                      flush=True)
    _use("gluon")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(dev), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
