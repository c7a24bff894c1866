"""Experiment (not in the package; compiled for sm_90, not yet run on a GPU): the wide
backward's dx and gated dh GEMMs with both consumer warpgroups on ONE 256x128 tile and a
separate epilogue partition, the lead of benchmarks/NOTES.md (wide, "What limits it",
after item 17).

gluon_wide.py's ping-pong kernel gives each consumer warpgroup its own 128x128 tile, so
per FLOP it moves a third more operand bytes into shared memory than cuBLAS's 128x256
tiles, and its main loop runs at ~610-640 TFLOP/s against cuBLAS's ~670-690. Here:
- both consumers take the same 256x128 tile (rows 0-127 and 128-255), sharing its B
  tile: a 256x64 A and a 64x128 B tile per K step (0.0117 operand bytes a FLOP, as
  128x256), a 3-stage ring;
- after the main loop each consumer rounds its accumulator to the operands' dtype into a
  256x128 staging tile (as eager's mm output is rounded before the elementwise pass) and
  goes on to the next tile's main loop;
- the epilogue partition (2 warps) takes the staging tile in 8-row pieces with a
  row-major layout: z (or g and u) by plain coalesced loads from global memory, the
  outputs by coalesced stores, no shared memory for them; it hands the staging tile back
  when it has read it;
- one loader warp fills the ring by TMA.
Register split (12 warps, 168 at launch): consumers 184 / 184, the epilogue and loader
warpgroup 136 (sm_90 compile, Triton 3.6: no spills, 36 B with 3.9; at 104 with 16-row
pieces the epilogue spilled 1.8-7.6 KB). Shared memory 208 KB. ci/aot_wide.py compiles it.

    python benchmarks/probe_gluon_wide.py --variants gluon coop bare   (on an H200)
"""
from __future__ import annotations

import torch

from fusedmlp_xpu.backends.triton.gluon_narrow import Addr, gluon

