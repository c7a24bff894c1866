"""The wide kernels' configurations, one named place per vendor: the autotuner's tile
lists (NVIDIA, Intel, the interpreter) fitted to the device's shared memory, the TMA
kernels' tiles on Hopper (with the measurements behind them), the activation ids the
kernels take (the hardware tanh where it is allowed), and the autotuned launchers."""
from __future__ import annotations

import functools

import torch
import triton

from .... import activations, envvars
from ..common import (APPROX_ENV, act_id, cdiv, interpreting,  # noqa: F401 (re-exported)
                      pow2)
from ..launch import TunedLauncher
from .gated_kernels import _gated_bwd_kernel, _gated_fwd_kernel
from .gemm_kernels import _linear_dw_kernel, _linear_dx_kernel, _linear_fwd_kernel


GATE_ACTIVATIONS = activations.GATE_ACTIVATIONS


# Pointer offsets are 32-bit in the kernels (cheaper address math in the K loop);
# larger operands are refused on the host, never silently wrapped.
_MAX_ELEMENTS = 2**31 - 1


# ---------------------------------------------------------------- tuning ---
# Each list is the config space the autotuner times once per (kernel, M bucket, N, K,
# constexprs, dtypes); after warm-up every call is a dict lookup.
def _configs_nvidia(dual: bool) -> list[triton.Config]:
    """Hopper/Ampere, 16-bit operands. Large M: 128x256x64 with 8 warps and 3 stages is
    the classic Hopper tile for bf16 (3 x (128+256) x 64 x 2 B = 144 KB of smem, under the
    228 KB an H100/H200 SM has); 4-stage 128x128 trades reuse for a smaller last wave
    (M 8192, N 4096: 1024 tiles of 128x256 = 7.8 waves on 132 SMs, 2048 of 128x128 =
    15.5). Small M (decode, <= 64 rows) is bound by reading the weights: narrow BLOCK_M,
    deep BLOCK_K, and BLOCK_N small enough that N / BLOCK_N programs fill the 132 SMs
    (N 4096 / 32 = 128 programs). ``dual`` kernels hold two accumulators (or a heavy
    epilogue): half the tile width keeps them in registers. The lists are the search space;
    the autotuner picks per shape on first use. On the H200 (Triton 3.6, bf16, M 8192) the
    3-stage lists' picks ran at 545-560 TFLOP/s against cuBLAS's ~695 (wide-gelu/-swiglu
    inference): the 4-stage large tiles were added after that run. 16 warps halve the
    accumulator a thread holds: the input gradient with the gelu' epilogue and h stored
    (M 8192, 4096 -> 16384) spilled registers at 128x256 / 8 warps (ncu) and ran 2.22 ms
    there, 2.14 ms at 128x256 / 16 warps (h200-probe-epilogue-20261130b.json)."""
    big = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4),
           (128, 256, 64, 8, 4), (256, 128, 64, 8, 4),  # 4 stages: 192 KB
           (128, 256, 64, 16, 3)]
    small = [(16, 64, 256, 4, 4), (32, 64, 128, 4, 5), (64, 64, 128, 4, 4), (16, 32, 256, 4, 5)]
    if dual:  # two B tiles a stage: smem = stages x (BM + 2 BN) x BK x 2 B stays <= 196 KB
        big = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4)]
        small = [(16, 64, 128, 4, 4), (32, 64, 128, 4, 4), (64, 64, 64, 4, 4)]
    return [_cfg(*c) for c in big + small]


def _configs_intel(dual: bool) -> list[triton.Config]:
    """Data Center GPU Max 1550 (Triton's XPU backend): 32 warps of 16 lanes and the large
    register file (grf_mode 'large', 256 registers a thread) are what Intel's own GEMM
    tuning uses for 256x256 bf16 tiles; BLOCK_K 32 matches one DPAS k-step x 2. Unmeasured
    here (no Intel GPU is reachable): a starting point, not a tuned result."""
    big = [(256, 256, 32, 32, 4), (256, 128, 32, 32, 3), (128, 256, 32, 32, 3), (128, 128, 32, 16, 3)]
    if dual:
        big = [(256, 128, 32, 32, 3), (128, 128, 32, 16, 3), (128, 64, 32, 16, 3)]
    small = [(16, 128, 64, 8, 3), (32, 64, 64, 8, 3), (64, 128, 32, 16, 3)]
    return [_cfg(*c, grf_mode="large") for c in big + small]


