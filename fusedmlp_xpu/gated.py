"""Gated MLPs (SwiGLU, GEGLU): the ops, the functional entry, GatedMLP, GatedMLPView.

    y = (act(x Wg^T + bg) * (x Wu^T + bu)) Wd^T + bd        x: [..., d] -> y: [..., d_out]

    fusedmlp::gated_mlp           forward; autograd recomputes g and u in backward
    fusedmlp::gated_mlp_train     forward that also returns g, u (the pre-activations)
    fusedmlp::gated_mlp_backward  gradients for x, the three weights and the biases

On cuda/xpu the Triton kernels of ``backends/triton/wide/`` run (the gate and up
products in one kernel: two accumulators over the same x tiles, or at large M on
Hopper-class GPUs one GEMM over the two weights interleaved by rows; backward with the
activation derivative fused into the dh GEMM's epilogue); elsewhere, or when Triton is
not usable, the composite torch reference in this file. ``backend="triton"`` or
``"reference"`` (or $FUSEDMLP_BACKEND) forces one; a forced backend that cannot run
is an error. Module layout and state_dict keys are those of Llama's/Mistral's MLP
(``gate_proj``, ``up_proj``, ``down_proj``).
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F
from torch import nn

from . import activations, dispatch, envvars, op
from .dispatch import BackendUnavailableError
from .op import DEVICE_TYPES, _autocast
from .spec import check_backend, check_recompute, check_size
from .backends.triton import routes as _routes
from .backends.triton import routes_note as _routes_note

GATE_ACTIVATIONS = activations.GATE_ACTIVATIONS
BACKENDS = ("triton", "reference")


# --- the composite reference --------------------------------------------------------
class _Reference:
    """Torch ops on any device; the same roundings as eager Llama MLP in the same dtype."""

    name = "reference"

    @staticmethod
    def gated_forward(x, w_gate, w_up, w_down, activation, save, biases=None):
        bg, bu, bd = biases if biases is not None else (None, None, None)
        g, u = F.linear(x, w_gate, bg), F.linear(x, w_up, bu)
        y = F.linear(activations.ACTIVATIONS[activation].fn(g) * u, w_down, bd)
        return y, ([g, u] if save else [])

    @staticmethod
    def gated_backward(grad_y, x, w_gate, w_up, w_down, saved, activation, needs, biases=None):
        need_x, need_w, need_b = needs
        need_b = need_b and biases is not None
        if not saved:
            _, saved = _Reference.gated_forward(x, w_gate, w_up, w_down, activation, True, biases)
        g, u = saved
        act = activations.ACTIVATIONS[activation]
        wide = torch.promote_types(g.dtype, torch.float32)  # derivative in fp32 at least
        a = act.fn(g.to(wide))
        dh = grad_y.mm(w_down).to(wide)
        dg = (dh * u.to(wide) * act.grad(g.to(wide))).to(g.dtype)
        du = (dh * a).to(g.dtype)
        grad_x = dg.mm(w_gate) + du.mm(w_up) if need_x else None
        gw = [dg.t().mm(x), du.t().mm(x), grad_y.t().mm((a * u.to(wide)).to(g.dtype))] \
            if need_w else []
        gb = [t.sum(0, dtype=wide).to(t.dtype) for t in (dg, du, grad_y)] if need_b else []
        return grad_x, gw, gb


_WIDE = []  # the wide module once imported (a failed import is retried, and reported)


def _wide():
    if not _WIDE:
        _WIDE.append(importlib.import_module(".backends.triton.wide", __package__))
    return _WIDE[0]


def _triton_usable(device: torch.device, forced: bool) -> tuple[bool, str]:
    """Triton's verdict for this device: the registered 'triton' backend's availability
    when there is one, else the wide kernels' own check. On the CPU only when asked for
    by name (the interpreter is for testing the kernels, never an automatic choice)."""
    if device.type == "cpu" and not forced:
        return False, "cpu: the reference is used unless backend='triton' is forced"
    try:
        wide = _wide()
    except Exception as e:  # triton missing or broken: report, do not fail the import
        return False, f"cannot import the Triton kernels: {type(e).__name__}: {e}"
    if "triton" in dispatch.REGISTRY:
        ok, why = dispatch.availability("triton")
    else:
        ok, why = wide.available()
    if ok and not wide.supports_device(device):
        ok, why = False, f"does not run on {device.type} (set TRITON_INTERPRET=1 for cpu)"
    return ok, why


def choose(device: torch.device, backend: str | None = None):
    """The implementation (wide kernels or the reference) for this device and request."""
    name = backend or envvars.get(dispatch.ENV_VAR) or "auto"
    src = "backend" if backend else dispatch.ENV_VAR
    if name == "auto":
        return _wide() if _triton_usable(device, False)[0] else _Reference
    if name == "reference":
        return _Reference
    if name == "triton":
        ok, why = _triton_usable(device, True)
        if not ok:
            raise BackendUnavailableError(f"backend 'triton' cannot run the gated MLP on {device}: {why}")
        return _wide()
    if name in dispatch.REGISTRY:
        raise BackendUnavailableError(
            f"{src}: backend {name!r} has no gated-MLP kernels; use one of {list(BACKENDS)}")
    raise ValueError(f"{src}: unknown backend {name!r}; the gated MLP knows {list(BACKENDS)}")


def explain_choice(device: torch.device, spec, backend: str | None = None):
    """dispatch.Explanation for a gated MLP: which implementation ``choose`` takes on
    ``device`` (spec: MLPSpec with widths (d, hidden, d_out), for the header) and why not
    the other."""
    forced = backend or envvars.get(dispatch.ENV_VAR) or None
    forced = None if forced == "auto" else forced
    ex = dispatch.Explanation(device, spec, None, forced)
    for name in (forced,) if forced else BACKENDS:
        if name == "triton":
            ok, why = _triton_usable(device, forced == "triton")
            if ok and forced is None:
                why += _routes_note(device, gated=True)
        elif name == "reference":
            ok, why = True, "composite torch ops (F.linear, act(gate) * up), any device"
        else:
            ok, why = False, f"no gated-MLP kernels; the gated MLP knows {list(BACKENDS)}"
        taken = ok and ex.backend is None
        ex.backend = name if taken else ex.backend
        if taken and forced is None and (name == "triton" or device.type == "cpu"):
            d, hidden = spec.widths[0], spec.widths[1]
            ex.torch_rows = lambda train: _torch_rows(device, train, d, hidden)
        ex.considered.append(dispatch.Consideration(name, taken, why))
    return ex


def _torch_rows(device: torch.device, train: bool, d: int, hidden: int):
    """The row ranges where plain eager calls on ``device`` of a d -> hidden gated MLP run
    as torch ops when the wide kernels are chosen automatically (backends/triton/routes.py),
    and on the CPU, where the reference runs unforced, every training call: torch's own
    autograd graph of its ops, as for fused_mlp (ReferenceBackend.torch_rows; the node
    was 0.85-0.94x eager's train step there, cpu-eager-before-20261204.json)."""
    if device.type == "cpu":  # the reference's rule, which does not look at the spec
        return dispatch.REGISTRY["reference"].torch_rows(None, device, train)
    return _routes.torch_rows(device, True, train, d, hidden)


def _torch_ops(x, w_gate, backend: str | None, train: bool) -> bool:
    """Whether a plain eager call runs as the reference's torch ops (a training one with
    torch's own autograd graph), as fused_mlp's do (op._torch_ops): with the wide kernels
    chosen automatically, for _torch_rows's row counts. (Those ops save eager's four
    [rows, hidden] tensors where the op's node keeps g and u.) The cheap tests first:
    most calls leave before the choice is looked up."""
    return (op.rows_in(x, _torch_rows(x.device, train, w_gate.shape[1], w_gate.shape[0]))
            and not backend
            and (envvars.get(dispatch.ENV_VAR) or "auto") == "auto"
            and (x.device.type == "cpu" or choose(x.device) is not _Reference))


# --- validation ----------------------------------------------------------------------
def validate(x, w_gate, w_up, w_down, biases, activation) -> str:
    """Check the inputs; return the activation's registry name. TypeError/ValueError
    name the argument. x: [..., d]; w_gate, w_up: [hidden, d]; w_down: [d_out, hidden];
    biases: None or (b_gate [hidden], b_up [hidden], b_down [d_out])."""
    named = {"x": x, "w_gate": w_gate, "w_up": w_up, "w_down": w_down}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"x: expected a floating dtype, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dimension [..., in_features], got a scalar")
    for name in ("w_gate", "w_up", "w_down"):
        if named[name].dim() != 2:
            raise ValueError(f"{name}: expected 2-D [out, in], got shape {tuple(named[name].shape)}")
    d, hidden = x.shape[-1], w_gate.shape[0]
    if w_gate.shape[1] != d:
        raise ValueError(f"w_gate: expected [hidden, {d}] (in_features = x.shape[-1]), "
                         f"got {tuple(w_gate.shape)}")
    if tuple(w_up.shape) != tuple(w_gate.shape):
        raise ValueError(f"w_up: expected the shape of w_gate {tuple(w_gate.shape)}, "
                         f"got {tuple(w_up.shape)}")
    if w_down.shape[1] != hidden:
        raise ValueError(f"w_down: expected [out, {hidden}] (hidden = w_gate.shape[0]), "
                         f"got {tuple(w_down.shape)}")
    tensors = dict(named)
    if biases is not None:
        if isinstance(biases, torch.Tensor) or len(biases) != 3:
            raise TypeError("biases: expected None or (b_gate, b_up, b_down)")
        for i, (b, n) in enumerate(zip(biases, (hidden, hidden, w_down.shape[0]))):
            if not isinstance(b, torch.Tensor):
                raise TypeError(f"biases[{i}]: expected a torch.Tensor, got {type(b).__name__}")
            if tuple(b.shape) != (n,):
                raise ValueError(f"biases[{i}]: expected shape ({n},), got {tuple(b.shape)}")
            tensors[f"biases[{i}]"] = b
    dev, dt = x.device, x.dtype
    for name, t in tensors.items():
        if t.device != dev:
            raise ValueError(f"{name}: expected device {dev} (the device of x), got "
                             f"{t.device}; move the module or the input with .to(device)")
        if t.dtype != dt:
            raise TypeError(f"{name}: expected dtype {dt} (the dtype of x), got {t.dtype}; "
                            "cast the module or the input, or use torch.autocast")
    act = activations.get(activation).name
    if act not in GATE_ACTIVATIONS:
        raise ValueError(f"activation: the gated MLP supports {list(GATE_ACTIVATIONS)}, got {act!r}")
    return act


