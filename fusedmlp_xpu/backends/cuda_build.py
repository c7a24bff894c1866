"""The ``cuda`` backend's build side: kernel configurations, NVRTC compiles and their disk
cache. Nothing here needs a GPU or a driver (CPU CI compiles every configuration with it:
ci/aot_cuda.py, tests/test_cuda_backend.py); the loading and launching is in cuda.py.

- ``ForwardConfig``: one specialization of a forward kernel (``kernels/cuda/
  fused_mlp_forward.cu``, mma.sync; ``fused_mlp_forward_sm90.cu``, wgmma on Hopper: its
  ``family``) by widths, depth, activations, bias, dtype, and the tuning (16-row tiles
  per warp, warps per CTA), its NVRTC ``-D`` options and its dynamic shared memory,
  counted here and checked against the kernel's own count by a static_assert at compile
  time.
- ``compile_cubin``: NVRTC through NVIDIA's Python bindings (``cuda.bindings.nvrtc``,
  or the older ``cuda.nvrtc`` layout of cuda-python 12.x), once per (source, options,
  architecture, NVRTC version): the cubin and the ptxas log are kept under
  ``$FUSEDMLP_CACHE_DIR/cuda`` (default ``~/.cache/fusedmlp_xpu/cuda``), keyed by a hash
  of all of those, written atomically.
- The kernels include no CUDA header (inline PTX for conversions, MMAs and copies), so
  NVRTC needs no include path and no CUDA toolkit: the nvidia-cuda-nvrtc wheel is enough.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import activations
from .kernel_files import kernel_dir

KERNEL_DIR = kernel_dir("cuda")
FORWARD_SOURCE = KERNEL_DIR / "fused_mlp_forward.cu"
#: the wgmma forward (Hopper, sm_90a)
FORWARD_SM90_SOURCE = KERNEL_DIR / "fused_mlp_forward_sm90.cu"
#: the one-kernel backward (Hopper, sm_90a; compiled in CI, its float64 tests run on an H200)
BACKWARD_SM90_SOURCE = KERNEL_DIR / "fused_mlp_backward_sm90.cu"
BACKWARD_SM90_KERNEL = "fmlp_backward_sm90"
DEVICE_HEADER = KERNEL_DIR / "fmlp_device.cuh"
#: every header the kernels include, handed to NVRTC by name (and hashed into cache keys)
HEADERS = (DEVICE_HEADER, KERNEL_DIR / "fmlp_forward_common.cuh", KERNEL_DIR / "fmlp_wgmma.cuh",
           KERNEL_DIR / "fmlp_sm90.cuh")
FORWARD_KERNEL = "fmlp_forward"
FORWARD_SM90_KERNEL = "fmlp_forward_sm90"

#: widths the forward kernel takes (in, hidden and out features; padded to 16 inside)
MAX_WIDTH = 128
#: length of the weight and bias pointer arrays in FmlpForwardParams (the kernel's
#: FMLP_MAX_LAYERS); deeper nets do not fit shared memory at any width anyway
MAX_LAYERS = 32
DTYPES = {torch.float16: 0, torch.bfloat16: 1}
#: every activation of the registry (kernels/cuda/fmlp_device.cuh, fmlp::act)
ACTIVATION_IDS = frozenset(a.id for a in activations.ACTIVATIONS.values())
#: mma.sync m16n8k16, ldmatrix and cp.async need compute capability 8.0
MIN_CAPABILITY = (8, 0)
#: dynamic shared memory one CTA may use on sm_90 (the AOT check's target)
SM90_SMEM = 227 * 1024
#: ptxas may spill this many bytes (stores + loads) in a configuration ci/aot_cuda.py
#: compiles before it fails it: none (a spill in the layer chain costs local-memory
#: round trips per row block)
SPILL_BUDGET = 0


class CudaToolchainError(RuntimeError):
    """cuda-python's NVRTC bindings are missing, or NVRTC rejected a kernel."""


# --- configurations ----------------------------------------------------------------------
def pad16(v: int) -> int:
    return (v + 15) // 16 * 16