def _configs_interpreter(dual: bool) -> list[triton.Config]:
    """The CPU interpreter: one small tile (16 is tl.dot's minimum), so no timing runs and
    test shapes of a few dozen rows still cross several tiles and K steps."""
    return [_cfg(16, 16, 16, 1, 1)]


def _cfg(bm, bn, bk, warps, stages, **extra) -> triton.Config:
    return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, **extra),
                         num_warps=warps, num_stages=stages)


def _even_k(args) -> bool:
    """Every K loop of the kernel ends on a whole block (then no load needs a mask)."""
    bk = args["BLOCK_K"]
    return args["K"] % bk == 0 and args.get("K2", 0) % bk == 0


#: FUSEDMLP_WIDE_AUTOTUNE=0 takes the first config of each list instead of timing them
#: (correctness runs on a GPU: dozens of test shapes would otherwise each tune)
AUTOTUNE_ENV = "FUSEDMLP_WIDE_AUTOTUNE"


def _prune(configs, named_args, dual=False, **kwargs):
    """Decode-sized M gets the small-M tiles, everything else the large ones; each tile is
    then fitted to the device's shared memory for the operands' element size."""
    args = {**named_args, **kwargs}
    m = args["M_BUCKET"]
    small = [c for c in configs if c.kwargs["BLOCK_M"] <= 64]
    big = [c for c in configs if c.kwargs["BLOCK_M"] > 64]
    pick = (small if m <= 64 else big) or configs
    t = next((v for v in args.values() if isinstance(v, torch.Tensor)), None)
    if t is not None:
        fitted = {}
        for c in pick:
            f = _fit_smem(c, t.element_size(), dual, _smem_limit(t.device))
            fitted.setdefault((tuple(sorted(f.kwargs.items())), f.num_warps, f.num_stages), f)
        pick = list(fitted.values())
    return pick[:1] if envvars.get(AUTOTUNE_ENV, "1") == "0" else pick


def _smem_bytes(c: triton.Config, esize: int, dual: bool) -> int:
    """Shared memory of the pipelined operand tiles: stages x (A tile + B tile(s)). On the
    H200 this matched Triton's own figure (294912 B for 128x256x64, 3 stages, fp32)."""
    k = c.kwargs
    return c.num_stages * (k["BLOCK_M"] + k["BLOCK_N"] * (2 if dual else 1)) * k["BLOCK_K"] * esize


def _fit_smem(c: triton.Config, esize: int, dual: bool, limit: int) -> triton.Config:
    """The config itself if it fits; else BLOCK_K halved (fp32 operands take twice the bytes
    the 16-bit lists were made for), then fewer stages, down to 32 and 2."""
    k, stages = dict(c.kwargs), c.num_stages
    fits = lambda: _smem_bytes(  # noqa: E731
        triton.Config(k, num_warps=c.num_warps, num_stages=stages), esize, dual) <= limit
    while not fits() and k["BLOCK_K"] > 32:
        k["BLOCK_K"] //= 2
    while not fits() and stages > 2:
        stages -= 1
    if k == c.kwargs and stages == c.num_stages:
        return c
    return triton.Config(k, num_warps=c.num_warps, num_stages=stages, **_extra(c))


def _extra(c: triton.Config) -> dict:
    return {a: getattr(c, a) for a in ("num_ctas", "maxnreg") if getattr(c, a, None) is not None}


_SMEM: dict = {}


