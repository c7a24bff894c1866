"""The narrow backward's host side: which backward runs (the Gluon kernel on sm_90,
the one kernel, the split or the fused kernels of backward_kernels.py), its launches,
and the one-kernel backward's plan with its direct launches."""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .... import envvars
from ... import device_guard, memory
from .. import launch
from ..common import cdiv
from ..launch import int_key
from . import launchers, reduce, tuning
from .launchers import NUM_STAGES, _fits, _launch_meta
from .operands import _ALIGN, _aligned, _dense, _gluon_operands, _stacked
from .reduce import _reduce_flat, _reduce_grads, _reduce_launch
from .tuning import (GLUON_MIN_ROWS, Split, _chain_pads, _dw_pads, _narrow,
                     _one_kernel, _one_kernel_pads, _tuning)


def backward(grad_y, x, weights, biases, saved, spec, needs, forward):
    """The narrow backward -> (grad_x or None, weight gradients, bias gradients), as
    Backend.backward. ``forward``: the backend's forward (x, weights, biases, spec, save),
    run when the pre-activations were not saved and a kernel needs them.

    Fused: one persistent kernel walks the rows back through every layer and adds its
    weight/bias partials into an fp32 scratch. Split (``tuning._split_backward``): that
    kernel only stores every layer's g (no weight-gradient work in it), then
    _mlp_dw_kernel sums g^T act(z) per program in registers into the same scratch layout
    (costs a [M, S] g buffer beside z). One kernel (``Split.g_dw``, weights resident):
    the chain sums those itself, with no g buffer. Either way one reduction follows. On
    sm_90, nothing saved, from GLUON_MIN_ROWS rows (at any row count for nets the one
    kernel does not take): the Gluon backward (hopper_backward.py) where it takes the
    net."""
    need_x, need_w, need_b = needs
    weights, biases = _dense(weights), _dense(biases)
    M = x.shape[0]
    split = tuning._split_backward(x.device, spec) if M > 0 else None
    # below GLUON_MIN_ROWS the one kernel where it takes the net, else Gluon at any count
    if saved is None and M > 0 and (M >= GLUON_MIN_ROWS or not _one_kernel(split, spec)):
        plan = _gluon_backward_plan(spec, x.device, need_x, need_w, need_b)
        out = None if plan is None else _gluon_backward(plan, grad_y, x, weights, biases)
        if out is not None:
            return out
    need_wb = need_w or need_b
    # nothing saved (recompute): the one kernel also when only x needs a gradient
    if _one_kernel(split, spec) and (need_wb or saved is None):  # one kernel, if it fits
        out = _backward_plan(spec, x.device, split, needs, saved is None)(
            grad_y, x, weights, biases, saved)
        if out is not None:
            return out
        if saved is None:  # refused at every stage count: save, then as if saved
            _, saved = forward(x, weights, biases, spec, True)
            return backward(grad_y, x, weights, biases, saved, spec, needs, forward)
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    wh = _stacked(weights[1:-1]) if spec.n_layers > 2 else None
    meta = _launch_meta(spec, x.device.type)
    L_HID = spec.n_layers - 2
    x_only = not need_wb
    if x_only and not (split is not None and split.g_unroll):
        split = None  # x's gradient alone: the fused kernel
    # x's gradient alone with an unrolled chain: the chain, storing no g, and no weight-
    # gradient kernel (the sdf net at 2^20 rows, fp16, H200: the forward and x's gradient
    # 1.44 ms against 1.51 with the fused kernel; h200-so-parts-20261203{,b}.json)
    if saved is None:  # recompute: the forward once more, saving
        _, saved = forward(x, weights, biases, spec, True)
    z = saved if saved.stride(-1) == 1 else saved.contiguous()
    grad_y = grad_y if grad_y.stride(-1) == 1 else grad_y.contiguous()
    T_P = meta["H_P"]  # every tile is padded to this one width
    gx = memory.new_empty(M, IN, like=x) if need_x else x
    # per program and layer: the padded weight tile's partial sum, then the bias's
    W_SLOT, SLOT = T_P * T_P, T_P * T_P + T_P
    store_g = split is not None and not x_only  # then a weight or bias gradient is wanted
    g_width = (L_HID + 1) * H + (OUT if spec.output_activation != "none" else 0)
    # the split stores g for a chunk of rows at a time (tuning.g_chunk_rows), so that the
    # g buffer beside the saved z stays small
    chunk = tuning.g_chunk_rows(M, g_width * x.element_size()) if store_g else M
    g_buf = memory.new_empty(chunk, g_width, like=x) if store_g else None
    if chunk >= M:  # every row at once (the usual case: no slices on this path)
        acc = _chain_and_dw(grad_y, x, weights, wh, z, gx, g_buf, spec, meta, split, needs,
                            x_only, W_SLOT, SLOT)
        gws, gbs = (_reduce_grads(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, x)
                    if need_wb else ([], []))
        return (gx if need_x else None), gws, gbs
    # chunk by chunk: its chain, weight-gradient kernel and reduction, the sums added in fp32
    total = None
    for r0 in range(0, M, chunk):
        rows = slice(r0, r0 + chunk)
        acc = _chain_and_dw(grad_y[rows], x[rows], weights, wh, z[rows], gx[rows], g_buf,
                            spec, meta, split, needs, x_only, W_SLOT, SLOT)
        layout, part = _reduce_flat(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, acc)
        total = part if total is None else total.add_(part)
    gws, gbs = layout.views(total.to(x.dtype))
    return (gx if need_x else None), gws, gbs


