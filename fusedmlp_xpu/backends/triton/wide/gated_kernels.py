"""The gated MLP's (SwiGLU, GEGLU) Triton GEMM kernels:

    _gated_fwd_kernel     h = act(x Wg^T + bg) * (x Wu^T + bu): two accumulators, one x tile
    _gated_fwd_tma_kernel the same as one GEMM over [Wg; Wu] interleaved by rows (read in
                          place through one [H, 2, K] descriptor), through TMA
                          descriptors, persistent (Hopper+, 16-bit operands, large M)
    _gated_bwd_kernel     dh = dy Wd; epilogue: dg = dh u act'(g), du = dh act(g)
    _gated_bwd_tma_kernel _gated_bwd_kernel through TMA descriptors, persistent

The host side is gated.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..act import act as _act
from ..act import act_grad as _act_grad
from .gemm_kernels import (_dot, _load_k, _load_mn, _mm, _store, _subtiles, _tile, _tile_pos,
                           _tma_acc)


@triton.jit
def _gated_fwd_kernel(
    x_ptr, wg_ptr, wu_ptr, bg_ptr, bu_ptr, h_ptr, g_ptr, u_ptr,
    M, N, K, M_BUCKET,
    s_xm, s_xk, s_gwn, s_gwk, s_uwn, s_uwk, s_hm, s_hn, s_gm, s_gn, s_um, s_un,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_GU: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """h = act(x Wg^T + bg) * (x Wu^T + bu): each x tile is loaded once and feeds both
    accumulators. With STORE_GU the two pre-activations are kept for backward."""
    rows, cols, _ = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rw, cw = rows % M, cols % N
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rw[:, None] * s_xm + ks[None, :] * s_xk
    g_ptrs = wg_ptr + cw[None, :] * s_gwn + ks[:, None] * s_gwk
    u_ptrs = wu_ptr + cw[None, :] * s_uwn + ks[:, None] * s_uwk
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        x = _load_k(x_ptrs, K - k0, 1, BLOCK_K, EVEN_K)
        acc_g = _dot(x, _load_k(g_ptrs, K - k0, 0, BLOCK_K, EVEN_K), acc_g, UPCAST, PRECISION)
        acc_u = _dot(x, _load_k(u_ptrs, K - k0, 0, BLOCK_K, EVEN_K), acc_u, UPCAST, PRECISION)
        x_ptrs += BLOCK_K * s_xk
        g_ptrs += BLOCK_K * s_gwk
        u_ptrs += BLOCK_K * s_uwk
    if HAS_BIAS:
        acc_g += tl.load(bg_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        acc_u += tl.load(bu_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if STORE_GU:
        _store(g_ptr, rows, cols, s_gm, s_gn, acc_g, M, N)
        _store(u_ptr, rows, cols, s_um, s_un, acc_u, M, N)
    _store(h_ptr, rows, cols, s_hm, s_hn, _act(acc_g, ACT) * acc_u, M, N)


@triton.jit
def _gated_bwd_kernel(
    dy_ptr, wd_ptr, g_ptr, u_ptr, dg_ptr, du_ptr,
    M, N, K, M_BUCKET,
    s_dym, s_dyk, s_wn, s_wk, s_gm, s_gn, s_um, s_un,
    s_dgm, s_dgn, s_dum, s_dun,
    ACT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """dh = dy @ Wd (Wd read as B[n = hidden, k = out]); epilogue: dg = dh u act'(g),
    du = dh act(g)."""
    rows, cols, _ = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc = _mm(dy_ptr, wd_ptr, dy_ptr, rows % M, cols % N, K, s_dym, s_dyk, s_wn, s_wk,
              0, 0, acc, 0, UPCAST, PRECISION, BLOCK_K, EVEN_K)
    g = _load_mn(g_ptr, rows, cols, s_gm, s_gn, M, N)
    u = _load_mn(u_ptr, rows, cols, s_um, s_un, M, N)
    a = _act(g, ACT)
    _store(dg_ptr, rows, cols, s_dgm, s_dgn, acc * u * _act_grad(g, ACT), M, N)
    _store(du_ptr, rows, cols, s_dum, s_dun, acc * a, M, N)


@triton.jit
def _gated_fwd_tma_kernel(
    x_desc, w_desc, h_desc, g_desc, u_desc, b_ptr, M, N, K,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_GU: tl.constexpr, SWAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    """h = act(x Wg^T + bg) * (x Wu^T + bu) as ONE GEMM, persistent over the tiles: w_desc
    is the [H, 2, K] pair descriptor of (Wg, Wu) (of (Wu, Wg) with SWAP; weight_pair), so
    each B tile holds Wg's and Wu's rows alternating, a [BLOCK_M, 2 BLOCK_N] accumulator
    holds g and u in alternating columns, and the epilogue splits them apart (N = hidden
    width). b_ptr: the biases interleaved in the same order."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_pos(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_acc(x_desc, w_desc, off_m, off_n, K, True, BLOCK_M, 2 * BLOCK_N,
                       BLOCK_K, UPCAST, PRECISION, True)
        if HAS_BIAS:
            cols2 = 2 * off_n + tl.arange(0, 2 * BLOCK_N)
            acc += tl.load(b_ptr + cols2, mask=cols2 < 2 * N, other=0.0).to(tl.float32)[None, :]
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))
        if SWAP:
            g, u = u, g
        if STORE_GU:  # training only
            g_desc.store([off_m, off_n], g.to(g_desc.dtype))
            u_desc.store([off_m, off_n], u.to(u_desc.dtype))
        h_desc.store([off_m, off_n], (_act(g, ACT) * u).to(h_desc.dtype))


