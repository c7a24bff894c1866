"""Tile helpers shared by the narrow Triton kernels (forward_kernels.py,
backward_kernels.py): dots at the operands' precision, weight and bias tiles loaded
padded and masked, the resident weight tiles of a whole chain.

Layout: layer 0 maps in -> H, hidden layers H -> H (stacked: [L_HID, H, H]), the last
H -> out. Widths are padded to powers of two >= 16 inside the kernel by masking; x, y
and gradients are never copied to padded buffers.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, F32: tl.constexpr, PREC: tl.constexpr):
    # F32: the interpreter computes bf16 dots wrongly unless the operands are upcast
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _load_wT(w_ptr, K, N, K_P: tl.constexpr, N_P: tl.constexpr):
    """W is [N, K] row-major (nn.Linear); return W^T as a [K_P, N_P] tile, zero-padded."""
    k = tl.arange(0, K_P)
    n = tl.arange(0, N_P)
    return tl.load(w_ptr + n[None, :] * K + k[:, None], mask=(k[:, None] < K) & (n[None, :] < N),
                   other=0.0)


@triton.jit
def _load_w(w_ptr, K, N, K_P: tl.constexpr, N_P: tl.constexpr):
    """W as a [N_P, K_P] tile, zero-padded."""
    k = tl.arange(0, K_P)
    n = tl.arange(0, N_P)
    return tl.load(w_ptr + n[:, None] * K + k[None, :], mask=(n[:, None] < N) & (k[None, :] < K),
                   other=0.0)


@triton.jit
def _load_b(b_ptr, N, N_P: tl.constexpr):
    n = tl.arange(0, N_P)
    return tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)


@triton.jit
def _hidden_tiles(wh_ptr, H, H_P: tl.constexpr, L_HID: tl.constexpr, fill,
                  TRANS: tl.constexpr):
    """Hidden weights 0..3 (those below L_HID <= 4) as tiles for the kernels that keep
    them resident: W^T (_load_wT) when TRANS, else W (_load_w); ``fill`` (a tile of the
    same padded shape) for the absent ones."""
    w1 = fill
    w2 = fill
    w3 = fill
    w4 = fill
    for l in tl.static_range(L_HID):
        if TRANS:
            w = _load_wT(wh_ptr + l * H * H, H, H, H_P, H_P)
        else:
            w = _load_w(wh_ptr + l * H * H, H, H, H_P, H_P)
        if l == 0:
            w1 = w
        if l == 1:
            w2 = w
        if l == 2:
            w3 = w
        if l == 3:
            w4 = w
    return w1, w2, w3, w4


@triton.jit
def _chain_tiles(w0_ptr, wh_ptr, wl_ptr, IN, H, OUT, IN_P: tl.constexpr, H_P: tl.constexpr,
                 OUT_P: tl.constexpr, L_HID: tl.constexpr, NEED_X: tl.constexpr):
    """Every weight tile of the backward chain (_load_w's layout), for the kernels that
    keep them resident (L_HID <= 4): first, hidden 0..3 (the absent ones zeros), last;
    the first is a placeholder (the last's tile) when x needs no gradient."""
    tl.static_assert(L_HID <= 4)
    wlt = _load_w(wl_ptr, H, OUT, H_P, OUT_P)
    w0t = wlt
    if NEED_X:
        w0t = _load_w(w0_ptr, IN, H, IN_P, H_P)
    w1t, w2t, w3t, w4t = _hidden_tiles(wh_ptr, H, H_P, L_HID,
                                       tl.zeros([H_P, H_P], wlt.dtype), False)
    return w0t, w1t, w2t, w3t, w4t, wlt


@triton.jit
def _resident_biases(b0_ptr, bh_ptr, bl_ptr, H, OUT, H_P: tl.constexpr, OUT_P: tl.constexpr,
                     L_HID: tl.constexpr, LOAD: tl.constexpr):
    """Every bias as an fp32 vector, loaded once per program (first, hidden 0..3, last);
    zeros where absent or not LOAD."""
    c0 = tl.zeros([H_P], tl.float32)
    c1 = c0
    c2 = c0
    c3 = c0
    c4 = c0
    cl = tl.zeros([OUT_P], tl.float32)
    if LOAD:
        c0 = _load_b(b0_ptr, H, H_P)
        cl = _load_b(bl_ptr, OUT, OUT_P)
        if L_HID > 0:
            c1 = _load_b(bh_ptr, H, H_P)
        if L_HID > 1:
            c2 = _load_b(bh_ptr + H, H, H_P)
        if L_HID > 2:
            c3 = _load_b(bh_ptr + 2 * H, H, H_P)
        if L_HID > 3:
            c4 = _load_b(bh_ptr + 3 * H, H, H_P)
    return c0, c1, c2, c3, c4, cl


@triton.jit
def _block_biases(c0, c1, c2, c3, c4, cl, b0_ptr, bh_ptr, bl_ptr, H, OUT, H_P: tl.constexpr,
                  OUT_P: tl.constexpr, L_HID: tl.constexpr, LOAD: tl.constexpr,
                  PER_BLOCK: tl.constexpr):
    """Inside a loop over row blocks: the biases held through it (c0..cl), or with
    PER_BLOCK loaded again for this block (_resident_biases, zeros unless LOAD), so that
    nothing is carried from block to block in registers."""
    if PER_BLOCK:
        c0, c1, c2, c3, c4, cl = _resident_biases(b0_ptr, bh_ptr, bl_ptr, H, OUT, H_P, OUT_P,
                                                  L_HID, LOAD)
    return c0, c1, c2, c3, c4, cl
