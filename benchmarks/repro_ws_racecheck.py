"""Repro: compute-sanitizer racecheck on Gluon warp-specialized kernels far smaller than
the package's (gluon_backward.py; NOTES.md, narrow history 33), to tell hazards of
Triton's warp-specialization machinery from the package kernel's own: each partition
writes its program id to global memory; with --smem the default partition also hands
a shared-memory tile (and an mbarrier set up before the fork) to the worker, which
copies it out.

    compute-sanitizer --tool racecheck python3 benchmarks/repro_ws_racecheck.py [--smem]
"""
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _default(out_ptr):
    gl.store(out_ptr + gl.program_id(0) * 2, gl.program_id(0))


@gluon.jit
def _worker(out_ptr):
    gl.store(out_ptr + gl.program_id(0) * 2 + 1, gl.program_id(0) + 1000)


@gluon.jit
def _kernel(out_ptr):
    gl.warp_specialize([(_default, (out_ptr,)), (_worker, (out_ptr,))], [4], [128])


@gluon.jit
def _give(out_ptr, t_smem, bar):
    lay: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, lay))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, lay))
    t_smem.store((r[:, None] * 32 + c[None, :] + gl.program_id(0)).to(gl.float32))
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _take(out_ptr, t_smem, bar):
    lay: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [4, 1], [1, 0])
    mbarrier.wait(bar, 0)
    r = gl.arange(0, 32, layout=gl.SliceLayout(1, lay))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, lay))
    gl.store(out_ptr + gl.program_id(0) * 1024 + r[:, None] * 32 + c[None, :],
             t_smem.load(lay))


@gluon.jit
def _smem_kernel(out_ptr):
    t_smem = gl.allocate_shared_memory(gl.float32, [32, 32],
                                       gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    gl.warp_specialize([(_give, (out_ptr, t_smem, bar)), (_take, (out_ptr, t_smem, bar))],
                       [4], [128])


if __name__ == "__main__" and "--smem" in sys.argv:
    out = torch.zeros(132, 1024, dtype=torch.float32, device="cuda")
    _smem_kernel[(132,)](out, num_warps=4, maxnreg=128)
    torch.cuda.synchronize()
    want = torch.arange(1024).float()[None, :] + torch.arange(132).float()[:, None]
    print("right" if torch.equal(out.cpu(), want) else "WRONG")
elif __name__ == "__main__":
    out = torch.zeros(2 * 132, dtype=torch.int32, device="cuda")
    _kernel[(132,)](out, num_warps=4, maxnreg=128)
    torch.cuda.synchronize()
    want = torch.stack([torch.arange(132), torch.arange(132) + 1000], 1).flatten()
    print("right" if torch.equal(out.cpu(), want.int()) else "WRONG")
