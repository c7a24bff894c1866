"""A candidate measured and not taken (benchmarks/NOTES.md, wide history 16): few-row
training calls as torch's own ops under ONE autograd node.

Plain eager training calls with few rows run torch's ops (``Backend.torch_train_rows``):
cuBLAS's GEMMs there beat the Triton train path, and the step is host time. With
torch's own autograd graph every op is a node (two per nn.Linear, one per activation),
and on CUDA each node's hand-off to the autograd engine's device thread costs host time.
The guess was that one node for the whole MLP costs less; on the H200 host it cost
30-70 us a step more (probe_host_small.py's "node" variant). Here the whole MLP is one
node: the forward runs the same ops as eager nn.Linear layers
and activations and saves what eager's nodes save (each layer's input, and the
pre-activation or the activation's output where eager's derivative reads it), and the
backward runs the derivative kernels eager's nodes run (``aten.*_backward``, the GEMMs
for x and the weights, the bias sums), skipping the gradients nobody asked for. Same
kernels, same memory, same values as eager up to the GEMMs' summation order.

Double backward (``create_graph=True``): the saved intermediates were made without a
graph, so that backward runs the forward's ops again from the inputs and differentiates
them with torch's autograd, keeping that graph (as eager would have).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fusedmlp_xpu.activations import ACTIVATIONS, LEAKY_RELU_SLOPE, SOFTPLUS_BETA, SOFTPLUS_THRESHOLD

_aten = torch.ops.aten

# activation -> (what its derivative reads: "z" (the pre-activation) or "h" (the output),
# the derivative as eager's autograd computes it: grad, that tensor -> grad wrt z)
_BACKWARD = {
    "relu": ("h", lambda g, h: _aten.threshold_backward(g, h, 0)),
    "leaky_relu": ("z", lambda g, z: _aten.leaky_relu_backward(g, z, LEAKY_RELU_SLOPE, False)),
    "gelu": ("z", lambda g, z: _aten.gelu_backward(g, z)),
    "gelu_tanh": ("z", lambda g, z: _aten.gelu_backward(g, z, approximate="tanh")),
    "silu": ("z", lambda g, z: _aten.silu_backward(g, z)),
    "sigmoid": ("h", lambda g, h: _aten.sigmoid_backward(g, h)),
    "tanh": ("h", lambda g, h: _aten.tanh_backward(g, h)),
    "softplus": ("z", lambda g, z: _aten.softplus_backward(g, z, SOFTPLUS_BETA,
                                                          SOFTPLUS_THRESHOLD)),
}
assert set(_BACKWARD) | {"none"} == set(ACTIVATIONS), "an activation without its backward"


def _kept(name: str, z, h):
    """What the activation's derivative reads (None for the identity)."""
    how = _BACKWARD.get(name)
    return None if how is None else (z if how[0] == "z" else h)


def _through(name: str, g, kept):
    """g (wrt the activation's output) -> the gradient wrt its input."""
    how = _BACKWARD.get(name)
    return g if how is None else how[1](g, kept)


def _again(fn, inputs, needs, gy):
    """The gradients of fn(*inputs) for ``needs`` (a flag per input) with the graph kept:
    backward under create_graph=True."""
    asked = [t for t, n in zip(inputs, needs) if n]
    grads = iter(torch.autograd.grad(fn(*inputs), asked, gy, create_graph=True,
                                     allow_unused=True))
    return [next(grads) if n else None for n in needs]


def _forward(x, weights, biases, act, out):
    """The ops of nn.Linear layers and activation modules: y, each layer's input, and what
    each layer's activation derivative reads."""
    n = len(weights)
    h, inputs, kept = x, [], []
    for i, w in enumerate(weights):
        z = F.linear(h, w, None if biases is None else biases[i])
        name = act if i < n - 1 else out
        inputs.append(h)
        h = z if name == "none" else ACTIVATIONS[name].fn(z)
        kept.append(_kept(name, z, h))
    return h, inputs, kept


def _rows(t):
    """t as [rows, features]."""
    return t if t.dim() == 2 else t.reshape(-1, t.shape[-1])


