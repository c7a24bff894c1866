"""Backends: one module each, all with the small interface of ``Backend``.

A backend sees 2-D tensors only (x: [N, in_features], contiguous rows are not
assumed), the validated ``MLPSpec``, and returns new tensors. It knows nothing of
modules or of the dispatcher. Outputs that a kernel writes are allocated with
``memory.new_empty`` (called through the module, so the test suite can poison them).

Note: ``fusedmlp_xpu.backends`` as an attribute is the public function; import this
package's modules relatively or through ``importlib``.
"""
from __future__ import annotations

import contextlib
from typing import Sequence

import torch

from ..spec import MLPSpec


class Backend:
    """What every backend provides. ``available``/``supports`` return (ok, reason)."""

    name: str = "?"
    #: device types this backend can ever run on
    device_types: tuple[str, ...] = ()

    def available(self) -> tuple[bool, str]:
        """Whether the backend can run in this process at all (imports, toolchain, build)."""
        raise NotImplementedError

    #: whether it trains: ``forward(save=True)`` and ``backward``; False for an
    #: inference-only backend, to which the dispatcher gives no training call
    trains: bool = True
    #: whether ``forward(save=True)`` saves the pre-activations (``recompute=False``); a
    #: backend whose backward always recomputes them raises there instead
    saves: bool = True

    def train_support(self, spec: MLPSpec, device: torch.device) -> tuple[bool, str]:
        """Whether it trains ``spec`` on ``device`` (for a training call the dispatcher
        asks this after ``supports``); the reason where not. Default: ``trains``."""
        if self.trains:
            return True, ""
        return False, "inference only (no saving forward, no backward)"

    def supports(self, spec: MLPSpec, device: torch.device) -> tuple[bool, str]:
        """Whether it can compute ``spec`` on ``device`` (what a forced backend runs); the
        reason either way."""
        raise NotImplementedError

    def preferred(self, spec: MLPSpec, device: torch.device,
                  train: bool = False) -> tuple[bool, str]:
        """Whether the dispatcher, choosing unforced, takes it for a ``spec`` it supports on
        ``device`` (``train``: for a training call); (False, why) where it runs only when
        forced (such as a backend not yet measured faster than the next one in the
        dispatcher's order)."""
        return True, ""

    def forward(
        self, x: torch.Tensor, weights: Sequence[torch.Tensor],
        biases: Sequence[torch.Tensor] | None, spec: MLPSpec, save: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: [N, in] -> (y: [N, out], saved). ``saved`` (only when ``save``, else None) is
        one [N, saved_width(spec)] tensor: the pre-activations z_1..z_{L-1} of the hidden
        layers side by side, then z_L when the output activation is not none."""
        raise NotImplementedError

    def recomputes(self, spec: MLPSpec, device: torch.device) -> bool:
        """Whether training on ``device`` should save nothing and recompute in backward
        when the caller leaves ``recompute`` to the backend (None): where its backward
        recomputes the pre-activations on chip faster than a saving forward writes them
        and backward reads them back."""
        return False

    def torch_rows(self, spec: MLPSpec, device: torch.device,
                   train: bool) -> tuple[tuple[int, int], ...]:
        """The row ranges (inclusive (lo, hi) pairs) where a plain eager call (not
        compiled, not forced to this backend) runs as the reference's torch ops instead,
        a training call recording torch's own autograd graph: where those were measured
        faster (a host-bound step pays for the op's Python autograd node; the vendor
        library's GEMMs with a separate epilogue may beat the kernels at some shapes).
        ``train``: for training calls, else for no-grad ones. Empty: never."""
        return ()

    def backward(
        self, grad_y: torch.Tensor, x: torch.Tensor, weights: Sequence[torch.Tensor],
        biases: Sequence[torch.Tensor] | None, saved: torch.Tensor | None,
        spec: MLPSpec, needs: tuple[bool, bool, bool],
    ) -> tuple[torch.Tensor | None, list[torch.Tensor], list[torch.Tensor]]:
        """grad_y: [N, out] -> (grad_x | None, grad_weights, grad_biases).

        ``saved`` is what ``forward(save=True)`` returned, or None: then recompute.
        ``needs`` = (x, weights, biases); lists are empty where not needed.
        """
        raise NotImplementedError

    def second_order(
        self, gg: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
        weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor] | None,
        spec: MLPSpec, needs: tuple[bool, bool, bool, bool],
    ) -> tuple | None:
        """The second-order backward of the input gradient g = (dy/dx)^T v in closed form
        (fusedmlp_xpu/second_order.py): gg [N, in] is the gradient at g -> (grad v | None,
        grad x | None, grad weights, grad biases), ``needs`` = (v, x, weights, biases),
        lists empty where not needed. None: not here (the op computes it as torch ops)."""
        return None

    def second_order_form(self, spec: MLPSpec, device: torch.device, rows: int | None = None):
        """Where its second-order backward over ``rows`` rows (None: not known) is the
        closed form in whole-batch passes (an object with second_order.TorchForm's
        ``first``/``tangent``/``finish``): the input gradient's node keeps the first pass
        from its forward, and a loss's gradient at y joins its last pass. None (the
        default): the node calls ``backward`` and ``second_order`` instead, or the
        torch-op form where ``second_order_torch_form``."""
        return None

    # a backend whose backward is torch ops anyway: the input gradient's node runs the
    # closed form as torch ops in passes (second_order.TorchForm), as second_order_form's
    second_order_torch_form = False


def device_guard(t: torch.Tensor):
    """Make ``t``'s device current while launching: Triton (and torch's current stream or
    queue) follow the current device, which need not be the tensors' device."""
    if t.device.type == "cuda":
        # already current (the usual case): no guard, ~3.5 us of host time a launch
        if torch.cuda.current_device() == t.device.index:
            return contextlib.nullcontext()
        return torch.cuda.device(t.device)
    if t.device.type == "xpu":
        return torch.xpu.device(t.device)
    return contextlib.nullcontext()


def saved_widths(spec: MLPSpec) -> list[int]:
    """Column widths of the pre-activations ``forward(save=True)`` stores, in order."""
    return list(spec.widths[1:-1]) + ([spec.out_features] if spec.output_activation != "none" else [])


def backward_rows(be, grad_y, x, weights, biases, saved, spec: MLPSpec, needs):
    """``be.backward`` on inputs of any leading dims (flattened to rows, grad_x shaped back
    like x). Returns (grad_x | None, grad_weights, grad_biases)."""
    flat = x.dim() == 2  # [rows, in] already: no reshapes (host time at decode sizes)
    if not flat:
        rows = x.shape[:-1].numel()
        grad_y = grad_y.reshape(rows, spec.out_features)
        saved = None if saved is None else saved.reshape(rows, saved.shape[-1])
    gx, gw, gb = be.backward(
        grad_y if grad_y.is_contiguous() else grad_y.contiguous(),
        x if flat else x.reshape(-1, spec.in_features), weights, biases, saved, spec, needs)
    return (gx if gx is None or flat else gx.reshape(x.shape)), gw, gb
