"""The torch.library custom ops of the ``fusedmlp`` namespace, and the functional entry.

    fusedmlp::mlp           forward; autograd recomputes hidden activations in backward
    fusedmlp::mlp_train     forward that also returns the saved pre-activations
    fusedmlp::mlp_backward  gradients for x, every weight and every bias

Each op has a fake implementation (any leading dims) for torch.compile/export, one
kernel per device type that asks the dispatcher for a backend, and autograd formulas
whose backward is itself an op. Autocast: under ``torch.autocast`` ``fused_mlp``
casts x, weights and biases to the region's dtype before the op (like nn.Linear).
"""
from __future__ import annotations

import math
import sys

from collections.abc import Iterable
from typing import Sequence

import torch
import torch.autograd.forward_ad as _forward_ad

from . import activations, dispatch, second_order
from .backends import backward_rows, saved_widths
from .second_order import grads_by_recompute  # noqa: F401  (gated.py's too)
from .spec import MLPSpec, _same, check_backend, check_recompute, validate

DEVICE_TYPES = ("cpu", "cuda", "xpu")

_FWD_ARGS = ("Tensor x, Tensor[] weights, Tensor[]? biases, str activation, "
             "str output_activation, str backend")


def _spec(x, weights, biases, activation, output_activation) -> MLPSpec:
    # the ops can be called directly (torch.ops.fusedmlp.*), past fused_mlp's validation:
    # at least every tensor on x's device and dtype (a kernel reads the others wrongly)
    dt, dev = x.dtype, x.device
    for name, ts in (("weights", weights), ("biases", biases or ())):
        for i, t in enumerate(ts):
            if t.dtype is not dt or t.device != dev:
                _same(t, dev, dt, i, name)
    widths = (x.shape[-1],) + tuple(w.shape[0] for w in weights)
    # not spec._spec's cache: under fake tensors (opcheck, compile) widths are SymInts,
    # which do not hash
    return MLPSpec(widths, activation, output_activation, biases is not None, x.dtype)


def _run_forward(x, weights, biases, spec, backend, save, be=None):
    be = dispatch.choose(x.device, spec, backend or None, train=save) if be is None else be
    if x.dim() == 2:  # already [rows, in]: no reshapes (host time per call)
        y, saved = be.forward(x, weights, biases, spec, save)
        return (y, saved) if save else y
    lead = x.shape[:-1]
    y, saved = be.forward(x.reshape(-1, spec.in_features), weights, biases, spec, save)
    y = y.reshape(*lead, spec.out_features)
    return (y, saved.reshape(*lead, saved.shape[-1])) if save else y


#: the package's ops (op.py, gated.py)
FUSED_OPS = ("fusedmlp::mlp", "fusedmlp::mlp_train", "fusedmlp::mlp_backward",
             "fusedmlp::gated_mlp", "fusedmlp::gated_mlp_train", "fusedmlp::gated_mlp_backward")


def keep_fused_under_inductor() -> None:
    """Tell inductor that its fallback to these ops (the fused kernels) is meant.

    fusedmlp_xpu.export registers decompositions of them for the exporters, and inductor's
    implicit fallback for an op that has one raises where the environment sets CI ("a
    decomposition exists, we should switch to it"), so a user's CI compiling a model with
    fused MLPs would fail. Its allow list is the way to keep such an op whole. Called from
    the fake implementations, which inductor's tracing runs before lowering; a dictionary
    lookup when inductor is not loaded or the ops are already listed."""
    low = sys.modules.get("torch._inductor.lowering")
    if low is not None and FUSED_OPS[0] not in low.FALLBACK_ALLOW_LIST:
        low.FALLBACK_ALLOW_LIST.update(FUSED_OPS)


# --- forward (recompute in backward) -------------------------------------------------
@torch.library.custom_op("fusedmlp::mlp", mutates_args=(), device_types=DEVICE_TYPES,
                         schema=f"({_FWD_ARGS}) -> Tensor")
def mlp(x, weights, biases, activation, output_activation, backend):
    spec = _spec(x, weights, biases, activation, output_activation)
    return _run_forward(x, weights, biases, spec, backend, False)


@mlp.register_fake
def _(x, weights, biases, activation, output_activation, backend):
    keep_fused_under_inductor()
    return x.new_empty(*x.shape[:-1], weights[-1].shape[0])