@dataclass(frozen=True)
class ForwardConfig:
    """One specialization of the forward kernel (its -D options)."""

    in_features: int
    out_features: int
    hidden: int
    hidden_layers: int  # hidden -> hidden matmuls: n_layers - 2
    activation: int  # registry ids
    output_activation: int
    bias: bool
    bf16: bool
    mt: int  # 16-row tiles per warp
    warps: int  # warps per CTA
    #: "mma": fused_mlp_forward.cu (mma.sync, sm_80+); "wgmma": fused_mlp_forward_sm90.cu
    #: (warpgroup MMAs, sm_90a only; mt 1, warps a multiple of 4)
    family: str = "mma"
    #: x/y buffers per warp: x tiles are copied stages - 1 row blocks ahead
    stages: int = 2

    def __post_init__(self):
        if not 2 <= self.stages <= 8:
            raise ValueError(f"stages: {self.stages} x/y buffers per warp, not in [2, 8]")
        if self.family not in ("mma", "wgmma"):
            raise ValueError(f"family: {self.family!r} is not 'mma' or 'wgmma'")
        if self.family == "wgmma" and (self.mt != 1 or self.warps % 4):
            raise ValueError(f"the wgmma forward takes mt 1 and whole warpgroups, not mt "
                             f"{self.mt}, {self.warps} warps")

    @property
    def source(self) -> Path:
        return FORWARD_SM90_SOURCE if self.family == "wgmma" else FORWARD_SOURCE

    @property
    def kernel(self) -> str:
        return FORWARD_SM90_KERNEL if self.family == "wgmma" else FORWARD_KERNEL

    @property
    def rows_per_warp(self) -> int:
        return 16 * self.mt

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def smem_bytes(self) -> int:
        """Dynamic shared memory of one CTA, as the kernel lays it out: every layer's
        weights padded to 16 (mma: with rows 16 bytes longer, for bank-conflict-free
        ldmatrix; wgmma: in core matrices, unpadded), the biases as fp32, ``stages``
        x/y buffers of rows_per_warp rows per warp."""
        in_p, out_p, h_p = pad16(self.in_features), pad16(self.out_features), pad16(self.hidden)
        pad = 0 if self.family == "wgmma" else 8
        weights = h_p * (in_p + pad) + (self.hidden_layers * h_p + out_p) * (h_p + pad)
        biases = (self.hidden_layers + 1) * h_p + out_p if self.bias else 0
        buffers = 2 * self.warps * self.rows_per_warp * (max(in_p, out_p) + 8)  # bytes, one
        return 2 * weights + 4 * biases + self.stages * buffers

    def defines(self) -> dict[str, int]:
        return {"FMLP_IN": self.in_features, "FMLP_OUT": self.out_features,
                "FMLP_H": self.hidden, "FMLP_L_HID": self.hidden_layers,
                "FMLP_ACT": self.activation, "FMLP_OUT_ACT": self.output_activation,
                "FMLP_BIAS": int(self.bias), "FMLP_BF16": int(self.bf16), "FMLP_MT": self.mt,
                "FMLP_WARPS": self.warps, "FMLP_STAGES": self.stages,
                "FMLP_MAX_LAYERS": MAX_LAYERS,
                "FMLP_SMEM_BYTES": self.smem_bytes()}

    def describe(self) -> str:
        dt = "bf16" if self.bf16 else "fp16"
        return (f"{self.in_features}->{self.hidden}x{self.hidden_layers + 1}->"
                f"{self.out_features} {dt} act {self.activation}/{self.output_activation}"
                f"{' bias' if self.bias else ''} {self.family} {self.rows_per_warp} rows/warp "
                f"{self.warps} warps {self.stages} stages")