# --- the ops -------------------------------------------------------------------------
_ARGS = ("Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, Tensor[]? biases, "
         "str activation, str backend")


def _run_forward(x, w_gate, w_up, w_down, biases, activation, backend, save, impl=None):
    impl = choose(x.device, backend or None) if impl is None else impl
    if x.dim() == 2:  # already [rows, d]: no reshapes (host time at decode sizes)
        return impl.gated_forward(x, w_gate, w_up, w_down, activation, save, biases)
    lead = x.shape[:-1]
    y, saved = impl.gated_forward(x.reshape(-1, x.shape[-1]), w_gate, w_up, w_down,
                                  activation, save, biases)
    return y.reshape(*lead, y.shape[-1]), [t.reshape(*lead, t.shape[-1]) for t in saved]


@torch.library.custom_op("fusedmlp::gated_mlp", mutates_args=(), device_types=DEVICE_TYPES,
                         schema=f"({_ARGS}) -> Tensor")
def gated_mlp(x, w_gate, w_up, w_down, biases, activation, backend):
    return _run_forward(x, w_gate, w_up, w_down, biases, activation, backend, False)[0]


@gated_mlp.register_fake
def _(x, w_gate, w_up, w_down, biases, activation, backend):
    op.keep_fused_under_inductor()
    return x.new_empty(*x.shape[:-1], w_down.shape[0])