# --- forward for training (saves pre-activations) ------------------------------------
@torch.library.custom_op("fusedmlp::mlp_train", mutates_args=(), device_types=DEVICE_TYPES,
                         schema=f"({_FWD_ARGS}) -> (Tensor, Tensor)")
def mlp_train(x, weights, biases, activation, output_activation, backend):
    spec = _spec(x, weights, biases, activation, output_activation)
    return _run_forward(x, weights, biases, spec, backend, True)


@mlp_train.register_fake
def _(x, weights, biases, activation, output_activation, backend):
    keep_fused_under_inductor()
    lead = x.shape[:-1]
    spec = _spec(x, weights, biases, activation, output_activation)
    return x.new_empty(*lead, spec.out_features), x.new_empty(*lead, sum(saved_widths(spec)))


# --- backward ------------------------------------------------------------------------
@torch.library.custom_op(
    "fusedmlp::mlp_backward", mutates_args=(), device_types=DEVICE_TYPES,
    schema="(Tensor grad_y, Tensor x, Tensor[] weights, Tensor[]? biases, Tensor? saved, "
           "str activation, str output_activation, str backend, bool need_x, bool need_w, "
           "bool need_b) -> (Tensor[], Tensor[], Tensor[])",
)
def mlp_backward(grad_y, x, weights, biases, saved, activation, output_activation, backend,
                 need_x, need_w, need_b):
    spec = _spec(x, weights, biases, activation, output_activation)
    be = dispatch.choose(x.device, spec, backend or None, train=True)
    n = x.shape[:-1].numel()
    gx, gw, gb = be.backward(
        grad_y.reshape(n, spec.out_features), x.reshape(n, spec.in_features), weights, biases,
        None if saved is None else saved.reshape(n, saved.shape[-1]), spec,
        (need_x, need_w, need_b and biases is not None),
    )
    # op outputs may not alias one another: backends may hand back views of one buffer
    owned = _own(list(gw) + list(gb))
    return ([gx.reshape(x.shape)] if need_x else []), owned[: len(gw)], owned[len(gw):]


def _own(ts) -> list[torch.Tensor]:
    """ts, with a copy of each tensor whose storage an earlier one already uses."""
    seen, out = set(), []
    for t in ts:
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(ptr)
        out.append(t)
    return out


@mlp_backward.register_fake
def _(grad_y, x, weights, biases, saved, activation, output_activation, backend,
      need_x, need_w, need_b):
    keep_fused_under_inductor()
    gx = [torch.empty_like(x, memory_format=torch.contiguous_format)] if need_x else []
    gw = [torch.empty_like(w, memory_format=torch.contiguous_format) for w in weights] if need_w else []
    gb = [torch.empty_like(b) for b in biases] if need_b and biases is not None else []
    return gx, gw, gb


# --- autograd ------------------------------------------------------------------------
def differentiable_backward(grad_y, x, weights, biases, spec: MLPSpec, needs):
    """The backward as autograd records it (``create_graph=True``: second derivatives,
    eikonal losses): the reference's torch ops recompute the forward from x (the saved
    pre-activations of a fused forward carry no graph back to x and the weights) and
    torch differentiates them (grads_by_recompute). Returns (grad_x | None, grad_weights,
    grad_biases) as ``backward_rows``."""
    need_x, need_w, need_b = needs
    need_b = need_b and biases is not None
    ref = dispatch.REGISTRY["reference"]
    gx, gw, gb = grads_by_recompute(
        lambda: ref.forward(x, weights, biases, spec, False)[0], grad_y,
        [[x] if need_x else [], list(weights) if need_w else [],
         list(biases) if need_b else []])
    return (gx[0] if need_x else None), gw, gb


def _create_graph() -> bool:
    """Whether a backward running now must itself be differentiable: autograd runs backward
    in grad mode only for ``create_graph=True``. Not while torch.compile traces a joint
    graph (it records backward in grad mode; compiled graphs raise on double backward)."""
    return torch.is_grad_enabled() and not torch.compiler.is_compiling()


def _setup(ctx, inputs, saved):
    x, weights, biases, activation, output_activation, backend = inputs
    ctx.meta = (len(weights), biases is not None, activation, output_activation, backend)
    ctx.save_for_backward(x, *weights, *(biases or ()), *saved)


