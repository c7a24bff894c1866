"""The gated MLP's (SwiGLU, GEGLU) wide path: h = act(x Wg^T + bg) * (x Wu^T + bu) as one
GEMM pass (two accumulators, or one GEMM over the interleaved weights by TMA on Hopper),
the down projection as a linear layer, and the backward's dh GEMM with dg and du in its
epilogue (by column chunks that also store h for the down weight's gradient)."""
from __future__ import annotations

import functools

from .... import activations
from ... import device_guard as _guard
from ... import memory
from .. import launch
from ..launch import int_key
from . import configs
from .configs import (_MAX_ELEMENTS, _bucket, _check_size, _grid, _meta, _meta_for, _tma_config,
                      act_id)
from .layers import (_Direct, _bias_grad, _col_chunks, _warp_specialized, grad_input, grad_weight,
                     linear)
from .tma import _gated_bwd_tma, _gated_tma, _tma_ok


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
        self._direct = _Direct(configs._kernel("gated_fwd", device), device)

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
            configs._kernel("gated_bwd", g.device).launch(
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
