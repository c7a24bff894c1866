"""The CPU path against eager on the machine it runs on: a FusedMLP (on the CPU the
dispatcher takes the `reference` backend) and its `nn.Sequential` twin (`to_sequential()`,
the same weights), a GatedMLP and the eager Llama MLP of the same Linears, no-grad inference, a train step (forward, backward of a given
grad_y to x and every parameter) and, for the sdf net, an eikonal step (g = dy/dx with
create_graph=True, a loss on y and g, backward: a double backward), at several row counts. Each case is checked against
float64 first; the two are then timed interleaved (their rounds in turn, median:
`bench.interleaved_us`), so the host's drift lands on both alike. Appends the run, with
the environment, to the machine's results table.

    PYTHONPATH=. python3 benchmarks/cpu_eager.py [--out benchmarks/results/cpu.jsonl]
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.nn.functional as F

import fusedmlp_xpu as fm
from fusedmlp_xpu.bench.narrow import interleaved_us
from fusedmlp_xpu.bench.results import RunWriter
from fusedmlp_xpu.bench.tools import add_output_arguments, environment

MODES = ("inference", "train", "eikonal")
# name -> (FusedMLP arguments, row counts); the eikonal step on the sdf net only
NETS = {
    "narrow-w64": (dict(in_features=64, out_features=64, hidden_features=64, hidden_layers=4,
                        activation="relu", bias=False), (16, 1024, 16384, 65536)),
    "narrow-w128": (dict(in_features=64, out_features=64, hidden_features=128,
                         hidden_layers=4, activation="relu", bias=False), (1024, 16384)),
    "sdf": (dict(in_features=32, out_features=16, hidden_features=64, hidden_layers=4,
                 activation="softplus", bias=True), (1024, 65536)),
    "ffn-gelu": (dict(in_features=512, out_features=512, hidden_features=2048,
                      hidden_layers=1, activation="gelu", bias=True), (16, 512, 4096)),
    # a GatedMLP (SwiGLU, Llama's layout)
    "swiglu": (dict(in_features=512, hidden_features=1408, activation="silu", bias=False),
               (16, 512, 2048)),
}


class LlamaMLP(torch.nn.Module):
    """Eager SwiGLU over copies of a GatedMLP's three Linears: down(silu(gate(x)) * up(x))."""

    def __init__(self, gated):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = (
            copy.deepcopy(m) for m in (gated.gate_proj, gated.up_proj, gated.down_proj))

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _nets(name, dtype):
    """(the fused module, its eager twin) with the same weights."""
    kw, _ = NETS[name]
    if name == "swiglu":
        fused = fm.GatedMLP(**kw, dtype=dtype)
        return fused, LlamaMLP(fused)
    fused = fm.FusedMLP(**kw, dtype=dtype)
    return fused, fused.to_sequential()


def _err(model, eager, x) -> float:
    """The module's output against float64 eager on the same weights (relative)."""
    ref = copy.deepcopy(eager).double()
    with torch.no_grad():
        y, r = model(x).double(), ref(x.double())
    return ((y - r).norm() / r.norm().clamp_min(1e-30)).item()


def case(name, rows, dtype, mode, calls) -> dict:
    kw, _ = NETS[name]
    torch.manual_seed(0)
    fused, eager = _nets(name, dtype)
    x = torch.randn(rows, kw["in_features"], dtype=dtype)
    err = _err(fused, eager, x)
    if mode == "inference":
        def run(net):
            def f():
                with torch.no_grad():
                    net(x)
            return f
    elif mode == "eikonal":
        def run(net):
            params = list(net.parameters())

            def f():
                xg = x.clone().requires_grad_()
                for p in params:
                    p.grad = None
                y = net(xg)
                g, = torch.autograd.grad(y[:, 0].sum(), xg, create_graph=True)
                (y[:, 0].abs().mean() + (g.norm(dim=-1) - 1).square().mean()).backward()
            return f
    else:
        xg = x.clone().requires_grad_()
        gy = torch.randn(rows, kw.get("out_features", kw["in_features"]), dtype=dtype)

        def run(net):
            params = list(net.parameters())

            def f():
                xg.grad = None
                for p in params:
                    p.grad = None
                net(xg).backward(gy)
            return f
    us = interleaved_us({"fused": run(fused), "eager": run(eager)}, torch.device("cpu"),
                        n=calls * 5, rounds=5, warm=2)
    return {"net": name, "rows": rows, "dtype": str(dtype).removeprefix("torch."),
            "mode": mode, "backend": fm.explain(fused, x).backend,
            "fused_ms": us["fused"] / 1e3, "eager_ms": us["eager"] / 1e3,
            "eager_over_fused": us["eager"] / us["fused"], "max_rel_error": err}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nets", nargs="+", choices=sorted(NETS), default=sorted(NETS))
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                   choices=["float32", "bfloat16", "float16"])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--calls", type=int, default=4, help="calls per round (5 rounds)")
    add_output_arguments(p)
    args = p.parse_args(argv)
    res = {"schema": "fusedmlp-cpu-eager/1", "env": environment(torch.device("cpu")),
           "notes": ["ms per call, interleaved rounds, median; eager_over_fused > 1: the "
                     "fused module is faster", "train: forward and backward of a given "
                     "grad_y to x and every parameter", "eikonal (sdf net): g = d y0/dx "
                     "with create_graph=True, loss |y0| + (|g| - 1)^2, backward to x and "
                     "every parameter"],
           "records": []}
    writer = RunWriter(args.out, args.run, "benchmarks/cpu_eager.py --nets " + " ".join(args.nets)
                       + " --dtypes " + " ".join(args.dtypes), "eager")
    for name in args.nets:
        for dt in args.dtypes:
            for rows in NETS[name][1]:
                for mode in args.modes:
                    if mode == "eikonal" and name != "sdf":
                        continue
                    r = case(name, rows, getattr(torch, dt), mode, args.calls)
                    res["records"].append(r)
                    print(f"{name:<12} {dt:<9} {rows:>6} {mode:<9} fused {r['fused_ms']:9.3f} "
                          f"eager {r['eager_ms']:9.3f} ms  {r['eager_over_fused']:.2f}x  "
                          f"err {r['max_rel_error']:.1e}", file=sys.stderr, flush=True)
                    writer.write(res)  # as it goes: a run cut short keeps its cases
    writer.write(res, final=True)
    print(f"appended run {writer.run} to {writer.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
