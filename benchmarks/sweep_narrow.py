"""Sweep the Triton narrow kernel's tuning (BLOCK_M, num_warps, programs per SM) on a GPU.

Prints one line per variant and the best per (width, pass); the chosen values go into
_tuning_nvidia() in fusedmlp_xpu/backends/triton/narrow/tuning.py with these numbers as the
reason. Usage: PYTHONPATH=. python benchmarks/sweep_narrow.py [--out results.json]
"""
import argparse
import copy
import importlib
import sys

import torch
import triton.testing

import fusedmlp_xpu as fm

tb = importlib.import_module("fusedmlp_xpu.backends.triton")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="the results table to append to (.jsonl)")
    ap.add_argument("--run", default=None, help="the run's id in the table")
    ap.add_argument("--n", type=int, default=2 ** 22)
    ap.add_argument("--width", type=int, action="append")
    ap.add_argument("--mode", action="append", choices=["fwd", "fwd_save", "bwd"],
                    help="fwd: inference; fwd_save: the training forward alone (stores z; "
                         "the per-block kernel); bwd: forward + backward")
    ap.add_argument("--persistent", action="store_true",
                    help="forward only: the persistent kernel's stages and programs per SM")
    ap.add_argument("--split", action="store_true",
                    help="train step: the fused backward against the split backward's "
                         "weight-gradient kernel (BLOCK_M, warps, stages)")
    ap.add_argument("--stages", action="store_true",
                    help="num_stages of the layer loop (1-3): per-block forward, training "
                         "forward, fused backward and the split's input-gradient chain")
    ap.add_argument("--padding", action="store_true",
                    help="train step: each width padded on its own against every tile at "
                         "the widest (forward and split backward), kernel by kernel")
    ap.add_argument("--one-kernel", action="store_true",
                    help="train step: the split backward's two kernels against the resident "
                         "chain summing the weight gradients itself (Split.g_dw), with and "
                         "without biases, interleaved twice, then kernel by kernel")
    ap.add_argument("--nobias", action="store_true", help="--one-kernel: without biases only")
    ap.add_argument("--bias", action="store_true",
                    help="--persistent: with biases (past hidden 64 the resident kernel loads "
                         "them per row block)")
    ap.add_argument("--recompute", action="store_true",
                    help="--one-kernel: also each one-kernel variant with recompute=True")
    ap.add_argument("--maxnreg", action="store_true",
                    help="--one-kernel: instead of the usual variants, 3 and 4 programs per SM "
                         "under a register cap")
    ap.add_argument("--resident-only", action="store_true",
                    help="--split at width 128: the chain variants with the package's "
                         "weight-gradient kernel only")
    ap.add_argument("--more-stages", action="store_true",
                    help="--persistent / --one-kernel: the package's tuning with deeper "
                         "pipelines of the row-block loop (more rows in flight per SM)")
    ap.add_argument("--bias-per-block", action="store_true",
                    help="--one-kernel: the package's recomputing one kernel with its "
                         "biases held through the row-block loop and loaded per block; "
                         "--persistent (with --bias): each variant also with them per block")
    ap.add_argument("--variants",
                    help="--persistent: the resident kernels to time besides the package's, "
                         "as rows,warps,stages,per_sm;... (e.g. 256,16,2,1;256,8,2,1)")
    ap.add_argument("--hidden", type=int, default=4, help="hidden layers")
    ap.add_argument("--widest-padding", action="store_true",
                    help="every forward tile padded to the widest width (OWN_PADDING off)")
    args = ap.parse_args()
    tb.narrow.tuning.OWN_PADDING = not args.widest_padding
    if args.persistent:
        return sweep_persistent(args)
    if args.stages:
        return sweep_stages(args)
    if args.split:
        return sweep_split(args)
    if args.padding:
        return sweep_padding(args)
    if args.one_kernel:
        return sweep_one_kernel(args)
    dev = torch.device("cuda")
    rows = []
    for W in args.width or (32, 64, 128):
        for dtype in (torch.float16,):
            m = fm.FusedMLP(64, 64, W, 4, bias=False, device=dev, dtype=dtype, backend="triton")
            x = torch.randn(args.n, 64, device=dev, dtype=dtype, requires_grad=True)
            gy = torch.randn(args.n, 64, device=dev, dtype=dtype)
            for mode in args.mode or ("fwd", "bwd"):
                best = None
                for bm in (64, 128, 256):
                    for warps in (4, 8):
                        for per_sm in ((1, 2) if mode == "bwd" else (0,)):
                            tb.narrow.tuning._tuning_nvidia = lambda spec, md, bm=bm, w=warps: (bm, w)
                            _replan(m)
                            tb.narrow.launchers._n_programs = lambda d, nb, k=per_sm: max(1, min(nb, k * 132))
                            try:
                                with torch.no_grad():
                                    xs = x[:8192].detach()
                                    ref = m.to_sequential()(xs).float()
                                    err = ((m(xs).float() - ref).norm() / ref.norm()).item()
                                if not err < 1e-2:
                                    print(f"W{W} {mode} bm{bm} w{warps}: WRONG (rel err {err:.2e})")
                                    continue
                                if mode == "fwd":
                                    def fn():
                                        with torch.no_grad():
                                            m(x)
                                elif mode == "fwd_save":
                                    tb.narrow.tuning._persistent = lambda d, spec, save=False: None
                                    xs = x[:8192].detach().requires_grad_()
                                    err = ((m(xs).float() - ref).norm() / ref.norm()).item()
                                    if not err < 1e-2:
                                        print(f"W{W} {mode} bm{bm} w{warps}: WRONG")
                                        continue

                                    def fn():
                                        m(x)  # x requires grad: the forward saves z
                                else:
                                    fn = _step(m, x, gy)
                                ms = triton.testing.do_bench(fn, warmup=50, rep=300,
                                                             return_mode="median")
                            except Exception as e:  # out of resources, etc.
                                print(f"W{W} {mode} bm{bm} w{warps} k{per_sm}: {type(e).__name__}")
                                continue
                            rows.append(dict(W=W, mode=mode, bm=bm, warps=warps, per_sm=per_sm,
                                             ms=ms))
                            print(f"W{W} {mode} bm{bm} w{warps} k{per_sm}: {ms:.4f} ms", flush=True)
                            if best is None or ms < best[0]:
                                best = (ms, bm, warps, per_sm)
                print(f"BEST W{W} {mode}: {best}", flush=True)
    _write(args, rows)


