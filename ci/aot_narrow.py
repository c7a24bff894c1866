"""Compile the narrow fully-fused Triton kernels for an NVIDIA target without a GPU.

    python ci/aot_narrow.py [--arch 90]

Like ci/aot_wide.py: CPU CI runs the kernels in Triton's interpreter, which accepts code
the GPU compiler rejects (seen: a loop-carried tile whose shape changed compiled in the
interpreter and failed on the H200). This compiles the forward (one program per row
block, and persistent), the backward (fused, and split in two) kernels for
sm_<arch> with the tuning the H200 uses (and the backward in one kernel), for every
padded width and activation family, and the Gluon inference forward
(narrow/hopper_forward.py), and prints shared memory, MMA family, registers and spills.
Must run WITHOUT TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from aot_wide import _compile_gluon, _ptxas_info  # noqa: E402
from fusedmlp_xpu.backends.triton.common import APPROX, interpreting  # noqa: E402
from fusedmlp_xpu.backends.triton.narrow import (  # noqa: E402
    backward_kernels, forward_kernels, launchers, tuning)
from fusedmlp_xpu.spec import MLPSpec  # noqa: E402

#: softplus as NVIDIA GPUs compile it (common.narrow_act_ids: its logarithm in PTX)
SOFTPLUS = 8 + APPROX

# strides that are 1 for contiguous tensors; the launcher specialises them the same way
UNIT = {"s_xk"}


def compile_kernel(fn, consts, arch, num_warps, num_stages=1):
    sig, cx, attrs = {}, {}, {}
    for i, (n, p) in enumerate(zip(fn.arg_names, fn.params)):
        if n in UNIT:
            sig[n], cx[n] = "constexpr", 1
        elif p.is_constexpr:  # those with a default may be left out of consts
            sig[n], cx[n] = "constexpr", consts[n] if n in consts or not p.has_default \
                else p.default
        else:
            sig[n] = (("*fp32" if n in ("acc_ptr", "s_ptr") else "*fp16") if n.endswith("_ptr")
                      else "i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", arch, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    ptx = k.asm["ptx"]
    mma = "wgmma" if "wgmma" in ptx else ("mma" if "mma.sync" in ptx else "fma")
    return k.metadata.shared, mma, _ptxas_info(ptx)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--quick", action="store_true", help="widths 64 and 128, relu only")
    args = p.parse_args(argv)
    if interpreting():
        p.error("unset TRITON_INTERPRET: the interpreter replaces the compiler")
    failed = 0
    for P in (64, 128) if args.quick else (16, 32, 64, 128):
        spec = MLPSpec((64, P, P, 64), dtype=torch.float16)  # the tuning of fp16 operands
        # relu/none, gelu_tanh/sigmoid, softplus/leaky_relu
        acts = ((1, 0),) if args.quick else ((1, 0), (4, 6), (SOFTPLUS, 2))
        for act, out_act in acts:
            base = dict(IN_P=P, H_P=P, OUT_P=P, ACT=act, OUT_ACT=out_act, F32=False,
                        PREC="tf32x3")
            jobs = [("fwd_save", forward_kernels._mlp_fwd_kernel, "fwd_save",
                     dict(base, HAS_BIAS=True, SAVE=True)),
                    # inference at width 128 with in/out 128 (one program per row block;
                    # its tuning, 64 rows / 4 warps, neither spills nor serializes)
                    ("fwd", forward_kernels._mlp_fwd_kernel, "fwd",
                     dict(base, HAS_BIAS=True, SAVE=False)) if P == 128 else None,
                    # inference at width 128 with in/out 64, each width padded on its own
                    ("fwd_own_p", forward_kernels._mlp_fwd_kernel, "fwd",
                     dict(base, IN_P=64, OUT_P=64, HAS_BIAS=True, SAVE=False))
                    if P == 128 else None,
                    ("fwd_persistent", forward_kernels._mlp_fwd_persistent_kernel, "fwd",
                     dict(base, HAS_BIAS=True, SAVE=False, L_HID=4, STAGES=2,
                          RESIDENT=False)),
                    # ... with hidden padded on its own, narrower than in/out (64 -> 32
                    # -> 64: narrow-w32)
                    ("fwd_pers_own_p", forward_kernels._mlp_fwd_persistent_kernel, "fwd",
                     dict(base, H_P=P // 2, HAS_BIAS=True, SAVE=False, L_HID=4, STAGES=2,
                          RESIDENT=False)) if P == 64 else None,
                    # ... resident at hidden 128 between in/out 64 (narrow-w128, no
                    # biases), for inference and storing z, at their own tunings
                    ("fwd_pers_w128", forward_kernels._mlp_fwd_persistent_kernel, "fwd",
                     dict(base, IN_P=64, OUT_P=64, HAS_BIAS=False, SAVE=False, L_HID=3))
                    if P == 128 else None,
                    ("fwd_pers_w128_z", forward_kernels._mlp_fwd_persistent_kernel, "fwd",
                     dict(base, IN_P=64, OUT_P=64, HAS_BIAS=False, SAVE=True, L_HID=3))
                    if P == 128 else None,
                    # ... and with biases, loaded per row block
                    ("fwd_pers_w128_b", forward_kernels._mlp_fwd_persistent_kernel, "fwd",
                     dict(base, IN_P=64, OUT_P=64, HAS_BIAS=True, SAVE=False, L_HID=3,
                          BIAS_PER_BLOCK=True)) if P == 128 else None,
                    ("fwd_pers_w128_bz", forward_kernels._mlp_fwd_persistent_kernel, "fwd",
                     dict(base, IN_P=64, OUT_P=64, HAS_BIAS=True, SAVE=True, L_HID=3,
                          BIAS_PER_BLOCK=True)) if P == 128 else None,
                    ("bwd", backward_kernels._mlp_bwd_kernel, "bwd",
                     dict(base, W_SLOT=P * P, SLOT=P * P + P, NEED_X=True, NEED_W=True,
                          NEED_B=True, STORE_G=False)),
                    # the split backward: the input-gradient chain storing g, then dW
                    ("bwd_store_g", backward_kernels._mlp_bwd_kernel, "bwd",
                     dict(base, W_SLOT=P * P, SLOT=P * P + P, NEED_X=True, NEED_W=False,
                          NEED_B=False, STORE_G=True)),
                    # ... or with the layer loop unrolled and its row blocks pipelined
                    ("g_unrolled", backward_kernels._mlp_g_kernel, "bwd",
                     dict(base, NEED_X=True, L_HID=4, STAGES=2, RESIDENT=False)),
                    # ... with its weight tiles loaded once per program (the hidden-32 choice)
                    ("g_resident", backward_kernels._mlp_g_kernel, "bwd",
                     dict(base, NEED_X=True, L_HID=4, STAGES=2, RESIDENT=True)),
                    ("dw", backward_kernels._mlp_dw_kernel, "bwd",
                     dict(base, T_P=P, W_SLOT=P * P, SLOT=P * P + P, NEED_B=True,
                          STAGES=2)),
                    # the split backward with each width padded on its own: the resident
                    # chain at hidden 32 between in/out 64 (narrow-w32), the weight
                    # gradients at in/out 64 around hidden 128 (narrow-w128)
                    ("g_res_own_p", backward_kernels._mlp_g_kernel, "bwd",
                     dict(base, H_P=P // 2, NEED_X=True, L_HID=4, STAGES=2,
                          RESIDENT=True)) if P == 64 else None,
                    # ... the resident chain at hidden 128 between in/out 64 (narrow-w128)
                    ("g_res_w128", backward_kernels._mlp_g_kernel, "bwd",
                     dict(base, IN_P=64, OUT_P=64, NEED_X=True, L_HID=3, STAGES=2,
                          RESIDENT=True)) if P == 128 else None,
                    # (narrow-w128 has no biases: with them, ptxas serializes this
                    # kernel's MMAs, as "dw" shows)
                    ("dw_own_p", backward_kernels._mlp_dw_kernel, "bwd",
                     dict(base, T_P=P, W_SLOT=P * P, SLOT=P * P + P, NEED_B=False, STAGES=2,
                          IN_P=64, OUT_P=64)) if P == 128 else None]
            # the backward in one kernel (the resident chain summing the weight gradients
            # in registers): at width P with biases, and at hidden 32 between in/out 64
            # (narrow-w32, no biases); reading the saved z, or computing it again from x
            # (the default in training)
            one_base = dict(base, T_P=P, W_SLOT=P * P, SLOT=P * P + P, NEED_X=True,
                            NEED_W=True, L_HID=3)
            for rc, tag in ((False, "one_kernel"), (True, "one_recompute")):
                jobs += [(tag, backward_kernels._mlp_bwd_resident_kernel, "one",
                          dict(one_base, NEED_B=True, RECOMPUTE=rc, HAS_BIAS=rc))
                         if P <= 64 else None,
                         (tag + "_own_p", backward_kernels._mlp_bwd_resident_kernel, "one",
                          dict(one_base, H_P=P // 2, NEED_B=False, RECOMPUTE=rc,
                               HAS_BIAS=False))
                         if P == 64 else None]
            # the split backward's own tuning, where on (at P 128 narrow-w128's too)
            split = tuning._split_nvidia(spec)
            for name, fn, mode, consts in filter(None, jobs):
                if mode == "one":  # the one-kernel backward's own tuning at its widths
                    one_spec = MLPSpec(
                        (64,) + (consts["H_P"],) * (consts["L_HID"] + 1) + (64,),
                        bias=consts["NEED_B"], dtype=torch.float16)
                    one = tuning._split_nvidia(one_spec)
                    # recomputing with biases: held, or loaded per row block as the
                    # package chooses
                    consts.update(BLOCK_M=one.g_block_m, STAGES=one.g_stages,
                                  BIAS_PER_BLOCK=consts["RECOMPUTE"] and consts["HAS_BIAS"]
                                  and tuning._bwd_bias_per_block(one_spec))
                    smem, mma, info = compile_kernel(fn, consts, args.arch, one.g_warps)
                    print(f"{name:<14} P={P:<4} act {act}/{out_act} BLOCK_M {one.g_block_m:<4} "
                          f"w{one.g_warps} {smem // 1024:>4} KB smem {mma:<6} {info}")
                    continue
                bm, warps = tuning._tuning_nvidia(
                    MLPSpec((P,) * 4, dtype=torch.float16) if name == "fwd" else spec, mode)
                if split is not None and name in ("bwd_store_g", "g_unrolled", "g_resident",
                                                  "g_res_own_p", "g_res_w128"):
                    bm, warps = split.g_block_m, split.g_warps
                    if name != "bwd_store_g":
                        consts["STAGES"] = split.g_stages
                elif split is not None and name.startswith("dw"):
                    bm, warps, consts["STAGES"] = split.block_m, split.warps, split.stages
                if name.startswith("fwd_pers_w128"):
                    w128 = MLPSpec((64,) + (128,) * 4 + (64,), bias=consts["HAS_BIAS"],
                                   dtype=torch.float16)
                    bm, warps, consts["STAGES"], _, consts["RESIDENT"] = \
                        tuning._persistent_nvidia(w128, consts["SAVE"])
                elif (name.startswith("fwd_pers")
                      and tuning._persistent_nvidia(spec) is not None):
                    bm, warps, consts["STAGES"], _, consts["RESIDENT"] = \
                        tuning._persistent_nvidia(spec)
                consts["BLOCK_M"] = bm
                # the layer loop's stages, as the launches ask them (unrolled or none: 1)
                stages = {"fwd_save": "fwd_save", "fwd": "fwd", "fwd_own_p": "fwd", "bwd": "bwd",
                          "bwd_store_g": "g"}.get(name)
                stages = (tuning._layer_stages_nvidia(spec, stages) if stages
                          else launchers.NUM_STAGES)
                try:
                    smem, mma, info = compile_kernel(fn, consts, args.arch, warps, stages)
                    # more than sm_90's 227 KB a block: Triton refuses it at launch, the
                    # unrolled kernels fall back to the layer loop (_fits)
                    over = "  OVER 227 KB" if smem > 227 * 1024 else ""
                    print(f"{name:<14} P={P:<4} act {act}/{out_act} BLOCK_M {bm:<4} w{warps} "
                          f"{smem // 1024:>4} KB smem {mma:<6} {info}{over}")
                except Exception as e:  # report every failure, then fail the run
                    failed += 1
                    print(f"{name} P={P} act {act}/{out_act}: FAILED {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]}")
    failed += compile_second_order(args)
    failed += compile_gluon(args)
    failed += compile_gluon_backward(args)
    return 1 if failed else 0


def _report(label, fn, consts, arch, warps) -> bool:
    """Compile one kernel and print "<label> <smem> KB smem <mma> <ptxas info>", or
    "<label>: FAILED ..." -> whether it compiled (every failure reported, then the run
    fails)."""
    try:
        smem, mma, info = compile_kernel(fn, consts, arch, warps)
    except Exception as e:  # noqa: BLE001
        print(f"{label}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return False
    print(f"{label} {smem // 1024:>4} KB smem {mma:<6} {info}")
    return True


def compile_second_order(args) -> int:
    """The second-order backward kernel (narrow/second_order_kernels.py) at widths 32, 64
    and 128 (softplus: the most live registers; relu at 64), 3 hidden-to-hidden layers,
    biases, at kernel_tuning (and at 64 with the merged weight-gradient pass), and at the
    GPU default's few-row tuning (second_order.SMALL, softplus and relu at 64); lines
    start with "so"."""
    from fusedmlp_xpu.backends.triton.narrow import second_order, second_order_kernels

    failed = 0
    sp = SOFTPLUS

    def kt(P, merge=False):
        return replace(second_order.kernel_tuning(torch.device("cuda"), P), merge_dw=merge)

    small = second_order.SMALL
    cases = ((64, sp, kt(64)), (64, 1, kt(64)), (64, sp, small)) if args.quick else (
        (32, sp, kt(32)), (64, sp, kt(64)), (64, 1, kt(64)), (128, sp, kt(128)),
        (64, sp, kt(64, True)), (64, sp, small), (64, 1, small))
    for P, act, tune in cases:
        bm, merge = tune.block_m, tune.merge_dw
        consts = dict(L_HID=3, IN_P=P, H_P=P, OUT_P=P, BLOCK_M=bm, ACT=act, OUT_ACT=0,
                      HAS_BIAS=True, NEED_X=True, NEED_V=False, NEED_W=True, NEED_B=True,
                      HID2=act % APPROX in second_order.CURVED, OUT2=False, F32=False,
                      PREC="tf32x3",
                      MERGE_DW=merge)
        failed += not _report(f"so P={P:<4} act {act}{' merged dW' if merge else ''} "
                              f"BLOCK_M {bm:<4} w{tune.warps}",
                              second_order_kernels._second_order_kernel, consts, args.arch,
                              tune.warps)
    # the GEMM form's pointwise kernel (Tuning.split), every mode, softplus; with a bias's
    # column sums (width 64) where the backward pass writes e; z read in place from the
    # saved pre-activations (Z_W 64) as the first and the backward pass read it
    for mode, sum_w, z_w in ((0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 0, 0), (1, 64, 0),
                             (3, 64, 0), (0, 0, 64), (2, 0, 64), (3, 64, 64)):
        failed += not _report(f"sop mode {mode} sums {sum_w} z rows {z_w} act {SOFTPLUS}",
                              second_order_kernels._so_pointwise_kernel,
                              dict(MODE=mode, ACT=SOFTPLUS, BLOCK=1024, SUM_W=sum_w, Z_W=z_w),
                              args.arch, 4)
    # its products fused to those steps (Tuning.fuse, the GPU default), at its tuning: every
    # mode as GemmForm launches it, widths 64 (and 128 unless quick), fp16
    fused = second_order.FUSED
    for P in (64,) if args.quick else (64, 128):
        for mode, keep, sums in ((0, False, False), (4, False, False), (1, True, False),
                                 (2, False, False), (1, False, False), (3, False, True)):
            consts = dict(MODE=mode, ACT=SOFTPLUS, BM=fused.block_m, KP=P, NP=P,
                          HAS_BIAS=mode in (0, 4), KEEP_P=keep, SUM=sums, F32=False,
                          PREC="tf32x3")
            failed += not _report(f"somm P={P:<4} mode {mode}{' keep' if keep else ''}"
                                  f"{' sums' if sums else ''} BM {fused.block_m} "
                                  f"w{fused.warps}", second_order_kernels._so_mm_kernel,
                                  consts, args.arch, fused.warps)
    return failed


def compile_gluon(args) -> int:
    """The Gluon inference forward (narrow/hopper_forward.py) at the bench's nets, at the
    package's tuning; returns the number of failures."""
    from fusedmlp_xpu.backends.triton.narrow import hopper_forward as g

    if g.gluon is None:
        print(f"gluon: not compiled ({g.IMPORT_ERROR})")
        return 0
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon import language as gl

    nets = [((64,) + (32,) * 4 + (64,), 1, 0, False), ((64,) + (64,) * 4 + (64,), 1, 0, False),
            ((64,) + (128,) * 4 + (64,), 1, 0, False)]
    if not args.quick:
        nets += [((64,) + (64,) * 11 + (64,), 1, 0, False), ((24, 64, 64, 40), 4, 6, True),
                 ((32, 16, 8), 8, 7, True)]
    failed = 0
    for widths, act, out_act, bias in nets:
        spec = MLPSpec(widths, dtype=torch.float16, bias=bias)
        bm, stages, per_sm, warps = g.tuning(spec)
        IN_P, H_P, OUT_P = g._pads(spec)

        def desc(shape):
            lay = gl.NVMMASharedLayout.get_default_for(shape, gl.float16)
            return f"tensordesc<fp16[{shape[0]}, {shape[1]}],{lay!r}>"

        sig = dict(x_desc=desc([bm, IN_P]), w0_desc=desc([H_P, IN_P]),
                   wh_desc=desc([H_P, H_P]), wl_desc=desc([OUT_P, H_P]),
                   y_desc=desc([bm, OUT_P]), b0_ptr="*fp16", bh_ptr="*fp16", bl_ptr="*fp16",
                   M="i32", H="i32", OUT="i32")
        cx = dict(L_HID=spec.n_layers - 2, ACT=act, OUT_ACT=out_act, HAS_BIAS=bias,
                  STAGES=stages, num_warps=warps)
        sig.update({k: "constexpr" for k in cx})
        name = "gluon " + "-".join(map(str, widths))
        failed += _compile_gluon(
            name, GluonASTSource(g._fwd_kernel, sig, cx, {}), args.arch,
            dict(num_warps=warps), g.smem_bytes(spec, bm, stages),
            f"act {act}/{out_act} BLOCK_M {bm} w{warps} stages {stages} x{per_sm}/SM")
    return failed


