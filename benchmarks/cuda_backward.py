"""The cuda backend's backward kernel (kernels/cuda/fused_mlp_backward_sm90.cu) beside the
triton backend's (the Gluon backward on sm_90), in one process on one input: each checked
against float64 autograd first, then timed; and the train step (forward without saving,
then the backward of x and every weight) of each. Appends the run to the machine's
results table.

    PYTHONPATH=. python benchmarks/cuda_backward.py [--out T.jsonl]
        [--config narrow-w64] [--rows 4194304] [--dtype float16]

Sets FUSEDMLP_CUDA_BACKWARD=1 for itself (the kernel is off by default until its GPU
tests pass). Check: grad_x, every weight and bias gradient, each as the norm of its error
over the norm of the float64 gradient, within the suite's tolerance of the dtype (the max
|error| over the largest |value| is recorded too, not gated on: at 2^22 rows some relu
pre-activations round to the other side of 0 in 16 bits, and those units' gradients
differ from float64's whole; on the H200 triton and cuda both read 0.29 there, equal to
the last digit, h200-cuda-bwd-narrow-w64-float16-20261205b); the outputs are poisoned (NaN-filled grad_x) so a value the kernel never wrote fails. A wrong
backend is reported WRONG and not timed. Times: device events, back-to-back calls, the
median of --repeats runs after warm-up; the floor is fusedmlp bench's (the train step's
FLOPs at the 8192^3 matmul rate, or its minimal bytes at the copy rate, measured here).
Then the host time of one backward call from Python at 2^14 rows, the backends' rounds
interleaved (fusedmlp_xpu.bench.narrow.interleaved_us).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

from fusedmlp_xpu import dispatch
from fusedmlp_xpu.bench import configs
from fusedmlp_xpu.bench import narrow as bench
from fusedmlp_xpu.backends import cuda as cuda_backend, cuda_build, memory
from fusedmlp_xpu.bench.results import RunWriter
from fusedmlp_xpu.bench.tools import add_output_arguments, environment
from fusedmlp_xpu.spec import MLPSpec

from cuda_forward import TOLERANCE, median_ms

SCHEMA = "fusedmlp-bench-cuda-backward/1"


def reference_grads(x, gy, weights, biases, spec):
    """(grad_x, weight gradients, bias gradients) of the reference's float64 forward."""
    xd = x.double().requires_grad_()
    wd = [w.double().requires_grad_() for w in weights]
    bd = None if biases is None else [b.double().requires_grad_() for b in biases]
    sd = MLPSpec(spec.widths, spec.activation, spec.output_activation, spec.bias, torch.float64)
    y, _ = dispatch.REGISTRY["reference"].forward(xd, wd, bd, sd, False)
    params = [xd, *wd, *(bd or [])]
    g = torch.autograd.grad(y, params, gy.double())
    n = len(wd)
    return g[0], list(g[1:1 + n]), list(g[1 + n:])


def errors(got, want) -> dict:
    gx, gw, gb = got
    rx, rw, rb = want

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()
    out = {"grad_x": rel(gx, rx)}
    out.update({f"grad_w{i}": rel(a, b) for i, (a, b) in enumerate(zip(gw, rw))})
    out.update({f"grad_b{i}": rel(a, b) for i, (a, b) in enumerate(zip(gb, rb))})
    return out