@torch.library.custom_op("fusedmlp::gated_mlp_train", mutates_args=(), device_types=DEVICE_TYPES,
                         schema=f"({_ARGS}) -> (Tensor, Tensor, Tensor)")
def gated_mlp_train(x, w_gate, w_up, w_down, biases, activation, backend):
    y, (g, u) = _run_forward(x, w_gate, w_up, w_down, biases, activation, backend, True)
    return y, g, u


@gated_mlp_train.register_fake
def _(x, w_gate, w_up, w_down, biases, activation, backend):
    op.keep_fused_under_inductor()
    lead, hidden = x.shape[:-1], w_gate.shape[0]
    return (x.new_empty(*lead, w_down.shape[0]), x.new_empty(*lead, hidden),
            x.new_empty(*lead, hidden))


@torch.library.custom_op(
    "fusedmlp::gated_mlp_backward", mutates_args=(), device_types=DEVICE_TYPES,
    schema="(Tensor grad_y, Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down, "
           "Tensor[]? biases, Tensor[] saved, str activation, str backend, bool need_x, "
           "bool need_w, bool need_b) -> (Tensor[], Tensor[], Tensor[])",
)
def gated_mlp_backward(grad_y, x, w_gate, w_up, w_down, biases, saved, activation, backend,
                       need_x, need_w, need_b):
    impl = choose(x.device, backend or None)
    n = x.shape[:-1].numel()
    gx, gw, gb = impl.gated_backward(
        grad_y.reshape(n, grad_y.shape[-1]), x.reshape(n, x.shape[-1]), w_gate, w_up, w_down,
        [t.reshape(n, t.shape[-1]) for t in saved], activation,
        (need_x, need_w, need_b and biases is not None), biases)
    return ([gx.reshape(x.shape)] if need_x else []), list(gw), list(gb)


