"""Host time of one wide train step at decode-sized rows (bf16): wide-gelu (4096 ->
16384 -> 4096, bias) or, with --gated, wide-swiglu's Llama block (4096 -> 14336, no
bias). Variants: the package's automatic call ("ours": torch's ops with torch's own
autograd graph at these rows), the package with those ops under one autograd node
("node", the candidate of probe_one_node.py, not taken: NOTES wide history 16), the same
torch ops written inline, and the eager modules; forward alone and the whole step, the variants interleaved over
several rounds, then a cProfile of the package's step. Each step's device work queues
behind the previous; a round ends with a synchronize, so a round's mean per step is
max(host, device) time.

    PYTHONPATH=. python3 benchmarks/probe_host_small.py --out host-small.json [--gated]
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

import probe_one_node
from fusedmlp_xpu import dispatch, gated
from fusedmlp_xpu.bench import environment
from fusedmlp_xpu.bench_wide import eager_model, ours_model


def _as_node(call):
    """call() with the package's few-row torch ops (the reference's forward for
    fused_mlp, _Reference.gated_forward for the gated MLP) swapped for the one-node
    candidate."""
    ref = dispatch.REGISTRY["reference"]

    def mlp(x, weights, biases, spec, save):
        return probe_one_node.mlp(x, weights, biases, spec), None

    def gated_forward(x, w_gate, w_up, w_down, activation, save, biases=None):
        return probe_one_node.gated(x, w_gate, w_up, w_down, biases, activation), []

    def run():
        real = gated._Reference.gated_forward
        ref.forward, gated._Reference.gated_forward = mlp, staticmethod(gated_forward)
        try:
            return call()
        finally:
            del ref.forward  # the class's method again
            gated._Reference.gated_forward = real
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--d", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gated", action="store_true",
                    help="wide-swiglu's block (hidden 14336 unless --hidden is given)")
    args = ap.parse_args()
    if args.gated and args.hidden == 16384:
        args.hidden = 14336
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(0)
    # the bench's own models: ours shares eager's parameters (bench_wide.ours_model)
    eager = eager_model(None, (args.d, args.hidden, not args.gated, args.gated), dev, dt)
    ours, _ = ours_model(eager, args.gated, dev, [])
    ps = list(eager.parameters())
    if args.gated:
        def inline():
            return F.linear(F.silu(F.linear(x, eager.gate_proj.weight))
                            * F.linear(x, eager.up_proj.weight), eager.down_proj.weight)
    else:
        W, B = [eager[0].weight, eager[2].weight], [eager[0].bias, eager[2].bias]

        def inline():
            return F.linear(F.gelu(F.linear(x, W[0], B[0]), approximate="tanh"), W[1], B[1])
    x = torch.randn(args.rows, args.d, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn(args.rows, args.d, device=dev, dtype=dt)
    fwds = {"ours": lambda: ours(x), "node": _as_node(lambda: ours(x)), "inline": inline,
            "eager": lambda: eager(x)}
    fns = {}
    for k, f in fwds.items():
        fns[k + "_fwd"] = f
        fns[k + "_step"] = (lambda f=f: torch.autograd.grad(f(), [x, *ps], gy))
    want = torch.autograd.grad(eager(x), [x, *ps], gy)
    for k in ("ours", "node"):  # the same gradients before any timing
        for a, b in zip(torch.autograd.grad(fwds[k](), [x, *ps], gy), want):
            torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    grad_fn = type(ours(x).grad_fn).__name__
    print("ours' node:", grad_fn, "| node's:", type(fwds["node"]().grad_fn).__name__)

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
    # the host time of each call alone, the variants taking turns call by call: this
    # host's jitter moved whole rounds by up to 2x, and the median of single calls is
    # robust to it. The device's queue does not fill (its work per step is shorter than
    # the host's), so a call's time is its host time.
    each = {k: [] for k in fns}
    names = list(fns)
    for r in range(args.rounds):
        for i in range(args.steps):
            for k in (names if (r + i) % 2 == 0 else names[::-1]):
                t = time.perf_counter()
                fns[k]()
                each[k].append((time.perf_counter() - t) * 1e6)
        sync()
    summary = {}
    for k, v in res.items():
        e = sorted(each[k])
        summary[k] = {"median_us": statistics.median(v), "min_us": min(v), "all_us": v,
                      "call_median_us": e[len(e) // 2], "call_p10_us": e[len(e) // 10],
                      "call_p90_us": e[len(e) * 9 // 10]}
    for k, v in summary.items():
        print(f"{k:12s} rounds: median {v['median_us']:7.1f} us, min {v['min_us']:7.1f};  "
              f"single calls: median {v['call_median_us']:7.1f}, p10 {v['call_p10_us']:7.1f},"
              f" p90 {v['call_p90_us']:7.1f}", flush=True)
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
        json.dump({"env": environment(dev), "args": vars(args), "ours_grad_fn": grad_fn,
                   "times": summary,
                   "cprofile_ours_step": s.getvalue()}, f, indent=1)


if __name__ == "__main__":
    main()
