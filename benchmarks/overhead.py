"""Host time of one eager no-grad call, broken into its parts (GPU machine).

Usage: PYTHONPATH=. python benchmarks/overhead.py [--out overhead.json]
"""
import argparse
import contextlib
import copy
import importlib
import json

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch, op
from fusedmlp_xpu.backends import memory
from fusedmlp_xpu.bench import interleaved_us


def per_call_us(fn, n=3500, rounds=7):
    """Host time of one call: the median over ``rounds`` rounds of n / rounds calls."""
    return interleaved({"f": fn}, n, rounds)["f"]


def interleaved(fns: dict, n=3500, rounds=7) -> dict:
    """Like per_call_us for several functions, their rounds taken in turn: the H200 host's
    single-call times drift by tens of us over seconds, which would otherwise land on
    whichever function was timed then (fusedmlp_xpu.bench.interleaved_us)."""
    return interleaved_us(fns, torch.device("cuda"), n, rounds, warm=200)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--profile", action="store_true", help="cProfile 2000 module calls")
    ap.add_argument("--device-profile", action="store_true",
                    help="--wide: torch.profiler tables of the 16-row train step")
    ap.add_argument("--wide", action="store_true",
                    help="the wide-gelu block at 16 rows instead (bf16, 4096 -> 16384 -> 4096)")
    args = ap.parse_args()
    if args.wide:
        return wide(args)
    tb = importlib.import_module("fusedmlp_xpu.backends.triton")
    m = fm.FusedMLP(64, 64, 64, 4, bias=False, device="cuda", dtype=torch.float16)
    x = torch.randn(1, 64, device="cuda", dtype=torch.float16)
    ws, spec = m.weights(), m.spec(torch.float16)
    be = dispatch.REGISTRY["triton"]
    seq = m.to_sequential()
    res = {}
    launch = importlib.import_module("fusedmlp_xpu.backends.triton.launch")
    on = launch.enabled

    launch.enabled = lambda device: False  # a forward plan that launches through Triton
    slow_plan = tb.narrow.forward._NarrowForward(spec, x.device, False)
    launch.enabled = on
    plan = tb.narrow.forward._forward_plan(spec, x.device, False)

    fk = importlib.import_module("fusedmlp_xpu.backends.triton.narrow.forward_kernels")
    y = torch.empty(1, 64, device="cuda", dtype=torch.float16)
    wh = torch.stack(ws[1:-1])
    P = 64
    meta = dict(IN_P=P, H_P=P, OUT_P=P, ACT=1, OUT_ACT=0, F32=False, PREC="tf32x3")

    def raw():
        return fk._mlp_fwd_kernel[(1,)](x, ws[0], wh, ws[-1], x, x, x, y, y, 1, 64, 64, 64,
                                        3, 64, 1, 64, 64, HAS_BIAS=False, SAVE=False,
                                        BLOCK_M=64, num_warps=4,
                                        num_stages=tb.narrow.launchers.NUM_STAGES, **meta)
    with torch.no_grad():
        ck = raw()
        import triton
        drv = triton.runtime.driver.active
        stream = drv.get_current_stream(drv.get_current_device())
        full = (x, ws[0], wh, ws[-1], x, x, x, y, y, 1, 64, 64, 64, 3, 64, 1, 64, 64,
                P, P, P, 1, 0, False, False, False, "tf32x3", 64)  # signature order
        full_int = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in full)
        ref = y.clone()
        for args_ in (full, full_int):
            y.fill_(float("nan"))
            ck.run(1, 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *args_)
            torch.cuda.synchronize()
            assert torch.equal(y, ref), "a direct launch of the compiled kernel gave another y"
        first = plan(x, ws, None)[0]  # the general path; the second call launches directly
        again = plan(x, ws, None)[0]
        assert len(plan._entries) == 1, "the forward plan kept no direct launch"
        assert torch.equal(first, again), "the forward plan's direct launch gave another y"
        m(x)
        bound = m._bound  # the module's no-grad calls bound to its parameters (module.py)
        assert bound is not None, "the module's no-grad call did not bind"
        assert torch.equal(m(x), first), "the module's bound call gave another y"
        res.update(interleaved({
            "module_call": lambda: m(x),
            "bound_run": lambda: bound.run(x),
            "plan_call": lambda: plan(x, ws, None),
            "plan_call_triton_launch_path": lambda: slow_plan(x, ws, None),
            "op_call_lean": lambda: op.call(x, ws, None, spec, None, False),
            "custom_op": lambda: torch.ops.fusedmlp.mlp.default(x, ws, None, "relu", "none", ""),
            "backend_forward": lambda: be.forward(x, ws, None, spec, False),
            "eager_sequential": lambda: seq(x),
            "one_linear": lambda: torch.nn.functional.linear(x, ws[0]),
            "raw_triton_launch": raw,
            "compiled_kernel_run": lambda: ck.run(1, 1, 1, stream, ck.function,
                                                  ck.packed_metadata, None, None, None, *full),
            "compiled_kernel_run_int_ptrs": lambda: ck.run(
                1, 1, 1, stream, ck.function, ck.packed_metadata, None, None, None, *full_int),
        }))
        dev = x.device
        unbound = copy.deepcopy(m)  # the module's path before bound calls existed
        unbound._bind = lambda *a: None
        res.update(interleaved({  # a second, shorter round: these three side by side
            "module_call_b": lambda: m(x),
            "module_call_unbound_b": lambda: unbound(x),
            "one_linear_b": lambda: torch.nn.functional.linear(x, ws[0]),
        }))
        res.update(interleaved({
            "direct_ok": lambda: launch.direct_ok(0),
            "cuda_current_device": torch.cuda.current_device,
            "C_cuda_getDevice": torch._C._cuda_getDevice,
            "raw_stream": lambda: torch._C._cuda_getCurrentRawStream(0),
            "launch_hooked": launch._hooked,
            "new_empty_like": lambda: memory.new_empty(1, 64, like=x),
            "empty_device_of_x": lambda: torch.empty((1, 64), device=x.device,
                                                     dtype=torch.float16),
            "empty_device_kept": lambda: torch.empty((1, 64), device=dev, dtype=torch.float16),
            "x_new_empty": lambda: x.new_empty((1, 64)),
            "empty_like_x": lambda: torch.empty_like(x),
            "x_device": lambda: x.device,
            "choose": lambda: dispatch.choose(x.device, spec, None),
            "stack_hidden": lambda: torch.stack(ws[1:-1]),
            "empty": lambda: torch.empty(1, 64, device="cuda", dtype=torch.float16),
            "device_guard": lambda: torch.cuda.device(x.device).__enter__() or None,
            "current_stream": lambda: torch.cuda.current_stream(),
        }))
    xg = torch.randn(16, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    res.update(interleaved({
        "train_step_16_rows": lambda: m(xg).sum().backward(),
        "eager_train_step_16_rows": lambda: seq(xg).sum().backward(),
    }, n=1400))
    for k, v in res.items():
        print(f"{k:<32} {v:8.1f} us")
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
        from fusedmlp_xpu.benchtools import environment

        out = {"schema": "fusedmlp-host-overhead/1", "env": environment(torch.device("cuda")),
               "unit": "us per call (host, perf_counter; median of 7 rounds of 500 calls after 200 warm-up)",
               "us": res}
        json.dump(out, open(args.out, "w"), indent=1)


def wide(args):
    """fused_mlp on the wide-gelu block at 16 rows (decode-sized): host time with the lean
    launch path and without, against eager; which launches took the lean path; a profile."""
    wide_mod = importlib.import_module("fusedmlp_xpu.backends.triton.wide")
    launch = importlib.import_module("fusedmlp_xpu.backends.triton.launch")
    dt, dev = torch.bfloat16, "cuda"
    seq = torch.nn.Sequential(torch.nn.Linear(4096, 16384), torch.nn.GELU("tanh"),
                              torch.nn.Linear(16384, 4096)).to(dev, dt)
    ws, bs = [seq[0].weight, seq[2].weight], [seq[0].bias, seq[2].bias]
    x = torch.randn(16, 4096, device=dev, dtype=dt)
    on = launch.enabled

    def ours():
        return fm.fused_mlp(x, ws, bs, "gelu_tanh", backend="triton")

    slow = {}  # linear plans made with the lean path off: Triton's own launch each call

    def slow_plan(*key):
        if key not in slow:
            launch.enabled = lambda device: False
            slow[key] = wide_mod.layers._LinearForward(*key)
            launch.enabled = on
        return slow[key]

    def ours_triton_path():
        real, wide_mod.layers._linear_plan = wide_mod.layers._linear_plan, slow_plan
        launch.enabled = lambda device: False
        ours()
        launch.enabled, wide_mod.layers._linear_plan = on, real

    with torch.inference_mode():
        res = interleaved({"fused_mlp_16_rows": ours,
                           "fused_mlp_16_rows_triton_launch_path": ours_triton_path,
                           "eager_16_rows": lambda: seq(x)}, n=1400)
    xg = x.clone().requires_grad_()
    params = [*ws, *bs]
    gy = torch.randn_like(x)

    def train_ours():
        torch.autograd.grad(ours_x(xg), [xg, *params], gy)

    def ours_x(xx):
        return fm.fused_mlp(xx, ws, bs, "gelu_tanh", backend="triton")

    res.update(interleaved({
        "fused_mlp_16_rows_train_step": train_ours,
        "eager_16_rows_train_step": lambda: torch.autograd.grad(seq(xg), [xg, *params], gy),
    }, n=700))
    for k, v in res.items():
        print(f"{k:<40} {v:8.1f} us")
    print("launch hook installed:", launch._hooked())
    for (name, vendor), k in wide_mod.configs._tuned.items():
        print(f"{name:<10} {vendor:<7} lean launches {k.direct:>6}, cached specializations "
              f"{k.cache_size()}")
    if args.profile:
        import cProfile
        import pstats
        for what, fn in (("inference", ours), ("train step", train_ours)):
            with torch.inference_mode() if what == "inference" else contextlib.nullcontext():
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(500):
                    fn()
                pr.disable()
            print(f"--- cProfile, 500 x {what}")
            pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    if args.device_profile:  # where a 16-row train step's device time goes, ours and eager's
        from torch.profiler import ProfilerActivity, profile
        for what, fn in (("ours", train_ours), ("eager", lambda: torch.autograd.grad(
                seq(xg), [xg, *params], gy))):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
            print(f"--- torch.profiler, 20 x train step at 16 rows, {what}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14))
    if args.out:
        from fusedmlp_xpu.benchtools import environment

        json.dump({"schema": "fusedmlp-host-overhead/1", "env": environment(torch.device(dev)),
                   "unit": "us per call (host, perf_counter; median of 7 interleaved rounds)",
                   "us": res}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