@gated_mlp_backward.register_fake
def _(grad_y, x, w_gate, w_up, w_down, biases, saved, activation, backend, need_x, need_w,
      need_b):
    op.keep_fused_under_inductor()

    def like(t):
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    gx = [like(x)] if need_x else []
    gw = [like(w) for w in (w_gate, w_up, w_down)] if need_w else []
    gb = [like(b) for b in biases] if need_b and biases is not None else []
    return gx, gw, gb


# --- autograd ------------------------------------------------------------------------
def _backward_rows(impl, grad_y, x, w_gate, w_up, w_down, saved, activation, needs, biases):
    """``impl.gated_backward`` on inputs of any leading dims (flattened to rows, grad_x
    shaped back like x). Returns (grad_x | None, grad_weights, grad_biases)."""
    flat = x.dim() == 2  # [rows, d] already: no reshapes (host time at decode sizes)
    if not flat:
        n = x.shape[:-1].numel()
        grad_y = grad_y.reshape(n, grad_y.shape[-1])
        saved = [s.reshape(n, s.shape[-1]) for s in saved or ()]
    gx, gw, gb = impl.gated_backward(
        grad_y if grad_y.is_contiguous() else grad_y.contiguous(),
        x if flat else x.reshape(-1, x.shape[-1]), w_gate, w_up, w_down, saved, activation,
        needs, biases)
    return (gx if gx is None or flat else gx.reshape(x.shape)), gw, gb


def _differentiable_backward(grad_y, x, w_gate, w_up, w_down, biases, activation, needs):
    """The backward as autograd records it (``create_graph=True``; as
    op.differentiable_backward): the reference's torch ops recompute the forward from x
    and torch differentiates them (op.grads_by_recompute)."""
    need_x, need_w, need_b = needs
    need_b = need_b and biases is not None
    gx, gw, gb = op.grads_by_recompute(
        lambda: _Reference.gated_forward(x, w_gate, w_up, w_down, activation, False,
                                         biases)[0], grad_y,
        [[x] if need_x else [], [w_gate, w_up, w_down] if need_w else [],
         list(biases) if need_b else []])
    return (gx[0] if need_x else None), gw, gb


def _setup(ctx, inputs, saved):
    x, w_gate, w_up, w_down, biases, activation, backend = inputs
    ctx.meta = (biases is not None, activation, backend)
    ctx.save_for_backward(x, w_gate, w_up, w_down, *(biases or ()), *saved)


