"""`fusedmlp bench --suite steps`: whole training steps timed end to end (the benchmark's
`loop-image` and `sdf-eikonal`), writing JSON with the environment.

One step samples its inputs on the device, encodes them (a frequency encoding to 32
features), runs the MLP, computes the loss, backpropagates and takes an Adam step:

- `loop-image` (tiny-cuda-nn's "learning an image"): 2-D coordinates -> W 64, 2 hidden
  layers, ReLU, out 3 -> relative L2 loss against a fixed random 256x256x3 image looked up
  bilinearly.
- `sdf-eikonal`: 3-D points -> W 64, 4 hidden layers, softplus, out 16 (an SDF value and 15
  features) -> |sdf| + 0.1 (|d sdf/dx| - 1)^2 + 1e-3 features^2, d sdf/dx taken with
  ``create_graph=True`` (the backward is a double backward). `fused-first-order` times the
  same net's step without the eikonal term, for scale.

Variants, each a fresh copy of the same initial weights: `eager` (nn.Sequential),
`compile` (torch.compile, default mode, of the step; what it could compile is recorded),
`fused` (fm.FusedMLP), and on CUDA `fused-captured` / `eager-captured` (the whole step in
one CUDA graph, Adam with capturable=True). Parameters are held in the benchmark dtype; in
fp16/bf16 Adam updates float32 master copies (as tiny-cuda-nn does), so an fp16 gradient
too small for fp16 Adam state does not turn into an oversized update.

Before timing, one `fused` step is checked against the eager net in float64 on the same
inputs (loss and every gradient). Each variant then trains ``--steps`` steps from the same
seed (its final loss: the mean of the last 10 steps' losses; the variants must agree
within 2%), is timed (device events on CUDA, a host clock elsewhere; median over repeats)
and, on CUDA, profiled for a device-time breakdown by phase.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import statistics
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import fusedmlp_xpu as fm
from . import results
from .tools import calls_ms, environment, sync

SCHEMA = "fusedmlp-bench-steps/1"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}  # tests/conftest.py
GRAD_VS_EAGER = 4.0  # half precision: a gradient within 4x eager's own error (conftest.py)
AGREE = 0.02  # the variants' final losses agree within 2%
#: the final loss compared across variants: the median of the last TAIL steps' losses. On
#: the H200 the fp16 sdf-eikonal step's loss spikes now and then, for eager and fused alike
#: but at different steps (eager 0.021 -> 0.036 at step 200, fused 0.022 -> 0.091 at step
#: 499 at 2^18 rows; the same curves from this tree, with the lean launches off and from
#: the tree before: h200-sdf-loss-curves-20261204.txt), so the mean of the last 10 steps
#: compared one spike against none
TAIL = 100
ENCODED = 32  # frequency-encoded features (the MLP's input width)
PHASES = ("encoding", "mlp", "loss", "backward", "optimizer")


@dataclass(frozen=True)
class StepConfig:
    name: str
    dims: int  # coordinates per sample
    hidden_layers: int
    activation: str
    out_features: int
    second_order: bool
    hidden: int = 64
    batches: tuple[int, ...] = (2 ** 16, 2 ** 18, 2 ** 20)


CONFIGS = {c.name: c for c in [
    StepConfig("loop-image", 2, 2, "relu", 3, False),
    StepConfig("sdf-eikonal", 3, 4, "softplus", 16, True),
]}


def encode(x: torch.Tensor) -> torch.Tensor:
    """Frequency encoding, x: [N, d] in [0, 1] -> [N, 32]: sin and cos of x * pi * 2^k for
    the 32 // (2 d) octaves k that fit, padded with ones to 32 (tiny-cuda-nn's padding)."""
    n, d = x.shape
    octaves = ENCODED // (2 * d)
    freqs = math.pi * 2.0 ** torch.arange(octaves, device=x.device, dtype=x.dtype)
    xf = (x[:, :, None] * freqs).reshape(n, d * octaves)
    parts = [xf.sin(), xf.cos()]
    if 2 * d * octaves < ENCODED:
        parts.append(x.new_ones(n, ENCODED - 2 * d * octaves))
    return torch.cat(parts, 1)


