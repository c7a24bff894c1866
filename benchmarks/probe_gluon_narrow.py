"""Probe: the narrow inference forward written in Gluon (Triton's lower-level dialect,
Hopper only) with two row blocks in flight per warpgroup, each layer's MMA issued
asynchronously so one block's epilogue (activation, convert) runs under the other
block's MMA. Triton's own codegen issues a layer's MMAs and then waits for all of them
(NOTES.md, "What limits it"), so the package's persistent kernel overlaps blocks only
across programs.

x and y move by TMA (x through a ring of STAGES pairs of tiles, y through two staging
tiles); every layer's weights sit in shared memory for the whole program. Square nets
only (in = hidden = out = W, a multiple of 16; row strides 16-byte aligned), no biases:
the shape of the narrow bench configs.

    python benchmarks/probe_gluon_narrow.py --out F.json [--rows 20 22] [--width 32 64]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fusedmlp_xpu.backends.triton.act import act


@gluon.jit
def _layer_in(h_acc, dt: gl.constexpr, op_a: gl.constexpr, ACT: gl.constexpr):
    return gl.convert_layout(act(h_acc, ACT).to(dt), op_a)


@gluon.jit
def _fwd_pairs_kernel(x_desc, w_desc, y_desc, M,
                      N_LAYERS: gl.constexpr, ACT: gl.constexpr, OUT_ACT: gl.constexpr,
                      STAGES: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    W: gl.constexpr = x_desc.block_type.shape[1]
    dt: gl.constexpr = x_desc.dtype
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, W, 16])
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)

    w_smem = gl.allocate_shared_memory(dt, [N_LAYERS, W, W], w_desc.layout)
    x_smem = gl.allocate_shared_memory(dt, [2 * STAGES, BM, W], x_desc.layout)
    y_smem = gl.allocate_shared_memory(dt, [2, BM, W], y_desc.layout)
    wbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    xbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(wbar, count=1)
    for j in gl.static_range(STAGES):
        mbarrier.init(xbar.index(j), count=1)

    pid = gl.program_id(0)
    n_prog = gl.num_programs(0)
    n_pairs = gl.cdiv(gl.cdiv(M, BM), 2)
    n_my = gl.cdiv(n_pairs - pid, n_prog)
    pair_bytes: gl.constexpr = 2 * x_desc.block_type.nbytes

    mbarrier.expect(wbar, N_LAYERS * w_desc.block_type.nbytes)
    for l in gl.static_range(N_LAYERS):
        tma.async_copy_global_to_shared(w_desc, [l * W, 0], wbar, w_smem.index(l))
    for j in gl.static_range(STAGES):
        qj = pid + j * n_prog
        okj = j < n_my
        mbarrier.expect(xbar.index(j), pair_bytes, pred=okj)
        tma.async_copy_global_to_shared(x_desc, [2 * qj * BM, 0], xbar.index(j),
                                        x_smem.index(2 * j), pred=okj)
        tma.async_copy_global_to_shared(x_desc, [(2 * qj + 1) * BM, 0], xbar.index(j),
                                        x_smem.index(2 * j + 1), pred=okj)
    mbarrier.wait(wbar, 0)

    zero = gl.zeros([BM, W], gl.float32, mma)
    for i in range(n_my):
        s = i % STAGES
        q = pid + i * n_prog
        mbarrier.wait(xbar.index(s), (i // STAGES) & 1)
        ha = x_smem.index(2 * s).load(op_a)
        hb = x_smem.index(2 * s + 1).load(op_a)
        gl.thread_barrier()
        # refill this stage with the pair STAGES iterations on
        qn = q + STAGES * n_prog
        ok = i + STAGES < n_my
        mbarrier.expect(xbar.index(s), pair_bytes, pred=ok)
        tma.async_copy_global_to_shared(x_desc, [2 * qn * BM, 0], xbar.index(s),
                                        x_smem.index(2 * s), pred=ok)
        tma.async_copy_global_to_shared(x_desc, [(2 * qn + 1) * BM, 0], xbar.index(s),
                                        x_smem.index(2 * s + 1), pred=ok)

        aa = warpgroup_mma(ha, w_smem.index(0).permute((1, 0)), zero, use_acc=False,
                           is_async=True)
        ab = warpgroup_mma(hb, w_smem.index(0).permute((1, 0)), zero, use_acc=False,
                           is_async=True)
        for l in gl.static_range(1, N_LAYERS):
            aa, ha = warpgroup_mma_wait(1, deps=(aa, ha))
            ha = _layer_in(aa, dt, op_a, ACT)
            aa = warpgroup_mma(ha, w_smem.index(l).permute((1, 0)), zero, use_acc=False,
                               is_async=True)
            ab, hb = warpgroup_mma_wait(1, deps=(ab, hb))
            hb = _layer_in(ab, dt, op_a, ACT)
            ab = warpgroup_mma(hb, w_smem.index(l).permute((1, 0)), zero, use_acc=False,
                               is_async=True)
        aa, ha = warpgroup_mma_wait(1, deps=(aa, ha))
        ya = act(aa, OUT_ACT).to(dt)
        tma.store_wait(pendings=1)
        y_smem.index(0).store(ya)
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [2 * q * BM, 0], y_smem.index(0))
        ab, hb = warpgroup_mma_wait(0, deps=(ab, hb))
        yb = act(ab, OUT_ACT).to(dt)
        tma.store_wait(pendings=1)
        y_smem.index(1).store(yb)
        fence_async_shared()
        tma.async_copy_shared_to_global(y_desc, [(2 * q + 1) * BM, 0], y_smem.index(1))
    tma.store_wait(pendings=0)
    mbarrier.invalidate(wbar)
    for j in gl.static_range(STAGES):
        mbarrier.invalidate(xbar.index(j))


def descriptors(x, w_stack, y, bm):
    """TMA descriptors: x and y in [bm, W] tiles, the stacked weights in [W, W] tiles."""
    W = x.shape[1]
    gdt = gl.float16 if x.dtype == torch.float16 else gl.bfloat16
    tile = gl.NVMMASharedLayout.get_default_for([bm, W], gdt)
    wtile = gl.NVMMASharedLayout.get_default_for([W, W], gdt)
    return (TensorDescriptor.from_tensor(x, [bm, W], tile),
            TensorDescriptor.from_tensor(w_stack, [W, W], wtile),
            TensorDescriptor.from_tensor(y, [bm, W], tile))


def forward(x, w_stack, y, n_layers, act_id=1, out_act=0, bm=64, stages=2, per_sm=2,
            num_warps=4):
    xd, wd, yd = descriptors(x, w_stack, y, bm)
    n_pairs = triton.cdiv(triton.cdiv(x.shape[0], bm), 2)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = (min(n_pairs, per_sm * sms),)
    _fwd_pairs_kernel[grid](xd, wd, yd, x.shape[0], n_layers, act_id, out_act, stages,
                            num_warps=num_warps)
    return y


def main():
    import fusedmlp_xpu as fm
    from fusedmlp_xpu.bench import environment

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int, nargs="+", default=[20, 22])
    ap.add_argument("--width", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--hidden-layers", type=int, default=4)
    ap.add_argument("--variants", default="64,2,2;64,3,2;64,2,3;128,2,1",
                    help="bm,stages,per_sm;... (4 warps)")
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows = []
    variants = [tuple(int(t) for t in v.split(",")) for v in args.variants.split(";")]
    for W in args.width:
        torch.manual_seed(0)
        m = fm.FusedMLP(W, W, W, args.hidden_layers, bias=False, device=dev,
                        dtype=torch.float16, backend="triton")
        w_stack = torch.cat([w.detach() for w in m.weights()]).contiguous()
        L = args.hidden_layers + 1
        for lg in args.rows:
            n = 2 ** lg
            x = torch.randn(n, W, device=dev, dtype=torch.float16)
            # a tail: rows that are no multiple of a pair of blocks
            xt = x[: n - 37]
            with torch.no_grad():
                ref = m.to_sequential().double()(xt[:300000].double())
                m.to(torch.float16)
            cases = {"package": lambda x=x: m(x)}
            for v in variants:
                y = torch.empty_like(x)
                cases["gluon bm{} stages{} per_sm{}".format(*v)] = (
                    lambda x=x, y=y, v=v: forward(x, w_stack, y, L, 1, 0, *v))
            with torch.no_grad():
                for name, fn in cases.items():
                    try:
                        if name == "package":
                            out = m(xt)
                        else:
                            v = variants[list(cases).index(name) - 1]
                            out = forward(xt, w_stack, torch.full_like(xt, float("nan")), L,
                                          1, 0, *v)
                        err = ((out[:300000].double() - ref).norm() / ref.norm()).item()
                    except Exception as e:  # out of resources, compile errors
                        print(f"W{W} 2^{lg} {name}: {type(e).__name__} {str(e)[:300]}",
                              flush=True)
                        cases[name] = None
                        continue
                    ok = err < 5e-3
                    print(f"W{W} 2^{lg} {name}: rel err {err:.2e} {'ok' if ok else 'WRONG'}",
                          flush=True)
                    if not ok:
                        cases[name] = None
                floor_ms = 2 * x.numel() * 2 / 4.16e12 * 1e3
                for p in range(args.passes):
                    for name, fn in cases.items():
                        if fn is None:
                            continue
                        ms = triton.testing.do_bench(fn, warmup=50, rep=300,
                                                     return_mode="median")
                        rows.append(dict(width=W, rows=n, case=name, p=p, ms=ms,
                                         floor_x=ms / floor_ms))
                        print(f"W{W} 2^{lg} pass {p} {name}: {ms:.4f} ms "
                              f"({ms / floor_ms:.2f}x copy floor)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(environment=environment(dev), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
