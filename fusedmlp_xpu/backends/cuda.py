"""The ``cuda`` backend: CUDA C++ kernels of ``kernels/cuda``, compiled at run time by
NVRTC, loaded through the CUDA driver API (NVIDIA's Python bindings) and launched through
the driver library itself (ctypes: three calls a launch).

Kernel chain: ``fmlp_forward_sm90`` (kernels/cuda/fused_mlp_forward_sm90.cu, wgmma) on
sm_90, ``fmlp_forward`` (fused_mlp_forward.cu, mma.sync) elsewhere -> ``cuda_build``
(configuration, NVRTC, disk cache) -> ``CudaBackend.forward`` (this file: module load in
torch's context, launch on torch's current stream).

What it runs today: the narrow fully-fused forward (every layer in one kernel; in/out
features and the one hidden width <= 128, >= 2 layers, fp16/bf16 with fp32 accumulation,
every registry activation, optional biases) on compute capability 8.0 and later. Training
(``fmlp_backward_sm90``, kernels/cuda/fused_mlp_backward_sm90.cu: one kernel that
computes the forward again from x and sums every weight gradient on chip) passed its
float64 tests on an H200 (tests/test_cuda_backward.py, 122 of 122, 2026-12-05) but has not
been through compute-sanitizer or timed beside triton there: training calls are refused
(``train_support``) unless ``FUSEDMLP_CUDA_BACKWARD=1`` or the spec is in
``MEASURED_TRAIN_WINS``, and then only on sm_90 at hidden width 16, 32 or 64 with in/out widths <= 64 and activations whose
derivative is a function of their output. Its backward always recomputes: ``saves`` is
False, so ``recompute=False`` raises.

When it is chosen: for inference where it was measured faster than triton, device and
host time (``MEASURED_WINS``: empty until the ctypes launch is timed on a GPU, below), or
when forced (``FUSEDMLP_BACKEND=cuda``, ``backend="cuda"``). ``supports`` says what the
kernel can compute (a forced backend runs it); ``preferred`` says whether the dispatcher
takes it unforced.

A launch does no allocation through the driver and no synchronization, so forwards
capture in CUDA graphs; the first call of a configuration compiles (or reads the disk
cache) and loads the module, so warm up before capturing.
"""
from __future__ import annotations

import ctypes
import functools
import sys
import threading
import time

import torch

from .. import envvars
from . import Backend, cuda_build, device_guard, memory, notes

#: Measured inference wins over triton, by (compute capability, dtype, hidden width,
#: activation, output activation, bias): the benchmark result file that showed it. A spec
#: not in it runs here only when forced. H200, 2^22 rows, fp16 / bf16, ms (triton beside it
#: in the same process, h200-cuda-fwd-*-20261204*.json):
#: - narrow-w64 (hidden 64, relu, no bias): 0.331 / 0.314 against 0.367 / 0.351; from a CUDA
#:   graph at 2^16-2^20 rows 2-9% faster (h200-bench-narrow-w64-inference-cuda-20261204a.json);
#:   paper-table1 (11 hidden layers, 2^20 rows) 0.172 against 0.205, nerf-density (in 32,
#:   out 16, one hidden layer) 0.033 against 0.037. With the ctypes launch (launch(),
#:   below), fusedmlp bench, fp16 / bf16, ms a call (h200-bench-cuda-narrow-w64-20261205b):
#:   from Python 0.080 / 0.091 against 0.051 / 0.059 at 2^16 rows, 0.099 / 0.053 against
#:   0.063 / 0.032 at 2^18, 0.094 / 0.089 against 0.098 / 0.086 at 2^20, 0.353 / 0.344
#:   against 0.379 / 0.373 at 2^22; from a CUDA graph slower at 2^16-2^20 (0.0134 against
#:   0.0101 at 2^16). A call still costs ~25 us more host time than triton's and wins only
#:   where the device time is long: not taken.
#: - narrow-w128 (hidden 128): 0.798 / 0.766 against 0.840 / 0.820 at 2^22 rows, but slower
#:   from a graph at 2^16 (0.021 against 0.017 ms) and 2^18 (0.061 against 0.058): the
#:   choice is per spec, not per row count, so not taken.
#: - narrow-w32 (hidden 32): 0.079 against 0.073 at 2^20 rows. Not taken.
#: Biases and other activations were not timed.
MEASURED_WINS: dict[tuple, str] = {}