class Task:
    """The data and the loss of one config: ``loss(net, dtype, gen=None)`` samples a batch on
    the device (from ``gen``, or the default generator, which CUDA graphs can capture)."""

    def __init__(self, cfg: StepConfig, N: int, device, first_order: bool = False):
        self.cfg, self.N, self.device = cfg, N, device
        self.eikonal = cfg.second_order and not first_order
        if cfg.name == "loop-image":
            g = torch.Generator(device=device).manual_seed(1234)
            self.image = torch.rand(1, 3, 256, 256, generator=g, device=device)

    def sample(self, gen=None) -> torch.Tensor:
        return torch.rand(self.N, self.cfg.dims, device=self.device, generator=gen)

    def loss(self, net, dtype, gen=None, phase=None) -> torch.Tensor:
        phase = phase or _no_range
        x = self.sample(gen)
        if self.eikonal:
            x.requires_grad_()
        with phase("encoding"):
            h = encode(x).to(dtype)
        with phase("mlp"):
            y = net(h).float()
        with phase("loss"):
            if self.cfg.name == "loop-image":
                grid = (x * 2 - 1)[None, None]  # [1, 1, N, 2]
                target = F.grid_sample(self.image, grid, align_corners=True)[0, :, 0].t()
                return ((y - target) ** 2 / (y.detach() ** 2 + 0.01)).mean()
            sdf, feat = y[:, 0], y[:, 1:]
            loss = sdf.abs().mean() + 1e-3 * (feat ** 2).mean()
            if self.eikonal:
                (g,) = torch.autograd.grad(sdf.sum(), x, create_graph=True)
                loss = loss + 0.1 * ((g.norm(dim=-1) - 1) ** 2).mean()
            return loss


def _phase(name):
    return torch.profiler.record_function(f"step:{name}")


def _no_range(name):
    return contextlib.nullcontext()


class Trainer:
    """One variant's net, Adam (over float32 masters in half precision) and step."""

    def __init__(self, net, dtype, device, capturable=False):
        self.net, self.dtype = net, dtype
        self.params = list(net.parameters())
        self.master = self.params if dtype == torch.float32 else [
            p.detach().float().requires_grad_() for p in self.params]
        if self.master is not self.params:
            for m in self.master:
                m.grad = torch.zeros_like(m)
        kw = {"fused": True} if device.type == "cuda" else {}
        self.opt = torch.optim.Adam(self.master, lr=1e-3, capturable=capturable, **kw)
        self.initial = [p.detach().clone() for p in self.master]

    def step(self, task, zero=True, phase=None) -> torch.Tensor:
        phase = phase or _no_range
        if zero:
            for p in self.params:
                p.grad = None
        loss = task.loss(self.net, self.dtype, phase=phase)
        with phase("backward"):
            loss.backward()
        with phase("optimizer"):
            if self.master is not self.params:
                torch._foreach_copy_([m.grad for m in self.master], [p.grad for p in self.params])
            self.opt.step()
            if self.master is not self.params:
                with torch.no_grad():
                    torch._foreach_copy_(self.params, self.master)
        return loss.detach()

    def restart(self):
        """Back to the initial weights and a fresh Adam state, in place (a captured graph
        keeps its tensors)."""
        with torch.no_grad():
            for m, p0 in zip(self.master, self.initial):
                m.copy_(p0)
            if self.master is not self.params:
                torch._foreach_copy_(self.params, self.master)
            for st in self.opt.state.values():
                for v in st.values():
                    if torch.is_tensor(v):
                        v.zero_()


def make_nets(cfg, device, dtype):
    """The fused module and its eager twin, same initial weights (seeded)."""
    torch.manual_seed(0)
    fused = fm.FusedMLP(ENCODED, cfg.out_features, cfg.hidden, cfg.hidden_layers,
                        activation=cfg.activation, device=device, dtype=dtype)
    return fused, fused.to_sequential()


def check(cfg, N, device, dtype) -> dict:
    """One `fused` step's loss and gradients against the eager net in float64 on the same
    inputs, at the timed batch N (the kernels and tunings chosen by row count are the ones
    timed); in half precision each may be off by GRAD_VS_EAGER x eager's own error."""
    task = Task(cfg, N, device)
    fused, seq = make_nets(cfg, device, dtype)
    ref = seq.double()
    seq = fused.to_sequential()

    def run(net, dt):
        net.zero_grad(set_to_none=True)
        gen = torch.Generator(device=device).manual_seed(7)
        loss = task.loss(net, dt, gen)
        loss.backward()
        return [loss.detach().double()] + [p.grad.double() for p in net.parameters()]

    want = run(ref, torch.float64)
    rel = lambda a, b: ((a - b).norm() / b.norm().clamp_min(1e-30)).item()  # noqa: E731
    got = [rel(a, b) for a, b in zip(run(fused, dtype), want)]
    name = next(k for k, v in DTYPES.items() if v == dtype)
    tol = [TOLERANCE[name]] * len(got)
    out = {"rows": N, "fused_errors": got}
    if dtype != torch.float32:
        eager = [rel(a, b) for a, b in zip(run(seq, dtype), want)]
        tol = [max(t, GRAD_VS_EAGER * e) for t, e in zip(tol, eager)]
        out["eager_errors"] = eager
    out.update(tolerances=tol, what=["loss"] + [n for n, _ in fused.named_parameters()],
               ok=all(e <= t for e, t in zip(got, tol)))
    return out