def check_spec(spec) -> str | None:
    """Why the forward kernel cannot compute ``spec`` at all (None: it can)."""
    if spec.dtype not in DTYPES:
        return f"dtype {spec.dtype} has no CUDA kernel (float16, bfloat16)"
    if spec.n_layers < 2:
        return "one layer: the fused kernel needs a hidden layer (n_layers >= 2)"
    hidden = spec.widths[1:-1]
    if len(set(hidden)) != 1:
        return f"hidden widths {list(hidden)} differ: the kernel takes one hidden width"
    if max(spec.widths) > MAX_WIDTH:
        return (f"width {max(spec.widths)} over the kernel's limit {MAX_WIDTH} (narrow "
                "MLPs only)")
    if spec.n_layers > MAX_LAYERS:
        return f"{spec.n_layers} layers over the kernel's limit {MAX_LAYERS}"
    bad = {spec.activation_id, spec.output_activation_id} - ACTIVATION_IDS
    if bad:
        return f"activation ids {sorted(bad)} not in the kernel"
    return None


def _registers_per_tile(in_p: int, h_p: int, out_p: int) -> int:
    """A rough count of the 32-bit registers one 16-row tile holds at the peak of the
    layer chain: a layer's input and output fragments (16 bits a value, 16 x width per
    tile over 32 lanes) and 8 fp32 accumulators."""
    return max(in_p + h_p, 2 * h_p, h_p + out_p) // 4 + 8


def tuning(spec) -> tuple[int, int]:
    """(16-row tiles per warp, warps per CTA) for ``spec``. Not timed yet (no GPU run of
    this kernel so far); the rule keeps ptxas from spilling: 16 warps (128 registers a
    thread) with as many tiles as ~64 registers of fragments allow, else 8 warps (255
    registers) of one tile. Compiled for sm_90a (ci/aot_cuda.py): hidden 16/32 at two
    tiles, 64 at one, and 128 at one tile of 8 warps do not spill; two tiles at 128,
    or four at 64, spill with gelu."""
    in_p, h_p, out_p = pad16(spec.in_features), pad16(spec.widths[1]), pad16(spec.out_features)
    per_tile = _registers_per_tile(in_p, h_p, out_p)
    if per_tile > 64:
        return 1, 8
    return next(m for m in (4, 2, 1) if m * per_tile <= 64), 16


def wgmma_warpgroups(spec) -> int:
    """Warpgroups a CTA of the wgmma forward: 4 (512 threads, at most 128 registers each)
    where the widest layer's accumulators (padded width <= 64: 32 a thread) leave room,
    else 3 (168). Measured on the H200 (h200-cuda-fwd-wgmma-*-20261203.json, 2^22
    rows): narrow-w64 0.443 / 0.463 / 0.461 ms at 4 / 3 / 2 (fp16); narrow-w128 0.943
    (spilling) / 0.860 / 0.945."""
    return 4 if max(pad16(w) for w in spec.widths) <= 64 else 3


def family_for(capability: tuple[int, int]) -> str:
    """The forward kernel family for a compute capability: wgmma on Hopper (sm_90a; it
    ran narrow-w64 0.44 ms against mma.sync's 0.50-0.53 on the H200), mma.sync elsewhere."""
    return "wgmma" if tuple(capability) == (9, 0) else "mma"


@functools.lru_cache(maxsize=256)
def forward_config(spec, smem_limit: int = SM90_SMEM,
                   family: str = "mma") -> tuple[ForwardConfig | None, str]:
    """The kernel configuration of ``family`` for ``spec`` within ``smem_limit`` bytes of
    shared memory a CTA (fewer warps, then fewer rows a warp, where the tuning's does not
    fit), or (None, why not)."""
    why = check_spec(spec)
    if why:
        return None, why
    base = dict(in_features=spec.in_features, out_features=spec.out_features,
                hidden=spec.widths[1], hidden_layers=spec.n_layers - 2,
                activation=spec.activation_id, output_activation=spec.output_activation_id,
                bias=spec.bias, bf16=spec.dtype == torch.bfloat16, family=family)
    if family == "wgmma":
        shapes = [(1, 4 * g) for g in range(wgmma_warpgroups(spec), 0, -1)]
    else:
        mt, warps = tuning(spec)
        shapes = [(m, w) for m in sorted({mt, 1}, reverse=True) for w in range(warps, 1, -1)]
    for m, w in shapes:
        cfg = ForwardConfig(**base, mt=m, warps=w)
        if cfg.smem_bytes() <= smem_limit:
            return cfg, ""
    m, w = shapes[-1]
    need = ForwardConfig(**base, mt=m, warps=w).smem_bytes()
    return None, (f"the weights and {w} warps' buffers need {need // 1024} KB of shared "
                  f"memory, over the device's {smem_limit // 1024} KB a block")