def _backward(ctx, grad_y):
    has_b, activation, backend = ctx.meta
    if grad_y is None:  # y took no part in the loss (autograd left its gradient undefined)
        return None, None, None, None, ([None] * 3 if has_b else None), None, None
    t = ctx.saved_tensors
    x, w_gate, w_up, w_down = t[:4]
    biases = list(t[4:7]) if has_b else None
    saved = list(t[7:] if has_b else t[4:])
    need_x, ng, nu, nd, need_bs = ctx.needs_input_grad[:5]
    need_ws = (ng, nu, nd)
    need_w, need_b = any(need_ws), has_b and any(need_bs or ())
    if op._create_graph():  # create_graph=True: a backward autograd can differentiate
        gx, gw, gb = _differentiable_backward(grad_y, x, w_gate, w_up, w_down, biases,
                                              activation, (need_x, need_w, need_b))
        gx = [gx] if need_x else []
    else:
        gx, gw, gb = torch.ops.fusedmlp.gated_mlp_backward(
            grad_y.contiguous(), x, w_gate, w_up, w_down, biases, saved, activation, backend,
            need_x, need_w, need_b)
    gw = [g if n else None for g, n in zip(gw, need_ws)] if need_w else [None] * 3
    gb = [g if n else None for g, n in zip(gb, need_bs)] if need_b else None
    return (gx[0] if need_x else None), *gw, gb, None, None


gated_mlp.register_autograd(_backward, setup_context=lambda ctx, inputs, output: _setup(ctx, inputs, ()))


def _setup_train(ctx, inputs, output):
    _setup(ctx, inputs, output[1:])
    # g and u are outputs nobody differentiates: without this autograd would hand backward
    # two zero-filled [..., hidden] tensors for them, 2 x M x H more at the peak (measured:
    # the train step's peak above eager's on the H200)
    ctx.set_materialize_grads(False)


def _backward_train(ctx, grad_y, grad_g, grad_u):
    return _backward(ctx, grad_y)


gated_mlp_train.register_autograd(_backward_train, setup_context=_setup_train)


class _EagerGated(torch.autograd.Function):
    """The ops' forward and backward for plain eager autograd, without the custom-op layer
    (same implementation calls, same saved tensors: g and u, or nothing with recompute)."""

    @staticmethod
    def forward(ctx, activation, backend, recompute, x, w_gate, w_up, w_down, *biases):
        bl = list(biases) if biases else None
        # backward runs on the implementation that ran forward (it reads what that saved)
        impl = choose(x.device, backend or None)
        y, saved = _run_forward(x, w_gate, w_up, w_down, bl, activation, backend,
                                not recompute, impl)
        ctx.activation, ctx.impl, ctx.n_b = activation, impl, len(biases)
        ctx.save_for_backward(x, w_gate, w_up, w_down, *biases, *saved)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        t, n_b = ctx.saved_tensors, ctx.n_b
        x, w_gate, w_up, w_down = t[:4]
        biases = list(t[4 : 4 + n_b]) if n_b else None
        need = ctx.needs_input_grad
        need_x, need_ws, need_bs = need[3], need[4:7], need[7:]
        need_w, need_b = any(need_ws), any(need_bs)
        needs = (need_x, need_w, need_b)
        if op._create_graph():  # a backward autograd can differentiate (torch's own)
            gx, gw, gb = _differentiable_backward(grad_y, x, w_gate, w_up, w_down, biases,
                                                  ctx.activation, needs)
        else:  # the implementation that ran forward
            gx, gw, gb = _backward_rows(ctx.impl, grad_y, x, w_gate, w_up, w_down,
                                        list(t[4 + n_b:]), ctx.activation, needs, biases)
        gw = [g if k else None for g, k in zip(gw, need_ws)] if need_w else [None] * 3
        gb = [g if k else None for g, k in zip(gb, need_bs)] if need_b else [None] * n_b
        return None, None, None, gx if need_x else None, *gw, *gb