def sweep_persistent(args):
    """The persistent forward against the one-program-per-block forward, same process."""
    dev = torch.device("cuda")
    rows = []
    own, own_tuning = tb.narrow.tuning._persistent, tb.narrow.tuning._tuning_nvidia
    own_pb = tb.narrow.tuning._bias_per_block
    for W in args.width or (32, 64):
        m = fm.FusedMLP(64, 64, W, args.hidden, bias=args.bias, device=dev,
                        dtype=torch.float16, backend="triton")
        x = torch.randn(args.n, 64, device=dev, dtype=torch.float16)
        with torch.no_grad():
            ref = m.to_sequential()(x[:8192]).float()
        # the package's own choice (and with every tile padded to the widest width),
        # the per-block kernel, then the persistent kernel as (rows, warps, stages,
        # programs per SM, weights resident). Swept before (history 11 of NOTES.md):
        # weights per block and 8 warps; the resident kernel at 64 and 128 rows, 2 and 3
        # per SM. Each width padded on its own makes the kernel lighter where hidden is
        # narrower (sm_90 compile at 64 -> 32 -> 64: 48 KB, 124 registers against 80 KB,
        # 183), so up to 4 programs per SM may fit. Without biases (this sweep) the
        # hidden-64 kernel at 64 rows / 4 warps takes 78-80 registers and 80 / 72 / 56 KB
        # of shared memory at 3 / 2 / 1 stages (sm_90 compile, Triton 3.6): 2 / 3 / 4
        # programs fit an SM. A grid of more than fit runs in more than one wave (the
        # earlier 3 and 4 per SM at 3 stages, and 4 at 2 stages): 64/4/2/3 and 64/4/1/4
        # are the variants with more blocks in flight that fit.
        variants = ["package", "package, widest padding", (128, 4)] + [
            (64, 4, 3, 2, True), (64, 4, 3, 3, True), (64, 4, 3, 4, True),
            (64, 4, 2, 3, True), (64, 4, 1, 4, True), (128, 4, 3, 2, True),
            (128, 8, 3, 1, True)]
        if args.variants:
            variants = ["package"] + [tuple(int(t) for t in v.split(",")) + (True,)
                                      for v in args.variants.split(";")]
        elif args.more_stages:
            # the package's rows / warps / programs per SM with 4-6 stages: each stage
            # is one more 8 KB x tile in flight. sm_90 compile, no biases, 64 rows / 4
            # warps: hidden 64 72 / 80 / 88 / 96 KB at 3-6 stages, hidden 32 (own
            # padding) 46 KB at 3, 62 at 5, 70 at 6: two (hidden 64) or three (32) fit
            own_v = own(dev, m.spec(torch.float16))
            variants = ["package"] + [own_v[:2] + (st,) + own_v[3:] for st in (4, 5, 6)]
        elif W > 64:
            # hidden 128 between in/out 64, weights resident (128 KB at 3 hidden-to-hidden
            # weights): one program per SM fits (sm_90 compile, Triton 3.6, no biases:
            # 128/8 at 2 / 1 stages 176 / 144 KB, 150-154 registers; 64/4/2 152 KB,
            # 168; 256/8/2 208 KB, 248), against the per-block kernel, which reads every
            # weight tile from L2 for each row block (the package's before
            # h200-sweep-persistent-w128-20261201.json; resident since)
            variants = ["package", (128, 4), (128, 8, 2, 1, True), (256, 8, 2, 1, True),
                        (256, 8, 1, 1, True), (64, 4, 3, 2, True), (128, 8, 1, 1, True)]
        best = {}
        # with --bias-per-block each variant also with its biases loaded per row block
        for v, pb in [(v, pb) for v in variants
                      for pb in ((None, True) if args.bias_per_block else (None,))]:
            tb.narrow.tuning.OWN_PADDING = v != "package, widest padding"
            tb.narrow.tuning._bias_per_block = own_pb if pb is None else (lambda pads: True)
            if isinstance(v, str):
                tb.narrow.tuning._persistent, tb.narrow.tuning._tuning_nvidia = own, own_tuning
                sp = m.spec(torch.float16)
                label = f"{v} {own(dev, sp)} / storing z {own(dev, sp, True)}"
            elif len(v) == 2:
                tb.narrow.tuning._persistent = lambda d, spec, save=False: None
                tb.narrow.tuning._tuning_nvidia = lambda spec, md, v=v: v
                label = f"per-block bm{v[0]} w{v[1]}"
            else:
                tb.narrow.tuning._persistent = lambda d, spec, save=False, v=v: v
                label = "persistent bm{} w{} stages{} k{} resident {}".format(*v)
            label += " biases per block" if pb else ""
            _replan(m)
            for mode in ("inference", "train fwd"):  # the training forward stores z
                try:
                    with torch.set_grad_enabled(mode != "inference"):
                        err = ((m(x[:8192]).float() - ref).norm() / ref.norm()).item()
                        if not err < 1e-2:
                            print(f"W{W} {label} {mode}: WRONG (rel err {err:.2e})", flush=True)
                            continue
                        ms = triton.testing.do_bench(lambda: m(x), warmup=50, rep=300,
                                                     return_mode="median")
                except Exception as e:  # out of resources, etc.
                    print(f"W{W} {label}: {type(e).__name__} {str(e)[:120]}", flush=True)
                    continue
                best[mode] = _keep(rows, best.get(mode), W, args.hidden,
                                   f"{mode} {label}{_refused()}", ms)
        for mode, b in best.items():
            print(f"BEST W{W} L{args.hidden} {mode}: {b}", flush=True)
    tb.narrow.tuning.OWN_PADDING, tb.narrow.tuning._bias_per_block = True, own_pb
    _write(args, rows)


