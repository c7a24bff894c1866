"""Wide layers: Triton GEMMs with fused prologues/epilogues, layer by layer, any widths.

Kernels (each C = A @ B^T with A: [M, K], B: [N, K], any strides, fp32 accumulation):

    _linear_fwd_kernel    y = act(x W^T + b); optionally also stores z = x W^T + b
    _linear_dx_kernel     g_in = (g' W) * act'(z)   (derivative in the epilogue; optional
                          second product for the gated dx = dg Wg + du Wu; optional h = act(z))
    _linear_dw_kernel     dW = g'^T h (db = sum_rows g' is one reduction beside it)
    _linear_fwd_tma_kernel  the forward GEMM through TMA descriptors, persistent (Hopper+,
                          16-bit operands, large M); a last partial wave of tiles is
                          split along K (stream-K), finished by _stream_k_fixup_kernel
    _gated_fwd_kernel     h = act(x Wg^T + bg) * (x Wu^T + bu): two accumulators, one x tile
    _gated_fwd_tma_kernel the same as one GEMM over [Wg; Wu] interleaved by rows (read in
                          place through one [H, 2, K] descriptor), through TMA
                          descriptors, persistent (Hopper+, 16-bit operands, large M)
    _dx_tma_kernel        _linear_dx_kernel's activation case, persistent, every tile
                          (operands and epilogue) through TMA descriptors
    _gated_bwd_tma_kernel _gated_bwd_kernel likewise
    _gated_bwd_kernel     dh = dy Wd; epilogue: dg = dh u act'(g), du = dh act(g)

g' is g times the output activation's derivative, applied in the prologue when a layer
has one (the A tiles are scaled right after they are loaded), so no elementwise pass
ever reads or writes an intermediate on its own.

Host functions mirror the Backend interface: ``forward(x, weights, biases, spec, save)``
and ``backward(grad_y, x, weights, biases, saved, spec, needs)``, plus ``gated_forward``
and ``gated_backward``. Kernels see pointers, sizes and strides only; launches run on
the current stream of the tensors' device (Triton's launcher), under a device guard.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import activations, envvars
from .. import device_guard as _guard
from .. import memory, saved_widths
from .act import APPROX
from .act import act as _act
from .act import act_grad as _act_grad
from . import _pow2, triton_cdiv
from . import launch
from .launch import TunedLauncher, bind_context, fitting, int_key

_ACT = {name: a.id for name, a in activations.ACTIVATIONS.items()}
#: FUSEDMLP_APPROX_TANH=0 keeps the tanh-based activations in their portable form on
#: NVIDIA GPUs too (act.py: the hardware tanh is used for fp16 / bf16 operands otherwise)
APPROX_ENV = "FUSEDMLP_APPROX_TANH"
_APPROX_ACTS = ("gelu_tanh", "tanh")
GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
# Pointer offsets are 32-bit in the kernels (cheaper address math in the K loop);
# larger operands are refused on the host, never silently wrapped.
_MAX_ELEMENTS = 2**31 - 1


# ---------------------------------------------------------------- activations ---
# ---------------------------------------------------------------- shared pieces ---
@triton.jit
def _tile_pos(t, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block) of tile number t. Tiles are numbered GROUP_M row-blocks
    down a column before moving right, so a column of B tiles stays in L2 while reused."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first_m = (t // per_group) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (t % per_group) % group_m, (t % per_group) // group_m


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's (rows, cols) of C and its column block: one tile per program."""
    pid_m, pid_n = _tile_pos(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, cols, pid_n


@triton.jit
def _load_k(ptrs, k_left, K_AXIS: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Load a tile whose K axis (0 or 1) may run past the end; rows/cols are wrapped
    (modulo), so only K needs a mask and the tail contributes zeros. EVEN_K (K a
    multiple of BLOCK_K, as in every transformer shape) drops the mask altogether."""
    ks = tl.arange(0, BLOCK_K)
    if EVEN_K:
        t = tl.load(ptrs)
    elif K_AXIS == 1:
        t = tl.load(ptrs, mask=ks[None, :] < k_left, other=0.0)
    else:
        t = tl.load(ptrs, mask=ks[:, None] < k_left, other=0.0)
    return t


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    if UPCAST:  # the CPU interpreter multiplies bf16 wrongly; fp32 there is exact
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _mm(a_ptr, b_ptr, za_ptr, rows, cols, K,
        s_am, s_ak, s_bn, s_bk, s_zm, s_zk, acc,
        A_ACT: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """acc += A'[rows, :] @ B[cols, :]^T over K, where A' = A * act'(ZA) when A_ACT != 0
    (the prologue fusion)."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * s_am + ks[None, :] * s_ak
    b_ptrs = b_ptr + cols[None, :] * s_bn + ks[:, None] * s_bk
    z_ptrs = za_ptr + rows[:, None] * s_zm + ks[None, :] * s_zk
    for k0 in range(0, K, BLOCK_K):
        a = _load_k(a_ptrs, K - k0, 1, BLOCK_K, EVEN_K)
        b = _load_k(b_ptrs, K - k0, 0, BLOCK_K, EVEN_K)
        if A_ACT != 0:
            za = _load_k(z_ptrs, K - k0, 1, BLOCK_K, EVEN_K).to(tl.float32)
            a = (a.to(tl.float32) * _act_grad(za, A_ACT)).to(b.dtype)
            z_ptrs += BLOCK_K * s_zk
        acc = _dot(a, b, acc, UPCAST, PRECISION)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk
    return acc


@triton.jit
def _store(ptr, rows, cols, s_m, s_n, val, M, N):
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(ptr + rows[:, None] * s_m + cols[None, :] * s_n, val.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _load_mn(ptr, rows, cols, s_m, s_n, M, N):
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    return tl.load(ptr + rows[:, None] * s_m + cols[None, :] * s_n, mask=mask, other=0.0).to(tl.float32)


# ---------------------------------------------------------------- kernels ---
@triton.jit
def _linear_fwd_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, z_ptr,
    M, N, K, M_BUCKET,
    s_xm, s_xk, s_wn, s_wk, s_ym, s_yn, s_zm, s_zn,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_Z: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    rows, cols, _ = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc = _mm(x_ptr, w_ptr, x_ptr, rows % M, cols % N, K, s_xm, s_xk, s_wn, s_wk, 0, 0,
              acc, 0, UPCAST, PRECISION, BLOCK_K, EVEN_K)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if STORE_Z:
        _store(z_ptr, rows, cols, s_zm, s_zn, acc, M, N)
    _store(y_ptr, rows, cols, s_ym, s_yn, _act(acc, ACT), M, N)


@triton.jit
def _linear_dx_kernel(
    g_ptr, w_ptr, zg_ptr, g2_ptr, w2_ptr, z_ptr, out_ptr, h_ptr,
    M, N, K, K2, M_BUCKET,
    s_gm, s_gk, s_wn, s_wk, s_zgm, s_zgk, s_g2m, s_g2k, s_w2n, s_w2k,
    s_zm, s_zn, s_om, s_on, s_hm, s_hn,
    G_ACT: tl.constexpr, ACT: tl.constexpr, DUAL: tl.constexpr, STORE_H: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """out = (g' @ W [+ g2 @ W2]) * act'(z): the gradient w.r.t. the previous layer's
    pre-activation z (or w.r.t. x when ACT is 0 and there is no z). W is passed with its
    strides swapped, as B[n = in, k = out]. With STORE_H also h = act(z), the previous
    layer's output, which the weight gradient needs and forward did not keep."""
    rows, cols, _ = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    rw, cw = rows % M, cols % N
    acc = _mm(g_ptr, w_ptr, zg_ptr, rw, cw, K, s_gm, s_gk, s_wn, s_wk, s_zgm, s_zgk,
              acc, G_ACT, UPCAST, PRECISION, BLOCK_K, EVEN_K)
    if DUAL:
        acc = _mm(g2_ptr, w2_ptr, g2_ptr, rw, cw, K2, s_g2m, s_g2k, s_w2n, s_w2k, 0, 0,
                  acc, 0, UPCAST, PRECISION, BLOCK_K, EVEN_K)
    if ACT != 0:
        z = _load_mn(z_ptr, rows, cols, s_zm, s_zn, M, N)
        acc = acc * _act_grad(z, ACT)
        if STORE_H:
            _store(h_ptr, rows, cols, s_hm, s_hn, _act(z, ACT), M, N)
    _store(out_ptr, rows, cols, s_om, s_on, acc, M, N)


@triton.jit
def _linear_dw_kernel(
    g_ptr, h_ptr, zg_ptr, dw_ptr,
    M, N, K, M_BUCKET,
    s_gm, s_gk, s_hn, s_hk, s_zgm, s_zgk, s_wm, s_wn,
    G_ACT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """dW[out, in] = g'^T @ h, K = the batch rows; g' and h are read through swapped
    strides."""
    rows, cols, _ = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc = _mm(g_ptr, h_ptr, zg_ptr, rows % M, cols % N, K, s_gm, s_gk, s_hn, s_hk,
              s_zgm, s_zgk, acc, G_ACT, UPCAST, PRECISION, BLOCK_K, EVEN_K)
    _store(dw_ptr, rows, cols, s_wm, s_wn, acc, M, N)


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


# ------------------------------------------------------ TMA kernels (Hopper+) ---
# The forward GEMM of large-M inputs reads A and B through tensor descriptors (the TMA
# engine copies whole tiles into shared memory, zero-filling past the edges, so no masks
# and no address math in the K loop) and runs persistent: one program per SM walks the
# tiles in the grouped order. On the H200 (Triton 3.6, bf16, M 8192; benchmarks/
# probe_tma_gemm.py, h200-probe-tma-gemm-20261130{,b,c}.json) this took the wide-gelu
# GEMMs from 504-572 TFLOP/s (the pointer kernels above) to 647-684, against cuBLAS's
# 679-719 without an epilogue. The gated GEMM the same way with two 128x128 accumulators
# and two weight descriptors ran 3.44 ms against the pointer kernel's 3.39 (x 8192x4096,
# hidden 14336); as ONE GEMM over the interleaved weights (_gated_fwd_tma_kernel) 2.79.
@triton.jit
def _tma_acc(a_desc, b_desc, off_m, off_b, K, B_NK: tl.constexpr, BLOCK_M: tl.constexpr,
             ACC_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
             PRECISION: tl.constexpr, B_PAIR: tl.constexpr = False, k_lo=0):
    """The [BLOCK_M, ACC_N] fp32 tile A[off_m:, k_lo:K] @ B from descriptor tiles: A's are
    [BLOCK_M, BLOCK_K] at [off_m, k]; B's are [ACC_N, BLOCK_K] at [off_b, k], used
    transposed (B_NK: a weight in nn.Linear layout), or [BLOCK_K, ACC_N] at [k, off_b].
    B_PAIR (with B_NK): B is a [rows, 2, K] descriptor (two weights' rows side by side,
    see weight_pair) read as [ACC_N / 2, 2, BLOCK_K] tiles at [off_b, 0, k], whose rows
    alternate between the two weights; in shared memory that tile is laid out as the
    [ACC_N, BLOCK_K] tile of the interleaved weight would be."""
    acc = tl.zeros((BLOCK_M, ACC_N), tl.float32)
    for k in range(k_lo, K, BLOCK_K):
        a = a_desc.load([off_m, k])
        if B_PAIR:
            b = tl.reshape(b_desc.load([off_b, 0, k]), (ACC_N, BLOCK_K)).T
        elif B_NK:
            b = b_desc.load([off_b, k]).T
        else:
            b = b_desc.load([k, off_b])
        acc = _dot(a, b, acc, UPCAST, PRECISION)
    return acc


@triton.jit
def _fwd_epilogue(acc, b_ptr, y_desc, z_desc, off_m, off_n, N, ACT: tl.constexpr,
                  HAS_BIAS: tl.constexpr, STORE_Z: tl.constexpr, BLOCK_N: tl.constexpr):
    cols = off_n + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if STORE_Z:  # training only
        z_desc.store([off_m, off_n], acc.to(z_desc.dtype))
    y_desc.store([off_m, off_n], _act(acc, ACT).to(y_desc.dtype))


@triton.jit(do_not_specialize=["sk_tiles"])  # 1 would become a constexpr int
def _linear_fwd_tma_kernel(
    x_desc, w_desc, y_desc, z_desc, part_desc, b_ptr, M, N, K, sk_tiles,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_Z: tl.constexpr,
    STREAM_K: tl.constexpr, PART_N: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    """y = act(x W^T + b) (and z = x W^T + b with STORE_Z), persistent over the tiles.
    STREAM_K: the last ``sk_tiles`` tiles (fewer than PROGRAMS: the wave that would leave
    SMs idle) are split along K evenly over every program (stream-K): each program's
    share of their K iterations is one contiguous range, so it spans at most two tiles.
    A tile a program covers whole gets its epilogue here; a partial one goes to the fp32
    workspace (part_desc: [PROGRAMS * 2 * BLOCK_M, BLOCK_N], in pieces of the columns,
    slot 0 for a program's first range and 1 for its second), which
    _stream_k_fixup_kernel sums, in program order, and finishes."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    dp_tiles = tiles - sk_tiles
    for t in tl.range(tl.program_id(0), dp_tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_pos(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_acc(x_desc, w_desc, off_m, off_n, K, True, BLOCK_M, BLOCK_N, BLOCK_K,
                       UPCAST, PRECISION)
        _fwd_epilogue(acc, b_ptr, y_desc, z_desc, off_m, off_n, N, ACT, HAS_BIAS, STORE_Z,
                      BLOCK_N)
    if STREAM_K:
        # a program's share of the tail's K iterations: [it, end), fewer than one tile's
        # (sk_tiles < PROGRAMS), so at most two segments, the second from a tile's start
        k_iters = tl.cdiv(K, BLOCK_K)
        total = sk_tiles.to(tl.int64) * k_iters
        pid = tl.program_id(0)
        it = pid * total // PROGRAMS
        end = (pid + 1) * total // PROGRAMS
        if it < end:
            t_rel = (it // k_iters).to(tl.int32)
            k0 = (it - t_rel * k_iters).to(tl.int32)
            k1 = tl.minimum(k_iters, k0 + (end - it)).to(tl.int32)
            _stream_k_segment(x_desc, w_desc, y_desc, z_desc, part_desc, b_ptr, M, N,
                              dp_tiles + t_rel, k0, k1, k_iters, pid * 2, ACT, HAS_BIAS,
                              STORE_Z, PART_N, UPCAST, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
                              GROUP_M)
            rest = (end - it - (k1 - k0)).to(tl.int32)
            if rest > 0:
                _stream_k_segment(x_desc, w_desc, y_desc, z_desc, part_desc, b_ptr, M, N,
                                  dp_tiles + t_rel + 1, 0, rest, k_iters, pid * 2 + 1, ACT,
                                  HAS_BIAS, STORE_Z, PART_N, UPCAST, PRECISION, BLOCK_M,
                                  BLOCK_N, BLOCK_K, GROUP_M)


@triton.jit
def _stream_k_segment(x_desc, w_desc, y_desc, z_desc, part_desc, b_ptr, M, N, t, k0, k1,
                      k_iters, slot, ACT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      STORE_Z: tl.constexpr, PART_N: tl.constexpr, UPCAST: tl.constexpr,
                      PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """K blocks [k0, k1) of tile t: finished here when that is the whole tile, else
    stored as fp32 partial sums in workspace slot ``slot``."""
    pid_m, pid_n = _tile_pos(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    acc = _tma_acc(x_desc, w_desc, off_m, off_n, k1 * BLOCK_K, True, BLOCK_M, BLOCK_N,
                   BLOCK_K, UPCAST, PRECISION, False, k0 * BLOCK_K)
    if k0 == 0 and k1 == k_iters:
        _fwd_epilogue(acc, b_ptr, y_desc, z_desc, off_m, off_n, N, ACT, HAS_BIAS, STORE_Z,
                      BLOCK_N)
    else:
        _store_pieces(part_desc, slot * BLOCK_M, acc, BLOCK_M, BLOCK_N, PART_N)


@triton.jit
def _store_halves(desc, row, col, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    a0, a1 = _subtiles(acc, BLOCK_M, BLOCK_N)
    desc.store([row, col], a0)
    desc.store([row, col + BLOCK_N // 2], a1)


@triton.jit
def _store_quarters(desc, row, col, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    a0, a1 = _subtiles(acc, BLOCK_M, BLOCK_N)
    _store_halves(desc, row, col, a0, BLOCK_M, BLOCK_N // 2)
    _store_halves(desc, row, col + BLOCK_N // 2, a1, BLOCK_M, BLOCK_N // 2)


@triton.jit
def _store_eighths(desc, row, col, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    a0, a1 = _subtiles(acc, BLOCK_M, BLOCK_N)
    _store_quarters(desc, row, col, a0, BLOCK_M, BLOCK_N // 2)
    _store_quarters(desc, row, col + BLOCK_N // 2, a1, BLOCK_M, BLOCK_N // 2)


@triton.jit
def _store_pieces(desc, row, acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PART_N: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] at [row, 0] through ``desc``, whose blocks are
    [BLOCK_M, PART_N] (1, 2, 4 or 8 of them a row): in column pieces, so the shared-memory
    staging tile is a piece, not the tile. The stream-K partials are fp32; at 128x256
    their staging tile did not fit beside the forward's pipeline buffers whole or in
    halves (Triton 3.9's sm_90 compile: 272 / 240 KB against the 227 KB limit; 224 KB
    in eighths)."""
    if BLOCK_N // PART_N == 8:
        _store_eighths(desc, row, 0, acc, BLOCK_M, BLOCK_N)
    elif BLOCK_N // PART_N == 4:
        _store_quarters(desc, row, 0, acc, BLOCK_M, BLOCK_N)
    elif BLOCK_N // PART_N == 2:
        _store_halves(desc, row, 0, acc, BLOCK_M, BLOCK_N)
    else:
        tl.static_assert(BLOCK_N == PART_N)
        desc.store([row, 0], acc)


@triton.jit(do_not_specialize=["sk_tiles"])
def _stream_k_fixup_kernel(
    part_ptr, b_ptr, y_ptr, z_ptr, M, N, K, sk_tiles, s_ym, s_zm,
    ACT: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_Z: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr, FIX_M: tl.constexpr, FIX_N: tl.constexpr,
):
    """The stream-K tiles of _linear_fwd_tma_kernel that more than one program worked on:
    program (tile, piece) sums its [FIX_M, FIX_N] piece of every contributor's fp32
    partial in program order (the same order every run), adds the bias and stores y
    (and z). Contributors of tile t are the programs whose K-iteration ranges overlap
    t's, first to last (the range arithmetic of the main kernel, inverted), less those
    with empty ranges in between."""
    t_rel = tl.program_id(0)
    piece = tl.program_id(1)
    k_iters = tl.cdiv(K, BLOCK_K)
    total = sk_tiles.to(tl.int64) * k_iters
    first = ((t_rel * k_iters + 1) * PROGRAMS + total - 1) // total - 1
    last = ((t_rel + 1) * k_iters * PROGRAMS + total - 1) // total - 1
    if first < last:  # else one program covered the whole tile and finished it
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        pid_m, pid_n = _tile_pos(tiles - sk_tiles + t_rel, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rr = (piece // (BLOCK_N // FIX_N)) * FIX_M + tl.arange(0, FIX_M)
        cc = (piece % (BLOCK_N // FIX_N)) * FIX_N + tl.arange(0, FIX_N)
        acc = tl.zeros((FIX_M, FIX_N), tl.float32)
        offs = rr[:, None] * BLOCK_N + cc[None, :]
        # eight contributors a step: independent loads in flight, not one at a time
        for p0 in range(first, last + 1, 8):
            for j in tl.static_range(8):
                p = p0 + j
                start = p * total // PROGRAMS
                # a program with no iterations (more programs than the tail has) wrote
                # nothing; slot 1 when the tile is the program's second range
                ok = (p <= last) & ((p + 1) * total // PROGRAMS > start)
                slot = p * 2 + (start < t_rel * k_iters).to(tl.int64)
                # (a scalar mask as a bound on the offsets: Triton 3.9's interpreter
                # rejects tensor & scalar boolean masks)
                acc += tl.load(part_ptr + slot * BLOCK_M * BLOCK_N + offs,
                               mask=offs < ok.to(tl.int32) * (BLOCK_M * BLOCK_N), other=0.0)
        rows = pid_m * BLOCK_M + rr
        cols = pid_n * BLOCK_N + cc
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if STORE_Z:
            _store(z_ptr, rows, cols, s_zm, 1, acc, M, N)
        _store(y_ptr, rows, cols, s_ym, 1, _act(acc, ACT), M, N)


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
def _subtiles(acc, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A [BLOCK_M, BLOCK_N] accumulator as its left and right [BLOCK_M, BLOCK_N / 2]
    halves (the register layout of tensor-core results splits along N in place): an
    epilogue that takes the halves one after the other holds half as many of its
    operand tiles in registers at a time."""
    return tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _dx_epilogue(acc, z_desc, out_desc, h_desc, off_m, off_n, ACT: tl.constexpr,
                 STORE_H: tl.constexpr):
    z = z_desc.load([off_m, off_n]).to(tl.float32)
    out_desc.store([off_m, off_n], (acc * _act_grad(z, ACT)).to(out_desc.dtype))
    if STORE_H:
        h_desc.store([off_m, off_n], _act(z, ACT).to(h_desc.dtype))


@triton.jit
def _dx_tma_kernel(
    g_desc, w_desc, z_desc, out_desc, h_desc, M, N, K,
    ACT: tl.constexpr, STORE_H: tl.constexpr, SUBTILE: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    """out = (g @ W) * act'(z) (h = act(z) too with STORE_H), persistent; W read as
    [K = out, N = in] tiles. Every epilogue tile moves through a descriptor: no pointer
    tensors in registers. SUBTILE: the epilogue in two halves of the tile (its
    descriptors' blocks are [BLOCK_M, BLOCK_N / 2])."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_pos(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_acc(g_desc, w_desc, off_m, off_n, K, False, BLOCK_M, BLOCK_N, BLOCK_K,
                       UPCAST, PRECISION)
        if SUBTILE:
            acc0, acc1 = _subtiles(acc, BLOCK_M, BLOCK_N)
            _dx_epilogue(acc0, z_desc, out_desc, h_desc, off_m, off_n, ACT, STORE_H)
            _dx_epilogue(acc1, z_desc, out_desc, h_desc, off_m, off_n + BLOCK_N // 2, ACT,
                         STORE_H)
        else:
            _dx_epilogue(acc, z_desc, out_desc, h_desc, off_m, off_n, ACT, STORE_H)


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


# ---------------------------------------------------------------- tuning ---
# Each list is the config space the autotuner times once per (kernel, M bucket, N, K,
# constexprs, dtypes); after warm-up every call is a dict lookup.
def _configs_nvidia(dual: bool) -> list[triton.Config]:
    """Hopper/Ampere, 16-bit operands. Large M: 128x256x64 with 8 warps and 3 stages is
    the classic Hopper tile for bf16 (3 x (128+256) x 64 x 2 B = 144 KB of smem, under the
    228 KB an H100/H200 SM has); 4-stage 128x128 trades reuse for a smaller last wave
    (M 8192, N 4096: 1024 tiles of 128x256 = 7.8 waves on 132 SMs, 2048 of 128x128 =
    15.5). Small M (decode, <= 64 rows) is bound by reading the weights: narrow BLOCK_M,
    deep BLOCK_K, and BLOCK_N small enough that N / BLOCK_N programs fill the 132 SMs
    (N 4096 / 32 = 128 programs). ``dual`` kernels hold two accumulators (or a heavy
    epilogue): half the tile width keeps them in registers. The lists are the search space;
    the autotuner picks per shape on first use. On the H200 (Triton 3.6, bf16, M 8192) the
    3-stage lists' picks ran at 545-560 TFLOP/s against cuBLAS's ~695 (wide-gelu/-swiglu
    inference): the 4-stage large tiles were added after that run. 16 warps halve the
    accumulator a thread holds: the input gradient with the gelu' epilogue and h stored
    (M 8192, 4096 -> 16384) spilled registers at 128x256 / 8 warps (ncu) and ran 2.22 ms
    there, 2.14 ms at 128x256 / 16 warps (h200-probe-epilogue-20261130b.json)."""
    big = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
           (128, 256, 64, 8, 4), (256, 128, 64, 8, 4),  # 4 stages: 192 KB
           (128, 256, 64, 16, 3)]
    small = [(16, 64, 256, 4, 4), (32, 64, 128, 4, 5), (64, 64, 128, 4, 4), (16, 32, 256, 4, 5)]
    if dual:  # two B tiles a stage: smem = stages x (BM + 2 BN) x BK x 2 B stays <= 196 KB
        big = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4)]
        small = [(16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 64, 64, 4, 4)]
    return [_cfg(*c) for c in big + small]


def _configs_intel(dual: bool) -> list[triton.Config]:
    """Data Center GPU Max 1550 (Triton's XPU backend): 32 warps of 16 lanes and the large
    register file (grf_mode 'large', 256 registers a thread) are what Intel's own GEMM
    tuning uses for 256x256 bf16 tiles; BLOCK_K 32 matches one DPAS k-step x 2. Unmeasured
    here (no Intel GPU is reachable): a starting point, not a tuned result."""
    big = [(256, 256, 32, 32, 4), (256, 128, 32, 32, 3), (128, 256, 32, 32, 3), (128, 128, 32, 16, 3)]
    if dual:
        big = [(256, 128, 32, 32, 3), (128, 128, 32, 16, 3), (128, 64, 32, 16, 3)]
    small = [(16, 128, 64, 8, 3), (32, 64, 64, 8, 3), (64, 128, 32, 16, 3)]
    return [_cfg(*c, grf_mode="large") for c in big + small]


def _configs_interpreter(dual: bool) -> list[triton.Config]:
    """The CPU interpreter: one small tile (16 is tl.dot's minimum), so no timing runs and
    test shapes of a few dozen rows still cross several tiles and K steps."""
    return [_cfg(16, 16, 16, 1, 1)]


def _cfg(bm, bn, bk, warps, stages, **extra) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, **extra),
                         num_warps=warps, num_stages=stages)


def _even_k(args) -> bool:
    """Every K loop of the kernel ends on a whole block (then no load needs a mask)."""
    bk = args["BLOCK_K"]
    return args["K"] % bk == 0 and args.get("K2", 0) % bk == 0


#: FUSEDMLP_WIDE_AUTOTUNE=0 takes the first config of each list instead of timing them
#: (correctness runs on a GPU: dozens of test shapes would otherwise each tune)
AUTOTUNE_ENV = "FUSEDMLP_WIDE_AUTOTUNE"


def _prune(configs, named_args, dual=False, **kwargs):
    """Decode-sized M gets the small-M tiles, everything else the large ones; each tile is
    then fitted to the device's shared memory for the operands' element size."""
    args = {**named_args, **kwargs}
    m = args["M_BUCKET"]
    small = [c for c in configs if c.kwargs["BLOCK_M"] <= 64]
    big = [c for c in configs if c.kwargs["BLOCK_M"] > 64]
    pick = (small if m <= 64 else big) or configs
    t = next((v for v in args.values() if isinstance(v, torch.Tensor)), None)
    if t is not None:
        fitted = {}
        for c in pick:
            f = _fit_smem(c, t.element_size(), dual, _smem_limit(t.device))
            fitted.setdefault((tuple(sorted(f.kwargs.items())), f.num_warps, f.num_stages), f)
        pick = list(fitted.values())
    return pick[:1] if envvars.get(AUTOTUNE_ENV, "1") == "0" else pick


def _smem_bytes(c: triton.Config, esize: int, dual: bool) -> int:
    """Shared memory of the pipelined operand tiles: stages x (A tile + B tile(s)). On the
    H200 this matched Triton's own figure (294912 B for 128x256x64, 3 stages, fp32)."""
    k = c.kwargs
    return c.num_stages * (k["BLOCK_M"] + k["BLOCK_N"] * (2 if dual else 1)) * k["BLOCK_K"] * esize


def _fit_smem(c: triton.Config, esize: int, dual: bool, limit: int) -> triton.Config:
    """The config itself if it fits; else BLOCK_K halved (fp32 operands take twice the bytes
    the 16-bit lists were made for), then fewer stages, down to 32 and 2."""
    k, stages = dict(c.kwargs), c.num_stages
    fits = lambda: _smem_bytes(  # noqa: E731
        triton.Config(k, num_warps=c.num_warps, num_stages=stages), esize, dual) <= limit
    while not fits() and k["BLOCK_K"] > 32:
        k["BLOCK_K"] //= 2
    while not fits() and stages > 2:
        stages -= 1
    if k == c.kwargs and stages == c.num_stages:
        return c
    return triton.Config(k, num_warps=c.num_warps, num_stages=stages, **_extra(c))


def _extra(c: triton.Config) -> dict:
    return {a: getattr(c, a) for a in ("num_ctas", "maxnreg") if getattr(c, a, None) is not None}


_SMEM: dict = {}


def _smem_limit(device: torch.device) -> int:
    """Shared memory one program may use on this device (bytes); no limit in the interpreter."""
    if device.type == "cpu":
        return 1 << 30
    key = (device.type, device.index)
    if key not in _SMEM:
        try:
            idx = device.index if device.index is not None else 0
            props = triton.runtime.driver.active.utils.get_device_properties(idx)
            _SMEM[key] = int(props["max_shared_mem"])
        except Exception:  # noqa: BLE001 -- a driver without the query: the smaller known limit
            _SMEM[key] = 227 * 1024 if device.type == "cuda" else 128 * 1024
    return _SMEM[key]


_KERNELS = {
    "fwd": (_linear_fwd_kernel, False, ("ACT", "HAS_BIAS", "STORE_Z")),
    "dx": (_linear_dx_kernel, False, ("G_ACT", "ACT", "DUAL", "STORE_H", "K2")),
    "dw": (_linear_dw_kernel, False, ("G_ACT",)),
    "gated_fwd": (_gated_fwd_kernel, True, ("ACT", "HAS_BIAS", "STORE_GU")),
    # one accumulator, but an epilogue holding g, u and two outputs: the smaller tiles
    "gated_bwd": (_gated_bwd_kernel, True, ("ACT",)),
}
_tuned: dict[tuple[str, str], object] = {}


def interpreting() -> bool:
    return envvars.get("TRITON_INTERPRET", "0") not in ("", "0")


def act_id(act: str, where, dtype: torch.dtype | None = None) -> int:
    """The ACT constexpr of ``act`` for a kernel on ``where`` (a device, or a tensor whose
    device and dtype count): the registry id, plus act.APPROX for gelu_tanh and tanh
    with fp16 / bf16 operands on an NVIDIA GPU (their outputs round to 8-11 bits anyway;
    fp32 keeps the exact form), unless FUSEDMLP_APPROX_TANH=0."""
    i = _ACT[act]
    if act not in _APPROX_ACTS:
        return i
    if isinstance(where, torch.Tensor):
        where, dtype = where.device, where.dtype
    if (where.type == "cuda" and dtype in (torch.float16, torch.bfloat16)
            and torch.version.hip is None and not interpreting()
            and envvars.get(APPROX_ENV) != "0"):
        i += APPROX.value
    return i


def _vendor(device: torch.device) -> str:
    if device.type == "cpu":
        return "interpreter"
    return "intel" if device.type == "xpu" else "nvidia"


def _kernel(name: str, device: torch.device) -> TunedLauncher:
    """The autotuned kernel for this vendor, built once per process."""
    vendor = _vendor(device)
    k = _tuned.get((name, vendor))
    if k is None:
        fn, dual, keys = _KERNELS[name]
        configs = {"nvidia": _configs_nvidia, "intel": _configs_intel,
                   "interpreter": _configs_interpreter}[vendor](dual)
        key = ["M_BUCKET", "N", "K", *keys, "UPCAST", "PRECISION"]
        tuner = triton.autotune(
            configs, key=key,
            prune_configs_by={"early_config_prune": functools.partial(_prune, dual=dual)},
        )(triton.heuristics({"EVEN_K": _even_k})(fn))
        # the runtime ints the tuning key and the EVEN_K heuristic read
        k = _tuned[(name, vendor)] = TunedLauncher(tuner, fn, {"EVEN_K": _even_k},
                                                   tune=("M_BUCKET", "N", "K", "K2"))
    return k


def _bucket(m: int) -> int:
    """Tuning key for the row count: powers of two up to 64 rows (decode), then 8 coarse
    buckets, so serving traffic with every M in 1..8192 tunes ~14 times, not 8192."""
    # plain int arithmetic: triton.next_power_of_2 unwraps constexprs (~2 us a call)
    return min(_pow2(m), 8192)


def _meta(t: torch.Tensor) -> dict:
    return _meta_for(t.device, t.dtype)


def _meta_for(device: torch.device, dtype: torch.dtype) -> dict:
    """UPCAST and PRECISION for operands of ``dtype`` on ``device``."""
    up = device.type == "cpu" and dtype == torch.bfloat16 and interpreting()
    # fp32 operands: full-precision products ("ieee") so fp32 keeps its 1e-5 bound, not
    # the 1e-3 of tf32; 16-bit operands keep Triton's default (tensor cores either way).
    half = dtype in (torch.float16, torch.bfloat16)
    return dict(UPCAST=up, PRECISION="tf32" if half else "ieee")


def _grid(M, N):
    return lambda meta: (triton_cdiv(M, meta["BLOCK_M"]) * triton_cdiv(N, meta["BLOCK_N"]),)


def _check_size(*ts):
    for t in ts:
        if t is not None and t.numel() > _MAX_ELEMENTS:
            raise ValueError(f"wide kernels: a {tuple(t.shape)} operand exceeds 2^31 elements; "
                             "split the batch")


def available() -> tuple[bool, str]:
    """Whether these kernels can run in this process (any device they support)."""
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return True, f"triton {triton.__version__}"
    if interpreting():
        return True, f"triton {triton.__version__} interpreter (TRITON_INTERPRET=1), slow"
    return False, "no cuda/xpu device and TRITON_INTERPRET is not set"


def supports_device(device: torch.device) -> bool:
    return device.type in ("cuda", "xpu") or (device.type == "cpu" and interpreting())


# ---------------------------------------------------------------- TMA path ---
#: FUSEDMLP_WIDE_TMA=0 keeps every GEMM on the pointer kernels
TMA_ENV = "FUSEDMLP_WIDE_TMA"
try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # an older Triton: the pointer kernels only
    TensorDescriptor = None


def _tma_config_nvidia(kind: str) -> tuple:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages[, subtile]) of the TMA kernels on Hopper
    (subtile: the epilogue in two halves of the tile, for SUBTILE_KINDS): the forward
    for inference ("fwd") or training ("fwd_z": z is stored too), the gated GEMM ("gated",
    "gated_gu": g and u stored too; BLOCK_N counts h's columns, the interleaved weight
    tile has twice as many rows), the input gradient with an activation epilogue ("dx")
    and the gated backward's dh GEMM ("gated_bwd"). H200, Triton 3.6, bf16, M 8192:
    - fwd (three probes, h200-probe-tma-gemm-20261130{,b,c}.json): 128x256x64 / 8 warps /
      3 stages 1.65-1.70 ms (N 16384, K 4096) and 1.61-1.68 ms (N 4096, K 16384), cuBLAS
      1.53-1.62 without an epilogue; 256x128 1.75-1.82, 128x128 / 4 stages 1.80-1.85.
    - fwd_z: with z stored from registers through pointers, 128x256 fitted 2 stages only
      and 128x128x64 / 4 stages was the pick at 1.81-1.88 ms. Through a descriptor
      (h200-probe-epilogue-20261130c.json) 128x256x64 / 3 stages fits and runs 1.70 ms
      (128x128 / 4 stages 1.87, 2 stages 2.39; cuBLAS 1.62).
    - gated, gated_gu (h200-probe-gated-tma-20261130.json, x 8192 x 4096, hidden 14336):
      128x128x64 / 8 warps / 3 stages 2.79 ms, 2.91 storing g and u through pointers
      (4 stages 2.90; 256x64 / 3 stages 2.76; 2 stages 3.91), cuBLAS over [Wg; Wu] 2.76,
      the pointer kernel 3.39 / 3.47. g and u through descriptors (-epilogue-20261130c,
      interleaving copy included): 2.94 at 3 stages, 2.92 at 4.
    - dx, gated_bwd (-epilogue-20261130c): every epilogue tile through a descriptor,
      128x128x64 / 8 warps / 4 stages: dx with gelu' and h stored 2.08 ms (3 stages 2.48;
      the pointer kernel 2.20 at 128x256 / 8 warps, 2.11 at 16 warps; cuBLAS 1.63);
      gated dh with the dg, du epilogue 1.73 ms (pointer kernel 2.07; cuBLAS 1.37). An
      earlier TMA backward that moved its epilogue tiles through pointers (-tma-gemm-c)
      was slower than the pointer kernels.
    - subtile (-epilogue-20261130d): the gated dh GEMM storing h as well spilled 1008 B of
      registers with its epilogue whole (Triton 3.6): 2.37 ms, 1.99 in halves (3 stages
      2.24, 16 warps 2.39-2.83). The dx kernel ran 2.13 ms whole, 2.31 in halves.
    - dx again, with the hardware tanh (h200-probe-approx-20261201c.json, two passes):
      128x256x32 / 8 warps / 4 stages in halves 1.885-1.892 ms (196 KB, 254 registers, no
      spills in the sm_90 compile) against 128x128x64 whole 1.968-1.977; 16 warps 2.38-
      2.40, 128x128x32 / 6 stages 2.68; two programs per SM (-20261201b: 128x128 halves at
      2 stages, or BLOCK_K 32) 2.26-2.52."""
    if kind in ("gated", "gated_gu"):
        return (128, 128, 64, 8, 3)
    if kind == "dx":
        return (128, 256, 32, 8, 4, True)
    if kind == "gated_bwd":
        return (128, 128, 64, 8, 4, True)
    return (128, 256, 64, 8, 3)  # fwd, fwd_z


#: the kinds whose kernels have a SUBTILE epilogue: their configs have a 6th element
SUBTILE_KINDS = ("dx", "gated_bwd")


def _tma_config(device: torch.device, kind: str) -> tuple:
    if device.type == "cpu":  # the interpreter: tl.dot's smallest tile, no pipelining
        return (16, 16, 16, 1, 1) + ((True,) if kind in SUBTILE_KINDS else ())
    return _tma_config_nvidia(kind)


_PROGRAMS: dict = {}


def _programs(device: torch.device) -> int:
    """Programs of a persistent launch: one per SM (4 in the interpreter, so that each
    program there walks several tiles)."""
    key = (device.type, device.index)
    if key not in _PROGRAMS:
        if device.type == "cpu":
            _PROGRAMS[key] = 4
        else:
            props = torch.cuda.get_device_properties(device)
            _PROGRAMS[key] = props.multi_processor_count if props.major >= 9 else 0
    return _PROGRAMS[key]


def _tma_ok(device: torch.device, M: int, N: int, cfg, *tensors) -> bool:
    """Whether this GEMM (output M x N) takes a TMA kernel: a Hopper-class CUDA device (or
    the interpreter), 16-bit operands (fp32 was not measured), at least one full wave of
    tiles, and descriptors the TMA engine accepts: unit column stride, 16-byte aligned
    rows and base addresses. The callers keep decode-sized batches (<= 64 rows) on the
    autotuned pointer kernels, whose small-M tiles spread over the SMs."""
    if TensorDescriptor is None or envvars.get(TMA_ENV, "1") == "0":
        return False
    if (device.type == "cpu" and not interpreting()) or device.type not in ("cuda", "cpu"):
        return False
    if tensors[0].dtype not in (torch.float16, torch.bfloat16):
        return False
    progs = _programs(device)  # 0 before Hopper
    if progs == 0 or triton_cdiv(M, cfg[0]) * triton_cdiv(N, cfg[1]) < progs:
        return False
    return all(t.stride(1) == 1 and t.stride(0) * t.element_size() % 16 == 0
               and t.data_ptr() % 16 == 0 for t in tensors)


#: (kernel, device index, config, constexprs) -> the most stages that fit, once refused
_TMA_FIT: dict = {}


def _tma_launch(kernel, device, cfg, M, N, descs, args, consts) -> bool:
    """Launch a TMA kernel persistent: ``descs`` are (tensor, block rows, block cols) or
    (base tensor, shape, strides, block dims), the blocks named "m"/"n"/"k" (this
    config's tiles), 2, "p" (the stream-K partials' pieces: _part_cols), or "e" (an
    epilogue tile's columns: half of "n" when cfg[5], the SUBTILE flag of the kernels
    that have one, is true), turned into descriptors for this config; ``args`` the rest.
    A config whose shared memory the device refuses steps its stages down (launch.fitting);
    False when not even one fits (the caller takes the pointer kernels)."""
    bind_context(device)
    bm, bn, bk, warps, stages = cfg[:5]
    if len(cfg) > 5:  # the kernels with a SUBTILE epilogue: its tiles are "e" wide
        consts = dict(consts, SUBTILE=cfg[5])
    size = {"m": bm, "n": bn, "k": bk, 2: 2, "p": _part_cols(bn),
            "e": bn // 2 if consts.get("SUBTILE") else bn}
    ds = [TensorDescriptor.from_tensor(d[0], [size[r] for r in d[1:]]) if len(d) == 3
          else TensorDescriptor(d[0], d[1], d[2], [size[r] for r in d[3]]) for d in descs]
    progs = min(_programs(device), triton_cdiv(M, bm) * triton_cdiv(N, bn))
    return fitting(_TMA_FIT, (kernel, device.index, cfg, tuple(consts.items())), stages,
                   lambda s: kernel[(progs,)](
                       *ds, *args, **consts, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                       PROGRAMS=progs, num_warps=warps, num_stages=s))


#: FUSEDMLP_WIDE_STREAM_K=0: the TMA forward leaves its last wave of tiles partial
STREAM_K_ENV = "FUSEDMLP_WIDE_STREAM_K"


#: FLOPs per byte of DRAM traffic where the stream-K tail stops paying (H200 bf16: ~660
#: TFLOP/s dense over ~3.5 TB/s is ~190; see _stream_k_tiles)
_SK_FLOP_PER_BYTE = 190


def _stream_k_tiles(device: torch.device, M: int, N: int, cfg, esize: int = 2) -> int:
    """How many tiles of the TMA forward go to its stream-K tail: those of the last wave
    (tiles % programs) when splitting them pays, else 0 (also when the tiles fill whole
    waves or the switch is off).
    It pays when the last wave is short. The tail's programs each take a slice of K of
    different tiles at once, so their operand tiles come from DRAM with none of the L2
    reuse the grouped waves get: r tiles read r (BLOCK_M + BLOCK_N) K esize bytes. The
    split wins while that read takes under half of one tile's compute time (what an
    unsplit last wave costs), i.e. r < BLOCK_M BLOCK_N programs / (4 (BLOCK_M +
    BLOCK_N) esize F), F the device's FLOPs per byte; K cancels. 128x256 tiles, bf16,
    132 SMs: r <= 7. Measured on the H200 (h200-probe-sk-20261130*.json, x 8192 rows):
    N 16384, K 4096 (4096 tiles, r 4) 1.651-1.663 ms split against 1.660-1.678 not
    split (two calls; 10 of 12 pairs over three calls favour the split, by 0.5-1%);
    N 4096, K 16384 (1024 tiles, r 100) 1.665-1.765 split against 1.619-1.627.
    In the interpreter every partial wave is split (there to be tested)."""
    if envvars.get(STREAM_K_ENV, "1") == "0":
        return 0
    bm, bn = cfg[0], cfg[1]
    tiles = triton_cdiv(M, bm) * triton_cdiv(N, bn)
    progs = _programs(device)
    r = tiles % progs if tiles > progs else 0
    if device.type == "cpu":
        return r
    return r if 4 * r * (bm + bn) * esize * _SK_FLOP_PER_BYTE < bm * bn * progs else 0


def _part_cols(block_n: int) -> int:
    """Columns of one piece of a stream-K partial tile as stored (_store_pieces)."""
    return min(block_n, 32)


def _linear_tma(x, w, b, y, z, cfg, consts) -> bool:
    """y = act(x w^T + b) (z = x w^T + b too with consts["STORE_Z"]) through
    _linear_fwd_tma_kernel, its last partial wave as a stream-K tail finished by
    _stream_k_fixup_kernel; False when the device refuses every stage count of cfg."""
    M, K = x.shape
    N = w.shape[0]
    bm, bn = cfg[0], cfg[1]
    sk = _stream_k_tiles(x.device, M, N, cfg, x.element_size())
    progs = _programs(x.device)
    # fp32 partials, two slots a program (unused and never read when sk is 0)
    part = memory.new_empty(2 * progs * bm, bn, like=x, dtype=torch.float32) if sk else y
    if not _tma_launch(
            _linear_fwd_tma_kernel, x.device, cfg, M, N,
            ((x, "m", "k"), (w, "n", "k"), (y, "m", "n"), (z, "m", "n"), (part, "m", "p")),
            (b, M, N, K, sk), dict(consts, STREAM_K=sk > 0, PART_N=_part_cols(bn))):
        return False
    if sk:
        fm, fn = min(32, bm), min(64, bn)
        _stream_k_fixup_kernel[(sk, (bm // fm) * (bn // fn))](
            part, b, y, z, M, N, K, sk, y.stride(0), z.stride(0),
            ACT=consts["ACT"], HAS_BIAS=consts["HAS_BIAS"], STORE_Z=consts["STORE_Z"],
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg[2], GROUP_M=8, PROGRAMS=progs,
            FIX_M=fm, FIX_N=fn, num_warps=4)
    return True


def _gated_tma(x, w_gate, w_up, b_gate, b_up, act, h, g, u, cfg) -> bool:
    """h (and g, u when given) from the one-GEMM gated TMA kernel, the weights read in
    place where weight_pair allows, else from their interleaved copy. False when the
    device refuses every stage count of ``cfg``."""
    M, K = x.shape
    N = h.shape[1]
    pair = weight_pair(w_gate, w_up)
    if pair is None:
        pair = (interleave(w_gate, w_up), (2 * K, K, 1), False)
    base, strides, swap = pair
    b_i = None
    if b_gate is not None:
        b_i = interleave(b_up, b_gate) if swap else interleave(b_gate, b_up)
    gg, uu = (g, u) if g is not None else (h, h)
    return _tma_launch(
        _gated_fwd_tma_kernel, x.device, cfg, M, N,
        ((x, "m", "k"), (base, (N, 2, K), strides, ("n", 2, "k")), (h, "m", "n"),
         (gg, "m", "n"), (uu, "m", "n")),
        (b_i if b_i is not None else base, M, N, K),
        dict(ACT=act_id(act, x), HAS_BIAS=b_i is not None, STORE_GU=g is not None, SWAP=swap,
             **_meta(x)))


#: TMA strides stop short of 2^40 bytes (cuTensorMapEncodeTiled)
_TMA_STRIDE_BYTES = 2**40


def weight_pair(a: torch.Tensor, b: torch.Tensor):
    """Two [rows, cols] weights of one shape as ONE [rows, 2, cols] TMA view that reads
    a[j] and b[j] side by side in place: its middle stride is the distance from one
    weight to the other (the two need not share storage; the engine reads only the
    rows of the two). Returns (base, strides, swap): base is the lower-addressed of the
    two, swap True when that is b. None when no such view exists: different strides
    or dtypes, a column stride other than 1, rows that are not whole 16 bytes or
    overlap, misaligned or equal addresses, or a distance past what a TMA stride
    reaches; the caller then copies (interleave)."""
    if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype:
        return None
    es = a.element_size()
    pa, pb = a.data_ptr(), b.data_ptr()
    if (a.stride(1) != 1 or a.stride(0) < a.shape[1] or a.stride(0) * es % 16
            or pa % 16 or pb % 16 or pa == pb or abs(pb - pa) >= _TMA_STRIDE_BYTES):
        return None
    if pb > pa:
        return a, (a.stride(0), (pb - pa) // es, 1), False
    return b, (a.stride(0), (pa - pb) // es, 1), True


def _warp_specialized(device: torch.device, dtype: torch.dtype):
    """gluon_wide (the warp-specialized Gluon kernels of the dx and gated dh GEMMs) where
    they run: sm_90 CUDA devices, fp16/bf16, not turned off (FUSEDMLP_GLUON_WIDE=0,
    FUSEDMLP_GLUON=0); else None (wide.py's Triton TMA kernels). The callers have
    checked the operands for TMA (_tma_ok). H200, bf16, M 8192 (two probe runs): the
    gated dh GEMM 1.64-1.83 ms against the Triton kernel's 1.99-2.01, dx 1.71-1.83
    against 1.88-1.89 (NOTES.md, wide history 17)."""
    if device.type != "cuda":
        return None
    from . import gluon_wide  # imports this module: not at the top

    return gluon_wide if gluon_wide.available(device, dtype) else None


def _dx_tma(g, w, z, out, h, act, cfg) -> bool:
    """out = (g @ w) * act'(z) (and h = act(z)) through _dx_tma_kernel; False when the
    device refuses every stage count of ``cfg``."""
    M, K = g.shape
    N = w.shape[1]
    return _tma_launch(
        _dx_tma_kernel, g.device, cfg, M, N,
        ((g, "m", "k"), (w, "k", "n"), (z, "m", "e"), (out, "m", "e"),
         (h if h is not None else out, "m", "e")),
        (M, N, K), dict(ACT=act_id(act, g), STORE_H=h is not None, **_meta(g)))


def _gated_bwd_tma(grad_y, w_down, g, u, dg, du, act, cfg, h=None) -> bool:
    """dg, du (and h = act(g) u when given) from _gated_bwd_tma_kernel; False when
    nothing fits."""
    M, H = g.shape
    return _tma_launch(
        _gated_bwd_tma_kernel, g.device, cfg, M, H,
        ((grad_y, "m", "k"), (w_down, "k", "n"), (g, "m", "e"), (u, "m", "e"),
         (dg, "m", "e"), (du, "m", "e"), (h if h is not None else dg, "m", "e")),
        (M, H, w_down.shape[0]), dict(ACT=act_id(act, g), STORE_H=h is not None, **_meta(g)))


def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[a; b] by rows, alternating: row 2j = a[j], row 2j + 1 = b[j] (a copy)."""
    return torch.stack((a, b), dim=1).reshape(2 * a.shape[0], *a.shape[1:])


# ---------------------------------------------------------------- launchers ---
def linear(x, w, b, act: str, save_z: bool):
    """act(x @ w^T + b) -> (y [M, N], z [M, N] or None). x: [M, K] any strides."""
    return _linear_plan(x.device, x.dtype, w.shape[0], x.shape[1], act, b is not None,
                        save_z)(x, w, b)


@functools.lru_cache(maxsize=1024)
def _linear_plan(device, dtype, N, K, act, has_b, save_z) -> "_LinearForward":
    return _LinearForward(device, dtype, N, K, act, has_b, save_z)


class _Direct:
    """Direct launches of one autotuned pointer kernel under a plan's short key: once the
    general path (launch.py's own key, the autotuner the first time) has launched a call
    of a key, later calls of that key launch the chosen config's compiled kernel directly,
    its grid from that config's tiles. The plan makes the key from what can vary in its
    launches' specialization (row bucket and count, input strides, alignment); key None
    (a misaligned pointer, or the lean path off) always takes the general path."""

    __slots__ = ("kernel", "device", "entries")

    def __init__(self, kernel: TunedLauncher, device: torch.device):
        self.kernel, self.device = kernel, device
        self.entries: dict = {}  # key -> (entry, BLOCK_M, BLOCK_N)

    def launch(self, key, M: int, N: int, args: tuple, consts: dict) -> None:
        hit = self.entries.get(key) if key is not None else None
        if hit is not None and launch.direct_ok(self.device.index):
            entry, bm, bn = hit
            self.kernel.launch_entry(entry, (triton_cdiv(M, bm) * triton_cdiv(N, bn),), args,
                                     self.device.index)
            return
        with _guard(args[0]):
            self.kernel.launch(_grid(M, N), args, consts, self.device)
        if key is not None:
            got = self.kernel.cached(args, consts, self.device)
            if got is not None:
                self.entries[key] = (got[0], got[1]["BLOCK_M"], got[1]["BLOCK_N"])


#: Rows from which an inference layer whose epilogue cuBLAS(Lt) has runs as that torch op
#: on CUDA (_blas_linear). H200, bf16, wide-gelu's layers, device-bound back-to-back calls
#: (NOTES.md wide history 14 and 16; h200-probe-blas-fwd-20261201.json, -20261201b):
#: the second layer, torch.addmm with its bias, 39.3 / 38.1 / 37.9 / 38.3 us at 16 / 32 /
#: 48 / 64 rows against the Triton kernel's 38.6 / 42.0 / 53.7 / 54.0; the first,
#: cuBLASLt's bias + GELU(tanh), 37.1 / 37.7 / 38.5 / 38.6 against the Triton kernel's
#: (hardware tanh) 39.4 / 39.1 / 42.1 / 41.8. The whole block at 16 rows from Python, where
#: the host sets the pace, went from 0.077 to 0.095-0.124 ms with both layers on cuBLAS(Lt)
#: (eager 0.080-0.086; h200-wide-small-20261201b.json): 16 rows and fewer keep the Triton
#: kernels' lean launches. From 17 rows cuBLAS takes these layers up to the TMA kernels'
#: range, where only the hardware tanh's GELU stays on Triton (BLAS_LT_GELU_MAX_ROWS).
BLAS_FWD_MIN_ROWS = 17
#: Up to these rows cuBLASLt's bias + GELU(tanh) takes the layer even where the Triton
#: kernel has the hardware tanh (faster from 8192 rows: h200-probe-approx-20261201.json;
#: from 65 to 4096 rows not timed, so the kernel keeps them)
BLAS_LT_GELU_MAX_ROWS = 64
#: the activations cuBLASLt's epilogues apply after the bias (torch._addmm_activation)
_BLAS_EPILOGUES = ("gelu_tanh", "relu")


def _blas_linear(x, w, b, act: str):
    """act(x w^T + b) as one torch op: torch.mm, torch.addmm (bias epilogue), or
    torch._addmm_activation (bias + GELU(tanh) or ReLU epilogue, cuBLASLt)."""
    if act == "none":
        return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())
    return torch._addmm_activation(b, x, w.t(), use_gelu=act == "gelu_tanh")


def _blas_forward_ok(act: str, has_b: bool) -> bool:
    """Whether _blas_linear computes this layer in one op."""
    return act == "none" or (has_b and act in _BLAS_EPILOGUES
                             and hasattr(torch, "_addmm_activation"))


class _LinearForward:
    """linear() for one (device, dtype, N, K, activation, bias?, z?): constexprs and the
    TMA tiles worked out once. At decode sizes a call is all host time, so on CUDA the
    pointer kernel's launches go through _Direct, keyed on the row bucket and what
    Triton specializes rows, x's and w's strides on (tensors, not int addresses, go to
    the launcher: see _NarrowForward)."""

    def __init__(self, device, dtype, N, K, act, has_b, save_z):
        self.device, self.N, self.K, self.save_z = device, N, K, save_z
        self.consts = dict(ACT=act_id(act, device, dtype), HAS_BIAS=has_b, STORE_Z=save_z,
                           **_meta_for(device, dtype))
        self.tma_cfg = _tma_config(device, "fwd_z" if save_z else "fwd")
        # inference on CUDA: cuBLAS(Lt) where it has this epilogue (no z to store); past
        # BLAS_LT_GELU_MAX_ROWS not over the hardware tanh's kernel: with it gelu_tanh's
        # first wide-gelu layer ran 1.638 ms against cuBLASLt's 1.693 at 8192 rows (1.700
        # with the portable gelu; h200-probe-approx-20261201.json)
        self.blas_act = act if (device.type == "cuda" and not save_z
                                and _blas_forward_ok(act, has_b)) else None
        self.blas_max_rows = (BLAS_LT_GELU_MAX_ROWS if self.consts["ACT"] >= APPROX.value
                              else float("inf"))
        self.lean = launch.enabled(device)
        self._direct = _Direct(_kernel("fwd", device), device)  # looked up once
        self._entries = self._direct.entries

    def __call__(self, x, w, b):
        M, N, K = x.shape[0], self.N, self.K
        if (self.blas_act is not None and BLAS_FWD_MIN_ROWS <= M <= self.blas_max_rows
                and _blas(x.device)):
            return _blas_linear(x, w, b, self.blas_act), None
        y = memory.new_empty(M, N, like=x)
        z = memory.new_empty(M, N, like=x) if self.save_z else None
        if M == 0:
            return y, z
        if M * max(N, K) > _MAX_ELEMENTS or N * K > _MAX_ELEMENTS:
            _check_size(x, w, y)
        b = b if b is None or b.is_contiguous() else b.contiguous()  # read with unit stride
        zz = z if z is not None else y
        pb = b if b is not None else w
        if M > 64:
            with _guard(x):
                cfg = self.tma_cfg
                if _tma_ok(x.device, M, N, cfg, x, w, y) and _linear_tma(
                        x, w, pb, y, zz, cfg, self.consts):
                    return y, z
        xs0, xs1 = x.stride()
        ws0, ws1 = w.stride()
        bucket = _bucket(M)
        key = None
        if self.lean and not (x.data_ptr() | w.data_ptr() | pb.data_ptr() | y.data_ptr()
                              | zz.data_ptr()) & 15:  # every pointer 16-byte aligned
            key = (bucket, int_key(M) | int_key(xs0) << 3 | int_key(xs1) << 6
                   | int_key(ws0) << 9 | int_key(ws1) << 12)
        self._direct.launch(key, M, N, (x, w, pb, y, zz, M, N, K, bucket, xs0, xs1, ws0, ws1,
                                        N, 1, N, 1), self.consts)
        return y, z


def grad_input(g, w, z=None, act="none", g_z=None, g_act="none", g2=None, w2=None,
               store_h=False, out=None):
    """(g' @ w [+ g2 @ w2]) * act'(z) -> (out [M, in], h = act(z) or None).

    g: [M, out]; w: [out, in]; g' = g * g_act'(g_z) (prologue). z: [M, in] or None.
    ``out``: a preallocated [M, in] (view) to write into. With nothing to fuse (no
    prologue, no activation) on CUDA, torch.mm / addmm_ (_blas)."""
    M, K = g.shape
    N = w.shape[1]
    if (M and (z is None or act == "none") and g_act == "none" and not store_h
            and _blas(g.device)):
        # torch.mm allocates its own output: one call less of host time than new_empty
        # and mm(out=) (M = 16 train steps are host-bound); no 2^31-element limit here
        out = torch.mm(g, w) if out is None else torch.mm(g, w, out=out)
        if g2 is not None:  # the gated dx: dg Wg + du Wu
            out.addmm_(g2, w2)
        return out, None
    out = memory.new_empty(M, N, like=g) if out is None else out
    h = memory.new_empty(M, N, like=g) if store_h else None
    if M == 0:
        return out, h
    _check_size(g, w, out, g2, w2)
    if z is not None and act != "none" and g_act == "none" and g2 is None and M > 64:
        cfg = _tma_config(g.device, "dx")
        if _tma_ok(g.device, M, N, cfg, g, w, z, out, *([h] if h is not None else [])):
            with _guard(g):
                ws = _warp_specialized(g.device, g.dtype) if K else None
                if ws is not None:
                    ws.launch_ws(ws.DX, act_id(act, g), g, w, z, None, out, None, h)
                    return out, h
                if _dx_tma(g, w, z, out, h, act, cfg):
                    return out, h
    zg = g_z if g_z is not None else g
    zz = z if z is not None else out
    hh = h if h is not None else out
    g2_, w2_ = (g2, w2) if g2 is not None else (g, w)
    K2 = w2_.shape[0]
    # W [out, in] goes in as B[n = in, k = out]: its strides swapped
    (wk, wn), (w2k, w2n) = w.stride(), w2_.stride()
    strides = (*g.stride(), wn, wk, *zg.stride(), *g2_.stride(), w2n, w2k, *zz.stride(),
               *out.stride(), *hh.stride())
    _dx_plan(g.device, g.dtype, N, K, K2, g_act, act if z is not None else "none",
             g2 is not None, store_h).launch(M, (g, w, zg, g2_, w2_, zz, out, hh), strides)
    return out, h


@functools.lru_cache(maxsize=1024)
def _dx_plan(device, dtype, N, K, K2, g_act, act, dual, store_h) -> "_DxLaunch":
    return _DxLaunch(device, dtype, N, K, K2, g_act, act, dual, store_h)


class _DxLaunch:
    """grad_input's pointer-kernel launches for one (device, dtype, N, K, K2, prologue,
    epilogue, dual?, h?). When every operand has the dense strides of its shape (a
    decode-sized backward: no column chunks), the strides Triton specializes on are fixed
    by N, K and K2, so the launches go through _Direct keyed on the row bucket and M's
    specialization alone (host time: the general path builds a key over ~30 arguments
    every call); other strides take the general path."""

    def __init__(self, device, dtype, N, K, K2, g_act, act, dual, store_h):
        self.device, self.N, self.K, self.K2 = device, N, K, K2
        self.consts = dict(G_ACT=act_id(g_act, device, dtype), ACT=act_id(act, device, dtype),
                           DUAL=dual, STORE_H=store_h,
                           **_meta_for(device, dtype))
        # g [M, K], w [K, N] (as w.stride(1), w.stride(0)), zg [M, K], g2 [M, K2],
        # w2 [K2, N], z, out, h [M, N]: the strides in launch order when all are dense
        self.dense = (K, 1, 1, N, K, 1, K2, 1, 1, N, N, 1, N, 1, N, 1)
        self.lean = launch.enabled(device)
        self._direct = _Direct(_kernel("dx", device), device)

    def launch(self, M, tensors, strides):
        key = None
        bucket = _bucket(M)
        if self.lean and strides == self.dense:
            ptrs = 0
            for t in tensors:
                ptrs |= t.data_ptr()
            if not ptrs & 15:  # every pointer 16-byte aligned
                key = (bucket, int_key(M))
        self._direct.launch(key, M, self.N,
                            (*tensors, M, self.N, self.K, self.K2, bucket, *strides),
                            self.consts)


#: FUSEDMLP_WIDE_BLAS=0: the GEMMs with nothing to fuse take the Triton kernels on CUDA too
BLAS_ENV = "FUSEDMLP_WIDE_BLAS"


def _blas(device: torch.device) -> bool:
    """Whether a backward GEMM with nothing to fuse (no prologue: the layer has no output
    activation; no epilogue: a weight gradient, or the input gradient of a layer with no
    input activation, such as the first layer's or the gated dx = dg Wg + du Wu) is
    torch.mm (cuBLAS) on this device rather than a Triton pointer kernel. On CUDA it is.
    cuBLAS ran the wide-swiglu train step's three weight gradients in 4.02 ms of device
    time where the Triton kernel took 4.26-4.39 (H200, M 8192;
    h200-wide-kernels-20261130e.json against -c, -d), and a decode-sized one (K = 16
    rows) in 41 us against 64 (NOTES.md wide history 6). Per GEMM, each pair timed twice
    in turn (h200-probe-blas-20261130.json, M 8192, d 4096, hidden 14336): the gated dx
    2.75-2.77 ms as torch.mm + addmm_ against 2.87 for the dual Triton kernel; a dx with
    no activation 1.37-1.50 against 1.42, a dW 1.38-1.48 against 1.43-1.44 (level).
    Forward layers with no z to store whose epilogue cuBLAS(Lt) has (BLAS_FWD_MIN_ROWS,
    _blas_linear) follow the same switch. Elsewhere (XPU, the interpreter) the Triton
    kernels run."""
    return device.type == "cuda" and envvars.get(BLAS_ENV, "1") != "0"


def grad_weight(g, h, g_z=None, g_act="none", bias_grad=False, out=None):
    """(g'^T @ h [out, in], row sums of g' [out] or None); g: [M, out], h: [M, in].
    ``out``: a preallocated [out, in] (view) to write dW into. Without a prologue on
    CUDA, dW is one torch.mm (_blas)."""
    M, N_out = g.shape
    N_in = h.shape[1]
    # one row reduction, not sums of the A tiles inside the GEMM's loop: with those the
    # wide-gelu train step took 14.8 ms on the H200, without them 11.1 (M 8192; not
    # profiled, NOTES.md wide history 5), and with masked K tails they gave a wrong dW
    # there under Triton 3.6 (wide history 2)
    if M and g_act == "none" and _blas(g.device):
        # the ops allocate their outputs (host time, as in grad_input)
        db = _bias_grad(g, g_z, g_act) if bias_grad else None
        dw = torch.mm(g.t(), h) if out is None else torch.mm(g.t(), h, out=out)
        return dw, db
    dw = memory.new_empty(N_out, N_in, like=g) if out is None else out
    db = memory.new_empty(N_out, like=g) if bias_grad else None
    if M == 0:  # a sum over no rows
        dw.zero_()
        if db is not None:
            db.zero_()
        return dw, db
    _check_size(g, h, dw)
    zg = g_z if g_z is not None else g
    if db is not None:
        _bias_grad(g, g_z, g_act, out=db)
    with _guard(g):
        # K of this GEMM is the batch; bucket the output rows (N_out) like any M
        _kernel("dw", g.device).launch(
            _grid(N_out, N_in), (
                g, h, zg, dw,
                N_out, N_in, M, _bucket(N_out),
                g.stride(1), g.stride(0), h.stride(1), h.stride(0), zg.stride(1), zg.stride(0),
                dw.stride(0), dw.stride(1),
            ),
            dict(G_ACT=act_id(g_act, g), **_meta(g)),
            g.device,
        )
    return dw, db


def _bias_grad(g, g_z, g_act, out=None):
    """Bias gradient alone (weights need none): one reduction over the rows (into ``out``
    when given)."""
    if g_act == "none":  # torch sums 16-bit tensors in fp32 and rounds once: one op
        return g.sum(0) if out is None else torch.sum(g, 0, out=out)
    dtype = g.dtype
    g = g.float() * activations.ACTIVATIONS[g_act].grad(g_z.float())
    db = g.sum(0).to(dtype)
    return db if out is None else out.copy_(db)


# ---------------------------------------------------------------- Backend shapes ---
def forward(x, weights, biases, spec, save):
    """x: [N, in] (any strides) -> (y [N, out], saved pre-activations as Backend.forward)."""
    saved = []
    h = x
    L = len(weights)
    for i, w in enumerate(weights):
        last = i == L - 1
        act = spec.output_activation if last else spec.activation
        keep = save and (not last or act != "none")
        h, z = linear(h, w, None if biases is None else biases[i], act, keep)
        if keep:
            saved.append(z)
    if not save:
        return h, None
    # the Backend contract: one [N, S] tensor. With one saved layer (the usual two-layer FFN)
    # that is z itself; with more, this concatenation is an extra copy (not yet avoided by
    # writing z into slices of one buffer)
    if len(saved) == 1:
        return h, saved[0]
    return h, torch.cat(saved, dim=-1) if saved else x.new_empty(x.shape[0], 0)


# The weight gradient of layer i needs h_{i-1} = act(z_{i-1}), which forward did not keep
# (it saves z only). Rebuilding all of it at once costs a [rows, width] temporary on top
# of z, g_{i-1} and dW: for wide-gelu train at M 8192 (width 16384, bf16) that is 256 MiB
# and puts the step's peak level with eager's. Built in column chunks of <= 128 MiB
# (2 chunks there) the peak drops ~128 MiB below eager's, and each chunk's GEMMs stay
# large (8192 x 8192 x 4096). Chunks are multiples of 256 columns, the widest tile.
H_CHUNK_BYTES = 128 * 2**20
CHUNK_ALIGN = 256


def _col_chunks(rows: int, cols: int, esize: int, budget: int | None = None
                ) -> list[tuple[int, int]]:
    """Column ranges of a [rows, cols] tensor, each at most ``budget`` bytes
    (H_CHUNK_BYTES by default) and starting at a multiple of CHUNK_ALIGN columns."""
    n = max(1, -(-rows * cols * esize // (budget or H_CHUNK_BYTES)))
    step = -(-cols // n)
    step = -(-step // CHUNK_ALIGN) * CHUNK_ALIGN
    return [(c, min(c + step, cols)) for c in range(0, cols, step)]


def _hidden_layer_grads(g, w, z, act, g_z, g_act, need_b):
    """For a hidden layer i > 0: g_{i-1} = (g' W_i) * act'(z_{i-1}) and dW_i = g'^T h_{i-1},
    h_{i-1} rebuilt chunk by chunk of columns in the epilogue of the g_{i-1} GEMM."""
    M, n_in = z.shape
    db = _bias_grad(g, g_z, g_act) if need_b else None
    chunks = _col_chunks(M, n_in, g.element_size())
    if len(chunks) == 1:  # no column views to make (host time at decode sizes)
        g_next, h = grad_input(g, w, z, act, g_z, g_act, store_h=True)
        dw, _ = grad_weight(g, h, g_z, g_act)
        return g_next, dw, db
    g_next = memory.new_empty(M, n_in, like=g)
    dw = memory.new_empty(w.shape[0], n_in, like=g)
    for c0, c1 in chunks:
        _, h = grad_input(g, w[:, c0:c1], z[:, c0:c1], act, g_z, g_act, store_h=True,
                          out=g_next[:, c0:c1])
        grad_weight(g, h, g_z, g_act, out=dw[:, c0:c1])
        del h  # free this chunk's h before the next one is allocated
    return g_next, dw, db


def backward(grad_y, x, weights, biases, saved, spec, needs):
    """grad_y: [N, out] -> (grad_x | None, grad_weights, grad_biases) as Backend.backward.

    Per layer i (last first), with g' = g * act'(z_i) already folded in:
      grad_input: g_{i-1} = (g' W_i) * act'(z_{i-1}), and h_{i-1} = act(z_{i-1}) when
                  the weight gradient needs it (forward kept z, not h), by column chunks;
      grad_weight: dW_i = g'^T h_{i-1}, db_i from the same tiles."""
    need_x, need_w, need_b = needs
    need_b = need_b and biases is not None
    if saved is None:
        _, saved = forward(x, weights, biases, spec, True)
    widths = saved_widths(spec)
    if len(widths) == 1 and saved.is_contiguous():  # the usual FFN: z itself, no views
        saved = [saved]
    else:
        saved = [z.contiguous() for z in saved.split(widths, dim=-1)]
    L = len(weights)
    act = spec.activation
    g, g_z, g_act = grad_y, None, "none"
    if spec.output_activation != "none":
        g_z, g_act = saved[L - 1], spec.output_activation
    gw, gb = [None] * L, [None] * L
    grad_x = None
    for i in range(L - 1, -1, -1):
        h_in = x
        g_next = None
        if i > 0 and need_w and act != "none":
            g_next, gw[i], gb[i] = _hidden_layer_grads(g, weights[i], saved[i - 1], act,
                                                       g_z, g_act, need_b)
            g, g_z, g_act = g_next, None, "none"
            continue
        if i > 0:  # with no hidden activation h_{i-1} is z_{i-1} itself
            g_next, _ = grad_input(g, weights[i], saved[i - 1], act, g_z, g_act)
            h_in = saved[i - 1]
        elif need_x:
            grad_x, _ = grad_input(g, weights[0], None, "none", g_z, g_act)
        if need_w:
            gw[i], gb[i] = grad_weight(g, h_in, g_z, g_act, need_b)
        elif need_b:
            gb[i] = _bias_grad(g, g_z, g_act)
        g, g_z, g_act = g_next, None, "none"
    return grad_x, (gw if need_w else []), (gb if need_b else [])


# ---------------------------------------------------------------- gated ---
#: Rows from which the gated GEMM takes the TMA kernel (where _tma_ok allows). Set when
#: the kernel read an interleaved copy made per call (0.12 ms for 2 x 14336 x 4096 bf16
#: against 0.6 ms saved on the GEMM at 8192 rows, H200: break-even ~1700 rows). It now
#: reads the weights in place (weight_pair) and copies only when their strides differ;
#: fewer rows were never timed, so the threshold stays.
GATED_TMA_MIN_ROWS = 4096


def gated_hidden(x, w_gate, w_up, activation, save, b_gate=None, b_up=None):
    """h = act(x Wg^T + bg) * (x Wu^T + bu) -> (h [M, H], [g, u] when save else []).
    Large M on Hopper-class GPUs (16-bit operands): ONE GEMM over the interleaved
    weights (_gated_fwd_tma_kernel); otherwise two accumulators over the same x tiles
    (_gated_fwd_kernel)."""
    return _gated_plan(x.device, x.dtype, w_gate.shape[0], x.shape[1], activation,
                       b_gate is not None, save)(x, w_gate, w_up, b_gate, b_up)


@functools.lru_cache(maxsize=1024)
def _gated_plan(device, dtype, H, K, act, has_b, save) -> "_GatedForward":
    return _GatedForward(device, dtype, H, K, act, has_b, save)


class _GatedForward:
    """gated_hidden() for one (device, dtype, hidden, d, activation, biases?, save?):
    constexprs and tiles worked out once; the pointer kernel's launches through _Direct
    (as _LinearForward's), keyed on the row bucket and what Triton specializes rows and
    x's, Wg's and Wu's strides on."""

    def __init__(self, device, dtype, H, K, act, has_b, save):
        self.device, self.H, self.K, self.act, self.save = device, H, K, act, save
        self.consts = dict(ACT=act_id(act, device, dtype), HAS_BIAS=has_b, STORE_GU=save,
                           **_meta_for(device, dtype))
        self.tma_cfg = _tma_config(device, "gated_gu" if save else "gated")
        self.lean = launch.enabled(device)
        self._direct = _Direct(_kernel("gated_fwd", device), device)

    def __call__(self, x, w_gate, w_up, b_gate, b_up):
        M, H, K = x.shape[0], self.H, self.K
        h = memory.new_empty(M, H, like=x)
        g = memory.new_empty(M, H, like=x) if self.save else None
        u = memory.new_empty(M, H, like=x) if self.save else None
        saved = [g, u] if self.save else []
        if M == 0:
            return h, saved
        if M * max(H, K) > _MAX_ELEMENTS or H * K > _MAX_ELEMENTS:
            _check_size(x, w_gate, h)
        # the interleaved weight is a new contiguous [2H, K]: its rows need K x esize
        # to be whole 16 bytes, which x's row stride need not show (a column slice)
        if (M >= GATED_TMA_MIN_ROWS and K * x.element_size() % 16 == 0
                and _tma_ok(x.device, M, H, self.tma_cfg, x, h)):
            with _guard(x):
                if _gated_tma(x, w_gate, w_up, b_gate, b_up, self.act, h, g, u,
                              self.tma_cfg):
                    return h, saved
        # the biases are read with unit stride
        b_gate = b_gate if b_gate is None or b_gate.is_contiguous() else b_gate.contiguous()
        b_up = b_up if b_up is None or b_up.is_contiguous() else b_up.contiguous()
        bg = b_gate if b_gate is not None else w_gate
        bu = b_up if b_up is not None else w_up
        gg, uu = (g, u) if self.save else (h, h)
        xs0, xs1 = x.stride()
        gs0, gs1 = w_gate.stride()
        us0, us1 = w_up.stride()
        bucket = _bucket(M)
        key = None
        if self.lean and not (x.data_ptr() | w_gate.data_ptr() | w_up.data_ptr()
                              | bg.data_ptr() | bu.data_ptr() | h.data_ptr() | gg.data_ptr()
                              | uu.data_ptr()) & 15:  # every pointer 16-byte aligned
            key = (bucket, int_key(M) | int_key(xs0) << 3 | int_key(xs1) << 6
                   | int_key(gs0) << 9 | int_key(gs1) << 12 | int_key(us0) << 15
                   | int_key(us1) << 18)
        self._direct.launch(key, M, H, (x, w_gate, w_up, bg, bu, h, gg, uu, M, H, K, bucket,
                                        xs0, xs1, gs0, gs1, us0, us1, H, 1, H, 1, H, 1),
                            self.consts)
        return h, saved


def gated_forward(x, w_gate, w_up, w_down, activation, save, biases=None):
    """x: [M, d] -> (y [M, d_out], saved = [g, u] pre-activations when save, else []).

    biases: None or (b_gate, b_up, b_down)."""
    bg, bu, bd = biases if biases is not None else (None, None, None)
    h, saved = gated_hidden(x, w_gate, w_up, activation, save, bg, bu)
    y, _ = linear(h, w_down, bd, "none", False)
    return y, saved


#: The gated backward's TMA path stores h = act(g) u in column chunks of at most this
#: many bytes (one chunk alive at a time, beside g, u, dg and du). H200, wide-swiglu,
#: 8192 rows (h200-wide-kernels-20261130b.json): at 64 MiB, four chunks of 3584 columns,
#: the dh launches took 2.16 ms against 1.99 for one launch over all columns, and dWd's
#: GEMMs over 3584 columns ran in 3.4 waves of 128x256 tiles; 128 MiB makes two chunks.
GATED_H_CHUNK_BYTES = 128 * 2**20


def _gated_bwd_chunks(grad_y, w_down, g, u, act, need_w, need_b):
    """dg, du, dWd, dbd through _gated_bwd_tma_kernel (Hopper-class GPUs), or None where
    it does not apply. With weight gradients the dh GEMM runs in column chunks, each also
    storing its chunk of h = act(g) u, which dWd's GEMM takes next: no elementwise pass
    rebuilds h (on the H200, wide-swiglu at 8192 rows, torch's silu and product over g
    and u took 0.73 ms of a 13.5 ms step), and only one chunk of h exists at a time."""
    M, H = g.shape
    cfg = _tma_config(g.device, "gated_bwd")
    # dg, du and h are new [M, H] / [M, chunk] tensors: their rows are aligned when H's
    # are; the chunks start at multiples of CHUNK_ALIGN columns
    if M <= 64 or H * g.element_size() % 16 or not _tma_ok(g.device, M, H, cfg, grad_y,
                                                             w_down, g, u):
        return None
    chunks = _col_chunks(M, H, g.element_size(), GATED_H_CHUNK_BYTES) if need_w else [(0, H)]
    ws = _warp_specialized(g.device, g.dtype) if w_down.shape[0] else None
    dg = memory.new_empty(M, H, like=g)
    du = memory.new_empty(M, H, like=g)
    dwd = memory.new_empty(w_down.shape[0], H, like=g) if need_w else None
    for c0, c1 in chunks:
        h = memory.new_empty(M, c1 - c0, like=g) if need_w else None
        with _guard(g):
            if ws is not None:
                ws.launch_ws(ws.GATED, act_id(act, g), grad_y, w_down[:, c0:c1], g[:, c0:c1],
                             u[:, c0:c1], dg[:, c0:c1], du[:, c0:c1], h)
            elif not _gated_bwd_tma(grad_y, w_down[:, c0:c1], g[:, c0:c1], u[:, c0:c1],
                                    dg[:, c0:c1], du[:, c0:c1], act, cfg, h):
                return None  # the device refused every stage count: the pointer kernel
        if need_w:
            grad_weight(grad_y, h, out=dwd[:, c0:c1])
        del h
    dbd = _bias_grad(grad_y, None, "none") if need_w and need_b else None
    return dg, du, dwd, dbd


def _gated_bwd_pointer(grad_y, w_down, g, u, act, need_w, need_b):
    """dg, du, dWd, dbd through _gated_bwd_kernel. The down projection's weight gradient
    first, from h = act(g) u rebuilt in column chunks: keeping h whole beside dg and du
    put the train step's peak level with eager's (H200, SwiGLU 1024 -> 4096, 4096 rows);
    chunked, the peak is g, u, dg, du."""
    M, H = g.shape
    dwd = dbd = None
    if need_w:
        dbd = _bias_grad(grad_y, None, "none") if need_b else None
        fn = activations.ACTIVATIONS[act].fn
        chunks = _col_chunks(M, H, g.element_size())
        if len(chunks) == 1:  # no column views (host time at decode sizes)
            dwd, _ = grad_weight(grad_y, fn(g) * u)
            chunks = ()
        else:
            dwd = memory.new_empty(w_down.shape[0], H, like=g)
        for c0, c1 in chunks:
            h = fn(g[:, c0:c1]) * u[:, c0:c1]
            grad_weight(grad_y, h, out=dwd[:, c0:c1])
            del h
    dg = memory.new_empty(M, H, like=g)
    du = memory.new_empty(M, H, like=g)
    if M > 0:
        with _guard(g):
            _kernel("gated_bwd", g.device).launch(
                _grid(M, H), (
                    grad_y, w_down, g, u, dg, du,
                    M, H, w_down.shape[0], _bucket(M),
                    grad_y.stride(0), grad_y.stride(1), w_down.stride(1), w_down.stride(0),
                    g.stride(0), g.stride(1), u.stride(0), u.stride(1),
                    dg.stride(0), dg.stride(1), du.stride(0), du.stride(1),
                ),
                dict(ACT=act_id(act, g), **_meta(g)),
                g.device,
            )
    return dg, du, dwd, dbd


def gated_backward(grad_y, x, w_gate, w_up, w_down, saved, activation, needs, biases=None):
    """grad_y: [M, d_out] -> (grad_x | None, [dWg, dWu, dWd] or [], [dbg, dbu, dbd] or []).

    ``saved`` = [g, u] from gated_forward(save=True), or empty: then they are recomputed
    here (one more gated GEMM) and freed when this returns. needs = (x, weights, biases)."""
    need_x, need_w, need_b = needs
    need_b = need_b and biases is not None
    if not saved:
        bg, bu = (biases[0], biases[1]) if biases is not None else (None, None)
        _, saved = gated_hidden(x, w_gate, w_up, activation, True, bg, bu)
    g, u = saved
    done = _gated_bwd_chunks(grad_y, w_down, g, u, activation, need_w, need_b)
    if done is not None:
        dg, du, dwd, dbd = done
    else:
        dg, du, dwd, dbd = _gated_bwd_pointer(grad_y, w_down, g, u, activation, need_w, need_b)
    grad_x, gw, gb = None, [], []
    if need_x:
        grad_x, _ = grad_input(dg, w_gate, g2=du, w2=w_up)
    if need_w:
        dwg, dbg = grad_weight(dg, x, bias_grad=need_b)
        dwu, dbu = grad_weight(du, x, bias_grad=need_b)
        gw = [dwg, dwu, dwd]
        gb = [dbg, dbu, dbd] if need_b else []
    elif need_b:
        gb = [_bias_grad(t, None, "none") for t in (dg, du, grad_y)]
    return grad_x, gw, gb
