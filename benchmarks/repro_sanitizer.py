"""One narrow forward, repeated on fresh data with NaN-poisoned outputs, each compared with
the float64 reference; says which rows and columns are wrong when one is. Meant to run
under compute-sanitizer (memcheck, racecheck, initcheck), where the fp32 (100, 128, 128, 3)
forward of the test suite gave wrong values without a sanitizer error.

Usage: PYTHONPATH=. python3 benchmarks/repro_sanitizer.py [--widths 100,128,128,3]
       [--dtype float32] [--rows 1037] [--repeats 5]
"""
import argparse

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import memory


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="100,128,128,3")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--act", default="tanh")
    p.add_argument("--rows", type=int, default=1037)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--tuning", help="BLOCK_M,warps of the one-program-per-block forward "
                                    "instead of the package's (e.g. 128,8: no spills at 128)")
    a = p.parse_args()
    if a.tuning:
        import importlib
        tb = importlib.import_module("fusedmlp_xpu.backends.triton")
        bm, w = (int(v) for v in a.tuning.split(","))
        tb._tuning_nvidia = lambda spec, mode, bm=bm, w=w: (bm, w)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: under TRITON_INTERPRET
    widths = tuple(int(w) for w in a.widths.split(","))
    dtype = getattr(torch, a.dtype)
    real = memory.new_empty

    def poisoned(*shape, like, dtype=None):
        t = real(*shape, like=like, dtype=dtype)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    memory.new_empty = poisoned
    bad = 0
    for r in range(a.repeats):
        ws = [((torch.rand(o, i, dtype=torch.float64) * 2 - 1) * i ** -0.5)
              for i, o in zip(widths[:-1], widths[1:])]
        bs = [((torch.rand(o, dtype=torch.float64) * 2 - 1) * i ** -0.5)
              for i, o in zip(widths[:-1], widths[1:])]
        x = torch.randn(a.rows, widths[0], dtype=torch.float64)
        h = x
        for k, (w, b) in enumerate(zip(ws, bs)):
            h = h @ w.T + b
            if k < len(ws) - 1:
                h = getattr(torch, a.act)(h)
        dev = [t.to(device, dtype) for t in (x, *ws, *bs)]
        xd, wd, bd = dev[0], dev[1:1 + len(ws)], dev[1 + len(ws):]
        y = fm.fused_mlp(xd, wd, bd, a.act, backend="triton")
        if device == "cuda":
            torch.cuda.synchronize()
        y64 = y.double().cpu()
        err = (y64 - h).norm().item() / h.norm().item()
        wrong = ((y64 - h).abs() > 1e-2 * (1 + h.abs())) | torch.isnan(y64)
        rows = wrong.any(1).nonzero().flatten().tolist()
        cols = wrong.any(0).nonzero().flatten().tolist()
        print(f"repeat {r}: rel error {err:.3e}, wrong rows {len(rows)} "
              f"{rows[:4]}..{rows[-4:]}, wrong cols {cols}, max |y| {y64.abs().max():.3g} "
              f"(ref {h.abs().max():.3g})", flush=True)
        bad += err > 1e-3
    print(f"{bad} of {a.repeats} wrong")


if __name__ == "__main__":
    main()
