"""The wide dW kernel with its in-kernel bias gradient on, at a row count that leaves a
masked K tail: on the H200 (Triton 3.6) this gave dW 6% off for some tiles (see NOTES.md,
wide history 2); grad_weight now avoids that combination. This script launches the kernel
directly with DB on, one config at a time, to reproduce it (or show a Triton upgrade
fixed it). It ran in this form only under the CPU interpreter, where every config is right.

Usage: PYTHONPATH=. python benchmarks/repro_dw_db.py [--rows 1000] [--device cuda]
"""
import argparse
import os

import torch

os.environ.setdefault("FUSEDMLP_WIDE_AUTOTUNE", "0")
from fusedmlp_xpu.backends.triton import wide  # noqa: E402


def dw_error(rows, cfg, device, dtype, db_on):
    base = wide._configs_nvidia if device.type == "cuda" else wide._configs_interpreter
    wide._configs_nvidia = wide._configs_interpreter = lambda dual: [wide._cfg(*cfg)]
    wide._tuned.clear()
    try:
        torch.manual_seed(0)
        g = torch.randn(rows, 512, device=device).to(dtype)
        h = torch.randn(rows, 2048, device=device).to(dtype)
        dw = torch.empty(512, 2048, device=device, dtype=dtype)
        db = torch.empty(512, device=device, dtype=dtype)
        wide._kernel("dw", device)[wide._grid(512, 2048)](
            g, h, g, dw, db, 512, 2048, rows, wide._bucket(512),
            g.stride(1), g.stride(0), h.stride(1), h.stride(0), g.stride(1), g.stride(0),
            dw.stride(0), dw.stride(1), G_ACT=0, DB=db_on, **wide._meta(g))
        ref = g.double().T @ h.double()
        return ((dw.double() - ref).norm() / ref.norm()).item()
    finally:
        wide._configs_nvidia = wide._configs_interpreter = base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cfgs = [(16, 16, 16, 1, 1)] if dev.type == "cpu" else \
        [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (64, 64, 64, 4, 3), (128, 256, 64, 8, 4)]
    for cfg in cfgs:
        for db_on in (False, True):
            e = dw_error(args.rows, cfg, dev, torch.bfloat16, db_on)
            print(f"rows {args.rows} tile {cfg} DB={db_on}: dW relative error {e:.1e}"
                  + ("  <-- wrong" if e > 1e-2 else ""), flush=True)


if __name__ == "__main__":
    main()
