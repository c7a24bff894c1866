"""The narrow train step's backward for Hopper (sm_90) GPUs, written in Gluon: one
kernel that computes every row block's forward again from x, walks the input gradient
back through the layers and sums every weight gradient over its row blocks, as the Triton
one-kernel backward (backward_kernels.py, ``_mlp_bwd_resident_kernel`` with RECOMPUTE) does, into
the same per-program partials (the same reduction kernel then writes the gradients).

Why it is faster (benchmarks/NOTES.md, narrow history 33): the Triton kernel runs one
chain of dependent layers per warp group, each layer's MMA waited for before its
epilogue, with the weight-gradient sums and every pre-activation in registers (255, with
spills). Here the work is split by warp specialization into warpgroups per program (one
per SM; narrow history 34 adds hidden 16/32 and the third chain):
- two chain warpgroups (three at hidden widths up to 32 where their tiles fit: ``tuning``),
  each over its share of the program's 64-row blocks: the forward again
  (each layer's activation into shared memory, where the sums read it), then g back
  through the layers, handing each layer's g over in shared memory, and grad_x out by
  TMA. The derivative comes back from the stored activation (relu, leaky relu,
  identity) or from the pre-activation kept beside it (the other activations). While
  one chain waits on its MMA or runs an epilogue, the others' run;
- one warpgroup that holds every layer's weight-gradient sum (a [64, in] fp32 tile each)
  and adds g^T h as soon as a chain hands g over (asynchronous MMAs; a g tile is handed
  back as soon as its MMA is done), and the bias gradients as g^T @ ones the same way; it
  also loads x by TMA for the chains. The sums' MMAs take g's width as their M, which
  a warpgroup's MMA needs to be 64: the g tiles are 64 wide, a narrower layer's g (hidden
  16 or 32, out widths below 64) is stored into their left part and the rest stays zero.
mbarriers carry the hand-overs both ways; every weight stays in shared memory.

What it takes (``eligible``): fp16/bf16, hidden width 16, 32 or 64, in width a multiple of
8 up to 64, out width up to 64 (padded to a multiple of 8 on the host: ``tma_out``), 0..4
hidden-to-hidden weights (with biases: up to 3), activations and depth whose tiles fit
shared memory, and a forward that saved nothing (the default where the one-kernel backward
applies)."""
from __future__ import annotations

import dataclasses

import torch

from .... import envvars
from .. import launch
from ..launch import int_key
from . import hopper_forward
from .hopper_forward import MAX_ROWS, SMEM_BYTES, _pads, gluon, row_desc, weight_descs
from .launchers import _launch_meta
from ..common import APPROX as APPROX_ID
from .reduce import _reduce_launch, _reduce_layout

#: set to 0 to keep every narrow backward on the Triton kernels (FUSEDMLP_GLUON=0 turns
#: off this kernel and the Gluon forward)
ENV = "FUSEDMLP_GLUON_BACKWARD"
#: the largest hidden-to-hidden weight count (as the one-kernel backward's); with biases
#: (their sums take registers of the summing warpgroup too)
MAX_HIDDEN_WEIGHTS = 4
MAX_HIDDEN_WEIGHTS_BIAS = 3
HIDDEN = (16, 32, 64)  # the hidden widths it takes
BLOCK_M = 64  # rows of a chain's block
#: the width of every g tile the sums read, their MMAs' M (a warpgroup's 64 rows): a
#: narrower layer's g (hidden 16 or 32, out widths below 64) is stored into its left part
#: and the rest stays zero
G_P = 64


def keeps_z(act: int) -> bool:
    """Whether activation ``act`` (a registry id, plus APPROX where the host chose the PTX
    form) keeps its pre-activations: gelu, gelu_tanh and silu, whose derivative is no
    function of act(z). The others take it from the stored activation h (_dact): identity,
    relu and leaky relu by its sign; sigmoid h (1 - h) and tanh 1 - h^2, as torch's
    backward does; softplus sigmoid(z) = 1 - exp(-h). Without the z tiles the sdf net
    (32 -> 64 x 4 -> 16, softplus, biases) fits one program's shared memory."""
    return act % APPROX_ID in (3, 4, 5)