def compile_gluon_backward(args) -> int:
    """The Gluon recomputing backward (narrow/hopper_backward.py, warp-specialized) at the
    bench's narrow-w64 net and, unless quick, at the other depths, TMA-padded widths and
    an activation that keeps its pre-activations; returns the number of failures."""
    from fusedmlp_xpu.backends.triton.narrow import hopper_backward as g

    if g.gluon is None:
        print(f"gluon-bwd: not compiled ({g.IMPORT_ERROR})")
        return 0
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.experimental.gluon import language as gl

    nets = [((64,) + (64,) * 4 + (64,), "relu", "none", False),
            ((64,) + (64,) * 4 + (64,), "relu", "none", True),
            ((64,) + (32,) * 4 + (64,), "relu", "none", False)]
    if not args.quick:
        nets += [((64,) + (64,) * 5 + (64,), "relu", "none", False),
                 ((64, 64, 64), "relu", "none", False),
                 ((24,) + (64,) * 3 + (40,), "relu", "sigmoid", True),
                 ((64, 64, 64, 32), "gelu", "none", False),
                 ((32,) + (16,) * 3 + (8,), "tanh", "none", True),
                 ((64,) + (32,) * 4 + (64,), "silu", "none", True),
                 # the sdf net: softplus's derivative from its output (no z tiles)
                 ((32,) + (64,) * 4 + (16,), "softplus", "none", True)]
    failed = 0
    for widths, act, out_act, bias in nets:
        spec = MLPSpec(widths, act, out_act, bias, torch.float16)
        IN_P, H_P, OUT_P = g._pads(spec)
        bm = g.BLOCK_M

        def lay(shape):
            return gl.NVMMASharedLayout.get_default_for(shape, gl.float16)

        def desc(shape):
            return f"tensordesc<fp16[{shape[0]}, {shape[1]}],{lay(shape)!r}>"

        sig = dict(x_desc=desc([bm, IN_P]), gy_desc=desc([bm, OUT_P]), gx_desc=desc([bm, IN_P]),
                   w0_desc=desc([H_P, IN_P]), wh_desc=desc([H_P, H_P]),
                   wl_desc=desc([OUT_P, H_P]), acc_ptr="*fp32", b0_ptr="*fp16",
                   bh_ptr="*fp16", bl_ptr="*fp16", M="i32")
        cx = dict(g.kernel_consts(spec, True, True, bias), num_warps=4)
        sig.update({k: "constexpr" for k in cx})
        name = "gluon-bwd " + "-".join(map(str, widths)) + (" bias" if bias else "")
        failed += _compile_gluon(
            name, GluonASTSource(g._bwd_kernel, sig, cx, {}), args.arch,
            dict(num_warps=4, maxnreg=g.maxnreg(cx["CHAINS"])),
            g.smem_bytes(spec, cx["CHAINS"], cx["X_STAGES"]),
            f"{act}/{out_act} chains {cx['CHAINS']} x stages {cx['X_STAGES']} regs "
            f"{cx['CHAIN_REGS']}/{cx['SUM_REGS']}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
