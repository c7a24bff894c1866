"""Probe: host time of one narrow train step (GPU machine). At up to ~2^20 rows a train
step's host work, not its kernels, bounds the bench's back-to-back timing; this times it
where the GPU keeps up (2^14 rows: the Gluon backward's smallest), for the Gluon backward
and the Triton kernels (FUSEDMLP_GLUON_BACKWARD=0): the step as the bench times it (the
parameters' gradients accumulate: autograd adds each into .grad), the step after
``zero_grad()`` (autograd keeps the new gradients, no adds), the forward alone; eager
PyTorch's step and one F.linear as this host's yardsticks (interleaved rounds,
fusedmlp_xpu.bench.interleaved_us), then profiles the step with cProfile.

    python benchmarks/probe_train_host.py --out F.json [--hidden 32 64] [--profile]
        [--torch-profile]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends import triton as tb
from fusedmlp_xpu.bench import environment, interleaved_us, profile_text


def _backward(variant: str):
    os.environ["FUSEDMLP_GLUON_BACKWARD"] = "0" if variant == "triton" else "1"
    tb._gluon_backward_plan.cache_clear()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--hidden", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--rows", type=int, default=tb.GLUON_MIN_ROWS)
    ap.add_argument("--profile", action="store_true", help="cProfile 1000 Gluon steps")
    ap.add_argument("--torch-profile", action="store_true",
                    help="torch.profiler's CPU table of 200 Gluon steps (the C++ side: "
                         "autograd's nodes, the dispatcher, the gradients' accumulation)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.float16
    rows, profiles = [], []
    for hidden in args.hidden:
        torch.manual_seed(0)
        m = fm.FusedMLP(64, 64, hidden, 4, bias=False, device=dev, dtype=dt, backend="triton")
        seq = m.to_sequential()
        x = torch.randn(args.rows, 64, device=dev, dtype=dt, requires_grad=True)
        gy = torch.randn(args.rows, 64, device=dev, dtype=dt)

        def step(model=m):
            x.grad = None
            model(x).backward(gy)

        def fresh_step():
            m.zero_grad()
            step()

        def forward():
            m(x)

        def linear():
            torch.nn.functional.linear(x, seq[0].weight)

        for variant in ("gluon", "triton"):
            _backward(variant)
            fns = {"step": step, "step after zero_grad": fresh_step, "forward": forward,
                   "eager step": lambda: step(seq), "F.linear": linear}
            us = interleaved_us(fns, dev, n=1400, rounds=7, warm=50)
            print(f"hidden {hidden} {variant}: " + ", ".join(f"{k} {v:.1f} us"
                                                            for k, v in us.items()), flush=True)
            rows.append(dict(hidden=hidden, rows=args.rows, backward=variant, **{
                k.replace(" ", "_").replace(".", "") + "_us": v for k, v in us.items()}))
        if args.profile:
            _backward("gluon")
            text = profile_text(step, 1000, dev)
            print(f"--- cProfile, 1000 steps, hidden {hidden}, Gluon backward\n{text}")
            profiles.append(dict(hidden=hidden, cprofile_1000_steps=text))
        if args.torch_profile:
            from torch.profiler import ProfilerActivity, profile

            _backward("gluon")
            for _ in range(50):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(200):
                    step()
                torch.cuda.synchronize()
            text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
            print(f"--- torch.profiler, 200 steps, hidden {hidden}, Gluon backward\n{text}")
            profiles.append(dict(hidden=hidden, torch_profiler_200_steps=text))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(dev), rows=rows, profiles=profiles), f,
                      indent=1)


if __name__ == "__main__":
    main()