def from_output(act: int) -> bool:
    """Whether a smooth activation's derivative comes from the stored output (sigmoid,
    tanh, softplus: see keeps_z) rather than from a kept pre-activation."""
    return act % APPROX_ID in (6, 7, 8)

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

    from ..act import APPROX, act, times_act_grad
    from .hopper_forward import _load_weights, _thread_barrier, _tma_load, _tma_store

    _keeps_z = gluon.constexpr_function(keeps_z)

    @gluon.constexpr_function
    def _acc(n):
        """The layout of a one-warpgroup MMA's accumulator with n columns (64 rows a
        warpgroup)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                         instr_shape=[16, n, 16])

    @gluon.jit
    def _keep(acc, hs, zs, l: gl.constexpr, ACT: gl.constexpr, Z_SMEM: gl.constexpr):
        """Layer l's forward epilogue: h = act(z) into hs[l] (and z into zs[l] where the
        derivative needs it); h back, in the accumulator's layout."""
        h = act(acc, ACT).to(hs.dtype)
        hs.index(l).store(h)
        if Z_SMEM:
            zs.index(l).store(acc.to(zs.dtype))
        return h

    @gluon.jit
    def _dact(g, hs, zs, l: gl.constexpr, ACT: gl.constexpr, Z_SMEM: gl.constexpr):
        """g * act'(z) of hidden layer l, from what _keep stored."""
        if Z_SMEM:
            z = zs.index(l).load(g.type.layout).to(gl.float32)
            g = times_act_grad(g, z, ACT)
        elif ACT == 1:
            h = hs.index(l).load(g.type.layout)
            g = gl.where(h <= 0, 0.0, g)  # as torch's relu backward: NaN passes g
        elif ACT == 2:
            h = hs.index(l).load(g.type.layout)
            g = gl.where(h > 0, g, 0.01 * g)
        elif ACT != 0:  # sigmoid, tanh, softplus (either form): from_output
            h = hs.index(l).load(g.type.layout).to(gl.float32)
            if ACT == 6:
                g = g * (h * (1.0 - h))
            elif ACT % APPROX == 7:
                g = g * (1.0 - h * h)
            else:  # sigmoid(z) = 1 - exp(-h); below h = 1e-2 the series h - h^2/2 + h^3/6
                # (the subtraction would lose the small result's precision; rel. err. < 5e-8)
                g = g * gl.where(h < 1e-2, h * (1.0 - h * (0.5 - h * 0.16666666666666666)),
                                 1.0 - gl.exp(-h))
        return g

    @gluon.jit
    def _add_bias(acc, b_ptr, N, HAS_BIAS: gl.constexpr):
        """acc + b (N values, read per call: from L1) when HAS_BIAS."""
        if HAS_BIAS:
            cols = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
            b = gl.load(b_ptr + cols, mask=cols < N, other=0.0)
            acc = acc + b.to(gl.float32)[None, :]
        return acc

    @gluon.jit
    def _store_bias_sum(slot, e, T_P: gl.constexpr):
        """A bias gradient's partial sum from g^T @ ones [G_P, 16] (equal columns): the
        first column's first T_P rows into the slot (the rest are the zero padding of g)."""
        c = gl.arange(0, e.shape[1], layout=gl.SliceLayout(0, e.type.layout))
        r = gl.arange(0, e.shape[0], layout=gl.SliceLayout(1, e.type.layout))
        gl.store(slot + r, gl.sum(gl.where(c[None, :] == 0, e, 0.0), axis=1), mask=r < T_P)

    @gluon.jit
    def _store_sum(slot, d, T_P: gl.constexpr):
        """A weight gradient's partial sum d = g^T h [G_P, in] into its [T_P, T_P] slot,
        row-major [out, in] (rows from T_P on are the zero padding of g)."""
        r = gl.arange(0, d.shape[0], layout=gl.SliceLayout(1, d.type.layout))
        c = gl.arange(0, d.shape[1], layout=gl.SliceLayout(0, d.type.layout))
        gl.store(slot + r[:, None] * T_P + c[None, :], d, mask=r[:, None] < T_P)

    @gluon.jit
    def _g_view(tile, n: gl.constexpr):
        """The first n columns of a [BM, G_P] g tile: where a layer's g is stored."""
        if n == tile.shape[1]:
            return tile
        else:
            return tile.slice(0, n, dim=1)

    @gluon.jit
    def _zero_pads(tile, zeros, n: gl.constexpr):
        """``zeros`` into a g tile where a layer's g (n columns) does not reach: the whole
        tile, once before its first use (g is stored into its first n columns only)."""
        if n < zeros.shape[1]:
            tile.store(zeros)

    @gluon.jit
    def _load_x(x_desc, x_ready, xs, slot, i, n_my):
        """x of this program's block i (pid + i * programs) into tile ``slot``, on its
        barrier; nothing where the program has no block i."""
        row = (gl.program_id(0) + i * gl.num_programs(0)) * x_desc.block_type.shape[0]
        mbarrier.expect(x_ready.index(slot), x_desc.block_type.nbytes, pred=i < n_my)
        _tma_load(x_desc, [row, 0], x_ready.index(slot), xs.index(slot), pred=i < n_my)

    @gluon.jit
    def _mma_into(k: gl.constexpr, a, b, s0, s1, s2, s3, s4):
        """s_k += a @ b, issued and not waited for; all five back."""
        if k == 0:
            s0 = warpgroup_mma(a, b, s0, is_async=True)
        elif k == 1:
            s1 = warpgroup_mma(a, b, s1, is_async=True)
        elif k == 2:
            s2 = warpgroup_mma(a, b, s2, is_async=True)
        elif k == 3:
            s3 = warpgroup_mma(a, b, s3, is_async=True)
        else:
            s4 = warpgroup_mma(a, b, s4, is_async=True)
        return s0, s1, s2, s3, s4

    @gluon.jit
    def _tile_sums(k: gl.constexpr, g_s, h_s, ones_s, d0, d1, d2, d3, d4, e0, e1, e2, e3, e4,
                   NEED_W: gl.constexpr, NEED_B: gl.constexpr):
        """Weight layer k's sums from its output gradient g_s (the input layer's k = 0,
        hidden weight k - 1's k >= 1): d_k += g^T h (h_s: its input), e_k += g^T @ ones;
        issued, not waited for. Every sum back."""
        gt = g_s.permute((1, 0))
        if NEED_W:
            d0, d1, d2, d3, d4 = _mma_into(k, gt, h_s, d0, d1, d2, d3, d4)
        if NEED_B:
            e0, e1, e2, e3, e4 = _mma_into(k, gt, ones_s, e0, e1, e2, e3, e4)
        return d0, d1, d2, d3, d4, e0, e1, e2, e3, e4

    @gluon.jit
    def _wait_sums(d0, d1, d2, d3, d4, dl, L_HID: gl.constexpr):
        """Wait for every MMA in flight; the sums (those that exist) back."""
        if L_HID == 0:
            d0, dl = warpgroup_mma_wait(0, deps=(d0, dl))
        elif L_HID == 1:
            d0, d1, dl = warpgroup_mma_wait(0, deps=(d0, d1, dl))
        elif L_HID == 2:
            d0, d1, d2, dl = warpgroup_mma_wait(0, deps=(d0, d1, d2, dl))
        elif L_HID == 3:
            d0, d1, d2, d3, dl = warpgroup_mma_wait(0, deps=(d0, d1, d2, d3, dl))
        else:
            d0, d1, d2, d3, d4, dl = warpgroup_mma_wait(0, deps=(d0, d1, d2, d3, d4, dl))
        return d0, d1, d2, d3, d4, dl

    @gluon.jit
    def _ws_chain(c, ops, L_HID: gl.constexpr, ACT: gl.constexpr, OUT_ACT: gl.constexpr,
                  NEED_X: gl.constexpr, NEED_W: gl.constexpr, NEED_B: gl.constexpr,
                  HAS_BIAS: gl.constexpr, X_STAGES: gl.constexpr):
        """Chain c (one warpgroup) of this program: its row blocks are the program's
        NC j + c (64 rows each; NC chains). Per block: the forward again, every activation
        into its hs tiles (the sums' operands), then g back through the layers, each
        layer's g handed to the sums warpgroup through go[c] (the last layer's) and its two
        gh tiles in turn (mbarriers both ways), and grad_x out by TMA. ``ops``:
        _bwd_kernel's operands."""
        (xs, gys, hs, zs, go, gh, gxs, w0_s, wh_s, wl_s, bars, x_desc, gy_desc, gx_desc, M,
         b0_ptr, bh_ptr, bl_ptr, acc_ptr, ones_s) = ops
        SUMS: gl.constexpr = NEED_W or NEED_B
        x_ready, gy_ready, hs_free, go_ready, go_free, gh_ready, gh_free = bars
        BM: gl.constexpr = x_desc.block_type.shape[0]
        IN_P: gl.constexpr = x_desc.block_type.shape[1]
        H_P: gl.constexpr = w0_s.shape[0]
        OUT_P: gl.constexpr = gy_desc.block_type.shape[1]
        Z_SMEM: gl.constexpr = _keeps_z(ACT)
        dt: gl.constexpr = x_desc.dtype
        mma_h: gl.constexpr = _acc(H_P)
        mma_o: gl.constexpr = _acc(OUT_P)
        mma_i: gl.constexpr = _acc(IN_P)
        op_h: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_h, k_width=2)
        op_o: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        op_i: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_i, k_width=2)
        hb: gl.constexpr = c * (L_HID + 1)  # this chain's tiles in hs (and zs)
        NC: gl.constexpr = gys.shape[0]  # chains
        gy_s = gys.index(c)
        go_s = go.index(c)
        gx_s = gxs.index(c)
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        n_my = gl.cdiv(gl.cdiv(M, BM) - pid, n_prog)
        n_c = (n_my - c + NC - 1) // NC
        zero_h = gl.zeros([BM, H_P], gl.float32, mma_h)
        zero_o = gl.zeros([BM, OUT_P], gl.float32, mma_o)
        zero_i = gl.zeros([BM, IN_P], gl.float32, mma_i)
        if SUMS:  # (its first g is stored after a fence)
            G_P: gl.constexpr = gh.shape[2]
            zero_g = gl.zeros([BM, G_P], dt, _acc(G_P))
            _zero_pads(go_s, zero_g, OUT_P)
            _zero_pads(gh.index(2 * c), zero_g, H_P)
            _zero_pads(gh.index(2 * c + 1), zero_g, H_P)
        mbarrier.expect(gy_ready.index(c), gy_desc.block_type.nbytes, pred=n_c > 0)
        _tma_load(gy_desc, [(pid + c * n_prog) * BM, 0], gy_ready.index(c), gy_s, pred=n_c > 0)
        for j in range(n_c):
            s = j % X_STAGES
            row = (pid + (NC * j + c) * n_prog) * BM
            mbarrier.wait(x_ready.index(c * X_STAGES + s), (j // X_STAGES) & 1)
            acc = warpgroup_mma(xs.index(c * X_STAGES + s), w0_s.permute((1, 0)), zero_h,
                                use_acc=False)
            acc = _add_bias(acc, b0_ptr, H_P, HAS_BIAS)
            if SUMS:  # the sums are done with hs (its first write is next)
                mbarrier.wait(hs_free.index(c), (j & 1) ^ 1)
            else:  # x's stage is read by nothing more: the loader may refill it (one
                # barrier a stage: a chain two blocks ahead of the loader must not complete
                # a barrier's phase twice before the loader waits on it)
                mbarrier.arrive(hs_free.index(c * X_STAGES + s), count=1)
            h = _keep(acc, hs, zs, hb, ACT, Z_SMEM)
            for k in gl.static_range(L_HID):
                acc = warpgroup_mma(gl.convert_layout(h, op_h), wh_s.index(k).permute((1, 0)),
                                    zero_h, use_acc=False)
                acc = _add_bias(acc, bh_ptr + k * H_P, H_P, HAS_BIAS)
                h = _keep(acc, hs, zs, hb + k + 1, ACT, Z_SMEM)
            zo = zero_o
            if OUT_ACT != 0:
                zo = warpgroup_mma(gl.convert_layout(h, op_o), wl_s.permute((1, 0)), zero_o,
                                   use_acc=False)
                zo = _add_bias(zo, bl_ptr, gy_desc.shape[1], HAS_BIAS)
            mbarrier.wait(gy_ready.index(c), j & 1)
            g = gy_s.load(mma_o).to(gl.float32)
            _thread_barrier()
            nxt = j + 1 < n_c
            mbarrier.expect(gy_ready.index(c), gy_desc.block_type.nbytes, pred=nxt)
            _tma_load(gy_desc, [row + NC * n_prog * BM, 0], gy_ready.index(c), gy_s, pred=nxt)
            if OUT_ACT != 0:  # (relu selects, as torch's backward: see act.times_act_grad)
                g = times_act_grad(g, zo, OUT_ACT)
            gd = g.to(dt)
            if SUMS:
                mbarrier.wait(go_free.index(c), (j & 1) ^ 1)
                _g_view(go_s, OUT_P).store(gd)
                fence_async_shared()  # hs and go, before the sums' MMAs read them
                mbarrier.arrive(go_ready.index(c), count=1)
            acc = warpgroup_mma(gl.convert_layout(gd, op_h), wl_s, zero_h, use_acc=False)
            g = _dact(acc, hs, zs, hb + L_HID, ACT, Z_SMEM)
            for t in gl.static_range(L_HID + 1):  # g of hidden layer L_HID - t
                gd = g.to(dt)
                if SUMS:
                    u = j * (L_HID + 1) + t
                    b = c * 2 + u % 2
                    mbarrier.wait(gh_free.index(b), ((u // 2) & 1) ^ 1)
                    _g_view(gh.index(b), H_P).store(gd)
                    fence_async_shared()
                    mbarrier.arrive(gh_ready.index(b), count=1)
                if t < L_HID:
                    acc = warpgroup_mma(gl.convert_layout(gd, op_h),
                                        wh_s.index(L_HID - 1 - t), zero_h, use_acc=False)
                    g = _dact(acc, hs, zs, hb + L_HID - 1 - t, ACT, Z_SMEM)
                elif NEED_X:
                    dx = warpgroup_mma(gl.convert_layout(gd, op_i), w0_s, zero_i,
                                       use_acc=False)
                    tma.store_wait(pendings=0)
                    gx_s.store(dx.to(dt))
                    fence_async_shared()
                    _tma_store(gx_desc, [row, 0], gx_s)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _ws_sums(ops, L_HID: gl.constexpr, NEED_W: gl.constexpr, NEED_B: gl.constexpr,
                 X_STAGES: gl.constexpr, T_P: gl.constexpr, SLOT: gl.constexpr):
        """The weight-gradient warpgroup: loads x for every chain and, block by block in
        the program's order, adds each layer's g^T h to its sum as the chains hand g over
        (asynchronous MMAs; a g tile is freed as soon as its MMA is done), and each
        layer's bias gradient as g^T @ ones (ones_s: [64, 16] of ones, filled here); at
        the end, writes the sums as this program's partials. ``ops``: _bwd_kernel's
        operands."""
        (xs, gys, hs, zs, go, gh, gxs, w0_s, wh_s, wl_s, bars, x_desc, gy_desc, gx_desc, M,
         b0_ptr, bh_ptr, bl_ptr, acc_ptr, ones_s) = ops
        x_ready, gy_ready, hs_free, go_ready, go_free, gh_ready, gh_free = bars
        BM: gl.constexpr = x_desc.block_type.shape[0]
        IN_P: gl.constexpr = x_desc.block_type.shape[1]
        H_P: gl.constexpr = w0_s.shape[0]
        G_P: gl.constexpr = gh.shape[2]
        NC: gl.constexpr = gys.shape[0]  # chains
        sum_i: gl.constexpr = _acc(IN_P)
        sum_h: gl.constexpr = _acc(H_P)
        sum_b: gl.constexpr = _acc(16)
        N_MMA: gl.constexpr = NEED_W + NEED_B  # MMAs a g tile
        if NEED_B:
            ones_s.store(gl.full(ones_s.shape, 1.0, ones_s.dtype, sum_b))
            fence_async_shared()
        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        n_my = gl.cdiv(gl.cdiv(M, BM) - pid, n_prog)
        for i in gl.static_range(NC * X_STAGES):  # x of each chain's first blocks
            _load_x(x_desc, x_ready, xs, (i % NC) * X_STAGES + i // NC, i, n_my)
        # every sum is g^T h: G_P rows (a layer's outputs, zero past them), h's columns
        d0 = gl.zeros([G_P, IN_P], gl.float32, sum_i)
        d1 = gl.zeros([G_P, H_P], gl.float32, sum_h)
        d2 = gl.zeros([G_P, H_P], gl.float32, sum_h)
        d3 = gl.zeros([G_P, H_P], gl.float32, sum_h)
        d4 = gl.zeros([G_P, H_P], gl.float32, sum_h)
        dl = gl.zeros([G_P, H_P], gl.float32, sum_h)
        e0 = gl.zeros([G_P, 16], gl.float32, sum_b)
        e1 = gl.zeros([G_P, 16], gl.float32, sum_b)
        e2 = gl.zeros([G_P, 16], gl.float32, sum_b)
        e3 = gl.zeros([G_P, 16], gl.float32, sum_b)
        e4 = gl.zeros([G_P, 16], gl.float32, sum_b)
        el = gl.zeros([G_P, 16], gl.float32, sum_b)
        if NEED_W or NEED_B:
            for i in range(n_my):
                cc = i % NC
                j = i // NC
                s = j % X_STAGES
                hb = cc * (L_HID + 1)
                mbarrier.wait(go_ready.index(cc), j & 1)
                if NEED_W:
                    dl = warpgroup_mma(go.index(cc).permute((1, 0)), hs.index(hb + L_HID), dl,
                                       is_async=True)
                if NEED_B:
                    el = warpgroup_mma(go.index(cc).permute((1, 0)), ones_s, el, is_async=True)
                for t in gl.static_range(L_HID + 1):
                    u = j * (L_HID + 1) + t
                    b = cc * 2 + u % 2
                    mbarrier.wait(gh_ready.index(b), (u // 2) & 1)
                    # weight layer L_HID - t's sums; its input: x for the first layer
                    if t < L_HID:
                        h_s = hs.index(hb + L_HID - 1 - t)
                    else:
                        h_s = xs.index(cc * X_STAGES + s)
                    d0, d1, d2, d3, d4, e0, e1, e2, e3, e4 = _tile_sums(
                        L_HID - t, gh.index(b), h_s, ones_s, d0, d1, d2, d3, d4, e0, e1, e2, e3,
                        e4, NEED_W, NEED_B)
                    # the previous MMA (the tile before this one) is done: free its tile
                    dl, el = warpgroup_mma_wait(N_MMA, deps=(dl, el))
                    if t == 0:
                        mbarrier.arrive(go_free.index(cc), count=1)
                    else:
                        mbarrier.arrive(gh_free.index(cc * 2 + (u - 1) % 2), count=1)
                d0, d1, d2, d3, d4, dl = _wait_sums(d0, d1, d2, d3, d4, dl, L_HID)
                if NEED_B:
                    e0, e1, e2, e3, e4, el = _wait_sums(e0, e1, e2, e3, e4, el, L_HID)
                mbarrier.arrive(gh_free.index(cc * 2 + (j * (L_HID + 1) + L_HID) % 2), count=1)
                mbarrier.arrive(hs_free.index(cc), count=1)
                # x's stage is read by nothing more: its next block
                _load_x(x_desc, x_ready, xs, cc * X_STAGES + s, NC * (j + X_STAGES) + cc, n_my)
        else:
            for i in range(n_my):  # x alone: each stage refilled once the chain's forward
                cc = i % NC        # has read it (the chain arrives at the stage's hs_free)
                j = i // NC
                s = j % X_STAGES
                mbarrier.wait(hs_free.index(cc * X_STAGES + s), (j // X_STAGES) & 1)
                _load_x(x_desc, x_ready, xs, cc * X_STAGES + s, NC * (j + X_STAGES) + cc, n_my)
        base = acc_ptr + pid.to(gl.int64) * (L_HID + 2) * SLOT
        if NEED_B:
            W_SLOT: gl.constexpr = T_P * T_P
            _store_bias_sum(base + W_SLOT, e0, T_P)
            if L_HID > 0:
                _store_bias_sum(base + SLOT + W_SLOT, e1, T_P)
            if L_HID > 1:
                _store_bias_sum(base + 2 * SLOT + W_SLOT, e2, T_P)
            if L_HID > 2:
                _store_bias_sum(base + 3 * SLOT + W_SLOT, e3, T_P)
            if L_HID > 3:
                _store_bias_sum(base + 4 * SLOT + W_SLOT, e4, T_P)
            _store_bias_sum(base + (L_HID + 1) * SLOT + W_SLOT, el, T_P)
        if NEED_W:
            _store_sum(base, d0, T_P)
            if L_HID > 0:
                _store_sum(base + SLOT, d1, T_P)
            if L_HID > 1:
                _store_sum(base + 2 * SLOT, d2, T_P)
            if L_HID > 2:
                _store_sum(base + 3 * SLOT, d3, T_P)
            if L_HID > 3:
                _store_sum(base + 4 * SLOT, d4, T_P)
            _store_sum(base + (L_HID + 1) * SLOT, dl, T_P)

    @gluon.jit
    def _ws_worker(c: gl.constexpr, ops, L_HID: gl.constexpr, ACT: gl.constexpr,
                   OUT_ACT: gl.constexpr, NEED_X: gl.constexpr, NEED_W: gl.constexpr,
                   NEED_B: gl.constexpr, HAS_BIAS: gl.constexpr, X_STAGES: gl.constexpr,
                   T_P: gl.constexpr, SLOT: gl.constexpr):
        """Worker c: chain c below the chain count, else the sums (the workers share one
        signature)."""
        if c < ops[1].shape[0]:  # gys: one tile a chain
            _ws_chain(c, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS, X_STAGES)
        else:
            _ws_sums(ops, L_HID, NEED_W, NEED_B, X_STAGES, T_P, SLOT)

    @gluon.jit
    def _bwd_kernel(x_desc, gy_desc, gx_desc, w0_desc, wh_desc, wl_desc, acc_ptr, b0_ptr,
                    bh_ptr, bl_ptr, M, h_layout: gl.constexpr, g_layout: gl.constexpr,
                    ones_layout: gl.constexpr,
                    L_HID: gl.constexpr, ACT: gl.constexpr, OUT_ACT: gl.constexpr,
                    NEED_X: gl.constexpr, NEED_W: gl.constexpr, NEED_B: gl.constexpr,
                    HAS_BIAS: gl.constexpr, X_STAGES: gl.constexpr, T_P: gl.constexpr,
                    SLOT: gl.constexpr, G_P: gl.constexpr, CHAINS: gl.constexpr,
                    CHAIN_REGS: gl.constexpr, SUM_REGS: gl.constexpr,
                    num_warps: gl.constexpr):
        """The default warpgroup and the first CHAINS - 1 workers each run a chain over
        every CHAINS-th of the program's 64-row blocks (_ws_chain); the last worker sums
        the weight gradients and loads x (_ws_sums)."""
        BM: gl.constexpr = x_desc.block_type.shape[0]
        IN_P: gl.constexpr = x_desc.block_type.shape[1]
        H_P: gl.constexpr = w0_desc.block_type.shape[0]
        OUT_P: gl.constexpr = gy_desc.block_type.shape[1]
        Z_SMEM: gl.constexpr = _keeps_z(ACT)
        dt: gl.constexpr = x_desc.dtype
        w0_s = gl.allocate_shared_memory(dt, [H_P, IN_P], w0_desc.layout)
        wh_s = gl.allocate_shared_memory(dt, [max(L_HID, 1), H_P, H_P], wh_desc.layout)
        wl_s = gl.allocate_shared_memory(dt, [OUT_P, H_P], wl_desc.layout)
        # per chain c: x's stages c * X_STAGES.., hs (zs) c * (L_HID + 1).., gh c * 2..
        xs = gl.allocate_shared_memory(dt, [CHAINS * X_STAGES, BM, IN_P], x_desc.layout)
        gys = gl.allocate_shared_memory(dt, [CHAINS, BM, OUT_P], gy_desc.layout)
        hs = gl.allocate_shared_memory(dt, [CHAINS * (L_HID + 1), BM, H_P], h_layout)
        zs = gl.allocate_shared_memory(dt, [CHAINS * (L_HID + 1) if Z_SMEM else 1, BM, H_P],
                                       h_layout)
        go = gl.allocate_shared_memory(dt, [CHAINS, BM, G_P], g_layout)
        gh = gl.allocate_shared_memory(dt, [2 * CHAINS, BM, G_P], g_layout)
        gxs = gl.allocate_shared_memory(dt, [CHAINS, BM, IN_P], gx_desc.layout)
        ones_s = gl.allocate_shared_memory(dt, [BM, 16], ones_layout)  # bias sums' operand
        lay: gl.constexpr = mbarrier.MBarrierLayout()
        wbar = gl.allocate_shared_memory(gl.int64, [1], lay)
        x_ready = gl.allocate_shared_memory(gl.int64, [CHAINS * X_STAGES, 1], lay)
        gy_ready = gl.allocate_shared_memory(gl.int64, [CHAINS, 1], lay)
        # hs_free: chain c's hs tiles free (the sums arrive), or, without sums, x's stage
        # c * X_STAGES + s read (the chain arrives)
        hs_free = gl.allocate_shared_memory(gl.int64, [CHAINS * X_STAGES, 1], lay)
        go_ready = gl.allocate_shared_memory(gl.int64, [CHAINS, 1], lay)
        go_free = gl.allocate_shared_memory(gl.int64, [CHAINS, 1], lay)
        gh_ready = gl.allocate_shared_memory(gl.int64, [2 * CHAINS, 1], lay)
        gh_free = gl.allocate_shared_memory(gl.int64, [2 * CHAINS, 1], lay)
        mbarrier.init(wbar, count=1)
        for j in gl.static_range(CHAINS * X_STAGES):
            mbarrier.init(x_ready.index(j), count=1)
            mbarrier.init(hs_free.index(j), count=1)
        for j in gl.static_range(CHAINS):
            mbarrier.init(gy_ready.index(j), count=1)
            mbarrier.init(go_ready.index(j), count=1)
            mbarrier.init(go_free.index(j), count=1)
        for j in gl.static_range(2 * CHAINS):
            mbarrier.init(gh_ready.index(j), count=1)
            mbarrier.init(gh_free.index(j), count=1)
        _load_weights(w0_desc, wh_desc, wl_desc, wbar, w0_s, wh_s, wl_s, L_HID)
        mbarrier.wait(wbar, 0)
        bars = (x_ready, gy_ready, hs_free, go_ready, go_free, gh_ready, gh_free)
        ops = (xs, gys, hs, zs, go, gh, gxs, w0_s, wh_s, wl_s, bars, x_desc, gy_desc, gx_desc,
               M, b0_ptr, bh_ptr, bl_ptr, acc_ptr, ones_s)
        # (the constants inline: a tuple built here would turn them into tensors)
        if CHAINS == 2:
            gl.warp_specialize([
                (_ws_chain, (0, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                             X_STAGES)),
                (_ws_worker, (1, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                              X_STAGES, T_P, SLOT)),
                (_ws_worker, (2, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                              X_STAGES, T_P, SLOT))],
                [4, 4], [CHAIN_REGS, SUM_REGS])
        else:
            gl.warp_specialize([
                (_ws_chain, (0, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                             X_STAGES)),
                (_ws_worker, (1, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                              X_STAGES, T_P, SLOT)),
                (_ws_worker, (2, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                              X_STAGES, T_P, SLOT)),
                (_ws_worker, (3, ops, L_HID, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, HAS_BIAS,
                              X_STAGES, T_P, SLOT))],
                [4, 4, 4], [CHAIN_REGS, CHAIN_REGS, SUM_REGS])

    _LAUNCHER = launch.Launcher(_bwd_kernel)


def maxnreg(chains: int) -> int:
    """Registers a thread at launch: (chains + 1) warpgroups in one SM's 64K (168 for
    two chains, 128 for three)."""
    return 65536 // ((chains + 1) * 128) // 8 * 8


def smem_bytes(spec, chains: int, x_stages: int) -> int:
    """Shared memory of one program: the weights and, per chain, x's stages, grad_y's
    tile, every hidden layer's activation (and pre-activation where kept), g's tiles,
    grad_x's tile."""
    IN_P, H_P, OUT_P = _pads(spec)
    L_HID = spec.n_layers - 2
    hz = (L_HID + 1) * (2 if keeps_z(spec.activation_id) else 1)  # h (and z) tiles
    return spec.dtype.itemsize * (
        H_P * IN_P + L_HID * H_P * H_P + OUT_P * H_P  # (no hidden weights: none kept)
        # a chain's: x's stages, grad_y, g's three (go, gh), h (z), grad_x
        + chains * BLOCK_M * (x_stages * IN_P + OUT_P + 3 * G_P + hz * H_P + IN_P)
        + (BLOCK_M * 16 if spec.bias else 0)) + 128  # the bias sums' tile of ones


def tuning(spec) -> tuple[int, int] | None:
    """(chains, x's stages), or None where nothing fits shared memory: three chains at
    hidden widths up to 32 where their tiles fit, else two; two x stages where they fit,
    else one."""
    for chains in (3, 2) if _pads(spec)[1] <= 32 else (2,):
        for stages in (2, 1):
            if smem_bytes(spec, chains, stages) <= SMEM_BYTES:
                return chains, stages
    return None


def tma_out(spec):
    """``spec`` as this kernel runs it: the out width rounded up to a multiple of 8, or spec
    itself. TMA reads grad_y and the last weight in 16-byte rows; for an out width that is
    not a multiple of 8 (an RGB image's 3, an SDF's 1) the host pads grad_y, the last
    weight and the last bias with zero rows/columns (backward._gluon_backward) and keeps
    the real rows of their gradients: the padded outputs' gradients are exact zeros."""
    OUT = spec.out_features
    if OUT % 8 == 0:
        return spec
    return dataclasses.replace(spec, widths=spec.widths[:-1] + (OUT + (-OUT) % 8,))


def eligible(spec, device: torch.device) -> tuple[bool, str]:
    """Whether the recomputing backward of ``spec`` on ``device`` runs this kernel, and why
    not (shown by explain())."""
    ok, why = hopper_forward.device_ok(spec, device)
    if not ok:
        return ok, why
    if envvars.get(ENV, "1") == "0":
        return False, f"{ENV}=0"
    spec = tma_out(spec)
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    if H not in HIDDEN:
        return False, f"hidden width {H} (16, 32 or 64)"
    if IN % 8 or IN > 64 or OUT > 64:
        return False, "in width not a multiple of 8 up to 64, or out width above 64"
    if spec.n_layers - 2 > MAX_HIDDEN_WEIGHTS:
        return False, f"more than {MAX_HIDDEN_WEIGHTS} hidden-to-hidden weights"
    if spec.bias and spec.n_layers - 2 > MAX_HIDDEN_WEIGHTS_BIAS:
        return False, (f"biases with more than {MAX_HIDDEN_WEIGHTS_BIAS} hidden-to-hidden "
                       "weights (the bias sums' registers)")
    if tuning(spec) is None:
        return False, "the weights and tiles do not fit one program's shared memory"
    return True, ""


def kernel_consts(spec, need_x: bool, need_w: bool, need_b: bool) -> dict:
    """The kernel's constexpr arguments for ``spec`` and the gradients asked for."""
    gdt = gl.float16 if spec.dtype == torch.float16 else gl.bfloat16
    lay = gl.NVMMASharedLayout.get_default_for
    meta = _launch_meta(spec, "cuda")
    T_P = meta["H_P"]  # the Triton backward's reduction's slots
    L_HID = spec.n_layers - 2
    chains, stages = tuning(spec)
    IN_P, H_P, _ = _pads(spec)
    if chains == 2:
        # the sums warpgroup holds up to 6 [64, 64] fp32 tiles: 160 registers a thread at
        # 3 hidden-to-hidden weights, 192 at 4, and 8 a layer for the biases; the chains
        # share what is left (sm_90 compile: no spills at these)
        sums = 232 if L_HID <= 3 and not need_b else 240
    else:  # its [64, n] tiles (n / 2 registers each) and 56 more
        tiles = (IN_P + (L_HID + 1) * H_P) // 2 + (8 * (L_HID + 2) if need_b else 0)
        sums = (tiles + 56 + 7) // 8 * 8
    return dict(h_layout=lay([BLOCK_M, H_P], gdt), g_layout=lay([BLOCK_M, G_P], gdt),
                ones_layout=lay([BLOCK_M, 16], gdt), L_HID=L_HID, ACT=meta["ACT"],
                OUT_ACT=meta["OUT_ACT"], NEED_X=need_x, NEED_W=need_w,
                NEED_B=need_b, HAS_BIAS=spec.bias, X_STAGES=stages, T_P=T_P,
                SLOT=T_P * T_P + T_P, G_P=G_P, CHAINS=chains,
                CHAIN_REGS=((chains + 1) * maxnreg(chains) - sums) // chains // 8 * 8,
                SUM_REGS=sums)


class Plan:
    """The Gluon backward of one (spec, device, needs): ``accepts(x, grad_y)``, then the
    call writes grad_x and the gradients' buffer."""

    def __init__(self, spec, device: torch.device, need_x: bool, need_w: bool,
                 need_b: bool = False):
        if device.index is None:  # launches name the device by its index
            device = torch.device(device.type, torch.cuda.current_device())
        self.spec, self.device = spec, device
        self.need_x, self.need_w, self.need_b = need_x, need_w, need_b and spec.bias
        bm = BLOCK_M
        self.IN, self.H, self.OUT = spec.in_features, spec.widths[1], spec.out_features
        self.L_HID = spec.n_layers - 2
        IN_P, H_P, OUT_P = _pads(spec)
        gdt = gl.float16 if spec.dtype == torch.float16 else gl.bfloat16
        lay = gl.NVMMASharedLayout.get_default_for
        self.x_block, self.y_block = [bm, IN_P], [bm, OUT_P]
        self.x_layout, self.y_layout = lay(self.x_block, gdt), lay(self.y_block, gdt)
        self.w_blocks = ([H_P, IN_P], [H_P, H_P], [OUT_P, H_P])
        self.w_layouts = tuple(lay(b, gdt) for b in self.w_blocks)
        self.consts = kernel_consts(spec, need_x, need_w, self.need_b)
        T_P, self.SLOT = self.consts["T_P"], self.consts["SLOT"]
        self.reduce = _reduce_layout(spec, T_P, T_P * T_P, self.SLOT, need_w, self.need_b,
                                     "cuda")
        self.max_programs = torch.cuda.get_device_properties(device).multi_processor_count
        self.lean = launch.enabled(device)
        self._wdesc: dict = {}
        self._xdesc: dict = {}  # row_desc's: x and grad_x
        self._ydesc: dict = {}  # grad_y
        self._kernels: dict = {}  # int_key(M) -> launch.py entry

    @staticmethod
    def rows(grad_y: torch.Tensor) -> torch.Tensor:
        """grad_y as TMA can read it: itself, or a contiguous copy (e.g. a broadcast
        gradient, a sum's, whose row stride is 0)."""
        return grad_y if hopper_forward.tma_rows(grad_y) else grad_y.contiguous()

    @staticmethod
    def accepts(x: torch.Tensor, grad_y: torch.Tensor) -> bool:
        return (hopper_forward.tma_rows(x) and hopper_forward.tma_rows(grad_y)
                and 0 < x.shape[0] <= MAX_ROWS)

    def __call__(self, grad_y, x, weights, biases, gx, out):
        """Writes grad_x into ``gx`` ([M, IN], contiguous, 16-byte aligned; ignored unless
        need_x) and the reduction's buffer ``out`` (unless neither need_w nor need_b);
        weights: w0, the hidden weights back to back, wl; biases likewise or None (all
        16-byte aligned, dense)."""
        launch.bind_context(self.device)
        M = x.shape[0]
        P = min(self.max_programs, (M + BLOCK_M - 1) // BLOCK_M)
        acc = x.new_empty((P, self.spec.n_layers, self.SLOT), dtype=torch.float32)
        xd = row_desc(self._xdesc, x, self.x_block, self.x_layout)
        gyd = row_desc(self._ydesc, grad_y, self.y_block, self.y_layout)
        gxd = row_desc(self._xdesc, gx, self.x_block, self.x_layout)
        w0d, whd, wld = weight_descs(self._wdesc, weights, self.IN, self.H, self.OUT,
                                     self.L_HID, self.w_blocks, self.w_layouts)
        b0, bh, bl = biases if biases is not None else (acc, acc, acc)
        args = (xd, gyd, gxd, w0d, whd, wld, acc, b0, bh, bl, M)
        key = int_key(M)
        entry = self._kernels.get(key) if self.lean else None
        if entry is not None and launch.direct_ok(self.device.index):
            _LAUNCHER.launch_entry(entry, (P,), args, self.device.index)
        else:
            ck = launch._through_triton("the Gluon narrow backward", lambda: _bwd_kernel[(P,)](
                *args, **self.consts, num_warps=4, maxnreg=maxnreg(self.consts["CHAINS"])))
            if self.lean:
                e = launch._entry(ck, launch._constexpr_names(_bwd_kernel),
                                  dict(self.consts, num_warps=4))
                if e is not None:
                    self._kernels[key] = e
        if self.need_w or self.need_b:
            _reduce_launch(acc, out, self.reduce, self.IN, self.H, self.OUT, self.L_HID,
                           self.device)
