"""The ``sycl`` backend: the SYCL kernels of ``kernels/sycl`` behind a ctypes C ABI.

Kernel chain: ``fmlp_fwd_<t>`` / ``fmlp_bwd_rows_<t>`` / ``fmlp_wgrad_<t>``
(kernels/sycl/fused_mlp.cpp) -> ``fmlp_sycl_forward`` / ``fmlp_sycl_backward_rows`` /
``fmlp_sycl_weight_grads`` (kernels/sycl/fmlp_sycl_shim.cpp) -> ``SyclBackend``.

- The host shim is compiled on first use with the system C++ compiler against the SYCL
  headers of the pip-installed ``intel-sycl-rt`` wheel, linked with ``-lsycl`` and cached
  per user, package and runtime version under ``~/.cache/fusedmlp_xpu``. The kernels are
  compiled from source by the SYCL runtime (kernel_compiler extension) once per process
  and device, inside the shim.
- ``xpu`` tensors: their USM pointers, on PyTorch's current XPU queue, never a private one.
- ``cpu`` tensors: a dpctl in-order queue on Intel's OpenCL CPU device (``opencl:cpu``).
  Verification only: it runs the same kernel source, so CI checks it without a GPU.
  Only used when forced (``FUSEDMLP_BACKEND=sycl`` or ``backend="sycl"``).

No import here needs the SYCL runtime, dpctl or an XPU build of torch: everything
optional is looked up lazily and reported by ``available()``/``supports()``.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from .. import activations
from . import Backend, memory, saved_widths
from . import sycl_esimd as esimd
from .kernel_files import kernel_dir

KERNEL_DIR = kernel_dir("sycl")
KERNEL_SOURCE = KERNEL_DIR / "fused_mlp.cpp"
PARAMS_HEADER = KERNEL_DIR / "fused_mlp_params.h"
SHIM_SOURCE = KERNEL_DIR / "fmlp_sycl_shim.cpp"


def _header_define(name: str, default: int) -> int:
    """A #define of fused_mlp_params.h, so the limits below have one source of truth."""
    try:
        m = re.search(rf"^#define {name} (\d+)", PARAMS_HEADER.read_text(), re.M)
    except OSError:
        return default
    return int(m.group(1)) if m else default


# Limits of the fused kernels (widths of the local-memory tile; by-value argument size)
MAX_WIDTH = _header_define("FMLP_MAX_WIDTH", 128)
MAX_LAYERS = _header_define("FMLP_MAX_LAYERS", 16)
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
ABI_VERSION = 3  # fmlp_sycl_abi_version() of kernels/sycl/fmlp_sycl_shim.cpp

CPU_DEVICE = "opencl:cpu"
#: path of an ahead-of-time (icpx) build of the shim with the kernels inside
AOT_LIB_ENV = "FUSEDMLP_SYCL_LIB"
_MAX_1550_NAMES = ("Max 1550", "Data Center GPU Max")


class SyclToolchainError(RuntimeError):
    """The SYCL runtime, its headers or a C++ compiler is missing or broken."""


# --- locating the runtime and the compiler ----------------------------------------------
def _dist_file(dist: str, rel: str) -> Path | None:
    """A file of an installed wheel (e.g. intel-sycl-rt's include/sycl/sycl.hpp), or None."""
    try:
        files = md.distribution(dist).files or []
    except md.PackageNotFoundError:
        return None
    name = rel.rsplit("/", 1)[-1]
    for f in files:
        if f.name != name:
            continue
        # wheel data files are recorded relative to site-packages ("../../../include/...");
        # normalise without following symlinks (libsycl.so is one)
        p = Path(os.path.normpath(md.distribution(dist).locate_file(f)))
        if p.as_posix().endswith(rel) and p.exists():
            return p
    return None


