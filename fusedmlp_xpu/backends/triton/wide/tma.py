"""The wide GEMMs through TMA descriptors (Hopper-class GPUs and the interpreter): when a
GEMM takes them (_tma_ok), persistent launches whose shared memory steps down until the
device takes it, the stream-K tail of the forward, and the gated weights read in place
as one interleaved operand."""
from __future__ import annotations

import torch

from .... import envvars
from ... import memory
from ..common import cdiv
from ..launch import _name, _through_triton, bind_context, fitting
from . import configs, gemm_kernels
from .configs import _meta, act_id
from .gated_kernels import _gated_bwd_tma_kernel, _gated_fwd_tma_kernel
from .gemm_kernels import _dx_tma_kernel, _linear_fwd_tma_kernel


# ---------------------------------------------------------------- TMA path ---
#: FUSEDMLP_WIDE_TMA=0 keeps every GEMM on the pointer kernels
TMA_ENV = "FUSEDMLP_WIDE_TMA"


try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # an older Triton: the pointer kernels only
    TensorDescriptor = None


_PROGRAMS: dict = {}


def _programs(device: torch.device) -> int:
    """Programs of a persistent launch: one per SM (4 in the interpreter, so that each
    program there walks several tiles)."""
    key = (device.type, device.index)
    if key not in _PROGRAMS:
        if device.type == "cpu":
            _PROGRAMS[key] = 4
        else:
            props = torch.cuda.get_device_properties(device)
            _PROGRAMS[key] = props.multi_processor_count if props.major >= 9 else 0
    return _PROGRAMS[key]


def _tma_ok(device: torch.device, M: int, N: int, cfg, *tensors) -> bool:
    """Whether this GEMM (output M x N) takes a TMA kernel: a Hopper-class CUDA device (or
    the interpreter), 16-bit operands (fp32 was not measured), at least one full wave of
    tiles, and descriptors the TMA engine accepts: unit column stride, 16-byte aligned
    rows and base addresses. The callers keep decode-sized batches (<= 64 rows) on the
    autotuned pointer kernels, whose small-M tiles spread over the SMs."""
    if TensorDescriptor is None or envvars.get(TMA_ENV, "1") == "0":
        return False
    if (device.type == "cpu" and not configs.interpreting()) or device.type not in ("cuda", "cpu"):
        return False
    if tensors[0].dtype not in (torch.float16, torch.bfloat16):
        return False
    progs = _programs(device)  # 0 before Hopper
    if progs == 0 or cdiv(M, cfg[0]) * cdiv(N, cfg[1]) < progs:
        return False
    return all(t.stride(1) == 1 and t.stride(0) * t.element_size() % 16 == 0
               and t.data_ptr() % 16 == 0 for t in tensors)


#: (kernel, device index, config, constexprs) -> the most stages that fit, once refused
_TMA_FIT: dict = {}


