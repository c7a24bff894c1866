"""The reference backend: composite torch ops on any device, width, depth and dtype.

It computes exactly what the ``nn.Sequential`` of ``nn.Linear`` and activation modules
computes (same matmuls, same rounding of each layer to the operand dtype), so it is
the fallback everywhere and, run in float64, the ground truth of the test suite.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import activations
from . import Backend, saved_widths


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

    def forward(self, x, weights, biases, spec, save):
        act = activations.ACTIVATIONS[spec.activation].fn
        out_act = activations.ACTIVATIONS[spec.output_activation]
        saved = []
        h = x
        last = len(weights) - 1
        for i, w in enumerate(weights):
            z = F.linear(h, w, None if biases is None else biases[i])
            if i < last:
                if save:
                    saved.append(z)
                h = act(z)
            else:
                if save and out_act.name != "none":
                    saved.append(z)
                h = out_act.fn(z)
        return h, (torch.cat(saved, dim=-1) if save and saved else x.new_empty(x.shape[0], 0)
                   if save else None)

    def backward(self, grad_y, x, weights, biases, saved, spec, needs):
        need_x, need_w, need_b = needs
        if saved is None:
            _, saved = self.forward(x, weights, biases, spec, save=True)
        saved = saved.split(saved_widths(spec), dim=-1)
        act = activations.ACTIVATIONS[spec.activation]
        out_act = activations.ACTIVATIONS[spec.output_activation]
        L = len(weights)
        # inputs of each layer: h_0 = x, h_i = act(z_i)
        inputs = [x] + [act.fn(z) for z in saved[: L - 1]]
        g = grad_y
        if out_act.name != "none":
            g = _times_grad(g, out_act, saved[L - 1])
        grad_w, grad_b = [None] * L, [None] * L
        grad_x = None
        for i in range(L - 1, -1, -1):
            if need_w:
                grad_w[i] = g.t().mm(inputs[i])
            if need_b and biases is not None:
                # summed in float32 at least (half-precision sums lose the small terms),
                # in float64 for float64
                grad_b[i] = g.sum(0, dtype=torch.promote_types(g.dtype, torch.float32)
                                  ).to(g.dtype)
            if i > 0:
                g = _times_grad(g.mm(weights[i]), act, saved[i - 1])
            elif need_x:
                grad_x = g.mm(weights[0])
        return (
            grad_x,
            grad_w if need_w else [],
            grad_b if need_b and biases is not None else [],
        )


def _times_grad(g, act, z):
    """g * act'(z), the derivative evaluated in float32 at least, rounded to g's dtype.
    relu and leaky relu select instead, as torch's backward does: a NaN in g stays NaN only
    where the unit is on (NaN * 0 would spread it to every row)."""
    if act.name == "none":
        return g
    if act.name == "relu":
        return g.masked_fill(z <= 0, 0)
    if act.name == "leaky_relu":
        return torch.where(z > 0, g, g * activations.LEAKY_RELU_SLOPE)
    wide = torch.promote_types(z.dtype, torch.float32)
    return (g.to(wide) * act.grad(z.to(wide))).to(g.dtype)
