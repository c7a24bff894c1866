"""The narrow second-order backward in one Triton kernel (host side: second_order.py).

The closed form of fusedmlp_xpu/second_order.py for one block of rows at a time, every
layer in one program: the forward's pre-activations z_l, the first backward's gradients
u_l (from v), then the tangent pass from G (the gradient at the input gradient g) and the
backward pass with the second-derivative terms. What a block needs again later (z_l,
u_l, zbar_l) goes to the program's own scratch tiles, which it reuses block after block
(they stay in L2); the weight and bias gradients are summed into the program's own fp32
slice (no atomics), added up by the host. Layout as tiles.py: layer 0 maps in -> H, the
L_HID hidden layers H -> H (stacked), the last H -> out.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..act import act as _act
from ..act import act_grad2 as _act_grad2
from ..act import times_act_grad as _times_act_grad
from .backward_kernels import _accumulate, _accumulate_bias
from .tiles import _dot, _load_b, _load_w, _load_wT


@triton.jit
def _rows(ptr, rows, rmask, stride, C, C_P: tl.constexpr):
    """A [BM, C_P] tile of a row-major tensor (zero past the rows and columns)."""
    c = tl.arange(0, C_P)
    return tl.load(ptr + rows[:, None] * stride + c[None, :],
                   mask=rmask[:, None] & (c[None, :] < C), other=0.0)


@triton.jit
def _put(ptr, rows, rmask, stride, C, C_P: tl.constexpr, t):
    c = tl.arange(0, C_P)
    tl.store(ptr + rows[:, None] * stride + c[None, :], t,
             mask=rmask[:, None] & (c[None, :] < C))


@triton.jit
def _slot(base, BM: tl.constexpr, C_P: tl.constexpr):
    """The pointers of one [BM, C_P] scratch tile (the program's own: no masks)."""
    r = tl.arange(0, BM)
    c = tl.arange(0, C_P)
    return base + r[:, None] * C_P + c[None, :]


@triton.jit
def _accumulate2(acc_ptr, g1, h1, g2, h2, R_P: tl.constexpr, C_P: tl.constexpr,
                 F32: tl.constexpr, PREC: tl.constexpr):
    """acc[R_P, C_P] (this program's fp32 slice) += g1^T @ h1 + g2^T @ h2: one read and one
    write of the slice for both terms."""
    r = tl.arange(0, R_P)
    c = tl.arange(0, C_P)
    ptrs = acc_ptr + r[:, None] * C_P + c[None, :]
    tl.store(ptrs, tl.load(ptrs) + _dot(tl.trans(g1), h1, F32, PREC)
             + _dot(tl.trans(g2), h2, F32, PREC))


@triton.jit
def _second_order_kernel(
    x_ptr, v_ptr, gg_ptr, w0_ptr, wh_ptr, wl_ptr, b0_ptr, bh_ptr, bl_ptr,
    gx_ptr, gv_ptr, z_ptr, u_ptr, zb_ptr, t_ptr, acc_ptr,
    M, IN, H, OUT, s_x, s_v, s_g,
    L_HID: tl.constexpr, IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    BLOCK_M: tl.constexpr, ACT: tl.constexpr, OUT_ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr, NEED_X: tl.constexpr, NEED_V: tl.constexpr,
    NEED_W: tl.constexpr, NEED_B: tl.constexpr, HID2: tl.constexpr, OUT2: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, MERGE_DW: tl.constexpr = False,
):
    """x, v (the first backward's grad_y), gg (the gradient at g = (dy/dx)^T v) -> the
    gradients of x (gx), v (gv), every weight and bias (acc: this program's partial sums,
    [W0 | W1..W_L_HID | W_last | b0 | b1.. | b_last], each padded). HID2 / OUT2: the
    hidden / output activation has a non-zero second derivative; a layer without one adds
    no zbar term at all (eager's double backward has none: a zero times a NaN would be a
    NaN it does not have). Neither: the backward pass carries nothing (the host fills gx
    and the biases' gradients with zeros). MERGE_DW (with HID2 or OUT2, and
    NEED_W): the tangent pass stores each layer's input t to scratch (t_ptr) instead of
    adding d_l^T t_{l-1} into acc, and the backward pass adds both weight-gradient terms of
    a layer in one read-modify-write of its fp32 slice (half the acc traffic, one more
    [BLOCK_M, P] tile a layer to scratch)."""
    pid = tl.program_id(0)
    dt = x_ptr.dtype.element_ty
    TILE: tl.constexpr = BLOCK_M * H_P
    SCR: tl.constexpr = (L_HID + 1) * TILE + BLOCK_M * OUT_P
    W_H: tl.constexpr = H_P * IN_P  # offsets in acc: the hidden weights, the last, biases
    W_L: tl.constexpr = W_H + L_HID * H_P * H_P
    B0: tl.constexpr = W_L + OUT_P * H_P
    B_L: tl.constexpr = B0 + (L_HID + 1) * H_P
    zs = z_ptr + pid * SCR
    us = u_ptr + pid * SCR
    zbs = zb_ptr + pid * SCR
    ts = t_ptr + pid * SCR  # MERGE_DW: the tangent entering layer l >= 1 at (l - 1) * TILE
    SECOND: tl.constexpr = HID2 or OUT2
    DEFER: tl.constexpr = MERGE_DW and SECOND and NEED_W
    acc = acc_ptr + pid * (B_L + OUT_P)
    for blk in range(pid, tl.cdiv(M, BLOCK_M), tl.num_programs(0)):
        rows = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        x = _rows(x_ptr, rows, rmask, s_x, IN, IN_P)
        # the forward: every pre-activation to scratch
        z = _dot(x, _load_wT(w0_ptr, IN, H, IN_P, H_P), F32, PREC)
        if HAS_BIAS:
            z += _load_b(b0_ptr, H, H_P)[None, :]
        tl.store(_slot(zs, BLOCK_M, H_P), z.to(dt))
        for j in tl.static_range(L_HID):
            a = _act(z, ACT).to(dt)
            z = _dot(a, _load_wT(wh_ptr + j * H * H, H, H, H_P, H_P), F32, PREC)
            if HAS_BIAS:
                z += _load_b(bh_ptr + j * H, H, H_P)[None, :]
            tl.store(_slot(zs + (j + 1) * TILE, BLOCK_M, H_P), z.to(dt))
        a = _act(z, ACT).to(dt)
        zo = _dot(a, _load_wT(wl_ptr, H, OUT, H_P, OUT_P), F32, PREC)
        if HAS_BIAS:
            zo += _load_b(bl_ptr, OUT, OUT_P)[None, :]
        zo = zo.to(dt).to(tl.float32)  # as the other passes read it back
        # each pass reads back what the one before stored to scratch, in another layout:
        # other threads' values, which Triton orders only with an explicit barrier
        tl.debug_barrier()
        # the first backward from v: u_l (the gradient at layer l's output) to scratch
        v = _rows(v_ptr, rows, rmask, s_v, OUT, OUT_P).to(tl.float32)
        d = _times_act_grad(v, zo, OUT_ACT).to(dt)
        u = _dot(d, _load_w(wl_ptr, H, OUT, H_P, OUT_P), F32, PREC)
        tl.store(_slot(us + L_HID * TILE, BLOCK_M, H_P), u.to(dt))
        for j in tl.static_range(L_HID):
            l = L_HID - j
            zl = tl.load(_slot(zs + l * TILE, BLOCK_M, H_P)).to(tl.float32)
            d = _times_act_grad(u, zl, ACT).to(dt)
            u = _dot(d, _load_w(wh_ptr + (l - 1) * H * H, H, H, H_P, H_P), F32, PREC)
            tl.store(_slot(us + (l - 1) * TILE, BLOCK_M, H_P), u.to(dt))
        tl.debug_barrier()  # u stored
        # the tangent pass from gg: T_l = t W_l^T, t = T s'(z_l); W_l gets d_l^T t_{l-1};
        # zbar_l = T_l u_l s''(z_l) to scratch
        t = _rows(gg_ptr, rows, rmask, s_g, IN, IN_P).to(dt)
        for l in tl.static_range(L_HID + 1):
            zl = tl.load(_slot(zs + l * TILE, BLOCK_M, H_P)).to(tl.float32)
            ul = tl.load(_slot(us + l * TILE, BLOCK_M, H_P)).to(tl.float32)
            if l == 0:
                wT = _load_wT(w0_ptr, IN, H, IN_P, H_P)
                if NEED_W and not DEFER:
                    _accumulate(acc, _times_act_grad(ul, zl, ACT).to(dt), t, H_P, IN_P,
                                F32, PREC)
            else:
                wT = _load_wT(wh_ptr + (l - 1) * H * H, H, H, H_P, H_P)
                if DEFER:
                    tl.store(_slot(ts + (l - 1) * TILE, BLOCK_M, H_P), t)
                elif NEED_W:
                    _accumulate(acc + W_H + (l - 1) * H_P * H_P,
                                _times_act_grad(ul, zl, ACT).to(dt), t, H_P, H_P, F32, PREC)
            T = _dot(t, wT, F32, PREC)
            if HID2:
                tl.store(_slot(zbs + l * TILE, BLOCK_M, H_P),
                         (T * ul * _act_grad2(zl, ACT)).to(dt))
            t = _times_act_grad(T, zl, ACT).to(dt)
        if DEFER:
            tl.store(_slot(ts + L_HID * TILE, BLOCK_M, H_P), t)
        elif NEED_W:
            _accumulate(acc + W_L, _times_act_grad(v, zo, OUT_ACT).to(dt), t, OUT_P, H_P,
                        F32, PREC)
        T = _dot(t, _load_wT(wl_ptr, H, OUT, H_P, OUT_P), F32, PREC)
        if NEED_V:
            _put(gv_ptr, rows, rmask, OUT, OUT, OUT_P, _times_act_grad(T, zo, OUT_ACT).to(dt))
        if SECOND:
            tl.debug_barrier()  # zbar (and t) stored
            # the backward pass: e_l = (e_{l+1} W_{l+1}) s'(z_l) + zbar_l, each term only
            # where it exists (OUT2: the last layer's e; HID2: the hidden zbar terms)
            zp = tl.load(_slot(zs + L_HID * TILE, BLOCK_M, H_P)).to(tl.float32)
            if OUT2:
                e = (T * v * _act_grad2(zo, OUT_ACT)).to(dt)
                if DEFER:
                    _accumulate2(acc + W_L, e, _act(zp, ACT).to(dt),
                                 _times_act_grad(v, zo, OUT_ACT).to(dt),
                                 tl.load(_slot(ts + L_HID * TILE, BLOCK_M, H_P)), OUT_P,
                                 H_P, F32, PREC)
                elif NEED_W:
                    _accumulate(acc + W_L, e, _act(zp, ACT).to(dt), OUT_P, H_P, F32, PREC)
                if NEED_B:
                    _accumulate_bias(acc + B_L, e, OUT_P)
                g = _dot(e, _load_w(wl_ptr, H, OUT, H_P, OUT_P), F32, PREC)
            elif DEFER:  # the tangent's term alone
                _accumulate(acc + W_L, _times_act_grad(v, zo, OUT_ACT).to(dt),
                            tl.load(_slot(ts + L_HID * TILE, BLOCK_M, H_P)), OUT_P, H_P,
                            F32, PREC)
            for j in tl.static_range(L_HID):
                l = L_HID - j
                zl = zp
                zp = tl.load(_slot(zs + (l - 1) * TILE, BLOCK_M, H_P)).to(tl.float32)
                if OUT2 or j > 0:  # a gradient from the layer above
                    e = _times_act_grad(g, zl, ACT)
                    if HID2:
                        e += tl.load(_slot(zbs + l * TILE, BLOCK_M, H_P)).to(tl.float32)
                else:  # the first term: this layer's zbar (HID2)
                    e = tl.load(_slot(zbs + l * TILE, BLOCK_M, H_P)).to(tl.float32)
                e = e.to(dt)
                if DEFER:
                    ul = tl.load(_slot(us + l * TILE, BLOCK_M, H_P)).to(tl.float32)
                    _accumulate2(acc + W_H + (l - 1) * H_P * H_P, e, _act(zp, ACT).to(dt),
                                 _times_act_grad(ul, zl, ACT).to(dt),
                                 tl.load(_slot(ts + (l - 1) * TILE, BLOCK_M, H_P)),
                                 H_P, H_P, F32, PREC)
                elif NEED_W:
                    _accumulate(acc + W_H + (l - 1) * H_P * H_P, e, _act(zp, ACT).to(dt),
                                H_P, H_P, F32, PREC)
                if NEED_B:
                    _accumulate_bias(acc + B0 + l * H_P, e, H_P)
                g = _dot(e, _load_w(wh_ptr + (l - 1) * H * H, H, H, H_P, H_P), F32, PREC)
            if OUT2 or L_HID > 0:
                e = _times_act_grad(g, zp, ACT)
                if HID2:
                    e += tl.load(_slot(zbs, BLOCK_M, H_P)).to(tl.float32)
            else:
                e = tl.load(_slot(zbs, BLOCK_M, H_P)).to(tl.float32)
            e = e.to(dt)
            if DEFER:
                u0 = tl.load(_slot(us, BLOCK_M, H_P)).to(tl.float32)
                _accumulate2(acc, e, x, _times_act_grad(u0, zp, ACT).to(dt),
                             _rows(gg_ptr, rows, rmask, s_g, IN, IN_P).to(dt), H_P, IN_P,
                             F32, PREC)
            elif NEED_W:
                _accumulate(acc, e, x, H_P, IN_P, F32, PREC)
            if NEED_B:
                _accumulate_bias(acc + B0, e, H_P)
            if NEED_X:
                gx = _dot(e, _load_w(w0_ptr, IN, H, IN_P, H_P), F32, PREC)
                _put(gx_ptr, rows, rmask, IN, IN, IN_P, gx.to(dt))
        tl.debug_barrier()  # every read of this block's scratch before the next one's stores


@triton.jit
def _so_step(a, z, b_ptr, o1_ptr, o2_ptr, offs, m, MODE: tl.constexpr, ACT: tl.constexpr):
    """MODE 1-3 of _so_pointwise_kernel from a and z (fp32) at offs: o1 (and o2) stored
    -> o1 as rounded, in fp32."""
    dt = o1_ptr.dtype.element_ty
    r = _times_act_grad(a, z, ACT)
    if MODE == 2:
        b = tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(o2_ptr + offs, (a * b * _act_grad2(z, ACT)).to(dt), mask=m)
    if MODE == 3:
        r += tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
    r = r.to(dt)
    tl.store(o1_ptr + offs, r, mask=m)
    return r.to(tl.float32)


@triton.jit
def _so_pointwise_kernel(a_ptr, b_ptr, z_ptr, o1_ptr, o2_ptr, s_ptr, n, sz,
                         MODE: tl.constexpr, ACT: tl.constexpr, BLOCK: tl.constexpr,
                         SUM_W: tl.constexpr, Z_W: tl.constexpr = 0):
    """The elementwise steps of the second-order backward's GEMM form (second_order.py,
    Tuning.split) over n contiguous elements, in fp32, each output rounded once, as the
    one kernel above rounds its tiles (Z_W > 0: z is rows of Z_W elements sz apart, a
    layer's columns of the forward's saved pre-activations, read in place):
    MODE 0: o1 = act(z)                              (the forward's activations)
    MODE 1: o1 = a act'(z)                           (d = u s'(z))
    MODE 2: o1 = a act'(z), o2 = a b act''(z)        (t and zbar from T and u)
    MODE 3: o1 = a act'(z) + b                       (e from e W and zbar)
    SUM_W > 0: o1 is rows of SUM_W (a power of two dividing BLOCK): each program also
    stores the fp32 column sums of its rows of o1 as rounded, at s_ptr + program * SUM_W
    (a bias gradient's partial sums: no second pass over o1)."""
    if SUM_W > 0:  # the block as its [rows, SUM_W] tile: the column sums stay in registers
        rows = tl.program_id(0) * (BLOCK // SUM_W) + tl.arange(0, BLOCK // SUM_W)
        offs = rows[:, None] * SUM_W + tl.arange(0, SUM_W)[None, :]
        zoffs = offs
        if Z_W > 0:  # Z_W == SUM_W
            zoffs = rows.to(tl.int64)[:, None] * sz + tl.arange(0, SUM_W)[None, :]
    else:
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        zoffs = offs
        if Z_W > 0:
            zoffs = (offs // Z_W).to(tl.int64) * sz + offs % Z_W  # M x sz: past 2^31
    m = offs < n
    dt = o1_ptr.dtype.element_ty
    z = tl.load(z_ptr + zoffs, mask=m, other=0.0).to(tl.float32)
    if MODE == 0:
        tl.store(o1_ptr + offs, _act(z, ACT).to(dt), mask=m)
    else:
        a = tl.load(a_ptr + offs, mask=m, other=0.0).to(tl.float32)
        r = _so_step(a, z, b_ptr, o1_ptr, o2_ptr, offs, m, MODE, ACT)
        if SUM_W > 0:
            tl.store(s_ptr + tl.program_id(0) * SUM_W + tl.arange(0, SUM_W),
                     tl.sum(tl.where(m, r, 0.0), axis=0))


@triton.jit
def _so_mm_kernel(a_ptr, w_ptr, bias_ptr, z_ptr, b_ptr, p_ptr, o1_ptr, o2_ptr, s_ptr,
                  M, K, N, sa, swk, swn, sz, MODE: tl.constexpr, ACT: tl.constexpr,
                  BM: tl.constexpr, KP: tl.constexpr, NP: tl.constexpr,
                  HAS_BIAS: tl.constexpr, KEEP_P: tl.constexpr, SUM: tl.constexpr,
                  F32: tl.constexpr, PREC: tl.constexpr):
    """The GEMM form's product and the elementwise step after it in one pass over BM rows:
    P = A W' (A [M, K] with row stride sa; W' [K, N] at w_ptr + k swk + n swn: W or W^T;
    all of K in one tile, as narrow widths are), rounded to the output dtype as a GEMM's
    output is, then _so_pointwise_kernel's MODE with P as its ``a`` (o1, o2, b
    contiguous [M, N], z's rows sz apart; P itself, never written out there, is not read
    back):
    MODE 0: z = P + bias stored at p_ptr, o1 = act(z)   (a hidden layer's forward)
    MODE 4: z = P + bias stored at p_ptr                (the output layer's)
    MODE 1-3 as _so_pointwise_kernel; KEEP_P: P stored at p_ptr too; SUM: the fp32 column
    sums of o1 as rounded, at s_ptr + program * NP."""
    pid = tl.program_id(0)
    rows = pid * BM + tl.arange(0, BM)
    ks = tl.arange(0, KP)
    ns = tl.arange(0, NP)
    rm = rows < M
    a = tl.load(a_ptr + rows[:, None] * sa + ks[None, :], mask=rm[:, None] & (ks[None, :] < K),
                other=0.0)
    w = tl.load(w_ptr + ks[:, None] * swk + ns[None, :] * swn,
                mask=(ks[:, None] < K) & (ns[None, :] < N), other=0.0)
    p = _dot(a, w, F32, PREC)
    dt = p_ptr.dtype.element_ty
    offs = rows[:, None] * N + ns[None, :]
    m = rm[:, None] & (ns[None, :] < N)
    if MODE == 0 or MODE == 4:
        if HAS_BIAS:
            p += tl.load(bias_ptr + ns, mask=ns < N, other=0.0).to(tl.float32)[None, :]
        z = p.to(dt)
        tl.store(p_ptr + offs, z, mask=m)
        if MODE == 0:
            tl.store(o1_ptr + offs, _act(z.to(tl.float32), ACT).to(dt), mask=m)
    else:
        pr = p.to(dt)
        if KEEP_P:
            tl.store(p_ptr + offs, pr, mask=m)
        z = tl.load(z_ptr + rows.to(tl.int64)[:, None] * sz + ns[None, :], mask=m, other=0.0)
        r = _so_step(pr.to(tl.float32), z.to(tl.float32), b_ptr, o1_ptr, o2_ptr, offs, m,
                     MODE, ACT)
        if SUM:
            tl.store(s_ptr + pid * NP + ns, tl.sum(tl.where(m, r, 0.0), axis=0))