def _tma_launch(kernel, device, cfg, M, N, descs, args, consts) -> bool:
    """Launch a TMA kernel persistent: ``descs`` are (tensor, block rows, block cols) or
    (base tensor, shape, strides, block dims), the blocks named "m"/"n"/"k" (this
    config's tiles), 2, "p" (the stream-K partials' pieces: _part_cols), or "e" (an
    epilogue tile's columns: half of "n" when cfg[5], the SUBTILE flag of the kernels
    that have one, is true), turned into descriptors for this config; ``args`` the rest.
    A config whose shared memory the device refuses steps its stages down (launch.fitting);
    False when not even one fits (the caller takes the pointer kernels)."""
    bind_context(device)
    bm, bn, bk, warps, stages = cfg[:5]
    if len(cfg) > 5:  # the kernels with a SUBTILE epilogue: its tiles are "e" wide
        consts = dict(consts, SUBTILE=cfg[5])
    size = {"m": bm, "n": bn, "k": bk, 2: 2, "p": _part_cols(bn),
            "e": bn // 2 if consts.get("SUBTILE") else bn}
    ds = [TensorDescriptor.from_tensor(d[0], [size[r] for r in d[1:]]) if len(d) == 3
          else TensorDescriptor(d[0], d[1], d[2], [size[r] for r in d[3]]) for d in descs]
    progs = min(_programs(device), cdiv(M, bm) * cdiv(N, bn))
    return fitting(_TMA_FIT, (kernel, device.index, cfg, tuple(consts.items())), stages,
                   lambda s: _through_triton(_name(kernel), lambda: kernel[(progs,)](
                       *ds, *args, **consts, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                       PROGRAMS=progs, num_warps=warps, num_stages=s)))


#: FUSEDMLP_WIDE_STREAM_K=0: the TMA forward leaves its last wave of tiles partial
STREAM_K_ENV = "FUSEDMLP_WIDE_STREAM_K"


#: FLOPs per byte of DRAM traffic where the stream-K tail stops paying (H200 bf16: ~660
#: TFLOP/s dense over ~3.5 TB/s is ~190; see _stream_k_tiles)
_SK_FLOP_PER_BYTE = 190


def _stream_k_tiles(device: torch.device, M: int, N: int, cfg, esize: int = 2) -> int:
    """How many tiles of the TMA forward go to its stream-K tail: those of the last wave
    (tiles % programs) when splitting them pays, else 0 (also when the tiles fill whole
    waves or the switch is off).
    It pays when the last wave is short. The tail's programs each take a slice of K of
    different tiles at once, so their operand tiles come from DRAM with none of the L2
    reuse the grouped waves get: r tiles read r (BLOCK_M + BLOCK_N) K esize bytes. The
    split wins while that read takes under half of one tile's compute time (what an
    unsplit last wave costs), i.e. r < BLOCK_M BLOCK_N programs / (4 (BLOCK_M +
    BLOCK_N) esize F), F the device's FLOPs per byte; K cancels. 128x256 tiles, bf16,
    132 SMs: r <= 7. Measured on the H200 (h200-probe-sk-20261130*.json, x 8192 rows):
    N 16384, K 4096 (4096 tiles, r 4) 1.651-1.663 ms split against 1.660-1.678 not
    split (two calls; 10 of 12 pairs over three calls favour the split, by 0.5-1%);
    N 4096, K 16384 (1024 tiles, r 100) 1.665-1.765 split against 1.619-1.627.
    In the interpreter every partial wave is split (there to be tested)."""
    if envvars.get(STREAM_K_ENV, "1") == "0":
        return 0
    bm, bn = cfg[0], cfg[1]
    tiles = cdiv(M, bm) * cdiv(N, bn)
    progs = _programs(device)
    r = tiles % progs if tiles > progs else 0
    if device.type == "cpu":
        return r
    return r if 4 * r * (bm + bn) * esize * _SK_FLOP_PER_BYTE < bm * bn * progs else 0


def _part_cols(block_n: int) -> int:
    """Columns of one piece of a stream-K partial tile as stored (_store_pieces)."""
    return min(block_n, 32)


def _linear_tma(x, w, b, y, z, cfg, consts) -> bool:
    """y = act(x w^T + b) (z = x w^T + b too with consts["STORE_Z"]) through
    _linear_fwd_tma_kernel, its last partial wave as a stream-K tail finished by
    _stream_k_fixup_kernel; False when the device refuses every stage count of cfg."""
    M, K = x.shape
    N = w.shape[0]
    bm, bn = cfg[0], cfg[1]
    sk = _stream_k_tiles(x.device, M, N, cfg, x.element_size())
    progs = _programs(x.device)
    # fp32 partials, two slots a program (unused and never read when sk is 0)
    part = memory.new_empty(2 * progs * bm, bn, like=x, dtype=torch.float32) if sk else y
    if not _tma_launch(
            _linear_fwd_tma_kernel, x.device, cfg, M, N,
            ((x, "m", "k"), (w, "n", "k"), (y, "m", "n"), (z, "m", "n"), (part, "m", "p")),
            (b, M, N, K, sk), dict(consts, STREAM_K=sk > 0, PART_N=_part_cols(bn))):
        return False
    if sk:
        fm, fn = min(32, bm), min(64, bn)
        gemm_kernels._stream_k_fixup_kernel[(sk, (bm // fm) * (bn // fn))](
            part, b, y, z, M, N, K, sk, y.stride(0), z.stride(0),
            ACT=consts["ACT"], HAS_BIAS=consts["HAS_BIAS"], STORE_Z=consts["STORE_Z"],
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg[2], GROUP_M=8, PROGRAMS=progs,
            FIX_M=fm, FIX_N=fn, num_warps=4)
    return True


def _gated_tma(x, w_gate, w_up, b_gate, b_up, act, h, g, u, cfg) -> bool:
    """h (and g, u when given) from the one-GEMM gated TMA kernel, the weights read in
    place where weight_pair allows, else from their interleaved copy. False when the
    device refuses every stage count of ``cfg``."""
    M, K = x.shape
    N = h.shape[1]
    pair = weight_pair(w_gate, w_up)
    if pair is None:
        pair = (interleave(w_gate, w_up), (2 * K, K, 1), False)
    base, strides, swap = pair
    b_i = None
    if b_gate is not None:
        b_i = interleave(b_up, b_gate) if swap else interleave(b_gate, b_up)
    gg, uu = (g, u) if g is not None else (h, h)
    return _tma_launch(
        _gated_fwd_tma_kernel, x.device, cfg, M, N,
        ((x, "m", "k"), (base, (N, 2, K), strides, ("n", 2, "k")), (h, "m", "n"),
         (gg, "m", "n"), (uu, "m", "n")),
        (b_i if b_i is not None else base, M, N, K),
        dict(ACT=act_id(act, x), HAS_BIAS=b_i is not None, STORE_GU=g is not None, SWAP=swap,
             **_meta(x)))


#: TMA strides stop short of 2^40 bytes (cuTensorMapEncodeTiled)
_TMA_STRIDE_BYTES = 2**40


def weight_pair(a: torch.Tensor, b: torch.Tensor):
    """Two [rows, cols] weights of one shape as ONE [rows, 2, cols] TMA view that reads
    a[j] and b[j] side by side in place: its middle stride is the distance from one
    weight to the other (the two need not share storage; the engine reads only the
    rows of the two). Returns (base, strides, swap): base is the lower-addressed of the
    two, swap True when that is b. None when no such view exists: different strides
    or dtypes, a column stride other than 1, rows that are not whole 16 bytes or
    overlap, misaligned or equal addresses, or a distance past what a TMA stride
    reaches; the caller then copies (interleave)."""
    if a.shape != b.shape or a.stride() != b.stride() or a.dtype != b.dtype:
        return None
    es = a.element_size()
    pa, pb = a.data_ptr(), b.data_ptr()
    if (a.stride(1) != 1 or a.stride(0) < a.shape[1] or a.stride(0) * es % 16
            or pa % 16 or pb % 16 or pa == pb or abs(pb - pa) >= _TMA_STRIDE_BYTES):
        return None
    if pb > pa:
        return a, (a.stride(0), (pb - pa) // es, 1), False
    return b, (a.stride(0), (pa - pb) // es, 1), True


def _dx_tma(g, w, z, out, h, act, cfg) -> bool:
    """out = (g @ w) * act'(z) (and h = act(z)) through _dx_tma_kernel; False when the
    device refuses every stage count of ``cfg``."""
    M, K = g.shape
    N = w.shape[1]
    return _tma_launch(
        _dx_tma_kernel, g.device, cfg, M, N,
        ((g, "m", "k"), (w, "k", "n"), (z, "m", "e"), (out, "m", "e"),
         (h if h is not None else out, "m", "e")),
        (M, N, K), dict(ACT=act_id(act, g), STORE_H=h is not None, **_meta(g)))


def _gated_bwd_tma(grad_y, w_down, g, u, dg, du, act, cfg, h=None) -> bool:
    """dg, du (and h = act(g) u when given) from _gated_bwd_tma_kernel; False when
    nothing fits."""
    M, H = g.shape
    return _tma_launch(
        _gated_bwd_tma_kernel, g.device, cfg, M, H,
        ((grad_y, "m", "k"), (w_down, "k", "n"), (g, "m", "e"), (u, "m", "e"),
         (dg, "m", "e"), (du, "m", "e"), (h if h is not None else dg, "m", "e")),
        (M, H, w_down.shape[0]), dict(ACT=act_id(act, g), STORE_H=h is not None, **_meta(g)))


def interleave(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[a; b] by rows, alternating: row 2j = a[j], row 2j + 1 = b[j] (a copy)."""
    return torch.stack((a, b), dim=1).reshape(2 * a.shape[0], *a.shape[1:])
