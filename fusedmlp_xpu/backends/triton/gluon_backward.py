"""The narrow train step's backward for Hopper (sm_90) GPUs, written in Gluon: one
kernel that computes every row block's forward again from x, walks the input gradient
back through the layers and sums every weight gradient over its row blocks, as the Triton
one-kernel backward (narrow.py, ``_mlp_bwd_resident_kernel`` with RECOMPUTE) does.

What differs from that kernel, and why it can be faster:
- the pre-activations are not held in registers across the chain: each layer's
  activation (the weight gradient's other operand) goes to shared memory as it is
  computed, and the derivative is read back from it (relu, leaky relu, identity) or from
  the pre-activation kept beside it (every other activation). The Triton kernel held
  them all in registers beside the weight-gradient sums and spilled (255 registers);
- the weight-gradient MMAs are asynchronous: layer l's ``g^T h`` runs on the tensor
  cores while the chain's epilogue for layer l - 1 (the derivative, the convert, the
  store of g) runs on the other units (``warpgroup_mma_wait(1)``);
- x comes in by TMA through a ring of stages, grad_y through one tile refilled as soon
  as it is read, grad_x leaves by TMA; the tails are zero-filled and clipped, no masks.

Layout of the work: 8 warps, 128-row blocks; in the forward and the chain each
warpgroup runs its own 64 rows, and each weight gradient (hidden width 64 as its M, the
row block as its K) is split between the two warpgroups by columns, so each thread
holds half of every layer's sum. Every weight stays in shared memory.

What it takes (``eligible``): fp16/bf16, hidden width 64, in and out widths multiples of
8 up to 64, 0..4 hidden-to-hidden weights, no biases, a forward that saved nothing (the
default where the one-kernel backward applies). The sums go out as the Triton kernel's
per-program partials, and the same reduction kernel writes the gradients."""
from __future__ import annotations

import torch

from ... import envvars
from . import _pow2, launch
from .gluon_narrow import MAX_ROWS, SMEM_BYTES, gluon
from .launch import int_key