def _backward(ctx, grad_y):
    n_w, has_b, activation, output_activation, backend = ctx.meta
    nothing = (None, [None] * n_w, ([None] * n_w if has_b else None), None, None, None)
    t = ctx.saved_tensors
    x, weights = t[0], list(t[1 : 1 + n_w])
    biases = list(t[1 + n_w : 1 + 2 * n_w]) if has_b else None
    rest = t[1 + n_w * (2 if has_b else 1):]
    saved = rest[0] if rest else None
    need_x, need_ws, need_bs = ctx.needs_input_grad[:3]  # lists for list arguments
    need_w, need_b = any(need_ws), has_b and any(need_bs or ())
    create = _create_graph()
    # one backward pass with the eikonal node's (second_order._share): run here or left there
    took = None if create else second_order.take_over(ctx, grad_y, x.shape,
                                                      (need_x, need_w, need_b))
    if took is second_order.LEFT:
        return nothing
    if took is not None:
        gx, gw, gb = took
        gx = [gx] if need_x else []
    elif grad_y is None:  # y took no part in the loss (autograd left its gradient undefined)
        return nothing
    elif create:
        spec = _spec(x, weights, biases, activation, output_activation)
        params = list(weights) + list(biases or ())
        if need_x and second_order.applies(spec, x, params):
            # the input gradient only (eikonal): one node, backward in closed form
            be = dispatch.choose(x.device, spec, backend or None, train=True)
            # the saved pre-activations, as mlp_backward reads them (the same choice)
            gx = second_order.input_grad(spec, be, saved, grad_y, x, params, ctx,
                                         (need_x, need_w, need_b))
            return (gx, *nothing[1:])
        gx, gw, gb = differentiable_backward(grad_y, x, weights, biases, spec,
                                             (need_x, need_w, need_b))
        gx = [gx] if need_x else []
    else:
        # grad_y from .sum().backward() is an expanded (stride 0) tensor
        gx, gw, gb = torch.ops.fusedmlp.mlp_backward(
            grad_y.contiguous(), x, weights, biases, saved, activation, output_activation,
            backend, need_x, need_w, need_b,
        )
    gw = [g if n else None for g, n in zip(gw, need_ws)] if need_w else None
    gb = [g if n else None for g, n in zip(gb, need_bs)] if need_b else None
    return gx[0] if need_x else None, gw, gb, None, None, None


def _setup_recompute(ctx, inputs, output):
    _setup(ctx, inputs, ())


def _setup_train(ctx, inputs, output):
    _setup(ctx, inputs, (output[1],))
    # the saved pre-activations are an output nobody differentiates: without this, autograd
    # would hand backward a zero-filled [N, S] tensor for them (memory and a fill kernel)
    ctx.set_materialize_grads(False)


def _backward_train(ctx, grad_y, grad_saved):
    return _backward(ctx, grad_y)


mlp.register_autograd(_backward, setup_context=_setup_recompute)
mlp_train.register_autograd(_backward_train, setup_context=_setup_train)


# --- the functional entry ------------------------------------------------------------
def _autocast(x, weights, biases):
    dev = x.device.type
    if dev in DEVICE_TYPES and torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        x = x.to(dt)
        weights = [w.to(dt) for w in weights]
        biases = None if biases is None else [b.to(dt) for b in biases]
    return x, weights, biases


# the number of active TorchDispatchModes (fake tensors, make_fx, ...); 1 = "assume some"
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 1)


#: plain eager calls skip the custom-op layer (same backend calls, less host time); the
#: tests turn this off to run the ops' own autograd in eager mode too
EAGER_FAST_PATH = True


