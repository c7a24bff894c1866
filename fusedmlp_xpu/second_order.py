"""Second derivatives through the narrow MLP by their closed form: the input gradient as a
node of its own.

An eikonal loss (neural SDFs: NeuS, VolSDF, instant-nsr) takes g = (dy/dx)^T v, the MLP's
input gradient, with ``create_graph=True`` and differentiates a loss on g back to the
weights. Recording the first backward op by op (``op.grads_by_recompute``) costs eager's
double backward plus a forward. Here g is one autograd node, ``InputGrad``, whose
backward is the closed form. With z_l the pre-activations of layer l = 1..L, a_l = s_l(z_l)
(a_0 = x), u_l the first backward's gradient at a_l (u_L = v) and d_l = u_l s_l'(z_l)
(so g = d_1 W_1), the gradient G of a loss on g gives:

    tangent pass    t_0 = G, T_l = t_{l-1} W_l^T, t_l = T_l s_l'(z_l)     (v's gradient: t_L)
                    W_l gets d_l^T t_{l-1};  zbar_l = T_l u_l s_l''(z_l)
    backward pass   e_L = zbar_L, e_{l-1} = (e_l W_l) s_{l-1}'(z_{l-1}) + zbar_{l-1}
                    W_l gets e_l^T a_{l-1}, b_l gets sum(e_l), x gets e_1 W_1

(T_l is also the gradient of d_l; zbar_l is zero for relu, leaky relu and none, and the
backward pass then has nothing to carry.) The node applies where the running backward
needs the MLP's input gradient only (``torch.autograd.grad(y, x, create_graph=True)``, the
eikonal pattern); where it also needs the weights' first gradients (``.backward(
create_graph=True)``, gradgradcheck) the op records its backward instead. ``InputGrad``'s
own backward run with ``create_graph=True`` (third derivatives) recomputes g as torch ops
and differentiates that.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import activations
from .backends import backward_rows
from .backends.reference import _times_grad
from .spec import MLPSpec

#: off: every differentiable backward records its ops (op.grads_by_recompute); the tests
#: compare both
ENABLED = True


def _grad_node(t: torch.Tensor):
    """The autograd node that receives ``t``'s gradient (a leaf's AccumulateGrad)."""
    if t.grad_fn is not None:
        return t.grad_fn
    with torch.enable_grad():
        return t.view_as(t).grad_fn.next_functions[0][0]


def will_run(t: torch.Tensor) -> bool:
    """Whether the backward pass running now will compute ``t``'s gradient."""
    if not t.requires_grad:
        return False
    try:
        return torch._C._will_engine_execute_node(_grad_node(t))
    except RuntimeError:
        # autograd.grad() refuses to answer for a leaf it was asked for: it is an input
        return True
    except Exception:  # noqa: BLE001 -- an older torch without the query: assume needed
        return True


def applies(spec: MLPSpec, x: torch.Tensor, params) -> bool:
    """Whether a differentiable backward of the MLP can be ``InputGrad``: the running
    backward needs x's gradient and none of the parameters', and every activation has a
    second derivative in the registry."""
    if not ENABLED or spec.dtype not in (torch.float16, torch.bfloat16, torch.float32,
                                         torch.float64):
        return False
    if not will_run(x):
        return False
    return not any(will_run(p) for p in params)


def grads_by_recompute(fn, grad_y, groups):
    """The gradients, for each tensor in ``groups`` (lists of tensors), of ``fn()`` (a
    torch-ops forward of them) against ``grad_y``: ``fn`` runs again under grad mode and
    torch's autograd differentiates that graph with ``create_graph=True``. So a backward
    that autograd must record (second derivatives, eikonal losses) is torch's own: eager's
    derivative formulas, their second derivatives, fused kernels and NaN behaviour, at
    eager's cost plus one forward. A tensor that requires no grad gets zeros."""
    with torch.enable_grad():
        y = fn()
    flat = [t for g in groups for t in g]
    live = [i for i, t in enumerate(flat) if t.requires_grad]
    got = torch.autograd.grad(y, [flat[i] for i in live], grad_y.reshape(y.shape),
                              create_graph=True, allow_unused=True) if live else ()
    out = [None] * len(flat)
    for i, g in zip(live, got):
        out[i] = g
    out = [torch.zeros_like(t) if g is None else g for g, t in zip(out, flat)]
    res, k = [], 0
    for g in groups:
        res.append(out[k:k + len(g)])
        k += len(g)
    return res


def _act(name):
    return activations.ACTIVATIONS[name]


def _layer_acts(spec: MLPSpec):
    hid, out = _act(spec.activation), _act(spec.output_activation)
    return [hid] * (spec.n_layers - 1) + [out]


def _times(g, act, z, second: bool):
    """g * s'(z) (``second``: g * s''(z)), in float32 at least, rounded to g's dtype."""
    wide = torch.promote_types(z.dtype, torch.float32)
    if second:
        return (g.to(wide) * act.grad2(z.to(wide))).to(g.dtype)
    return _times_grad(g, act, z)


