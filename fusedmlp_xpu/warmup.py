"""``warmup(model, rows)``: compile a model's fused kernels ahead of its first real call.

The first call of each new shape compiles its kernels (Triton and Gluon JIT, the wide
GEMMs' autotuning): about 2 s for a narrow train step on an H200 host, seconds more for
wide layers. A training loop or a server that would rather pay that before its first
step calls ``warmup`` with the row counts it will run.
"""
from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import nn

from .gated import GatedMLP, GatedMLPView
from .module import FusedMLP


def _in_features(mod: nn.Module) -> int:
    if isinstance(mod, FusedMLP):
        return mod.in_features
    if isinstance(mod, GatedMLPView):
        return mod.gate_up_params()[0].shape[1]
    return mod.gate_proj.in_features


def fused_modules(model: nn.Module) -> list[nn.Module]:
    """The FusedMLP, GatedMLP and GatedMLPView modules in ``model`` (itself included)."""
    return [m for m in model.modules() if isinstance(m, (FusedMLP, GatedMLP, GatedMLPView))]


def warmup(model: nn.Module, rows: int | Iterable[int], *, train: bool | None = None) -> float:
    """Run every fused module in ``model`` once per row count in ``rows`` on random inputs,
    so that the kernels those calls use are compiled (and tuned) before the real ones.

    train: also a backward to the input and every parameter that requires grad (default:
    the module's ``training`` flag); gradients are returned by ``torch.autograd.grad`` and
    dropped, so no ``.grad`` changes. A model that runs under ``torch.autocast`` is warmed
    up under the same autocast (the inputs are in the parameters' dtype). Returns the
    seconds it took (the device synchronized). Parameters and the random number
    generators are left as they were (the inputs are constant: compiling and tuning look
    at shapes, not values)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected an nn.Module, got {type(model).__name__}")
    counts = [rows] if isinstance(rows, int) else list(rows)
    if not counts or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                             for n in counts):
        raise ValueError(f"rows: expected a positive int or a non-empty list of them, got "
                         f"{rows!r}")
    mods = fused_modules(model)
    if not mods:
        raise ValueError("model: holds no FusedMLP, GatedMLP or GatedMLPView (fuse_mlps / "
                         "fuse_gated_mlps swap them in)")
    t0 = time.perf_counter()
    devices = set()
    for mod in mods:
        p = next(mod.parameters())
        devices.add(p.device)
        params = [q for q in mod.parameters() if q.requires_grad]
        grad = mod.training if train is None else train
        for n in counts:
            x = torch.full((n, _in_features(mod)), 0.5, device=p.device, dtype=p.dtype)
            with torch.no_grad():
                mod(x)
            if grad:
                x.requires_grad_()
                y = mod(x)
                torch.autograd.grad(y, [x, *params], torch.ones_like(y))
    for dev in devices:
        if dev.type in ("cuda", "xpu"):
            getattr(torch, dev.type).synchronize(dev)
    return time.perf_counter() - t0
