"""One narrow train step through the split backward, with each width padded on its own in
the input-gradient chain, in the weight-gradient kernel, in both or in neither: every
gradient against the float64 reference (autograd on the CPU). Says which kernel goes
wrong with which padding (the GPU compile, not the interpreter, is in question), one
configuration per process (an illegal address poisons the process).

Usage: PYTHONPATH=. python3 benchmarks/repro_padding.py --widths 17,33,33,33,9
       --chain unrolled|loop|resident|one-kernel --own chain|dw|both|none [--rows 1037]
       [--programs 3] [--stages 2]

--chain one-kernel: the resident chain summing the weight gradients itself (Split.g_dw;
its tiles always padded on their own); --programs caps the persistent grid, so each
program walks several row blocks; --stages: the chain's pipeline stages.
"""
import argparse

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import triton as tb


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="17,33,33,33,9")
    p.add_argument("--chain", default="unrolled",
                   choices=("unrolled", "loop", "resident", "one-kernel"))
    p.add_argument("--programs", type=int, default=0, help="cap on persistent programs")
    p.add_argument("--stages", type=int, default=2, help="the chain's pipeline stages")
    p.add_argument("--own", default="both", choices=("chain", "dw", "both", "none"))
    p.add_argument("--rows", type=int, default=1037)
    p.add_argument("--dw", default="64,4,2", help="BLOCK_M,warps,stages of the dW kernel")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: under TRITON_INTERPRET
    widths = tuple(int(w) for w in a.widths.split(","))
    bm, warps, stages = (int(v) for v in a.dw.split(","))
    split = tb.Split(bm, warps, stages, g_block_m=64, g_warps=4, g_per_sm=1,
                     g_unroll=a.chain != "loop", g_stages=a.stages,
                     g_resident=a.chain in ("resident", "one-kernel"),
                     g_dw=a.chain == "one-kernel")
    tb._split_backward = lambda d, spec: split
    if a.programs:
        n_programs = tb._n_programs
        tb._n_programs = lambda d, n, per_sm=1: min(a.programs, n_programs(d, n, per_sm))
    # OWN_PADDING is read where each kernel's launch is built: the chain in backward(),
    # the weight gradients in _split_weight_grads; the package pads a chain that loads
    # its weights per row block at the widest unless told
    tb.OWN_PADDING = a.own in ("chain", "both")
    tb.OWN_PADDING_CHAIN_PER_BLOCK = True
    dw = tb._split_weight_grads

    def dw_padded(*args, **kwargs):
        keep = tb.OWN_PADDING
        tb.OWN_PADDING = a.own in ("dw", "both")
        try:
            return dw(*args, **kwargs)
        finally:
            tb.OWN_PADDING = keep

    tb._split_weight_grads = dw_padded
    torch.manual_seed(0)
    ws = [((torch.rand(o, i, dtype=torch.float64) * 2 - 1) * i ** -0.5)
          for i, o in zip(widths[:-1], widths[1:])]
    bs = [((torch.rand(o, dtype=torch.float64) * 2 - 1) * i ** -0.5)
          for i, o in zip(widths[:-1], widths[1:])]
    x = torch.randn(a.rows, widths[0], dtype=torch.float64)
    gy = torch.randn(a.rows, widths[-1], dtype=torch.float64)
    ref = [t.clone().requires_grad_() for t in (x, *ws, *bs)]
    h = ref[0]
    for k in range(len(ws)):
        h = torch.nn.functional.linear(h, ref[1 + k], ref[1 + len(ws) + k])
        if k < len(ws) - 1:
            h = torch.nn.functional.gelu(h)
    h.backward(gy)
    dev = [t.to(device, torch.float16).requires_grad_() for t in (x, *ws, *bs)]
    y = fm.fused_mlp(dev[0], dev[1:1 + len(ws)], dev[1 + len(ws):], "gelu", backend="triton")
    y.backward(gy.to(device, torch.float16))
    if device == "cuda":
        torch.cuda.synchronize()
    names = ["x"] + [f"w{k}" for k in range(len(ws))] + [f"b{k}" for k in range(len(bs))]
    errs = {n: ((d.grad.double().cpu() - r.grad).norm() / r.grad.norm()).item()
            for n, d, r in zip(names, dev, ref)}
    bad = [n for n, e in errs.items() if not e < 2e-2]
    print(f"widths {a.widths} chain {a.chain} own {a.own} dw {a.dw} programs "
          f"{a.programs or 'all'} stages {a.stages}: "
          + ("ok" if not bad else "WRONG " + ", ".join(f"{n} {errs[n]:.2e}" for n in bad)))


if __name__ == "__main__":
    main()
