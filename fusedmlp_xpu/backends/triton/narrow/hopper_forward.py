"""The narrow inference forward for Hopper (sm_90) GPUs, written in Gluon, Triton's
lower-level dialect (layouts, shared memory, TMA and warpgroup MMAs spelled out).

Why a second forward: the Triton kernel (forward_kernels.py) issues a layer's MMAs and then waits
for all of them, so within one program a row block's epilogue (bias, activation,
convert) never overlaps tensor-core work; only other programs on the SM fill that gap,
and shared memory caps them. Here each program runs two row blocks through the layers
in turn with asynchronous MMAs: while block a's layer-l MMA runs, block b's layer-(l-1)
result goes through its epilogue, and the other way round (``warpgroup_mma_wait(1)``).
x comes in by TMA through a ring of STAGES pairs of tiles, y leaves by TMA from two
staging tiles, and every layer's weights stay in shared memory for the whole program.
TMA pads the tiles past x's rows and in/out columns with zeros and clips the stores, so
there are no masks and no padded copies.

Deep nets whose weights leave room for one program per SM run 128-row blocks on 8 warps:
two warpgroups, each with its own pair of row blocks, sharing one copy of the weights.

What it takes (``eligible``): fp16/bf16, hidden width a power of two from 64 (MIN_HIDDEN;
the kernel runs from 16) to 128, in and out widths multiples of 8 (16-byte TMA row
strides), the weights in shared memory fitting one program, and Triton's Gluon API for
Hopper. The host side (``Plan``) keeps the weight descriptors per parameter address and
launches the compiled kernel directly after the first call (launch.py). It stores no
pre-activations: a train step's forward takes it only where the backward computes them
again from x (the one-kernel backward); forwards that save them keep forward_kernels.py.

Measured on the H200 (benchmarks/NOTES.md, narrow history 32), 2^22 rows: narrow-w64
0.316-0.351 ms against the Triton kernel's 0.372-0.401, narrow-w128 0.809-0.864 against
0.934-0.968; narrow-w32 0.294 against 0.282, hence MIN_HIDDEN."""
from __future__ import annotations

import torch

from .. import launch
from ..common import narrow_act_ids, pow2
# the shared Gluon floor; ENV (0: every forward on forward_kernels.py), Addr and device_ok
# are read through this module by its callers and tests
from ..gluon import ENV, IMPORT_ERROR, Addr, device_ok, gluon, kept_descriptor  # noqa: F401
from ..launch import int_key
SMEM_BYTES = 227 * 1024  # per program at most, sm_90
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED = 1024  # per program, by the driver
# Narrower hidden layers keep the Triton kernel: narrow-w32 (64 -> 32 x 4 -> 64) read
# 0.294 ms here against its 0.282 at 2^22 rows (fp16, H200; NOTES.md history 32)
MIN_HIDDEN = 64
# TMA coordinates are 32-bit: the last pair's second block starts below 2^31
MAX_ROWS = 2 ** 31 - 512

