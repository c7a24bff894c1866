"""Probe: the narrow Triton forward (one program per row block) at padded width 128 with
in/out 128, at several (BLOCK_M, warps) tunings forced through ``_tuning_nvidia``, against
the package's own. The Gluon forward is off (FUSEDMLP_GLUON=0), so the Triton kernel runs
for fp16/bf16 too. A net 128 -> 128 x hidden_layers -> 128, no biases, checked against
float64 before timing; the variants in turn, two passes.

    python benchmarks/probe_fwd_w128_tuning.py --out F.json [--rows 22] [--dtype float16 float32]
"""
from __future__ import annotations

import argparse
import json
import os

import torch

os.environ["FUSEDMLP_GLUON"] = "0"  # before the package reads it

import fusedmlp_xpu as fm  # noqa: E402
from fusedmlp_xpu.backends import triton as tb  # noqa: E402
from fusedmlp_xpu.bench import Timer, environment  # noqa: E402

_own = tb._tuning_nvidia
VARIANTS = ["package", (256, 4), (128, 4), (128, 8), (64, 4)]


def _use(variant):
    tb._tuning_nvidia = _own if variant == "package" else (
        lambda spec, mode, v=variant: v if mode == "fwd" else _own(spec, mode))
    tb._tuning_cached.cache_clear()
    tb._forward_plan.cache_clear()


def _reference(m, x):
    """float64 forward of ``m`` (ReLU hidden layers, no output activation, no biases)."""
    h = x.double()
    ws = m.weights()
    for i, w in enumerate(ws):
        h = h @ w.double().t()
        if i < len(ws) - 1:
            h = h.relu()
    return h


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[22])
    p.add_argument("--dtype", nargs="+", default=["float16", "float32"])
    p.add_argument("--hidden-layers", type=int, default=4)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--device", default="cuda", help="cpu: a smoke test in the interpreter")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    dev = torch.device(a.device)
    records = []
    for dt_name in a.dtype:
        dt = getattr(torch, dt_name)
        m = fm.FusedMLP(128, 128, 128, a.hidden_layers, activation="relu", bias=False,
                        device=dev, dtype=dt)
        spec = m.spec()
        for r in a.rows:
            x = torch.randn(2 ** r, 128, device=dev, dtype=dt)
            want = _reference(m, x)
            for pss in range(a.passes):
                for v in VARIANTS:
                    _use(v)
                    m._bound = None
                    with torch.no_grad():
                        y = torch.full_like(want, float("nan"), dtype=dt)
                        y.copy_(m(x))
                        err = ((y.double() - want).abs().max() / want.abs().max()).item()
                        ms, lo, hi = Timer(dev, repeats=9, min_repeat_ms=20.0)(lambda i: m(x))
                    tun = tb._tuning_nvidia(spec, "fwd")
                    records.append({"dtype": dt_name, "rows": 2 ** r, "variant": str(v),
                                    "tuning": list(tun), "pass": pss + 1, "median_ms": ms,
                                    "min_ms": lo, "max_ms": hi, "max_rel_err": err})
                    print(f"{dt_name} 2^{r} pass {pss + 1} {str(v):<10} {tun} {ms:.4f} ms "
                          f"(err {err:.1e})", flush=True)
    _use("package")
    with open(a.out, "w") as f:
        json.dump({"env": environment(dev), "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