def _chain_and_dw(grad_y, x, weights, wh, z, gx, g_buf, spec, meta, split, needs, x_only,
                  W_SLOT, SLOT):
    """The fused kernel, or the split's input-gradient chain (storing g into ``g_buf``
    unless x's gradient is all that is wanted) and its weight-gradient kernel, over the
    rows of ``x`` -> the per-program partial sums [P, layers, SLOT] (``grad_y`` as a
    placeholder when no weight or bias gradient is wanted)."""
    need_x, need_w, need_b = needs
    need_wb = need_w or need_b
    M = x.shape[0]
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    L_HID = spec.n_layers - 2
    block_m, warps, stages = _tuning(x.device, spec, "bwd" if split is None else "g")
    if split is not None:  # the input-gradient chain's rows and warps are the split's
        block_m, warps = split.g_block_m, split.g_warps
    n_blocks = cdiv(M, block_m)
    if split is not None and split.g_per_sm == 0:
        P = n_blocks
    else:
        P = launchers._n_programs(x.device, n_blocks,
                                  split.g_per_sm if split is not None else 1)
    g = acc = grad_y  # placeholders for pointers a launch does not use
    if split is not None and not x_only:
        g = g_buf[:M]
    elif need_wb:  # every program adds into its slot: zeros first
        acc = torch.zeros(P, spec.n_layers, SLOT, device=x.device, dtype=torch.float32)
    if M > 0:
        ptrs = (grad_y, x, weights[0], wh if wh is not None else weights[0], weights[-1],
                z, gx)
        strides = (grad_y.stride(0), x.stride(0), x.stride(1), z.stride(0), g.stride(0))
        resident = split is not None and split.g_resident and L_HID <= 4
        with device_guard(x):
            if not (split is not None and split.g_unroll and _fits(
                    "g", x.device, spec, (P,), (*ptrs, g, M, IN, H, OUT, n_blocks, *strides),
                    dict(meta, **_chain_pads(spec, resident), L_HID=L_HID,
                         NEED_X=need_x, BLOCK_M=block_m, STAGES=split.g_stages,
                         RESIDENT=resident, STORE_G=not x_only), warps)):
                # the fused kernel adds [T_P, T_P] partials into the scratch: T_P tiles
                launchers._launcher("bwd").launch(
                    (P,), (*ptrs, acc, g, M, IN, H, OUT, L_HID, n_blocks, *strides),
                    dict(meta, **({} if split is None else _chain_pads(spec, False)),
                         W_SLOT=W_SLOT, SLOT=SLOT, NEED_X=need_x,
                         NEED_W=need_w and split is None, NEED_B=need_b and split is None,
                         STORE_G=split is not None and not x_only, BLOCK_M=block_m),
                    x.device, num_warps=warps, num_stages=stages)
            if split is not None and not x_only:
                acc = _split_weight_grads(grad_y, x, z, g, spec, meta, split, need_b,
                                          W_SLOT, SLOT)
    return acc


