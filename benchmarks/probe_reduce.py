"""The narrow backward's last kernel alone (_reduce_grads_kernel: every program's fp32
weight-gradient partials summed into the gradients), at several tunings (floats of a slot
one program sums, partials loaded a step), on partials shaped as the one-kernel backward
leaves them for the bench configs (their program counts), interleaved twice. Each tuning's
output is first checked against torch's sum of the same partials. Timed twice: back to
back (the partials warm in L2, as right after the backward kernel wrote them; on the H200
this read the host's ~28 us a call, whatever the tuning) and with triton.testing.do_bench
(L2 flushed before each call: the device time).

Usage: PYTHONPATH=. python3 benchmarks/probe_reduce.py [--out FILE.json]
(h200-probe-reduce-20261201.json was written before it took its timer and environment
from fusedmlp_xpu.bench: the same event timing, a shorter environment record.)
"""
import argparse
import json

import torch
import triton

from fusedmlp_xpu import bench, configs
from fusedmlp_xpu.backends import triton as tb

TUNINGS = [(1024, 8), (128, 32), (128, 16), (256, 32), (64, 32)]


def warm_ms(fn, device, n=50, reps=7):
    """Median over ``reps`` of device-event ms per call, ``n`` calls back to back."""
    return sorted(bench.calls_ms(device, lambda i: fn(), n) for _ in range(reps))[reps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.float16
    own = tb._reduce_tuning
    rows = []
    for name in ("narrow-w32", "narrow-w64"):
        spec = configs.CONFIGS[name].make(device=dev, dtype=dt, backend="triton").spec(dt)
        split = tb._split_backward(dev, spec)
        T_P = tb._launch_meta(spec, "cuda")["H_P"]
        W_SLOT, SLOT = T_P * T_P, T_P * T_P + T_P
        P = tb._n_programs(dev, 1 << 40, split.g_per_sm)
        acc = torch.randn(P, spec.n_layers, SLOT, device=dev)
        like = torch.empty(1, device=dev, dtype=dt)
        total = acc.sum(0)
        ref = [total[i, :W_SLOT].view(T_P, T_P)[:o, :n]
               for i, (n, o) in enumerate(zip(spec.widths[:-1], spec.widths[1:]))]
        for span, block_p in TUNINGS * 2:
            tb._reduce_tuning = lambda device_type, v=(span, block_p): v
            tb._reduce_layout.cache_clear()

            def run():
                return tb._reduce_grads(acc, spec, T_P, W_SLOT, SLOT, True, False, like)
            gws, _ = run()
            err = max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(gws, ref))
            ok = err < 2e-3
            w, c = warm_ms(run, dev), triton.testing.do_bench(run, return_mode="median")
            print(f"{name} P={P} span {span:5d} block_p {block_p:3d}: warm {w * 1e3:7.1f} us, "
                  f"flushed {c * 1e3:7.1f} us  (rel err {err:.1e}{'' if ok else ' WRONG'})",
                  flush=True)
            rows.append(dict(config=name, programs=P, span=span, block_p=block_p,
                             warm_us=w * 1e3, flushed_us=c * 1e3, rel_err=err, ok=ok))
    tb._reduce_tuning = own
    tb._reduce_layout.cache_clear()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(env=bench.environment(dev), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
