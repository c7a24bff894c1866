"""The second-order kernel (the eikonal node's backward, narrow/second_order_kernels.py)
at a sweep of tunings, beside the same closed form as torch ops and eager torch's double
backward (and, for scale, the step's other MLP kernels: the training forward, the first
backward that computes g, the weights' backward of y's own loss term), on the sdf-eikonal
net (32 -> 64 x 4 -> 16, softplus, biases). Writes JSON.

    PYTHONPATH=. python benchmarks/second_order.py [--out T.jsonl] [--rows 262144]
        [--dtype float16] [--tunings 32x4x1 32x4x2 32x8x1 16x4x2]

A tuning is ROWSxWARPSxPER_SM (rows per block, warps per program, programs per SM), with
a trailing m for the kernel's merged weight-gradient pass (Tuning.merge_dw), or `split`:
not the one kernel but the closed form as whole-batch GEMMs and pointwise kernels, or
`fused`: the same passes with each product and its pointwise step in one kernel. Each
is checked against the closed form in float64 on the timed inputs before it is timed; one
whose error exceeds max(tolerance, 4 x the torch-op closed form's own error in that dtype)
is reported WRONG and not timed. Times: device events, back-to-back calls, the median of
``--repeats`` runs after warm-up. Without a GPU the kernel runs in Triton's interpreter
(a smoke run: keep --rows small).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fusedmlp_xpu import dispatch, second_order as so  # noqa: E402
from fusedmlp_xpu.bench import steps as bench_steps  # noqa: E402
from fusedmlp_xpu.backends.triton.narrow import second_order as kernel  # noqa: E402
from fusedmlp_xpu.bench.results import RunWriter  # noqa: E402
from fusedmlp_xpu.bench.tools import add_output_arguments, calls_ms, environment  # noqa: E402

SCHEMA = "fusedmlp-bench-second-order/1"
DEFAULT_TUNINGS = ("32x4x1", "32x4x2", "32x8x1", "16x4x1", "16x4x2", "16x8x1", "64x4x1",
                   "32x4x1m", "32x4x2m", "16x4x2m", "split", "fused")
NEEDS = (False, True, True, True)  # v, x, weights, biases: what the eikonal step asks


def checked_tuning(text: str) -> str:
    """A --tunings word, kept as spelled (the JSON's "spelling": what
    FUSEDMLP_SECOND_ORDER_TUNING takes) once Tuning.parse accepts it."""
    try:
        kernel.Tuning.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def inputs(rows: int, device, dtype):
    """The sdf net's parameters and one eikonal call's operands: x (encoded points), v (the
    sdf column's one-hot: g = d sdf / dx) and gg (a gradient at g)."""
    cfg = bench_steps.CONFIGS["sdf-eikonal"]
    fused, _ = bench_steps.make_nets(cfg, device, dtype)
    gen = torch.Generator(device=device).manual_seed(1)
    pts = torch.rand(rows, cfg.dims, device=device, generator=gen)
    x = bench_steps.encode(pts).to(dtype)
    v = torch.zeros(rows, cfg.out_features, device=device, dtype=dtype)
    v[:, 0] = 1
    gg = (0.1 * torch.randn(rows, x.shape[1], device=device, generator=gen)).to(dtype)
    ws = [w.detach() for w in fused.weights()]
    bs = [b.detach() for b in fused.biases()]
    return fused.spec(dtype), ws, bs, x, v, gg


def _flat(out):
    gv, gx, gw, gb = out
    return [gx, *gw, *gb]


def error(out, ref) -> float:
    """The largest relative error over x's, every weight's and every bias's gradient."""
    return max(((g.double() - r).norm() / r.norm().clamp_min(1e-30)).item()
               for g, r in zip(_flat(out), _flat(ref)))


def eager_double_backward(spec, ws, bs, x, v, gg):
    """Eager torch: the forward, g = (dy/dx)^T v with create_graph=True, then the gradients
    of <g, gg> for x and every parameter (what the eikonal node's backward replaces, with
    the forward and first backward it recomputes)."""
    ps = [t.detach().requires_grad_() for t in (*ws, *bs)]
    xr = x.detach().requires_grad_()
    n = spec.n_layers
    y = dispatch.REGISTRY["reference"].forward(xr, ps[:n], ps[n:], spec, False)[0]
    (g,) = torch.autograd.grad(y, xr, v, create_graph=True)
    # the last bias does not reach g: allow_unused
    return torch.autograd.grad(g, [xr, *ps], gg, allow_unused=True)


def time_ms(device, fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    n = 20 if device.type == "cuda" else 1
    return statistics.median(calls_ms(device, lambda i: fn(), n, lead=True)
                             for _ in range(repeats))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_arguments(p)
    p.add_argument("--rows", type=int, default=2 ** 18)
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    p.add_argument("--tunings", nargs="+", type=checked_tuning, default=list(DEFAULT_TUNINGS))
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    writer = RunWriter(args.out, args.run, "benchmarks/second_order.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), "second-order")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = bench_steps.DTYPES[args.dtype]
    spec, ws, bs, x, v, gg = inputs(args.rows, device, dtype)
    spec64 = spec.__class__(spec.widths, spec.activation, spec.output_activation, spec.bias,
                            torch.float64)
    ref = so.grads(gg.double(), v.double(), x.double(), [w.double() for w in ws],
                   [b.double() for b in bs], spec64, NEEDS)
    closed = lambda: so.grads(gg, v, x, ws, bs, spec, NEEDS)  # noqa: E731
    bound = max(bench_steps.TOLERANCE[args.dtype],
                bench_steps.GRAD_VS_EAGER * error(closed(), ref))
    out = {"schema": SCHEMA, "env": environment(device), "rows": args.rows,
           "dtype": args.dtype, "widths": list(spec.widths), "activation": spec.activation,
           "bias": spec.bias, "error_bound": bound, "default": str(kernel.tuning(
               device, kernel.padded_width(spec))), "tunings": []}
    for text in args.tunings:
        tune = kernel.Tuning.parse(text)
        rec = {"tuning": str(tune), "spelling": text, "block_m": tune.block_m,
               "warps": tune.warps, "per_sm": tune.per_sm, "merge_dw": tune.merge_dw,
               "split": tune.split, "fuse": tune.fuse}
        try:
            run = lambda tune=tune: kernel.second_order(  # noqa: E731
                gg, v, x, ws, bs, spec, NEEDS, tune)
            rec["max_rel_error"] = err = error(run(), ref)
            rec["ok"] = err <= bound
            rec["ms"] = time_ms(device, run, args.repeats) if rec["ok"] else None
        except Exception as e:  # noqa: BLE001 -- a tuning the device refuses is reported
            rec["ok"], rec["ms"] = False, None
            rec["failed"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        out["tunings"].append(rec)
        print(f"kernel {rec['tuning']:<28} " + (
            f"{rec['ms']:.4f} ms, error {rec['max_rel_error']:.2e}" if rec["ok"]
            else rec.get("failed") or f"WRONG: error {rec['max_rel_error']:.2e} > {bound:.2e}"),
            flush=True)
    be = dispatch.REGISTRY["triton"]
    out["first_backward_x_ms"] = time_ms(  # the eikonal node's forward (g), for scale
        device, lambda: be.backward(v, x, ws, bs, None, spec, (True, False, False)),
        args.repeats)
    # the step's other MLP kernels, for scale: the training forward (saving z where the
    # backend saves) and the backward of y's own loss term (weights and biases)
    keep = not be.recomputes(spec, device)
    saved = be.forward(x, ws, bs, spec, keep)[1] if keep else None
    gy = torch.randn(x.shape[0], spec.out_features, device=device, dtype=dtype)
    out["forward_train_ms"] = time_ms(device, lambda: be.forward(x, ws, bs, spec, keep),
                                      args.repeats)
    out["forward_saves_z"] = keep
    out["backward_weights_ms"] = time_ms(
        device, lambda: be.backward(gy, x, ws, bs, saved, spec, (False, True, True)),
        args.repeats)
    out["closed_form_torch_ops_ms"] = time_ms(device, closed, args.repeats)
    out["eager_double_backward_ms"] = time_ms(
        device, lambda: eager_double_backward(spec, ws, bs, x, v, gg), args.repeats)
    for k in ("forward_train_ms", "first_backward_x_ms", "backward_weights_ms",
              "closed_form_torch_ops_ms", "eager_double_backward_ms"):
        print(f"{k}: {out[k]:.4f}", flush=True)
    writer.write(out, final=True)
    return 0 if all(r["ok"] for r in out["tunings"]) else 1


if __name__ == "__main__":
    sys.exit(main())
