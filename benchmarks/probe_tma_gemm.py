"""Probe: the wide forward GEMM with TMA descriptors (persistent, wide._linear_fwd_tma_kernel)
against the pointer kernel and cuBLAS, tile by tile, for inference and for the training
forward (which also stores z); then the backward GEMMs against cuBLAS.

Per shape (bf16, M 8192): cuBLAS without an epilogue ("bare"), eager torch, the pointer
kernel (FUSEDMLP_WIDE_TMA=0, autotuned), and the TMA kernel at several tiles (the
package's choice, wide._tma_config_nvidia, first; a tile whose shared memory the device
refuses runs with fewer stages, and the row says how many fitted). The package's tile
is also timed with its stream-K tail off (FUSEDMLP_WIDE_STREAM_K=0), twice in turn;
--quick times only that. Every result is checked against torch in fp32 before it is
timed.

    PYTHONPATH=. python3 benchmarks/probe_tma_gemm.py --out probe.json
"""
from __future__ import annotations

import argparse
import os

import torch

from fusedmlp_xpu.backends.triton import wide
from probe_common import Probe

F = torch.nn.functional
TILES = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
         (128, 128, 128, 8, 3)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--m", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--part", choices=["all", "forward", "backward"], default="all")
    ap.add_argument("--quick", action="store_true",
                    help="forward: the package's tile only, stream-K on and off")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = getattr(torch, args.dtype)
    probe = Probe(m=args.m)
    tuned = wide._tma_config_nvidia

    def rec(shape, flop, ref, name, fn):
        probe.rec(name, fn, ref, flop, case=shape, width=40)

    def variants(shape, flop, ref, call, save):
        tag = " +z" if save else ""
        mine = tuned("fwd_z" if save else "fwd")
        # the package's tile with and without its stream-K tail, twice in turn
        for rep in (1, 2):
            for sk in ("1", "0"):
                os.environ[wide.STREAM_K_ENV] = sk
                rec(shape, flop, ref, "tma {}x{}x{} w{} st{}".format(*mine) + tag
                    + (" stream-K" if sk == "1" else " no stream-K") + f" #{rep}", call)
        os.environ[wide.STREAM_K_ENV] = "1"
        if args.quick:
            return
        os.environ[wide.TMA_ENV] = "0"
        rec(shape, flop, ref, "pointer kernel (autotuned)" + tag, call)
        os.environ[wide.TMA_ENV] = "1"
        for t in [mine] + [t for t in TILES if t != mine]:
            wide._tma_config_nvidia = lambda kind, t=t: t
            wide._linear_plan.cache_clear()  # the plans read the tiles when made
            wide._TMA_FIT.clear()
            name = "tma {}x{}x{} w{} st{}".format(*t) + tag
            rec(shape, flop, ref, name, call)
            probe.note_fit(name)
        wide._tma_config_nvidia = tuned
        wide._linear_plan.cache_clear()

    torch.manual_seed(0)
    for n, k in ((16384, 4096), (4096, 16384)) if args.part != "backward" else ():
        x = torch.randn(args.m, k, device=dev, dtype=dt)
        w = torch.randn(n, k, device=dev, dtype=dt) / k ** 0.5
        b = torch.randn(n, device=dev, dtype=dt)
        ref = F.gelu(x.float() @ w.float().t() + b.float(), approximate="tanh")
        shape, flop = f"linear {args.m}x{n}x{k} gelu_tanh", 2 * args.m * n * k
        rec(shape, flop, x.float() @ w.float().t(), "cuBLAS x@W^T (bare)",
            lambda x=x, w=w: x @ w.t())
        rec(shape, flop, ref, "eager F.linear + gelu",
            lambda x=x, w=w, b=b: F.gelu(F.linear(x, w, b), approximate="tanh"))
        for save in (False, True):
            variants(shape, flop, ref, lambda x=x, w=w, b=b, save=save: wide.linear(
                x, w, b, "gelu_tanh", save)[0], save)
    # the backward GEMMs of wide-gelu (4096 -> 16384 -> 4096), pointer kernels (TMA ones
    # were slower here: h200-probe-tma-gemm-20261130c.json), dW with and without the bias
    # gradient (one row reduction beside the GEMM)
    if args.part != "forward":
        d, hid = 4096, 16384
        g2 = torch.randn(args.m, d, device=dev, dtype=dt)
        w2 = torch.randn(d, hid, device=dev, dtype=dt) / hid ** 0.5
        w1 = torch.randn(hid, d, device=dev, dtype=dt) / d ** 0.5
        z1 = torch.randn(args.m, hid, device=dev, dtype=dt)
        g1 = torch.randn(args.m, hid, device=dev, dtype=dt)
        x = torch.randn(args.m, d, device=dev, dtype=dt)
        h1f = F.gelu(z1.float(), approximate="tanh")
        h1 = h1f.to(dt)
        dgelu = torch.autograd.functional.jvp(lambda t: F.gelu(t, approximate="tanh"), z1.float(),
                                              torch.ones_like(z1, dtype=torch.float32))[1]
        cases = [
            ("dx hidden (g2 W2) * gelu'(z1), h stored", g2.float() @ w2.float() * dgelu,
             lambda: g2 @ w2, [("", lambda: wide.grad_input(g2, w2, z1, "gelu_tanh", store_h=True)[0])]),
            ("dW2 = g2^T h1", g2.float().t() @ h1f, lambda: g2.t() @ h1,
             [("", lambda: wide.grad_weight(g2, h1)[0]),
              (" + db", lambda: wide.grad_weight(g2, h1, bias_grad=True)[0])]),
            ("dx input g1 W1", g1.float() @ w1.float(), lambda: g1 @ w1,
             [("", lambda: wide.grad_input(g1, w1)[0])]),
            ("dW1 = g1^T x", g1.float().t() @ x.float(), lambda: g1.t() @ x,
             [("", lambda: wide.grad_weight(g1, x)[0]),
              (" + db", lambda: wide.grad_weight(g1, x, bias_grad=True)[0])]),
        ]
        for name, ref, bare, calls in cases:
            shape, flop = f"{name} M {args.m}", 2 * args.m * d * hid
            rec(shape, flop, ref, "cuBLAS (bare, no epilogue)", bare)
            for tag, call in calls:
                rec(shape, flop, ref, "pointer kernel (autotuned)" + tag, call)
    probe.write(args.out, dev)


if __name__ == "__main__":
    main()