#: Measured train-step wins over triton (the forward and the backward kernel), keyed as
#: MEASURED_WINS: the run that showed it. A spec in it trains here unforced, without
#: FUSEDMLP_CUDA_BACKWARD; every other spec trains here only forced, with it. Empty: on the
#: H200 narrow-w64's train step (relu, no bias) ran slower than triton's at every row count,
#: fp16 / bf16, ms: from a CUDA graph 0.076 / 0.076 against 0.050 / 0.049 at 2^16 rows,
#: 0.146 / 0.147 against 0.113 / 0.113 at 2^18, 0.409 / 0.401 against 0.378 / 0.372 at
#: 2^20; from Python 1.544 / 1.482 against 1.479 / 1.437 at 2^22
#: (h200-bench-cuda-train-narrow-w64-20261205c); and racecheck reported hazards in it
#: (h200-cuda-bwd-racecheck-20261205a).
MEASURED_TRAIN_WINS: dict[tuple, str] = {}


def win_key(capability: tuple[int, int], spec) -> tuple:
    """The MEASURED_WINS key of ``spec`` on a device of ``capability``."""
    return (tuple(capability), spec.dtype, spec.widths[1], spec.activation,
            spec.output_activation, spec.bias)


#: FUSEDMLP_CUDA_BACKWARD=1: training calls may run the sm_90 backward kernel (right against
#: float64 on an H200; not yet sanitized or timed there: for the runs that check it)
BACKWARD_ENV = "FUSEDMLP_CUDA_BACKWARD"

#: The run where compute-sanitizer's racecheck found the backward kernel clean; None: the
#: kernel refuses to train even forced. Racecheck had paired the weight, bias and ones
#: staging stores with mbar_init within one launch of one configuration
#: (h100-cuda-bwd-race-one1-case2-20261205e); with the barriers initialised after a
#: __syncthreads that follows the staging, five configurations (one a process, two launches
#: each: widths 64 relu fp16 at 65 and 1037 rows, 3-16-16-5 tanh/sigmoid bf16 at 1 and 65,
#: the sdf net) report 0 hazards, and the 80 float64 cases pass (h100-cuda-bwd-tests-20261205g).
#: synccheck was not re-run (its barrier table overflowed before).
RACECHECK_CLEAN: str | None = "h100-cuda-bwd-race-one-20261205g"
_RACE = ("the CUDA C++ backward is held back until compute-sanitizer's racecheck reports it "
         "clean (cuda.RACECHECK_CLEAN names no racecheck run); train with backend='triton' "
         "or leave the backend unforced")

_TRAINING = ("inference only (its backward kernel, sm_90, is not yet sanitized or timed on "
             f"a GPU: off unless {BACKWARD_ENV}=1); train with backend='triton' or leave "
             "the backend unforced")
_SAVES = ("cuda backend: recompute=False is not supported: its backward computes the "
          "forward again from x (leave recompute unset, or True)")