if gluon is not None:  # without Gluon every forward takes forward_kernels.py
    from ..act import act
    from ..gluon import (fence_async_shared, gl, mbarrier, tma, warpgroup_mma,
                         warpgroup_mma_wait)
    from ..gluon import thread_barrier as _thread_barrier  # noqa: F401 (the backward's)
    from ..gluon import tma_load as _tma_load
    from ..gluon import tma_store as _tma_store

    @gluon.jit
    def _epilogue(acc, b_ptr, N, ACT: gl.constexpr, HAS_BIAS: gl.constexpr):
        """act(acc + b) in fp32, acc in its MMA layout; b (N values) read per call (from
        L1: one vector a layer and block)."""
        if HAS_BIAS:
            cols = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
            b = gl.load(b_ptr + cols, mask=cols < N, other=0.0)
            acc = acc + b.to(gl.float32)[None, :]
        return act(acc, ACT)

    @gluon.jit
    def _mma(h, w_smem, zero):
        """h @ w^T, issued and not waited for (w [N, K] in shared memory)."""
        return warpgroup_mma(h, w_smem.permute((1, 0)), zero, use_acc=False, is_async=True)

    @gluon.jit
    def _next(acc, h, b_ptr, N, w_smem, zero, op: gl.constexpr, ACT: gl.constexpr,
              HAS_BIAS: gl.constexpr):
        """Wait until this block's MMA is done (the other block's may still run), its
        epilogue into the next layer's operand layout, then the next layer's MMA issued:
        (that MMA, its operand, which must stay live until it is waited for)."""
        acc, h = warpgroup_mma_wait(1, deps=(acc, h))
        h = gl.convert_layout(_epilogue(acc, b_ptr, N, ACT, HAS_BIAS).to(h.dtype), op)
        return _mma(h, w_smem, zero), h

    @gluon.jit
    def _store(y_desc, y_smem, row, acc, bl_ptr, OUT, OUT_ACT: gl.constexpr,
               HAS_BIAS: gl.constexpr):
        """The last layer's epilogue into a staging tile, then a TMA store; first waits
        until at most one store is in flight (the one from the other staging tile)."""
        y = _epilogue(acc, bl_ptr, OUT, OUT_ACT, HAS_BIAS).to(y_desc.dtype)
        tma.store_wait(pendings=1)
        y_smem.store(y)
        fence_async_shared()
        _tma_store(y_desc, [row, 0], y_smem)

    @gluon.jit
    def _load_weights(w0_desc, wh_desc, wl_desc, bar, w0_s, wh_s, wl_s, L_HID: gl.constexpr):
        """Every weight into shared memory by TMA, all on ``bar``: w0, the L_HID hidden
        ones (back to back in wh_desc's tensor), wl."""
        mbarrier.expect(bar, w0_desc.block_type.nbytes + L_HID * wh_desc.block_type.nbytes
                        + wl_desc.block_type.nbytes)
        _tma_load(w0_desc, [0, 0], bar, w0_s)
        for j in gl.static_range(L_HID):
            _tma_load(wh_desc, [j * wh_desc.block_type.shape[0], 0], bar, wh_s.index(j))
        _tma_load(wl_desc, [0, 0], bar, wl_s)

    @gluon.jit
    def _load_pair(x_desc, bar, x_smem, s, q, BM: gl.constexpr, ok):
        """Row blocks 2q and 2q + 1 into stage s (both on the stage's one barrier)."""
        mbarrier.expect(bar.index(s), 2 * x_desc.block_type.nbytes, pred=ok)
        _tma_load(x_desc, [2 * q * BM, 0], bar.index(s),
                                        x_smem.index(2 * s), pred=ok)
        _tma_load(x_desc, [(2 * q + 1) * BM, 0], bar.index(s),
                                        x_smem.index(2 * s + 1), pred=ok)

    @gluon.jit
    def _fwd_kernel(x_desc, w0_desc, wh_desc, wl_desc, y_desc, b0_ptr, bh_ptr, bl_ptr,
                    M, H, OUT,
                    L_HID: gl.constexpr, ACT: gl.constexpr, OUT_ACT: gl.constexpr,
                    HAS_BIAS: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
        BM: gl.constexpr = x_desc.block_type.shape[0]
        IN_P: gl.constexpr = x_desc.block_type.shape[1]
        H_P: gl.constexpr = w0_desc.block_type.shape[0]
        OUT_P: gl.constexpr = y_desc.block_type.shape[1]
        dt: gl.constexpr = x_desc.dtype
        # the MMA layouts of the hidden and the last layers (their N differ), and the
        # register layouts their A operands take
        mma_h: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, H_P, 16])
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, OUT_P, 16])
        op_h: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_h, k_width=2)
        op_o: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)

        w0_smem = gl.allocate_shared_memory(dt, [H_P, IN_P], w0_desc.layout)
        wh_smem = gl.allocate_shared_memory(dt, [max(L_HID, 1), H_P, H_P], wh_desc.layout)
        wl_smem = gl.allocate_shared_memory(dt, [OUT_P, H_P], wl_desc.layout)
        x_smem = gl.allocate_shared_memory(dt, [2 * STAGES, BM, IN_P], x_desc.layout)
        y_smem = gl.allocate_shared_memory(dt, [2, BM, OUT_P], y_desc.layout)
        wbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        xbar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(wbar, count=1)
        for j in gl.static_range(STAGES):
            mbarrier.init(xbar.index(j), count=1)

        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        n_pairs = gl.cdiv(gl.cdiv(M, BM), 2)
        n_my = gl.cdiv(n_pairs - pid, n_prog)  # this program's pairs: pid, pid + n_prog..

        _load_weights(w0_desc, wh_desc, wl_desc, wbar, w0_smem, wh_smem, wl_smem, L_HID)
        for j in gl.static_range(STAGES):
            _load_pair(x_desc, xbar, x_smem, j, pid + j * n_prog, BM, j < n_my)
        mbarrier.wait(wbar, 0)

        zero_h = gl.zeros([BM, H_P], gl.float32, mma_h)
        zero_o = gl.zeros([BM, OUT_P], gl.float32, mma_o)
        for i in range(n_my):
            s = i % STAGES
            q = pid + i * n_prog
            mbarrier.wait(xbar.index(s), (i // STAGES) & 1)
            ha = x_smem.index(2 * s).load(op_h)
            hb = x_smem.index(2 * s + 1).load(op_h)
            _thread_barrier()  # every warp has read the stage before TMA refills it
            _load_pair(x_desc, xbar, x_smem, s, q + STAGES * n_prog, BM, i + STAGES < n_my)

            aa = _mma(ha, w0_smem, zero_h)
            ab = _mma(hb, w0_smem, zero_h)
            # block a's layer j is done (b's may still run): its epilogue, then its next
            # MMA; then the same for b
            for j in gl.static_range(L_HID):
                if j == 0:
                    bp = b0_ptr
                else:
                    bp = bh_ptr + (j - 1) * H
                aa, ha = _next(aa, ha, bp, H, wh_smem.index(j), zero_h, op_h, ACT, HAS_BIAS)
                ab, hb = _next(ab, hb, bp, H, wh_smem.index(j), zero_h, op_h, ACT, HAS_BIAS)
            if L_HID == 0:
                bp = b0_ptr
            else:
                bp = bh_ptr + (L_HID - 1) * H
            oa, ga = _next(aa, ha, bp, H, wl_smem, zero_o, op_o, ACT, HAS_BIAS)
            ob, gb = _next(ab, hb, bp, H, wl_smem, zero_o, op_o, ACT, HAS_BIAS)
            oa, ga = warpgroup_mma_wait(1, deps=(oa, ga))
            _store(y_desc, y_smem.index(0), 2 * q * BM, oa, bl_ptr, OUT, OUT_ACT, HAS_BIAS)
            ob, gb = warpgroup_mma_wait(0, deps=(ob, gb))
            _store(y_desc, y_smem.index(1), (2 * q + 1) * BM, ob, bl_ptr, OUT, OUT_ACT,
                   HAS_BIAS)
        tma.store_wait(pendings=0)
        mbarrier.invalidate(wbar)
        for j in gl.static_range(STAGES):
            mbarrier.invalidate(xbar.index(j))

    # direct launches go through launch.py's counter (launch.stats(), which the bench
    # records); the key is Plan's own: its descriptors are not args_key material
    _LAUNCHER = launch.Launcher(_fwd_kernel)


def _pads(spec) -> tuple[int, int, int]:
    return pow2(spec.in_features), spec.widths[1], pow2(spec.out_features)


def smem_bytes(spec, block_m: int, stages: int) -> int:
    """Shared memory of one program: the weights, STAGES pairs of x tiles, two y tiles."""
    IN_P, H_P, OUT_P = _pads(spec)
    el = spec.dtype.itemsize
    L_HID = spec.n_layers - 2
    return el * (H_P * IN_P + max(L_HID, 1) * H_P * H_P + OUT_P * H_P
                 + 2 * stages * block_m * IN_P + 2 * block_m * OUT_P) + 64


def tuning(spec) -> tuple[int, int, int, int] | None:
    """(rows per block, x stages, programs per SM, warps), or None when one program's
    weights and tiles do not fit shared memory. 64-row blocks, one warpgroup; as many
    programs per SM as fit, up to three, then the stages that still fit (at most two).
    Where only one fits and hidden is at most 64 (deep nets), 128-row blocks on 8 warps:
    two warpgroups, each its own pair of 64-row chains, sharing one copy of the weights.
    Swept on the H200 (NOTES.md, narrow history 32): narrow-w64 1 stage / 3 per SM 0.321
    ms, 3 / 2 0.338-0.357, 2 / 2 0.358, 128 rows on 4 warps 0.370; at 2^20 rows 0.082 ms
    against 8 warps' 0.085. paper-table1's net (11 hidden layers) at 2^20 rows: 0.195 ms
    at 64 rows / 2 stages / 4 warps, 0.178 at 128 rows / 1 stage / 8 warps, 0.192-0.196
    at 256 rows / 16 warps (spilling). Hidden 128 keeps 4 warps (8 not timed there)."""
    for per_sm in (3, 2, 1):
        for stages in (2, 1):
            need = smem_bytes(spec, 64, stages)
            if need <= SMEM_BYTES and per_sm * (need + SMEM_RESERVED) <= SMEM_PER_SM:
                if per_sm == 1 and spec.widths[1] <= 64 \
                        and smem_bytes(spec, 128, 1) <= SMEM_BYTES:
                    return 128, 1, 1, 8
                return 64, stages, per_sm, 4
    return None


def eligible(spec, device: torch.device) -> tuple[bool, str]:
    """Whether the no-grad narrow forward of ``spec`` on ``device`` runs this kernel, and
    why not (shown by explain())."""
    ok, why = device_ok(spec, device)
    if not ok:
        return ok, why
    H = spec.widths[1]
    if H < 16 or H & (H - 1) or H > 128:
        return False, f"hidden width {H} is no power of two in 16..128"
    if spec.in_features % 8 or spec.out_features % 8:
        return False, "in/out widths not multiples of 8 (TMA rows need 16-byte strides)"
    if H < MIN_HIDDEN:
        return False, f"hidden width {H} < {MIN_HIDDEN} (the Triton kernel measured faster)"
    if tuning(spec) is None:
        return False, "the weights do not fit one program's shared memory"
    return True, ""


def tma_rows(t: torch.Tensor) -> bool:
    """Whether TMA can read the 2-D ``t`` row by row: unit column stride, a row stride of
    whole 16-byte units and at least one row (not a broadcast: TMA takes no zero or
    overlapping strides), a 16-byte aligned address."""
    s0, s1 = t.stride()
    return (s1 == 1 and not (s0 * t.element_size()) % 16 and s0 >= t.shape[1]
            and not t.data_ptr() % 16)


#: activation descriptors a plan keeps (row_desc)
ROW_DESCS = 16


def row_desc(cache: dict, t: torch.Tensor, block, layout):
    """The TMA descriptor of the 2-D ``t`` (x, grad_y, or an output the caller made;
    dtype and columns fixed per plan), kept in ``cache`` per (address, rows, row stride):
    PyTorch's caching allocator hands the same blocks back call after call, so a training
    loop mostly finds its descriptors made (one costs ~3-10 us of host time). Kept without
    the tensor (Addr): a descriptor holds nothing alive; at most ROW_DESCS."""
    key = (t.data_ptr(), t.shape[0], t.stride(0))
    d = cache.get(key)
    if d is None:
        if len(cache) >= ROW_DESCS:
            cache.clear()
        d = cache[key] = kept_descriptor(t, list(t.shape), list(t.stride()), block, layout)
    return d


def weight_descs(cache: dict, weights, IN: int, H: int, OUT: int, L_HID: int, blocks,
                 layouts) -> tuple:
    """TMA descriptors of (w0, the hidden weights back to back, wl), kept in ``cache`` per
    address (at most 8 sets)."""
    w0, wh, wl = weights
    key = (w0.data_ptr(), wh.data_ptr(), wl.data_ptr())
    d = cache.get(key)
    if d is None:
        if len(cache) >= 8:
            cache.clear()
        # wh: the hidden weights back to back from its address (_stacked may hand over
        # the first one only); w0 stands in for it without hidden layers
        shapes = ([H, IN], [L_HID * H, H] if L_HID else [H, IN], [OUT, H])
        d = cache[key] = tuple(
            kept_descriptor(w, shape, [shape[1], 1], b, lay)
            for w, shape, b, lay in zip(weights, shapes, blocks, layouts))
    return d


class Plan:
    """The Gluon forward of one (spec, device): ``accepts(x)``, then ``(x, weights,
    biases) -> y``. TMA descriptors are kept per address (row_desc, weight_descs)."""

    def __init__(self, spec, device: torch.device):
        self.spec, self.device = spec, device
        self.IN, self.H, self.OUT = spec.in_features, spec.widths[1], spec.out_features
        self.L_HID = spec.n_layers - 2
        self.block_m, self.stages, self.per_sm, self.warps = tuning(spec)
        IN_P, H_P, OUT_P = _pads(spec)
        gdt = gl.float16 if spec.dtype == torch.float16 else gl.bfloat16
        lay = gl.NVMMASharedLayout.get_default_for
        bm = self.block_m
        self.x_block, self.y_block = [bm, IN_P], [bm, OUT_P]
        self.x_layout, self.y_layout = lay([bm, IN_P], gdt), lay([bm, OUT_P], gdt)
        self.w_blocks = ([H_P, IN_P], [H_P, H_P], [OUT_P, H_P])
        self.w_layouts = tuple(lay(b, gdt) for b in self.w_blocks)
        # the activations of forward_kernels.py's kernels (same results, same tolerances)
        act, out_act = narrow_act_ids(spec, "cuda")
        self.consts = dict(L_HID=self.L_HID, ACT=act, OUT_ACT=out_act, HAS_BIAS=spec.bias,
                           STAGES=self.stages)
        self.max_programs = self.per_sm * torch.cuda.get_device_properties(
            device).multi_processor_count
        self.lean = launch.enabled(device)
        self._wdesc: dict = {}
        self._xdesc: dict = {}  # row_desc's
        self._ydesc: dict = {}
        self._kernels: dict = {}  # int_key(M) -> launch.py entry

    @staticmethod
    def accepts(x: torch.Tensor) -> bool:
        return tma_rows(x) and 0 < x.shape[0] <= MAX_ROWS

    def __call__(self, x, weights, biases, y):
        """y = the MLP of x, written into ``y`` ([M, OUT], contiguous, 16-byte aligned).
        ``weights`` (w0, the hidden weights back to back, wl) and ``biases`` (b0, the
        hidden ones back to back, bl; or None): tensors or Addr, dense, 16-byte aligned
        (the caller's _NarrowForward checks)."""
        launch.bind_context(self.device)
        M = x.shape[0]
        xd = row_desc(self._xdesc, x, self.x_block, self.x_layout)
        yd = row_desc(self._ydesc, y, self.y_block, self.y_layout)
        w0d, whd, wld = weight_descs(self._wdesc, weights, self.IN, self.H, self.OUT,
                                     self.L_HID, self.w_blocks, self.w_layouts)
        b0, bh, bl = biases if biases is not None else (x, x, x)
        n_pairs = (M + 2 * self.block_m - 1) // (2 * self.block_m)
        grid = (min(n_pairs, self.max_programs),)
        args = (xd, w0d, whd, wld, yd, b0, bh, bl, M, self.H, self.OUT)
        key = int_key(M)
        entry = self._kernels.get(key) if self.lean else None
        if entry is not None and launch.direct_ok(self.device.index):
            _LAUNCHER.launch_entry(entry, grid, args, self.device.index)
            return y
        ck = launch._through_triton("the Gluon narrow forward", lambda: _fwd_kernel[grid](
            *args, **self.consts, num_warps=self.warps))
        if self.lean:
            e = launch._entry(ck, launch._constexpr_names(_fwd_kernel),
                              dict(self.consts, num_warps=self.warps))
            if e is not None:
                self._kernels[key] = e
        return y

