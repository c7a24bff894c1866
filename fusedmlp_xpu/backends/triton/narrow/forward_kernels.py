"""The narrow forward as ONE Triton kernel (every width <= 128): each program reads a
block of rows once, runs it through every layer on chip (weights come from L2; each
layer's weights are a few KB) and writes only the output (and, for training, the
pre-activations backward needs).

_mlp_fwd_kernel              one program per row block, the layers in a loop
_mlp_fwd_persistent_kernel   persistent programs, the layers unrolled, the weights
                             resident on chip when they fit

Saved for backward: one [M, S] tensor, the pre-activations of the hidden layers side by
side (layer l at columns l*H ..), then the output layer's when it has an activation.
Row offsets are int64, so inputs with more than 2^31 elements are fine. The host side
(tunings, launches) is forward.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..act import act as _act
from .tiles import _block_biases, _dot, _hidden_tiles, _load_b, _load_wT, _resident_biases


@triton.jit
def _hidden_layer(h, l, wh_ptr, bh_ptr, z_ptr, rows, hmask, H, L_HID, s_zm,
                  H_P: tl.constexpr, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  SAVE: tl.constexpr, F32: tl.constexpr, PREC: tl.constexpr):
    """Hidden layer l (H -> H) of a row block: act(h W_l^T + b_l), its z stored if SAVE."""
    ch = tl.arange(0, H_P)
    z = _dot(h, _load_wT(wh_ptr + l * H * H, H, H, H_P, H_P), F32, PREC)
    if HAS_BIAS:
        z += _load_b(bh_ptr + l * H, H, H_P)[None, :]
    if SAVE:
        tl.store(z_ptr + (l + 1) * H + rows[:, None] * s_zm + ch[None, :], z.to(h.dtype),
                 mask=hmask)
    return _act(z, ACT).to(h.dtype)


@triton.jit
def _fwd_rows(
    x_ptr, w0_ptr, wh_ptr, wl_ptr, b0_ptr, bh_ptr, bl_ptr, y_ptr, z_ptr, rows,
    M, IN, H, OUT, L_HID, s_xm, s_xk, s_ym, s_zm,
    IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    ACT: tl.constexpr, OUT_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SAVE: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, UNROLL: tl.constexpr,
):
    """One block of rows through every layer. UNROLL: L_HID is a constexpr and the layer
    loop is unrolled (the persistent kernel's loop over row blocks is then innermost)."""
    rmask = rows < M
    ci = tl.arange(0, IN_P)
    ch = tl.arange(0, H_P)
    co = tl.arange(0, OUT_P)
    dt = y_ptr.dtype.element_ty
    hmask = rmask[:, None] & (ch[None, :] < H)

    xt = tl.load(x_ptr + rows[:, None] * s_xm + ci[None, :] * s_xk,
                 mask=rmask[:, None] & (ci[None, :] < IN), other=0.0)
    z0 = _dot(xt, _load_wT(w0_ptr, IN, H, IN_P, H_P), F32, PREC)
    if HAS_BIAS:
        z0 += _load_b(b0_ptr, H, H_P)[None, :]
    if SAVE:
        tl.store(z_ptr + rows[:, None] * s_zm + ch[None, :], z0.to(dt), mask=hmask)
    h = _act(z0, ACT).to(dt)
    if UNROLL:
        for l in tl.static_range(L_HID):
            h = _hidden_layer(h, l, wh_ptr, bh_ptr, z_ptr, rows, hmask, H, L_HID, s_zm,
                              H_P, ACT, HAS_BIAS, SAVE, F32, PREC)
    else:
        for l in range(L_HID):
            h = _hidden_layer(h, l, wh_ptr, bh_ptr, z_ptr, rows, hmask, H, L_HID, s_zm,
                              H_P, ACT, HAS_BIAS, SAVE, F32, PREC)
    zl = _dot(h, _load_wT(wl_ptr, H, OUT, H_P, OUT_P), F32, PREC)
    if HAS_BIAS:
        zl += _load_b(bl_ptr, OUT, OUT_P)[None, :]
    omask = rmask[:, None] & (co[None, :] < OUT)
    if SAVE and OUT_ACT != 0:
        tl.store(z_ptr + (L_HID + 1) * H + rows[:, None] * s_zm + co[None, :], zl.to(dt),
                 mask=omask)
    tl.store(y_ptr + rows[:, None] * s_ym + co[None, :], _act(zl, OUT_ACT).to(dt), mask=omask)


@triton.jit
def _mlp_fwd_kernel(
    x_ptr, w0_ptr, wh_ptr, wl_ptr, b0_ptr, bh_ptr, bl_ptr, y_ptr, z_ptr,
    M, IN, H, OUT, L_HID,
    s_xm, s_xk, s_ym, s_zm,
    IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    ACT: tl.constexpr, OUT_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SAVE: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """One program per block of BLOCK_M rows. The layer loop carries h at H_P throughout,
    so IN_P and OUT_P may differ from H_P (each width padded on its own)."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    _fwd_rows(x_ptr, w0_ptr, wh_ptr, wl_ptr, b0_ptr, bh_ptr, bl_ptr, y_ptr, z_ptr, rows,
              M, IN, H, OUT, L_HID, s_xm, s_xk, s_ym, s_zm, IN_P, H_P, OUT_P, ACT, OUT_ACT,
              HAS_BIAS, SAVE, F32, PREC, False)


@triton.jit
def _resident_layer(h, w, b, z_ptr, col0, rows, rmask, N, s_zm, N_P: tl.constexpr,
                    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SAVE: tl.constexpr,
                    F32: tl.constexpr, PREC: tl.constexpr):
    """One layer of a row block with its weight tile w (W^T) and bias b already loaded:
    act(h w + b), the pre-activation stored at column col0 of z if SAVE."""
    n = tl.arange(0, N_P)
    z = _dot(h, w, F32, PREC)
    if HAS_BIAS:
        z += b[None, :]
    if SAVE:
        tl.store(z_ptr + col0 + rows[:, None] * s_zm + n[None, :], z.to(h.dtype),
                 mask=rmask[:, None] & (n[None, :] < N))
    return z


@triton.jit
def _mlp_fwd_persistent_kernel(
    x_ptr, w0_ptr, wh_ptr, wl_ptr, b0_ptr, bh_ptr, bl_ptr, y_ptr, z_ptr,
    M, IN, H, OUT,
    s_xm, s_xk, s_ym, s_zm,
    L_HID: tl.constexpr,
    IN_P: tl.constexpr, H_P: tl.constexpr, OUT_P: tl.constexpr,
    ACT: tl.constexpr, OUT_ACT: tl.constexpr, HAS_BIAS: tl.constexpr, SAVE: tl.constexpr,
    F32: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr, STAGES: tl.constexpr,
    RESIDENT: tl.constexpr = False, BIAS_PER_BLOCK: tl.constexpr = False,
):
    """A fixed grid of programs striding over the row blocks, the layer loop unrolled
    (L_HID a constexpr): the loop over blocks is innermost, so Triton's pipeliner can
    fetch the next block's rows while this one is computed (STAGES buffers).
    RESIDENT (L_HID <= 4): every layer's weights and biases are loaded once per program,
    before the loop, instead of once per row block (which the pipeliner also buffers
    STAGES times in shared memory). No tile is carried from one layer to the next through
    a loop, so IN_P, H_P and OUT_P may differ here (each width padded on its own).
    BIAS_PER_BLOCK (with RESIDENT): the biases are loaded again for each row block (from
    L1) instead of held through the loop; at hidden 128 the held ones spill registers."""
    pid = tl.program_id(0)
    n_blocks = tl.cdiv(M, BLOCK_M)
    if RESIDENT:
        tl.static_assert(L_HID <= 4)
        dt = y_ptr.dtype.element_ty
        ci = tl.arange(0, IN_P)
        co = tl.arange(0, OUT_P)
        w0 = _load_wT(w0_ptr, IN, H, IN_P, H_P)
        wl = _load_wT(wl_ptr, H, OUT, H_P, OUT_P)
        w1, w2, w3, w4 = _hidden_tiles(wh_ptr, H, H_P, L_HID,
                                       tl.zeros([H_P, H_P], w0.dtype), True)
        c0, c1, c2, c3, c4, cl = _resident_biases(b0_ptr, bh_ptr, bl_ptr, H, OUT, H_P, OUT_P,
                                                  L_HID, HAS_BIAS and not BIAS_PER_BLOCK)
        for blk in tl.range(pid, n_blocks, tl.num_programs(0), num_stages=STAGES):
            b0, b1, b2, b3, b4, bl = _block_biases(c0, c1, c2, c3, c4, cl, b0_ptr, bh_ptr,
                                                   bl_ptr, H, OUT, H_P, OUT_P, L_HID,
                                                   HAS_BIAS, BIAS_PER_BLOCK)
            rows = (tl.zeros([BLOCK_M], tl.int64) + blk) * BLOCK_M + tl.arange(0, BLOCK_M)
            rmask = rows < M
            h = tl.load(x_ptr + rows[:, None] * s_xm + ci[None, :] * s_xk,
                        mask=rmask[:, None] & (ci[None, :] < IN), other=0.0)
            z = _resident_layer(h, w0, b0, z_ptr, 0, rows, rmask, H, s_zm, H_P, ACT,
                                HAS_BIAS, SAVE, F32, PREC)
            h = _act(z, ACT).to(dt)
            if L_HID > 0:
                h = _act(_resident_layer(h, w1, b1, z_ptr, H, rows, rmask, H, s_zm, H_P,
                                         ACT, HAS_BIAS, SAVE, F32, PREC), ACT).to(dt)
            if L_HID > 1:
                h = _act(_resident_layer(h, w2, b2, z_ptr, 2 * H, rows, rmask, H, s_zm,
                                         H_P, ACT, HAS_BIAS, SAVE, F32, PREC), ACT).to(dt)
            if L_HID > 2:
                h = _act(_resident_layer(h, w3, b3, z_ptr, 3 * H, rows, rmask, H, s_zm,
                                         H_P, ACT, HAS_BIAS, SAVE, F32, PREC), ACT).to(dt)
            if L_HID > 3:
                h = _act(_resident_layer(h, w4, b4, z_ptr, 4 * H, rows, rmask, H, s_zm,
                                         H_P, ACT, HAS_BIAS, SAVE, F32, PREC), ACT).to(dt)
            zl = _resident_layer(h, wl, bl, z_ptr, (L_HID + 1) * H, rows, rmask, OUT, s_zm,
                                 OUT_P, ACT, HAS_BIAS, SAVE and OUT_ACT != 0, F32, PREC)
            tl.store(y_ptr + rows[:, None] * s_ym + co[None, :], _act(zl, OUT_ACT).to(dt),
                     mask=rmask[:, None] & (co[None, :] < OUT))
    else:
        for blk in tl.range(pid, n_blocks, tl.num_programs(0), num_stages=STAGES):
            # int64 before the multiply (blk is a plain int under the interpreter)
            rows = (tl.zeros([BLOCK_M], tl.int64) + blk) * BLOCK_M + tl.arange(0, BLOCK_M)
            _fwd_rows(x_ptr, w0_ptr, wh_ptr, wl_ptr, b0_ptr, bh_ptr, bl_ptr, y_ptr, z_ptr,
                      rows, M, IN, H, OUT, L_HID, s_xm, s_xk, s_ym, s_zm, IN_P, H_P, OUT_P,
                      ACT, OUT_ACT, HAS_BIAS, SAVE, F32, PREC, True)
