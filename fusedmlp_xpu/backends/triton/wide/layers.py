"""Wide layers of fused_mlp, layer by layer, any widths: the forward (one GEMM a layer,
bias and activation in the epilogue; cuBLAS where cublas.py routes it, the TMA kernels
for large M on Hopper), and the backward's input and weight gradients (the activation's
derivative and h = act(z) fused in the dx GEMM's epilogue, by column chunks).

``forward(x, weights, biases, spec, save)`` and ``backward(grad_y, x, weights, biases,
saved, spec, needs)`` mirror the Backend interface. Launches run on the current stream of
the tensors' device (Triton's launcher), under a device guard.
"""
from __future__ import annotations

import functools

import torch

from .... import activations
from ... import device_guard as _guard
from ... import memory, saved_widths
from .. import launch
from ..act import APPROX
from ..common import cdiv
from ..launch import TunedLauncher, int_key
from . import configs, cublas
from .configs import (_MAX_ELEMENTS, _bucket, _check_size, _grid, _meta, _meta_for, _tma_config,
                      act_id)
from .cublas import BLAS_FWD_MIN_ROWS, BLAS_LT_GELU_MAX_ROWS, _blas, _blas_forward_ok
from .tma import _dx_tma, _linear_tma, _tma_ok


def _warp_specialized(device: torch.device, dtype: torch.dtype):
    """hopper_gemm (the warp-specialized Gluon kernels of the dx and gated dh GEMMs) where
    they run: sm_90 CUDA devices, fp16/bf16, not turned off (FUSEDMLP_GLUON_WIDE=0,
    FUSEDMLP_GLUON=0); else None (the Triton TMA kernels of tma.py). The callers have
    checked the operands for TMA (_tma_ok). H200, bf16, M 8192 (two probe runs): the
    gated dh GEMM 1.64-1.83 ms against the Triton kernel's 1.99-2.01, dx 1.71-1.83
    against 1.88-1.89 (NOTES.md, wide history 17)."""
    if device.type != "cuda":
        return None
    from . import hopper_gemm  # Gluon: imported where it may run

    return hopper_gemm if hopper_gemm.available(device, dtype) else None


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
            self.kernel.launch_entry(entry, (cdiv(M, bm) * cdiv(N, bn),), args,
                                     self.device.index)
            return
        with _guard(args[0]):
            self.kernel.launch(_grid(M, N), args, consts, self.device)
        if key is not None:
            got = self.kernel.cached(args, consts, self.device)
            if got is not None:
                self.entries[key] = (got[0], got[1]["BLOCK_M"], got[1]["BLOCK_N"])


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
        self.blas_max_rows = (BLAS_LT_GELU_MAX_ROWS if act == "gelu_tanh"
                              and self.consts["ACT"] >= APPROX.value else float("inf"))
        self.lean = launch.enabled(device)
        self._direct = _Direct(configs._kernel("fwd", device), device)  # looked up once
        self._entries = self._direct.entries

    def __call__(self, x, w, b):
        M, N, K = x.shape[0], self.N, self.K
        if (self.blas_act is not None and BLAS_FWD_MIN_ROWS <= M <= self.blas_max_rows
                and _blas(x.device)):
            return cublas._blas_linear(x, w, b, self.blas_act), None
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
        self._direct = _Direct(configs._kernel("dx", device), device)

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
        configs._kernel("dw", g.device).launch(
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