def _replan(*modules):
    """Make the next calls read the (patched) tuning again: the cached tuning, the
    forward plans (they keep theirs), the stage fits and the modules' bound calls."""
    tb.narrow.tuning._tuning_cached.cache_clear()
    tb.narrow.tuning._split_cached.cache_clear()
    tb.narrow.forward._forward_plan.cache_clear()
    tb.narrow.backward._backward_plan.cache_clear()
    tb.narrow.launchers._FIT.clear()
    for m in modules:
        m._bound = None


def _step(m, x, gy):
    """One train step as the bench times it: x's gradient new each step (x.grad = None,
    bench.TRAIN_STEP; the sweep files up to h200-sweep-one-kernel-20261201i.json let it
    accumulate: ~0.37 ms more a step at 2^22 x 64 fp16)."""
    def fn():
        x.grad = None
        m(x).backward(gy)
    return fn


def _train_case(W, hidden, n, dev, bias=True):
    """A W-wide fp16 FusedMLP (in/out 64, biases unless told), x [n, 64] needing grad,
    grad_y, and the eager reference gradients (x and every parameter) on the first 8192
    rows."""
    m = fm.FusedMLP(64, 64, W, hidden, bias=bias, device=dev, dtype=torch.float16,
                    backend="triton")
    x = torch.randn(n, 64, device=dev, dtype=torch.float16, requires_grad=True)
    gy = torch.randn(n, 64, device=dev, dtype=torch.float16)
    seq = m.to_sequential()
    xs = x[:8192].detach().requires_grad_()
    seq(xs).backward(gy[:8192])
    ref = [xs.grad.float()] + [p.grad.float() for p in seq.parameters()]
    return m, seq, x, gy, xs, ref


