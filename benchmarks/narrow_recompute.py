"""The narrow train step (forward, then backward to x, every weight and bias) recomputing
(recompute=True: on sm_90 the Gluon backward computes the pre-activations again on chip)
against the forward saving them (recompute=False: the Triton split kernels read them
back), and eager nn.Linear layers, per net and row count; each record says which the
backend takes by default (recompute=None).
Every variant's gradients are checked against float64 first (on the same inputs and
parameters); a fused one whose error exceeds both the tolerance and 4x eager's in the
same dtype is reported WRONG and not timed. Writes JSON.

    PYTHONPATH=. python benchmarks/narrow_recompute.py --out rc.json \
        [--nets sdf-softplus sdf-tanh] [--rows 16384 262144] [--dtype float16]

Times: device events, back-to-back steps, the variants interleaved round by round, the
median over ``--rounds`` after warm-up. Without a GPU it runs on the CPU (a smoke run:
keep --rows small; nothing there recomputes).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import fusedmlp_xpu as fm  # noqa: E402
from fusedmlp_xpu.bench.tools import add_output_arguments, calls_ms, environment, save_run  # noqa: E402,E501

SCHEMA = "fusedmlp-bench-narrow-recompute/1"
# name: (in, hidden, hidden layers, out, activation, bias)
NETS = {
    "sdf-softplus": (32, 64, 4, 16, "softplus", True),  # the sdf-eikonal config's net
    "sdf-tanh": (32, 64, 4, 16, "tanh", True),
    "sdf-sigmoid": (32, 64, 4, 16, "sigmoid", True),
    "w64-gelu": (64, 64, 3, 64, "gelu", True),  # gelu keeps z: two hidden-to-hidden fit
    "w64-silu": (32, 64, 3, 16, "silu", True),
    "w64-relu": (64, 64, 4, 64, "relu", True),  # unchanged: a control
}
TOL = {torch.float16: 2e-2, torch.bfloat16: 8e-2}  # relative to each tensor's largest value
VS_EAGER = 4.0  # or this multiple of eager's own error (sums over many rows cancel)


def _grads(model, x, gy):
    """(grad x, every parameter's grad) of one step."""
    x = x.detach().requires_grad_(True)
    for p in model.parameters():
        p.grad = None
    model(x).backward(gy)
    return [x.grad] + [p.grad for p in model.parameters()]


def _error(got, ref) -> float:
    """The largest error over the tensors, each relative to its reference's largest value."""
    return max(float((g.double() - r).abs().max() / r.abs().max().clamp_min(1e-30))
               for g, r in zip(got, ref))


def run(nets, rows_list, dtype, rounds, device, log=print):
    records = []
    for name in nets:
        IN, H, L, OUT, act, bias = NETS[name]
        for rows in rows_list:
            torch.manual_seed(rows + L)
            variants = {"recompute": fm.FusedMLP(IN, OUT, H, L, act, bias=bias, device=device,
                                                 dtype=dtype, recompute=True)}
            variants["save"] = fm.FusedMLP(IN, OUT, H, L, act, bias=bias, device=device,
                                           dtype=dtype, recompute=False)
            variants["save"].load_state_dict(variants["recompute"].state_dict())
            variants["eager"] = variants["recompute"].to_sequential()
            x = torch.randn(rows, IN, device=device, dtype=dtype)
            gy = torch.randn(rows, OUT, device=device, dtype=dtype) / rows ** 0.5
            ref = _grads(variants["recompute"].to_sequential().double(), x.double(), gy.double())
            rec = dict(net=name, widths=[IN] + [H] * L + [OUT], activation=act, bias=bias,
                       rows=rows, dtype=str(dtype).replace("torch.", ""),
                       explain=str(fm.explain(variants["recompute"], x, train=True)),
                       default_recomputes=fm.dispatch.choose(
                           device, variants["save"].spec(), None, train=True).recomputes(
                           variants["save"].spec(), device))
            for v, m in variants.items():
                rec[f"{v}_max_rel_err"] = _error(_grads(m, x, gy), ref)
            bound = max(TOL[dtype], VS_EAGER * rec["eager_max_rel_err"])
            ok = {v: rec[f"{v}_max_rel_err"] <= bound for v in variants}
            for v in variants:
                if not ok[v]:
                    log(f"WRONG {name} {rows} {v}: {rec[f'{v}_max_rel_err']:.3g} > {bound:.3g}")
            xs = x.detach().requires_grad_(True)

            def step(m):
                def f(_):
                    m(xs).backward(gy)
                return f

            runs = {v: step(m) for v, m in variants.items() if ok[v]}
            n = max(3, min(200, (1 << 22) // rows))
            for f in runs.values():  # warm-up: compiles, autotunes, allocator pools
                calls_ms(device, f, 3)
            times = {v: [] for v in runs}
            for _ in range(rounds):
                for v, f in runs.items():
                    times[v].append(calls_ms(device, f, n, lead=True))
            for v, t in times.items():
                rec[f"{v}_ms"] = statistics.median(t)
                rec[f"{v}_ms_all"] = t
            if "recompute" in times and "save" in times:
                rec["save_over_recompute"] = rec["save_ms"] / rec["recompute_ms"]
            if "recompute" in times and "eager" in times:
                rec["eager_over_recompute"] = rec["eager_ms"] / rec["recompute_ms"]
            log(f"{name:13s} {rows:8d} " + "  ".join(
                f"{v} {rec.get(f'{v}_ms', float('nan')):.4f} ms" for v in variants)
                + f"  err {rec['recompute_max_rel_err']:.2g}/{rec['save_max_rel_err']:.2g}"
                  f"/{rec['eager_max_rel_err']:.2g}")
            records.append(rec)
    return records


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", choices=sorted(NETS), default=sorted(NETS))
    p.add_argument("--rows", nargs="+", type=int,
                   default=[1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20])
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    p.add_argument("--rounds", type=int, default=5)
    add_output_arguments(p)
    a = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, a.dtype)
    records = run(a.nets, a.rows, dtype, a.rounds, device)
    save_run(a.out, dict(schema=SCHEMA, env=environment(device), records=records), a.run,
             "benchmarks/narrow_recompute.py " + " ".join(argv if argv is not None
                                                          else sys.argv[1:]), "narrow-recompute")
    return 0


if __name__ == "__main__":
    sys.exit(main())