def driver_module():
    """``cuda.bindings.driver`` (cuda-bindings 12.6+, 13.x) or ``cuda.cuda`` (cuda-python
    before 12.6); CudaToolchainError naming the install otherwise."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[no-redef]
        except ImportError:
            raise cuda_build.CudaToolchainError(
                "cuda backend: NVIDIA's Python bindings for the CUDA driver are not "
                "installed (pip install 'fusedmlp-xpu[cuda]')") from None
    return driver


def _check(driver, result, what: str):
    return cuda_build.unpack(result, driver.CUresult.CUDA_SUCCESS, what)


# --- loaded kernels --------------------------------------------------------------------
class LoadedKernel:
    """One configuration's cubin, loaded in a device's primary context."""

    def __init__(self, driver, cubin: bytes, name: str, cfg, sms: int):
        self.module = _check(driver, driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.function = _check(driver, driver.cuModuleGetFunction(self.module, name.encode()),
                               f"cuModuleGetFunction({name})")
        self.smem = cfg.smem_bytes()
        self.threads = cfg.threads
        _check(driver, driver.cuFuncSetAttribute(
            self.function,
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            self.smem), "cuFuncSetAttribute(max dynamic shared memory)")
        #: the CUfunction's handle, for the ctypes launch (_libcuda)
        self.handle = int(self.function)
        per_sm = _check(driver, driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.function, self.threads, self.smem), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        if per_sm < 1:
            raise RuntimeError(f"cuda backend: {cfg.describe()} cannot run on this device "
                               f"({self.threads} threads, {self.smem} bytes shared memory)")
        self.max_ctas = sms * per_sm


@functools.lru_cache(maxsize=1)
def _libcuda():
    """The driver library itself, for the three calls every launch makes (the current
    context, setting it, the launch), through ctypes: NVIDIA's Python bindings marshal
    each argument into objects, and a forward from Python took ~0.10 ms of host time
    against triton's ~0.05 (fusedmlp bench, 2^16 rows, H200). Loaded by name: it is
    already in the process (torch and the bindings load it)."""
    lib = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")
    vp, u = ctypes.c_void_p, ctypes.c_uint
    lib.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(vp)]
    lib.cuCtxSetCurrent.argtypes = [vp]
    for f in (lib.cuLaunchKernel, lib.cuCtxGetCurrent, lib.cuCtxSetCurrent):
        f.restype = ctypes.c_int
    return lib


def _driver_call(result: int, what: str) -> None:
    if result != 0:
        raise RuntimeError(f"cuda backend: {what} failed: CUresult {result}")


class _Contexts:
    """The primary context of each device, made current on the launching thread when it is
    not (a thread whose first CUDA work this is, such as autograd's device threads, may
    have none): the context torch itself uses, so modules, pointers and streams agree."""

    def __init__(self):
        self.primary: dict[int, int] = {}  # device index -> CUcontext handle
        self.lock = threading.Lock()

    def ensure(self, index: int) -> None:
        ctx = self.primary.get(index)
        if ctx is None:
            with self.lock:
                torch.cuda.init()
                driver = driver_module()
                _check(driver, driver.cuInit(0), "cuInit")
                dev = _check(driver, driver.cuDeviceGet(index), "cuDeviceGet")
                ctx = self.primary[index] = int(_check(
                    driver, driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain"))
        lib = _libcuda()
        current = ctypes.c_void_p()
        _driver_call(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
        if (current.value or 0) != ctx:
            _driver_call(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


_contexts = _Contexts()
_kernels: dict[tuple[int, object], LoadedKernel] = {}  # (device index, config)
_kernels_lock = threading.Lock()


def device_info(device: torch.device) -> tuple[tuple[int, int], int, int]:
    """(compute capability, SM count, opt-in shared memory a block) of a CUDA device."""
    return _device_info(device.index if device.index is not None
                        else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _device_info(index: int) -> tuple[tuple[int, int], int, int]:
    p = torch.cuda.get_device_properties(index)
    smem = getattr(p, "shared_memory_per_block_optin", 0) or cuda_build.SM90_SMEM
    return (p.major, p.minor), p.multi_processor_count, smem


def forward_kernel(device: torch.device, cfg: cuda_build.ForwardConfig) -> LoadedKernel:
    """The forward kernel of ``cfg`` loaded on ``device``: compiled (or read from the disk
    cache) and loaded on the first call, then kept for the process."""
    return _loaded(device, cfg, cuda_build.compile_forward)


def backward_kernel(device: torch.device, cfg: cuda_build.BackwardConfig) -> LoadedKernel:
    """The backward kernel of ``cfg`` loaded on ``device``, as forward_kernel."""
    return _loaded(device, cfg, cuda_build.compile_backward)


def build(cfg, compile_fn, arch: str) -> cuda_build.Compiled:
    """``compile_fn(cfg, arch)``, saying so (notes.note_compile: one stderr line a
    process) where NVRTC compiled rather than the disk cache answering."""
    t = time.perf_counter()
    built = compile_fn(cfg, arch)
    if not built.cached:
        notes.note_compile(f"{cfg.kernel} ({cfg.describe()}) with NVRTC",
                           time.perf_counter() - t)
    return built


def _loaded(device: torch.device, cfg, compile_fn) -> LoadedKernel:
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, cfg)
    k = _kernels.get(key)
    if k is None:
        with _kernels_lock:
            k = _kernels.get(key)
            if k is None:
                cap, sms, _ = device_info(torch.device("cuda", index))
                built = build(cfg, compile_fn, cuda_build.arch_for(cap))
                _contexts.ensure(index)
                k = _kernels[key] = LoadedKernel(driver_module(), built.cubin, cfg.kernel,
                                                 cfg, sms)
    return k


# --- host side of a launch -------------------------------------------------------------
def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` with contiguous rows at a 16-byte aligned address (the kernel's vector loads),
    copied only where it is not already."""
    if t.is_contiguous() and t.data_ptr() % 16 == 0:
        return t
    return t.clone(memory_format=torch.contiguous_format)