@functools.lru_cache(maxsize=512)
def _backward_plan(spec, device: torch.device, split: Split, needs: tuple,
                   recompute: bool) -> "_OneKernelBackward":
    return _OneKernelBackward(spec, device, split, needs, recompute)


class _OneKernelBackward:
    """The backward as ONE kernel (``Split.g_dw``) for one (spec, device, split, needs,
    recompute), worked out once: the resident chain also sums the weight gradients
    (_mlp_bwd_resident_kernel) into per-program partials [P, layers, SLOT] (every program
    writes all its slots: no zero-fill), then one reduction writes every gradient.
    ``recompute``: nothing was saved; the kernel computes the pre-activations again from x.

    As _NarrowForward: on CUDA, once both launches have compiled, a later call whose
    arguments specialize alike (x's rows and strides, the pointers' alignment: the rest
    is fixed by the spec) launches the two kept kernels directly: on a train step's
    backward that host work is most of the cost at small row counts."""

    def __init__(self, spec, device: torch.device, split: Split, needs: tuple,
                 recompute: bool):
        self.spec, self.device, self.split, self.recompute = spec, device, split, recompute
        self.need_x, self.need_w, self.need_b = needs
        self.IN, self.H, self.OUT = spec.in_features, spec.widths[1], spec.out_features
        self.L_HID = L_HID = spec.n_layers - 2
        meta = _launch_meta(spec, device.type)
        T_P = meta["H_P"]  # the scratch's slots: a weight tile, then a bias
        W_SLOT, SLOT = T_P * T_P, T_P * T_P + T_P
        self.SLOT = SLOT
        self.mode = "bwd_recompute" if recompute else "bwd_resident"
        self.consts = dict(
            _one_kernel_pads(spec), L_HID=L_HID, T_P=T_P, W_SLOT=W_SLOT, SLOT=SLOT,
            ACT=meta["ACT"], OUT_ACT=meta["OUT_ACT"], NEED_X=self.need_x,
            NEED_W=self.need_w, NEED_B=self.need_b, F32=meta["F32"], PREC=meta["PREC"],
            BLOCK_M=split.g_block_m, STAGES=split.g_stages, RECOMPUTE=recompute,
            HAS_BIAS=recompute and spec.bias,
            BIAS_PER_BLOCK=recompute and spec.bias and tuning._bwd_bias_per_block(spec))
        self.grads = self.need_w or self.need_b
        self.reduce = reduce._reduce_layout(spec, T_P, W_SLOT, SLOT, self.need_w,
                                            self.need_b, device.type)
        self.lean = launch.enabled(device)
        # a register cap only where the GPU compiler takes one (not in the interpreter)
        self.options = ({"maxnreg": split.g_maxnreg}
                        if split.g_maxnreg and device.type == "cuda" else {})
        self._entries: dict = {}  # key bits -> (chain entry, reduction entry)
        if self.lean:
            self._max_programs = launchers._n_programs(device, 1 << 62, max(1, split.g_per_sm))

    def __call__(self, grad_y, x, weights, biases, z):
        """-> (gx or None, weight gradients, bias gradients), or None where the device
        refuses the kernel at every stage count (the caller then runs two kernels)."""
        M, split = x.shape[0], self.split
        z = x if z is None else z if z.stride(-1) == 1 else z.contiguous()
        grad_y = grad_y if grad_y.stride(-1) == 1 else grad_y.contiguous()
        wh = _stacked(weights[1:-1]) if self.L_HID else weights[0]
        b0 = bh = bl = x
        if self.recompute and biases is not None:
            b0, bl = biases[0], biases[-1]
            bh = _stacked(biases[1:-1]) if self.L_HID else x
        gx = memory.new_empty(M, self.IN, like=x) if self.need_x else x
        n_blocks = cdiv(M, split.g_block_m)
        if split.g_per_sm == 0:  # one program per row block
            P = n_blocks
        else:
            P = (min(n_blocks, self._max_programs) if self.lean
                 else launchers._n_programs(self.device, n_blocks, split.g_per_sm))
        acc = torch.empty(P, self.spec.n_layers, self.SLOT, device=x.device,
                          dtype=torch.float32)
        ptrs = (grad_y, x, weights[0], wh, weights[-1], z, gx, acc, b0, bh, bl)
        xs0, xs1 = x.stride()
        args = (*ptrs, M, self.IN, self.H, self.OUT, n_blocks, grad_y.stride(0), xs0, xs1,
                z.stride(0))
        out = memory.new_empty(self.reduce.numel, like=x) if self.grads else None
        key = None
        if self.lean:
            aligned = not (grad_y.data_ptr() | x.data_ptr() | weights[0].data_ptr()
                           | wh.data_ptr() | weights[-1].data_ptr() | z.data_ptr()
                           | gx.data_ptr() | b0.data_ptr() | bh.data_ptr() | bl.data_ptr()
                           | (0 if out is None else out.data_ptr())) & _ALIGN
            # acc is fp32 from the allocator: always aligned; every other int is the spec's
            key = (int_key(M) | int_key(xs0) << 3 | int_key(xs1) << 6
                   | int_key(z.stride(0)) << 9 | int_key(n_blocks) << 12
                   | int_key(P) << 15) if aligned else None
            hit = None if key is None else self._entries.get(key)
            if hit is not None and launch.direct_ok(self.device.index):
                launchers._launcher(self.mode).launch_entry(hit[0], (P,), args, self.device.index)
                if out is not None:
                    launchers._launcher("reduce").launch_entry(
                        hit[1], self.reduce.grid, (acc, out, P, self.IN, self.H, self.OUT,
                                                   self.L_HID), self.device.index)
                return self._grads(gx, out)
        with device_guard(x):
            # recomputing, never at 1 stage: 64 rows / 4 warps / 1 stage, two programs per
            # SM (hidden 32, no biases) read out of bounds on the H200 (NOTES narrow
            # history 23)
            if not _fits(self.mode, self.device, self.spec, (P,), args, self.consts,
                         split.g_warps, 2 if self.recompute else 1, **self.options):
                return None
            if out is not None:
                _reduce_launch(acc, out, self.reduce, self.IN, self.H, self.OUT,
                               self.L_HID, self.device)
        if key is not None and not launch._hooked():
            self._keep(key, args, acc, out)
        return self._grads(gx, out)

    def _keep(self, key, args, acc, out):
        """The two launches just made, kept for direct launches of this specialization."""
        most = self.consts["STAGES"]
        fit = launchers._FIT.get((self.mode, self.device.index, self.spec), most)
        chain = launchers._launcher(self.mode).cached(
            args, self.consts if fit == most else dict(self.consts, STAGES=fit),
            self.device, num_warps=self.split.g_warps, num_stages=NUM_STAGES, **self.options)
        red = None
        if out is not None:
            red = launchers._launcher("reduce").cached(
                (acc, out, acc.shape[0], self.IN, self.H, self.OUT, self.L_HID),
                self.reduce.consts, self.device, num_warps=4, num_stages=1)
        if chain is not None and (out is None or red is not None):
            self._entries[key] = (chain, red)

    def _grads(self, gx, out):
        gws, gbs = self.reduce.views(out) if out is not None else ([], [])
        return (gx if self.need_x else None), gws, gbs