#: set to 0 to keep every narrow backward on the Triton kernels (FUSEDMLP_GLUON=0 turns
#: off this kernel and the Gluon forward)
ENV = "FUSEDMLP_GLUON_BACKWARD"
#: the largest hidden-to-hidden weight count (as the one-kernel backward's)
MAX_HIDDEN_WEIGHTS = 4
BLOCK_M = 128
WARPS = 8
# activations whose derivative is a function of act(z) (relu, leaky relu, identity):
# no pre-activation is kept for them
_FROM_H = (0, 1, 2)

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from .act import act, act_grad
    from .gluon_narrow import _thread_barrier, _tma_load, _tma_store

    @gluon.jit
    def _keep(acc, hs, zs, l: gl.constexpr, ACT: gl.constexpr, Z_SMEM: gl.constexpr):
        """Layer l's forward epilogue: h = act(z) into hs[l] (and z into zs[l] where the
        derivative needs it); h back, in the accumulator's layout."""
        h = act(acc, ACT).to(hs.dtype)
        hs.index(l).store(h)
        if Z_SMEM:
            zs.index(l).store(acc.to(zs.dtype))
        return h

    @gluon.jit
    def _dact(g, hs, zs, l: gl.constexpr, ACT: gl.constexpr, Z_SMEM: gl.constexpr):
        """g * act'(z) of hidden layer l, from what _keep stored."""
        if Z_SMEM:
            z = zs.index(l).load(g.type.layout).to(gl.float32)
            g = g * act_grad(z, ACT)
        elif ACT == 1:
            h = hs.index(l).load(g.type.layout)
            g = gl.where(h > 0, g, 0.0)
        elif ACT == 2:
            h = hs.index(l).load(g.type.layout)
            g = gl.where(h > 0, g, 0.01 * g)
        return g

    @gluon.jit
    def _store_sum(slot, d, T_P: gl.constexpr, TRANS: gl.constexpr):
        """A weight gradient's partial sum into its [T_P, T_P] slot, row-major [out, in]
        (TRANS: d is [in, out])."""
        r = gl.arange(0, d.shape[0], layout=gl.SliceLayout(1, d.type.layout))
        c = gl.arange(0, d.shape[1], layout=gl.SliceLayout(0, d.type.layout))
        if TRANS:
            gl.store(slot + c[None, :] * T_P + r[:, None], d)
        else:
            gl.store(slot + r[:, None] * T_P + c[None, :], d)

    @gluon.jit
    def _hidden_sum(l: gl.constexpr, g_s, hs, d1, d2, d3, d4):
        """d_{l+1} += g^T h_l, issued and not waited for; all four back."""
        gt = g_s.permute((1, 0))
        if l == 0:
            d1 = warpgroup_mma(gt, hs.index(l), d1, is_async=True)
        elif l == 1:
            d2 = warpgroup_mma(gt, hs.index(l), d2, is_async=True)
        elif l == 2:
            d3 = warpgroup_mma(gt, hs.index(l), d3, is_async=True)
        else:
            d4 = warpgroup_mma(gt, hs.index(l), d4, is_async=True)
        return d1, d2, d3, d4

    @gluon.jit
    def _wait_sums(d0, d1, d2, d3, d4, dl, dx, L_HID: gl.constexpr):
        """Wait for every MMA in flight; the sums (those that exist) and dx back."""
        if L_HID == 0:
            d0, dl, dx = warpgroup_mma_wait(0, deps=(d0, dl, dx))
        elif L_HID == 1:
            d0, d1, dl, dx = warpgroup_mma_wait(0, deps=(d0, d1, dl, dx))
        elif L_HID == 2:
            d0, d1, d2, dl, dx = warpgroup_mma_wait(0, deps=(d0, d1, d2, dl, dx))
        elif L_HID == 3:
            d0, d1, d2, d3, dl, dx = warpgroup_mma_wait(0, deps=(d0, d1, d2, d3, dl, dx))
        else:
            d0, d1, d2, d3, d4, dl, dx = warpgroup_mma_wait(
                0, deps=(d0, d1, d2, d3, d4, dl, dx))
        return d0, d1, d2, d3, d4, dl, dx

    @gluon.jit
    def _bwd_kernel(x_desc, gy_desc, gx_desc, w0_desc, wh_desc, wl_desc, acc_ptr, M,
                    h_layout: gl.constexpr, L_HID: gl.constexpr, ACT: gl.constexpr,
                    OUT_ACT: gl.constexpr, NEED_X: gl.constexpr, NEED_W: gl.constexpr,
                    X_STAGES: gl.constexpr, T_P: gl.constexpr, SLOT: gl.constexpr,
                    num_warps: gl.constexpr):
        BM: gl.constexpr = x_desc.block_type.shape[0]
        IN_P: gl.constexpr = x_desc.block_type.shape[1]
        H_P: gl.constexpr = w0_desc.block_type.shape[0]
        OUT_P: gl.constexpr = gy_desc.block_type.shape[1]
        WG: gl.constexpr = num_warps // 4
        Z_SMEM: gl.constexpr = ACT != 0 and ACT != 1 and ACT != 2
        dt: gl.constexpr = x_desc.dtype
        # the chain's accumulators: [BM, N], each warpgroup 64 rows
        mma_h: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, H_P, 16])
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, OUT_P, 16])
        mma_i: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, IN_P, 16])
        op_h: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_h, k_width=2)
        op_o: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        op_i: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_i, k_width=2)
        # the weight-gradient sums: [H_P, N], the warpgroups split N
        sum_i: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, IN_P // WG, 16])
        sum_h: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, H_P // WG, 16])
        sum_o: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, WG], instr_shape=[16, OUT_P // WG, 16])

        w0_s = gl.allocate_shared_memory(dt, [H_P, IN_P], w0_desc.layout)
        wh_s = gl.allocate_shared_memory(dt, [max(L_HID, 1), H_P, H_P], wh_desc.layout)
        wl_s = gl.allocate_shared_memory(dt, [OUT_P, H_P], wl_desc.layout)
        x_s = gl.allocate_shared_memory(dt, [X_STAGES, BM, IN_P], x_desc.layout)
        gy_s = gl.allocate_shared_memory(dt, [BM, OUT_P], gy_desc.layout)
        hs = gl.allocate_shared_memory(dt, [L_HID + 1, BM, H_P], h_layout)
        zs = gl.allocate_shared_memory(dt, [L_HID + 1 if Z_SMEM else 1, BM, H_P], h_layout)
        go_s = gl.allocate_shared_memory(dt, [BM, OUT_P], gy_desc.layout)
        gh_s = gl.allocate_shared_memory(dt, [2, BM, H_P], h_layout)
        gx_s = gl.allocate_shared_memory(dt, [BM, IN_P], gx_desc.layout)
        wbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        gbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        xbar = gl.allocate_shared_memory(gl.int64, [X_STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(wbar, count=1)
        mbarrier.init(gbar, count=1)
        for j in gl.static_range(X_STAGES):
            mbarrier.init(xbar.index(j), count=1)

        pid = gl.program_id(0)
        n_prog = gl.num_programs(0)
        n_my = gl.cdiv(gl.cdiv(M, BM) - pid, n_prog)  # row blocks pid, pid + n_prog, ..

        mbarrier.expect(wbar, w0_desc.block_type.nbytes + L_HID * wh_desc.block_type.nbytes
                        + wl_desc.block_type.nbytes)
        _tma_load(w0_desc, [0, 0], wbar, w0_s)
        for j in gl.static_range(L_HID):
            _tma_load(wh_desc, [j * H_P, 0], wbar, wh_s.index(j))
        _tma_load(wl_desc, [0, 0], wbar, wl_s)
        for j in gl.static_range(X_STAGES):
            mbarrier.expect(xbar.index(j), x_desc.block_type.nbytes, pred=j < n_my)
            _tma_load(x_desc, [(pid + j * n_prog) * BM, 0], xbar.index(j), x_s.index(j),
                      pred=j < n_my)
        mbarrier.expect(gbar, gy_desc.block_type.nbytes, pred=n_my > 0)
        _tma_load(gy_desc, [pid * BM, 0], gbar, gy_s, pred=n_my > 0)
        mbarrier.wait(wbar, 0)

        zero_h = gl.zeros([BM, H_P], gl.float32, mma_h)
        zero_o = gl.zeros([BM, OUT_P], gl.float32, mma_o)
        dx = gl.zeros([BM, IN_P], gl.float32, mma_i)
        d0 = gl.zeros([H_P, IN_P], gl.float32, sum_i)
        d1 = gl.zeros([H_P, H_P], gl.float32, sum_h)
        d2 = gl.zeros([H_P, H_P], gl.float32, sum_h)
        d3 = gl.zeros([H_P, H_P], gl.float32, sum_h)
        d4 = gl.zeros([H_P, H_P], gl.float32, sum_h)
        dl = gl.zeros([H_P, OUT_P], gl.float32, sum_o)  # the last layer's, transposed
        for i in range(n_my):
            s = i % X_STAGES
            row = (pid + i * n_prog) * BM
            mbarrier.wait(xbar.index(s), (i // X_STAGES) & 1)
            # the forward again: every layer's activation kept in shared memory
            acc = warpgroup_mma(x_s.index(s), w0_s.permute((1, 0)), zero_h, use_acc=False)
            h = _keep(acc, hs, zs, 0, ACT, Z_SMEM)
            for j in gl.static_range(L_HID):
                acc = warpgroup_mma(gl.convert_layout(h, op_h), wh_s.index(j).permute((1, 0)),
                                    zero_h, use_acc=False)
                h = _keep(acc, hs, zs, j + 1, ACT, Z_SMEM)
            dgo = zero_o
            if OUT_ACT != 0:
                zo = warpgroup_mma(gl.convert_layout(h, op_o), wl_s.permute((1, 0)), zero_o,
                                   use_acc=False)
                dgo = act_grad(zo, OUT_ACT)
            fence_async_shared()  # the stored activations, before MMAs read them

            # the last layer: g = grad_y (* out_act'), then grad_y's tile refilled
            mbarrier.wait(gbar, i & 1)
            g = gy_s.load(mma_o).to(gl.float32)
            _thread_barrier()
            mbarrier.expect(gbar, gy_desc.block_type.nbytes, pred=i + 1 < n_my)
            _tma_load(gy_desc, [row + n_prog * BM, 0], gbar, gy_s, pred=i + 1 < n_my)
            if OUT_ACT != 0:
                g = g * dgo
            gd = g.to(dt)
            if NEED_W:
                go_s.store(gd)
                fence_async_shared()
            gop = gl.convert_layout(gd, op_h)
            # the chain's MMA first, then the sum's: waiting for all but one in flight
            # then means the chain's is done
            acc = warpgroup_mma(gop, wl_s, zero_h, use_acc=False, is_async=True)
            if NEED_W:
                dl = warpgroup_mma(hs.index(L_HID).permute((1, 0)), go_s, dl, is_async=True)
            acc, gop = warpgroup_mma_wait(1, deps=(acc, gop))
            g = _dact(acc, hs, zs, L_HID, ACT, Z_SMEM)
            for j in gl.static_range(L_HID):
                # hidden weight L_HID - 1 - j maps h_{L_HID-1-j} to z_{L_HID-j}
                gd = g.to(dt)
                if NEED_W:
                    gh_s.index(j % 2).store(gd)
                    fence_async_shared()
                gop = gl.convert_layout(gd, op_h)
                acc = warpgroup_mma(gop, wh_s.index(L_HID - 1 - j), zero_h, use_acc=False, is_async=True)
                if NEED_W:
                    d1, d2, d3, d4 = _hidden_sum(L_HID - 1 - j, gh_s.index(j % 2), hs, d1, d2, d3, d4)
                acc, gop = warpgroup_mma_wait(1, deps=(acc, gop))
                g = _dact(acc, hs, zs, L_HID - 1 - j, ACT, Z_SMEM)
            gd = g.to(dt)
            if NEED_W:
                gh_s.index(L_HID % 2).store(gd)
                fence_async_shared()
            if NEED_X:
                gop = gl.convert_layout(gd, op_i)
                dx = warpgroup_mma(gop, w0_s, dx, use_acc=False, is_async=True)
            if NEED_W:
                d0 = warpgroup_mma(gh_s.index(L_HID % 2).permute((1, 0)), x_s.index(s), d0,
                                   is_async=True)
            d0, d1, d2, d3, d4, dl, dx = _wait_sums(d0, d1, d2, d3, d4, dl, dx, L_HID)
            # x's stage is read by every MMA: refill it
            _thread_barrier()
            nxt = i + X_STAGES < n_my
            mbarrier.expect(xbar.index(s), x_desc.block_type.nbytes, pred=nxt)
            _tma_load(x_desc, [row + X_STAGES * n_prog * BM, 0], xbar.index(s), x_s.index(s),
                      pred=nxt)
            if NEED_X:
                tma.store_wait(pendings=0)
                gx_s.store(dx.to(dt))
                fence_async_shared()
                _tma_store(gx_desc, [row, 0], gx_s)
        tma.store_wait(pendings=0)
        mbarrier.invalidate(wbar)
        mbarrier.invalidate(gbar)
        for j in gl.static_range(X_STAGES):
            mbarrier.invalidate(xbar.index(j))
        if NEED_W:
            base = acc_ptr + pid.to(gl.int64) * (L_HID + 2) * SLOT
            _store_sum(base, d0, T_P, False)
            if L_HID > 0:
                _store_sum(base + SLOT, d1, T_P, False)
            if L_HID > 1:
                _store_sum(base + 2 * SLOT, d2, T_P, False)
            if L_HID > 2:
                _store_sum(base + 3 * SLOT, d3, T_P, False)
            if L_HID > 3:
                _store_sum(base + 4 * SLOT, d4, T_P, False)
            _store_sum(base + (L_HID + 1) * SLOT, dl, T_P, True)

    _LAUNCHER = launch.Launcher(_bwd_kernel)


def _pads(spec) -> tuple[int, int, int]:
    return _pow2(spec.in_features), _pow2(spec.widths[1]), _pow2(spec.out_features)


def _keeps_z(spec) -> bool:
    return spec.activation_id not in _FROM_H


def smem_bytes(spec, x_stages: int) -> int:
    """Shared memory of one program: the weights, x's stages, grad_y's tile, every hidden
    layer's activation (and pre-activation where kept), g's tiles, grad_x's tile."""
    IN_P, H_P, OUT_P = _pads(spec)
    L_HID = spec.n_layers - 2
    tiles = (L_HID + 1) * (2 if _keeps_z(spec) else 1) + 2  # h (z), g's two tiles
    return spec.dtype.itemsize * (
        H_P * IN_P + max(L_HID, 1) * H_P * H_P + OUT_P * H_P
        + BLOCK_M * (x_stages * IN_P + 2 * OUT_P + tiles * H_P + IN_P)) + 64


def tuning(spec) -> int | None:
    """x's stages (two where they fit, else one), or None where one stage does not fit."""
    for stages in (2, 1):
        if smem_bytes(spec, stages) <= SMEM_BYTES:
            return stages
    return None


def eligible(spec, device: torch.device) -> tuple[bool, str]:
    """Whether the recomputing backward of ``spec`` on ``device`` runs this kernel, and why
    not (shown by explain())."""
    from . import gluon_narrow

    ok, why = gluon_narrow.device_ok(spec, device)
    if not ok:
        return ok, why
    if envvars.get(ENV, "1") == "0":
        return False, f"{ENV}=0"
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    if H != 64:
        return False, f"hidden width {H} (64 only: the sums' MMAs take it as their M)"
    if IN % 8 or OUT % 8 or IN > 64 or OUT > 64:
        return False, "in/out widths not multiples of 8 up to 64"
    if spec.n_layers - 2 > MAX_HIDDEN_WEIGHTS:
        return False, f"more than {MAX_HIDDEN_WEIGHTS} hidden-to-hidden weights"
    if spec.bias:
        return False, "biases (their gradients are not in this kernel)"
    if tuning(spec) is None:
        return False, "the weights and tiles do not fit one program's shared memory"
    return True, ""


class Plan:
    """The Gluon backward of one (spec, device, needs): ``accepts(x, grad_y)``, then
    ``(grad_y, x, weights) -> (grad_x or None, weight gradients, [])``."""

    def __init__(self, spec, device: torch.device, need_x: bool, need_w: bool):
        from . import _launch_meta, _reduce_layout  # the Triton backward's reduction
        from .gluon_narrow import weight_descs

        if device.index is None:  # launches name the device by its index
            device = torch.device(device.type, torch.cuda.current_device())
        self.spec, self.device = spec, device
        self.need_x, self.need_w = need_x, need_w
        self.IN, self.H, self.OUT = spec.in_features, spec.widths[1], spec.out_features
        self.L_HID = spec.n_layers - 2
        IN_P, H_P, OUT_P = _pads(spec)
        gdt = gl.float16 if spec.dtype == torch.float16 else gl.bfloat16
        lay = gl.NVMMASharedLayout.get_default_for
        self.x_block, self.y_block = [BLOCK_M, IN_P], [BLOCK_M, OUT_P]
        self.x_layout, self.y_layout = lay(self.x_block, gdt), lay(self.y_block, gdt)
        self.w_blocks = ([H_P, IN_P], [H_P, H_P], [OUT_P, H_P])
        self.w_layouts = tuple(lay(b, gdt) for b in self.w_blocks)
        self.weight_descs = weight_descs
        T_P = _launch_meta(spec, "cuda")["H_P"]  # the reduction's slots
        self.SLOT = T_P * T_P + T_P
        self.reduce = _reduce_layout(spec, T_P, T_P * T_P, self.SLOT, need_w, False, "cuda")
        self.consts = dict(h_layout=lay([BLOCK_M, H_P], gdt), L_HID=self.L_HID,
                           ACT=spec.activation_id, OUT_ACT=spec.output_activation_id,
                           NEED_X=need_x, NEED_W=need_w, X_STAGES=tuning(spec), T_P=T_P,
                           SLOT=self.SLOT)
        self.max_programs = torch.cuda.get_device_properties(device).multi_processor_count
        self.lean = launch.enabled(device)
        self._wdesc: dict = {}
        self._kernels: dict = {}  # int_key(M) -> launch.py entry

    @staticmethod
    def accepts(x: torch.Tensor, grad_y: torch.Tensor) -> bool:
        for t in (x, grad_y):
            s0, s1 = t.stride()
            if s1 != 1 or (s0 * t.element_size()) % 16 or t.data_ptr() % 16:
                return False
        return 0 < x.shape[0] <= MAX_ROWS

    def __call__(self, grad_y, x, weights, gx, out):
        """Writes grad_x into ``gx`` ([M, IN], contiguous, 16-byte aligned; ignored unless
        need_x) and the reduction's buffer ``out`` (unless not need_w); weights: w0, the
        hidden weights back to back, wl (16-byte aligned, dense)."""
        from . import _reduce_launch

        M = x.shape[0]
        P = min(self.max_programs, (M + BLOCK_M - 1) // BLOCK_M)
        acc = torch.empty(P, self.spec.n_layers, self.SLOT, device=x.device,
                          dtype=torch.float32)
        xd = TensorDescriptor(x, list(x.shape), list(x.stride()), self.x_block, self.x_layout)
        gyd = TensorDescriptor(grad_y, list(grad_y.shape), list(grad_y.stride()), self.y_block,
                               self.y_layout)
        gxd = TensorDescriptor(gx, [M, self.IN], [self.IN, 1], self.x_block, self.x_layout)
        w0d, whd, wld = self.weight_descs(self._wdesc, weights, self.IN, self.H, self.OUT,
                                          self.L_HID, self.w_blocks, self.w_layouts)
        args = (xd, gyd, gxd, w0d, whd, wld, acc, M)
        key = int_key(M)
        entry = self._kernels.get(key) if self.lean else None
        if entry is not None and launch.direct_ok(self.device.index):
            _LAUNCHER.launch_entry(entry, (P,), args, self.device.index)
        else:
            ck = _bwd_kernel[(P,)](*args, **self.consts, num_warps=WARPS)
            if self.lean:
                e = launch._entry(ck, launch._constexpr_names(_bwd_kernel),
                                  dict(self.consts, num_warps=WARPS))
                if e is not None:
                    self._kernels[key] = e
        if self.need_w:
            _reduce_launch(acc, out, self.reduce, self.IN, self.H, self.OUT, self.L_HID,
                           self.device)