def _grad_err(m, xs, gy, ref) -> float:
    """Largest relative error of the module's gradients on xs against ref."""
    m.zero_grad(set_to_none=True)
    xs.grad = None
    m(xs).backward(gy[: xs.shape[0]])
    got = [xs.grad.float()] + [p.grad.float() for p in m.parameters()]
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(got, ref))


def _checked_train_ms(m, xs, gy, ref, fn, label):
    """The median ms of the train step fn once the module's gradients on xs match ref;
    None (said why) when they do not or the variant fails (out of resources, etc.)."""
    try:
        err = _grad_err(m, xs, gy, ref)
        if not err < 2e-2:
            print(f"{label}: WRONG (rel err {err:.2e})", flush=True)
            return None
        return triton.testing.do_bench(fn, warmup=20, rep=200, return_mode="median")
    except Exception as e:  # out of resources, etc.
        print(f"{label}: {type(e).__name__} {str(e)[:120]}", flush=True)
        return None


def sweep_stages(args):
    """The layer loop's num_stages (``_layer_stages_nvidia``), 1-3, at 4 and 11 hidden
    layers: inference with the per-block forward (persistent off) and the train step
    (forward + backward; the package's backward choice, fused or split, for that width)."""
    dev = torch.device("cuda")
    rows = []
    own_persistent = tb.narrow.tuning._persistent
    for W in args.width or (32, 64):
        for hidden in (4, 11):
            m, seq, x, gy, xs, ref = _train_case(W, hidden, args.n, dev)
            with torch.no_grad():
                ref_y = seq(xs).float()
            for mode in ("fwd", "train"):
                best = None
                for st in (1, 2, 3):
                    tb.narrow.tuning._layer_stages_nvidia = lambda spec, md, st=st: st
                    tb.narrow.tuning._persistent = ((lambda d, spec, save=False: None) if mode == "fwd"
                                      else own_persistent)
                    _replan(m)
                    label = f"{mode} stages {st}"
                    try:
                        if mode == "fwd":
                            with torch.no_grad():
                                err = ((m(xs).float() - ref_y).norm() / ref_y.norm()).item()

                            def fn():
                                with torch.no_grad():
                                    m(x)
                        else:
                            err = _grad_err(m, xs, gy, ref)
                            fn = _step(m, x, gy)
                        if not err < 2e-2:
                            print(f"W{W} L{hidden} {label}: WRONG (rel err {err:.2e})")
                            continue
                        ms = triton.testing.do_bench(fn, warmup=20, rep=200,
                                                     return_mode="median")
                    except Exception as e:  # out of resources, etc.
                        print(f"W{W} L{hidden} {label}: {type(e).__name__} {str(e)[:120]}")
                        continue
                    best = _keep(rows, best, W, hidden, label, ms)
                print(f"BEST W{W} L{hidden} {mode}: {best}", flush=True)
    tb.narrow.tuning._persistent = own_persistent
    _write(args, rows)