def gluon_takes(spec, device: torch.device) -> bool:
    """Whether spec's recomputing backward runs the Gluon kernel on ``device`` (sm_90): the
    backend then has the forward save nothing (TritonBackend.recomputes), also for nets
    the one-kernel Triton backward does not take (hidden 64 with silu, sigmoid, tanh or
    softplus: tuning._curved; gelu's still save: tuning.GLUON_SAVES). A train
    step of the sdf net (32 -> 64 x 4 -> 16, biases, fp16, 2^20 rows, H200) took 1.35 ms
    recomputing against 1.72 saving z with softplus, 1.33 against 2.35 with tanh, 1.05
    against 1.57 with sigmoid (h200-narrow-recompute-fp16-20261204b.json)."""
    if device.type != "cuda":
        return False
    from . import hopper_backward, hopper_forward

    env = (envvars.get(hopper_forward.ENV), envvars.get(hopper_backward.ENV),
           envvars.get("TRITON_INTERPRET"))
    return _gluon_eligible(spec, device, env)


@functools.lru_cache(maxsize=256)
def _gluon_eligible(spec, device: torch.device, env: tuple) -> bool:
    """hopper_backward.eligible, kept per (spec, device) and the switches it reads (env):
    the train hot path asks it on every call."""
    from . import hopper_backward

    return _narrow(spec) and hopper_backward.eligible(spec, device)[0]