# --- the functional entry ------------------------------------------------------------
def fused_gated_mlp(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
                    w_down: torch.Tensor, activation: str = "silu", backend: str | None = None,
                    recompute: bool = False, *, biases=None) -> torch.Tensor:
    """y = (act(x Wg^T + bg) * (x Wu^T + bu)) Wd^T + bd, as one op.

    x: [..., d]; w_gate, w_up: [hidden, d]; w_down: [d_out, hidden] (nn.Linear layout);
    biases: None or (b_gate, b_up, b_down). Returns [..., d_out]. activation: silu
    (SwiGLU), gelu or gelu_tanh (GEGLU). ``recompute``: training keeps nothing of the
    [..., hidden] intermediates and recomputes them in backward (less memory, one more
    gated GEMM)."""
    if biases is not None and (isinstance(biases, torch.Tensor) or type(biases) not in (
            list, tuple) or len(biases) != 3):
        raise TypeError(f"biases: expected None or (b_gate, b_up, b_down), got "
                        f"{type(biases).__name__}")
    check_recompute(recompute)
    if backend is not None:
        check_backend(backend)
    if isinstance(x, torch.Tensor) and all(isinstance(w, torch.Tensor) for w in (w_gate, w_up, w_down)):
        bl = None if biases is None else list(biases)
        x, ws, bl = _autocast(x, [w_gate, w_up, w_down], bl)
        w_gate, w_up, w_down = ws
        biases = bl
    act = validate(x, w_gate, w_up, w_down, biases, activation)
    if backend is not None and backend not in BACKENDS:
        choose(x.device, backend)  # raises, naming the argument
    return call(x, w_gate, w_up, w_down, None if biases is None else list(biases), act,
                backend, recompute)


def lean(x, w_gate, w_up, w_down, biases) -> bool:
    """Whether a module's call may skip ``validate`` and autocast (``call`` directly): a
    plain tensor x whose last dimension is w_gate's input, every parameter on x's device
    and dtype, the shapes chaining, no autocast region. Anything else takes
    fused_gated_mlp's full path and its errors. ~1 us where validate costs ~5."""
    if type(x) is not torch.Tensor or x.dim() < 1 or x.is_meta \
            or torch.is_autocast_enabled(x.device.type):
        return False
    dt, dev, hidden = x.dtype, x.device, w_gate.shape[0]
    if x.shape[-1] != w_gate.shape[1] or w_up.shape != w_gate.shape \
            or w_down.shape[1] != hidden:
        return False
    for t in (w_gate, w_up, w_down) if biases is None else (w_gate, w_up, w_down, *biases):
        if not isinstance(t, torch.Tensor) or t.dtype is not dt or t.device != dev:
            return False
    return biases is None or (biases[0].shape == (hidden,) and biases[1].shape == (hidden,)
                              and biases[2].shape == (w_down.shape[0],))


def call(x, w_gate, w_up, w_down, biases, act: str, backend: str | None, recompute: bool):
    """Run the gated op on validated inputs (``act``: the registry name): the modules'
    per-call path and the tail of fused_gated_mlp."""
    args = (x, w_gate, w_up, w_down, biases, act, backend or "")
    needs_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (x, w_gate, w_up, w_down, *(biases or ())))
    if not torch.compiler.is_compiling() and op.transformed():  # torch.func, forward AD
        return _Reference.gated_forward(x, w_gate, w_up, w_down, act, False, biases)[0]
    # plain eager calls skip the custom-op layer, as fused_mlp's do (op.call): ~35 us of
    # host time a call on the H200 host, all of a decode step's cost
    if op.plain_eager(x):
        if not needs_grad:
            if _torch_ops(x, w_gate, backend, False):
                return _Reference.gated_forward(x, w_gate, w_up, w_down, act, False, biases)[0]
            return _run_forward(x, w_gate, w_up, w_down, biases, act, backend or "", False)[0]
        if not recompute and _torch_ops(x, w_gate, backend, True):
            return _Reference.gated_forward(x, w_gate, w_up, w_down, act, False, biases)[0]
        return _EagerGated.apply(act, backend or "", recompute, x, w_gate, w_up, w_down,
                                 *(biases or ()))
    if needs_grad and not recompute:
        return torch.ops.fusedmlp.gated_mlp_train.default(*args)[0]
    return torch.ops.fusedmlp.gated_mlp.default(*args)


