"""The wide backward's two GEMMs with heavy epilogues for Hopper (sm_90), in Gluon,
warp-specialized: the input gradient through an activation, out = (g @ W) * act'(z) (and
h = act(z), the next weight gradient's operand), and the gated backward's dh GEMM,
dh = dy @ Wd with dg = dh u act'(g), du = dh act(g) (and h = act(g) u).

Why (benchmarks/NOTES.md, wide history 17): in the Triton kernels (gemm_kernels.py) every tile's
epilogue (two or three tiles loaded and stored beside the accumulator) runs after its
main loop and before the next tile's, so the tensor cores idle through it; Triton 3.6
has no warp specialization on Hopper to overlap the two. Here one program per SM runs
- two consumer warpgroups that take the program's tiles in turn (ping-pong): while one
  runs its tile's epilogue, the other runs the next tile's main loop (its MMAs on the
  [BLOCK_M, BLOCK_N] accumulator, a warpgroup's own);
- one loader warp that keeps the ring of A and B tiles (STAGES deep) full by TMA, in
  tile order: the consumers' main loops take the ring in turn (a consumer starts its
  main loop once the other has waited for every stage of the tile before: an mbarrier
  wait tells phases apart by parity only, so no wait may run two phases ahead);
- one more loader warp that brings each tile's epilogue inputs (z, or g and u) into
  shared memory while that tile's main loop runs. The epilogues run in tile order, one at
  a time, so one set of those buffers serves both consumers: a consumer writes its
  outputs over its inputs in shared memory (the same register layout reads and writes
  them: each thread only touches its own elements), stores them by TMA, then h over the
  first once its store has read it, and hands the buffers back when the stores are done.
mbarriers carry every hand-over. Tiles at the edges are clipped by the descriptors (TMA
zero-fills the loads past M, N and K, and leaves the stores' rows and columns past them
unwritten)."""
from __future__ import annotations

import functools
import types

import torch

from .... import envvars
from .. import launch
from .. import gluon as _gluon
from ..gluon import Addr, gluon
from .tma import _programs