@functools.lru_cache(maxsize=256)
def _gluon_backward_plan(spec, device: torch.device, need_x: bool, need_w: bool,
                         need_b: bool = False):
    """hopper_backward's Plan for spec's recomputing backward on device, or None."""
    from . import hopper_backward

    ok, _ = hopper_backward.eligible(spec, device) if _narrow(spec) else (False, "")
    if not ok:
        return None
    return hopper_backward.Plan(hopper_backward.tma_out(spec), device, need_x, need_w, need_b)


def _gluon_backward(plan, grad_y, x, weights, biases=None):
    """(grad_x or None, weight gradients, bias gradients) from the Gluon backward, or
    None where it cannot read an operand by TMA (strides or addresses not 16-byte
    aligned): the caller takes the Triton kernels. An out width the plan pads
    (hopper_backward.tma_out): grad_y, the last weight and bias padded with zeros here
    (at 2^20 rows and out 3, fp16: 22 MB written), the padding's gradients dropped."""
    pad = plan.OUT - grad_y.shape[1]
    if pad:
        grad_y = F.pad(grad_y, (0, pad))
        weights = [*weights[:-1], F.pad(weights[-1], (0, 0, 0, pad))]
        if biases is not None:
            biases = [*biases[:-1], F.pad(biases[-1], (0, pad))]
    else:
        grad_y = plan.rows(grad_y)
    if not plan.accepts(x, grad_y):
        return None
    ws = _gluon_operands(weights, plan.L_HID)
    bs = _gluon_operands(biases, plan.L_HID)
    if not _aligned(ws, bs):
        return None
    M = x.shape[0]
    gx = memory.new_empty(M, plan.IN, like=x) if plan.need_x else x
    out = (memory.new_empty(plan.reduce.numel, like=x) if plan.need_w or plan.need_b
           else None)
    if (gx.data_ptr() | (0 if out is None else out.data_ptr())) & _ALIGN:
        return None  # never from PyTorch's allocators; a test's wrapper
    with device_guard(x):
        plan(grad_y, x, ws, bs, gx, out)
    gws, gbs = plan.reduce.views(out) if out is not None else ([], [])
    if pad:
        if gws:
            gws[-1] = gws[-1][:-pad]
        if gbs:
            gbs[-1] = gbs[-1][:-pad]
    return (gx if plan.need_x else None), gws, gbs


def _split_weight_grads(grad_y, x, z, g, spec, meta, split, need_b, W_SLOT, SLOT):
    """The split backward's second kernel: per-program partial sums of every layer's
    weight (and bias) gradient, in the scratch layout _reduce_grads reads. Each program
    writes its whole slot, so the scratch needs no zero-fill."""
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    M, L_HID, T_P = x.shape[0], spec.n_layers - 2, meta["H_P"]
    bm, warps, stages = split.block_m, split.warps, split.stages
    nb = cdiv(M, bm)
    P = launchers._n_programs(x.device, nb)
    acc = torch.empty(P, spec.n_layers, SLOT, device=x.device, dtype=torch.float32)
    launchers._launcher("dw").launch(
        (P, spec.n_layers), (
            grad_y, x, z, g, acc, M, IN, H, OUT, L_HID, nb,
            grad_y.stride(0), x.stride(0), x.stride(1), z.stride(0), g.stride(0),
        ),
        dict(_dw_pads(spec, T_P), T_P=T_P, W_SLOT=W_SLOT, SLOT=SLOT, ACT=meta["ACT"],
             OUT_ACT=meta["OUT_ACT"], NEED_B=need_b, F32=meta["F32"], PREC=meta["PREC"],
             BLOCK_M=bm, STAGES=stages), x.device,
        num_warps=warps, num_stages=NUM_STAGES)
    return acc
