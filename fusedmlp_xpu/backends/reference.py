"""The reference backend: composite torch ops on any device, width, depth and dtype.

It computes exactly what the ``nn.Sequential`` of ``nn.Linear`` and activation modules
computes (same matmuls, same rounding of each layer to the operand dtype), so it is
the fallback everywhere and, run in float64, the ground truth of the test suite.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from .. import activations
from . import Backend, saved_widths


#: every row count (Backend.torch_rows' inclusive pairs)
ALL_ROWS = ((0, 2 ** 63 - 1),)


class ReferenceBackend(Backend):
    name = "reference"
    device_types = ("cpu", "cuda", "xpu")
    second_order_torch_form = True

    def available(self):
        return True, "composite torch ops, always available"

    def supports(self, spec, device):
        if device.type == "cpu" and spec.dtype in (torch.float16, torch.bfloat16):
            return True, "torch ops (CPU half-precision matmuls are slow but exact to the dtype)"
        return True, ("torch ops: any width, depth, dtype; second derivatives through the "
                      "input gradient (eikonal) in closed form as torch ops")

    def torch_rows(self, spec, device, train):
        """On the CPU, a plain eager training call chosen unforced records torch's own
        autograd graph of these same ops, as nn.Sequential does (its backward, its
        derivatives of every order, what it saves), instead of the op's autograd node:
        measured faster there (benchmarks/cpu_eager.py on a 2-core CPU: the node's train
        step 0.58-0.95x eager's, this 0.93-1.07x, cpu-eager-{node-20261204,20261204b}.json).
        Elsewhere (the reference as a GPU's fallback) that was not measured: the node."""
        return ALL_ROWS if train and device.type == "cpu" else ()

    def forward(self, x, weights, biases, spec, save):
        act = activations.ACTIVATIONS[spec.activation].fn
        out_act = activations.ACTIVATIONS[spec.output_activation]
        last = len(weights) - 1
        # saved: the pre-activations side by side, each copied into its columns as it is
        # computed (layer i has columns cols[i]:cols[i + 1], the output layer only with an
        # output activation)
        cols = list(itertools.accumulate(saved_widths(spec), initial=0)) if save else [0]
        saved = x.new_empty(x.shape[0], cols[-1]) if save else None
        h = x
        # one name for the layer's input, pre-activation and output: each is let go as
        # soon as the next exists (one more [M, width] buffer alive a layer made a
        # 2^16-row CPU forward 20-40% slower, through the allocator)
        for i, w in enumerate(weights):
            h = F.linear(h, w, None if biases is None else biases[i])
            if i < len(cols) - 1:
                saved[:, cols[i]:cols[i + 1]].copy_(h)
            h = act(h) if i < last else out_act.fn(h)
        return h, saved

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        need_x, need_w, need_b = needs
        if saved is None:
            _, saved = self.forward(x, weights, biases, spec, save=True)
        saved = saved.split(saved_widths(spec), dim=-1)
        act = activations.ACTIVATIONS[spec.activation]
        out_act = activations.ACTIVATIONS[spec.output_activation]
        L = len(weights)
        g = grad_y
        if out_act.name != "none":
            g = _times_grad(g, out_act, saved[L - 1])
        grad_w, grad_b = [None] * L, [None] * L
        grad_x = None
        for i in range(L - 1, -1, -1):
            # the pre-activation below layer i, read twice: its own columns first (the
            # elementwise ops on a column slice of saved ran 3-4x slower on a CPU, in bf16)
            z = saved[i - 1].contiguous() if i > 0 else None
            if need_w:
                # layer i's input, h_0 = x, h_i = act(z_i): computed when it is needed
                h = x if i == 0 else act.fn(z)
                grad_w[i] = g.t().mm(h)
                del h
            if need_b and biases is not None:
                # summed in float32 at least (half-precision sums lose the small terms),
                # in float64 for float64
                grad_b[i] = g.sum(0, dtype=torch.promote_types(g.dtype, torch.float32)
                                  ).to(g.dtype)
            if i > 0:
                g = _times_grad(g.mm(weights[i]), act, z)
            elif need_x:
                grad_x = g.mm(weights[0])
        return (
            grad_x,
            grad_w if need_w else [],
            grad_b if need_b and biases is not None else [],
        )


def _times_grad(g, act, z):
    """g * act'(z), rounded to g's dtype once: by the backward kernel eager autograd runs
    for the activation (Activation.backward) where g and z share a dtype and autograd is
    not recording (some of those kernels have no derivative), else with the derivative
    evaluated in float32 at least. relu and leaky relu select, as torch's backward does: a
    NaN in g stays NaN only where the unit is on (NaN * 0 would spread it to every row)."""
    if act.name == "none":
        return g
    if (act.backward is not None and g.dtype == z.dtype
            and not (torch.is_grad_enabled() and (g.requires_grad or z.requires_grad))):
        return act.backward(g, z)
    if act.name == "relu":
        return g.masked_fill(z <= 0, 0)
    if act.name == "leaky_relu":
        return torch.where(z > 0, g, g * activations.LEAKY_RELU_SLOPE)
    wide = torch.promote_types(z.dtype, torch.float32)
    return (g.to(wide) * act.grad(z.to(wide))).to(g.dtype)