def _toolchain() -> dict:
    """Paths and versions the shim build needs; raises SyclToolchainError naming what is missing."""
    missing = []
    try:
        rt_version = md.version("intel-sycl-rt")
    except md.PackageNotFoundError:
        rt_version = None
        missing.append("the intel-sycl-rt wheel (pip install 'fusedmlp-xpu[sycl]', or dpctl)")
    header = _dist_file("intel-sycl-rt", "include/sycl/sycl.hpp") if rt_version else None
    libsycl = _dist_file("intel-sycl-rt", "lib/libsycl.so") if rt_version else None
    if rt_version and header is None:
        missing.append("SYCL headers (include/sycl/sycl.hpp) in the intel-sycl-rt wheel")
    if rt_version and libsycl is None:
        missing.append("libsycl.so in the intel-sycl-rt wheel")
    cxx = shutil.which(os.environ.get("CXX", "g++"))
    if cxx is None:
        missing.append(f"a C++17 compiler ({os.environ.get('CXX', 'g++')} not on PATH; set CXX)")
    for p in (KERNEL_SOURCE, PARAMS_HEADER, SHIM_SOURCE):
        if not p.exists():
            missing.append(f"{p} (the package's kernel sources: reinstall fusedmlp-xpu)")
    if missing:
        raise SyclToolchainError("sycl backend: missing " + "; ".join(missing))
    return {
        "cxx": cxx, "rt_version": rt_version,
        "include": header.parent.parent, "libdir": libsycl.parent,
    }


def _cache_dir() -> Path:
    root = os.environ.get("FUSEDMLP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fusedmlp_xpu")
    return Path(root) / "sycl"


def _build_shim(tc: dict) -> Path:
    """Compile fmlp_sycl_shim.cpp once per (sources, compiler, runtime version); return the .so."""
    from .._version import __version__

    key = hashlib.sha256()
    for p in (SHIM_SOURCE, PARAMS_HEADER):
        key.update(p.read_bytes())
    key.update(f"{tc['cxx']}|{tc['include']}|{tc['rt_version']}".encode())
    out_dir = _cache_dir() / f"{__version__}-sycl{tc['rt_version']}-{key.hexdigest()[:12]}"
    lib = out_dir / "libfmlp_sycl.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    # rpath to the wheel's lib dir: the same libsycl.so.9 that dpctl and torch load,
    # so a sycl::queue* from either is an object of the runtime the shim calls into.
    cmd = [tc["cxx"], "-std=c++17", "-O2", "-fPIC", "-shared", str(SHIM_SOURCE),
           f"-I{KERNEL_DIR}", f"-I{tc['include']}", f"-L{tc['libdir']}", "-lsycl",
           f"-Wl,-rpath,{tc['libdir']}"]
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        res = subprocess.run(cmd + ["-o", tmp], capture_output=True, text=True)
        if res.returncode != 0:
            raise SyclToolchainError(
                f"sycl backend: building the host shim failed ({' '.join(cmd)}):\n"
                f"{res.stderr[-4000:]}")
        os.replace(tmp, lib)  # atomic: concurrent first uses never load a half-written file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


# --- the loaded shim ------------------------------------------------------------------
_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_I32 = ctypes.c_int


class _Shim:
    def __init__(self, path: Path):
        self.lib = lib = ctypes.CDLL(str(path))
        if lib.fmlp_sycl_abi_version() != ABI_VERSION:  # a stale $FUSEDMLP_SYCL_LIB build
            raise SyclToolchainError(
                f"sycl backend: {path} has C ABI {lib.fmlp_sycl_abi_version()}, this package "
                f"expects {ABI_VERSION}: rebuild it from kernels/sycl")
        lib.fmlp_sycl_last_error.restype = ctypes.c_char_p
        lib.fmlp_sycl_compile.argtypes = [_P, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p]
        lib.fmlp_sycl_forward.argtypes = [
            _P, _I32, _I64, _I32, _P, _P, _I64, _I64, _P, _P, _I32, _I32, _P, _P]
        lib.fmlp_sycl_backward_rows.argtypes = [
            _P, _I32, _I64, _I32, _P, _P, _I64, _I64, _P, _P, _I32, _I32, _P, _P]
        lib.fmlp_sycl_weight_grads.argtypes = [
            _P, _I32, _I64, _I32, _I32, _P, _P, _I64, _I64, _I32, _P, _P]
        lib.fmlp_sycl_build.argtypes = [
            _P, _I32, ctypes.c_char_p, _I64, _I32, _P, _P, ctypes.c_char_p, ctypes.c_char_p,
            ctypes.POINTER(_I64)]
        lib.fmlp_sycl_launch.argtypes = [_P, _I64, ctypes.c_char_p, _I64, _I64, _I32, _P, _P]
        # (an ahead-of-time build ignores the sources: its kernels are inside it)
        self.source = KERNEL_SOURCE.read_bytes() if KERNEL_SOURCE.exists() else b""
        self.header = PARAMS_HEADER.read_bytes() if PARAMS_HEADER.exists() else b""

    def call(self, fn: str, *args) -> None:
        if getattr(self.lib, fn)(*args) != 0:
            raise RuntimeError(f"sycl backend: {fn}: {self.lib.fmlp_sycl_last_error().decode()}")

    def build(self, queue: int, source: bytes, names: list[str], *, spirv: bool = False,
              includes: dict[str, bytes] | None = None, options: list[str] = ()) -> "Bundle":
        """Build SYCL source (or SPIR-V bytes with ``spirv=True``) for the queue's device;
        the bundle holds the free-function kernels ``names``. Every call builds: cache it."""
        inc = list((includes or {}).items())
        inc_names = (ctypes.c_char_p * max(len(inc), 1))(*[k.encode() for k, _ in inc])
        inc_srcs = (ctypes.c_char_p * max(len(inc), 1))(*[v for _, v in inc])
        handle = _I64(-1)
        self.call("fmlp_sycl_build", queue, int(spirv), source, len(source), len(inc),
                  ctypes.cast(inc_names, _P), ctypes.cast(inc_srcs, _P),
                  "\n".join(options).encode(), "\n".join(names).encode(), ctypes.byref(handle))
        return Bundle(self, handle.value, tuple(names))

    def compile(self, queue: int, options: str = "") -> None:
        """Kernels for the queue's device; the shim caches them per process (once per device)."""
        self.call("fmlp_sycl_compile", queue, self.source, self.header, options.encode())