def kernel_input(x: torch.Tensor, in_features: int) -> torch.Tensor:
    """x as the kernel reads it: unit column stride and, where in_features is a multiple
    of 8 (16-byte row chunks), rows 16-byte aligned; copied only where needed."""
    if x.shape[0] > 0 and x.stride(-1) != 1:
        return _aligned(x)
    if in_features % 8 == 0 and (x.stride(0) % 8 or x.data_ptr() % 16):
        return _aligned(x)
    return x


def pack_params(x, y, weights, biases) -> cuda_build.ForwardParams:
    """The kernel's argument: pointers and row strides (in elements) of x and y, every
    layer's weight (contiguous, 16-byte aligned) and bias."""
    if len(weights) > cuda_build.MAX_LAYERS:
        raise ValueError(f"weights: {len(weights)} layers, the kernel takes at most "
                         f"{cuda_build.MAX_LAYERS}")
    p = cuda_build.ForwardParams()
    p.x, p.y = x.data_ptr(), y.data_ptr()
    p.n_rows, p.ld_x, p.ld_y = x.shape[0], x.stride(0), y.stride(0)
    return _layers(p, weights, biases)


def _layers(p, weights, biases):
    """``p`` with every layer's weight and bias pointer filled in."""
    for i, w in enumerate(weights):
        p.w[i] = w.data_ptr()
    for i, b in enumerate(biases or ()):
        p.b[i] = b.data_ptr()
    return p


