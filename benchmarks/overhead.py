"""Host time of one eager no-grad call, broken into its parts (GPU machine); --wide: of
the wide-gelu block at 16 rows; --train: of a narrow train step (forward and backward
from Python) against eager's, a do-nothing autograd node, and the step with every kernel
launch left out.

Usage: PYTHONPATH=. python benchmarks/overhead.py [--out T.jsonl] [--wide | --train]
"""
import argparse
import contextlib
import copy
import importlib

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch, op
from fusedmlp_xpu.backends import memory
from fusedmlp_xpu.bench.narrow import interleaved_us


def per_call_us(fn, n=3500, rounds=7):
    """Host time of one call: the median over ``rounds`` rounds of n / rounds calls."""
    return interleaved({"f": fn}, n, rounds)["f"]


def interleaved(fns: dict, n=3500, rounds=7) -> dict:
    """Like per_call_us for several functions, their rounds taken in turn: the H200 host's
    single-call times drift by tens of us over seconds, which would otherwise land on
    whichever function was timed then (fusedmlp_xpu.bench.narrow.interleaved_us)."""
    return interleaved_us(fns, torch.device("cuda"), n, rounds, warm=200)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="the results table to append to (.jsonl)")
    ap.add_argument("--run", default=None, help="the run's id in the table")
    ap.add_argument("--profile", action="store_true", help="cProfile 2000 module calls")
    ap.add_argument("--device-profile", action="store_true",
                    help="--wide: torch.profiler tables of the 16-row train step")
    ap.add_argument("--wide", action="store_true",
                    help="the wide-gelu block at 16 rows instead (bf16, 4096 -> 16384 -> 4096)")
    ap.add_argument("--train", action="store_true",
                    help="host time of narrow train steps (narrow-w64, loop-image's net) "
                         "at 2^14 rows (the Gluon kernels' smallest) and wall time at 2^18")
    args = ap.parse_args()
    if args.wide:
        return wide(args)
    if args.train:
        return train(args)
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
        from fusedmlp_xpu.bench.tools import environment, save_run

        out = {"schema": "fusedmlp-host-overhead/1", "env": environment(torch.device("cuda")),
               "unit": "us per call (host, perf_counter; median of 7 rounds of 500 calls after 200 warm-up)",
               "us": res}
        save_run(args.out, out, args.run, "benchmarks/overhead.py", "host-overhead")


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
        from fusedmlp_xpu.bench.tools import environment, save_run

        save_run(args.out, {"schema": "fusedmlp-host-overhead/1",
                            "env": environment(torch.device(dev)),
                            "unit": "us per call (host, perf_counter; median of 7 interleaved "
                                    "rounds)", "us": res},
                 args.run, "benchmarks/overhead.py --wide", "host-overhead-wide")


def patched(obj, name: str, value, fn):
    """fn, run with ``obj.name`` set to ``value`` (restored after each call)."""
    def run():
        real = getattr(obj, name)
        setattr(obj, name, value)
        try:
            fn()
        finally:
            setattr(obj, name, real)
    return run


def _tma_driver():
    """Triton's NVIDIA driver module where the package's memo of TMA maps wraps its
    make_tensordesc_arg (gluon.kept_descriptor), else None."""
    from fusedmlp_xpu.backends.triton import gluon

    if not (gluon._MEMO and gluon._MEMO[0]):
        return None
    drv = importlib.import_module("triton.backends.nvidia.driver")
    return drv if hasattr(drv.make_tensordesc_arg, "__wrapped__") else None


class _Nothing(torch.autograd.Function):
    """A do-nothing autograd node with a train step's inputs and outputs: the floor of any
    autograd.Function's host time (apply, the engine's call back into Python, the
    gradients' allocations)."""

    @staticmethod
    def forward(ctx, x, *params):
        ctx.save_for_backward(x, *params)
        return x.new_empty(x.shape[0], ctx_out[0])

    @staticmethod
    def backward(ctx, gy):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors)


ctx_out = [0]


