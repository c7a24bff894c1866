"""What every Gluon kernel of the Triton backend shares (narrow/hopper_*.py,
wide/hopper_gemm.py): the import of Gluon's Hopper API, under the names the kernels use;
the switch that turns every Gluon kernel off; the device check; and ``Addr``, a tensor's
address without the tensor. Gluon is Triton's lower-level dialect (layouts, shared memory,
TMA and warpgroup MMAs spelled out); without it (Triton < 3.5) ``gluon`` is None and the
kernels' callers keep the Triton kernels. ``kept_descriptor``: a TMA descriptor a plan
keeps, whose CUtensorMap Triton's launcher then builds once instead of on every launch."""
from __future__ import annotations

import importlib

import torch

from ... import envvars

#: set to 0 to keep every kernel on Triton's (no Gluon kernel runs)
ENV = "FUSEDMLP_GLUON"

try:  # Gluon's Hopper API (Triton >= 3.5)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: F401 (re-exported)
        fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: F401
    # the TMA copies' names: async_load / async_store from Triton 3.7 on
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    thread_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # 3.9: barrier
    IMPORT_ERROR = None
except Exception as e:  # noqa: BLE001  (any failure means: not available)
    gluon = gl = None
    IMPORT_ERROR = f"{type(e).__name__}: {e}"


class Addr:
    """A tensor's address and dtype without the tensor (Triton takes any object with
    ``data_ptr()`` and ``dtype`` as a pointer; TMA descriptors read the same two): kept
    descriptors and bound forwards do not keep parameters alive."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, t):
        self.ptr, self.dtype = t.data_ptr(), t.dtype

    def data_ptr(self) -> int:
        return self.ptr


def device_ok(spec, device: torch.device) -> tuple[bool, str]:
    """The checks every Gluon kernel shares: Gluon's Hopper API, not turned off, an sm_90
    CUDA device, fp16/bf16 (``spec``: anything with a ``dtype``)."""
    if gluon is None:
        return False, f"no Gluon in this Triton ({IMPORT_ERROR})"
    if envvars.get(ENV, "1") == "0":
        return False, f"{ENV}=0"
    if device.type != "cuda" or envvars.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False, "not a CUDA device (or under Triton's interpreter)"
    if torch.cuda.get_device_capability(device)[0] != 9:
        return False, "warpgroup MMAs are sm_90 only"
    if spec.dtype not in (torch.float16, torch.bfloat16):
        return False, f"{spec.dtype} (fp16 and bf16 only)"
    return True, ""


def kept_descriptor(t, shape, strides, block, layout):
    """A TensorDescriptor of ``t``'s address (Addr: the tensor is not kept) for a plan to
    keep and pass to its launches. Triton's launcher turns every descriptor argument into
    a CUtensorMap on every launch (``make_tensordesc_arg`` in its NVIDIA driver: ~6-12 us
    each on the H200 host; a narrow train step passes 11). A kept descriptor never changes
    (address, shape, strides, block and layout are fixed when it is made), so its map is
    made once per kernel and reused (``_memo_maps``); any other descriptor, the user's
    own included, takes Triton's path untouched. FUSEDMLP_FAST_LAUNCH=0 turns it off."""
    d = TensorDescriptor(Addr(t), shape, strides, block, layout)
    if envvars.get("FUSEDMLP_FAST_LAUNCH", "1") != "0" and _memo_maps():
        try:
            d._fmlp_maps = {}
        except AttributeError:  # a descriptor class without instance attributes
            pass
    return d


_MEMO: list = []  # [True] once installed, [False] where Triton has no such hook


def _memo_maps() -> bool:
    """Install, once, a wrapper of Triton's ``make_tensordesc_arg`` that keeps the result
    for kept descriptors (those with ``_fmlp_maps``), per kernel (its descriptor
    metadata), and hands every other descriptor to Triton's own function. The launcher
    looks the function up in its module when it builds a kernel's launcher (or at each
    launch in older Triton), so kernels compiled afterwards take it. Returns whether it
    is installed."""
    if not _MEMO:
        try:
            mod = importlib.import_module("triton.backends.nvidia.driver")
            real = mod.make_tensordesc_arg
        except Exception:  # noqa: BLE001  (another Triton layout: no memo, Triton's path)
            _MEMO.append(False)
            return False
        mod.make_tensordesc_arg = memoizing(real)
        _MEMO.append(True)
    return _MEMO[0]


def memoizing(real):
    """``real`` (Triton's make_tensordesc_arg(descriptor, metadata, ...) -> the launch's
    arguments for it), keeping its result per kept descriptor and metadata object."""
    def make_tensordesc_arg(arg, metadata, *rest):
        maps = getattr(arg, "_fmlp_maps", None)
        if maps is None:
            return real(arg, metadata, *rest)
        hit = maps.get(id(metadata))
        if hit is None or hit[0] is not metadata:
            hit = maps[id(metadata)] = (metadata, real(arg, metadata, *rest))
        return list(hit[1])

    make_tensordesc_arg.__wrapped__ = real
    return make_tensordesc_arg
