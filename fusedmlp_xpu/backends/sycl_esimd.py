"""The ESIMD kernels of the ``sycl`` backend (kernels/sycl/fused_mlp_esimd.cpp): every
layer's matmul on the Max 1550's XMX engines (``xmx::dpas``), rows carried through the
layers in registers, the weights read as dpas B tiles through L1 by 2-D block loads.

Kernel chain: ``fmlp_esimd_fwd_<t>_<IN>_<H>_<OUT>`` / ``fmlp_esimd_bwd_...`` /
``fmlp_esimd_wgrad_<t>_a<act>_io<mode>`` -> ``forward`` / ``backward`` here -> ``SyclBackend``, which
takes this path for the nets ``config_for`` covers and its portable kernels for the rest.

- One configuration per (dtype, padded input, hidden and output width): widths are padded
  on chip to 16/32/64/128 (the x columns past in_features load as 0; the host packs zero
  weights there), never in memory. A kernel is one configuration, activation pair and I/O
  mode (which of x, y and z go through 2-D block messages, ``io_mode``; the rest gather):
  the runtime compiles it when a call first needs it, once per process and device.
- On an ``xpu`` device (a Max 1550) the source compiles as ESIMD with the large register
  file; ``ci/aot_sycl.py`` compiles every configuration for ``pvc`` with ``ocloc`` and
  checks its ISA. On the CPU the same source compiles against ``esimd_emu.hpp`` (plain
  SYCL) for ``opencl:cpu``, so the shared suite runs it against float64.
- ``$FUSEDMLP_SYCL_SPIRV_DIR``: a directory of SPIR-V modules (``ci/aot_sycl.py
  --spirv-dir``) to load a configuration from instead of compiling source, for a device
  whose runtime compiler fails.

The backward reads the forward's saved pre-activations (the portable kernels' contract):
at these widths saving z costs 2 bytes a value written and read once, against a second
pass of every layer's dpas work. The weight gradients of every layer come from one
launch: each thread sums one 32 x 32 tile of one layer's dW over one chunk of rows on the
XMX engines (dz^T by transposed 2-D loads, act(z) by VNNI 2-D loads), and one sum on the
device adds the chunks' partials.

The packed weights (``pack_forward``/``pack_backward``: ~4 torch ops a layer, ~50 launches
at paper-table1, more than Intel's 83 us for the whole call) are kept between calls,
keyed on each weight's address, version counter, shape and strides, and held only while
the weight itself lives (a weak reference: a freed temporary's address reused by a new
tensor is a miss). In-place updates move a tensor's version counter, so the next call
packs again; every ``optimizer.step()`` also drops the kept packs (a global step hook),
because the fused optimizers (``fused=True``: ``torch._fused_adamw_``) write parameters
without moving their version counters (torch 2.13). Writes through ``.data`` bypass the
counter too; after those, ``clear_packs()``.
"""
from __future__ import annotations

import ctypes
import math
import os
import re
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import memory, saved_widths
from .kernel_files import kernel_dir

KERNEL_DIR = kernel_dir("sycl")
SOURCE = KERNEL_DIR / "fused_mlp_esimd.cpp"
HEADER = KERNEL_DIR / "fused_mlp_esimd.h"
INCLUDES = ("fused_mlp_esimd.h", "esimd_select.hpp", "esimd_emu.hpp", "esimd_emu_simd.hpp")

#: the widths a configuration pads to (dpas tiles are 16 wide)
PADS = (16, 32, 64, 128)
HALF = {torch.float16: ("f16", "sycl::half"),
        torch.bfloat16: ("bf16", "sycl::ext::oneapi::bfloat16")}
SPIRV_DIR_ENV = "FUSEDMLP_SYCL_SPIRV_DIR"
#: FUSEDMLP_SYCL_ESIMD=0 keeps every net on the portable kernels (for comparisons)
ENABLE_ENV = "FUSEDMLP_SYCL_ESIMD"


def _define(name: str) -> int:
    m = re.search(rf"^#define {name} (\d+)", HEADER.read_text(), re.M)
    if not m:
        raise RuntimeError(f"{HEADER} lacks #define {name}")
    return int(m.group(1))