def train(args):
    """Host time of one narrow train step from Python (zero_grad(set_to_none), forward,
    backward into .grad): the fused module, eager's nn.Sequential, _Nothing, the fused
    step with the kernels' launches left out (launch._direct a no-op: the package's Python
    alone) and with Triton making every TMA map on every launch (the package's memo off),
    interleaved in one process (this host's speed differs by up to 2x between processes);
    at 2^14 rows the GPU keeps up, so these are host times. Then the
    wall time a step at 2^18 (max of host and device) and the device time from a CUDA
    graph of the same step."""
    from fusedmlp_xpu.backends.triton import launch
    from fusedmlp_xpu.bench.tools import calls_ms

    dt, dev = torch.float16, torch.device("cuda")
    res = {}
    for name, (IN, H, L, OUT) in {"narrow-w64": (64, 64, 4, 64),
                                  "loop-image": (32, 64, 2, 3)}.items():
        torch.manual_seed(0)
        m = fm.FusedMLP(IN, OUT, H, L, device=dev, dtype=dt)
        seq = m.to_sequential()
        ctx_out[0] = OUT
        params = list(m.parameters())
        rows = 2 ** 14

        def step(net, x, gy):
            for p in net.parameters():
                p.grad = None
            net(x).backward(gy)

        def nothing(x, gy):
            for p in params:
                p.grad = None
            _Nothing.apply(x, *params).backward(gy)

        x = torch.randn(rows, IN, device=dev, dtype=dt, requires_grad=True)
        gy = torch.randn(rows, OUT, device=dev, dtype=dt)
        step(m, x, gy)  # the first call makes (and memoizes) the plans' descriptors
        fns = {"fused": lambda: step(m, x, gy), "eager": lambda: step(seq, x, gy),
               "nothing_node": lambda: nothing(x, gy),
               # the package's Python alone: every kernel launch a no-op
               "fused_no_launches": patched(launch, "_direct", lambda *a: None,
                                            lambda: step(m, x, gy))}
        drv = _tma_driver()
        if drv is not None:  # Triton's own descriptor handling on every launch
            fns["fused_tma_maps_every_launch"] = patched(
                drv, "make_tensordesc_arg", drv.make_tensordesc_arg.__wrapped__,
                lambda: step(m, x, gy))
        r = interleaved(fns, n=1400)
        big = 2 ** 18
        xb = torch.randn(big, IN, device=dev, dtype=dt, requires_grad=True)
        gb = torch.randn(big, OUT, device=dev, dtype=dt)
        for k, net in (("fused", m), ("eager", seq)):
            r[f"{k}_wall_2^18_us"] = 1e3 * min(
                calls_ms(dev, lambda i: step(net, xb, gb), 100, lead=True) for _ in range(5))
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step(net, xb, gb)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                net(xb).backward(gb)
            r[f"{k}_device_2^18_us"] = 1e3 * min(
                calls_ms(dev, lambda i: g.replay(), 100, lead=True) for _ in range(5))
        res[name] = r
        print(name, "rows", rows, flush=True)
        for k, v in r.items():
            print(f"  {k:<28} {v:8.1f} us", flush=True)
    # wide-gelu 2048 -> 5632 at 16 and 512 rows, the dispatcher's choice (these train calls
    # run as torch ops: routes.py; bound to them, module._bind_train, and through the
    # module's full path) against eager's nn.Sequential, interleaved
    seq = torch.nn.Sequential(torch.nn.Linear(2048, 5632), torch.nn.GELU(),
                              torch.nn.Linear(5632, 2048)).to(dev, dt)
    ours = fm.FusedMLP.from_sequential(seq)
    for lin, src in zip(ours.linears, (seq[0], seq[2])):
        lin.weight, lin.bias = src.weight, src.bias
    params = list(seq.parameters())
    r = {}
    for rows in (16, 512):
        xw = torch.randn(rows, 2048, device=dev, dtype=dt, requires_grad=True)
        gw = torch.randn(rows, 2048, device=dev, dtype=dt)
        r[f"route_{rows}"] = fm.explain(ours, xw).route(xw, train=True)
        def unbound(xw=xw, gw=gw):  # the module's full path (no train binding)
            kept, ours._bound_train = ours._bound_train, None
            real = fm.FusedMLP._bind_train
            fm.FusedMLP._bind_train = lambda *a: None
            try:
                torch.autograd.grad(ours(xw), [xw, *params], gw)
            finally:
                fm.FusedMLP._bind_train, ours._bound_train = real, kept

        r.update({f"{k}_{rows}": v for k, v in interleaved({
            "fused": lambda: torch.autograd.grad(ours(xw), [xw, *params], gw),
            "fused_unbound": unbound,
            "eager": lambda: torch.autograd.grad(seq(xw), [xw, *params], gw)}, n=1400).items()})
    res["wide-gelu-2048x5632"] = r
    print("wide-gelu-2048x5632 train steps", flush=True)
    for k, v in r.items():
        print(f"  {k:<28} {v:8.1f} us" if isinstance(v, float) else f"  {k}: {v}", flush=True)
    if args.profile:
        import cProfile
        import pstats
        import io
        m = fm.FusedMLP(64, 64, 64, 4, device=dev, dtype=dt)
        x = torch.randn(2 ** 14, 64, device=dev, dtype=dt, requires_grad=True)
        gy = torch.randn(2 ** 14, 64, device=dev, dtype=dt)
        for _ in range(50):
            m(x).backward(gy)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            for p in m.parameters():
                p.grad = None
            m(x).backward(gy)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(40)
        res["cprofile_tottime"] = buf.getvalue()
        print(buf.getvalue())
    if args.out:
        from fusedmlp_xpu.bench.tools import environment, save_run

        save_run(args.out, {"env": environment(dev), "train_host_us": res}, args.run,
                 "benchmarks/overhead.py --train", "host-train")


if __name__ == "__main__":
    main()
