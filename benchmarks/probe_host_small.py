"""Host time of one wide-gelu train step at decode-sized rows (bf16, 4096 -> 16384 ->
4096, bias): the package's automatic call (torch ops with torch's autograd at these
rows), the same three torch ops written inline, and the eager nn.Sequential; forward
alone and the whole step, the variants interleaved over several rounds, then a cProfile
of the package's step. Each step's device work queues behind the previous; a round ends
with a synchronize, so a round's mean per step is max(host, device) time.

    PYTHONPATH=. python3 benchmarks/probe_host_small.py --out host-small.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu.bench import environment


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(args.d, args.hidden), nn.GELU(approximate="tanh"),
                          nn.Linear(args.hidden, args.d)).to(dev, dt)
    ps = list(eager.parameters())
    W, B = [eager[0].weight, eager[2].weight], [eager[0].bias, eager[2].bias]
    x = torch.randn(args.rows, args.d, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn(args.rows, args.d, device=dev, dtype=dt)

    def ours():
        return fm.fused_mlp(x, W, B, "gelu_tanh")

    def inline():
        return F.linear(F.gelu(F.linear(x, W[0], B[0]), approximate="tanh"), W[1], B[1])

    fwds = {"ours": ours, "inline": inline, "eager": lambda: eager(x)}
    fns = {}
    for k, f in fwds.items():
        fns[k + "_fwd"] = f
        fns[k + "_step"] = (lambda f=f: torch.autograd.grad(f(), [x, *ps], gy))

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for f in fns.values():
        for _ in range(20):
            f()
    sync()
    res = {k: [] for k in fns}
    for r in range(args.rounds):
        for k in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            t = time.perf_counter()
            for _ in range(args.steps):
                fns[k]()
            sync()
            res[k].append((time.perf_counter() - t) / args.steps * 1e6)
    summary = {k: {"median_us": statistics.median(v), "min_us": min(v), "all_us": v}
               for k, v in res.items()}
    for k, v in summary.items():
        print(f"{k:12s} median {v['median_us']:8.1f} us  min {v['min_us']:8.1f}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        fns["ours_step"]()
    sync()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    print(s.getvalue())
    with open(args.out, "w") as f:
        json.dump({"env": environment(dev), "args": vars(args), "times": summary,
                   "cprofile_ours_step": s.getvalue()}, f, indent=1)


if __name__ == "__main__":
    main()