class Bundle:
    """Kernels built by ``_Shim.build`` for one device; ``launch`` passes each argument
    by its bytes (a ctypes scalar or structure) or as a USM pointer (``ctypes.c_void_p``
    or a plain int)."""

    def __init__(self, sh: _Shim, handle: int, names: tuple[str, ...]):
        self.shim, self.handle, self.names = sh, handle, names

    def launch(self, queue: int, name: str, global_size: int, local_size: int, *args) -> None:
        if global_size % max(local_size, 1):
            raise ValueError(f"global_size {global_size} is not a multiple of local_size "
                             f"{local_size}")
        vals = [a if isinstance(a, (ctypes._SimpleCData, ctypes.Structure)) else _P(a)
                for a in args]
        ptrs = (_P * max(len(vals), 1))(*[ctypes.addressof(v) for v in vals])
        sizes = (_I64 * max(len(vals), 1))(
            *[-1 if isinstance(v, _P) else ctypes.sizeof(v) for v in vals])
        self.shim.call("fmlp_sycl_launch", queue, self.handle, name.encode(), global_size,
                       local_size, len(vals), ctypes.cast(ptrs, _P), ctypes.cast(sizes, _P))


_shim: _Shim | None = None
_cpu_queue = None
_cpu_queue_error: SyclToolchainError | None = None  # asked once per process, like the queue
_lock = threading.Lock()


def shim() -> _Shim:
    """The loaded host shim: $FUSEDMLP_SYCL_LIB (an ahead-of-time icpx build, see
    kernels/sycl/README.md; never tried here) or the g++ build, made on first use."""
    global _shim
    with _lock:
        if _shim is None:
            prebuilt = os.environ.get(AOT_LIB_ENV)
            _shim = _Shim(Path(prebuilt) if prebuilt else _build_shim(_toolchain()))
        return _shim