def _first(v, x, weights, biases, spec):
    """The first backward as torch ops: (pre-activations z_l, inputs a_{l-1}, gradients
    u_l at each layer's output, d_l, g)."""
    acts = _layer_acts(spec)
    zs, inputs = [], []
    a = x
    for i, w in enumerate(weights):
        inputs.append(a)
        z = F.linear(a, w, None if biases is None else biases[i])
        zs.append(z)
        a = acts[i].fn(z)
    us, ds = [None] * spec.n_layers, [None] * spec.n_layers
    u = v
    for i in range(spec.n_layers - 1, -1, -1):
        us[i] = u
        ds[i] = _times(u, acts[i], zs[i], False)
        u = ds[i].mm(weights[i])
    return zs, inputs, us, ds, u


def input_grad_torch(v, x, weights, biases, spec):
    """g = (dy/dx)^T v by torch ops, differentiable (third derivatives recompute this)."""
    return _first(v, x, weights, biases, spec)[-1]


def grads(gbar, v, x, weights, biases, spec, needs):
    """The closed-form second-order gradients (module docstring) as torch ops: (v's, x's,
    the weights', the biases') gradients of a loss whose gradient at g is ``gbar``.
    ``needs``: (v, x, weights, biases); None where not needed."""
    need_v, need_x, need_w, need_b = needs
    acts = _layer_acts(spec)
    zs, inputs, us, ds, _ = _first(v, x, weights, biases, spec)
    L = spec.n_layers
    gw = [None] * L
    zbar = [None] * L
    t = gbar
    for i in range(L):
        if need_w:
            gw[i] = ds[i].t().mm(t)
        T = t.mm(weights[i].t())
        if acts[i].grad2 is not None:
            zbar[i] = _times(T * us[i], acts[i], zs[i], True)
        t = _times(T, acts[i], zs[i], False)
    gv = t if need_v else None
    gb = [None] * L
    gx = None
    e = None
    for i in range(L - 1, -1, -1):
        if e is not None:
            e = _times(e, acts[i], zs[i], False)
        if zbar[i] is not None:
            e = zbar[i] if e is None else e + zbar[i]
        if e is None:
            continue
        if need_w:
            gw[i] = gw[i] + e.t().mm(inputs[i])
        if need_b and biases is not None:
            gb[i] = e.sum(0, dtype=torch.promote_types(e.dtype, torch.float32)).to(e.dtype)
        e = e.mm(weights[i])
    if need_x:
        gx = e if e is not None else torch.zeros_like(x)
    if need_b and biases is not None:
        gb = [torch.zeros_like(b) if g is None else g for g, b in zip(gb, biases)]
    return gv, gx, gw, gb


def input_grad(spec, be, saved, v, x, params):
    """g = (dy/dx)^T v as the ``InputGrad`` node; ``saved``: the pre-activations the forward
    saved on ``be`` (or None), detached: the node reads them, nothing differentiates them."""
    z = None if saved is None else saved.detach()
    return InputGrad.apply(spec, be, z, v, x, *params)


class InputGrad(torch.autograd.Function):
    """g = (dy/dx)^T v of the MLP on backend ``be``; backward: the closed form. ``saved``:
    the pre-activations the forward saved on ``be`` (None: the backend computes them
    again), read by the first backward only: its backward recomputes what it needs."""

    @staticmethod
    def forward(ctx, spec, be, saved, v, x, *params):
        n = spec.n_layers
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        gx, _, _ = backward_rows(be, v, x, weights, biases, saved, spec, (True, False, False))
        ctx.spec, ctx.be = spec, be
        ctx.save_for_backward(v, x, *params)
        return gx

    @staticmethod
    def backward(ctx, gbar):
        spec, n = ctx.spec, ctx.spec.n_layers
        v, x, *params = ctx.saved_tensors
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        need = ctx.needs_input_grad
        need_v, need_x = need[3], need[4]
        need_w = any(need[5:5 + n])
        need_b = spec.bias and any(need[5 + n:])
        if torch.is_grad_enabled():  # create_graph=True again: third derivatives
            groups = [[v] if need_v else [], [x] if need_x else [],
                      list(weights) if need_w else [], list(biases) if need_b else []]
            gv, gx, gw, gb = grads_by_recompute(
                lambda: input_grad_torch(v, x, weights, biases, spec), gbar, groups)
            gv, gx = (gv[0] if gv else None), (gx[0] if gx else None)
        else:
            lead = x.shape[:-1]
            flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
            args = (flat(gbar.contiguous()), flat(v.contiguous()), flat(x), weights, biases,
                    spec, (need_v, need_x, need_w, need_b))
            out = ctx.be.second_order(*args)  # the backend's kernel, where it has one
            gv, gx, gw, gb = grads(*args) if out is None else out
            gv = None if gv is None else gv.reshape(*lead, gv.shape[-1])
            gx = None if gx is None else gx.reshape(x.shape)
        gw = list(gw) if need_w else [None] * n
        gb = (list(gb) if need_b else [None] * n) if spec.bias else []
        return (None, None, None, gv, gx, *gw, *gb)