def _refused() -> str:
    """What ran instead, when the device refused an unrolled kernel of the variant just
    timed (tb._FIT, cleared before each variant); empty when everything fit."""
    if not tb.narrow.launchers._FIT:
        return ""
    return " (did not fit; ran: {})".format(", ".join(
        f"{k[0]} {v} stages" if v else f"{k[0]} layer loop" for k, v in tb.narrow.launchers._FIT.items()))


def _keep(rows, best, W, hidden, label, ms):
    """Record and print one timed variant; the (ms, label) best so far."""
    rows.append(dict(W=W, hidden=hidden, variant=label, ms=ms))
    print(f"W{W} L{hidden} {label}: {ms:.4f} ms", flush=True)
    return best if best is not None and best[0] <= ms else (ms, label)


def _write(args, rows):
    if args.out:
        from fusedmlp_xpu.bench.tools import environment, save_run

        save_run(args.out, {"schema": "fusedmlp-sweep/1", "env": environment(torch.device("cuda")),
                            "args": vars(args), "rows": rows}, args.run,
                 "benchmarks/sweep_narrow.py " + " ".join(sys.argv[1:]), "sweep")


def sweep_split(args):
    """Train step (forward + backward, all gradients): fused backward vs split backward
    (input-gradient kernel persistent or per row block, then the weight-gradient kernel).
    Then the fused and the best split step under torch.profiler, kernel by kernel, and
    cuBLAS's g^T h for one layer, the bar for the weight-gradient kernel."""
    dev = torch.device("cuda")
    rows = []
    for W in args.width or (32, 64, 128):
        m, _, x, gy, xs, ref = _train_case(W, args.hidden, args.n, dev)
        # the input-gradient kernel's (rows, warps, programs per SM or 0 for one per row
        # block, layer loop unrolled?, stages of its row-block loop), each with the first
        # weight-gradient (rows, warps, stages); then every weight-gradient variant with
        # the best chain. The earlier sweeps' best of each first.
        if W <= 64:
            gs = ((64, 4, 1, True, 3), (64, 4, 1, True, 2), (64, 4, 2, True, 2),
                  (128, 8, 1, True, 3), (128, 8, 1, True, 2), (128, 4, 0, False, 1),
                  # weights resident (loaded once per program): 98 KB at 64/4/2 stages in
                  # the sm_90 compile (Triton 3.9, 3 hidden-to-hidden weights), so two
                  # programs fit an SM; not timed yet
                  (64, 4, 1, True, 3, True), (64, 4, 2, True, 2, True),
                  (128, 8, 1, True, 2, True))
            dws = ((128, 4, 2), (128, 4, 3), (256, 8, 2), (256, 4, 2), (64, 4, 3),
                   (128, 8, 3))
        else:
            # ... and the chain with its weights resident at hidden 128 between in/out 64
            # (sm_90 compile, Triton 3.6: 128/8 at 1 stage 176 KB, 255 registers, no
            # spills; 64/4 at 2 stages 216 KB, 20 B of spills)
            gs = ((64, 4, 0, False, 1), (64, 4, 0, True, 1), (128, 8, 1, True, 1, True),
                  (64, 4, 1, True, 2, True))
            dws = ((64, 4, 3),) if args.resident_only else ((64, 4, 3), (64, 4, 4), (128, 8, 3))
        best = None
        timed = {}

        fn = _step(m, x, gy)

        def time_variant(v, W=W, m=m, xs=xs, gy=gy, ref=ref, timed=timed, fn=fn):
            nonlocal best
            tb.narrow.tuning._split_backward = lambda d, spec, v=v: v
            tb.narrow.launchers._FIT.clear()
            label = "fused" if v is None else (
                "split dw bm{} w{} st{} g bm{} w{} per-SM {} unroll {} st{} resident {}"
                .format(*v))
            ms = _checked_train_ms(m, xs, gy, ref, fn, f"W{W} {label}")
            if ms is None:
                return
            if tb.narrow.launchers._FIT:  # an unrolled kernel was refused: fewer stages or the layer loop ran
                label += _refused()
            else:
                timed[v] = ms
            best = _keep(rows, best, W, args.hidden, f"train {label}", ms)
        time_variant(None)
        for g in gs:
            time_variant(tb.narrow.tuning.Split(*dws[0], *g))
        g_best = min((v for v in timed if v is not None), key=timed.get, default=None)
        if g_best is not None:
            for dw in dws[1:]:
                time_variant(tb.narrow.tuning.Split(*dw, *g_best[3:]))
        print(f"BEST W{W} L{args.hidden} train: {best}", flush=True)
        splits = [v for v in timed if v is not None]
        for v in [None] + ([min(splits, key=timed.get)] if splits else []):
            tb.narrow.tuning._split_backward = lambda d, spec, v=v: v
            kernels = _profile_kernels(fn)
            print(f"W{W} {'fused' if v is None else v} per step, kernel by kernel:")
            for name, us in kernels:
                print(f"   {us:9.1f} us  {name}")
            rows.append(dict(width=W, hidden=args.hidden, variant=str(v), kernels_us=kernels))
        h = torch.randn(args.n, W, device=dev, dtype=torch.float16)
        ms = triton.testing.do_bench(lambda: torch.mm(h.t(), h), warmup=20, rep=200,
                                     return_mode="median")
        print(f"W{W} cuBLAS g^T h for one layer [{W}, {args.n}] @ [{args.n}, {W}]: {ms:.4f} ms",
              flush=True)
        rows.append(dict(width=W, n=args.n, cublas_gTh_ms=ms))
    _write(args, rows)


