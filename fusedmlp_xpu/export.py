"""Decompositions of every ``fusedmlp`` op into standard aten ops, for deployment.

    fusedmlp::mlp, mlp_train, mlp_backward                  -> linear, the activations
    fusedmlp::gated_mlp, gated_mlp_train, gated_mlp_backward -> linear, act(g) * u

A program exported with ``torch.export`` holds the package's ops as they are (so
``torch.compile`` and a Python-side AOTInductor package keep the fused kernels).
Runtimes with no Python (onnxruntime, AOTInductor's C++ loader, ExecuTorch) cannot call
them: they need the same computation as standard ops. Each decomposition here is the
reference backend's computation (``backends/reference.py``, ``gated._Reference``), the
ground truth the kernels are tested against, written as torch ops that trace.

Where they are registered, and why there: in torch's global post-autograd decomposition
table (``torch._decomp.register_decomposition``, the table behind
``torch._decomp.decomposition_table``). ``torch.onnx.export(..., dynamo=True)`` builds its
decomposition table from that one (``create_onnx_friendly_decomposition_table``: every
entry with no ONNX translation), so ONNX export decomposes the ops with no argument from
the user. The alternatives each ask more of the user or give up speed:

- an ONNX translation (``custom_translation_table``) is an argument on every export call;
- a ``CompositeImplicitAutograd`` kernel or a Python front that traces into aten ops
  whenever ``torch.compiler.is_exporting()`` would drop the fused op from every exported
  program, AOTInductor on a GPU included, where the op is what the user came for;
- inductor's own table would decompose the op under ``torch.compile`` too.

torch.compile's inductor decomposes with a table of its own, so compiled code still calls
the op (tests/test_deploy.py checks), as does ``ExportedProgram.run_decompositions()``
with its default table. For the other runtimes, decompose the exported program first::

    ep = torch.export.export(model.eval(), (x,))
    ep = ep.run_decompositions(fm.export_decompositions())   # standard aten ops only

The activations follow the registry (``activations.py``): the same torch functions as
eager (``gelu(approximate="tanh")``, ``softplus(beta=1, threshold=20)``), so every
runtime's lowering of those aten ops is the one it uses for an unfused model. Softplus
with another beta never reaches the op: ``fused_mlp`` folds beta into the parameters
(``op.fold_softplus_beta``), and the folding's multiplications and division are traced
into the program as ordinary ops.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._decomp import register_decomposition

from . import activations, dispatch, gated
from .backends import backward_rows
from .spec import MLPSpec

_ops = torch.ops.fusedmlp


def _spec(x, weights, biases, activation, output_activation) -> MLPSpec:
    widths = (x.shape[-1],) + tuple(w.shape[0] for w in weights)
    return MLPSpec(widths, activation, output_activation, biases is not None, x.dtype)


def _layers(x, weights, biases, activation, output_activation):
    """(y, pre-activations of every layer) as eager's nn.Sequential computes them; x:
    [..., in_features]."""
    act = activations.get(activation).fn
    out_act = activations.get(output_activation).fn
    last = len(weights) - 1
    h, pre = x, []
    for i, w in enumerate(weights):
        z = F.linear(h, w, None if biases is None else biases[i])
        pre.append(z)
        h = act(z) if i < last else out_act(z)
    return h, pre


def mlp(x, weights, biases, activation, output_activation, backend):
    return _layers(x, weights, biases, activation, output_activation)[0]


def mlp_train(x, weights, biases, activation, output_activation, backend):
    """(y, saved): saved holds the pre-activations as ``Backend.forward(save=True)``
    does, side by side on the last dimension (``saved_widths``)."""
    y, pre = _layers(x, weights, biases, activation, output_activation)
    if activations.get(output_activation).name == "none":
        pre = pre[:-1]  # the output layer's is kept only with an output activation
    if not pre:  # one layer, no output activation: [..., 0]
        return y, x.new_empty(*x.shape[:-1], 0)
    return y, torch.cat(pre, dim=-1)


def mlp_backward(grad_y, x, weights, biases, saved, activation, output_activation, backend,
                 need_x, need_w, need_b):
    spec = _spec(x, weights, biases, activation, output_activation)
    gx, gw, gb = backward_rows(dispatch.REGISTRY["reference"], grad_y, x, weights, biases,
                               saved, spec, (need_x, need_w, need_b and biases is not None))
    return ([gx] if need_x else []), list(gw), list(gb)


def gated_mlp(x, w_gate, w_up, w_down, biases, activation, backend):
    return gated._Reference.gated_forward(x, w_gate, w_up, w_down, activation, False,
                                          biases)[0]


def gated_mlp_train(x, w_gate, w_up, w_down, biases, activation, backend):
    y, (g, u) = gated._Reference.gated_forward(x, w_gate, w_up, w_down, activation, True,
                                               biases)
    return y, g, u


def gated_mlp_backward(grad_y, x, w_gate, w_up, w_down, biases, saved, activation, backend,
                       need_x, need_w, need_b):
    gx, gw, gb = gated._backward_rows(gated._Reference, grad_y, x, w_gate, w_up, w_down,
                                      list(saved), activation,
                                      (need_x, need_w, need_b and biases is not None), biases)
    return ([gx] if need_x else []), list(gw), list(gb)


#: op overload -> its decomposition
DECOMPOSITIONS = {
    _ops.mlp.default: mlp,
    _ops.mlp_train.default: mlp_train,
    _ops.mlp_backward.default: mlp_backward,
    _ops.gated_mlp.default: gated_mlp,
    _ops.gated_mlp_train.default: gated_mlp_train,
    _ops.gated_mlp_backward.default: gated_mlp_backward,
}

for _op, _fn in DECOMPOSITIONS.items():
    register_decomposition(_op)(_fn)


def export_decompositions():
    """torch.export's default decomposition table with the package's ops added: give it
    to ``ExportedProgram.run_decompositions`` and the program holds standard aten ops
    only (no ``fusedmlp::*``), ready for AOTInductor's C++ loader or ExecuTorch."""
    table = torch.export.default_decompositions()
    for op_, fn in DECOMPOSITIONS.items():
        table[op_] = fn
    return table
