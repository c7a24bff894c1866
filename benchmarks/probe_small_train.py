"""Wide train steps by row count: the Triton kernels (forced), the same call as torch ops
with torch's autograd (backend='reference'), and eager modules; plus, at 8192 rows, the
wide-gelu inference GEMMs with cuBLASLt's bias+GELU epilogue (torch._addmm_activation)
against the bare GEMMs and the Triton epilogue kernels.

Train: a step is forward + torch.autograd.grad for x and every parameter; timed as
back-to-back steps between two CUDA events (host time included: small steps are
host-bound), median of the passes, the variants interleaved and reversed every other
pass. Writes JSON to --out.

    PYTHONPATH=. python3 benchmarks/probe_small_train.py --out probe.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.nn.functional as F
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu.bench import calls_ms, environment


def _time(fn, n: int) -> float:
    """Device-event ms per call of fn(), n back to back (bench.calls_ms)."""
    return calls_ms(torch.device("cuda", torch.cuda.current_device()), lambda i: fn(), n)


def _interleaved(fns: dict, n: int, passes: int) -> dict:
    for fn in fns.values():  # warm-up (compiles, autotunes, allocator)
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times = {k: [] for k in fns}
    for p in range(passes):
        for k in (list(fns) if p % 2 == 0 else list(fns)[::-1]):
            times[k].append(_time(fns[k], n))
    return {k: {"median_ms": statistics.median(v), "min_ms": min(v), "all_ms": v}
            for k, v in times.items()}


def _train_fns(config: str, m: int, dev, dt):
    torch.manual_seed(0)
    d, hid = (4096, 16384) if config == "wide-gelu" else (4096, 14336)
    x = torch.randn(m, d, device=dev, dtype=dt, requires_grad=True)
    gy = torch.randn(m, d, device=dev, dtype=dt)
    if config == "wide-gelu":
        eager = nn.Sequential(nn.Linear(d, hid), nn.GELU(approximate="tanh"),
                              nn.Linear(hid, d)).to(dev, dt)
        params = [eager[0].weight, eager[2].weight, eager[0].bias, eager[2].bias]

        def ours(backend):
            return lambda: torch.autograd.grad(fm.fused_mlp(
                x, params[:2], params[2:], "gelu_tanh", backend=backend), [x, *params], gy)
    else:
        wg, wu = (nn.Linear(d, hid, bias=False).to(dev, dt) for _ in range(2))
        wd = nn.Linear(hid, d, bias=False).to(dev, dt)
        params = [wg.weight, wu.weight, wd.weight]

        class Llama(nn.Module):
            def forward(self, t):
                return wd(F.silu(wg(t)) * wu(t))
        eager = Llama()

        def ours(backend):
            return lambda: torch.autograd.grad(fm.fused_gated_mlp(
                x, *params, "silu", backend=backend), [x, *params], gy)

    def eager_step():
        return torch.autograd.grad(eager(x), [x, *params], gy)

    return {"triton": ours("triton"), "torch_ops": ours("reference"), "auto": ours(None),
            "eager": eager_step}


def _triton(fn):
    """fn with the package's cuBLAS paths off (the Triton kernels)."""
    from fusedmlp_xpu.backends.triton import wide

    def run():
        os.environ[wide.BLAS_ENV] = "0"
        try:
            return fn()
        finally:
            del os.environ[wide.BLAS_ENV]
    return run


def _gelu_inference_fns(dev, dt, m=8192):
    from fusedmlp_xpu.backends.triton import wide

    torch.manual_seed(0)
    x = torch.randn(m, 4096, device=dev, dtype=dt)
    w1 = torch.randn(16384, 4096, device=dev, dtype=dt) / 64
    b1 = torch.randn(16384, device=dev, dtype=dt)
    h = torch.randn(m, 16384, device=dev, dtype=dt)
    w2 = torch.randn(4096, 16384, device=dev, dtype=dt) / 128
    b2 = torch.randn(4096, device=dev, dtype=dt)
    # the epilogue's accuracy first, against fp32 torch ops
    ref = F.gelu(F.linear(x.float(), w1.float(), b1.float()), approximate="tanh")
    err = {"lt_gelu": (torch._addmm_activation(b1, x, w1.t(), use_gelu=True).float() - ref)
           .abs().max().item(),
           "triton_gelu": (_triton(lambda: wide.linear(x, w1, b1, "gelu_tanh", False))()[0]
                           .float() - ref)
           .abs().max().item()}
    fns = {
        "l1_bare": lambda: torch.mm(x, w1.t()),
        "l1_lt_bias_gelu": lambda: torch._addmm_activation(b1, x, w1.t(), use_gelu=True),
        "l1_triton_bias_gelu": _triton(lambda: wide.linear(x, w1, b1, "gelu_tanh", False)),
        "l2_bare": lambda: torch.mm(h, w2.t()),
        "l2_addmm_bias": lambda: torch.addmm(b2, h, w2.t()),
        "l2_triton_bias": _triton(lambda: wide.linear(h, w2, b2, "none", False)),
    }
    return fns, err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="16,64,256,1024,2048,4096,8192")
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-inference", action="store_true")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--inference-rows", default="8192")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    out = {"env": environment(dev), "args": vars(args), "train": [], "inference": None}
    for config in () if args.no_train else ("wide-gelu", "wide-swiglu"):
        for m in (int(r) for r in args.rows.split(",")):
            fns = _train_fns(config, m, dev, dt)
            res = _interleaved(fns, args.steps if m <= 1024 else max(3, args.steps // 4),
                               args.passes)
            peaks = {}
            for k, fn in fns.items():  # one step's peak above what was allocated before
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                fn()
                torch.cuda.synchronize()
                peaks[k] = (torch.cuda.max_memory_allocated() - base) / 2**20
            out["train"].append({"config": config, "rows": m, "times": res, "peak_MB": peaks})
            print(config, m, {k: round(v["median_ms"] * 1e3, 1) for k, v in res.items()},
                  "us", {k: round(v) for k, v in peaks.items()}, "MB", flush=True)
            del fns
            torch.cuda.empty_cache()
    if not args.no_inference:
        out["inference"] = []
        for m in (int(r) for r in args.inference_rows.split(",")):
            fns, err = _gelu_inference_fns(dev, dt, m)
            res = _interleaved(fns, 10 if m > 1024 else 100, args.passes)
            out["inference"].append({"rows": m, "max_abs_err_vs_fp32": err, "times": res})
            print("inference", m, err, {k: round(v["median_ms"], 4) for k, v in res.items()},
                  "ms", flush=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