# --- the backward (sm_90a) ----------------------------------------------------------------
#: activation ids whose derivative the backward takes from the activation's output
#: (fmlp::grad_from_output: identity, relu, leaky relu, sigmoid, tanh, softplus)
GRAD_FROM_OUTPUT_IDS = frozenset(activations.get(n).id for n in (
    "none", "relu", "leaky_relu", "sigmoid", "tanh", "softplus"))
#: the backward's hidden widths (padded to 16 inside: a width the kernel takes is one of
#: these exactly), and its largest in/out width
BACKWARD_HIDDEN = (16, 32, 64)
BACKWARD_MAX_IO = 64
#: hidden-to-hidden weights the summing warpgroup's registers hold (fp32 sums of 64 x 64:
#: 32 registers a thread each, beside the first and last layers'), without / with biases
BACKWARD_MAX_HIDDEN_LAYERS = (3, 3)


@dataclass(frozen=True)
class BackwardConfig:
    """One specialization of the sm_90a backward (kernels/cuda/fused_mlp_backward_sm90.cu):
    ``chains`` chain warpgroups (2; 3 at hidden widths up to 32) and the summing one a
    CTA."""

    in_features: int
    out_features: int
    hidden: int
    hidden_layers: int
    activation: int
    output_activation: int
    bias: bool
    bf16: bool
    need_x: bool
    need_wb: bool
    chains: int = 2
    #: g^T tiles a chain: 2 lets a chain hand over the next g while the sums still read
    #: the last; backward_config takes 2 where shared memory allows
    g_bufs: int = 1

    source = BACKWARD_SM90_SOURCE
    kernel = BACKWARD_SM90_KERNEL

    @property
    def warps(self) -> int:
        return 4 * (self.chains + 1)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def _pads(self):
        return pad16(self.in_features), pad16(self.out_features), pad16(self.hidden)

    def smem_bytes(self) -> int:
        """Dynamic shared memory of one CTA, as the kernel lays it out (its kSmemBytes)."""
        in_p, out_p, h_p = self._pads()
        w0, wh, wl = 2 * h_p * in_p, 2 * h_p * h_p, 2 * out_p * h_p
        forward = w0 + self.hidden_layers * wh + (wl if self.output_activation else 0)
        transposed = (w0 if self.need_x else 0) + self.hidden_layers * wh + wl
        biases = 4 * ((self.hidden_layers + 1) * h_p + out_p) if self.bias else 0
        ones = 2 * 8 * 64 if self.bias and self.need_wb else 0
        layers = self.hidden_layers + 1  # h tiles a chain keeps: every layer's but the last
        tiles = self.chains * (2 * in_p * 64 + layers * 2 * h_p * 64 + self.g_bufs * 2 * 64 * 64)
        buffers = 2 * 2 * 4 * self.chains * 16 * (max(in_p, out_p) + 8)
        return (forward + transposed + (biases + 127) // 128 * 128 + ones + 128 + tiles
                + buffers)

    def layer_shapes(self) -> list[tuple[int, int]]:
        """(out, in) of every layer."""
        h = self.hidden
        return ([(h, self.in_features)] + [(h, h)] * self.hidden_layers
                + [(self.out_features, h)])

    def _columns(self) -> list[int]:
        """Each layer's accumulator columns in the summing warpgroup (its padded in width)."""
        h_p = pad16(self.hidden)
        return [pad16(self.in_features)] + [h_p] * (self.hidden_layers + 1)

    def partial_floats(self) -> int:
        """One CTA's partial (the kernel's kPartialFloats): per layer 128 threads' weight-
        gradient accumulators (columns / 2 each), then their 4 bias accumulators."""
        return sum(128 * (n // 2 + (4 if self.bias else 0)) for n in self._columns())

    def partial_index(self) -> list[tuple[list[int], list[int] | None]]:
        """Where each gradient lies in a partial (the kernel's fragment layout): per layer,
        the partial's indices of dW_l [out_l, in_l] (row major) and of db_l [out_l] (None
        without biases). A wgmma m64nN accumulator: thread 32 w + 4 g + t (warp w of the
        warpgroup, lane 4 g + t) holds, for each 8-column tile i, rows 16 w + g (+8) and
        columns 8 i + 2 t (+1) at d[4 i + 2 hh + j]; the bias sums are column 0 of an
        n8 accumulator (every column holds them)."""
        out, base = [], 0
        for (rows, cols), n in zip(self.layer_shapes(), self._columns()):
            per = n // 2
            w = []
            for m in range(rows):
                warp, g, hh = m // 16, m % 8, (m % 16) // 8
                for c in range(cols):
                    i, t, j = c // 8, (c % 8) // 2, c % 2
                    w.append(base + (32 * warp + 4 * g + t) * per + 4 * i + 2 * hh + j)
            base += 128 * per
            b = None
            if self.bias:
                b = [base + (32 * (m // 16) + 4 * (m % 8)) * 4 + 2 * ((m % 16) // 8)
                     for m in range(rows)]
                base += 128 * 4
            out.append((w, b))
        return out

    def defines(self) -> dict[str, int]:
        return {"FMLP_IN": self.in_features, "FMLP_OUT": self.out_features,
                "FMLP_H": self.hidden, "FMLP_L_HID": self.hidden_layers,
                "FMLP_ACT": self.activation, "FMLP_OUT_ACT": self.output_activation,
                "FMLP_BIAS": int(self.bias), "FMLP_BF16": int(self.bf16), "FMLP_MT": 1,
                "FMLP_WARPS": self.warps, "FMLP_MAX_LAYERS": MAX_LAYERS,
                "FMLP_NEED_X": int(self.need_x), "FMLP_NEED_WB": int(self.need_wb),
                "FMLP_PARTIAL_FLOATS": self.partial_floats(), "FMLP_G_BUFS": self.g_bufs,
                "FMLP_SMEM_BYTES": self.smem_bytes()}

    def describe(self) -> str:
        dt = "bf16" if self.bf16 else "fp16"
        needs = "".join(n for n, on in (("x", self.need_x), ("w", self.need_wb)) if on)
        return (f"bwd {self.in_features}->{self.hidden}x{self.hidden_layers + 1}->"
                f"{self.out_features} {dt} act {self.activation}/{self.output_activation}"
                f"{' bias' if self.bias else ''} needs {needs} {self.chains} chains "
                f"{self.g_bufs} g")


@functools.lru_cache(maxsize=256)
def backward_config(spec, need_x: bool, need_wb: bool,
                    smem_limit: int = SM90_SMEM) -> tuple[BackwardConfig | None, str]:
    """The sm_90a backward's configuration for ``spec`` and the gradients asked for, or
    (None, why not)."""
    why = check_spec(spec)
    if why:
        return None, why
    if not (need_x or need_wb):
        return None, "no gradient asked for"
    h = spec.widths[1]
    if h not in BACKWARD_HIDDEN:
        return None, (f"hidden width {h}: the CUDA backward takes "
                      f"{', '.join(map(str, BACKWARD_HIDDEN))}")
    if max(spec.in_features, spec.out_features) > BACKWARD_MAX_IO:
        return None, (f"in/out widths {spec.in_features}/{spec.out_features}: the CUDA "
                      f"backward takes up to {BACKWARD_MAX_IO}")
    acts = {spec.activation_id, spec.output_activation_id} - GRAD_FROM_OUTPUT_IDS
    if acts:
        return None, (f"activation ids {sorted(acts)}: the CUDA backward takes activations "
                      "whose derivative is a function of their output (none, relu, "
                      "leaky_relu, sigmoid, tanh, softplus)")
    most = BACKWARD_MAX_HIDDEN_LAYERS[int(spec.bias)]
    if spec.n_layers - 2 > most:
        return None, (f"{spec.n_layers - 2} hidden-to-hidden layers: the summing "
                      f"warpgroup's registers hold {most}")
    # the most chains (three at hidden <= 32, as the Gluon kernel runs), then two g^T
    # tiles a chain, that fit; the last tried (2 chains, 1 tile) is the smallest
    for chains in (3, 2) if h <= 32 else (2,):
        for g_bufs in (2, 1):
            cfg = BackwardConfig(spec.in_features, spec.out_features, h, spec.n_layers - 2,
                                 spec.activation_id, spec.output_activation_id, spec.bias,
                                 spec.dtype == torch.bfloat16, need_x, need_wb, chains, g_bufs)
            if cfg.smem_bytes() <= smem_limit:
                return cfg, ""
    return None, (f"the backward needs {cfg.smem_bytes() // 1024} KB of shared memory, "
                  f"over the device's {smem_limit // 1024} KB a block")


class BackwardParams(ctypes.Structure):
    """FmlpBackwardParams of fused_mlp_backward_sm90.cu, field for field."""

    _fields_ = [("x", ctypes.c_void_p), ("gy", ctypes.c_void_p), ("gx", ctypes.c_void_p),
                ("partial", ctypes.c_void_p), ("n_rows", ctypes.c_int64),
                ("ld_x", ctypes.c_int64), ("ld_gy", ctypes.c_int64), ("ld_gx", ctypes.c_int64),
                ("w", ctypes.c_void_p * MAX_LAYERS), ("b", ctypes.c_void_p * MAX_LAYERS)]


# --- the kernel's argument -----------------------------------------------------------------
class ForwardParams(ctypes.Structure):
    """FmlpForwardParams of fused_mlp_forward.cu, field for field."""

    _fields_ = [("x", ctypes.c_void_p), ("y", ctypes.c_void_p), ("n_rows", ctypes.c_int64),
                ("ld_x", ctypes.c_int64), ("ld_y", ctypes.c_int64),
                ("w", ctypes.c_void_p * MAX_LAYERS), ("b", ctypes.c_void_p * MAX_LAYERS)]


# --- NVRTC ---------------------------------------------------------------------------------
_MISSING = ("cuda backend: NVIDIA's Python bindings for NVRTC are not installed "
            "(pip install 'fusedmlp-xpu[cuda]': cuda-bindings and nvidia-cuda-nvrtc)")


def nvrtc_module():
    """``cuda.bindings.nvrtc`` (cuda-bindings 12.6+ and 13.x), else ``cuda.nvrtc`` (the
    layout of cuda-python before 12.6); CudaToolchainError naming the install otherwise."""
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # type: ignore[no-redef]
        except ImportError:
            raise CudaToolchainError(_MISSING) from None
    return nvrtc


def unpack(result, success, what: str, error: type[Exception] = RuntimeError):
    """The values of an NVIDIA binding call's (error, *values) result: one value alone,
    several as a list; ``error`` naming the call where the code is not ``success``."""
    err, *values = result
    if err != success:
        raise error(f"cuda backend: {what} failed: {err!r}")
    return values[0] if len(values) == 1 else values


def _check(nvrtc, result, what: str):
    return unpack(result, nvrtc.nvrtcResult.NVRTC_SUCCESS, what, CudaToolchainError)


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor); CudaToolchainError where the bindings or the library are
    missing (the bindings load libnvrtc on first call)."""
    nvrtc = nvrtc_module()
    try:
        major, minor = _check(nvrtc, nvrtc.nvrtcVersion(), "nvrtcVersion")
    except CudaToolchainError:
        raise
    except Exception as e:  # the shared library itself missing
        raise CudaToolchainError(f"{_MISSING}; loading NVRTC: {type(e).__name__}: {e}") from None
    return int(major), int(minor)


def arch_for(capability: tuple[int, int]) -> str:
    """NVRTC's --gpu-architecture for a device: sm_90a on Hopper (its full instruction
    set, for later wgmma kernels), else sm_XY."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def cache_dir() -> Path:
    root = os.environ.get("FUSEDMLP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusedmlp_xpu")
    return Path(root) / "cuda"


def compile_options(defines: dict[str, int], arch: str) -> list[str]:
    # -v: ptxas's registers, spills and shared memory go to the program log (aot_cuda.py);
    # -default-device: unannotated functions are device code, as the generic lambdas of
    # the backward need (the H200's NVRTC rejected them as host functions in JIT mode);
    # -lineinfo: compute-sanitizer names source lines, not only SASS offsets (the backward's
    # racecheck report on the H200 gave offsets alone); it leaves the code unchanged
    return [f"--gpu-architecture={arch}", "--std=c++17", "--ptxas-options=-v", "-default-device",
            "-lineinfo", *(f"-D{k}={v}" for k, v in sorted(defines.items()))]


def cache_key(source: bytes, headers: dict[str, bytes], options: list[str],
              version: tuple[int, int]) -> str:
    """What a cubin depends on: the source, every header, the options (arch included)
    and the NVRTC version."""
    h = hashlib.sha256(source)
    for name in sorted(headers):
        h.update(name.encode() + b"\0" + headers[name])
    h.update("\0".join(options).encode())
    h.update(f"nvrtc {version[0]}.{version[1]}".encode())
    return h.hexdigest()[:24]


@dataclass(frozen=True)
class Compiled:
    cubin: bytes
    log: str  # NVRTC's and ptxas's messages (registers, spills)
    key: str
    cached: bool  # read from the disk cache, not compiled by this call


_memo: dict[str, Compiled] = {}
_lock = threading.Lock()


def compile_cubin(source_path: Path, defines: dict[str, int], arch: str) -> Compiled:
    """The cubin of ``source_path`` with ``defines`` for ``arch``, from this process's
    memo, the disk cache, or NVRTC (then written to the cache). The kernel headers of
    kernels/cuda are handed to NVRTC by name: no include path is needed."""
    source = source_path.read_bytes()
    headers = {h.name: h.read_bytes() for h in HEADERS}
    options = compile_options(defines, arch)
    key = cache_key(source, headers, options, nvrtc_version())
    with _lock:
        hit = _memo.get(key)
        if hit is not None:
            return hit
        cubin_path = cache_dir() / f"{source_path.stem}-{key}.cubin"
        log_path = cubin_path.with_suffix(".log")
        if cubin_path.exists() and log_path.exists():
            done = Compiled(cubin_path.read_bytes(), log_path.read_text(), key, True)
        else:
            cubin, log = _nvrtc(source, source_path.name, headers, options)
            _write_atomic(log_path, log.encode())
            _write_atomic(cubin_path, cubin)  # last: its presence means both are whole
            done = Compiled(cubin, log, key, False)
        _memo[key] = done
        return done


def _nvrtc(source: bytes, name: str, headers: dict[str, bytes],
           options: list[str]) -> tuple[bytes, str]:
    nvrtc = nvrtc_module()
    names = sorted(headers)
    prog = _check(nvrtc, nvrtc.nvrtcCreateProgram(
        source, name.encode(), len(names), [headers[n] for n in names],
        [n.encode() for n in names]), "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        size = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CudaToolchainError(
                f"cuda backend: NVRTC could not compile {name} ({' '.join(options)}):\n"
                f"{log[-4000:]}")
        size = _check(nvrtc, nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _write_atomic(path: Path, data: bytes) -> None:
    """Concurrent first uses never read a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def ptxas_stats(log: str) -> dict[str, int]:
    """Registers, spill bytes (stores, loads), stack frame and static shared memory from
    the ptxas -v lines of an NVRTC log (0 where a number is absent)."""
    def num(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return {"registers": num(r"Used (\d+) registers"),
            "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"),
            "stack": num(r"(\d+) bytes stack frame"),
            "static_smem": num(r"(\d+) bytes smem")}


def compile_backward(cfg: BackwardConfig, arch: str) -> Compiled:
    if arch != "sm_90a":
        raise CudaToolchainError(f"cuda backend: the backward needs sm_90a, not {arch}")
    return compile_cubin(cfg.source, cfg.defines(), arch)


def compile_forward(cfg: ForwardConfig, arch: str) -> Compiled:
    if cfg.family == "wgmma" and arch != "sm_90a":
        raise CudaToolchainError(f"cuda backend: the wgmma forward needs sm_90a, not {arch}")
    return compile_cubin(cfg.source, cfg.defines(), arch)