def max_errors(got, want) -> dict:
    """The largest |error| of each gradient over its largest |value| (recorded only)."""
    names = ["grad_x"] + [f"grad_w{i}" for i in range(len(got[1]))] + [
        f"grad_b{i}" for i in range(len(got[2]))]
    pairs = [(got[0], want[0]), *zip(got[1], want[1]), *zip(got[2], want[2])]
    return {n: ((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
            for n, (a, b) in zip(names, pairs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arguments(p)
    p.add_argument("--config", default="narrow-w64", choices=sorted(configs.CONFIGS))
    p.add_argument("--rows", type=int, default=2**22)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    writer = RunWriter(args.out, args.run, "benchmarks/cuda_backward.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "cuda-backward")
    if not torch.cuda.is_available():
        p.error("needs an NVIDIA GPU")
    os.environ[cuda_backend.BACKWARD_ENV] = "1"
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    cfg = configs.get(args.config)
    widths = ((cfg.in_features,) + (cfg.hidden_features,) * cfg.hidden_layers
              + (cfg.out_features,))
    spec = MLPSpec(widths, cfg.activation, cfg.output_activation, cfg.bias, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(args.rows, widths[0], device=device, dtype=dtype, generator=gen)
    gy = torch.randn(args.rows, widths[-1], device=device, dtype=dtype, generator=gen)
    weights = [(torch.randn(n, k, device=device, generator=gen) / k ** 0.5).to(dtype)
               for k, n in zip(widths[:-1], widths[1:])]
    biases = ([(torch.randn(n, device=device, generator=gen) * 0.1).to(dtype)
               for n in widths[1:]] if cfg.bias else None)
    want = reference_grads(x, gy, weights, biases, spec)
    ceil = bench.ceilings(device, [args.dtype])
    floor = bench._floor_ms(cfg, spec, args.rows, args.dtype, "train", ceil)
    result = dict(schema=SCHEMA, env=environment(device), config=args.config, rows=args.rows,
                  dtype=args.dtype, widths=list(widths), ceilings=ceil, train_floor_ms=floor,
                  backends={})
    print(f"{args.config} {args.rows} rows {args.dtype}: train-step floor {floor:.4f} ms")
    needs = (True, True, bool(cfg.bias))
    real = memory.new_empty

    def poisoned(*shape, like, dtype=None):
        return real(*shape, like=like, dtype=dtype).fill_(float("nan"))

    for name in ("triton", "cuda"):
        be = dispatch.REGISTRY[name]
        rec = {}
        ok, why = be.supports(spec, device)
        if ok:
            ok, why = be.train_support(spec, device)
        if name == "cuda":
            c, _ = cuda_build.backward_config(spec, True, True, cuda_backend.device_info(device)[2])
            rec["kernel"] = None if c is None else c.describe()
        if not ok:
            rec["unsupported"] = why
            print(f"{name}: cannot train this config: {why}")
            result["backends"][name] = rec
            continue

        def backward(i, be=be):
            return be.backward(gy, x, weights, biases, None, spec, needs)

        def step(i, be=be):
            be.forward(x, weights, biases, spec, False)
            return be.backward(gy, x, weights, biases, None, spec, needs)
        memory.new_empty = poisoned
        try:
            got = backward(0)
        finally:
            memory.new_empty = real
        torch.cuda.synchronize(device)
        rec["errors"] = errors(got, want)
        rec["max_errors"] = max_errors(got, want)
        rec["ok"] = max(rec["errors"].values()) <= TOLERANCE[dtype]
        if rec["ok"]:
            rec["backward_ms"] = median_ms(device, backward, args.repeats)
            rec["step_ms"] = median_ms(device, step, args.repeats)
            rec["step_floor_multiple"] = rec["step_ms"] / floor if floor else None
        result["backends"][name] = rec
        worst = max(rec["errors"], key=rec["errors"].get)
        print(f"{name}: worst error {rec['errors'][worst]:.2e} ({worst})  " + (
            f"backward {rec['backward_ms']:.4f} ms, step {rec['step_ms']:.4f} ms "
            f"({rec['step_floor_multiple']:.2f}x floor)" if rec["ok"] else "WRONG"))
        writer.write(result)
    # host time of one backward call from Python, both backends in turn, at rows the GPU
    # keeps up with (the #39 target: no more than triton's)
    ready = [n for n in ("triton", "cuda") if result["backends"][n].get("ok")]
    if ready:
        rows = 2 ** 14
        xs, gys = x[:rows], gy[:rows]
        fns = {n: (lambda be=dispatch.REGISTRY[n]: be.backward(gys, xs, weights, biases, None,
                                                              spec, needs)) for n in ready}
        result["host_rows"] = rows
        result["host_us"] = bench.interleaved_us(fns, device, n=1400)
        print("host us a backward call at 2^14 rows: " + ", ".join(
            f"{k} {v:.1f}" for k, v in result["host_us"].items()))
    writer.write(result, final=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