BLOCK_M, BLOCK_N, BLOCK_K, STAGES = 256, 128, 64, 3
HALF = BLOCK_M // 2  # a consumer's rows
PIECE = 8  # rows of the staging tile the epilogue takes at a time (16 spilled 0.1-3 KB)
MAXNREG = 168
CONSUMER_REGS, EPILOGUE_REGS = 184, 136

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from fusedmlp_xpu.backends.triton.act import act, act_grad
    from fusedmlp_xpu.backends.triton.gluon_wide import _origin, _tiles, fill_ring

    @gluon.jit
    def _consumer(c: gl.constexpr, ops, GROUP: gl.constexpr):
        """Rows c * 128.. of every tile: the main loop (both consumers wait for each stage
        and both release it: empty counts 2), then the rounded accumulator into the
        staging tile once the epilogue has handed it back."""
        (a_desc, b_desc, a_s, b_s, st, ready, empty, st_ready, st_free, e0, e1, o0, o1, h,
         s_m, M, N, K) = ops
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        S: gl.constexpr = a_s.shape[0]
        H: gl.constexpr = BM // 2
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
        kt = gl.cdiv(K, BK)
        for i in range(_tiles(M, N, BM, BN)):
            acc = gl.zeros([H, BN], gl.float32, mma)
            for kk in range(kt):
                n = i * kt + kk
                s = n % S
                mbarrier.wait(ready.index(s), (n // S) & 1)
                acc = warpgroup_mma(a_s.index(s).slice(c * H, H, dim=0), b_s.index(s), acc,
                                    is_async=True)
                acc = warpgroup_mma_wait(1, deps=(acc,))
                mbarrier.arrive(empty.index((n + S - 1) % S), count=1, pred=kk > 0)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.arrive(empty.index((i * kt + kt - 1) % S), count=1)
            mbarrier.wait(st_free, (i & 1) ^ 1)
            st.slice(c * H, H, dim=0).store(acc.to(st.dtype))
            mbarrier.arrive(st_ready, count=1)

    @gluon.jit
    def _epilogue(ops, EPI: gl.constexpr, ACT: gl.constexpr, STORE_H: gl.constexpr,
                  GROUP: gl.constexpr, P: gl.constexpr):
        """Every tile's staging tile in PIECE-row pieces: its inputs by coalesced loads,
        its outputs by coalesced stores (rows past M and columns past N masked); the
        staging tile goes back once read."""
        (a_desc, b_desc, a_s, b_s, st, ready, empty, st_ready, st_free, e0, e1, o0, o1, h,
         s_m, M, N, K) = ops
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        blk: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [2, 1], [1, 0])
        rows0 = gl.arange(0, P, layout=gl.SliceLayout(1, blk))
        cols0 = gl.arange(0, BN, layout=gl.SliceLayout(0, blk))
        for i in range(_tiles(M, N, BM, BN)):
            off_m, off_n = _origin(i, M, N, BM, BN, GROUP)
            mbarrier.wait(st_ready, i & 1)
            cols = off_n + cols0
            for p in gl.static_range(BM // P):
                rows = off_m + p * P + rows0
                offs = rows.to(gl.int64)[:, None] * s_m + cols[None, :]
                mask = (rows < M)[:, None] & (cols < N)[None, :]
                acc = st.slice(p * P, P, dim=0).load(blk).to(gl.float32)
                if EPI == 1:
                    g = gl.load(e0 + offs, mask=mask, other=0.0).to(gl.float32)
                    u = gl.load(e1 + offs, mask=mask, other=0.0).to(gl.float32)
                    a = act(g, ACT)
                    gl.store(o0 + offs, (acc * u * act_grad(g, ACT)).to(o0.dtype.element_ty),
                             mask=mask)
                    gl.store(o1 + offs, (acc * a).to(o1.dtype.element_ty), mask=mask)
                    if STORE_H:
                        gl.store(h + offs, (a * u).to(h.dtype.element_ty), mask=mask)
                else:
                    z = gl.load(e0 + offs, mask=mask, other=0.0).to(gl.float32)
                    gl.store(o0 + offs, (acc * act_grad(z, ACT)).to(o0.dtype.element_ty),
                             mask=mask)
                    if STORE_H:
                        gl.store(h + offs, act(z, ACT).to(h.dtype.element_ty), mask=mask)
            mbarrier.arrive(st_free, count=1)

    @gluon.jit
    def _worker(role: gl.constexpr, ops, EPI: gl.constexpr, ACT: gl.constexpr,
                STORE_H: gl.constexpr, GROUP: gl.constexpr, P: gl.constexpr):
        if role == 1:
            _consumer(1, ops, GROUP)
        elif role == 2:
            _epilogue(ops, EPI, ACT, STORE_H, GROUP, P)
        else:
            (a_desc, b_desc, a_s, b_s, st, ready, empty, st_ready, st_free, e0, e1, o0, o1, h,
             s_m, M, N, K) = ops
            fill_ring(a_desc, b_desc, a_s, b_s, ready, empty, M, N, K, GROUP)

    @gluon.jit
    def _coop_kernel(a_desc, b_desc, e0, e1, o0, o1, h, s_m, M, N, K,
                     EPI: gl.constexpr, ACT: gl.constexpr, STORE_H: gl.constexpr,
                     STAGES_: gl.constexpr, GROUP: gl.constexpr, PIECE_: gl.constexpr,
                     C_REGS: gl.constexpr, E_REGS: gl.constexpr, num_warps: gl.constexpr):
        BM: gl.constexpr = a_desc.block_type.shape[0]
        BK: gl.constexpr = a_desc.block_type.shape[1]
        BN: gl.constexpr = b_desc.block_type.shape[1]
        dt: gl.constexpr = a_desc.dtype
        a_s = gl.allocate_shared_memory(dt, [STAGES_, BM, BK], a_desc.layout)
        b_s = gl.allocate_shared_memory(dt, [STAGES_, BK, BN], b_desc.layout)
        st = gl.allocate_shared_memory(dt, [BM, BN],
                                       gl.NVMMASharedLayout.get_default_for([BM, BN], dt))
        lay: gl.constexpr = mbarrier.MBarrierLayout()
        ready = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], lay)
        empty = gl.allocate_shared_memory(gl.int64, [STAGES_, 1], lay)
        st_ready = gl.allocate_shared_memory(gl.int64, [1], lay)
        st_free = gl.allocate_shared_memory(gl.int64, [1], lay)
        for j in gl.static_range(STAGES_):
            mbarrier.init(ready.index(j), count=1)
            mbarrier.init(empty.index(j), count=2)  # both consumers release a stage
        mbarrier.init(st_ready, count=2)  # both halves written
        mbarrier.init(st_free, count=1)
        ops = (a_desc, b_desc, a_s, b_s, st, ready, empty, st_ready, st_free, e0, e1, o0, o1,
               h, s_m, M, N, K)
        gl.warp_specialize([
            (_consumer, (0, ops, GROUP)),
            (_worker, (1, ops, EPI, ACT, STORE_H, GROUP, PIECE_)),
            (_worker, (2, ops, EPI, ACT, STORE_H, GROUP, PIECE_)),
            (_worker, (3, ops, EPI, ACT, STORE_H, GROUP, PIECE_))],
            [4, 2, 1], [C_REGS, E_REGS, E_REGS])


def _desc(t: torch.Tensor, block):
    gdt = gl.float16 if t.dtype == torch.float16 else gl.bfloat16
    return TensorDescriptor(Addr(t), list(t.shape), list(t.stride()), block,
                            gl.NVMMASharedLayout.get_default_for(block, gdt))


def launch_coop(epi: int, act_id: int, a, b, e0, e1, o0, o1, h, group: int = 8) -> None:
    """gluon_wide.launch_ws's contract, with e0, e1, o0, o1, h sharing one row stride
    (dense [M, N] tensors, or column views of equal [M, H] ones)."""
    M, K = a.shape
    N = b.shape[1]
    s_m = e0.stride(0)
    for t in (e1, o0, o1, h):
        assert t is None or (t.stride(0) == s_m and t.stride(1) == 1)
    tiles = -(-M // BLOCK_M) * -(-N // BLOCK_N)
    progs = torch.cuda.get_device_properties(a.device).multi_processor_count
    _coop_kernel[(min(progs, tiles),)](
        _desc(a, [BLOCK_M, BLOCK_K]), _desc(b, [BLOCK_K, BLOCK_N]), e0,
        e1 if e1 is not None else e0, o0, o1 if o1 is not None else o0,
        h if h is not None else o0, s_m, M, N, K, EPI=epi, ACT=act_id,
        STORE_H=h is not None, STAGES_=STAGES, GROUP=group, PIECE_=PIECE, C_REGS=CONSUMER_REGS,
        E_REGS=EPILOGUE_REGS, num_warps=4, maxnreg=MAXNREG)