def _smem_limit(device: torch.device) -> int:
    """Shared memory one program may use on this device (bytes); no limit in the interpreter."""
    if device.type == "cpu":
        return 1 << 30
    key = (device.type, device.index)
    if key not in _SMEM:
        try:
            idx = device.index if device.index is not None else 0
            props = triton.runtime.driver.active.utils.get_device_properties(idx)
            _SMEM[key] = int(props["max_shared_mem"])
        except Exception:  # noqa: BLE001 -- a driver without the query: the smaller known limit
            _SMEM[key] = 227 * 1024 if device.type == "cuda" else 128 * 1024
    return _SMEM[key]


_KERNELS = {
    "fwd": (_linear_fwd_kernel, False, ("ACT", "HAS_BIAS", "STORE_Z")),
    "dx": (_linear_dx_kernel, False, ("G_ACT", "ACT", "DUAL", "STORE_H", "K2")),
    "dw": (_linear_dw_kernel, False, ("G_ACT",)),
    "gated_fwd": (_gated_fwd_kernel, True, ("ACT", "HAS_BIAS", "STORE_GU")),
    # one accumulator, but an epilogue holding g, u and two outputs: the smaller tiles
    "gated_bwd": (_gated_bwd_kernel, True, ("ACT",)),
}


_tuned: dict[tuple[str, str], object] = {}


def _vendor(device: torch.device) -> str:
    if device.type == "cpu":
        return "interpreter"
    return "intel" if device.type == "xpu" else "nvidia"


def _kernel(name: str, device: torch.device) -> TunedLauncher:
    """The autotuned kernel for this vendor, built once per process."""
    vendor = _vendor(device)
    k = _tuned.get((name, vendor))
    if k is None:
        fn, dual, keys = _KERNELS[name]
        configs = {"nvidia": _configs_nvidia, "intel": _configs_intel,
                   "interpreter": _configs_interpreter}[vendor](dual)
        key = ["M_BUCKET", "N", "K", *keys, "UPCAST", "PRECISION"]
        tuner = triton.autotune(
            configs, key=key,
            prune_configs_by={"early_config_prune": functools.partial(_prune, dual=dual)},
        )(triton.heuristics({"EVEN_K": _even_k})(fn))
        # the runtime ints the tuning key and the EVEN_K heuristic read
        k = _tuned[(name, vendor)] = TunedLauncher(tuner, fn, {"EVEN_K": _even_k},
                                                   tune=("M_BUCKET", "N", "K", "K2"))
    return k


def _bucket(m: int) -> int:
    """Tuning key for the row count: powers of two up to 64 rows (decode), then 8 coarse
    buckets, so serving traffic with every M in 1..8192 tunes ~14 times, not 8192."""
    # plain int arithmetic: triton.next_power_of_2 unwraps constexprs (~2 us a call)
    return min(pow2(m), 8192)


def _meta(t: torch.Tensor) -> dict:
    return _meta_for(t.device, t.dtype)


def _meta_for(device: torch.device, dtype: torch.dtype) -> dict:
    """UPCAST and PRECISION for operands of ``dtype`` on ``device``."""
    up = device.type == "cpu" and dtype == torch.bfloat16 and interpreting()
    # fp32 operands: full-precision products ("ieee") so fp32 keeps its 1e-5 bound, not
    # the 1e-3 of tf32; 16-bit operands keep Triton's default (tensor cores either way).
    half = dtype in (torch.float16, torch.bfloat16)
    return dict(UPCAST=up, PRECISION="tf32" if half else "ieee")