def sweep_padding(args):
    """Train step, with biases and without, with each width padded on its own
    (OWN_PADDING, the package's choice) against every tile at the widest, interleaved twice; where the split's chain keeps
    its weights resident (hidden <= 32), also with two chain programs per SM (its shared
    memory shrinks with the narrower hidden tiles). Then both kernel by kernel."""
    dev = torch.device("cuda")
    rows = []
    own_split = tb.narrow.tuning._split_backward
    for W, bias in [(W, b) for W in args.width or (32, 128) for b in (True, False)]:
        m, _, x, gy, xs, ref = _train_case(W, args.hidden, args.n, dev, bias)
        spec = m.spec(torch.float16)
        split = own_split(dev, spec)
        variants = ["own", "widest", "own", "widest"]
        if split is not None and split.g_resident:
            variants.append("own, chain 2 per SM")

        fn = _step(m, x, gy)

        def use(v):
            tb.narrow.tuning.OWN_PADDING = not v.startswith("widest")
            two = split._replace(g_per_sm=2) if v.endswith("2 per SM") else split
            tb.narrow.tuning._split_backward = lambda d, sp, two=two: two
            _replan(m)

        best = None
        for v in variants:
            use(v)
            ms = _checked_train_ms(m, xs, gy, ref, fn, f"W{W} {v}")
            if ms is None:
                continue
            best = _keep(rows, best, W, args.hidden, f"train bias {bias} {v}{_refused()}", ms)
        print(f"BEST W{W} L{args.hidden} bias {bias} train: {best}", flush=True)
        for v in ("own", "widest"):
            use(v)
            kernels = _profile_kernels(fn)
            print(f"W{W} bias {bias} {v} per step, kernel by kernel:")
            for name, us in kernels:
                print(f"   {us:9.1f} us  {name}")
            rows.append(dict(width=W, hidden=args.hidden, bias=bias, variant=v,
                             kernels_us=kernels))
    tb.narrow.tuning.OWN_PADDING, tb.narrow.tuning._split_backward = True, own_split
    _write(args, rows)