class _EagerMLP(torch.autograd.Function):
    """The ops' forward and backward for plain eager autograd, without the custom-op layer:
    on a 2-core CPU a train step's host time with no-op kernels went from 283 us through
    the ops (pytree and dispatcher work) to 100 us. Same backend, same saved tensors."""

    @staticmethod
    def forward(ctx, spec, be, recompute, x, *params):
        # be: the backend the caller chose; backward runs on it (it reads what it saved)
        n = spec.n_layers
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        if recompute is None:  # the backend's choice
            recompute = be.recomputes(spec, x.device)
        out = _run_forward(x, weights, biases, spec, None, not recompute, be)
        y, saved = (out, None) if recompute else out
        ctx.spec, ctx.be = spec, be
        ctx.save_for_backward(x, *params, *(() if recompute else (saved,)))
        return y

    @staticmethod
    def backward(ctx, grad_y):
        spec, n = ctx.spec, ctx.spec.n_layers
        t = ctx.saved_tensors
        x, params = t[0], t[1 : 1 + len(ctx.needs_input_grad) - 4]
        saved = t[1 + len(params)] if len(t) > 1 + len(params) else None
        weights, biases = params[:n], (params[n:] if spec.bias else None)
        need = ctx.needs_input_grad
        need_x, need_w = need[3], any(need[4 : 4 + n])
        need_b = spec.bias and any(need[4 + n :])
        if _create_graph():  # create_graph=True: a backward autograd can differentiate
            if need_x and second_order.applies(spec, x, params):
                # the input gradient only (eikonal): one node, backward in closed form
                gx = second_order.input_grad(spec, ctx.be, saved, grad_y, x, params, ctx,
                                             (need_x, need_w, need_b))
                return (None, None, None, gx) + (None,) * len(params)
            gx, gw, gb = differentiable_backward(grad_y, x, weights, biases, spec,
                                                 (need_x, need_w, need_b))
        elif (took := second_order.take_over(ctx, grad_y, x.shape,
                                             (need_x, need_w, need_b))) is not None:
            # one backward pass with the eikonal node's (second_order._share)
            if took is second_order.LEFT:
                return (None,) * (4 + len(params))
            gx, gw, gb = took
        else:
            gx, gw, gb = backward_rows(ctx.be, grad_y, x, weights, biases, saved, spec,
                                       (need_x, need_w, need_b))
        gw = list(gw) if need_w else [None] * n
        gb = (list(gb) if need_b else [None] * n) if spec.bias else []
        return (None, None, None, gx, *gw, *gb)


def module_recompute(module: torch.nn.Module) -> bool | None:
    """``recompute`` for a call of ``module`` (FusedMLP, GatedMLP): its own, but True for
    a module in eval mode under torch.export, so that the program records the inference
    op (``fusedmlp::mlp``, not ``mlp_train`` with pre-activations nobody reads) even where
    the export traces in grad mode. That op stays differentiable (its backward recomputes)."""
    if not module.training and torch.compiler.is_exporting():
        return True
    return module.recompute


def linear_params(owner: torch.nn.Module, name: str):
    """(weight, bias) of ``owner``'s nn.Linear child ``name``, read from its _parameters
    (nn.Module.__getattr__ costs ~1 us a lookup on the hot path). TypeError naming the
    child where it is no longer a plain nn.Linear: an adapter (LoRA) or a parametrization
    wrapped it after fusing, and the op, which reads the Linear's own weight, would
    silently leave the wrapper's change out."""
    lin = owner._modules[name]
    p = lin._parameters
    w = p.get("weight")
    if w is None or type(lin) is not torch.nn.Linear:
        raise TypeError(
            f"{type(owner).__name__}.{name}: expected the nn.Linear it was built with, found "
            f"{type(lin).__name__}{'' if w is not None else ' without its own weight'}; the "
            "fused op reads plain Linear weights: merge the adapter or parametrization into "
            "the weight, or wrap the model before fusing (fusing then leaves that MLP alone)")
    return w, p.get("bias")


def raise_module_error(err: ValueError, x, in_features: int):
    """Re-raise ``err``, an op call's validation error inside a module, naming x when x's
    last dimension is not the module's in_features (the op names its weight arguments,
    which a module's caller never passed). Called only after a failure, so a module's hot
    path checks nothing twice."""
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] != in_features:
        raise ValueError(f"x: expected last dimension {in_features} (this module's "
                         f"in_features), got shape {tuple(x.shape)}") from None
    raise err


def plain_eager(x) -> bool:
    """Whether a call with input ``x`` may skip the custom-op layer: eager (not compiled,
    traced or under a dispatch mode such as fake tensors), a plain Tensor, and the fast
    path not switched off."""
    # is_compiling() first: dynamo folds it to True and never traces the rest
    return (not torch.compiler.is_compiling() and EAGER_FAST_PATH
            and type(x) is torch.Tensor and _dispatch_modes() == 0)