class _MLPNode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, spec, x, *params):
        n = spec.n_layers
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        y, inputs, kept = _forward(x, weights, biases, spec.activation,
                                   spec.output_activation)
        ctx.spec = spec
        ctx.save_for_backward(*inputs, *kept, *params)
        return y

    @staticmethod
    def backward(ctx, gy):
        spec = ctx.spec
        n = spec.n_layers
        t = ctx.saved_tensors
        inputs, kept, weights = t[:n], t[n:2 * n], t[2 * n:3 * n]
        need = ctx.needs_input_grad  # (spec, x, *weights, *biases)
        if torch.is_grad_enabled():  # create_graph=True
            params = t[2 * n:]
            return (None, *_again(
                lambda x, *p: _forward(x, p[:n], p[n:] if spec.bias else None,
                                       spec.activation, spec.output_activation)[0],
                (inputs[0], *params), need[1:], gy))
        need_x, need_w = need[1], need[2:2 + n]
        need_b = need[2 + n:] if spec.bias else (False,) * n
        # the first layer whose gradient is asked for: the chain stops there
        first = 0 if need_x else min((i for i in range(n) if need_w[i] or need_b[i]),
                                     default=n)
        gws, gbs = [None] * n, [None] * n
        g = _through(spec.output_activation, gy, kept[n - 1])
        for i in range(n - 1, first - 1, -1):
            g2 = _rows(g)
            if need_w[i]:
                gws[i] = g2.t().mm(_rows(inputs[i]))
            if need_b[i]:
                gbs[i] = g2.sum(0)
            if i > 0 and i > first:
                g = _through(spec.activation, g.matmul(weights[i]), kept[i - 1])
            elif i == 0 and need_x:
                g = g.matmul(weights[0])
        return (None, g if need_x else None, *gws, *(gbs if spec.bias else ()))


def mlp(x, weights, biases, spec):
    """fused_mlp's value for validated inputs, as torch's ops under one autograd node."""
    return _MLPNode.apply(spec, x, *weights, *(biases or ()))


def _gated_forward(x, w_gate, w_up, w_down, biases, activation):
    """The ops of a Llama-style MLP block: (y, g, u, a = act(g), p = a * u)."""
    bg, bu, bd = biases if biases else (None, None, None)
    g, u = F.linear(x, w_gate, bg), F.linear(x, w_up, bu)
    a = ACTIVATIONS[activation].fn(g)
    p = a * u
    return F.linear(p, w_down, bd), g, u, a, p


class _GatedNode(torch.autograd.Function):
    @staticmethod
    def forward(ctx, activation, x, w_gate, w_up, w_down, *biases):
        y, g, u, a, p = _gated_forward(x, w_gate, w_up, w_down, biases, activation)
        ctx.activation, ctx.bias = activation, bool(biases)
        # eager's nodes keep the same: x, g (or a), a and u for the product, p
        ctx.save_for_backward(x, g, u, a, p, w_gate, w_up, w_down, *biases)
        return y

    @staticmethod
    def backward(ctx, gy):
        x, g, u, a, p, w_gate, w_up, w_down, *biases = ctx.saved_tensors
        need = ctx.needs_input_grad  # (activation, x, w_gate, w_up, w_down, *biases)
        if torch.is_grad_enabled():  # create_graph=True
            act = ctx.activation
            return (None, *_again(
                lambda x, wg, wu, wd, *b: _gated_forward(x, wg, wu, wd, b, act)[0],
                (x, w_gate, w_up, w_down, *biases), need[1:], gy))
        nb = need[5:] if ctx.bias else (False, False, False)
        gy2 = _rows(gy)
        gwd = gy2.t().mm(_rows(p)) if need[4] else None
        gbd = gy2.sum(0) if nb[2] else None
        gwg = gwu = gbg = gbu = gx = None
        if need[1] or need[2] or need[3] or nb[0] or nb[1]:
            gp = gy.matmul(w_down)
            gu = gp * a
            gg = _through(ctx.activation, gp * u, _kept(ctx.activation, g, a))
            gg2, gu2 = _rows(gg), _rows(gu)
            if need[2]:
                gwg = gg2.t().mm(_rows(x))
            if need[3]:
                gwu = gu2.t().mm(_rows(x))
            if nb[0]:
                gbg = gg2.sum(0)
            if nb[1]:
                gbu = gu2.sum(0)
            if need[1]:  # both products into one output: two GEMMs, no third kernel
                gx = torch.addmm(gg2.mm(w_gate), gu2, w_up)
                gx = gx if x.dim() == 2 else gx.reshape(x.shape)
        return (None, gx, gwg, gwu, gwd, *((gbg, gbu, gbd) if ctx.bias else ()))


def gated(x, w_gate, w_up, w_down, biases, activation):
    """fused_gated_mlp's value for validated inputs, as torch's ops under one node."""
    return _GatedNode.apply(activation, x, w_gate, w_up, w_down, *(biases or ()))
