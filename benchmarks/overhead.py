"""Host time of one eager no-grad call, broken into its parts (GPU machine).

Usage: PYTHONPATH=. python benchmarks/overhead.py [--out overhead.json]
"""
import argparse
import importlib
import json
import os
import time

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch, op


def per_call_us(fn, n=3500, rounds=7):
    """Host time of one call: the median over ``rounds`` rounds of n / rounds calls (the
    H200 host's single-call times drift by tens of us between runs)."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n // rounds):
            fn()
        per.append((time.perf_counter() - t) / (n // rounds) * 1e6)
        torch.cuda.synchronize()
    return sorted(per)[rounds // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true", help="cProfile 2000 module calls")
    args = ap.parse_args()
    tb = importlib.import_module("fusedmlp_xpu.backends.triton")
    m = fm.FusedMLP(64, 64, 64, 4, bias=False, device="cuda", dtype=torch.float16)
    x = torch.randn(1, 64, device="cuda", dtype=torch.float16)
    ws, spec = m.weights(), m.spec(torch.float16)
    be = dispatch.REGISTRY["triton"]
    seq = m.to_sequential()
    res = {}
    with torch.no_grad():
        res["module_call"] = per_call_us(lambda: m(x))
        res["op_call_lean"] = per_call_us(lambda: op.call(x, ws, None, spec, None, False))
        res["custom_op"] = per_call_us(
            lambda: torch.ops.fusedmlp.mlp.default(x, ws, None, "relu", "none", ""))
        res["backend_forward"] = per_call_us(lambda: be.forward(x, ws, None, spec, False))
        res["choose"] = per_call_us(lambda: dispatch.choose(x.device, spec, None))
        res["stack_hidden"] = per_call_us(lambda: torch.stack(ws[1:-1]))
        res["empty"] = per_call_us(lambda: torch.empty(1, 64, device="cuda", dtype=torch.float16))
        res["eager_sequential"] = per_call_us(lambda: seq(x))
        res["one_linear"] = per_call_us(lambda: torch.nn.functional.linear(x, ws[0]))
        narrow = importlib.import_module("fusedmlp_xpu.backends.triton.narrow")
        y = torch.empty(1, 64, device="cuda", dtype=torch.float16)
        wh = torch.stack(ws[1:-1])
        P = 64
        meta = dict(IN_P=P, H_P=P, OUT_P=P, ACT=1, OUT_ACT=0, F32=False, PREC="tf32x3")

        def raw():
            narrow._mlp_fwd_kernel[(1,)](x, ws[0], wh, ws[-1], x, x, x, y, y, 1, 64, 64, 64, 3,
                                         64, 1, 64, 64, HAS_BIAS=False, SAVE=False, BLOCK_M=64,
                                         num_warps=4, num_stages=tb.NUM_STAGES, **meta)
        res["raw_triton_launch"] = per_call_us(raw)
        res["device_guard"] = per_call_us(lambda: torch.cuda.device(x.device).__enter__() or None)
        res["current_stream"] = per_call_us(lambda: torch.cuda.current_stream())
        ck = narrow._mlp_fwd_kernel[(1,)](x, ws[0], wh, ws[-1], x, x, x, y, y, 1, 64, 64, 64, 3,
                                          64, 1, 64, 64, HAS_BIAS=False, SAVE=False, BLOCK_M=64,
                                          num_warps=4, num_stages=tb.NUM_STAGES, **meta)
        ref = y.clone()
        import triton
        drv = triton.runtime.driver.active
        stream = drv.get_current_stream(drv.get_current_device())
        full = (x, ws[0], wh, ws[-1], x, x, x, y, y, 1, 64, 64, 64, 3, 64, 1, 64, 64,
                P, P, P, 1, 0, False, False, False, "tf32x3", 64)  # signature order
        lean = full[:18]
        for name, cargs in (("compiled_run_all_args", full), ("compiled_run_no_constexpr", lean)):
            try:
                y.fill_(float("nan"))
                ck.run(1, 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *cargs)
                torch.cuda.synchronize()
                ok = bool(torch.equal(y, ref))
                res[name] = per_call_us(lambda: ck.run(1, 1, 1, stream, ck.function,
                                                       ck.packed_metadata, None, None, None,
                                                       *cargs)) if ok else -1.0
            except Exception as e:  # noqa: BLE001
                print(name, "failed:", type(e).__name__, e)
                res[name] = -2.0
    # the same calls through Triton's own launch path, for comparison
    os.environ["FUSEDMLP_FAST_LAUNCH"] = "0"
    with torch.no_grad():
        res["module_call_triton_launch_path"] = per_call_us(lambda: m(x))
    os.environ["FUSEDMLP_FAST_LAUNCH"] = "1"
    xg = torch.randn(16, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    res["train_step_16_rows"] = per_call_us(lambda: m(xg).sum().backward(), n=1000)
    res["eager_train_step_16_rows"] = per_call_us(lambda: seq(xg).sum().backward(), n=1000)
    for k, v in res.items():
        print(f"{k:<18} {v:8.1f} us")
    if args.profile:
        import cProfile
        import pstats
        with torch.no_grad():
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(2000):
                m(x)
            pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    if args.out:
        from fusedmlp_xpu.bench import environment

        out = {"schema": "fusedmlp-host-overhead/1", "env": environment(torch.device("cuda")),
               "unit": "us per call (host, perf_counter; median of 7 rounds of 500 calls after 200 warm-up)",
               "us": res}
        json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