def transformed() -> bool:
    """Whether a torch.func transform (grad, vjp, jacrev, jacfwd, vmap, hessian, ...) or
    forward-mode AD (``torch.autograd.forward_ad``) is active. Kernels see plain buffers:
    they would drop a tangent or a batch dimension without a word. Such calls run as
    composite torch ops instead (``composite_forward``), which every transform handles."""
    return (torch._C._functorch.peek_interpreter_stack() is not None
            or _forward_ad._current_level >= 0)


def composite_forward(x, weights, biases, spec: MLPSpec) -> torch.Tensor:
    """The op as the reference's torch ops (F.linear and the activations) on x's device
    and dtype, any leading dims: under torch.func transforms and forward-mode AD, and on
    the meta device."""
    return dispatch.REGISTRY["reference"].forward(x, weights, biases, spec, False)[0]


@torch.compiler.assume_constant_result
def _recomputes(device, widths, activation, output_activation, bias, dtype, backend) -> bool:
    """recompute=None resolved for the ops (Backend.recomputes of the chosen backend).
    torch.compile calls it once while tracing and keeps the answer as a constant: no
    guard on the dispatcher's caches (each new entry would compile the graph again)."""
    spec = MLPSpec(widths, activation, output_activation, bias, dtype)
    return dispatch.choose(device, spec, backend, train=True).recomputes(spec, device)


def _torch_ops(x, spec: MLPSpec, be, backend: str | None, train: bool) -> bool:
    """Whether a plain eager call runs as the reference's torch ops (a training one with
    torch's own autograd graph rather than the op's autograd node): for the row counts
    the chosen backend ``be`` names (``Backend.torch_rows``), unless a backend was forced.
    (Those ops save what eager saves: for a two-layer MLP both z and act(z), where the
    op's node keeps z alone.) Most calls leave at the first test (no ranges)."""
    return (rows_in(x, be.torch_rows(spec, x.device, train))
            and dispatch.requested(backend) is None)


def rows_in(x, ranges) -> bool:
    """Whether x ([..., features]) has a row count within one of ``ranges`` (inclusive
    (lo, hi) pairs); False for none, at once (the usual case: no reshape or numel)."""
    if not ranges:
        return False
    n = x.shape[0] if x.dim() == 2 else x.shape[:-1].numel()
    return any(lo <= n <= hi for lo, hi in ranges)


def call(x, weights, biases, spec: MLPSpec, backend: str | None, recompute: bool | None):
    """Run the op on already validated inputs (the module's lean per-call path)."""
    needs_grad = torch.is_grad_enabled() and (
        x.requires_grad or any(w.requires_grad for w in weights)
        or (biases is not None and any(b.requires_grad for b in biases))
    )
    if not torch.compiler.is_compiling() and (transformed() or x.is_meta):
        # (meta tensors: shapes only, as for a model built on the meta device)
        return composite_forward(x, weights, biases, spec)
    if plain_eager(x):
        # Plain eager calls: exactly what the ops' kernels and autograd do, without the
        # custom-op layer (~30 us a no-grad call, ~200 us a train step of host time on a
        # 2-core CPU). Compiled, traced and fake-tensor calls all go through the ops.
        be = dispatch.choose(x.device, spec, backend, train=needs_grad)
        if not needs_grad:
            if _torch_ops(x, spec, be, backend, False):
                return composite_forward(x, weights, biases, spec)
            return _run_forward(x, weights, biases, spec, backend, False, be)
        if not recompute and _torch_ops(x, spec, be, backend, True):
            # F.linear takes any leading dims: no reshapes, no second dispatch (host time)
            return dispatch.REGISTRY["reference"].forward(x, weights, biases, spec, False)[0]
        return _EagerMLP.apply(spec, be, recompute, x, *weights, *(biases or ()))
    args = (x, weights, biases, spec.activation, spec.output_activation, backend or "")
    if needs_grad and recompute is None:
        recompute = _recomputes(x.device, spec.widths, spec.activation,
                                spec.output_activation, spec.bias, spec.dtype, backend)
    if needs_grad and not recompute:
        return torch.ops.fusedmlp.mlp_train.default(*args)[0]
    return torch.ops.fusedmlp.mlp.default(*args)


