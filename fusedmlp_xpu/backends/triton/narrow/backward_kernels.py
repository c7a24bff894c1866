"""The narrow backward's Triton kernels (every width <= 128).

One persistent kernel walks the rows back through all layers; the input gradient is
written once, and each program adds its weight/bias gradients for the row blocks it
owns into its own fp32 slice of a scratch buffer (no atomics, no contention; the slices
stay in L2), summed by one small reduction at the end.

_mlp_bwd_kernel            the fused backward: rows back through every layer, partial
                           weight and bias sums per program
_mlp_g_kernel              the split backward's input-gradient chain: stores every g
_mlp_dw_kernel             the split backward's weight gradients from those g
_mlp_bwd_resident_kernel   the one-kernel backward: weights resident, sums its weight
                           gradients itself, optionally recomputing the pre-activations
_reduce_grads_kernel       the per-program partial sums -> every gradient, unpadded

The host side (which of these runs, tunings, launches) is backward.py and reduce.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..act import act as _act
from ..act import times_act_grad as _times_act_grad
from .tiles import _block_biases, _chain_tiles, _dot, _load_w, _resident_biases


@triton.jit
def _accumulate(acc_ptr, g, h, R_P: tl.constexpr, C_P: tl.constexpr, F32: tl.constexpr,
                PREC: tl.constexpr):
    """acc[R_P, C_P] (this program's fp32 slice) += g^T @ h."""
    r = tl.arange(0, R_P)
    c = tl.arange(0, C_P)
    ptrs = acc_ptr + r[:, None] * C_P + c[None, :]
    tl.store(ptrs, tl.load(ptrs) + _dot(tl.trans(g), h, F32, PREC))


@triton.jit
def _accumulate_bias(acc_ptr, g, N_P: tl.constexpr):
    n = tl.arange(0, N_P)
    tl.store(acc_ptr + n, tl.load(acc_ptr + n) + tl.sum(g.to(tl.float32), axis=0))


@triton.jit
def _bwd_rows(
    gy_ptr, x_ptr, w0_ptr, wh_ptr, wl_ptr, z_ptr, gx_ptr, g_ptr, dw0, dwh, dwl, db, rows,
    M, IN, H, OUT, L_HID, s_gym, s_xm, s_xk, s_zm, s_gm,
    IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    SLOT: tl.constexpr, ACT: tl.constexpr, OUT_ACT: tl.constexpr,
    NEED_X: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr, STORE_G: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, UNROLL: tl.constexpr,
    w0t=0, w1t=0, w2t=0, w3t=0, w4t=0, wlt=0, RESIDENT: tl.constexpr = False,
):
    """One block of rows back through every layer: the input gradient, each layer's g
    (STORE_G) and the weight/bias partials added into this program's scratch slots
    (dw0 / dwh / dwl / db; NEED_W, NEED_B). UNROLL: L_HID is a constexpr and the layer
    loop is unrolled. RESIDENT (with UNROLL, L_HID <= 4): the weight tiles come loaded
    (w0t, the hidden w1t..w4t, wlt; _load_w's layout) instead of from memory per block."""
    ci = tl.arange(0, IN_P)
    ch = tl.arange(0, H_P)
    co = tl.arange(0, OUT_P)
    dt = x_ptr.dtype.element_ty
    n_layers = L_HID + 2
    rmask = rows < M
    hmask = rmask[:, None] & (ch[None, :] < H)
    omask = rmask[:, None] & (co[None, :] < OUT)
    go = tl.load(gy_ptr + rows[:, None] * s_gym + co[None, :], mask=omask, other=0.0)
    go = go.to(tl.float32)
    if OUT_ACT != 0:
        zo = tl.load(z_ptr + (L_HID + 1) * H + rows[:, None] * s_zm + co[None, :], mask=omask,
                     other=0.0)
        go = _times_act_grad(go, zo.to(tl.float32), OUT_ACT)
        if STORE_G:
            tl.store(g_ptr + (L_HID + 1) * H + rows[:, None] * s_gm + co[None, :],
                     go.to(dt), mask=omask)
    # last layer: its input is act(z of the last hidden layer)
    zp = tl.load(z_ptr + L_HID * H + rows[:, None] * s_zm + ch[None, :], mask=hmask,
                 other=0.0).to(tl.float32)
    god = go.to(dt)
    if NEED_W:
        _accumulate(dwl, god, _act(zp, ACT).to(dt), OUT_P, H_P, F32, PREC)
    if NEED_B:
        _accumulate_bias(db + (n_layers - 1) * SLOT, go, OUT_P)
    if RESIDENT:
        wl = wlt
    else:
        wl = _load_w(wl_ptr, H, OUT, H_P, OUT_P)
    g = _times_act_grad(_dot(god, wl, F32, PREC), zp, ACT)
    if STORE_G:
        tl.store(g_ptr + L_HID * H + rows[:, None] * s_gm + ch[None, :], g.to(dt),
                 mask=hmask)
    if UNROLL:
        for j in tl.static_range(L_HID):
            g = _bwd_hidden(g, L_HID - 1 - j, wh_ptr, z_ptr, g_ptr, dwh, db, rows, hmask, H,
                            s_zm, s_gm, H_P, SLOT, ACT, NEED_W, NEED_B, STORE_G, F32, PREC,
                            _pick(L_HID - 1 - j, w1t, w2t, w3t, w4t, RESIDENT), RESIDENT)
    else:
        for j in range(L_HID):
            g = _bwd_hidden(g, L_HID - 1 - j, wh_ptr, z_ptr, g_ptr, dwh, db, rows, hmask, H,
                            s_zm, s_gm, H_P, SLOT, ACT, NEED_W, NEED_B, STORE_G, F32, PREC)
    gd = g.to(dt)
    if NEED_W:
        x = tl.load(x_ptr + rows[:, None] * s_xm + ci[None, :] * s_xk,
                    mask=rmask[:, None] & (ci[None, :] < IN), other=0.0)
        _accumulate(dw0, gd, x, H_P, IN_P, F32, PREC)
    if NEED_B:
        _accumulate_bias(db, g, H_P)
    if NEED_X:
        if RESIDENT:
            w0 = w0t
        else:
            w0 = _load_w(w0_ptr, IN, H, IN_P, H_P)
        gx = _dot(gd, w0, F32, PREC)
        tl.store(gx_ptr + rows[:, None] * IN + ci[None, :], gx.to(dt),
                 mask=rmask[:, None] & (ci[None, :] < IN))


@triton.jit
def _pick(l: tl.constexpr, w1t, w2t, w3t, w4t, RESIDENT: tl.constexpr):
    """The resident tile of hidden weight l (a placeholder when not RESIDENT)."""
    w = w1t
    if RESIDENT:
        if l == 1:
            w = w2t
        if l == 2:
            w = w3t
        if l == 3:
            w = w4t
    return w


@triton.jit
def _bwd_hidden(g, l, wh_ptr, z_ptr, g_ptr, dwh, db, rows, hmask, H, s_zm, s_gm,
                H_P: tl.constexpr, SLOT: tl.constexpr, ACT: tl.constexpr,
                NEED_W: tl.constexpr, NEED_B: tl.constexpr, STORE_G: tl.constexpr,
                F32: tl.constexpr, PREC: tl.constexpr, wt=0, RESIDENT: tl.constexpr = False):
    """Hidden weight l (maps z[l] -> z[l + 1]) backward for a row block: g of z[l + 1]
    in, g of z[l] out (stored if STORE_G); its weight/bias partials if NEED_W/NEED_B.
    RESIDENT: its weight tile is wt, already loaded."""
    ch = tl.arange(0, H_P)
    dt = wh_ptr.dtype.element_ty
    zh = tl.load(z_ptr + l * H + rows[:, None] * s_zm + ch[None, :], mask=hmask,
                 other=0.0).to(tl.float32)
    gh = g.to(dt)
    if NEED_W:
        _accumulate(dwh + l * SLOT, gh, _act(zh, ACT).to(dt), H_P, H_P, F32, PREC)
    if NEED_B:
        _accumulate_bias(db + (l + 1) * SLOT, g, H_P)
    if RESIDENT:
        w = wt
    else:
        w = _load_w(wh_ptr + l * H * H, H, H, H_P, H_P)
    g = _times_act_grad(_dot(gh, w, F32, PREC), zh, ACT)
    if STORE_G:
        tl.store(g_ptr + l * H + rows[:, None] * s_gm + ch[None, :], g.to(dt), mask=hmask)
    return g


@triton.jit
def _mlp_bwd_kernel(
    gy_ptr, x_ptr, w0_ptr, wh_ptr, wl_ptr, z_ptr, gx_ptr,
    acc_ptr, g_ptr,
    M, IN, H, OUT, L_HID, n_blocks,
    s_gym, s_xm, s_xk, s_zm, s_gm,
    IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    W_SLOT: tl.constexpr, SLOT: tl.constexpr, ACT: tl.constexpr, OUT_ACT: tl.constexpr,
    NEED_X: tl.constexpr, NEED_W: tl.constexpr, NEED_B: tl.constexpr, STORE_G: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Programs striding over the row blocks (one per block when the grid has n_blocks).
    STORE_G (the split backward, with NEED_W/NEED_B off): store every layer's gradient
    w.r.t. its pre-activation into g [M, S] (layer l at columns l*H, the output layer's
    after the hidden ones when it has an activation) for _mlp_dw_kernel."""
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_layers = L_HID + 2
    # this program's slice of the fp32 scratch [programs, layers, SLOT]: per layer, the
    # weight gradient ([out_P, in_P] row-major) in the first W_SLOT, then the bias gradient
    dw0 = acc_ptr + pid.to(tl.int64) * n_layers * SLOT
    for blk in range(pid, n_blocks, n_prog):
        # int64 before the multiply (blk is a plain int under the interpreter)
        rows = (tl.zeros([BLOCK_M], tl.int64) + blk) * BLOCK_M + tl.arange(0, BLOCK_M)
        _bwd_rows(gy_ptr, x_ptr, w0_ptr, wh_ptr, wl_ptr, z_ptr, gx_ptr, g_ptr,
                  dw0, dw0 + SLOT, dw0 + (n_layers - 1) * SLOT, dw0 + W_SLOT, rows,
                  M, IN, H, OUT, L_HID, s_gym, s_xm, s_xk, s_zm, s_gm, IN_P, H_P, OUT_P,
                  SLOT, ACT, OUT_ACT, NEED_X, NEED_W, NEED_B, STORE_G, F32, PREC, False)


@triton.jit
def _mlp_g_kernel(
    gy_ptr, x_ptr, w0_ptr, wh_ptr, wl_ptr, z_ptr, gx_ptr, g_ptr,
    M, IN, H, OUT, n_blocks,
    s_gym, s_xm, s_xk, s_zm, s_gm,
    L_HID: tl.constexpr, IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    ACT: tl.constexpr, OUT_ACT: tl.constexpr, NEED_X: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr,
    RESIDENT: tl.constexpr = False, STORE_G: tl.constexpr = True,
):
    """The split backward's input-gradient chain with the layer loop unrolled (L_HID a
    constexpr), as the persistent forward: the loop over row blocks is innermost, so
    Triton's pipeliner can fetch the next block's gy and z while this one is computed
    (STAGES buffers), and every layer's z load is independent of the chain.
    RESIDENT (L_HID <= 4): every weight tile loaded once per program, before the loop.
    STORE_G: every layer's g stored for the weight-gradient kernel (off: x's gradient
    alone, from the saved z)."""
    pid = tl.program_id(0)
    w0t = 0
    w1t = 0
    w2t = 0
    w3t = 0
    w4t = 0
    wlt = 0
    if RESIDENT:
        w0t, w1t, w2t, w3t, w4t, wlt = _chain_tiles(w0_ptr, wh_ptr, wl_ptr, IN, H, OUT, IN_P,
                                                    H_P, OUT_P, L_HID, NEED_X)
    for blk in tl.range(pid, n_blocks, tl.num_programs(0), num_stages=STAGES):
        rows = (tl.zeros([BLOCK_M], tl.int64) + blk) * BLOCK_M + tl.arange(0, BLOCK_M)
        _bwd_rows(gy_ptr, x_ptr, w0_ptr, wh_ptr, wl_ptr, z_ptr, gx_ptr, g_ptr,
                  g_ptr, g_ptr, g_ptr, g_ptr, rows,
                  M, IN, H, OUT, L_HID, s_gym, s_xm, s_xk, s_zm, s_gm, IN_P, H_P, OUT_P,
                  1, ACT, OUT_ACT, NEED_X, False, False, STORE_G, F32, PREC, True,
                  w0t, w1t, w2t, w3t, w4t, wlt, RESIDENT)


@triton.jit
def _store_partial(slot, a, R_P: tl.constexpr, C_P: tl.constexpr, T_P: tl.constexpr):
    """A program's [R_P, C_P] partial sum into its [T_P, T_P] weight slot (row-major; the
    reduction reads only the real [out, in])."""
    r = tl.arange(0, R_P)
    c = tl.arange(0, C_P)
    tl.store(slot + r[:, None] * T_P + c[None, :], a)


@triton.jit
def _store_bias_partial(slot, ab, R_P: tl.constexpr):
    """The bias partial from g^T @ ones [.., 16]: one of the equal columns (a sum of it
    and zeros is exact)."""
    first = tl.arange(0, 16)[None, :] == 0
    tl.store(slot + tl.arange(0, R_P), tl.sum(tl.where(first, ab, 0.0), axis=1))


@triton.jit
def _add_at(l: tl.constexpr, d, a1, a2, a3, a4):
    """Partial sum l + 1 of the four (hidden-to-hidden weight l < 4) plus d; all four
    back."""
    if l == 0:
        a1 += d
    if l == 1:
        a2 += d
    if l == 2:
        a3 += d
    if l == 3:
        a4 += d
    return a1, a2, a3, a4


@triton.jit
def _recompute_z(x, w0t, w1t, w2t, w3t, w4t, wlt, c0, c1, c2, c3, c4, cl, L_HID: tl.constexpr,
                 ACT: tl.constexpr, OUT_ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                 F32: tl.constexpr, PREC: tl.constexpr):
    """A row block's forward again from x (x.dtype) with the backward chain's resident
    tiles (_load_w's layout, so transposed here): the hidden pre-activations z0..z4
    (the absent ones z0) and the output layer's (when OUT_ACT), rounded to x.dtype as the
    saving forward stores them; each next layer takes act of the unrounded z, as there."""
    dt = x.dtype
    z = _dot(x, tl.trans(w0t), F32, PREC)
    if HAS_BIAS:
        z += c0[None, :]
    z0 = z.to(dt)
    z1 = z0
    z2 = z0
    z3 = z0
    z4 = z0
    for l in tl.static_range(L_HID):
        z = _dot(_act(z, ACT).to(dt), tl.trans(_pick(l, w1t, w2t, w3t, w4t, True)), F32, PREC)
        if HAS_BIAS:
            z += _pick(l, c1, c2, c3, c4, True)[None, :]
        if l == 0:
            z1 = z.to(dt)
        if l == 1:
            z2 = z.to(dt)
        if l == 2:
            z3 = z.to(dt)
        if l == 3:
            z4 = z.to(dt)
    zo = tl.zeros([x.shape[0], wlt.shape[0]], dt)
    if OUT_ACT != 0:
        zo = _dot(_act(z, ACT).to(dt), tl.trans(wlt), F32, PREC)
        if HAS_BIAS:
            zo += cl[None, :]
        zo = zo.to(dt)
    return z0, z1, z2, z3, z4, zo


@triton.jit
def _z_at(l: tl.constexpr, z0, z1, z2, z3, z4):
    """The recomputed pre-activation of hidden layer l (0..4)."""
    z = z0
    if l > 0:
        z = _pick(l - 1, z1, z2, z3, z4, True)
    return z


@triton.jit
def _mlp_bwd_resident_kernel(
    gy_ptr, x_ptr, w0_ptr, wh_ptr, wl_ptr, z_ptr, gx_ptr, acc_ptr, b0_ptr, bh_ptr, bl_ptr,
    M, IN, H, OUT, n_blocks,
    s_gym, s_xm, s_xk, s_zm,
    L_HID: tl.constexpr, IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    T_P: tl.constexpr, W_SLOT: tl.constexpr, SLOT: tl.constexpr,
    ACT: tl.constexpr, OUT_ACT: tl.constexpr, NEED_X: tl.constexpr, NEED_W: tl.constexpr,
    NEED_B: tl.constexpr, F32: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
    STAGES: tl.constexpr, RECOMPUTE: tl.constexpr = False, HAS_BIAS: tl.constexpr = False,
    BIAS_PER_BLOCK: tl.constexpr = False,
):
    """The whole backward in one pass over the rows, for nets whose weights stay on chip
    (L_HID <= 4 hidden-to-hidden weights, narrow hidden width): every weight tile loaded
    once per program; per row block the input-gradient chain as _mlp_g_kernel, and every
    layer's weight gradient g^T act(z) (bias: g^T @ ones) added to a partial sum held in
    registers across the program's row blocks; at the end each program writes its
    partials to its slots of acc [programs, layers, SLOT] (the layout
    _reduce_grads_kernel sums). No g buffer, no second pass over g and z, no scratch
    traffic per block. Each layer kind's tiles are padded to its own widths.
    RECOMPUTE: nothing was saved (z_ptr unused): each row block's pre-activations are
    computed again from x on chip (_recompute_z, the chain's resident tiles transposed,
    biases from b*_ptr when HAS_BIAS) instead of read back, so the forward writes no z
    and this kernel reads none. BIAS_PER_BLOCK: those biases are loaded again for each
    row block instead of held through the loop (as the persistent forward's)."""
    pid = tl.program_id(0)
    n_layers = L_HID + 2
    dt = x_ptr.dtype.element_ty
    w0t, w1t, w2t, w3t, w4t, wlt = _chain_tiles(w0_ptr, wh_ptr, wl_ptr, IN, H, OUT, IN_P, H_P,
                                                OUT_P, L_HID, NEED_X or RECOMPUTE)
    c0, c1, c2, c3, c4, cl = _resident_biases(b0_ptr, bh_ptr, bl_ptr, H, OUT, H_P, OUT_P, L_HID,
                                              RECOMPUTE and HAS_BIAS and not BIAS_PER_BLOCK)
    ci = tl.arange(0, IN_P)
    ch = tl.arange(0, H_P)
    co = tl.arange(0, OUT_P)
    a0 = tl.zeros([H_P, IN_P], tl.float32)
    a1 = tl.zeros([H_P, H_P], tl.float32)
    a2 = tl.zeros([H_P, H_P], tl.float32)
    a3 = tl.zeros([H_P, H_P], tl.float32)
    a4 = tl.zeros([H_P, H_P], tl.float32)
    al = tl.zeros([OUT_P, H_P], tl.float32)
    b0 = tl.zeros([H_P, 16], tl.float32)
    b1 = tl.zeros([H_P, 16], tl.float32)
    b2 = tl.zeros([H_P, 16], tl.float32)
    b3 = tl.zeros([H_P, 16], tl.float32)
    b4 = tl.zeros([H_P, 16], tl.float32)
    bl = tl.zeros([OUT_P, 16], tl.float32)
    ones = tl.full([BLOCK_M, 16], 1.0, dt)
    for blk in tl.range(pid, n_blocks, tl.num_programs(0), num_stages=STAGES):
        rows = (tl.zeros([BLOCK_M], tl.int64) + blk) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        hmask = rmask[:, None] & (ch[None, :] < H)
        omask = rmask[:, None] & (co[None, :] < OUT)
        go = tl.load(gy_ptr + rows[:, None] * s_gym + co[None, :], mask=omask,
                     other=0.0).to(tl.float32)
        x = go  # a placeholder until loaded
        if RECOMPUTE or NEED_W:
            x = tl.load(x_ptr + rows[:, None] * s_xm + ci[None, :] * s_xk,
                        mask=rmask[:, None] & (ci[None, :] < IN), other=0.0).to(dt)
        if RECOMPUTE:
            d0, d1, d2, d3, d4, dl = _block_biases(c0, c1, c2, c3, c4, cl, b0_ptr, bh_ptr,
                                                   bl_ptr, H, OUT, H_P, OUT_P, L_HID,
                                                   HAS_BIAS, BIAS_PER_BLOCK)
            z0, z1, z2, z3, z4, zo = _recompute_z(x, w0t, w1t, w2t, w3t, w4t, wlt, d0, d1, d2,
                                                  d3, d4, dl, L_HID, ACT, OUT_ACT, HAS_BIAS,
                                                  F32, PREC)
            if OUT_ACT != 0:
                go = _times_act_grad(go, zo.to(tl.float32), OUT_ACT)
            zp = _z_at(L_HID, z0, z1, z2, z3, z4).to(tl.float32)
        else:
            if OUT_ACT != 0:
                zo = tl.load(z_ptr + (L_HID + 1) * H + rows[:, None] * s_zm + co[None, :],
                             mask=omask, other=0.0)
                go = _times_act_grad(go, zo.to(tl.float32), OUT_ACT)
            zp = tl.load(z_ptr + L_HID * H + rows[:, None] * s_zm + ch[None, :], mask=hmask,
                         other=0.0).to(tl.float32)
        god = go.to(dt)
        if NEED_W:
            al += _dot(tl.trans(god), _act(zp, ACT).to(dt), F32, PREC)
        if NEED_B:
            bl += _dot(tl.trans(god), ones, F32, PREC)
        g = _times_act_grad(_dot(god, wlt, F32, PREC), zp, ACT)
        for j in tl.static_range(L_HID):
            l = L_HID - 1 - j  # hidden weight l maps z[l] -> z[l + 1]
            if RECOMPUTE:
                zh = _z_at(l, z0, z1, z2, z3, z4).to(tl.float32)
            else:
                zh = tl.load(z_ptr + l * H + rows[:, None] * s_zm + ch[None, :], mask=hmask,
                             other=0.0).to(tl.float32)
            gh = g.to(dt)
            if NEED_W:
                a1, a2, a3, a4 = _add_at(l, _dot(tl.trans(gh), _act(zh, ACT).to(dt), F32, PREC),
                                         a1, a2, a3, a4)
            if NEED_B:
                b1, b2, b3, b4 = _add_at(l, _dot(tl.trans(gh), ones, F32, PREC), b1, b2, b3, b4)
            g = _times_act_grad(_dot(gh, _pick(l, w1t, w2t, w3t, w4t, True), F32, PREC), zh,
                                   ACT)
        gd = g.to(dt)
        if NEED_W:
            a0 += _dot(tl.trans(gd), x, F32, PREC)
        if NEED_B:
            b0 += _dot(tl.trans(gd), ones, F32, PREC)
        if NEED_X:
            gx = _dot(gd, w0t, F32, PREC)
            tl.store(gx_ptr + rows[:, None] * IN + ci[None, :], gx.to(dt),
                     mask=rmask[:, None] & (ci[None, :] < IN))
    base = acc_ptr + pid.to(tl.int64) * n_layers * SLOT
    if NEED_W:
        _store_partial(base, a0, H_P, IN_P, T_P)
        for l in tl.static_range(L_HID):
            _store_partial(base + (l + 1) * SLOT, _pick(l, a1, a2, a3, a4, True), H_P, H_P,
                           T_P)
        _store_partial(base + (n_layers - 1) * SLOT, al, OUT_P, H_P, T_P)
    if NEED_B:
        _store_bias_partial(base + W_SLOT, b0, H_P)
        for l in tl.static_range(L_HID):
            _store_bias_partial(base + (l + 1) * SLOT + W_SLOT, _pick(l, b1, b2, b3, b4, True),
                                H_P)
        _store_bias_partial(base + (n_layers - 1) * SLOT + W_SLOT, bl, OUT_P)


@triton.jit
def _dw_layer(g_ptr, s_gm, h_ptr, s_hm, s_hk, M, n_out, n_in, pid, n_prog, n_blocks, slot,
              G_P: tl.constexpr, K_P: tl.constexpr, T_P: tl.constexpr,
              W_SLOT: tl.constexpr, ACT: tl.constexpr, HAS_ACT: tl.constexpr,
              NEED_B: tl.constexpr, F32: tl.constexpr, PREC: tl.constexpr,
              BLOCK_M: tl.constexpr, STAGES: tl.constexpr):
    """sum over the row blocks pid, pid + n_prog, ... of g^T h (and of g's rows), g
    [M, n_out] and h [M, n_in] (act(h) when HAS_ACT), as tiles of G_P and K_P columns;
    stored into the [T_P, T_P] weight slot at slot (row-major, T_P >= G_P, K_P: the
    reduction reads only the real [n_out, n_in]) and the bias's after it. No branch
    inside the loop, so Triton can pipeline its loads. The bias gradient's row sums come
    from the tensor cores too, as g^T @ ones (16 equal columns): a row reduction of the
    tile per block (tl.sum over axis 0) cost 0.8-1.7 ms of a 2^22-row train step at
    width 128 on the H200."""
    cg = tl.arange(0, G_P)
    ck = tl.arange(0, K_P)
    gmask_c = cg < n_out
    hmask_c = ck < n_in
    dt = h_ptr.dtype.element_ty
    acc = tl.zeros([G_P, K_P], tl.float32)
    accb = tl.zeros([G_P, 16], tl.float32)
    ones = tl.full([BLOCK_M, 16], 1.0, dt)
    for blk in tl.range(pid, n_blocks, n_prog, num_stages=STAGES):
        rows = (tl.zeros([BLOCK_M], tl.int64) + blk) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < M
        g = tl.load(g_ptr + rows[:, None] * s_gm + cg[None, :],
                    mask=rmask[:, None] & gmask_c[None, :], other=0.0)
        h = tl.load(h_ptr + rows[:, None] * s_hm + ck[None, :] * s_hk,
                    mask=rmask[:, None] & hmask_c[None, :], other=0.0)
        if HAS_ACT:
            h = _act(h.to(tl.float32), ACT).to(dt)
        gt = tl.trans(g.to(dt))
        acc += _dot(gt, h.to(dt), F32, PREC)
        if NEED_B:
            accb += _dot(gt, ones, F32, PREC)
    _store_partial(slot, acc, G_P, K_P, T_P)
    if NEED_B:
        _store_bias_partial(slot + W_SLOT, accb, G_P)


@triton.jit
def _mlp_dw_kernel(
    gy_ptr, x_ptr, z_ptr, g_ptr, acc_ptr,
    M, IN, H, OUT, L_HID, n_blocks,
    s_gym, s_xm, s_xk, s_zm, s_gm,
    IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    T_P: tl.constexpr, W_SLOT: tl.constexpr, SLOT: tl.constexpr, ACT: tl.constexpr,
    OUT_ACT: tl.constexpr, NEED_B: tl.constexpr, F32: tl.constexpr, PREC: tl.constexpr,
    BLOCK_M: tl.constexpr, STAGES: tl.constexpr,
):
    """The split backward's weight gradients: program (p, layer) sums g_layer^T h_in over
    the row blocks p, p + P, ... with the partial sum in registers (no scratch traffic per
    block), then writes it (and the bias gradient's) to its slot of acc [P, layers, SLOT],
    the layout _reduce_grads_kernel sums. g_layer: the stored g, or grad_y itself for an
    output layer without activation; h_in: x for layer 0, else act(z of the layer below).
    The layer kind is decided once, outside the loops; each kind's tiles are padded to its
    own widths (IN_P, H_P, OUT_P), the slot to the widest (T_P). Masks keep the real
    widths."""
    pid = tl.program_id(0)
    layer = tl.program_id(1)
    n_prog = tl.num_programs(0)
    n_layers = L_HID + 2
    slot = acc_ptr + (pid.to(tl.int64) * n_layers + layer) * SLOT
    if layer == 0:
        _dw_layer(g_ptr, s_gm, x_ptr, s_xm, s_xk, M, H, IN, pid, n_prog, n_blocks, slot,
                  H_P, IN_P, T_P, W_SLOT, ACT, False, NEED_B, F32, PREC, BLOCK_M, STAGES)
    elif layer == n_layers - 1:
        if OUT_ACT == 0:  # the output layer's g is grad_y itself: none was stored
            _dw_layer(gy_ptr, s_gym, z_ptr + (layer - 1) * H, s_zm, 1, M, OUT, H, pid,
                      n_prog, n_blocks, slot, OUT_P, H_P, T_P, W_SLOT, ACT, True, NEED_B,
                      F32, PREC, BLOCK_M, STAGES)
        else:
            _dw_layer(g_ptr + layer * H, s_gm, z_ptr + (layer - 1) * H, s_zm, 1, M, OUT, H,
                      pid, n_prog, n_blocks, slot, OUT_P, H_P, T_P, W_SLOT, ACT, True,
                      NEED_B, F32, PREC, BLOCK_M, STAGES)
    else:
        _dw_layer(g_ptr + layer * H, s_gm, z_ptr + (layer - 1) * H, s_zm, 1, M, H, H, pid,
                  n_prog, n_blocks, slot, H_P, H_P, T_P, W_SLOT, ACT, True, NEED_B, F32,
                  PREC, BLOCK_M, STAGES)


@triton.jit
def _reduce_grads_kernel(
    acc_ptr, out_ptr, n_prog, IN, H, OUT, L_HID,
    NEED_W: tl.constexpr, NEED_B: tl.constexpr, T_P: tl.constexpr, ROWS: tl.constexpr,
    W_SLOT: tl.constexpr, SLOT: tl.constexpr, BLOCK_P: tl.constexpr,
):
    """Sum the backward programs' fp32 partials (acc [n_prog, layers, SLOT]) into every
    layer's weight and bias gradient, unpadded, in the output dtype, back to back in one
    buffer: weights first (layer 0 [H, IN], hidden [H, H] each, last [OUT, H]), then the
    biases (H each, the last OUT). Program (layer, chunk): ROWS rows of that layer's
    padded [T_P, T_P] weight tile (one contiguous span of the slot), or its bias when
    chunk == T_P // ROWS."""
    layer = tl.program_id(0)
    chunk = tl.program_id(1)
    n_layers = L_HID + 2
    n_out = tl.where(layer == n_layers - 1, OUT, H)
    n_in = tl.where(layer == 0, IN, H)
    is_bias = chunk == T_P // ROWS
    k = tl.arange(0, ROWS * T_P)
    r = chunk * ROWS + k // T_P  # weight row
    c = k % T_P
    src = acc_ptr + layer * SLOT + tl.where(is_bias, W_SLOT + k, chunk * ROWS * T_P + k)
    want = tl.where(is_bias, NEED_B & (k < n_out), NEED_W & (r < n_out) & (c < n_in))
    s = tl.zeros([ROWS * T_P], tl.float32)
    for p0 in range(0, n_prog, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        s += tl.sum(tl.load(src[None, :] + p[:, None] * n_layers * SLOT,
                            mask=(p[:, None] < n_prog) & want[None, :], other=0.0), axis=0)
    w_total = H * IN + L_HID * H * H + OUT * H
    w_off = tl.where(layer == 0, 0, H * IN + (layer - 1) * H * H)
    dst = tl.where(is_bias, w_total + layer * H + k, w_off + r * n_in + c)
    tl.store(out_ptr + dst, s.to(out_ptr.dtype.element_ty), mask=want)
