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

The backward pass is y's first-order backward too, seeded with the loss's gradient at y
above the top layer (e_L = gy s_L'(z_L) + zbar_L): where the loss takes y as well, the
two nodes run that pass once between them (``_share``, ``take_over``). And where the
backend runs the closed form in passes (``Backend.second_order_form``), the node's forward
(g) is the first of them, kept for its backward.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from . import activations
from .backends import backward_rows, saved_widths
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


def _first(v, x, weights, biases, spec, saved=None):
    """The first backward as torch ops: (pre-activations z_l, inputs a_{l-1}, gradients
    u_l at each layer's output, d_l, g); ``saved``: the forward's pre-activations side by
    side (Backend.forward's), read instead of computed again, or None."""
    acts = _layer_acts(spec)
    L = spec.n_layers
    # contiguous: the same products as computing them (a retained graph's next backward
    # does, and gradcheck wants both bit for bit)
    kept = [] if saved is None else [z.contiguous() for z in
                                     saved.split(saved_widths(spec), dim=-1)]
    zs, inputs = [], []
    a = x
    for i, w in enumerate(weights):
        inputs.append(a)
        z = kept[i] if i < len(kept) else F.linear(a, w, None if biases is None else biases[i])
        zs.append(z)
        if i < L - 1:
            a = acts[i].fn(z)
    us, ds = [None] * L, [None] * L
    u = v
    for i in range(L - 1, -1, -1):
        us[i] = u
        ds[i] = _times(u, acts[i], zs[i], False)
        u = ds[i].mm(weights[i])
    return zs, inputs, us, ds, u


def input_grad_torch(v, x, weights, biases, spec):
    """g = (dy/dx)^T v by torch ops, differentiable (third derivatives recompute this)."""
    return _first(v, x, weights, biases, spec)[-1]


class TorchForm:
    """The closed form (module docstring) as torch ops, in the passes ``InputGrad`` runs
    (the interface of the Triton backend's GEMM form, narrow/second_order.GemmForm):
    ``first`` -> (g, state), ``tangent(state, gbar, need_v)`` -> v's gradient,
    ``finish(state, gy, (need_x, need_w, need_b))`` -> (x's, the weights', the biases'
    gradients); ``gy``, the loss's gradient at y (or None), enters the backward pass above
    the top layer, so y's first-order backward is that same pass."""

    def __init__(self, spec: MLPSpec):
        self.spec = spec
        self.acts = _layer_acts(spec)

    def first(self, v, x, weights, biases, saved, need_g=True):
        zs, inputs, us, ds, g = _first(v, x, weights, biases, self.spec, saved)
        return g, dict(x=x, zs=zs, inputs=inputs, us=us, ds=ds, weights=weights,
                       biases=biases)

    def tangent(self, st, gbar, need_v):
        acts, zs, us = self.acts, st["zs"], st["us"]
        ts, zbar = [], [None] * len(zs)
        t = gbar
        for i, w in enumerate(st["weights"]):
            ts.append(t)
            T = t.mm(w.t())
            if acts[i].grad2 is not None:
                zbar[i] = _times(T * us[i], acts[i], zs[i], True)
            t = _times(T, acts[i], zs[i], False)
        st.update(ts=ts, zbar=zbar)
        return t if need_v else None

    def finish(self, st, gy, needs):
        need_x, need_w, need_b = needs
        acts, zs, zbar, biases = self.acts, st["zs"], st["zbar"], st["biases"]
        need_b = need_b and biases is not None
        L = len(zs)
        gw = [st["ds"][i].t().mm(st["ts"][i]) for i in range(L)] if need_w else []
        gb = [None] * L
        e = gy
        for i in range(L - 1, -1, -1):
            if e is not None:
                e = _times(e, acts[i], zs[i], False)
            if zbar[i] is not None:
                e = zbar[i] if e is None else e + zbar[i]
            if e is None:
                continue
            if need_w:
                gw[i] = gw[i] + e.t().mm(st["inputs"][i])
            if need_b:
                gb[i] = e.sum(0, dtype=torch.promote_types(e.dtype, torch.float32)).to(e.dtype)
            e = e.mm(st["weights"][i])
        gx = (e if e is not None else torch.zeros_like(st["x"])) if need_x else None
        gb = [torch.zeros_like(b) if g is None else g for g, b in zip(gb, biases)] \
            if need_b else []
        return gx, gw, gb


def grads(gbar, v, x, weights, biases, spec, needs):
    """The closed-form second-order gradients (module docstring) as torch ops: (v's, x's,
    the weights', the biases') gradients of a loss whose gradient at g is ``gbar``.
    ``needs``: (v, x, weights, biases); None where not needed."""
    need_v, need_x, need_w, need_b = needs
    form = TorchForm(spec)
    _, st = form.first(v, x, weights, biases, None)
    gv = form.tangent(st, gbar, need_v)
    gx, gw, gb = form.finish(st, None, (need_x, need_w, need_b))
    return gv, gx, (gw if need_w else [None] * spec.n_layers), (gb or [None] * spec.n_layers)


def pass_form(be, spec, device, rows=None):
    """The closed form in passes on backend ``be`` over ``rows`` rows (``TorchForm``'s
    interface), or None."""
    form = be.second_order_form(spec, device, rows)
    return TorchForm(spec) if form is None and be.second_order_torch_form else form


def input_grad(spec, be, saved, v, x, params, owner=None, owner_needs=None):
    """g = (dy/dx)^T v as the ``InputGrad`` node; ``saved``: the pre-activations the forward
    saved on ``be`` (or None), detached: the node reads them, nothing differentiates them.
    ``owner``: the MLP's own autograd node (whose backward is creating g) and
    ``owner_needs`` its (x, weights, biases) needs: where the loss also reaches y, the two
    nodes run one backward pass between them (``_share``, ``take_over``)."""
    z = None if saved is None else saved.detach()
    g = InputGrad.apply(spec, be, z, None if owner is None else (owner, owner_needs),
                        v, x, *params)
    if owner is not None and g.grad_fn is not None:
        owner._fusedmlp_ig = weakref.ref(g.grad_fn)  # the InputGrad node (its ctx)
    return g


# One backward pass for y's loss and g's: a loss on both reaches the MLP's own node
# (through y) and InputGrad (through g). Both passes run the same chain down the layers,
# so the node autograd runs first leaves its part to the other, which runs the chain once
# seeded with both gradients: InputGrad's tangent pass and, above the top layer, the loss's
# gradient at y. Autograd's order between the two is not fixed (the CPU runs the later
# node first; a GPU's own thread numbers the nodes made in a backward apart), so either
# may come first. A node only leaves its part to one that has not run yet in this
# backward and will run in it, and only where both need the same gradients.


def _task() -> int:
    """The id of the backward pass running now (-1: none, or an older torch)."""
    get = getattr(torch._C, "_current_graph_task_id", None)
    return -1 if get is None else get()


def _will_run(node) -> bool:
    try:
        return bool(torch._C._will_engine_execute_node(node))
    except Exception:  # noqa: BLE001 -- no answer: keep the pass
        return False


def _share(ctx, form, state):
    """InputGrad's side, after its tangent pass -> (whether it finishes the pass here, the
    loss's gradient at y to seed it with, or None)."""
    task = _task()
    ctx._fusedmlp_ran = task
    left, ctx._fusedmlp_gy = getattr(ctx, "_fusedmlp_gy", None), None
    if ctx.owner is None or task < 0 or ctx.owner[1] != ctx.needs:
        return True, None
    if left is not None and left[0] == task:  # the MLP's node ran first and left y's part
        return True, left[1]
    node = ctx.owner[0]
    pending = getattr(node, "_fusedmlp_pending", None)
    if (getattr(node, "_fusedmlp_ran", None) == task or
            (pending is not None and pending[0] == task) or not _will_run(node)):
        return True, None
    node._fusedmlp_pending = (task, form, state, ctx.needs)
    return False, None


LEFT = object()  # take_over: the MLP node's part left to InputGrad, all its gradients None


def take_over(node, grad_y, x_shape, needs):
    """The MLP node's side (``node``: its ctx, ``needs``: its (x, weights, biases) needs),
    in a backward that does not create a graph -> (grad x, grad weights, grad biases) of
    the pass InputGrad left to it, run from ``grad_y`` too (lists empty where not needed);
    ``LEFT`` where it leaves ``grad_y`` to InputGrad instead; None: neither, the node runs
    its own backward."""
    ig = getattr(node, "_fusedmlp_ig", None)
    if ig is None:
        return None
    task = _task()
    node._fusedmlp_ran = task
    pending, node._fusedmlp_pending = getattr(node, "_fusedmlp_pending", None), None
    gy = None if grad_y is None else grad_y.reshape(-1, grad_y.shape[-1])
    if pending is not None and pending[0] == task:
        _, form, state, needs = pending
        gx, gw, gb = form.finish(state, gy, needs)
        return (None if gx is None else gx.reshape(x_shape)), gw, gb
    ig = ig()
    if (ig is None or task < 0 or gy is None or ig.form is None or ig.needs != needs
            or getattr(ig, "_fusedmlp_ran", None) == task or not _will_run(ig)):
        return None
    ig._fusedmlp_gy = (task, gy)
    return LEFT


def _rows(t: torch.Tensor) -> torch.Tensor:
    t = t if t.is_contiguous() else t.contiguous()
    return t.reshape(-1, t.shape[-1])


class InputGrad(torch.autograd.Function):
    """g = (dy/dx)^T v of the MLP on backend ``be``; backward: the closed form. ``saved``:
    the pre-activations the forward saved on ``be`` (None: computed again). Where the
    backend's closed form runs in passes (``Backend.second_order_form``) the forward is
    its first pass, kept for the backward; else the forward is the backend's first
    backward and its backward computes what it needs again. ``owner``: (the MLP's node,
    its needs), with which the backward may share its last pass (``_share``)."""

    @staticmethod
    def forward(ctx, spec, be, saved, owner, v, x, *params):
        n = spec.n_layers
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        form = pass_form(be, spec, x.device, x.numel() // max(x.shape[-1], 1))
        ctx.spec, ctx.be, ctx.form, ctx.owner, ctx.state = spec, be, form, owner, None
        need = ctx.needs_input_grad
        # (x, weights, biases): the needs of every backward of this node (and of the MLP
        # node's, whose pass it may share: ``_share``)
        ctx.needs = (need[5], any(need[6:6 + n]), spec.bias and any(need[6 + n:]))
        if form is None:
            gx, _, _ = backward_rows(be, v, x, weights, biases, saved, spec,
                                     (True, False, False))
        else:
            gx, ctx.state = form.first(_rows(v), _rows(x), weights, biases,
                                       None if saved is None else _rows(saved))
            gx = gx.reshape(x.shape)
        # the pre-activations too (the MLP node keeps them anyway): a retained graph's next
        # backward computes the first pass again from the same z, to the same bits
        ctx.save_for_backward(v, x, *params, *(() if saved is None else (saved,)))
        return gx

    @staticmethod
    def backward(ctx, gbar):
        spec, n = ctx.spec, ctx.spec.n_layers
        v, x, *params = ctx.saved_tensors
        n_p = n * (2 if spec.bias else 1)
        params, saved = params[:n_p], (params[n_p] if len(params) > n_p else None)
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        need_v, needs = ctx.needs_input_grad[4], ctx.needs
        need_x, need_w, need_b = needs
        # this backward's alone: a retained graph's next backward computes it again
        state, ctx.state = ctx.state, None
        if torch.is_grad_enabled():  # create_graph=True again: third derivatives
            groups = [[v] if need_v else [], [x] if need_x else [],
                      list(weights) if need_w else [], list(biases) if need_b else []]
            gv, gx, gw, gb = grads_by_recompute(
                lambda: input_grad_torch(v, x, weights, biases, spec), gbar, groups)
            gv, gx = (gv[0] if gv else None), (gx[0] if gx else None)
        else:
            form, out = ctx.form, None
            if form is None:  # the backend's kernel, where it has one
                out = ctx.be.second_order(_rows(gbar), _rows(v), _rows(x), weights, biases,
                                          spec, (need_v, *needs))
                form = TorchForm(spec) if out is None else None
            if out is not None:
                gv, gx, gw, gb = out
            else:
                if state is None:
                    _, state = form.first(_rows(v), _rows(x), weights, biases,
                                          None if saved is None else _rows(saved),
                                          need_g=False)
                gv = form.tangent(state, _rows(gbar), need_v)
                here, gy = _share(ctx, form, state)
                gx, gw, gb = form.finish(state, gy, needs) if here else (None, [], [])
            gv = None if gv is None else gv.reshape(*v.shape[:-1], gv.shape[-1])
            gx = None if gx is None else gx.reshape(x.shape)
        gw = list(gw) if need_w and gw else [None] * n
        gb = (list(gb) if need_b and gb else [None] * n) if spec.bias else []
        return (None, None, None, None, gv, gx, *gw, *gb)