# --- modules -------------------------------------------------------------------------
class GatedMLP(nn.Module):
    """down_proj(act(gate_proj(x)) * up_proj(x)) as one op. x: [..., in] -> [..., out].

    Children and state_dict keys as Llama's MLP: gate_proj, up_proj ([hidden, in]) and
    down_proj ([out, hidden]).

    Args:
        in_features: width of the input's last dimension (a transformer's d).
        hidden_features: width of the gate and up projections.
        out_features: width of the output; default ``in_features``.
        activation: the gate's activation: silu (SwiGLU), gelu or gelu_tanh (GEGLU).
        bias: whether the three Linears have biases.
        device: where the parameters are made, as for ``nn.Linear``.
        dtype: the parameters' dtype, as for ``nn.Linear``.
        backend: force a backend for this module; None lets the dispatcher choose.
        recompute: True makes training recompute the gate and up products in backward
            instead of saving them.

    Raises:
        ValueError: a size out of range, an activation the gated op lacks, an unknown
            backend.
    """

    def __init__(self, in_features: int, hidden_features: int, out_features: int | None = None,
                 activation: str = "silu", bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 *, backend: str | None = None, recompute: bool = False):
        super().__init__()
        out_features = in_features if out_features is None else out_features
        for name, v in (("in_features", in_features), ("hidden_features", hidden_features),
                        ("out_features", out_features)):
            check_size(name, v)
        check_recompute(recompute)
        check_backend(backend)
        act = activations.get(activation).name
        if act not in GATE_ACTIVATIONS:
            raise ValueError(f"activation: the gated MLP supports {list(GATE_ACTIVATIONS)}, "
                             f"got {act!r}")
        self.activation, self.backend, self.recompute = act, backend, recompute
        kw = dict(bias=bias, device=device, dtype=dtype)
        self.gate_proj = nn.Linear(in_features, hidden_features, **kw)
        self.up_proj = nn.Linear(in_features, hidden_features, **kw)
        self.down_proj = nn.Linear(hidden_features, out_features, **kw)

    @property
    def has_bias(self) -> bool:
        """Whether the Linears have biases."""
        return self.gate_proj.bias is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[..., in_features]`` -> ``[..., out_features]``, through the backend the
        dispatcher picks (or ``backend``)."""
        # _modules / _parameters directly: nn.Module.__getattr__ costs ~1 us a lookup,
        # and a decode-sized call is all host time
        (wg, bg), (wu, bu), (wd, bd) = (op.linear_params(self, n)
                                        for n in ("gate_proj", "up_proj", "down_proj"))
        return _module_call(self, x, wg, wu, wd, None if bg is None else [bg, bu, bd])

    def extra_repr(self) -> str:
        return (f"in={self.gate_proj.in_features}, hidden={self.gate_proj.out_features}, "
                f"out={self.down_proj.out_features}, activation={self.activation!r}, "
                f"bias={self.has_bias}")

    @classmethod
    def from_module(cls, mlp: nn.Module, *, backend: str | None = None,
                    recompute: bool = False) -> "GatedMLP":
        """A GatedMLP whose children ARE ``mlp``'s gate/up/down Linears (shared, not
        copied). ValueError saying what does not fit otherwise."""
        act, why = _gated_plan(mlp)
        if act is None:
            raise ValueError(f"mlp: cannot fuse: {why}")
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.activation, m.backend, m.recompute = act, backend, recompute
        m.gate_proj, m.up_proj, m.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        m.train(mlp.training)
        return m


def _module_call(m, x, w_gate, w_up, w_down, biases):
    """A gated module's call: ``call`` when the inputs are ``lean``, else the functional
    entry's full validation, with an error about x's width naming x."""
    recompute = op.module_recompute(m)  # an eval module under export: the inference op
    if lean(x, w_gate, w_up, w_down, biases):
        return call(x, w_gate, w_up, w_down, biases, m.activation, m.backend, recompute)
    try:
        return fused_gated_mlp(x, w_gate, w_up, w_down, m.activation, m.backend, recompute,
                               biases=biases)
    except ValueError as e:
        op.raise_module_error(e, x, w_gate.shape[1])


# attribute names under which gated MLPs keep their activation (Llama/Mistral/Qwen/Gemma:
# act_fn; Phi-3: activation_fn; timm: act)
ACT_ATTRS = ("act_fn", "activation_fn", "act", "activation")


def find_activation(mlp: nn.Module):
    """(registry name, None) for the activation ``mlp`` holds under one of ACT_ATTRS (a
    module or a plain function, recognised by what it computes), else (None, why not)."""
    for attr in ACT_ATTRS:
        fn = getattr(mlp, attr, None)
        if fn is not None and not isinstance(fn, str):
            a, how = activations.recognise(fn)
            if a is None:
                return None, f"{attr}: {how}"
            if a.name not in GATE_ACTIVATIONS:
                return None, (f"{attr} computes {a.name!r}; the gated op supports "
                              f"{list(GATE_ACTIVATIONS)}")
            return a.name, None
    return None, f"no activation attribute ({', '.join(ACT_ATTRS)})"


def check_linears(lins) -> str | None:
    """Why these projections cannot feed one gated op, or None."""
    if any(type(l) is not nn.Linear for l in lins):
        kinds = ", ".join(type(l).__name__ for l in lins)
        return f"projections must be nn.Linear, got {kinds}"
    if len({l.bias is not None for l in lins}) > 1:
        return "some projections have a bias and some do not"
    if len({(l.weight.dtype, l.weight.device) for l in lins}) > 1:
        return "projections differ in dtype or device"
    return None


def _gated_plan(mlp: nn.Module):
    """(gate activation name, None) if ``mlp`` is a Llama-style MLP we can fuse, else
    (None, why not)."""
    lins = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if any(not isinstance(l, nn.Module) for l in lins):
        return None, "gate_proj, up_proj and down_proj must all be present"
    why = check_linears(lins)
    if why:
        return None, why
    gate, up, down = lins
    if gate.weight.shape != up.weight.shape or down.in_features != gate.out_features:
        return None, "gate/up/down shapes do not chain"
    return find_activation(mlp)


class GatedMLPView(nn.Module):
    """A gated MLP over another module's Linears, kept under their own names so state_dict
    keys do not change: split gate/up Linears (timm ``SwiGLU``: fc1_g, fc1_x, fc2) or one
    packed Linear holding both (Phi-3's ``gate_up_proj``, timm ``GluMlp``'s ``fc1``),
    whose halves are passed to the op as views of the packed weight, never copies.
    x: [..., in] -> [..., out]."""

    def __init__(self, linears: dict, gate_up: tuple, down: str, activation: str, *,
                 gate_first: bool = True, backend: str | None = None, recompute: bool = False):
        super().__init__()
        for name, lin in linears.items():
            self.add_module(name, lin)
        self._gate_up, self._down, self.gate_first = tuple(gate_up), down, gate_first
        self.activation, self.backend, self.recompute = activation, backend, recompute

    def gate_up_params(self):
        """(w_gate, w_up, b_gate, b_up): the Linears' own tensors, or views of the packed one."""
        if len(self._gate_up) == 2:
            (wg, bg), (wu, bu) = (op.linear_params(self, n) for n in self._gate_up)
            return wg, wu, bg, bu
        w, b = op.linear_params(self, self._gate_up[0])
        h = w.shape[0] // 2
        w0, w1 = w[:h], w[h:]
        b0, b1 = (None, None) if b is None else (b[:h], b[h:])
        return (w0, w1, b0, b1) if self.gate_first else (w1, w0, b1, b0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wg, wu, bg, bu = self.gate_up_params()
        wd, bd = op.linear_params(self, self._down)
        return _module_call(self, x, wg, wu, wd, None if bd is None else [bg, bu, bd])

    def extra_repr(self) -> str:
        packed = len(self._gate_up) == 1
        return (f"gate_up={list(self._gate_up)}{' (packed, gate ' if packed else ''}"
                f"{('first)' if self.gate_first else 'second)') if packed else ''}, "
                f"down={self._down!r}, activation={self.activation!r}")
