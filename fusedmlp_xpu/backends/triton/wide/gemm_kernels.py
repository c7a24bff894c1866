"""The wide layers' Triton GEMM kernels, each C = A @ B^T with A: [M, K], B: [N, K], any
strides, fp32 accumulation:

    _linear_fwd_kernel    y = act(x W^T + b); optionally also stores z = x W^T + b
    _linear_dx_kernel     g_in = (g' W) * act'(z)   (derivative in the epilogue; optional
                          second product for the gated dx = dg Wg + du Wu; optional h = act(z))
    _linear_dw_kernel     dW = g'^T h (db = sum_rows g' is one reduction beside it)
    _linear_fwd_tma_kernel  the forward GEMM through TMA descriptors, persistent (Hopper+,
                          16-bit operands, large M); a last partial wave of tiles is
                          split along K (stream-K), finished by _stream_k_fixup_kernel
    _dx_tma_kernel        _linear_dx_kernel's activation case, persistent, every tile
                          (operands and epilogue) through TMA descriptors

g' is g times the output activation's derivative, applied in the prologue when a layer
has one (the A tiles are scaled right after they are loaded), so no elementwise pass
ever reads or writes an intermediate on its own. The shared pieces here (tile order,
K loads, dots, stores) serve gated_kernels.py too. Kernels see pointers, sizes and
strides only; the host side is layers.py (launches), configs.py and tma.py.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..act import act as _act
from ..act import times_act_grad as _times_act_grad


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
            a = _times_act_grad(a.to(tl.float32), za, A_ACT).to(b.dtype)
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
        acc = _times_act_grad(acc, z, ACT)
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


# ------------------------------------------------------ TMA kernels (Hopper+) ---
# The forward GEMM of large-M inputs reads A and B through tensor descriptors (the TMA
# engine copies whole tiles into shared memory, zero-filling past the edges, so no masks
# and no address math in the K loop) and runs persistent: one program per SM walks the
# tiles in the grouped order. On the H200 (Triton 3.6, bf16, M 8192; benchmarks/
# probe_tma_gemm.py in git history, h200-probe-tma-gemm-20261130{,b,c}.json) this took the wide-gelu
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
    out_desc.store([off_m, off_n], _times_act_grad(acc, z, ACT).to(out_desc.dtype))
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