def sweep_one_kernel(args):
    """Train step with the package's split backward (two kernels, or one where it already
    chose Split.g_dw) against the resident chain that also sums every layer's weight
    gradient (Split.g_dw) at several (rows, warps, stages), with and without biases,
    interleaved twice. Each variant is checked first on 8192 rows (_checked_train_ms) and
    on all rows (every program then sums many row blocks): the weight gradients against
    eager's in fp32. Then the package's and the best one-kernel variant kernel by kernel."""
    dev = torch.device("cuda")
    rows = []
    own_split, own_pb = tb.narrow.tuning._split_backward, tb.narrow.tuning._bwd_bias_per_block
    biases = (True,) if args.bias_per_block else (False,) if args.nobias else (False, True)
    for W, bias in [(W, b) for W in args.width or (32, 64) for b in biases]:
        m, seq, x, gy, xs, ref = _train_case(W, args.hidden, args.n, dev, bias)
        spec = m.spec(torch.float16)
        package = own_split(dev, spec)
        # the two kernels, as the package chooses them without the one kernel
        tb.narrow.tuning.ONE_KERNEL_BACKWARD = False
        two = own_split(dev, spec) or tb.narrow.tuning.Split(128, 4, 2)
        tb.narrow.tuning.ONE_KERNEL_BACKWARD = True
        base = two._replace(g_per_sm=1, g_unroll=True, g_resident=True, g_dw=True)
        # (rows, warps, stages, programs per SM, register cap): the cap lets 3 or 4
        # 4-warp programs share an SM's 64K registers (ptxas spills the rest)
        ones = [base._replace(g_block_m=bm, g_warps=w, g_stages=st, g_per_sm=ps,
                              g_maxnreg=mr)
                for bm, w, st, ps, mr in (((64, 4, 2, 3, 168), (64, 4, 2, 4, 128))
                                          if args.maxnreg else
                                          ((64, 4, 2, 1, None), (128, 8, 2, 1, None),
                                           (64, 8, 2, 1, None), (64, 4, 2, 2, None)))]
        if args.more_stages:
            # the package's one kernel with 3 and 4 stages (x and grad_y tiles in
            # flight; sm_90 compile, recomputing, no biases: hidden 32 at 64/4 46 / 62
            # / 78 KB at 2-4 stages, hidden 64 at 128/8 136 / 168 / 200 KB)
            ones = [package._replace(g_stages=st) for st in (3, 4)]
        ones = [v for v in ones if v != package]
        # (split, recompute): with --recompute, the package's choice and each one-kernel
        # variant also with FusedMLP(recompute=True) (no z saved; the one kernel
        # computes it again from x)
        variants = [(v, False) for v in (package, two, *ones)]
        if args.bias_per_block:  # (split, recompute, biases per block)
            variants = [(package, True, False), (package, True, True)]
        elif args.more_stages:  # the train step's default: the one kernel recomputes
            variants = [(v, True) for v in (package, *ones)]
        elif args.recompute:
            variants += [(v, True) for v in (package, *ones) if v is not None and v.g_dw]
        # the weight gradients over every row in fp32 (eager fp16's cuBLAS may reduce a
        # K of 2^22 in fp16 pieces: 4-6% off in a first run)
        seq32 = copy.deepcopy(seq).float()
        seq32(x.detach().float()).backward(gy.float())
        full = [p.grad for p in seq32.parameters()]
        del seq32

        fn = _step(m, x, gy)

        def full_err():
            for p in m.parameters():
                p.grad = None
            fn()
            return max(((p.grad.float() - r).norm() / r.norm()).item()
                       for p, r in zip(m.parameters(), full))

        timed = {}
        best = None
        for v, rc, *pb in variants * 2:
            pb = bool(pb and pb[0])  # the recomputing one kernel's biases per row block
            tb.narrow.tuning._split_backward = lambda d, sp, v=v: v
            tb.narrow.tuning._bwd_bias_per_block = lambda sp, pb=pb: pb
            _replan(m)
            m.recompute = rc
            label = ("package" if v is package else "two kernels" if v is two else
                     "one kernel") + " bm{} w{} st{}".format(v.g_block_m, v.g_warps,
                                                           v.g_stages) + (
                " per SM {}".format(v.g_per_sm) if v.g_per_sm != 1 else "") + (
                " maxnreg {}".format(v.g_maxnreg) if v.g_maxnreg else "") + (
                " (one kernel)" if v is package and v.g_dw else "") + (
                " recompute" if rc else "") + (" biases per block" if pb else "")
            ms = _checked_train_ms(m, xs, gy, ref, fn, f"W{W} bias {bias} {label}")
            if ms is None:
                continue
            err = full_err()  # fp16 steps against fp32: ~2e-2 for the two kernels too
            if not err < 4e-2:
                print(f"W{W} bias {bias} {label}: WRONG on all rows (rel err {err:.2e})")
                continue
            label = f"train bias {bias} {label}{_refused()} (all rows rel err {err:.1e})"
            timed.setdefault((v, rc, pb), []).append(ms)
            best = _keep(rows, best, W, args.hidden, label, ms)
        print(f"BEST W{W} L{args.hidden} bias {bias} train: {best}", flush=True)
        picks = [(two, False, False)] + ([min((k for k in timed if k[0] is not two),
                                              key=lambda k: min(timed[k]))]
                                         if len(timed) > 1 else [])
        for v, rc, pb in picks:
            tb.narrow.tuning._split_backward = lambda d, sp, v=v: v
            tb.narrow.tuning._bwd_bias_per_block = lambda sp, pb=pb: pb
            _replan(m)
            m.recompute = rc
            kernels = _profile_kernels(fn)
            print(f"W{W} bias {bias} {v} recompute {rc} biases per block {pb} per step, "
                  "kernel by kernel:")
            for name, us in kernels:
                print(f"   {us:9.1f} us  {name}")
            rows.append(dict(width=W, hidden=args.hidden, bias=bias, variant=str(v),
                             recompute=rc, bias_per_block=pb, kernels_us=kernels))
        m.recompute = False
    tb.narrow.tuning._split_backward, tb.narrow.tuning._bwd_bias_per_block = own_split, own_pb
    _write(args, rows)


def _profile_kernels(fn, steps=5):
    """[(kernel, device us per step)], largest first, from torch.profiler over ``steps``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:70]] = per.get(e.name[:70], 0.0) + e.device_time_total / steps
    return sorted(((k, round(v, 1)) for k, v in per.items()), key=lambda kv: -kv[1])


if __name__ == "__main__":
    main()