def grid_size(n_rows: int, cfg: cuda_build.ForwardConfig, max_ctas: int) -> int:
    """CTAs of the persistent grid: enough for every warp to own a row block, at most
    what is resident at once (SMs x CTAs per SM)."""
    blocks = -(-n_rows // cfg.rows_per_warp)
    return max(1, min(max_ctas, -(-blocks // cfg.warps)))


def pack_backward_params(x, grad_y, grad_x, partial, weights, biases) -> cuda_build.BackwardParams:
    """The backward kernel's argument (grad_x and partial may be None: not written)."""
    p = cuda_build.BackwardParams()
    p.x, p.gy = x.data_ptr(), grad_y.data_ptr()
    p.gx = 0 if grad_x is None else grad_x.data_ptr()
    p.partial = 0 if partial is None else partial.data_ptr()
    p.n_rows, p.ld_x, p.ld_gy = x.shape[0], x.stride(0), grad_y.stride(0)
    p.ld_gx = 0 if grad_x is None else grad_x.stride(0)
    return _layers(p, weights, biases)


def backward_grid(n_rows: int, cfg: cuda_build.BackwardConfig, max_ctas: int) -> int:
    """CTAs of the backward's persistent grid: one 64-row block a chain at least, at most
    what is resident at once. Each CTA writes one partial of every weight gradient, so
    fewer CTAs also means a smaller sum after."""
    blocks = -(-n_rows // 64)
    return max(1, min(max_ctas, -(-blocks // cfg.chains)))


@functools.lru_cache(maxsize=64)
def _partial_index(cfg: cuda_build.BackwardConfig, device: torch.device, need_w: bool,
                   need_b: bool) -> torch.Tensor:
    """The partial's indices of the gradients asked for, as one index tensor on ``device``:
    every weight gradient (row major, layer after layer), then every bias gradient."""
    where = cfg.partial_index()
    idx = ([i for wi, _ in where for i in wi] if need_w else []) + (
        [i for _, bi in where for i in bi] if need_b else [])
    return torch.tensor(idx, dtype=torch.long, device=device)


def gradients_from_partials(partial: torch.Tensor, cfg: cuda_build.BackwardConfig,
                            dtype: torch.dtype, need_w: bool, need_b: bool):
    """The CTAs' fp32 partials [grid, partial_floats] -> (weight gradients, bias gradients)
    in ``dtype``, lists empty where not needed: summed over the CTAs, gathered out of the
    kernel's fragment layout and rounded once (three ops whatever the depth), then split
    into views."""
    shapes = cfg.layer_shapes()
    flat = partial.sum(0)[_partial_index(cfg, partial.device, need_w, need_b)].to(dtype)
    sizes = ([o * i for o, i in shapes] if need_w else []) + (
        [o for o, _ in shapes] if need_b else [])
    parts = flat.split(sizes)
    n = len(shapes) if need_w else 0
    gws = [t.view(o, i) for t, (o, i) in zip(parts[:n], shapes)]
    return gws, list(parts[n:])


def launch(kernel: LoadedKernel, grid: int, params,
           device: torch.device) -> None:
    """The kernel on torch's current stream of ``device``: asynchronous, nothing
    allocated, nothing synchronized (capturable in a CUDA graph). The driver copies the
    argument at the call, so ``params`` may be reused after it."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    _contexts.ensure(index)
    args = (ctypes.c_void_p * 1)(ctypes.addressof(params))
    stream = torch.cuda.current_stream(index).cuda_stream
    _driver_call(_libcuda().cuLaunchKernel(kernel.handle, grid, 1, 1, kernel.threads, 1, 1,
                                           kernel.smem, stream, args, None), "cuLaunchKernel")


def _backward_config(spec, device: torch.device, need_x: bool, need_wb: bool):
    """The backward kernel's configuration for ``spec`` on ``device`` and these
    gradients, or (None, why it does not train here): off unless FUSEDMLP_CUDA_BACKWARD=1,
    sm_90 only, the kernel's specs (cuda_build.backward_config)."""
    cap, _, smem = device_info(device)
    if (envvars.get(BACKWARD_ENV) != "1"
            and win_key(cap, spec) not in MEASURED_TRAIN_WINS):
        return None, _TRAINING
    if RACECHECK_CLEAN is None:
        return None, _RACE
    if tuple(cap) != (9, 0):
        return None, (f"sm_{cap[0]}{cap[1]}: the backward kernel is sm_90 (wgmma) only; "
                      "inference only here")
    cfg, why = cuda_build.backward_config(spec, need_x, need_wb, smem)
    return (cfg, "") if cfg is not None else (
        None, f"the backward kernel cannot train this spec: {why}")


# --- the backend -----------------------------------------------------------------------
class CudaBackend(Backend):
    name = "cuda"
    device_types = ("cuda",)
    #: training only where train_support says so (FUSEDMLP_CUDA_BACKWARD=1, sm_90, the
    #: backward kernel's specs); the backward always recomputes
    trains = True
    saves = False

    def available(self):
        try:
            major, minor = cuda_build.nvrtc_version()
            driver_module()
        except cuda_build.CudaToolchainError as e:
            return False, str(e)
        missing = [p.name for p in (cuda_build.FORWARD_SOURCE, cuda_build.FORWARD_SM90_SOURCE,
                                    cuda_build.BACKWARD_SM90_SOURCE, *cuda_build.HEADERS)
                   if not p.exists()]
        if missing:
            return False, (f"cuda backend: kernel sources {missing} not found under "
                           f"{cuda_build.KERNEL_DIR} (the package data of fusedmlp_xpu.kernels: "
                           "reinstall fusedmlp-xpu)")
        return True, f"CUDA C++ kernels compiled at run time by NVRTC {major}.{minor}"

    def supports(self, spec, device):
        """What the forward kernel can compute on ``device`` (a forced backend runs it);
        whether the dispatcher takes it unforced is ``preferred``."""
        if device.type != "cuda":
            return False, f"does not run on {device.type}"
        cap, _, smem = device_info(device)
        if cap < cuda_build.MIN_CAPABILITY:
            return False, (f"sm_{cap[0]}{cap[1]}: the kernel needs mma.sync/ldmatrix/cp.async "
                           "(compute capability 8.0 or later)")
        cfg, why = cuda_build.forward_config(spec, smem, cuda_build.family_for(cap))
        if cfg is None:
            return False, why
        return True, (f"fully-fused {cfg.family} forward compiled by NVRTC for "
                      f"{cuda_build.arch_for(cap)} ({cfg.rows_per_warp} rows a warp, "
                      f"{cfg.warps} warps a CTA, {cfg.smem_bytes() // 1024} KB shared "
                      "memory)")

    def train_support(self, spec, device):
        cfg, why = _backward_config(spec, device, True, True)
        if cfg is None:
            return False, why
        return True, (f"backward kernel {cfg.chains} chains + 1 summing warpgroup, "
                      f"{cfg.smem_bytes() // 1024} KB shared memory"
                      + ("" if win_key(device_info(device)[0], spec) in MEASURED_TRAIN_WINS
                         else f" ({BACKWARD_ENV}=1: not yet sanitized or timed on a GPU)"))

    def recomputes(self, spec, device):
        return True

    def preferred(self, spec, device, train=False):
        cap = torch.cuda.get_device_capability(device)
        arch = f"sm_{cap[0]}{cap[1]}"
        if train:
            src = MEASURED_TRAIN_WINS.get(win_key(cap, spec))
            if src is None:
                return False, (f"its train step is not measured faster than triton's on "
                               f"{arch} for this spec: trains only when forced (with "
                               "FUSEDMLP_CUDA_BACKWARD=1)")
            return True, f"measured faster than triton on {arch} for training ({src})"
        src = MEASURED_WINS.get(win_key(cap, spec))
        if src is None:
            return False, (f"compiled, not measured faster than triton on {arch} for this "
                           "spec (hidden width, dtype, activations, bias): used only when "
                           "forced (FUSEDMLP_BACKEND=cuda or backend='cuda')")
        return True, f"measured faster than triton on {arch} for inference ({src})"

    def forward(self, x, weights, biases, spec, save):
        if save:
            raise NotImplementedError(_SAVES)
        cap, _, smem = device_info(x.device)
        cfg, why = cuda_build.forward_config(spec, smem, cuda_build.family_for(cap))
        if cfg is None:  # the dispatcher asked supports() first; a direct call may not
            raise ValueError(f"cuda backend cannot run this spec: {why}")
        n = x.shape[0]
        y = memory.new_empty(n, spec.out_features, like=x)
        if n == 0:
            return y, None
        with device_guard(x):
            kernel = forward_kernel(x.device, cfg)
            x = kernel_input(x, spec.in_features)
            weights = [_aligned(w) for w in weights]
            biases = None if biases is None else [
                b if b.stride(0) == 1 else b.contiguous() for b in biases]
            params = pack_params(x, y, weights, biases)
            launch(kernel, grid_size(n, cfg, kernel.max_ctas), params, x.device)
        return y, None

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        if saved is not None:
            raise ValueError(_SAVES)
        need_x, need_w, need_b = needs
        if not (need_x or need_w or need_b):
            return None, [], []
        # the dispatcher asked train_support first; a direct call may not (one lookup)
        cfg, why = _backward_config(spec, x.device, need_x, need_w or need_b)
        if cfg is None:
            raise NotImplementedError(f"cuda backend: {why}")
        n = x.shape[0]
        gx = memory.new_empty(n, spec.in_features, like=x) if need_x else None
        if n == 0:  # no rows: zero gradients, nothing launched
            shapes = cfg.layer_shapes()
            return (gx, [x.new_zeros(o, i) for o, i in shapes] if need_w else [],
                    [x.new_zeros(o) for o, _ in shapes] if need_b else [])
        with device_guard(x):
            kernel = backward_kernel(x.device, cfg)
            x = kernel_input(x, spec.in_features)
            grad_y = kernel_input(grad_y, spec.out_features)
            weights = [_aligned(w) for w in weights]
            biases = None if biases is None else [
                b if b.stride(0) == 1 else b.contiguous() for b in biases]
            grid = backward_grid(n, cfg, kernel.max_ctas)
            # every CTA writes all of its partial (even one with no row block): no zero-fill
            # (through memory.new_empty: the tests poison it, so a slot left unwritten shows)
            partial = (memory.new_empty(grid, cfg.partial_floats(), like=x,
                                        dtype=torch.float32) if cfg.need_wb else None)
            launch(kernel, grid, pack_backward_params(x, grad_y, gx, partial, weights, biases),
                   x.device)
        gws, gbs = ([], []) if partial is None else gradients_from_partials(
            partial, cfg, x.dtype, need_w, need_b)
        return gx, gws, gbs