def cpu_queue():
    """The process's dpctl in-order queue on opencl:cpu (in order: each launch reads the
    previous one's output without events)."""
    global _cpu_queue, _cpu_queue_error
    with _lock:
        if _cpu_queue_error is not None:
            raise _cpu_queue_error
        if _cpu_queue is None:
            if "OCL_ICD_FILENAMES" not in os.environ:
                # The wheel's ICD file names a placeholder path; point the loader at the
                # real library (must happen before the runtime first enumerates devices).
                icd = _dist_file("intel-opencl-rt", "lib/libintelocl.so")
                if icd is not None:
                    os.environ["OCL_ICD_FILENAMES"] = str(icd)
            # The CPU compiler's vectorizer (work-items across SIMD lanes) spends over 10
            # minutes on one configuration of the emulated ESIMD kernels, whose work-items
            # each hold register tiles of thousands of elements; off, the build takes ~12 s
            # and the portable kernels stay correct (this device is for verification).
            os.environ.setdefault("CL_CONFIG_CPU_VECTORIZER_MODE", "1")
            # The emulated ESIMD kernels hold their register tiles on each work-item's
            # stack: the h128 backward (2 row groups x 8 tiles, and their temporaries)
            # overran the CPU runtime's default stack now and then (an abort in the
            # kernel); 128 MiB a thread, reserved, not touched
            os.environ.setdefault("CL_CONFIG_STACK_SIZE", str(128 << 20))
            try:
                import dpctl
            except ImportError:
                _cpu_queue_error = SyclToolchainError(
                    "sycl backend on cpu: dpctl is not installed "
                    "(pip install 'fusedmlp-xpu[sycl]')")
                raise _cpu_queue_error from None
            try:
                _cpu_queue = dpctl.SyclQueue(CPU_DEVICE, property="in_order")
            except Exception as e:
                _cpu_queue_error = SyclToolchainError(
                    f"sycl backend on cpu: no {CPU_DEVICE} device ({e}); install intel-opencl-rt "
                    "and set OCL_ICD_FILENAMES to its lib/libintelocl.so")
                raise _cpu_queue_error from None
        return _cpu_queue


