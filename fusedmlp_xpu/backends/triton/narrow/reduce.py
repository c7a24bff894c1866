"""The narrow backward's last step, shared by the Triton and the Gluon backward: every
program's partial weight and bias sums -> every gradient, unpadded, in x's dtype, as
views of one buffer (one kernel: backward_kernels._reduce_grads_kernel)."""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from ... import device_guard, memory
from . import launchers


class _ReduceLayout(NamedTuple):
    """Where _reduce_grads_kernel writes each gradient in its one output buffer (every
    weight's, then every bias's if wanted), and its launch constants. ``like`` holds a
    meta tensor of each gradient's shape: ``views`` makes them all in one call (~2x
    faster than a slice and view each, host time)."""
    numel: int
    like: tuple
    n_layers: int
    need_w: bool
    need_b: bool
    consts: dict
    grid: tuple

    def views(self, out) -> tuple[list, list]:
        vs = torch._utils._unflatten_dense_tensors(out, self.like)
        n = self.n_layers
        return (list(vs[:n]) if self.need_w else []), (list(vs[n:]) if self.need_b else [])


def _reduce_tuning(device_type: str) -> tuple[int, int]:
    """(floats of a slot one reduction program sums, partials it loads per step of its
    loop over the backward's programs).

    CUDA: spans of 128 floats, 32 partials a step. With spans of 1024 and 8 a step the
    reduction ran 25 programs (T_P 64): ncu on the H200 (h200-ncu-narrow-20261201.txt,
    2^22 rows, caches flushed) put it at 86 us after the 866 us one-kernel backward of
    narrow-w32 (264 programs' partials) and 45 us at w64; 128-float spans give 198
    programs there. The interpreter runs every program in turn: it keeps few (1024) and
    takes 2 a step, so its loop runs several steps; XPU keeps the earlier 1024 / 8
    (not measured)."""
    if device_type == "cpu":
        return 1024, 2
    if device_type == "cuda":
        return 128, 32
    return 1024, 8


@functools.lru_cache(maxsize=512)
def _reduce_layout(spec, T_P: int, W_SLOT: int, SLOT: int, need_w: bool, need_b: bool,
                   device_type: str) -> _ReduceLayout:
    outs, ins = spec.widths[1:], spec.widths[:-1]
    shapes = [(o, i) for o, i in zip(outs, ins)] + ([(o,) for o in outs] if need_b else [])
    span, block_p = _reduce_tuning(device_type)
    rows = min(T_P, max(1, span // T_P))  # weight rows a program sums: a span of the slot
    consts = dict(NEED_W=need_w, NEED_B=need_b, T_P=T_P, ROWS=rows, W_SLOT=W_SLOT,
                  SLOT=SLOT, BLOCK_P=block_p)
    return _ReduceLayout(sum(math.prod(s) for s in shapes),
                         tuple(torch.empty(s, device="meta") for s in shapes),
                         spec.n_layers, need_w, need_b, consts, (spec.n_layers, T_P // rows + 1))


def _reduce_launch(acc, out, layout: _ReduceLayout, IN, H, OUT, L_HID, device):
    launchers._launcher("reduce").launch(layout.grid, (acc, out, acc.shape[0], IN, H, OUT, L_HID),
                               layout.consts, device, num_warps=4, num_stages=1)


def _reduce_flat(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, like):
    """Every gradient from the partials into one flat buffer of ``like``'s dtype ->
    (its layout, the buffer)."""
    layout = _reduce_layout(spec, T_P, W_SLOT, SLOT, need_w, need_b, like.device.type)
    out = memory.new_empty(layout.numel, like=like)
    with device_guard(like):
        _reduce_launch(acc, out, layout, spec.in_features, spec.widths[1],
                       spec.out_features, spec.n_layers - 2, like.device)
    return layout, out


def _reduce_grads(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, x):
    """Every layer's weight and bias gradient from the backward's per-program partials:
    one kernel writing them, unpadded and in x's dtype, as views of one buffer (a sum and
    two copies a layer before: ~10 small launches a train step)."""
    layout, out = _reduce_flat(acc, spec, T_P, W_SLOT, SLOT, need_w, need_b, x)
    return layout.views(out)
