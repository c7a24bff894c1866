"""How the narrow kernels take their operands: weights and biases dense, the hidden
layers' as one stacked operand (in place when they lie back to back), and the alignment
checks of the kept (direct) launches and of TMA."""
from __future__ import annotations

import torch


_ALIGN = 15  # Triton specializes a pointer on 16-byte alignment


def _gluon_operands(ts, L_HID: int):
    """Weights or biases (or None) as the Gluon kernels take them: (first, the hidden ones
    back to back, last), the first standing in for the hidden ones without hidden
    layers."""
    return None if ts is None else (ts[0], _stacked(ts[1:-1]) if L_HID else ts[0], ts[-1])


def _aligned(*groups) -> bool:
    """Whether every tensor of the groups (tuples, or None) is 16-byte aligned: TMA needs
    it, and a kept launch was compiled for aligned pointers."""
    bits = 0
    for g in groups:
        if g is not None:
            for t in g:
                bits |= t.data_ptr()
    return not bits & _ALIGN


def _dense(ts):
    """ts with every tensor that is not contiguous (a transposed weight, a strided bias)
    replaced by a contiguous copy; the narrow kernels read weights and biases densely."""
    if ts is not None:
        for t in ts:  # a plain loop: this runs on every call
            if not t.is_contiguous():
                return [t if t.is_contiguous() else t.contiguous() for t in ts]
    return ts


def _stacked(ts) -> torch.Tensor:
    """Equal-shaped tensors as one [len, ...] operand for the kernel: the first tensor itself
    when they already lie back to back in memory (FusedMLP keeps its hidden layers so; the
    kernel reads past the first into the next), else a stacked copy (~8 us a call on the
    H200 host)."""
    return ts[0] if _back_to_back(ts) else torch.stack(ts)


def _back_to_back(ts) -> bool:
    """Whether equal-shaped contiguous tensors lie one after another in memory."""
    t0 = ts[0]
    base, step = t0.data_ptr(), t0.numel() * t0.element_size()
    for i, t in enumerate(ts):
        if t.data_ptr() != base + i * step or not t.is_contiguous():
            return False
    return True