WG = _define("FMLP_ESIMD_WG")
BIAS_STRIDE = _define("FMLP_ESIMD_MAX_WIDTH")
#: the weight-gradient kernel's thread tile (MR x 8 outputs, NR x 16 inputs) and the rows
#: it sums a step (2 dpas K steps: fused_mlp_esimd.cpp kWgM, kWgN, kWgK)
WGRAD_MR, WGRAD_NR, WGRAD_ROWS = 4, 2, 32


def slm_bytes(kind: str) -> int:
    """Shared local memory a work-group of ``kind`` declares: none (the weights come
    through L1 by 2-D block loads), so the register file alone sets the threads a vector
    engine holds (4 at 256 GRF)."""
    return 0


def row_groups(hidden: int) -> int:
    """Row groups of 8 a thread carries (fused_mlp_esimd.cpp row_groups<H>)."""
    return 2 if hidden >= 128 else 4


def pad(width: int) -> int:
    return next(p for p in PADS if p >= width)


#: I/O mode bits (fused_mlp_esimd.cpp): surfaces that go through 2-D block messages
IO_X, IO_Y, IO_Z = 1, 2, 4


def standard_io(IN: int, OUT: int) -> int:
    """The I/O mode of contiguous tensors whose widths are the padded ones: x and y by 2-D
    block messages where a row is at least 64 bytes (32 elements), z always."""
    return (IO_X if IN >= 32 else 0) | (IO_Y if OUT >= 32 else 0) | IO_Z