def check_softplus_beta(beta, activation: str, output_activation: str) -> float:
    """``softplus_beta``: a positive finite number, other than 1 only with softplus."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not math.isfinite(
            beta) or beta <= 0:
        raise ValueError(f"softplus_beta: expected a positive finite number, got {beta!r}")
    if beta != 1 and "softplus" not in (activations.get(activation).name,
                                        activations.get(output_activation).name):
        raise ValueError(f"softplus_beta: {beta} given, but neither activation "
                         f"({activation!r}, {output_activation!r}) is softplus")
    return float(beta)


def fold_softplus_beta(weights, biases, activation: str, output_activation: str, beta: float):
    """Softplus with ``beta`` (softplus(beta z) / beta, torch's nn.Softplus(beta)) as the
    registry's softplus (beta 1) on rescaled parameters: with s_l = beta z_l the layers
    chain as s_1 = beta W_1 x + beta b_1, s_l = W_l softplus(s_(l-1)) + beta b_l, and the
    last layer takes W_L / beta (or, when the output activation is softplus too, W_L and
    beta b_L, its output divided by beta). So every backend, kernel and derivative order
    runs it unchanged; autograd takes the gradients through the scaling. Returns
    (weights, biases, divide the output by beta)."""
    hidden = activation == "softplus"
    out = output_activation == "softplus"
    L = len(weights)
    ws, bs = list(weights), None if biases is None else list(biases)
    for i in range(L):
        # a softplus layer computes s = beta z; its input, after a softplus layer, is
        # softplus(s) = beta x the true activation
        s_out = beta if (out if i == L - 1 else hidden) else 1.0
        s_in = 1.0 / beta if (i > 0 and hidden) else 1.0
        if s_out * s_in != 1.0:
            ws[i] = ws[i] * (s_out * s_in)
        if bs is not None and s_out != 1.0:
            bs[i] = bs[i] * s_out
    return ws, bs, out


def fused_mlp(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor] | None = None,
    activation: str = "relu",
    output_activation: str = "none",
    backend: str | None = None,
    recompute: bool | None = None,
    *,
    softplus_beta: float = 1.0,
) -> torch.Tensor:
    """y = out_act(W_L · act(... act(W_1 · x + b_1) ...) + b_L), all layers in one op.

    x: [..., in_features]; weights[i]: [out_i, in_i] as in nn.Linear; biases: None or
    [out_i] each. Returns [..., out_features]. ``backend`` forces a backend (else
    $FUSEDMLP_BACKEND, else the dispatcher's choice); ``recompute=True`` trades the saved
    hidden activations of training for recomputing them in backward, False saves them,
    None lets the backend choose (``Backend.recomputes``; under torch.compile, once,
    when the graph is traced). Plain eager calls of some row counts may run as torch's
    own ops (``Backend.torch_rows``: wide layers on CUDA where those were measured
    faster, ``explain(...).route(x)`` says) unless a backend is forced or, for
    training, ``recompute=True``. ``softplus_beta``: softplus as torch's
    ``nn.Softplus(beta)`` (NeuS-style SDFs use 100), for whichever activation is softplus
    (fold_softplus_beta: the parameters rescaled on the way in).
    """
    # any iterable of tensors (a list, a tuple, a generator of parameters)
    if isinstance(weights, (torch.Tensor, str)) or not isinstance(weights, Iterable):
        raise TypeError(f"weights: expected a list of 2-D tensors [out, in], got "
                        f"{type(weights).__name__}")
    if biases is not None and (isinstance(biases, (torch.Tensor, str))
                               or not isinstance(biases, Iterable)):
        raise TypeError(f"biases: expected None or a list of 1-D tensors, got "
                        f"{type(biases).__name__}")
    weights = list(weights)
    biases = None if biases is None else list(biases)
    if isinstance(x, torch.Tensor):
        x, weights, biases = _autocast(x, weights, biases)
    spec = validate(x, weights, biases, activation, output_activation)
    check_recompute(recompute)
    beta = check_softplus_beta(softplus_beta, activation, output_activation)
    if backend is not None:
        check_backend(backend)
        dispatch.requested(backend)  # unknown names fail here, naming the argument
    if beta == 1.0:
        return call(x, weights, biases, spec, backend, recompute)
    weights, biases, divide = fold_softplus_beta(weights, biases, spec.activation,
                                                 spec.output_activation, beta)
    y = call(x, weights, biases, spec, backend, recompute)
    return y / beta if divide else y
