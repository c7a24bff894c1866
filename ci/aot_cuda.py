"""Compile every configuration of the cuda backend's kernels with NVRTC, no GPU needed.

    python ci/aot_cuda.py [--arch sm_90a] [--quick]

The cuda backend (fusedmlp_xpu/backends/cuda.py) compiles its kernels at run time; this
compiles, for the target architecture, each configuration the backend produces (both
kernel families for sm_90a: mma.sync and wgmma) for a table of nets (hidden 16/32/64/128
x fp16/bf16 x relu/none x bias, every activation, odd in/out widths, a deep net) exactly
as the backend would (cuda_build.forward_config: its tuning, its shared-memory count,
which the kernel static_asserts), and the sm_90a backward's (cuda_build.backward_config)
for its nets and every set of gradients, and fails on a compile error, on register spills over
cuda_build.SPILL_BUDGET, or on wgmma instructions ptxas serialized. One line per kernel:
registers, spill bytes, stack, dynamic shared memory. Needs cuda-bindings and
nvidia-cuda-nvrtc (pip install -e ".[cuda]"); compiled cubins go to the backend's disk
cache ($FUSEDMLP_CACHE_DIR/cuda).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from fusedmlp_xpu import activations  # noqa: E402
from fusedmlp_xpu.backends import cuda_build as cb  # noqa: E402
from fusedmlp_xpu.spec import MLPSpec  # noqa: E402

HALF = (torch.float16, torch.bfloat16)


def nets(quick: bool) -> list[MLPSpec]:
    """The specs to compile: the bench's narrow nets (in/out 64, 4 hidden layers) at every
    hidden width, dtype, relu/none and bias; every activation; odd widths; depth."""
    out = []
    for h in (16, 32, 64, 128):
        for dt in HALF:
            for act in ("relu", "none"):
                for bias in (False, True):
                    if quick and (dt is torch.bfloat16 or act == "none"):
                        continue
                    out.append(MLPSpec((64,) + (h,) * 4 + (64,), act, "none", bias, dt))
    names = sorted(activations.ACTIVATIONS)
    for i, act in enumerate(names if not quick else ("gelu", "softplus")):
        out.append(MLPSpec((32, 64, 64, 16), act, names[(i + 3) % len(names)], True,
                           torch.float16))
    odd = [(3, 16, 5), (17, 33, 33, 9), (1, 64, 1), (100, 128, 128, 3), (128, 16, 16, 100),
           (24, 64, 64, 40), (128, 128, 128, 128), (64,) + (64,) * 11 + (64,)]
    for widths in odd[:2] if quick else odd:
        for dt in HALF[:1] if quick else HALF:
            out.append(MLPSpec(widths, "tanh", "none", True, dt))
    return out


def backward_nets(quick: bool) -> list[MLPSpec]:
    """The backward kernel's specs (sm_90a): the bench's narrow-w64 and narrow-w32 and the
    steps' nets, every activation it takes as hidden and output activation, biases or not,
    hidden widths 16/32/64, in/out widths from 1 to 64, depth 2 to 5 layers."""
    out = []
    for dt in HALF[:1] if quick else HALF:
        out += [MLPSpec((64,) * 6, "relu", "none", False, dt),  # narrow-w64
                MLPSpec((32, 64, 64, 3), "relu", "none", False, dt),  # loop-image
                MLPSpec((32,) + (64,) * 4 + (16,), "softplus", "none", True, dt)]  # sdf
        if quick:
            continue
        acts = sorted(cb.GRAD_FROM_OUTPUT_IDS)
        names = {activations.get(n).id: n for n in activations.ACTIVATIONS}
        for i, a in enumerate(acts):
            out.append(MLPSpec((64,) * 6, names[a], names[acts[(i + 2) % len(acts)]], True, dt))
        out += [MLPSpec((64,) + (32,) * 4 + (64,), "relu", "none", False, dt),  # narrow-w32
                MLPSpec((3, 16, 16, 5), "tanh", "sigmoid", True, dt),
                MLPSpec((1, 64, 1), "tanh", "none", True, dt),
                MLPSpec((17, 64, 64, 9), "leaky_relu", "relu", True, dt),
                MLPSpec((48, 64, 64, 64, 40), "sigmoid", "none", False, dt)]
    return out


def compile_backward_one(spec, arch: str) -> int:
    """Compile the backward's configurations of ``spec`` (every gradient set); 1 a failure."""
    failed = 0
    for need_x, need_wb in ((True, True), (False, True), (True, False)):
        cfg, why = cb.backward_config(spec, need_x, need_wb)
        name = cfg.describe() if cfg else f"bwd {spec.widths}"
        if cfg is None:
            print(f"{name}: NOT SUPPORTED ({why})")
            failed += 1
            continue
        try:
            built = cb.compile_backward(cfg, arch)
        except cb.CudaToolchainError as e:
            print(f"{name}: FAILED {str(e)[:2000]}")
            failed += 1
            continue
        s = cb.ptxas_stats(built.log)
        spill = s["spill_stores"] + s["spill_loads"]
        over = "  OVER THE SPILL BUDGET" if spill > cb.SPILL_BUDGET else ""
        serial = "  WGMMA SERIALIZED" if "serialized" in built.log else ""
        # ptxas drops setmaxnreg where the kernel makes a call: the sums then spill
        dropped = "  SETMAXNREG IGNORED" if "setmaxnreg' ignored" in built.log else ""
        print(f"{name:<70} {spill:>4} B spill {s['stack']:>4} B stack "
              f"{cfg.smem_bytes() / 1024:>6.1f} KB smem{' (cached)' if built.cached else ''}"
              f"{over}{serial}{dropped}")
        failed += int(bool(over or serial or dropped))
    return failed


