"""The narrow second-order backward's host side: one kernel (second_order_kernels.py)
over the rows, then the per-program partial sums of the weight and bias gradients added
up (Backend.second_order's contract: fusedmlp_xpu/second_order.py has the formula). The
benchmark's alternatives are tunings: the kernel's merged weight-gradient pass, and the
GEMM form (whole-batch GEMMs with pointwise kernels between them, ``Tuning.split``)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .... import activations, envvars
from ... import device_guard, memory
from ..common import cdiv, pow2
from . import launchers
from .operands import _dense, _stacked

#: activation ids with a non-zero second derivative (the registry's grad2)
CURVED = frozenset(a.id for a in activations.BY_ID.values() if a.grad2 is not None)


@dataclass(frozen=True)
class Tuning:
    """Rows per block, warps per program and programs per SM (a persistent grid: each
    program walks row blocks with its own scratch and fp32 partial sums)."""

    block_m: int
    warps: int = 4
    per_sm: int = 1
    #: the kernel's MERGE_DW: both weight-gradient terms of a layer added in one pass over
    #: its fp32 partial sums (the tangent's layer inputs kept in scratch until then)
    merge_dw: bool = False
    #: not the one kernel: the closed form as whole-batch GEMMs (cuBLAS through torch) with
    #: its elementwise steps fused in small kernels (``_second_order_gemms``)
    split: bool = False
    #: the GEMM form with each product and the elementwise step after it in one row-block
    #: kernel (_so_mm_kernel): the product's [M, width] never goes through memory
    fuse: bool = False

    def __str__(self) -> str:
        if self.fuse:
            return (f"row-block GEMMs with their pointwise steps, {self.block_m} rows x "
                    f"{self.warps} warps")
        if self.split:
            return "GEMMs + pointwise kernels"
        return (f"{self.block_m} rows x {self.warps} warps x {self.per_sm} per SM"
                + (", merged dW" if self.merge_dw else ""))

    @classmethod
    def parse(cls, text: str) -> "Tuning":
        """``ROWSxWARPSxPER_SM`` with a trailing ``m`` for merge_dw (``32x4x2m``), or
        ``split``, or ``fused`` (Tuning.fuse; ``fusedROWSxWARPS`` for its row blocks,
        ``fused64x8``): the benchmark's and FUSEDMLP_SECOND_ORDER_TUNING's spelling."""
        t = text.strip().lower()
        if t == "split":
            return SPLIT
        if t.startswith("fused"):
            try:
                bm, warps = ((int(n) for n in t.removeprefix("fused").split("x"))
                             if t != "fused" else (FUSED.block_m, FUSED.warps))
            except ValueError:
                bm = warps = 0
            if bm < 16 or bm & (bm - 1) or warps not in (1, 2, 4, 8, 16):
                raise ValueError(f"second-order tuning {text!r}: fusedROWSxWARPS with rows "
                                 "a power of two >= 16 and warps 1-16, a power of two")
            return cls(bm, warps, split=True, fuse=True)
        try:
            bm, warps, per_sm = (int(n) for n in t.removesuffix("m").split("x"))
        except ValueError:
            raise ValueError(f"second-order tuning: expected ROWSxWARPSxPER_SM[m] such as "
                             f"32x4x2 or 32x4x2m, split or fused; got {text!r}") from None
        if bm < 16 or bm & (bm - 1) or warps not in (1, 2, 4, 8, 16) or per_sm < 1:
            raise ValueError(f"second-order tuning {text!r}: rows a power of two >= 16, "
                             "warps 1-16 (a power of two), programs per SM >= 1")
        return cls(bm, warps, per_sm, t.endswith("m"))


#: the GEMM form (Tuning.split), and with its products fused to their pointwise steps
SPLIT = Tuning(0, split=True)
# 64 rows x 4 warps: the fastest of the row blocks the H200 timed (``tuning``)
FUSED = Tuning(64, 4, split=True, fuse=True)
#: the one kernel where a training step is bound by its host time: one launch where the
#: GEMM form makes ~20 (``tuning``)
SMALL = Tuning(16, 4, 2, True)
#: up to this many rows (CUDA, width <= 64, no CUDA graph being captured): SMALL
SMALL_ROWS = 2 ** 18


def tuning(device: torch.device, P: int, rows: int | None = None) -> Tuning:
    """The tuning at padded width P for ``rows`` rows (None: not known): on CUDA GPUs up to
    SMALL_ROWS rows at widths up to 64, outside a CUDA graph's capture, the one kernel at
    SMALL; else on GPUs the GEMM form with its products fused to their pointwise steps
    (FUSED); in the interpreter the one kernel (``kernel_tuning``).
    SMALL where the step waits on the host: the sdf-eikonal step from Python, fp16, H100,
    eager's ms over ours with the two interleaved (h100-steps-sdf-eikonal-so-*-20261205b),
    at 2^16 / 2^18 rows: FUSED 1.03x / 1.03x, SMALL 1.09x / 1.16x (another run of FUSED:
    0.94x / 1.01x, h100-steps-sdf-eikonal-20261205a). On the device alone SMALL is the
    slower (the same step in a CUDA graph: 1.04 / 3.38 ms against FUSED's 0.74 / 2.25):
    hence FUSED while a graph is captured, and above 2^18 rows (2^20: FUSED 1.62x eager
    from Python, the one kernel alone 6.89 ms a call against FUSED's 3.08 on the H200).
    The sdf net (32 -> 64 x 4 -> 16, softplus, biases), fp16, H200, ms a call
    (benchmarks/second_order.py, every tuning checked against float64 first), 2^18 / 2^20
    rows (h200-so-kernel-{262144,1048576}-20261204.json, -rows- for the row blocks; the
    one kernel and eager from h200-so-kernel-*-20261203.json):
      GEMM form, fused, 64 rows x 4 warps        - / 3.08  (128x4: 1.30 / 3.71, 32x4: 3.15,
                                                 64x8: 3.12, 128x8: 3.16)
      GEMM form, cuBLAS + pointwise kernels      1.52 / 4.03
      one kernel, 16 rows x 4 warps x 2 per SM, merged dW  1.79 / 6.89
      one kernel, 32 rows x 4 warps x 1 per SM   2.68 / 10.51
      eager torch's double backward (with its forward and first backward)  2.63 / 7.07
    The kernel's tiles are too small for the tensor cores to pay: every row block does
    ~14 dependent [rows, 64] x [64, 64] products. Width 128 is not timed (the kernel spills
    3.6 KB a thread there; the GEMM form does not care). Memory: the GEMM form keeps about
    seven [M, width] activations a layer alive at once (at 2^20 rows, width 64, fp16:
    ~0.9 GB a layer), four of them (z, a, u, d) from the input gradient's forward, which is
    its first pass (GemmForm), on; z is no copy where the forward saved it (read in place
    from that buffer, columns of its rows).
    FUSEDMLP_SECOND_ORDER_TUNING (``Tuning.parse``'s spelling) overrides it."""
    forced = envvars.get("FUSEDMLP_SECOND_ORDER_TUNING")
    if forced:
        try:
            return Tuning.parse(forced)
        except ValueError as e:
            raise ValueError(f"FUSEDMLP_SECOND_ORDER_TUNING: {e}") from None
    if device.type == "cpu":
        return kernel_tuning(device, P)
    if (device.type == "cuda" and rows is not None and rows <= SMALL_ROWS and P <= 64
            and not _capturing()):
        return SMALL
    return FUSED


def _capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream (never before CUDA is
    initialized: nothing to capture, and no question a CPU-only torch can answer)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def kernel_tuning(device: torch.device, P: int) -> Tuning:
    """The one kernel's tuning at padded width P: 16 rows in the interpreter; on GPUs 32
    rows x 8 warps up to width 64 (181 registers in the sm_90 compile at width 64,
    softplus: no spills; the timings in ``tuning``), 16 rows x 4 warps at width 128 (its
    weight tiles alone fill the registers: 3.6 KB of spills a thread at 16 rows, 13 KB at
    64; not timed)."""
    if device.type == "cpu":
        return Tuning(16)
    return Tuning(16) if P > 64 else Tuning(32, 8)


def padded_width(spec) -> int:
    """The one padded width of every tile (launchers._launch_meta)."""
    return pow2(max(spec.widths))


def second_order(gg, v, x, weights, biases, spec, needs, tune: Tuning | None = None):
    """(grad v, grad x, grad weights, grad biases) of the loss whose gradient at
    g = (dy/dx)^T v is ``gg``; ``needs`` = (v, x, weights, biases). x, v, gg: [M, .].
    ``tune``: the launch's tuning (default ``tuning``; the benchmark sweeps others)."""
    need_v, need_x, need_w, need_b = needs
    need_b = need_b and biases is not None
    weights, biases = _dense(weights), _dense(biases)
    M = x.shape[0]
    IN, H, OUT = spec.in_features, spec.widths[1], spec.out_features
    L_HID = spec.n_layers - 2
    P = padded_width(spec)
    hid2 = spec.activation_id in CURVED
    out2 = spec.output_activation_id in CURVED
    second = hid2 or out2
    tune = tune or tuning(x.device, P, M)
    if tune.split:
        return _second_order_gemms(gg, v, x, weights, biases, spec, needs, tune)
    bm = tune.block_m
    progs = launchers._n_programs(x.device, cdiv(M, bm), tune.per_sm) if M else 1
    dt = x.dtype
    scratch = progs * ((L_HID + 1) * bm * P + bm * P)
    z = torch.empty(scratch, device=x.device, dtype=dt)
    u = torch.empty_like(z)
    zb = torch.empty_like(z) if hid2 else z
    ts = torch.empty_like(z) if tune.merge_dw and second and need_w else z
    per_prog = P * P * (L_HID + 2) + P * (L_HID + 2)
    acc = torch.zeros(progs, per_prog, device=x.device, dtype=torch.float32)
    gx = memory.new_empty(M, IN, like=x) if need_x and second else None
    gv = memory.new_empty(M, OUT, like=x) if need_v else None
    x, v, gg = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, v, gg))
    wh = _stacked(weights[1:-1]) if L_HID else weights[0]
    b0 = bh = bl = x  # placeholders where there are no biases
    if biases is not None:
        b0, bl = biases[0], biases[-1]
        bh = _stacked(biases[1:-1]) if L_HID else b0
    meta = launchers._launch_meta(spec, x.device.type)
    if M > 0:
        with device_guard(x):
            launchers._launcher("second_order").launch(
                (progs,),
                (x, v, gg, weights[0], wh, weights[-1], b0, bh, bl,
                 x if gx is None else gx, x if gv is None else gv, z, u, zb, ts, acc,
                 M, IN, H, OUT, x.stride(0), v.stride(0), gg.stride(0)),
                dict(L_HID=L_HID, IN_P=P, H_P=P, OUT_P=P, BLOCK_M=bm,
                     ACT=meta["ACT"], OUT_ACT=meta["OUT_ACT"],
                     HAS_BIAS=biases is not None, NEED_X=gx is not None,
                     NEED_V=need_v, NEED_W=need_w, NEED_B=need_b and second, HID2=hid2,
                     OUT2=out2,
                     F32=meta["F32"], PREC=meta["PREC"],
                     MERGE_DW=tune.merge_dw),
                x.device, num_warps=tune.warps, num_stages=1)
    sums = acc.sum(0)
    outs = [(H, IN)] + [(H, H)] * L_HID + [(OUT, H)]
    gw = [sums[i * P * P:(i + 1) * P * P].view(P, P)[:n, :k].to(dt) for i, (n, k)
          in enumerate(outs)] if need_w else []
    base = (L_HID + 2) * P * P
    gb = [sums[base + i * P:base + i * P + n].to(dt) for i, (n, _) in enumerate(outs)] \
        if need_b else []
    if need_x and gx is None:  # no curvature: x's gradient is zero
        gx = torch.zeros_like(x)
    return gv, gx, gw, gb


def _pointwise(mode: int, act_id: int, z, a=None, b=None, o2=None, out=None,
               col_sum=False):
    """second_order_kernels._so_pointwise_kernel over z's elements (every other operand
    contiguous, z's shape; z [M, W] contiguous, or its rows apart: a layer's columns of
    the forward's saved pre-activations): returns o1 (``out`` when given); ``col_sum``:
    (o1, the fp32 column sums of o1 [M, W] as rounded), in the same pass where W is a
    power of two up to the block, else by torch after it."""
    o1 = z.new_empty(z.shape) if out is None else out
    n, block = z.numel(), 1024
    W = z.shape[-1] if col_sum else 0
    fused = W > 0 and W & (W - 1) == 0 and W <= block
    parts = z.new_empty(cdiv(n, block), W, dtype=torch.float32) if fused and n else None
    z_w, sz = _row_layout(z)
    if n:
        launchers._launcher("so_pointwise").launch(
            (cdiv(n, block),), (z if a is None else a, z if b is None else b, z, o1,
                                o1 if o2 is None else o2, z if parts is None else parts, n,
                                sz),
            dict(MODE=mode, ACT=act_id, BLOCK=block, SUM_W=W if fused else 0, Z_W=z_w),
            z.device, num_warps=4, num_stages=1)
    if not col_sum:
        return o1
    if parts is None:
        return o1, o1.sum(0, dtype=torch.float32)
    return o1, parts.sum(0)


def _row_layout(z) -> tuple[int, int]:
    """(Z_W, sz) of _so_pointwise_kernel for z: (0, 0) contiguous, else (its width, its
    row stride)."""
    return (0, 0) if z.is_contiguous() else (z.shape[1], _z_stride(z))


def _mm_pointwise(tune: Tuning, mode: int, act_id: int, a, w, transpose: bool, z=None,
                  b=None, bias=None, keep=None, o2=None, out=None, col_sum=False):
    """_so_mm_kernel: P = a w^T (``transpose``) or a w, then the pointwise step ``mode``
    on it -> o1 (``out`` when given; for modes 0 and 4 z = P + bias goes into ``keep``);
    ``keep``: where P goes too (modes 1-3); ``col_sum``: (o1, its fp32 column sums).
    ``tune``: its rows a block and warps."""
    M, K = a.shape
    N = w.shape[0] if transpose else w.shape[1]
    swk, swn = (w.stride(1), w.stride(0)) if transpose else (w.stride(0), w.stride(1))
    o1 = a.new_empty(M, N) if out is None and mode != 4 else out
    NP, KP = max(16, pow2(N)), max(16, pow2(K))
    bm = tune.block_m
    progs = cdiv(M, bm)
    parts = a.new_empty(progs, NP, dtype=torch.float32) if col_sum else None
    if M:
        cpu = a.device.type == "cpu"  # the interpreter: fp32 dots (tiles._dot)
        meta = dict(F32=cpu, PREC="ieee" if cpu else "tf32x3")
        launchers._launcher("so_mm").launch(
            (progs,), (a, w, a if bias is None else bias, a if z is None else z,
                       a if b is None else b, a if keep is None else keep,
                       a if o1 is None else o1, a if o2 is None else o2,
                       a if parts is None else parts, M, K, N, a.stride(0), swk, swn,
                       N if z is None else _z_stride(z)),
            dict(MODE=mode, ACT=act_id, BM=bm, KP=KP, NP=NP, HAS_BIAS=bias is not None,
                 KEEP_P=keep is not None and mode not in (0, 4), SUM=col_sum, **meta),
            a.device, num_warps=tune.warps, num_stages=1)
    if not col_sum:
        return o1
    return o1, (parts.sum(0)[:N] if M else a.new_zeros(N, dtype=torch.float32))


def _z_stride(z) -> int:
    """z's row stride for _so_mm_kernel (z [M, N]: rows of contiguous elements)."""
    if z.dim() != 2 or z.stride(1) != 1:
        raise ValueError(f"second-order pass: z of shape {tuple(z.shape)} and strides "
                         f"{z.stride()}: rows of contiguous elements expected")
    return z.stride(0)


def _second_order_gemms(gg, v, x, weights, biases, spec, needs, tune=SPLIT):
    """``second_order``'s outputs from the GEMM form's three passes (``GemmForm``)."""
    need_v, need_x, need_w, need_b = needs
    form = GemmForm(spec, tune)
    _, state = form.first(v, x, weights, biases, None, need_g=False)
    gv = form.tangent(state, gg, need_v)
    gx, gw, gb = form.finish(state, None, (need_x, need_w, need_b))
    return gv, gx, gw, gb


class GemmForm:
    """The closed form (fusedmlp_xpu/second_order.py) over the whole batch: every product a
    GEMM through torch (cuBLAS on GPUs, fp32 accumulation, operands and results in x's
    dtype), every elementwise step one _so_pointwise_kernel (fp32 inside, rounded once).
    A layer's two weight-gradient terms d_l^T t_{l-1} + e_l^T a_{l-1} are ONE GEMM over
    [d_l; e_l] and [t_{l-1}; a_{l-1}] stacked by rows (each step writes its half in place:
    no copies), rounded once like the kernel's fp32 partial sums.

    In passes, as ``second_order.InputGrad`` runs them: ``first`` (the forward and the
    first backward from v: g, with z, a, u, d kept), ``tangent`` (from g's gradient: v's
    gradient, t and zbar) and ``finish`` (the backward pass: x's and the parameters'
    gradients; ``gy``, the loss's gradient at y, joins it as the gradient above the top
    layer, so y's first-order backward is the same pass). Memory: per layer z, u, d, t, a
    (and zbar, e with curvature) of [M, width], z a view of the forward's saved
    pre-activations where there are some (the kernels read its rows with their stride);
    each u is let go once the tangent pass has read it, and a layer's others once the
    backward pass is past it."""

    def __init__(self, spec, tune=None):
        # the products fused to their pointwise steps (Tuning.fuse): that tuning, else None
        self.spec, self.fuse = spec, (tune if tune is not None and tune.fuse else None)
        L = spec.n_layers
        self.curved = ([spec.activation_id in CURVED] * (L - 1)
                       + [spec.output_activation_id in CURVED])

    def first(self, v, x, weights, biases, saved, need_g=True):
        """(g, state): g = (dy/dx)^T v (None unless ``need_g``); ``saved``: the forward's
        pre-activations side by side (Backend.forward's ``saved``) or None (computed
        here)."""
        spec, M, L, fuse = self.spec, x.shape[0], self.spec.n_layers, self.fuse
        meta = launchers._launch_meta(spec, x.device.type)  # the kernels' ids, cached
        ids = [meta["ACT"]] * (L - 1) + [meta["OUT_ACT"]]
        x, v = (t if t.is_contiguous() else t.contiguous() for t in (x, v))
        # [d; e] and [t; a] stacked by rows: d_l on top, e_l below; the tangent entering
        # layer l on top, its input below
        de = [x.new_empty(2 * M, w.shape[0]) for w in weights]
        ta = [x.new_empty(2 * M, w.shape[1]) for w in weights]
        ta[0][M:].copy_(x)
        cols = [0, *itertools.accumulate(w.shape[0] for w in weights)]
        zs = []
        for i, w in enumerate(weights):
            h, b = ta[i][M:], (None if biases is None else biases[i])
            nxt = ta[i + 1][M:] if i < L - 1 else None
            if saved is not None and (i < L - 1 or spec.output_activation != "none"):
                z = saved[:, cols[i]:cols[i + 1]]  # no GEMM again, read in place
            elif fuse:  # z and the next layer's input in one pass
                z = x.new_empty(M, w.shape[0])
                _mm_pointwise(fuse, 0 if nxt is not None else 4, ids[i], h, w, True, bias=b,
                              keep=z, out=nxt)
                zs.append(z)
                continue
            else:
                z = torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())
            zs.append(z)
            if nxt is not None:
                _pointwise(0, ids[i], z, out=nxt)
        us, u = [None] * L, v
        for i in range(L - 1, -1, -1):
            if i < L - 1 and fuse:  # u = d W and d = u s'(z) in one pass, u kept
                u = x.new_empty(M, weights[i + 1].shape[1])
                d = _mm_pointwise(fuse, 1, ids[i], d, weights[i + 1], False, z=zs[i],
                                  keep=u, out=de[i][:M])
            elif i < L - 1:
                u = torch.mm(d, weights[i + 1])
                d = _pointwise(1, ids[i], zs[i], a=u, out=de[i][:M])
            else:
                d = _pointwise(1, ids[i], zs[i], a=u, out=de[i][:M])
            us[i] = u
        g = torch.mm(d, weights[0]) if need_g else None
        return g, dict(M=M, x=x, ids=ids, zs=zs, us=us, de=de, ta=ta, zbar=[None] * L,
                       weights=weights, biases=biases)

    def tangent(self, st, gg, need_v):
        """The tangent pass from gg (g's gradient): v's gradient (None unless
        ``need_v``); t into the upper halves of ``ta``, zbar where curved."""
        M, ids, zs, us, ta = st["M"], st["ids"], st["zs"], st["us"], st["ta"]
        t = gg if gg.is_contiguous() else gg.contiguous()
        ta[0][:M].copy_(t)
        L = len(zs)
        for i, w in enumerate(st["weights"]):
            nxt = ta[i + 1][:M] if i + 1 < L else None
            zb = st["zbar"][i] = zs[i].new_empty(zs[i].shape) if self.curved[i] else None
            mode = 2 if self.curved[i] else 1
            if self.fuse:  # T = t W^T never goes through memory
                t = _mm_pointwise(self.fuse, mode, ids[i], t, w, True, z=zs[i], b=us[i],
                                  o2=zb, out=nxt)
            else:
                T = torch.mm(t, w.t())
                t = _pointwise(mode, ids[i], zs[i], a=T, b=us[i], o2=zb, out=nxt)
            us[i] = None  # read by nothing more: its memory serves the next zbar
        return t if need_v else None

    def finish(self, st, gy, needs):
        """The backward pass: e_l = (e_{l+1} W_{l+1}) s'(z_l) + zbar_l into the lower
        halves, each term only where it exists (as eager's double backward: no zero times
        a NaN), from ``gy`` above the top layer when given -> (grad x, grad weights, grad
        biases), lists empty where not needed."""
        need_x, need_w, need_b = needs
        M, ids, zs, zbar, de, ta = (st[k] for k in ("M", "ids", "zs", "zbar", "de", "ta"))
        weights, biases = st["weights"], st["biases"]
        need_b = need_b and biases is not None
        L = len(zs)
        gw, gb = [None] * L, [None] * L
        g = None if gy is None else (gy if gy.is_contiguous() else gy.contiguous())
        e_above = None  # e of the layer above, where g = e_above W_above is still to come
        for i in range(L - 1, -1, -1):
            e = sums = None
            if g is not None or e_above is not None or zbar[i] is not None:
                e = de[i][M:]
                mode = 1 if zbar[i] is None else 3
                if e_above is not None:  # g = e_above W_{i+1} and e in one pass
                    out = _mm_pointwise(self.fuse, mode, ids[i], e_above, weights[i + 1],
                                        False, z=zs[i], b=zbar[i], out=e, col_sum=need_b)
                elif g is None:
                    e.copy_(zbar[i])
                    out = (e, e.sum(0, dtype=torch.float32)) if need_b else e
                else:  # with the bias's gradient in the same pass
                    out = _pointwise(mode, ids[i], zs[i], a=g, b=zbar[i], out=e,
                                     col_sum=need_b)
                sums = out[1] if need_b else None
            if need_w:  # [d; e]^T [t; a], or d^T t alone
                gw[i] = (torch.mm(de[i].t(), ta[i]) if e is not None
                         else torch.mm(de[i][:M].t(), ta[i][:M]))
            if need_b:
                gb[i] = sums.to(e.dtype) if e is not None else torch.zeros_like(biases[i])
            e_above = g = None
            if e is not None and (i or need_x):
                if self.fuse and i:
                    e_above = e
                else:
                    g = torch.mm(e, weights[i])
            # layer i's tensors are read by nothing more (peak memory: the next layer's GEMM
            # outputs take their blocks); e stays for the next layer's fused product
            zs[i] = zbar[i] = ta[i] = None
            if e_above is None:
                de[i] = None
        gx = None
        if need_x:
            gx = g if g is not None else torch.zeros_like(st["x"])
        return gx, (gw if need_w else []), (gb if need_b else [])