def _grid(M, N):
    return lambda meta: (cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"]),)


def _check_size(*ts):
    for t in ts:
        if t is not None and t.numel() > _MAX_ELEMENTS:
            raise ValueError(f"wide kernels: a {tuple(t.shape)} operand exceeds 2^31 elements; "
                             "split the batch")


def available() -> tuple[bool, str]:
    """Whether these kernels can run in this process (any device they support)."""
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return True, f"triton {triton.__version__}"
    if interpreting():
        return True, f"triton {triton.__version__} interpreter (TRITON_INTERPRET=1), slow"
    return False, "no cuda/xpu device and TRITON_INTERPRET is not set"


def supports_device(device: torch.device) -> bool:
    return device.type in ("cuda", "xpu") or (device.type == "cpu" and interpreting())


def _tma_config_nvidia(kind: str) -> tuple:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages[, subtile]) of the TMA kernels on Hopper
    (subtile: the epilogue in two halves of the tile, for SUBTILE_KINDS): the forward
    for inference ("fwd") or training ("fwd_z": z is stored too), the gated GEMM ("gated",
    "gated_gu": g and u stored too; BLOCK_N counts h's columns, the interleaved weight
    tile has twice as many rows), the input gradient with an activation epilogue ("dx")
    and the gated backward's dh GEMM ("gated_bwd"). H200, Triton 3.6, bf16, M 8192:
    - fwd (three probes, h200-probe-tma-gemm-20261130{,b,c}.json): 128x256x64 / 8 warps /
      3 stages 1.65-1.70 ms (N 16384, K 4096) and 1.61-1.68 ms (N 4096, K 16384), cuBLAS
      1.53-1.62 without an epilogue; 256x128 1.75-1.82, 128x128 / 4 stages 1.80-1.85.
    - fwd_z: with z stored from registers through pointers, 128x256 fitted 2 stages only
      and 128x128x64 / 4 stages was the pick at 1.81-1.88 ms. Through a descriptor
      (h200-probe-epilogue-20261130c.json) 128x256x64 / 3 stages fits and runs 1.70 ms
      (128x128 / 4 stages 1.87, 2 stages 2.39; cuBLAS 1.62).
    - gated, gated_gu (h200-probe-gated-tma-20261130.json, x 8192 x 4096, hidden 14336):
      128x128x64 / 8 warps / 3 stages 2.79 ms, 2.91 storing g and u through pointers
      (4 stages 2.90; 256x64 / 3 stages 2.76; 2 stages 3.91), cuBLAS over [Wg; Wu] 2.76,
      the pointer kernel 3.39 / 3.47. g and u through descriptors (-epilogue-20261130c,
      interleaving copy included): 2.94 at 3 stages, 2.92 at 4.
    - dx, gated_bwd (-epilogue-20261130c): every epilogue tile through a descriptor,
      128x128x64 / 8 warps / 4 stages: dx with gelu' and h stored 2.08 ms (3 stages 2.48;
      the pointer kernel 2.20 at 128x256 / 8 warps, 2.11 at 16 warps; cuBLAS 1.63);
      gated dh with the dg, du epilogue 1.73 ms (pointer kernel 2.07; cuBLAS 1.37). An
      earlier TMA backward that moved its epilogue tiles through pointers (-tma-gemm-c)
      was slower than the pointer kernels.
    - subtile (-epilogue-20261130d): the gated dh GEMM storing h as well spilled 1008 B of
      registers with its epilogue whole (Triton 3.6): 2.37 ms, 1.99 in halves (3 stages
      2.24, 16 warps 2.39-2.83). The dx kernel ran 2.13 ms whole, 2.31 in halves.
    - dx again, with the hardware tanh (h200-probe-approx-20261201c.json, two passes):
      128x256x32 / 8 warps / 4 stages in halves 1.885-1.892 ms (196 KB, 254 registers, no
      spills in the sm_90 compile) against 128x128x64 whole 1.968-1.977; 16 warps 2.38-
      2.40, 128x128x32 / 6 stages 2.68; two programs per SM (-20261201b: 128x128 halves at
      2 stages, or BLOCK_K 32) 2.26-2.52."""
    if kind in ("gated", "gated_gu"):
        return (128, 128, 64, 8, 3)
    if kind == "dx":
        return (128, 256, 32, 8, 4, True)
    if kind == "gated_bwd":
        return (128, 128, 64, 8, 4, True)
    return (128, 256, 64, 8, 3)  # fwd, fwd_z


#: the kinds whose kernels have a SUBTILE epilogue: their configs have a 6th element
SUBTILE_KINDS = ("dx", "gated_bwd")


def _tma_config(device: torch.device, kind: str) -> tuple:
    if device.type == "cpu":  # the interpreter: tl.dot's smallest tile, no pipelining
        return (16, 16, 16, 1, 1) + ((True,) if kind in SUBTILE_KINDS else ())
    return _tma_config_nvidia(kind)