@triton.jit
def _gated_bwd_epilogue(acc, g_desc, u_desc, dg_desc, du_desc, h_desc, off_m, off_n,
                        ACT: tl.constexpr, STORE_H: tl.constexpr):
    g = g_desc.load([off_m, off_n]).to(tl.float32)
    u = u_desc.load([off_m, off_n]).to(tl.float32)
    dg_desc.store([off_m, off_n], (acc * u * _act_grad(g, ACT)).to(dg_desc.dtype))
    du_desc.store([off_m, off_n], (acc * _act(g, ACT)).to(du_desc.dtype))
    if STORE_H:
        h_desc.store([off_m, off_n], (_act(g, ACT) * u).to(h_desc.dtype))


@triton.jit
def _gated_bwd_tma_kernel(
    dy_desc, wd_desc, g_desc, u_desc, dg_desc, du_desc, h_desc, M, N, K,
    ACT: tl.constexpr, STORE_H: tl.constexpr, SUBTILE: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    """_gated_bwd_kernel persistent through descriptors: dh = dy @ Wd (Wd read as
    [K = out, N = hidden] tiles); dg = dh u act'(g), du = dh act(g); with STORE_H also
    h = act(g) u, the down projection's input, for its weight gradient. SUBTILE as in
    _dx_tma_kernel."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_pos(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_acc(dy_desc, wd_desc, off_m, off_n, K, False, BLOCK_M, BLOCK_N, BLOCK_K,
                       UPCAST, PRECISION)
        if SUBTILE:
            acc0, acc1 = _subtiles(acc, BLOCK_M, BLOCK_N)
            _gated_bwd_epilogue(acc0, g_desc, u_desc, dg_desc, du_desc, h_desc, off_m, off_n,
                                ACT, STORE_H)
            _gated_bwd_epilogue(acc1, g_desc, u_desc, dg_desc, du_desc, h_desc, off_m,
                                off_n + BLOCK_N // 2, ACT, STORE_H)
        else:
            _gated_bwd_epilogue(acc, g_desc, u_desc, dg_desc, du_desc, h_desc, off_m, off_n,
                                ACT, STORE_H)