@dataclass(frozen=True)
class EsimdConfig:
    """One compiled configuration: operand dtype, the padded widths, the activation ids
    (hidden, output) and the I/O mode (``standard_io`` unless given)."""

    dtype: torch.dtype
    IN: int
    H: int
    OUT: int
    act: int = 1
    out_act: int = 0
    io: int = -1

    def __post_init__(self):
        if self.io < 0:
            object.__setattr__(self, "io", standard_io(self.IN, self.OUT))

    @property
    def tag(self) -> str:
        return HALF[self.dtype][0]

    @property
    def suffix(self) -> str:
        return f"{self.tag}_{self.IN}_{self.H}_{self.OUT}"

    def kernel(self, kind: str) -> str:
        if kind == "wgrad":  # every layer: the hidden activation, x and z/dz's I/O bits
            return f"fmlp_esimd_wgrad_{self.tag}_a{self.act}_io{self.io & (IO_X | IO_Z)}"
        return f"fmlp_esimd_{kind}_{self.suffix}_a{self.act}_{self.out_act}_io{self.io}"

    def names(self) -> list[str]:
        return [self.kernel(k) for k in ("fwd", "bwd", "wgrad")]

    def instantiation(self, kinds=("fwd", "bwd", "wgrad")) -> str:
        tag, ctype = HALF[self.dtype]
        lines = [f"FMLP_ESIMD_{k.upper()}({tag}, {ctype}, {self.IN}, {self.H}, {self.OUT}, "
                 f"{self.act}, {self.out_act}, {self.io})" for k in kinds if k != "wgrad"]
        if "wgrad" in kinds:
            lines.append(f"FMLP_ESIMD_WGRAD({tag}, {ctype}, {self.act}, "
                         f"{self.io & (IO_X | IO_Z)})")
        return "\n".join(lines) + "\n"

    def dpas(self, kind: str) -> int:
        """The dpas instructions the kernel's code holds (the ISA's static count): one
        per 8 rows x 16 x 16 tile product of the first layer, one hidden layer (the loop
        body: every hidden layer runs it) and the last layer, per row group; the
        weight-gradient kernel: its thread tile's MR x NR products and MR bias products
        (against ones) per 16 rows, two K steps a loop body."""
        ki, kh, ko = self.IN // 16, self.H // 16, self.OUT // 16
        if kind == "wgrad":
            return WGRAD_ROWS // 16 * WGRAD_MR * (WGRAD_NR + 1)
        # backward: dL/dz_L -> hidden (ko x kh), hidden -> hidden, hidden -> x (kh x ki)
        return row_groups(self.H) * (ki * kh + kh * kh + kh * ko)

    def packed_bytes(self, n_layers: int) -> int:
        tiles = (self.IN // 16) * (self.H // 16) + (n_layers - 2) * (self.H // 16) ** 2 \
            + (self.H // 16) * (self.OUT // 16)
        return tiles * 256 * 2


def all_configs() -> list[EsimdConfig]:
    """Every configuration the dispatcher can pick (what ci/aot_sycl.py compiles)."""
    return [EsimdConfig(dt, i, h, o) for dt in HALF for h in PADS for i in PADS for o in PADS]


def config_for(spec) -> tuple[EsimdConfig | None, str]:
    """The configuration that runs ``spec``, or (None, why not)."""
    if spec.dtype not in HALF:
        return None, f"{spec.dtype}: dpas takes float16/bfloat16 operands"
    if spec.n_layers < 2:
        return None, "one layer: no hidden width to carry (portable kernel)"
    hidden = set(spec.widths[1:-1])
    if len(hidden) > 1:
        return None, f"hidden widths {sorted(hidden)} differ (one padded width a kernel)"
    if max(spec.widths) > PADS[-1]:
        return None, f"width {max(spec.widths)} over {PADS[-1]}"
    cfg = EsimdConfig(spec.dtype, pad(spec.in_features), pad(spec.widths[1]),
                      pad(spec.out_features), spec.activation_id, spec.output_activation_id)
    need = cfg.packed_bytes(spec.n_layers)
    return cfg, (f"ESIMD dpas kernel {cfg.suffix} (widths padded on chip to {cfg.IN}/{cfg.H}/"
                 f"{cfg.OUT}, {max(1, need // 1024)} KiB of weights read through L1)")


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0"


# --- sources and builds ------------------------------------------------------------------
def source(configs, kinds=("fwd", "bwd", "wgrad")) -> bytes:
    """The kernel source with ``configs`` instantiated (each weight-gradient kernel once)."""
    text = SOURCE.read_text()
    seen_wgrad = set()
    for c in configs:
        ks = tuple(k for k in kinds if k != "wgrad" or c.kernel("wgrad") not in seen_wgrad)
        if "wgrad" in ks:
            seen_wgrad.add(c.kernel("wgrad"))
        text += "\n" + c.instantiation(ks)
    return text.encode()


def includes() -> dict[str, bytes]:
    return {name: (KERNEL_DIR / name).read_bytes() for name in INCLUDES}


def build_options(emulate: bool) -> list[str]:
    # The emulated build (opencl:cpu, for verification) at -O0: the runtime compiler's
    # optimizer spent most of each build on the emulation's templates (bf16 16/32/16
    # forward: 5.7 s, 1.8 s at -O0), and a build per configuration and kernel was most of
    # the CPU suite's time (three shared-suite cases: 83 s, 19 s at -O0), where each
    # kernel then runs a few hundred rows
    return ["-DFMLP_ESIMD_EMULATE", "-O0"] if emulate else ["-DFMLP_ESIMD_LARGE_GRF"]


_bundles: dict[tuple, object] = {}
_lock = threading.Lock()


def _spirv_module(names: list[str]) -> bytes | None:
    """The SPIR-V module of $FUSEDMLP_SYCL_SPIRV_DIR that holds every kernel ``names``."""
    d = os.environ.get(SPIRV_DIR_ENV)
    if not d:
        return None
    for f in sorted(Path(d).glob("*.spv")):
        data = f.read_bytes()
        if all(f"__sycl_kernel_{n}".encode() in data for n in names):
            return data
    raise RuntimeError(f"sycl backend: no SPIR-V module in {SPIRV_DIR_ENV}={d} holds "
                       f"{', '.join(names)}")


def bundle(sh, queue: int, key, cfg: EsimdConfig, emulate: bool, kind: str):
    """The built ``kind`` kernel of ``cfg`` for the queue's device (``key`` names the
    device): one kernel a module, as ``ci/aot_sycl.py --alone`` compiles it."""
    k = (key, cfg.kernel(kind), emulate)
    with _lock:
        if k not in _bundles:
            names = [cfg.kernel(kind)]
            spv = _spirv_module(names)
            if spv is not None:
                _bundles[k] = sh.build(queue, spv, names, spirv=True,
                                       options=[] if emulate else ["-ze-opt-large-register-file"])
            else:
                _bundles[k] = sh.build(queue, source([cfg], (kind,)), names,
                                       includes=includes(), options=build_options(emulate))
        return _bundles[k]


# --- the host side ------------------------------------------------------------------------
class Args(ctypes.Structure):
    """FmlpEsimdArgs of fused_mlp_esimd.h."""
    _fields_ = [("src", ctypes.c_void_p), ("src_rs", ctypes.c_int64), ("src_cs", ctypes.c_int64),
                ("dst", ctypes.c_void_p), ("wpack", ctypes.c_void_p), ("bias", ctypes.c_void_p),
                ("z", ctypes.c_void_p), ("dz", ctypes.c_void_p), ("z_rs", ctypes.c_int64),
                ("dz_rs", ctypes.c_int64), ("n_rows", ctypes.c_int64),
                ("wpack_words", ctypes.c_int32), ("n_layers", ctypes.c_int32),
                ("in_w", ctypes.c_int32), ("hid_w", ctypes.c_int32), ("out_w", ctypes.c_int32),
                ("act", ctypes.c_int32), ("out_act", ctypes.c_int32), ("pad_", ctypes.c_int32)]


class WgradArgs(ctypes.Structure):
    """FmlpEsimdWgradArgs of fused_mlp_esimd.h."""
    _fields_ = [("dz", ctypes.c_void_p), ("z", ctypes.c_void_p), ("x", ctypes.c_void_p),
                ("gw", ctypes.c_void_p), ("gb", ctypes.c_void_p), ("dz_rs", ctypes.c_int64),
                ("z_rs", ctypes.c_int64), ("x_rs", ctypes.c_int64), ("x_cs", ctypes.c_int64),
                ("n_rows", ctypes.c_int64), ("rows_per_chunk", ctypes.c_int64),
                ("chunks", ctypes.c_int32), ("n_layers", ctypes.c_int32),
                ("in_w", ctypes.c_int32), ("hid_w", ctypes.c_int32), ("out_w", ctypes.c_int32),
                ("out_pad", ctypes.c_int32), ("in_pad", ctypes.c_int32), ("pad_", ctypes.c_int32)]


def pack_tiles(m: torch.Tensor, n_pad: int, k_pad: int) -> torch.Tensor:
    """dpas B tiles of the product with m^T: m [N, K] (zero-padded to [n_pad, k_pad]) as
    tiles (n, k) in that order, each 16 x 16 in VNNI order: B[k][n] = m[n][k] at
    (k // 2) * 32 + n * 2 + k % 2. Returns the flat tiles."""
    p = m.new_zeros(n_pad, k_pad)
    p[: m.shape[0], : m.shape[1]] = m
    nt, kt = n_pad // 16, k_pad // 16
    t = p.view(nt, 16, kt, 16).permute(0, 2, 3, 1)          # [nt, kt, k, n]
    return t.reshape(nt, kt, 8, 2, 16).permute(0, 1, 2, 4, 3).reshape(-1)  # [.., k/2, n, k%2]


def _pads(cfg: EsimdConfig, n_layers: int) -> list[tuple[int, int]]:
    """(padded out, padded in) of each layer."""
    ins = [cfg.IN] + [cfg.H] * (n_layers - 1)
    outs = [cfg.H] * (n_layers - 1) + [cfg.OUT]
    return list(zip(outs, ins))


def pack_forward(weights, cfg: EsimdConfig) -> torch.Tensor:
    pads = _pads(cfg, len(weights))
    return torch.cat([pack_tiles(w, o, i) for w, (o, i) in zip(weights, pads)])


def pack_backward(weights, cfg: EsimdConfig) -> torch.Tensor:
    """W itself (g_{l-1} = g_l W_l) as B tiles, last layer first."""
    pads = _pads(cfg, len(weights))
    return torch.cat([pack_tiles(weights[l].t(), pads[l][1], pads[l][0])
                      for l in reversed(range(len(weights)))])


#: packs kept (forward and backward of a few nets; a pack is its net's weights in fp16/bf16)
PACK_CACHE_SIZE = 16
_packs: OrderedDict = OrderedDict()
_packs_lock = threading.Lock()  # not _lock: that one is held through builds
_PACKERS = {"fwd": pack_forward, "bwd": pack_backward}


def _identity(weights) -> tuple | None:
    """What a pack of ``weights`` depends on, or None where a weight has no version
    counter to go by (inference tensors, tensor subclasses without storage): those pack
    every call."""
    try:
        return tuple((w.data_ptr(), w._version, tuple(w.shape), w.stride()) for w in weights)
    except (RuntimeError, NotImplementedError):
        return None


def packed(kind: str, weights, cfg: EsimdConfig) -> torch.Tensor:
    """``pack_forward`` (kind "fwd") or ``pack_backward`` ("bwd") of ``weights``, from the
    cache while every weight is the same live tensor at the same address and version."""
    ident = _identity(weights)
    if ident is None:
        return _PACKERS[kind](weights, cfg)
    key = (kind, cfg, weights[0].device, ident)
    with _packs_lock:
        hit = _packs.get(key)
        if hit is not None and all(r() is w for r, w in zip(hit[0], weights)):
            _packs.move_to_end(key)
            return hit[1]
    pack = _PACKERS[kind](weights, cfg)
    with _packs_lock:
        _packs[key] = (tuple(weakref.ref(w) for w in weights), pack)
        while len(_packs) > PACK_CACHE_SIZE:
            _packs.popitem(last=False)
    return pack


def clear_packs(*_) -> None:
    """Drop every kept pack (after writing weights through ``.data``; every optimizer
    step calls it)."""
    with _packs_lock:
        _packs.clear()


_step_hook = register_optimizer_step_post_hook(clear_packs)


def pack_biases(biases, like: torch.Tensor, n_layers: int) -> torch.Tensor:
    """[n_layers][BIAS_STRIDE] biases, zeros where the net has none (the kernels add them
    unconditionally: no branch in the epilogue)."""
    out = like.new_zeros(n_layers, BIAS_STRIDE)
    for l, b in enumerate(biases or []):
        out[l, : b.shape[0]] = b
    return out


def _groups(blocks: int, device: torch.device) -> int:
    """Work-groups of a row kernel: enough to fill the device, each looping over blocks."""
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        cores = getattr(props, "gpu_subslice_count", 0) or 64
        limit = 4 * cores
    else:
        limit = 4 * (os.cpu_count() or 1)
    return max(1, min(math.ceil(blocks / WG), limit))


def block_surface(ptr: int | None, rs: int, cs: int, width: int, esize: int) -> bool:
    """Whether rows of ``width`` elements at ``ptr`` (row stride rs, column stride cs, in
    elements) can be a 2-D block message surface: contiguous rows of at least 64 bytes, a
    whole number of dwords, the pitch a multiple of 16 bytes, the base 64-byte aligned
    (row blocks start at multiples of 8 rows, so each block's base stays aligned)."""
    return (ptr is not None and (cs == 1 or width == 1) and width * esize >= 64
            and width * esize % 4 == 0 and rs >= width and rs * esize % 16 == 0
            and ptr % 64 == 0)


def io_mode(x_surface, y_surface, z_surfaces, hid_w: int, esize: int) -> int:
    """A kernel's I/O mode: (ptr, rs, cs, width) of its x-like and y-like surfaces (None:
    not accessed), the (ptr, rs) of z and dz (every hidden layer's columns side by side,
    so the hidden width must be a whole number of 16-column tiles)."""
    io = 0
    if x_surface is None or block_surface(*x_surface, esize):
        io |= IO_X
    if y_surface is None or block_surface(*y_surface, esize):
        io |= IO_Y
    if hid_w % 16 == 0 and all(block_surface(ptr, rs, 1, rs, esize) for ptr, rs in z_surfaces):
        io |= IO_Z
    return io


def _launch_rows(sh, lau, key, emulate, cfg, kind, args, n, device):
    b = bundle(sh, lau.queue, key, cfg, emulate, kind)
    blocks = math.ceil(n / (8 * row_groups(cfg.H)))
    b.launch(lau.queue, cfg.kernel(kind), _groups(blocks, device) * WG, WG, args)


def _rows_args(cfg, spec, n, lau, src, dst_ptr, wpack, z_ptr, z_rs, dz_ptr=None, dz_rs=0,
               bias_ptr=None) -> Args:
    src_ptr, (rs, cs) = lau.input(src)
    return Args(src=src_ptr, src_rs=rs, src_cs=cs, dst=dst_ptr,
                wpack=lau.input(wpack)[0], bias=bias_ptr, z=z_ptr, dz=dz_ptr, z_rs=z_rs,
                dz_rs=dz_rs, n_rows=n, wpack_words=wpack.numel() // 2,
                n_layers=spec.n_layers, in_w=spec.in_features, hid_w=spec.widths[1],
                out_w=spec.out_features, act=spec.activation_id,
                out_act=spec.output_activation_id)


def forward(sh, lau, key, emulate, x, weights, biases, spec, cfg, save):
    n = x.shape[0]
    y = memory.new_empty(n, spec.out_features, like=x)
    widths = saved_widths(spec)
    saved = memory.new_empty(n, sum(widths), like=x) if save else None
    if n == 0:
        return y, saved
    bias_ptr = lau.input(pack_biases(biases, x, spec.n_layers))[0]
    z_ptr = lau.output(saved) if save and saved.shape[1] else None
    z_rs = saved.shape[1] if save else 0
    y_ptr = lau.output(y)
    args = _rows_args(cfg, spec, n, lau, x, y_ptr, packed("fwd", weights, cfg), z_ptr, z_rs,
                      bias_ptr=bias_ptr)
    io = io_mode((args.src, args.src_rs, args.src_cs, spec.in_features),
                 (y_ptr, spec.out_features, 1, spec.out_features),
                 [(z_ptr, z_rs)] if z_ptr else [], spec.widths[1], x.element_size())
    _launch_rows(sh, lau, key, emulate, replace(cfg, io=io), "fwd", args, n, x.device)
    lau.finish()
    return y, saved


def backward(sh, lau, key, emulate, grad_y, x, weights, biases, saved, spec, cfg, needs):
    need_x, need_w, need_b = needs
    need_b = need_b and biases is not None
    n, L = x.shape[0], spec.n_layers
    gx = memory.new_empty(n, spec.in_features, like=x) if need_x else None
    if n == 0:
        gw = [torch.zeros_like(w) for w in weights] if need_w else []
        gb = [torch.zeros_like(w[:, 0]) for w in weights] if need_b else []
        return gx, gw, gb
    z_rs = saved.shape[1]
    z_ptr = lau.input(saved)[0] if z_rs else None
    dz_rs = (L - 1) * spec.widths[1] + spec.out_features
    dz = memory.new_empty(n, dz_rs, like=x) if need_w or need_b else None
    dz_ptr = lau.output(dz) if dz is not None else None
    gx_ptr = lau.output(gx) if need_x else None
    args = _rows_args(cfg, spec, n, lau, grad_y, gx_ptr, packed("bwd", weights, cfg), z_ptr,
                      z_rs, dz_ptr, dz_rs)
    io = io_mode((gx_ptr, spec.in_features, 1, spec.in_features) if need_x else None,
                 (args.src, args.src_rs, args.src_cs, spec.out_features),
                 [(p, rs) for p, rs in ((z_ptr, z_rs), (dz_ptr, dz_rs)) if p],
                 spec.widths[1], x.element_size())
    _launch_rows(sh, lau, key, emulate, replace(cfg, io=io), "bwd", args, n, x.device)
    partials = (None, None)
    if dz is not None:
        lau.finish()  # dz back in the tensor (CPU: out of USM) before it is read again
        partials = _weight_grads(sh, lau, key, emulate, cfg, spec, x, saved, dz, need_b)
    lau.finish()
    return (gx, *reduce_partials(partials, spec, x.dtype, need_w, need_b))


def wgrad_chunks(n: int, tiles: int, device: torch.device) -> int:
    """Row chunks of the weight-gradient launch: enough (chunk, tile) threads to give every
    vector engine its 4 (8 a Xe-core), at most one chunk per 32 rows."""
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        threads = 32 * (getattr(props, "gpu_subslice_count", 0) or 64)
    else:
        threads = 4 * (os.cpu_count() or 1)
    return max(1, min(math.ceil(threads / tiles), math.ceil(n / WGRAD_ROWS)))


def _weight_grads(sh, lau, key, emulate, cfg, spec, x, saved, dz, need_b):
    """Every layer's weight (and bias) gradient partials in one launch: (pw [L, chunks,
    out_pad, in_pad], pb [L, chunks, out_pad, 16] or None), fp32."""
    n, L, hid = x.shape[0], spec.n_layers, spec.widths[1]
    tile = lambda w: math.ceil(w / 32)  # noqa: E731 (the kernel's 32 x 32 thread tile)
    tiles = tile(hid) * (tile(spec.in_features) + (L - 2) * tile(hid) + tile(spec.out_features))
    chunks = wgrad_chunks(n, tiles, x.device)
    rows_per_chunk = WGRAD_ROWS * math.ceil(n / WGRAD_ROWS / chunks)
    chunks = math.ceil(n / rows_per_chunk)
    out_pad = max(32 * tile(w) for w in spec.widths[1:])
    in_pad = max(32 * tile(w) for w in spec.widths[:-1])
    pw = memory.new_empty(L, chunks, out_pad, in_pad, like=x, dtype=torch.float32)
    pb = memory.new_empty(L, chunks, out_pad, 16, like=x, dtype=torch.float32) \
        if need_b else None
    x_ptr, (x_rs, x_cs) = lau.input(x)
    z_rs = saved.shape[1]
    args = WgradArgs(dz=lau.input(dz)[0], z=lau.input(saved)[0] if z_rs else None, x=x_ptr,
                     gw=lau.output(pw), gb=lau.output(pb) if pb is not None else None,
                     dz_rs=dz.shape[1], z_rs=z_rs, x_rs=x_rs, x_cs=x_cs, n_rows=n,
                     rows_per_chunk=rows_per_chunk, chunks=chunks, n_layers=L,
                     in_w=spec.in_features, hid_w=hid, out_w=spec.out_features,
                     out_pad=out_pad, in_pad=in_pad)
    io = io_mode((x_ptr, x_rs, x_cs, spec.in_features), None,
                 [(p, rs) for p, rs in ((args.z, z_rs), (args.dz, args.dz_rs)) if p],
                 hid, x.element_size())
    wcfg = replace(cfg, io=io)
    b = bundle(sh, lau.queue, key, wcfg, emulate, "wgrad")
    b.launch(lau.queue, wcfg.kernel("wgrad"), WG * math.ceil(tiles * chunks / WG), WG, args)
    return pw, pb


def reduce_partials(partials, spec, dtype, need_w: bool, need_b: bool):
    """(weight gradients, bias gradients) from the weight-gradient kernel's work-group
    partials ``(pw [L, groups, out_pad, in_pad], pb [L, groups, out_pad, 16] or None)``,
    fp32: one sum on the device over the chunks of every layer, then each layer's real
    widths cut out in the operand dtype (a bias partial's 16 columns are each the sum)."""
    pw, pb = partials
    widths = spec.widths
    gw = gb = []
    if need_w:
        sums = pw.sum(1)  # [L, out_pad, in_pad]
        gw = [sums[l, :o, :i].to(dtype) for l, (o, i) in enumerate(zip(widths[1:], widths))]
    if need_b:
        sums = pb[..., 0].sum(1)  # [L, out_pad]
        gb = [sums[l, :o].to(dtype) for l, o in enumerate(widths[1:])]
    return gw, gb