#: FUSEDMLP_GLUON_WIDE=0 keeps the wide backward on the Triton kernels (tma.py)
#: (FUSEDMLP_GLUON=0 turns off every Gluon kernel)
ENV = "FUSEDMLP_GLUON_WIDE"
#: the epilogues (EPI): dx's z -> out (and h); the gated backward's g, u -> dg, du (and h)
DX, GATED = 0, 1
BLOCK_M, BLOCK_N, BLOCK_K = 128, 128, 64
GROUP_M = 8
#: the registers a thread at launch: 12 warps (two consumer warpgroups, the two loader
#: warps rounded up to a warpgroup) in one SM's 64K
MAXNREG = 168
LOADER_REGS = 24
#: the worker consumer's registers (setmaxnreg); the default partition's consumer gets
#: what is left of 12 * 32 * MAXNREG
CONSUMER_REGS = 232

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ..act import act, act_grad, times_act_grad
    from ..gluon import tma_load as _tma_load
    from ..gluon import tma_store as _tma_store
    from .gemm_kernels import _tile_pos

    @gluon.jit
    def _tiles(M, N, BM: gl.constexpr, BN: gl.constexpr):
        """This program's tile count (tiles pid, pid + programs, ...)."""
        tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
        return gl.cdiv(tiles - gl.program_id(0), gl.num_programs(0))

    @gluon.jit
    def _origin(i, M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP: gl.constexpr):
        """(row, column) of this program's i-th tile's corner."""
        pm, pn = _tile_pos(gl.program_id(0) + i * gl.num_programs(0), M, N, BM, BN, GROUP)
        return pm * BM, pn * BN

    @gluon.jit
    def _ab_loader(ops, GROUP: gl.constexpr):
        """The A and B tiles of every tile's K steps into the ring, in tile order."""
        (a_desc, b_desc, e0_desc, e1_desc, o0_desc, o1_desc, h_desc, a_s, b_s, e_s,
         ready, empty, e_ready, e_free, turn, M, N, K) = ops
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        STAGES: gl.constexpr = a_s.shape[0]
        nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
        kt = gl.cdiv(K, BK)
        for i in range(_tiles(M, N, BM, BN)):
            off_m, off_n = _origin(i, M, N, BM, BN, GROUP)
            for kk in range(kt):
                n = i * kt + kk
                s = n % STAGES
                mbarrier.wait(empty.index(s), ((n // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                _tma_load(a_desc, [off_m, kk * BK], ready.index(s), a_s.index(s))
                _tma_load(b_desc, [kk * BK, off_n], ready.index(s), b_s.index(s))

    @gluon.jit
    def _e_loader(ops, EPI: gl.constexpr, GROUP: gl.constexpr):
        """Every tile's epilogue inputs (z, or g and u), once the last tile's epilogue has
        handed the buffers back."""
        (a_desc, b_desc, e0_desc, e1_desc, o0_desc, o1_desc, h_desc, a_s, b_s, e_s,
         ready, empty, e_ready, e_free, turn, M, N, K) = ops
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        for i in range(_tiles(M, N, BM, BN)):
            off_m, off_n = _origin(i, M, N, BM, BN, GROUP)
            mbarrier.wait(e_free, (i & 1) ^ 1)
            bar = e_ready.index(i % 2)  # the consumer of tile i's
            if EPI == 1:
                mbarrier.expect(bar, 2 * e0_desc.block_type.nbytes)
                _tma_load(e0_desc, [off_m, off_n], bar, e_s.index(0))
                _tma_load(e1_desc, [off_m, off_n], bar, e_s.index(1))
            else:
                mbarrier.expect(bar, e0_desc.block_type.nbytes)
                _tma_load(e0_desc, [off_m, off_n], bar, e_s.index(0))

    @gluon.jit
    def _halves(acc):
        """acc's left and right column halves (tensor-core results split along N in
        place)."""
        BM: gl.constexpr = acc.shape[0]
        BN: gl.constexpr = acc.shape[1]
        return gl.split(gl.permute(gl.reshape(acc, [BM, 2, BN // 2]), [0, 2, 1]))

    @gluon.jit
    def _epilogue(acc, col: gl.constexpr, e_s, EPI: gl.constexpr, ACT: gl.constexpr):
        """The epilogue of the accumulator's columns col.. (acc's width) in shared memory:
        the outputs over their inputs (dx: z -> out; gated: g, u -> dg, du); returns h
        (act(z), or act(g) u) in the operands' dtype, for the caller to store once the
        first output's store has read its tile."""
        W: gl.constexpr = acc.shape[1]
        lay: gl.constexpr = acc.type.layout
        dt: gl.constexpr = e_s.dtype
        if EPI == 1:
            g = e_s.index(0).slice(col, W, dim=1).load(lay).to(gl.float32)
            u = e_s.index(1).slice(col, W, dim=1).load(lay).to(gl.float32)
            a = act(g, ACT)
            e_s.index(0).slice(col, W, dim=1).store((acc * u * act_grad(g, ACT)).to(dt))
            e_s.index(1).slice(col, W, dim=1).store((acc * a).to(dt))
            h = (a * u).to(dt)
        else:
            z = e_s.index(0).slice(col, W, dim=1).load(lay).to(gl.float32)
            e_s.index(0).slice(col, W, dim=1).store(times_act_grad(acc, z, ACT).to(dt))
            h = act(z, ACT).to(dt)
        return h

    @gluon.jit
    def _consumer(c: gl.constexpr, ops, EPI: gl.constexpr, ACT: gl.constexpr,
                  STORE_H: gl.constexpr, GROUP: gl.constexpr):
        """Tiles c, c + 2, ... of this program: the main loop off the ring (one MMA in
        flight; a stage goes back to the loader once the MMA after it was issued and it
        is done), then the epilogue."""
        (a_desc, b_desc, e0_desc, e1_desc, o0_desc, o1_desc, h_desc, a_s, b_s, e_s,
         ready, empty, e_ready, e_free, turn, M, N, K) = ops
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        STAGES: gl.constexpr = a_s.shape[0]
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
        kt = gl.cdiv(K, BK)
        for i in range(c, _tiles(M, N, BM, BN), 2):
            off_m, off_n = _origin(i, M, N, BM, BN, GROUP)
            acc = gl.zeros([BM, BN], gl.float32, mma)
            # the other consumer has waited for every stage of tile i - 1: the ring's
            # barriers are at most one phase behind the ones this main loop waits for
            # (an mbarrier wait tells phases apart by parity only)
            mbarrier.wait(turn.index(c), ((i // 2) & 1) ^ c ^ 1)
            for kk in range(kt):
                n = i * kt + kk
                s = n % STAGES
                mbarrier.wait(ready.index(s), (n // STAGES) & 1)
                acc = warpgroup_mma(a_s.index(s), b_s.index(s), acc, is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))
                mbarrier.arrive(empty.index((n + STAGES - 1) % STAGES), count=1, pred=kk > 0)
            mbarrier.arrive(turn.index(1 - c), count=1)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((i * kt + kt - 1) % STAGES), count=1)

            mbarrier.wait(e_ready.index(c), (i // 2) & 1)
            # in column halves: a half's inputs and outputs take half the registers
            acc0, acc1 = _halves(acc)
            acc00, acc01 = _halves(acc0)
            acc10, acc11 = _halves(acc1)
            Q: gl.constexpr = BN // 4
            h0 = _epilogue(acc00, 0, e_s, EPI, ACT)
            h1 = _epilogue(acc01, Q, e_s, EPI, ACT)
            h2 = _epilogue(acc10, 2 * Q, e_s, EPI, ACT)
            h3 = _epilogue(acc11, 3 * Q, e_s, EPI, ACT)
            fence_async_shared()
            _tma_store(o0_desc, [off_m, off_n], e_s.index(0))
            if EPI == 1:
                _tma_store(o1_desc, [off_m, off_n], e_s.index(1))
            if STORE_H:  # h over the first output once its store has read the tile
                tma.store_wait(pendings=EPI)
                e_s.index(0).slice(0, Q, dim=1).store(h0)
                e_s.index(0).slice(Q, Q, dim=1).store(h1)
                e_s.index(0).slice(2 * Q, Q, dim=1).store(h2)
                e_s.index(0).slice(3 * Q, Q, dim=1).store(h3)
                fence_async_shared()
                _tma_store(h_desc, [off_m, off_n], e_s.index(0))
            tma.store_wait(pendings=0)  # the stores have read the buffers
            mbarrier.arrive(e_free, count=1)

    @gluon.jit
    def _ws_worker(role: gl.constexpr, ops, EPI: gl.constexpr, ACT: gl.constexpr,
                   STORE_H: gl.constexpr, GROUP: gl.constexpr):
        """The worker partitions (one signature): 1 the second consumer, 2 the A/B loader,
        3 the epilogue inputs' loader."""
        if role == 1:
            _consumer(1, ops, EPI, ACT, STORE_H, GROUP)
        elif role == 2:
            _ab_loader(ops, GROUP)
        else:
            _e_loader(ops, EPI, GROUP)

    @gluon.jit
    def _ws_gemm_kernel(a_desc, b_desc, e0_desc, e1_desc, o0_desc, o1_desc, h_desc, M, N, K,
                        EPI: gl.constexpr, ACT: gl.constexpr, STORE_H: gl.constexpr,
                        STAGES: gl.constexpr, GROUP: gl.constexpr, C_REGS: gl.constexpr,
                        L_REGS: gl.constexpr, num_warps: gl.constexpr):
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        dt: gl.constexpr = a_desc.dtype
        a_s = gl.allocate_shared_memory(dt, [STAGES, BM, BK], a_desc.layout)
        b_s = gl.allocate_shared_memory(dt, [STAGES, BK, BN], b_desc.layout)
        e_s = gl.allocate_shared_memory(dt, [2 if EPI == 1 else 1, BM, BN], e0_desc.layout)
        lay: gl.constexpr = mbarrier.MBarrierLayout()
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], lay)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], lay)
        e_ready = gl.allocate_shared_memory(gl.int64, [2, 1], lay)  # one per consumer
        e_free = gl.allocate_shared_memory(gl.int64, [1], lay)
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], lay)  # consumer c's main loop's
        for j in gl.static_range(STAGES):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=1)
        for j in gl.static_range(2):
            mbarrier.init(e_ready.index(j), count=1)
            mbarrier.init(turn.index(j), count=1)
        mbarrier.init(e_free, count=1)
        ops = (a_desc, b_desc, e0_desc, e1_desc, o0_desc, o1_desc, h_desc, a_s, b_s, e_s,
               ready, empty, e_ready, e_free, turn, M, N, K)
        gl.warp_specialize([
            (_consumer, (0, ops, EPI, ACT, STORE_H, GROUP)),
            (_ws_worker, (1, ops, EPI, ACT, STORE_H, GROUP)),
            (_ws_worker, (2, ops, EPI, ACT, STORE_H, GROUP)),
            (_ws_worker, (3, ops, EPI, ACT, STORE_H, GROUP))],
            [4, 1, 1], [C_REGS, L_REGS, L_REGS])


def smem_bytes(epi: int, store_h: bool, stages: int, esize: int = 2) -> int:
    """Shared memory of one program: the ring, the epilogue inputs' tiles (the outputs
    and h go out through them), the barriers."""
    return (stages * (BLOCK_M + BLOCK_N) * BLOCK_K * esize
            + (2 if epi == GATED else 1) * BLOCK_M * BLOCK_N * esize + 8 * (2 * stages + 5))


def stages(epi: int, store_h: bool) -> int:
    """The ring's depth: 4, or the most that fit sm_90's 227 KB below that. H200, bf16,
    M 8192 (h200-probe-gluon-wide-20261202.json, two passes): dx 1.78-1.83 ms at 4
    stages, 1.80-1.97 at 5, 1.87-1.88 at 6; the gated dh GEMM 1.64-1.67 at 4, 1.67-1.72
    at 5; at 3 (an earlier layout, -first-20261202.txt) dx 2.14-2.30 against 1.79-1.80 at
    4."""
    for s in (4, 3, 2):
        if smem_bytes(epi, store_h, s) <= 227 * 1024:
            return s
    return 0


def available(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether these kernels may run: Gluon's Hopper API, not turned off
    (FUSEDMLP_GLUON_WIDE=0, FUSEDMLP_GLUON=0), an sm_90 CUDA device, fp16/bf16 operands."""
    if envvars.get(ENV, "1") == "0" or envvars.get(_gluon.ENV, "1") == "0":
        return False
    return _device_ok(device, dtype)


@functools.lru_cache(maxsize=16)
def _device_ok(device: torch.device, dtype: torch.dtype) -> bool:
    return _gluon.device_ok(types.SimpleNamespace(dtype=dtype), device)[0]


def _desc(t: torch.Tensor, block):
    gdt = gl.float16 if t.dtype == torch.float16 else gl.bfloat16
    return TensorDescriptor(Addr(t), list(t.shape), list(t.stride()), block,
                            gl.NVMMASharedLayout.get_default_for(block, gdt))


def launch_ws(epi: int, act_id: int, a, b, e0, e1, o0, o1, h, n_stages: int | None = None,
              group: int = GROUP_M, regs: int = CONSUMER_REGS, block_k: int = BLOCK_K) -> None:
    """One launch: a [M, K] @ b [K, N] with the epilogue ``epi`` over e0 (e1) into o0 (o1)
    and h (None: not stored); every tensor 2-D with unit column stride and 16-byte aligned
    rows and base (the caller checks: wide._tma_ok), K > 0."""
    launch.bind_context(a.device)
    M, K = a.shape
    N = b.shape[1]
    store_h = h is not None
    tile = [BLOCK_M, BLOCK_N]
    ds = (_desc(a, [BLOCK_M, block_k]), _desc(b, [block_k, BLOCK_N]), _desc(e0, tile),
          _desc(e1 if e1 is not None else e0, tile), _desc(o0, tile),
          _desc(o1 if o1 is not None else o0, tile), _desc(h if store_h else o0, tile))
    tiles = -(-M // BLOCK_M) * -(-N // BLOCK_N)
    progs = _programs(a.device)
    launch._through_triton("the Gluon wide GEMM", lambda: _ws_gemm_kernel[(min(progs, tiles),)](
        *ds, M, N, K, EPI=epi, ACT=act_id, STORE_H=store_h,
        STAGES=n_stages or stages(epi, store_h), GROUP=group, C_REGS=regs,
        L_REGS=LOADER_REGS, num_warps=4, maxnreg=MAXNREG))
