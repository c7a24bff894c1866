"""Compile the wide Triton kernels for an NVIDIA target without a GPU (ahead of time).

    python ci/aot_wide.py [--arch 90] [--quick]

CPU CI runs the kernels in Triton's interpreter, which accepts code the GPU compiler
rejects; this compiles every kernel variant with each NVIDIA config for sm_<arch> and
prints shared memory, registers, spill bytes and the MMA instruction family, so GPU
compile errors and spilling configs show up before a device run. Arguments are
specialised as Triton's launcher does for contiguous tensors (unit strides constant,
pointers and sizes 16-divisible). Must run WITHOUT TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import mangle_type  # noqa: E402

from fusedmlp_xpu.activations import ACTIVATIONS  # noqa: E402
from fusedmlp_xpu.backends.triton.common import APPROX  # noqa: E402
from fusedmlp_xpu.backends.triton.wide import (  # noqa: E402
    configs, gated_kernels, gemm_kernels)
from fusedmlp_xpu.backends.triton.wide import tma as wide_tma  # noqa: E402

# the strides that are 1 for row-major operands, per kernel (see the launchers in
# wide/layers.py and wide/gated.py)
UNIT_STRIDES = {
    "fwd": "s_xk s_wk s_yn s_zn",
    "dx": "s_gk s_wn s_zgk s_g2k s_w2n s_zn s_on s_hn",
    "dw": "s_gm s_hn s_zgm s_wn",
    "gated_fwd": "s_xk s_gwk s_uwk s_hn s_gn s_un",
    "gated_bwd": "s_dyk s_wn s_gn s_un s_dgn s_dun",
}
# the constexpr combinations wide-gelu / wide-swiglu training use, plus prologue variants
VARIANTS = {
    "fwd": [dict(ACT=4, HAS_BIAS=True, STORE_Z=True), dict(ACT=0, HAS_BIAS=True, STORE_Z=False),
            dict(ACT=4 + APPROX, HAS_BIAS=True, STORE_Z=False)],
    "dx": [dict(G_ACT=0, ACT=4, DUAL=False, STORE_H=True), dict(G_ACT=6, ACT=0, DUAL=True, STORE_H=False),
           dict(G_ACT=0, ACT=4 + APPROX, DUAL=False, STORE_H=False)],
    "dw": [dict(G_ACT=0), dict(G_ACT=7)],
    "gated_fwd": [dict(ACT=5, HAS_BIAS=False, STORE_GU=True)],
    "gated_bwd": [dict(ACT=5)],
}


def compile_variant(name, consts, cfg, arch, dtype="bf16"):
    fn = configs._KERNELS[name][0]
    unit = set(UNIT_STRIDES[name].split())
    sig, cx, attrs = {}, {}, {}
    values = {**consts, **cfg.kwargs, "UPCAST": False, "EVEN_K": True,
              "PRECISION": "ieee" if dtype == "fp32" else "tf32"}
    for i, (n, p) in enumerate(zip(fn.arg_names, fn.params)):
        if n in unit:
            sig[n], cx[n] = "constexpr", 1
        elif p.is_constexpr:
            sig[n], cx[n] = "constexpr", values[n]
        else:
            sig[n] = f"*{dtype}" if n.endswith("_ptr") else "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    smem, mma, ptx = _compile(ASTSource(fn, sig, cx, attrs), arch, cfg.num_warps, cfg.num_stages)
    return smem, mma, _ptxas_info(ptx)


def _compile(src, arch, warps, stages):
    """(shared memory bytes, MMA instruction family, PTX) of one sm_<arch> compile."""
    k = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": warps, "num_stages": stages})
    ptx = k.asm["ptx"]
    mma = "wgmma" if "wgmma" in ptx else ("mma" if "mma.sync" in ptx else "fma")
    return k.metadata.shared, mma, ptx


def compile_tma(kind: str, arch: int, dtype=torch.bfloat16, cfg=None, approx=False):
    """A TMA kernel at its tuned config for ``kind`` ("fwd", "fwd_z": z stored too;
    "gated", "gated_gu": g and u stored too; "dx": the input gradient with the gelu'
    epilogue and h; "gated_bwd"), with descriptor arguments typed as Triton types them at
    launch; ``approx``: gelu through the hardware tanh (act.APPROX), as bf16 runs it on
    NVIDIA GPUs."""
    cfg = cfg or configs._tma_config_nvidia(kind)
    bm, bn, bk, warps, stages = cfg[:5]
    sub = len(cfg) > 5 and cfg[5]
    mn, mk, kn = [bm, bn], [bm, bk], [bk, bn]
    me = [bm, bn // 2] if sub else mn  # epilogue tiles of the SUBTILE kernels
    fn, blocks = {
        "fwd": (gemm_kernels._linear_fwd_tma_kernel, dict(x_desc=mk, w_desc=[bn, bk], y_desc=mn, z_desc=mn,
                                                  part_desc=[bm, wide_tma._part_cols(bn)])),
        "gated": (gated_kernels._gated_fwd_tma_kernel, dict(x_desc=mk, w_desc=[bn, 2, bk], h_desc=mn,
                                                   g_desc=mn, u_desc=mn)),
        "dx": (gemm_kernels._dx_tma_kernel, dict(g_desc=mk, w_desc=kn, z_desc=me, out_desc=me, h_desc=me)),
        "gated_bwd": (gated_kernels._gated_bwd_tma_kernel, dict(dy_desc=mk, wd_desc=kn, g_desc=me,
                                                       u_desc=me, dg_desc=me, du_desc=me, h_desc=me)),
    }[{"fwd_z": "fwd", "gated_gu": "gated"}.get(kind, kind)]
    t = {2: torch.empty(1024, 1024, dtype=dtype), 3: torch.empty(1024, 2, 1024, dtype=dtype)}
    gelu = 4 + (APPROX if approx else 0)
    values = {"ACT": 5 if kind.startswith("gated") else gelu, "HAS_BIAS": kind.startswith("fwd"),
              "STORE_Z": kind == "fwd_z", "STORE_GU": kind == "gated_gu",
              "STORE_H": True, "SUBTILE": sub, "STREAM_K": True, "PART_N": wide_tma._part_cols(bn),
              "SWAP": False,
              "UPCAST": False, "PRECISION": "tf32", "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk,
              "GROUP_M": 8, "PROGRAMS": 132}
    sig, cx = {}, {}
    for n in fn.arg_names:
        if n in blocks:
            src = t[len(blocks[n])] if n != "part_desc" else t[2].float()  # fp32 partials
            sig[n] = mangle_type(wide_tma.TensorDescriptor.from_tensor(src, blocks[n]))
        elif n in values:
            sig[n], cx[n] = "constexpr", values[n]
        else:
            sig[n] = "*bf16" if n.endswith("_ptr") else "i32"
    smem, mma, ptx = _compile(ASTSource(fn, sig, cx), arch, warps, stages)
    tma = "tma" if "cp.async.bulk.tensor" in ptx else "no-tma"
    return (f"{bm}x{bn}x{bk} w{warps} s{stages}{' sub' if sub else ''}", smem, mma, tma,
            _ptxas_info(ptx))


def compile_fixup(arch: int, cfg=None):
    """The stream-K fixup kernel of the TMA forward at its tile (pointer loads/stores)."""
    cfg = cfg or configs._tma_config_nvidia("fwd_z")
    fn = gemm_kernels._stream_k_fixup_kernel
    values = {"ACT": 4, "HAS_BIAS": True, "STORE_Z": True, "BLOCK_M": cfg[0], "BLOCK_N": cfg[1],
              "BLOCK_K": cfg[2], "GROUP_M": 8, "PROGRAMS": 132, "FIX_M": 32, "FIX_N": 64}
    sig, cx, attrs = {}, {}, {}
    for i, n in enumerate(fn.arg_names):
        if n in values:
            sig[n], cx[n] = "constexpr", values[n]
        else:
            sig[n] = {"part_ptr": "*fp32"}.get(n, "*bf16" if n.endswith("_ptr") else "i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
    smem, mma, ptx = _compile(ASTSource(fn, sig, cx, attrs), arch, 4, 1)
    return smem, _ptxas_info(ptx)


SERIALIZED = "WGMMA SERIALIZED"  # in _ptxas_info's line where ptxas said so


def _ptxas_info(ptx: str) -> str:
    """registers and spill bytes from ptxas -v (the ptxas Triton ships), or '?', and
    whether ptxas serialized the wgmma instructions (and why)."""
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    arch = re.search(r"\.target (sm_\w+)", ptx).group(1)
    for exe in ("ptxas-blackwell", "ptxas"):
        path = os.path.join(bindir, exe)
        if not os.path.exists(path):
            continue
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "k.ptx")
            with open(src, "w") as f:
                f.write(ptx)
            r = subprocess.run([path, "-v", f"--gpu-name={arch}", src, "-o", os.path.join(d, "k.o")],
                               capture_output=True, text=True)
        regs = re.search(r"Used (\d+) registers", r.stderr)
        spill = re.search(r"(\d+) bytes spill stores", r.stderr)
        # ptxas waits for every wgmma before the next one in the whole function when it
        # cannot prove a pipeline stage safe (its info C7514/C7515...): a kernel that
        # compiles and computes right but runs its MMAs one at a time
        serial = re.search(r"wgmma.mma_async instructions are serialized due to ([^\n]*?)"
                           r" in the function", r.stderr)
        if regs:
            return (f"regs {regs.group(1)}, spill {spill.group(1) if spill else '?'} B"
                    + (f", {SERIALIZED} ({serial.group(1)})" if serial else ""))
    return "regs ?"


def _compile_gluon(name, src, arch, options, est, label) -> int:
    """Compile one Gluon kernel for sm_<arch>, print a line (the shared memory its tuning
    counted, ``est``, against what the compiler allocated; wgmma; registers); 1 where it
    failed or the counts differ by more than 1 KB, else 0."""
    try:
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
        ptx = k.asm["ptx"]
        mma = "wgmma" if "wgmma.mma_async" in ptx else "no wgmma"
        parts = ptx.count("setmaxnreg")
        print(f"{name:<28} {label} {k.metadata.shared // 1024:>4} KB smem (counted "
              f"{est // 1024}) {mma}{f' setmaxnreg x{parts}' if parts else ''} "
              f"{_ptxas_info(ptx)}")
        if abs(k.metadata.shared - est) > 1024:
            print(f"{name}: FAILED the counted shared memory is off")
            return 1
        return 0
    except Exception as e:  # report every failure, then fail the run
        print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, default=90)
    p.add_argument("--quick", action="store_true",
                   help="one large-M and one decode config per variant")
    args = p.parse_args(argv)
    if configs.interpreting():
        p.error("unset TRITON_INTERPRET: the interpreter replaces the compiler")
    failed = 0
    for name, variants in VARIANTS.items():
        cfgs = configs._configs_nvidia(configs._KERNELS[name][1])
        if args.quick:
            cfgs = [configs._prune(cfgs, {"M_BUCKET": 8192})[0],
                    configs._prune(cfgs, {"M_BUCKET": 16})[0]]
        for consts, cfg in itertools.product(variants, cfgs):
            kw = cfg.kwargs
            tile = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{cfg.num_warps} s{cfg.num_stages}"
            try:
                smem, mma, info = compile_variant(name, consts, cfg, args.arch)
                print(f"{name:<10}{tile:<20}{smem // 1024:>4} KB smem  {mma:<6}{info}  {consts}")
            except Exception as e:  # report every failure, then fail the run
                failed += 1
                print(f"{name:<10}{tile:<20}FAILED {type(e).__name__}: {str(e)[:400]}  {consts}")
    if wide_tma.TensorDescriptor is not None:
        for kind, approx in (("fwd", False), ("fwd", True), ("fwd_z", False), ("fwd_z", True),
                             ("gated", False), ("gated_gu", False), ("dx", False),
                             ("dx", True), ("gated_bwd", False)):
            try:
                tile, smem, mma, tma, info = compile_tma(kind, args.arch, approx=approx)
                kind += " approx" if approx else ""
                over = "  OVER 227 KB" if smem > 227 * 1024 else ""
                print(f"{kind + '_tma':<18}{tile:<20}{smem // 1024:>4} KB smem  {mma:<6}{tma} "
                      f"{info}{over}")
                failed += bool(over)
            except Exception as e:  # report every failure, then fail the run
                failed += 1
                print(f"{kind}_tma FAILED {type(e).__name__}: {str(e)[:400]}")
        try:
            smem, info = compile_fixup(args.arch)
            print(f"{'sk_fixup':<14}{'32x64 w4':<20}{smem // 1024:>4} KB smem  {info}")
        except Exception as e:  # report every failure, then fail the run
            failed += 1
            print(f"sk_fixup FAILED {type(e).__name__}: {str(e)[:400]}")
    failed += compile_gluon(args.arch)
    return 1 if failed else 0


def compile_gluon(arch: int) -> int:
    """hopper_gemm's warp-specialized kernel: dx (gelu_tanh with the hardware tanh) and the
    gated dh GEMM (silu), each with and without h; one line each (shared memory against
    hopper_gemm.smem_bytes, wgmma, setmaxnreg, registers and spills); returns failures."""
    from fusedmlp_xpu.backends.triton.wide import hopper_gemm as g

    if g.gluon is None:
        print("gluon-ws: not compiled (no Gluon in this Triton)")
        return 0
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(shape):
        lay = gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
        return f"tensordesc<bf16[{shape[0]}, {shape[1]}],{lay!r}>"

    bm, bn, bk = g.BLOCK_M, g.BLOCK_N, g.BLOCK_K
    failed = 0
    for epi, act, store_h in ((g.DX, "gelu_tanh", True), (g.DX, "gelu_tanh", False),
                              (g.GATED, "silu", True), (g.GATED, "silu", False)):
        stages = g.stages(epi, store_h)
        aid = ACTIVATIONS[act].id + (APPROX if act == "gelu_tanh" else 0)
        sig = dict(a_desc=desc([bm, bk]), b_desc=desc([bk, bn]),
                   **{n: desc([bm, bn]) for n in ("e0_desc", "e1_desc", "o0_desc", "o1_desc",
                                                  "h_desc")}, M="i32", N="i32", K="i32")
        cx = dict(EPI=epi, ACT=aid, STORE_H=store_h, STAGES=stages, GROUP=g.GROUP_M,
                  C_REGS=g.CONSUMER_REGS, L_REGS=g.LOADER_REGS, num_warps=4)
        sig.update({k: "constexpr" for k in cx})
        name = f"gluon-ws {'dx' if epi == g.DX else 'gated'}{' +h' if store_h else ''}"
        failed += _compile_gluon(
            name, GluonASTSource(g._ws_gemm_kernel, sig, cx, {}), arch,
            dict(num_warps=4, maxnreg=g.MAXNREG), g.smem_bytes(epi, store_h, stages),
            f"{bm}x{bn}x{bk} s{stages}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