def _losses(trainer, run, steps, device, seed=0) -> list[float]:
    trainer.restart()
    torch.manual_seed(seed)
    hist = [run().clone() for _ in range(steps)]
    return torch.stack(hist).tolist()


def _capture(trainer, task, device):
    """The whole step in one CUDA graph (warm-up on a side stream first, as torch's docs do)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            trainer.step(task)
    torch.cuda.current_stream().wait_stream(s)
    for p in trainer.params:
        p.grad = None
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = trainer.step(task, zero=False)

    def run():
        g.replay()
        return out
    return run


def _compile(trainer, task, log):
    """torch.compile of the whole step; where that fails (a double backward through
    aot_autograd), of the loss alone. Returns (run, scope, notes)."""
    notes = []
    for scope in ("step", "loss"):
        try:
            if scope == "step":
                fn = torch.compile(trainer.step)
                run = lambda: fn(task)  # noqa: E731
            else:
                task_c = copy.copy(task)
                task_c.loss = torch.compile(task.loss)
                run = lambda: trainer.step(task_c)  # noqa: E731
            for _ in range(3):
                run()
            sync(task.device)
            return run, scope, notes
        except Exception as e:  # noqa: BLE001 -- recorded: what compile could not do
            msg = f"compile of the {scope} failed: {type(e).__name__}: {str(e)[:300]}"
            log("    " + msg)
            notes.append(msg)
            torch._dynamo.reset()
            trainer.restart()
    return None, None, notes


def breakdown(trainer, task, device, steps=5) -> dict:
    """Device ms per step by phase (kernels grouped by the step:* range their launch fell
    in; the backward runs on autograd's thread, so by time window, not by thread)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            trainer.step(task, phase=_phase)
        sync(device)
    ranges, launches, kernels = [], {}, []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name.startswith("step:"):
            ranges.append((e.start_ns(), e.end_ns(), name[5:]))
        elif e.device_type() == torch.autograd.DeviceType.CUDA:
            kernels.append((e.correlation_id(), e.duration_ns()))
        elif name.startswith("cu"):  # the runtime/driver call that launched it (aten ops
            # carry correlation ids of their own, from another numbering)
            launches[e.correlation_id()] = e.start_ns()
    out = dict.fromkeys(PHASES + ("other",), 0.0)
    for corr, dur in kernels:
        t = launches.get(corr)
        ph = next((n for a, b, n in sorted(ranges, key=lambda r: r[1] - r[0])
                   if t is not None and a <= t <= b), "other")
        out[ph] += dur / 1e6 / steps
    return out


def time_ms(run, device, repeats, target_ms) -> tuple[float, float, float]:
    first = calls_ms(device, lambda i: run(), 1)
    inner = max(1, min(200, math.ceil(target_ms / max(first, 1e-3))))
    times = [calls_ms(device, lambda i: run(), inner, lead=True) for _ in range(repeats)]
    return statistics.median(times), min(times), max(times)


def bench_case(cfg, N, dtype_name, device, args, log) -> list[dict]:
    dtype = DTYPES[dtype_name]
    base = {"config": cfg.name, "N": N, "dtype": dtype_name}
    chk = check(cfg, N, device, dtype)
    log(f"  check: {'ok' if chk['ok'] else 'WRONG'}, max error {max(chk['fused_errors']):.2e}")
    # compile last: on the H200 the fused step from Python took 2.52 ms timed after the
    # compiled variant in one process (h200-steps-loop-image-20261203.json) and 1.55 ms in
    # a process that compiled nothing (h200-host-step-loop-image-20261203.json); the cause
    # is not isolated (hosts differ too), so nothing timed from Python follows a compile
    variants = ["eager", "fused", "fused-captured", "eager-captured"]
    if cfg.second_order:
        variants.append("fused-first-order")
    variants.append("compile")
    records, python_runs = [], {}
    for v in variants:
        if v == "compile":  # before the compile (nothing timed from Python follows it)
            _paired(python_runs, records, device, args)
        rec = dict(base, variant=v)
        fused, seq = make_nets(cfg, device, dtype)
        net = fused if v.startswith("fused") else seq
        task = Task(cfg, N, device, first_order=v == "fused-first-order")
        rec["second_order"] = task.eikonal
        if v.startswith("fused"):
            rec["backend"] = fm.explain(fused, torch.empty(2, ENCODED, device=device,
                                                           dtype=dtype), train=True).backend
        if v == "fused":  # the check covers every fused variant: the same module and step
            rec["check"] = chk
        skip = None
        if v.endswith("-captured") and device.type != "cuda":
            skip = "CUDA graphs need a CUDA device"
        elif v == "compile" and args.compile == "none":
            skip = "--compile none"
        elif v.startswith("fused") and not chk["ok"]:
            skip = "the fused step failed its check against float64: not timed"
        trainer = Trainer(net, dtype, device, capturable=v.endswith("-captured"))
        run = None
        if skip is None:
            try:
                if v.endswith("-captured"):
                    run = _capture(trainer, task, device)
                elif v == "compile":
                    run, scope, notes = _compile(trainer, task, log)
                    rec.update(compile_scope=scope, compile_notes=notes)
                    if run is None:
                        skip = "; ".join(notes)
                else:
                    # bound now: a later variant rebinds trainer and task (_paired)
                    run = functools.partial(trainer.step, task)
            except Exception as e:  # noqa: BLE001 -- one failing variant must not end the run
                skip = f"{type(e).__name__}: {str(e)[:300]}"
        if skip is not None:
            rec["skipped"] = skip
            log(f"    {v:<18} skipped: {skip[:120]}")
            records.append(rec)
            continue
        for _ in range(args.warmup):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        losses = _losses(trainer, run, args.steps, device)
        if device.type == "cuda":  # the training steps' peak (a captured graph's pool too)
            rec["peak_mb"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
        tail = losses[-min(10, len(losses)):]
        rec.update(loss_first=losses[0], loss_last=losses[-1], loss_final=sum(tail) / len(tail),
                   loss_tail_median=statistics.median(losses[-min(
                       TAIL, max(10, len(losses) // 5)):]),
                   loss_curve={i: losses[i] for i in range(0, len(losses), 25)},
                   steps=args.steps, finite=all(math.isfinite(x) for x in losses))
        passes = []
        for _ in range(args.passes):
            passes.append(time_ms(run, device, args.repeats, args.target_ms))
        med, lo, hi = passes[0]
        rec.update(median_ms=med, min_ms=lo, max_ms=hi, pass_medians_ms=[p[0] for p in passes],
                   rows_per_s=N / med * 1e3, timing="cuda-events" if device.type == "cuda"
                   else "host-clock")
        if device.type == "cuda" and not v.endswith("-captured") and v != "compile":
            try:
                rec["device_ms_by_phase"] = breakdown(trainer, task, device)
            except Exception as e:  # noqa: BLE001 -- the timing stands without it
                rec["device_ms_by_phase"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        log(f"    {v:<18} {med:9.4f} ms/step  loss after {args.steps}: {rec['loss_final']:.5f}")
        records.append(rec)
        if v in ("eager", "fused"):
            python_runs[v] = run
        del trainer, run
        torch._dynamo.reset()
    _paired(python_runs, records, device, args)
    for r in records:
        if "paired_python_ms" in r:
            log(f"    {r['variant']:<18} {r['paired_python_ms']:9.4f} ms/step from Python, "
                "interleaved with the other")
    _agreement(records)
    return records


def _paired(runs: dict, records: list, device, args) -> None:
    """Eager and fused from Python timed again with their repeats taken in turn, into
    their records' ``paired_python_ms`` (median): the H200 host's speed drifts by tens of
    percent within a process and up to 2x between processes, and timed one after the
    other that drift lands on whichever variant ran then. Runs once, then forgets the
    runs (their nets and optimizers)."""
    if len(runs) == 2:
        per = {k: [] for k in runs}
        for _ in range(max(args.repeats, 5)):
            for k, run in runs.items():
                per[k].append(time_ms(run, device, 1, args.target_ms)[0])
        for r in records:
            if r["variant"] in per:
                r["paired_python_ms"] = statistics.median(per[r["variant"]])
    runs.clear()


def _agreement(records):
    """Each timed record: its final loss over the eager one's, and whether all agree."""
    done = [r for r in records if "loss_final" in r and r["variant"] != "fused-first-order"]
    if not done:
        return
    key = "loss_tail_median"
    ref = next((r[key] for r in done if r["variant"] == "eager"), done[0][key])
    vals = [r[key] for r in done]
    agree = max(vals) <= (1 + AGREE) * min(vals) and all(r["finite"] for r in done)
    for r in done:
        r["loss_vs_eager"] = r[key] / ref
        r["losses_agree"] = agree


def run_steps(args, checkpoint=None) -> dict:
    device = torch.device(args.device if args.device != "auto" else
                          ("cuda" if torch.cuda.is_available() else "cpu"))
    tiny = args.tiny or device.type == "cpu"
    dtypes = args.dtype or (["float32"] if tiny else ["float16", "bfloat16"])
    names = args.configs or list(CONFIGS)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    result = {"schema": SCHEMA, "env": environment(device), "records": [], "notes": [
        "ms per step: a whole step (sample, encode, MLP, loss, backward, Adam), back to back",
        f"loss_final: mean loss of the last 10 of {args.steps} steps from the same seed and "
        f"weights; loss_tail_median: the median of the last {TAIL} (a fifth of shorter "
        "runs, at least 10); losses_agree: every "
        f"variant's loss_tail_median within {AGREE:.0%} of the others (the fp16 eikonal "
        "step's losses spike now and then, eager's and fused's at different steps: a mean "
        "of the last 10 compared one spike); loss_curve: every 25th step's loss",
        "half precision: parameters in the dtype, Adam over float32 master copies",
        "device_ms_by_phase: torch.profiler, eager and fused only (CUDA)",
        "paired_python_ms: eager and fused from Python again, their timed repeats taken in "
        "turn (the median): the comparison of the two from Python",
        "peak_mb: torch.cuda.max_memory_allocated over the loss run's steps (CUDA)"]}
    plan = [(CONFIGS[n], N, d) for n in names for N in (args.batch or
            ([2 ** 10] if tiny else CONFIGS[n].batches)) for d in dtypes]
    for i, (cfg, N, d) in enumerate(plan, 1):
        log(f"[{i}/{len(plan)}] {cfg.name} N={N} {d}")
        result["records"] += bench_case(cfg, N, d, device, args, log)
        if checkpoint is not None:
            checkpoint(result)
    return result


def summary(result) -> str:
    lines = [f"{'config':<12} {'N':>8} {'dtype':<8} {'variant':<18} {'ms':>9} {'loss':>9} "
             f"{'agree':>5} {'paired':>9}"]
    for r in result["records"]:
        if "skipped" in r:
            lines.append(f"{r['config']:<12} {r['N']:>8} {r['dtype']:<8} {r['variant']:<18} "
                         f"skipped: {r['skipped'][:60]}")
            continue
        lines.append(f"{r['config']:<12} {r['N']:>8} {r['dtype']:<8} {r['variant']:<18} "
                     f"{r['median_ms']:>9.4f} {r['loss_final']:>9.5f} "
                     f"{str(r.get('losses_agree', '-')):>5}"
                     + (f" {r['paired_python_ms']:>9.4f}" if "paired_python_ms" in r else ""))
    return "\n".join(lines)


def cmd_steps(args) -> int:
    if args.tiny:
        args.steps = args.steps or 20
        args.repeats, args.passes, args.target_ms = min(args.repeats, 3), 1, 5.0
    args.steps = args.steps or 500
    args.warmup = 2 if args.tiny else 10
    what = "fusedmlp bench --suite steps" + "".join(
        f" --{k} {' '.join(map(str, v))}" for k, v in
        (("configs", args.configs), ("batch", args.batch), ("dtype", args.dtype)) if v) \
        + (" --tiny" if args.tiny else "")
    writer = results.run_writer(args.out, args.run, what, "steps")
    write = writer.write  # after every case: a run cut short keeps what it timed

    result = run_steps(args, checkpoint=write)
    write(result, final=True)
    print(summary(result))
    print(results.where_written(writer))
    return 0


def add_arguments(p) -> None:
    """The steps suite's own options (``--batch``, ``--dtype``, ``--out`` are shared)."""
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS),
                   help="--suite steps: which step configs (default both)")
    p.add_argument("--steps", type=int, default=None,
                   help="--suite steps: training steps before the final loss (default 500)")
    p.add_argument("--tiny", action="store_true",
                   help="--suite steps: 2^10 rows, 20 steps, float32 (a smoke run)")