def compile_one(spec, family: str, arch: str) -> int:
    """Compile ``spec``'s configuration of ``family``; print its line; 1 on a failure."""
    cfg, why = cb.forward_config(spec, family=family)
    name = f"fwd {cfg.describe() if cfg else spec.widths}"
    if cfg is None:
        print(f"{name}: NOT SUPPORTED ({why})")
        return 1
    try:
        built = cb.compile_forward(cfg, arch)
    except cb.CudaToolchainError as e:
        print(f"{name}: FAILED {str(e)[:2000]}")
        return 1
    s = cb.ptxas_stats(built.log)
    spill = s["spill_stores"] + s["spill_loads"]
    over = "  OVER THE SPILL BUDGET" if spill > cb.SPILL_BUDGET else ""
    # ptxas's "wgmma.mma_async instructions are serialized" (a register it could not prove
    # untouched during the group): each MMA waits for the one before
    serial = "  WGMMA SERIALIZED" if "serialized" in built.log else ""
    print(f"{name:<70} {s['registers']:>3} regs {spill:>4} B spill {s['stack']:>4} B stack "
          f"{cfg.smem_bytes() / 1024:>6.1f} KB smem{' (cached)' if built.cached else ''}"
          f"{over}{serial}")
    return int(bool(over or serial))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--quick", action="store_true", help="fp16, relu, a few odd widths")
    args = p.parse_args(argv)
    try:
        major, minor = cb.nvrtc_version()
    except cb.CudaToolchainError as e:
        print(e)
        return 1
    print(f"NVRTC {major}.{minor}, {args.arch}, spill budget {cb.SPILL_BUDGET} B")
    failed = 0
    families = ("mma", "wgmma") if args.arch == "sm_90a" else ("mma",)
    for spec in nets(args.quick):
        for family in families:
            failed += compile_one(spec, family, args.arch)
    if args.arch == "sm_90a":
        print(f"backward (sm_90a), spill budget {cb.SPILL_BUDGET} B")
        for spec in backward_nets(args.quick):
            failed += compile_backward_one(spec, args.arch)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
