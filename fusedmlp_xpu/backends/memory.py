"""Allocation of kernel outputs, in one place so the test suite can poison them with NaN."""
from __future__ import annotations

import torch


def new_empty(*shape: int, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """An uninitialised [*shape] tensor on ``like``'s device, of ``dtype`` or ``like``'s."""
    return torch.empty(shape, device=like.device, dtype=dtype or like.dtype)