# --- where the memory lives -----------------------------------------------------------
class _XpuLaunch:
    """xpu tensors are USM device allocations already: pass their pointers, run on
    PyTorch's current queue, stay asynchronous (the caching allocator is stream-ordered,
    so temporaries freed after the launch are not reused before it runs)."""

    def __init__(self, device: torch.device):
        self.queue = torch.xpu.current_stream(device).sycl_queue
        # Temporaries (contiguous copies, scratch) must live until their launch is
        # enqueued: freed earlier, the next allocation here could reuse their block.
        self._keep: list[torch.Tensor] = []

    def input(self, t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
        self._keep.append(t)
        return t.data_ptr(), t.stride()

    def output(self, t: torch.Tensor) -> int:
        return t.data_ptr()

    def scratch(self, rows: int, cols: int, like: torch.Tensor) -> int:
        t = torch.empty(rows, cols, device=like.device, dtype=like.dtype)
        self._keep.append(t)
        return t.data_ptr()

    def finish(self) -> None:
        self._keep.clear()  # enqueued; the caching allocator orders reuse after it


class _CpuLaunch:
    """CPU tensors live in ordinary pageable memory, which is not USM: an OpenCL/SYCL
    kernel cannot dereference it. So every input is copied into a USM shared allocation
    on the dpctl queue, kernels write USM staging buffers, and ``finish`` drains the queue
    and copies the outputs back into the tensors the caller allocated."""

    def __init__(self):
        import dpctl.memory

        self.queue_obj = cpu_queue()
        self.queue = self.queue_obj.addressof_ref()  # the sycl::queue* behind the dpctl queue
        self._usm = dpctl.memory.MemoryUSMShared
        self._keep: list = []
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _alloc(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat CPU tensor aliasing fresh USM shared memory (kept alive until finish)."""
        size = torch.empty((), dtype=dtype).element_size()
        mem = self._usm(max(numel * size, 1), queue=self.queue_obj)
        self._keep.append(mem)
        return torch.frombuffer(mem, dtype=torch.uint8)[: numel * size].view(dtype)

    def input(self, t: torch.Tensor) -> tuple[int, tuple[int, ...]]:
        # Keep the caller's strides where they do not overlap, so the kernels' strided
        # loads run here too, not only contiguous ones.
        if t.numel() and _nested_strides(t):
            span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
            u = self._alloc(span, t.dtype).as_strided(t.shape, t.stride())
        else:
            u = self._alloc(t.numel(), t.dtype).view(t.shape)
        u.copy_(t)
        return u.data_ptr(), u.stride()

    def output(self, t: torch.Tensor) -> int:
        u = self._alloc(t.numel(), t.dtype).view(t.shape)
        # start from the caller's contents (NaN under the test suite's poisoning), so an
        # element the kernel fails to write stays visible after the copy back
        u.copy_(t)
        self._back.append((t, u))
        return u.data_ptr()

    def scratch(self, rows: int, cols: int, like: torch.Tensor) -> int:
        return self._alloc(rows * cols, like.dtype).data_ptr()

    def finish(self) -> None:
        self.queue_obj.wait()
        for t, u in self._back:
            t.copy_(u)
        self._back.clear()
        self._keep.clear()


def _nested_strides(t: torch.Tensor) -> bool:
    """Whether t's elements never share memory (each dim's stride steps past the whole
    span of the smaller ones), so a copy can keep its strides."""
    reach = 0
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


def _launcher(device: torch.device):
    if device.type == "xpu":
        return _XpuLaunch(device)
    return _CpuLaunch()


def _ptrs(values) -> ctypes.Array:
    return (ctypes.c_void_p * len(values))(*values)


def _widths(spec) -> ctypes.Array:
    return (ctypes.c_int32 * len(spec.widths))(*spec.widths)


def is_max_1550(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` is an Intel Data Center GPU Max (1550), from its properties."""
    name = str(getattr(torch.xpu.get_device_properties(device), "name", ""))
    return any(n in name for n in _MAX_1550_NAMES), name or "unnamed XPU device"


# --- the backend ------------------------------------------------------------------------
def _side_by_side(zs, n, like):
    return torch.cat(zs, dim=-1) if zs else like.new_empty(n, 0)


class SyclBackend(Backend):
    name = "sycl"
    device_types = ("xpu", "cpu")

    def available(self):
        if os.environ.get(AOT_LIB_ENV):
            lib = Path(os.environ[AOT_LIB_ENV])
            if not lib.exists():
                return False, f"sycl backend: {AOT_LIB_ENV}={lib} does not exist"
            what = f"SYCL kernels, ahead-of-time build {lib}"
        else:
            try:
                tc = _toolchain()
            except SyclToolchainError as e:
                return False, str(e)
            what = (f"SYCL kernels (intel-sycl-rt {tc['rt_version']}; host shim built with "
                    f"{Path(tc['cxx']).name} on first use)")
        has_xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
        try:
            import dpctl  # noqa: F401

            has_dpctl = True
        except ImportError:
            has_dpctl = False
        if not (has_xpu or has_dpctl):
            return False, ("sycl backend: no XPU in this torch build and dpctl not installed "
                           "(pip install 'fusedmlp-xpu[sycl]' for the opencl:cpu device)")
        return True, what

    def supports(self, spec, device):
        if spec.dtype not in DTYPE_CODES:
            return False, f"{spec.dtype} has no SYCL kernel (float32, float16, bfloat16)"
        if spec.n_layers > MAX_LAYERS:
            return False, f"{spec.n_layers} layers over the fused kernel's limit {MAX_LAYERS}"
        if max(spec.widths) > MAX_WIDTH:
            return False, (f"width {max(spec.widths)} over the fused kernel's limit "
                           f"{MAX_WIDTH} (wide MLPs: one GEMM per layer, not this kernel)")
        kernel = self._kernel_reason(spec)
        if device.type == "xpu":
            ok, dev_name = is_max_1550(device)
            if not ok:
                return False, (f"{dev_name} is not a Max 1550: the SYCL kernels are only picked "
                               "there; triton serves other Intel GPUs")
            return True, f"{kernel} on {dev_name}, PyTorch's current XPU queue"
        if device.type == "cpu":
            try:
                q = cpu_queue()
            except SyclToolchainError as e:
                return False, str(e)
            return True, (f"{kernel} on {CPU_DEVICE} ({q.sycl_device.name}) with USM copies"
                          f"{', ESIMD emulated in plain SYCL' if self._esimd(spec) else ''}: "
                          "for verification, only when forced")
        return False, f"does not run on {device.type}"

    @staticmethod
    def _esimd(spec):
        """The ESIMD configuration that runs ``spec``, or None: the portable kernels."""
        return esimd.config_for(spec)[0] if esimd.enabled() else None

    @staticmethod
    def _kernel_reason(spec) -> str:
        cfg, why = esimd.config_for(spec)
        if not esimd.enabled():
            return f"portable SYCL kernel ({esimd.ENABLE_ENV}=0)"
        return why if cfg is not None else f"portable SYCL kernel (not ESIMD: {why})"

    @staticmethod
    def _device_key(device: torch.device):
        return ("xpu", device.index) if device.type == "xpu" else ("cpu",)

    # Weights go to the forward kernel transposed ([in, out], see fused_mlp.cpp) and to
    # the backward as they are ([out, in]): a copy of a few KB per layer at most.
    def forward(self, x, weights, biases, spec, save):
        cfg = self._esimd(spec)
        if cfg is not None:
            return esimd.forward(shim(), _launcher(x.device), self._device_key(x.device),
                                 x.device.type != "xpu", x, weights, biases, spec, cfg, save)
        n = x.shape[0]
        y = memory.new_empty(n, spec.out_features, like=x)
        L = spec.n_layers
        save_out = spec.output_activation != "none"
        # the kernel writes each layer's z to its own [n, w] buffer; the Backend contract
        # returns them side by side in one [n, S] tensor (one concatenating copy)
        saved = [memory.new_empty(n, w, like=x) for w in spec.widths[1:-1]] if save else []
        if save and save_out:
            saved.append(memory.new_empty(n, spec.out_features, like=x))
        if n == 0:
            return y, _side_by_side(saved, n, x) if save else None
        lau = _launcher(x.device)
        sh = shim()
        sh.compile(lau.queue)
        x_ptr, (x_rs, x_cs) = lau.input(x)
        w_ptrs = [lau.input(w.t().contiguous())[0] for w in weights]
        b_ptrs = None if biases is None else _ptrs([lau.input(b.contiguous())[0] for b in biases])
        z_ptrs = None
        if save:
            z = [lau.output(t) for t in saved]
            z_ptrs = _ptrs(z + [None] * (L - len(z)))
        sh.call("fmlp_sycl_forward", lau.queue, DTYPE_CODES[spec.dtype], n, L, _widths(spec),
                x_ptr, x_rs, x_cs, _ptrs(w_ptrs), b_ptrs, spec.activation_id,
                spec.output_activation_id, lau.output(y), z_ptrs)
        lau.finish()
        return y, _side_by_side(saved, n, x) if save else None

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        if saved is None:
            _, saved = self.forward(x, weights, biases, spec, save=True)
        cfg = self._esimd(spec)
        if cfg is not None:
            return esimd.backward(shim(), _launcher(x.device), self._device_key(x.device),
                                  x.device.type != "xpu", grad_y, x, weights, biases, saved,
                                  spec, cfg, needs)
        need_x, need_w, need_b = needs
        need_b = need_b and biases is not None
        saved = list(saved.split(saved_widths(spec), dim=-1))
        n, L = x.shape[0], spec.n_layers
        gx = memory.new_empty(n, spec.in_features, like=x) if need_x else None
        gw = [memory.new_empty(w.shape[0], w.shape[1], like=x) for w in weights] if need_w else []
        gb = [memory.new_empty(w.shape[0], like=x) for w in weights] if need_b else []
        if not (need_x or need_w or need_b):
            return gx, gw, gb
        lau = _launcher(x.device)
        sh = shim()
        sh.compile(lau.queue)
        dt = DTYPE_CODES[spec.dtype]
        w_ptrs = [lau.input(w.contiguous())[0] for w in weights]
        # saved z of layer l (the output layer's only when its activation is not none)
        z_ptrs = [lau.input(z.contiguous())[0] for z in saved] + [None] * (L - len(saved))
        dz_ptrs = [lau.scratch(max(n, 1), w, x) for w in spec.widths[1:]] \
            if need_w or need_b else None
        if n > 0:
            gy_ptr, (gy_rs, gy_cs) = lau.input(grad_y)
            sh.call("fmlp_sycl_backward_rows", lau.queue, dt, n, L, _widths(spec), gy_ptr,
                    gy_rs, gy_cs, _ptrs(w_ptrs), _ptrs(z_ptrs), spec.activation_id,
                    spec.output_activation_id, lau.output(gx) if need_x else None,
                    None if dz_ptrs is None else _ptrs(dz_ptrs))
        if dz_ptrs is not None:
            x_ptr, (x_rs, x_cs) = lau.input(x) if n > 0 else (None, (0, 0))
            hidden = activations.ACTIVATIONS[spec.activation].id
            for l in range(L):
                # the layer's input h_l: x, or act(z_{l-1}) recomputed in the kernel
                src, rs, cs, act = (x_ptr, x_rs, x_cs, 0) if l == 0 else \
                    (z_ptrs[l - 1], spec.widths[l], 1, hidden)
                sh.call("fmlp_sycl_weight_grads", lau.queue, dt, n, spec.widths[l + 1],
                        spec.widths[l], dz_ptrs[l], src, rs, cs, act,
                        lau.output(gw[l]) if need_w else None,
                        lau.output(gb[l]) if need_b else None)
        lau.finish()
        return gx, gw, gb
