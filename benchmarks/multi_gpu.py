"""DDP and FSDP2 over a model holding the fused ops: two GPUs over NCCL, or two CPU
processes over gloo, the same code.

    torchrun --nproc-per-node 2 benchmarks/multi_gpu.py                       # 2 GPUs
    torchrun --nproc-per-node 2 benchmarks/multi_gpu.py --device cpu --tiny --steps 5 --out m.jsonl

Per config (narrow-w64, narrow-w128) the model is a FusedMLP of that width (in 64, out
64, 4 hidden layers, relu, no bias) on a batch of points, beside a GatedMLP of
wide-swiglu's shape (d 4096, hidden 14336, one block; toy sizes with --tiny) on a batch of
tokens feeding a plain nn.Linear head. Each rank trains on its half of the whole batch
(SGD, --steps steps):

- DDP (the run's dtype: bf16 on a GPU, fp32 on the CPU): the ranks' parameters, gathered,
  must be bit-identical.
- FSDP2 (fully_shard per block and at the root; on a GPU MixedPrecisionPolicy(param_dtype
  bf16, reduce_dtype fp32) over fp32 parameters): the gathered parameters must match one
  process trained on the whole batch in the same arithmetic (fp32 master weights, forward
  and backward on a bf16 copy, gradients taken to fp32) within the suite's tolerance
  (tests/conftest.py: 1e-5 relative in fp32, 2e-2 in bf16).
- The backends the fused modules take (fm.explain for the FusedMLP, the gated module's
  own choice for the GatedMLP), from every rank: not 'reference' on a GPU; on the CPU the
  reference is the automatic choice, and that is what is recorded.
- A DDP train step captured in a CUDA graph and replayed (CUDA only), and one step of
  torch.compile over the DDP-wrapped model.
- Weak scaling: ms per train step per device (device events on GPUs, a host clock on the
  CPU; warm-up first, median of --repeats batches of back-to-back steps) for the plain
  model alone and for DDP and FSDP2 on the same per-device batch;
  scaling_efficiency = t_single / t_multi.

Rank 0 appends the run (fusedmlp-multi-gpu/1), its text log in the run record, to the
results table (--out, default the machine's).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu import gated
from fusedmlp_xpu.bench.tools import add_output_arguments, calls_ms, environment, save_run, sync

SCHEMA = "fusedmlp-multi-gpu/1"
CONFIGS = {"narrow-w64": 64, "narrow-w128": 128}  # the benchmark configs' names: hidden width W
# per-device batch and the gated block's size: rows of points, tokens, d, hidden
SHAPES = {"gpu": dict(rows=2**18, tokens=8192, d=4096, hidden=14336),
          "tiny": dict(rows=64, tokens=16, d=32, hidden=96)}
HEAD_OUT = 64
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # tests/conftest.py's TOLERANCE
# DDP with CUDA graphs: the DDP reducer sets itself up over its first iterations, which
# must run eagerly on the capture's side stream before capturing (PyTorch's CUDA-graph
# notes: "at least 11 DDP-enabled eager iterations")
GRAPH_WARMUP = 11


class Net(nn.Module):
    """points [N, 64] -> FusedMLP -> [N, 64]; tokens [M, d] -> GatedMLP -> Linear -> [M, 64]."""

    def __init__(self, width, d, hidden, device, dtype):
        super().__init__()
        kw = dict(device=device, dtype=dtype)
        self.narrow = fm.FusedMLP(64, 64, width, 4, activation="relu", bias=False, **kw)
        self.ffn = fm.GatedMLP(d, hidden, activation="silu", **kw)
        self.head = nn.Linear(d, HEAD_OUT, **kw)

    def forward(self, points, tokens):
        return self.narrow(points), self.head(self.ffn(tokens))


def make_model(width, shapes, device, dtype) -> Net:
    torch.manual_seed(0)  # the same initial parameters on every rank
    return Net(width, shapes["d"], shapes["hidden"], device, dtype)


def make_batch(shapes, world, device, dtype) -> list[torch.Tensor]:
    """The whole batch (world x the per-device batch): points, tokens and their targets."""
    g = torch.Generator().manual_seed(1)
    n, m = shapes["rows"] * world, shapes["tokens"] * world
    sizes = [(n, 64), (m, shapes["d"]), (n, 64), (m, HEAD_OUT)]
    return [torch.randn(s, generator=g).to(device, dtype) for s in sizes]


def shard(batch, rank, world) -> list[torch.Tensor]:
    return [t[rank * len(t) // world:(rank + 1) * len(t) // world] for t in batch]


def loss_fn(out, batch) -> torch.Tensor:
    # means: DDP and FSDP average gradients over ranks, so equal shards give the gradient
    # of the whole batch's mean
    return sum(((y.float() - t.float()) ** 2).mean() for y, t in zip(out, batch[2:]))


def make_step(model, opt, batch):
    def step(_=None):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(batch[0], batch[1]), batch)
        loss.backward()
        opt.step()
        return loss
    return step


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


def gather(t: torch.Tensor, world) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous())
    return out


def gather_obj(obj, world) -> list:
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def ranks_identical(model, world) -> dict:
    mine = flat(model.parameters())
    got = gather(mine, world)
    return {"ranks_identical": all(torch.equal(g, got[0]) for g in got),
            "finite": bool(torch.isfinite(mine).all()), "numel": mine.numel()}


def time_step(step, device, args) -> dict:
    """ms per step: warm-up, then the median of --repeats batches of --calls steps, the
    ranks starting each batch together."""
    for _ in range(args.warmup):
        step()
    sync(device)
    ts = []
    for _ in range(args.repeats):
        if dist.is_initialized():
            dist.barrier()
        ts.append(calls_ms(device, step, args.calls))
    return {"median_ms": statistics.median(ts), "min_ms": min(ts), "max_ms": max(ts)}


def backends(model: Net, batch, world) -> dict:
    """The backend each fused module takes for this batch, from every rank."""
    points, tokens = batch[0], batch[1]
    narrow = fm.explain(model.narrow, points).backend
    # the gated module's choice: the wide Triton kernels ('triton') or the reference
    impl = gated.choose(tokens.device, model.ffn.backend)
    ffn = getattr(impl, "name", "triton")  # the wide kernels' module carries no name
    route = fm.explain(model.ffn, tokens).route(tokens, train=True)
    return {"narrow": gather_obj(narrow, world), "gated": gather_obj(ffn, world),
            "gated_train_route": gather_obj(route, world)}


def reference_train(model: Net, batch, steps, lr, compute_dtype) -> Net:
    """One process on the whole batch in FSDP2's mixed-precision arithmetic: fp32 master
    parameters, forward and backward on a compute_dtype copy, gradients taken to fp32."""
    work = copy.deepcopy(model).to(compute_dtype)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        with torch.no_grad():
            for w, m in zip(work.parameters(), model.parameters()):
                w.copy_(m)
        work.zero_grad(set_to_none=True)
        out = work(batch[0].to(compute_dtype), batch[1].to(compute_dtype))
        loss_fn(out, batch).backward()
        for w, m in zip(work.parameters(), model.parameters()):
            m.grad = w.grad.float()
        opt.step()
    return model


def run_ddp(cfg, width, args, ctx) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    device, dtype, world = ctx["device"], ctx["dtype"], ctx["world"]
    model = make_model(width, ctx["shapes"], device, dtype)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    step = make_step(ddp, opt, ctx["local"])
    losses = [step().item() for _ in range(args.steps)]
    r = {"steps": args.steps, "loss_first": losses[0], "loss_last": losses[-1],
         **ranks_identical(model, world), "backends": backends(model, ctx["local"], world)}
    r["time"] = time_step(step, device, args)
    return r


def run_graph(cfg, width, args, ctx) -> dict:
    """A DDP train step captured in a CUDA graph, then replayed: the ranks stay identical."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device, dtype, world = ctx["device"], ctx["dtype"], ctx["world"]
    if device.type != "cuda":
        return {"ok": None, "skipped": "CUDA graphs need a CUDA device"}
    try:
        model = make_model(width, ctx["shapes"], device, dtype)
        ddp = DDP(model, device_ids=[device.index])
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
        step = make_step(ddp, opt, ctx["local"])  # the batch tensors are the static inputs
        s = torch.cuda.Stream(device)
        s.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(s):
            for _ in range(GRAPH_WARMUP):
                step()
        torch.cuda.current_stream(device).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            loss = step()
        for _ in range(3):
            g.replay()
        sync(device)
        r = {"replays": 3, "loss": loss.item(), **ranks_identical(model, world)}
        r["time"] = time_step(lambda _=None: g.replay(), device, args)
        r["ok"] = r["ranks_identical"] and r["finite"]
        return r
    except Exception as e:  # recorded; the run goes on to the other checks
        return {"ok": False, "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=4)}


def run_compile(cfg, width, args, ctx) -> dict:
    """One train step of torch.compile over the DDP-wrapped model."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device, dtype, world = ctx["device"], ctx["dtype"], ctx["world"]
    try:
        model = make_model(width, ctx["shapes"], device, dtype)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        compiled = torch.compile(ddp, backend=args.compile_backend)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
        t = time.perf_counter()
        loss = make_step(compiled, opt, ctx["local"])().item()
        sync(device)
        r = {"backend": args.compile_backend, "steps": 1, "loss": loss,
             "seconds": time.perf_counter() - t, **ranks_identical(model, world)}
        # the compiled step's loss against eager's, from the same initial parameters
        eager = make_model(width, ctx["shapes"], device, dtype)
        with torch.no_grad():
            r["loss_eager"] = loss_fn(eager(*ctx["local"][:2]), ctx["local"]).item()
        r["ok"] = r["ranks_identical"] and r["finite"]
        return r
    except Exception as e:
        return {"ok": False, "backend": args.compile_backend, "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc(limit=4)}
    finally:
        torch._dynamo.reset()


def run_fsdp(cfg, width, args, ctx) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device, world = ctx["device"], ctx["world"]
    compute = ctx["dtype"]
    model = make_model(width, ctx["shapes"], device, torch.float32)
    start = flat(model.parameters())
    # the mesh on the run's device type: left out, fully_shard takes CUDA wherever it is
    # present and moves a CPU (gloo) run's parameters there
    kw = {"mesh": init_device_mesh(device.type, (world,))}
    if compute != torch.float32:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    for block in (model.narrow, model.ffn):
        fully_shard(block, **kw)
    fully_shard(model, **kw)  # the head's parameters, and the root
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    step = make_step(model, opt, ctx["local"])
    losses = [step().item() for _ in range(args.steps)]
    got = flat(p.full_tensor() for p in model.parameters())  # DTensor shards -> whole
    ref = make_model(width, ctx["shapes"], device, torch.float32)
    want = flat(reference_train(ref, ctx["whole"], args.steps, args.lr, compute).parameters())
    err = ((got - want).norm() / want.norm()).item()
    moved = (want - start).norm()
    tol = TOL[compute]
    r = {"steps": args.steps, "loss_first": losses[0], "loss_last": losses[-1],
         "compute_dtype": str(compute).replace("torch.", ""), "reduce_dtype": "float32",
         "rel_error": err, "tolerance": tol,
         "rel_error_of_update": ((got - want).norm() / moved).item(),
         "update_rel": (moved / start.norm()).item(),
         "ranks_identical": all(torch.equal(g, got) for g in gather(got, world))}
    r["rel_error_ranks"] = gather_obj(err, world)
    r["match"] = all(e < tol for e in r["rel_error_ranks"]) and r["update_rel"] > 0
    r["time"] = time_step(step, device, args)
    return r


def run_single(cfg, width, args, ctx) -> dict:
    """The plain model on this device alone, on the same per-device batch."""
    model = make_model(width, ctx["shapes"], ctx["device"], ctx["dtype"])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    return {"time": time_step(make_step(model, opt, ctx["local"]), ctx["device"], args)}


def run_config(cfg, width, args, ctx, log) -> dict:
    world = ctx["world"]
    rec = {"config": cfg, "width": width, **ctx["shapes"]}
    rec["single"] = run_single(cfg, width, args, ctx)
    rec["ddp"] = run_ddp(cfg, width, args, ctx)
    rec["cuda_graph"] = run_graph(cfg, width, args, ctx)
    rec["compile"] = run_compile(cfg, width, args, ctx)
    rec["fsdp"] = run_fsdp(cfg, width, args, ctx)
    # the step is synchronous across ranks: each rank's median, the slowest counts
    for kind in ("single", "ddp", "fsdp"):
        rec[kind]["time"]["median_ms_ranks"] = gather_obj(rec[kind]["time"]["median_ms"], world)
    t1 = max(rec["single"]["time"]["median_ms_ranks"])
    rec["scaling_efficiency"] = {k: t1 / max(rec[k]["time"]["median_ms_ranks"])
                                 for k in ("ddp", "fsdp")}
    b = rec["ddp"]["backends"]
    want_fused = ctx["device"].type != "cpu"
    rec["backends_ok"] = all((name != "reference") == want_fused
                             for name in b["narrow"] + b["gated"])
    g = rec["cuda_graph"]
    log(f"{cfg}: single {t1:.3f} ms/step; "
        + "; ".join(f"{k} {max(rec[k]['time']['median_ms_ranks']):.3f} ms/step, efficiency "
                    f"{rec['scaling_efficiency'][k]:.3f}" for k in ("ddp", "fsdp")))
    log(f"{cfg}: ddp ranks identical {rec['ddp']['ranks_identical']}, loss "
        f"{rec['ddp']['loss_first']:.4g} -> {rec['ddp']['loss_last']:.4g}; fsdp rel error "
        f"{rec['fsdp']['rel_error']:.2e} (tol {rec['fsdp']['tolerance']:.0e}, "
        f"{rec['fsdp']['rel_error_of_update']:.2e} of the update) match {rec['fsdp']['match']}")
    log(f"{cfg}: backends narrow {b['narrow']} gated {b['gated']} ok {rec['backends_ok']}; "
        f"cuda graph {g.get('ok')} {g.get('skipped') or g.get('error') or ''}; compile "
        f"({args.compile_backend}) {rec['compile']['ok']} {rec['compile'].get('error', '')}")
    return rec


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arguments(p)  # rank 0 appends the run, its log in the run record
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda when there is one")
    p.add_argument("--tiny", action="store_true", help="toy shapes (CPU runs, smoke tests)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--steps", type=int, default=50, help="training steps for the checks")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    p.add_argument("--repeats", type=int, default=7, help="timed batches (median)")
    p.add_argument("--calls", type=int, default=5, help="steps per timed batch")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cpu" and not args.tiny:
        p.error("on the CPU use --tiny")
    local = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        # NVLink multicast (NVLS) stays off; graphs with collectives need the watchdog's
        # async error handling off (PyTorch's CUDA-graph notes on DDP)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1)
                                  // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
        backend = "gloo"
    dist.init_process_group(backend)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        shapes = SHAPES["tiny" if args.tiny else "gpu"]
        whole = make_batch(shapes, world, device, dtype)
        ctx = dict(device=device, dtype=dtype, world=world, shapes=shapes, whole=whole,
                   local=shard(whole, rank, world))
        lines = []

        def log(text):
            if rank == 0:
                print(text, flush=True)
                lines.append(text)

        log(f"{world} ranks, {backend}, {device.type}, {str(dtype).replace('torch.', '')}, "
            f"per-device batch {shapes['rows']} points + {shapes['tokens']} tokens, "
            f"gated d {shapes['d']} hidden {shapes['hidden']}, {args.steps} steps")
        records = [run_config(cfg, CONFIGS[cfg], args, ctx, log) for cfg in args.configs]
        if rank == 0:
            env = environment(device)
            env.update(world_size=world, dist_backend=backend,
                       NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"))
            if backend == "nccl":
                env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            notes = [
                "single: the plain model (no wrapper, no collectives) on one device, same "
                "per-device batch and dtype as DDP; scaling_efficiency = single median_ms / "
                "the slowest rank's median_ms (weak scaling)",
                "fsdp: fp32 parameters; on a GPU MixedPrecisionPolicy(param_dtype=bfloat16, "
                "reduce_dtype=float32); compared with one process on the whole batch in the "
                "same arithmetic (reference_train), relative L2 error against the suite's "
                "tolerance; rel_error_of_update relates it to the parameters' movement",
                "backends: fm.explain(model.narrow, points).backend and the GatedMLP's own "
                "choice, per rank; gated_train_route: what an eager train call of these rows "
                "runs (torch ops at the row counts backends/triton/routes.py names)",
                f"torch.compile backend: {args.compile_backend}",
            ]
            if device.type == "cpu":
                notes.append("cpu: the reference backend is the automatic choice there (the "
                             "Triton interpreter is for tests); times are not a result")
            out = {"schema": SCHEMA, "env": env, "args": vars(args), "records": records,
                   "notes": notes, "seconds": time.perf_counter() - t_start, "log": lines}
            save_run(args.out, out, args.run, "benchmarks/multi_gpu.py " + " ".join(
                argv if argv is not None else sys.argv[1:]), "multi-gpu")
            log(f"took {out['seconds']:.0f} s")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
