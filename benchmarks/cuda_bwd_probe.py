"""Is a wrong gradient of the CUDA C++ backward a race or a rounding? One question, asked
on many fresh draws: for each case, the backward of the same inputs runs three times
(the second after a launch of another configuration, whose shared-memory layout differs),
and each result is compared bit for bit with the first and against float64.

Nondeterminism (repeats that differ) is a race; a deterministic result past the
tolerance is the arithmetic. Prints one line a case and, with --out, writes them
into --out (a JSON file, for ``fusedmlp_xpu.bench.results log``)::

    FUSEDMLP_CUDA_BACKWARD=1 python3 benchmarks/cuda_bwd_probe.py --draws 40 --out P.json --run ID
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from conftest import TOLERANCE, make_params, reference, rel_error  # noqa: E402
from test_cuda_backward import kernel_z  # noqa: E402

from fusedmlp_xpu.backends import cuda as cuda_backend  # noqa: E402
from fusedmlp_xpu.spec import MLPSpec  # noqa: E402

W64 = (64,) * 6
CASES = [  # (widths, act, out_act, bias, dtype, rows): the suite's failures, and neighbours
    (W64, "relu", "none", False, torch.float16, 65),
    (W64, "relu", "none", False, torch.float16, 1037),
    ((3, 16, 16, 5), "tanh", "sigmoid", True, torch.bfloat16, 1),
    ((3, 16, 16, 5), "tanh", "sigmoid", True, torch.bfloat16, 65),
    ((32,) + (64,) * 4 + (16,), "softplus", "none", True, torch.float16, 65),
]
OTHER = ((64, 32, 32, 64), "relu", "none", False, torch.float16, 257)  # another layout


def inputs(case, gen_seed):
    widths, act, out_act, bias, dtype, rows = case
    torch.manual_seed(gen_seed)
    dev = torch.device("cuda")
    ws, bs = make_params(widths, bias, dtype, dev)
    x = torch.randn(rows, widths[0], device=dev).to(dtype)
    gy = torch.randn(rows, widths[-1], device=dev).to(dtype)
    spec = MLPSpec(widths, act, out_act, bias, dtype)
    return spec, ws, bs, x, gy


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--draws", type=int, default=30, help="fresh draws a case (default 30)")
    p.add_argument("--out", help="a JSON file for the cases' lines")
    p.add_argument("--run", help="the run id (with --out)")
    p.add_argument("--one", type=int, metavar="I",
                   help="only launch case I twice with all gradients, no checks: one "
                   "configuration in the process, for compute-sanitizer --tool racecheck")
    p.add_argument("--launches", type=int, default=2, help="with --one: how many (default 2)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA device")
    # the kernel is held back until racecheck clears it: this probe is part of that work
    cuda_backend.RACECHECK_CLEAN = "probe"
    be = cuda_backend.CudaBackend()
    if args.one is not None:
        case = CASES[args.one]
        spec, ws, bs, x, gy = inputs(case, 7)
        for _ in range(args.launches):
            be.backward(gy, x, ws, bs, None, spec, (True, True, case[3]))
        torch.cuda.synchronize()
        print(f"case {args.one} launched {args.launches}x: {case[:4]} {case[4]} rows={case[5]}")
        return 0
    o_spec, o_ws, o_bs, o_x, o_gy = inputs(OTHER, 12345)
    lines = []
    for case in CASES:
        widths, act, out_act, bias, dtype, rows = case
        tol = TOLERANCE[dtype]
        needs = (True, True, bias)
        over = differ = 0
        worst, worst_rows = 0.0, []
        for d in range(args.draws):
            spec, ws, bs, x, gy = inputs(case, 1000 + d)
            first = be.backward(gy, x, ws, bs, None, spec, needs)
            be.backward(o_gy, o_x, o_ws, o_bs, None, o_spec, (True, True, False))
            again = [be.backward(gy, x, ws, bs, None, spec, needs) for _ in range(2)]
            torch.cuda.synchronize()
            flat = lambda g: [g[0], *g[1], *g[2]]  # noqa: E731
            if any(not torch.equal(a, b) for g in again for a, b in zip(flat(first), flat(g))):
                differ += 1
            _, rx, rw, rb = reference(x, ws, bs, act, out_act, grad_y=gy,
                                      kinks_at=kernel_z(x, ws, bs, act, out_act))
            err = rel_error(first[0], rx)
            if err > worst:
                worst = err
                row_err = (first[0].double().cpu() - rx).norm(dim=1) / rx.norm()
                worst_rows = row_err.topk(min(3, rows)).indices.tolist()
            over += err >= tol
        line = {"case": f"{widths} {act}/{out_act} bias={bias} {str(dtype)[6:]} rows={rows}",
                "draws": args.draws, "tol": tol, "gx_over_tol": int(over),
                "repeats_differ": differ, "worst_gx_rel_error": round(worst, 5),
                "worst_rows": worst_rows}
        lines.append(line)
        print(json.dumps(line), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"run": args.run, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "cases": lines}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
