"""The narrow kernels' launchers (one per mode, behind launch.py's lean launch path),
their constexpr arguments, the persistent grid's size, and the stage count that fits
(a kernel the device refuses steps its pipeline stages down). Plain Python: the
kernels' module (Triton) is imported on the first launch."""
from __future__ import annotations

import functools

import torch

from ..common import narrow_act_ids, pow2
from ..launch import fitting


# No software pipelining of the layer loop: with Triton's default (3 stages) the weight
# tiles of width 128 asked for 262-720 KB of shared memory on the H200 (limit 227 KB).
NUM_STAGES = 1


#: (kernel, device index, spec) -> the most pipeline stages of its row-block loop with
#: which the unrolled kernel fits on the device (0: none), once a launch was refused
_FIT: dict = {}


def _fits(mode: str, device: torch.device, spec, grid, args, consts, warps,
          least: int = 1, **options) -> bool:
    """Launch the unrolled kernel ``mode`` ("fwd_persistent", "g") with up to
    consts["STAGES"] pipeline stages. Where the device refuses it (Triton's OutOfResources:
    every layer's tiles are buffered per stage; seen with a newer Triton's pipeliner, and
    for deep nets), one stage fewer, down to ``least`` (1 unless said); the count that
    fits is remembered for (mode, device, spec; the forward passes (spec, save): its two
    plans are tuned apart). False when none fits: the caller launches
    the kernel with the layer loop instead (or, for the one-kernel backward, the two
    kernels). ``options``: more compile options (maxnreg)."""
    most = consts["STAGES"]
    return fitting(_FIT, (mode, device.index, spec), most, lambda s: _launcher(mode).launch(
        grid, args, consts if s == most else dict(consts, STAGES=s), device, num_warps=warps,
        num_stages=NUM_STAGES, **options), least)


_SM_COUNT: dict = {}


def _n_programs(device: torch.device, n_blocks: int, per_sm: int = 1) -> int:
    """Persistent-grid size: ``per_sm`` programs per multiprocessor (backward: one, 5.61 ms
    vs 5.63 ms with two, fwd+bwd, P=64, H200)."""
    if device.type == "cuda":
        if device.index not in _SM_COUNT:
            _SM_COUNT[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(n_blocks, per_sm * _SM_COUNT[device.index]))
    if device.type == "xpu":
        return max(1, min(n_blocks, 512))
    return max(1, min(n_blocks, 4))


_LAUNCHERS: dict = {}


def _launcher(mode: str):
    """The narrow kernel of ``mode`` ("fwd", "fwd_persistent", "bwd", "g", "dw",
    "bwd_resident", "bwd_recompute", "reduce", "second_order", "so_pointwise", "so_mm") behind the
    lean launch path (launch.py)."""
    la = _LAUNCHERS.get(mode)
    if la is None:
        from ..launch import Launcher
        from . import backward_kernels as bk
        from . import forward_kernels as fk
        from . import second_order_kernels as sk

        la = _LAUNCHERS[mode] = Launcher({
            "fwd": fk._mlp_fwd_kernel, "fwd_persistent": fk._mlp_fwd_persistent_kernel,
            "bwd": bk._mlp_bwd_kernel, "g": bk._mlp_g_kernel,
            "bwd_resident": bk._mlp_bwd_resident_kernel,
            "bwd_recompute": bk._mlp_bwd_resident_kernel,
            "reduce": bk._reduce_grads_kernel,
            "dw": bk._mlp_dw_kernel,
            "second_order": sk._second_order_kernel,
            "so_pointwise": sk._so_pointwise_kernel, "so_mm": sk._so_mm_kernel}[mode])
    return la


@functools.lru_cache(maxsize=512)
def _launch_meta(spec, device_type: str) -> dict:
    """The kernels' constexpr arguments for a spec, computed once (host time per call)."""
    interp = device_type == "cpu"
    # Every tile is padded to ONE width P (masks keep the real sizes). On the H200 with
    # Triton 3.6, mixing tile widths (in or out padded differently from hidden) gave wrong
    # input gradients and illegal addresses, while every equal-width case passed the suite;
    # the price is extra FLOPs in the first/last layer when they are narrower.
    P = pow2(max(spec.widths))
    act, out_act = narrow_act_ids(spec, device_type)
    return dict(IN_P=P, H_P=P, OUT_P=P, ACT=act, OUT_ACT=out_act,
                F32=interp, PREC="ieee" if interp else "tf32x3")
