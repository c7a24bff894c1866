"""nn.Modules over the op: FusedMLP (fuse_mlps, in convert.py, swaps models' MLPs for it).

FusedMLP keeps one ``nn.Linear`` child per layer, named by its index in the
equivalent ``nn.Sequential`` (Linear, act, Linear, act, ..., Linear[, out_act]), so a
state_dict saved from that Sequential loads unchanged and vice versa.
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
from torch import nn

from . import activations, dispatch, envvars, op
from .spec import MAX_HIDDEN_LAYERS, MLPSpec, check_backend, check_recompute, check_size


class FusedMLP(nn.Module):
    """A whole MLP as one fused op. x: [..., in_features] -> [..., out_features].

    The layers are ``nn.Linear`` children named as in the equivalent ``nn.Sequential``
    (``"0"``, ``"2"``, ...), so a state_dict saved from that Sequential loads unchanged.

    Args:
        in_features: width of the input's last dimension.
        out_features: width of the output's last dimension.
        hidden_features: width of every hidden layer.
        hidden_layers: hidden layers, counted as tiny-cuda-nn does: ``hidden_layers + 1``
            matmuls (in->hidden, ``hidden_layers - 1`` x hidden->hidden, hidden->out);
            0 gives a single in->out layer.
        activation: the hidden layers' activation: none, relu, leaky_relu, gelu,
            gelu_tanh, silu, sigmoid, tanh or softplus.
        output_activation: the activation after the last layer (default none).
        bias: whether every layer has a bias.
        device: where the parameters are made, as for ``nn.Linear``.
        dtype: the parameters' dtype, as for ``nn.Linear``.
        backend: force a backend for this module (a name from ``fm.backends()``);
            None lets the dispatcher choose. A forced backend that cannot run is an error.
        recompute: True makes training recompute the hidden activations in backward
            instead of saving them, False saves them, None lets the backend choose
            (Triton on CUDA recomputes where its backward is one kernel that does it on
            chip; the others save).
        softplus_beta: softplus as ``nn.Softplus(beta)``, for ``activation`` or
            ``output_activation`` softplus.

    Raises:
        ValueError: a size out of range, an unknown activation or backend.
        TypeError: a size that is not an int.
    """

    def __init__(self, in_features: int, out_features: int, hidden_features: int,
                 hidden_layers: int, activation: str = "relu",
                 output_activation: str = "none", bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 *, backend: str | None = None, recompute: bool | None = None,
                 softplus_beta: float = 1.0):
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features),
                        ("hidden_features", hidden_features)):
            check_size(name, v)
        check_size("hidden_layers", hidden_layers, 0, MAX_HIDDEN_LAYERS)
        check_backend(backend)
        widths = [in_features] + [hidden_features] * hidden_layers + [out_features]
        names = [str(2 * i) for i in range(len(widths) - 1)]
        self._setup(widths, names, activation, output_activation, bias, device, dtype,
                    backend, recompute, softplus_beta=softplus_beta)

    def _setup(self, widths, names, activation, output_activation, bias, device, dtype,
               backend, recompute, shared=None, softplus_beta=1.0):
        self.activation = activations.get(activation).name
        self.output_activation = activations.get(output_activation).name
        self.softplus_beta = op.check_softplus_beta(softplus_beta, self.activation,
                                                    self.output_activation)
        self.widths = tuple(int(w) for w in widths)
        self.has_bias = bool(bias)
        self.backend = backend
        check_recompute(recompute)
        self.recompute = recompute
        self._names = tuple(names)
        for name, a, b in zip(names, widths[:-1], widths[1:]):
            self.add_module(name, shared[name] if shared is not None else
                            nn.Linear(a, b, bias=bias, device=device, dtype=dtype))
        self._specs: dict[torch.dtype, MLPSpec] = {}
        self._bound: _BoundForward | None = None  # no-grad calls
        self._bound_train: _BoundForward | None = None  # grad-mode calls (routed rows)
        self._no_train_binding = None  # the key of the last _bind_train that found none
        self._pack_hidden()

    def _pack_hidden(self) -> None:
        """Keep the hidden layers' weights (and biases) back to back in one buffer each, so
        the fused kernel reads them in place instead of stacking a copy every call. The
        Parameters stay the same objects (``.data`` is re-pointed); anything that breaks the
        layout later (``load_state_dict(assign=True)``, re-assigned weights) only costs that
        copy again, never correctness."""
        self._bound = self._bound_train = None  # the parameters move: bind again
        hidden = [self._modules[n] for n in self._names[1:-1]]
        if len(hidden) < 2:
            return
        for attr in ("weight", "bias"):
            ps = [lin._parameters.get(attr) for lin in hidden]
            if any(p is None for p in ps) or len({(p.shape, p.dtype, p.device) for p in ps}) > 1:
                continue
            with torch.no_grad():
                buf = torch.stack([p.detach() for p in ps])
                if ps[0].is_shared():  # after share_memory(): keep them in shared memory
                    buf.share_memory_()
            for p, b in zip(ps, buf):
                p.data = b

    def __getstate__(self):  # a bound call holds compiled kernels: never copied along
        state = dict(super().__getstate__())
        state["_bound"] = state["_bound_train"] = None
        return state

    def __setstate__(self, state):  # copy.deepcopy and unpickling: pack the copy too
        super().__setstate__(state)
        self.__dict__.setdefault("softplus_beta", 1.0)  # pickled before it existed
        self.__dict__.setdefault("_bound_train", None)
        self.__dict__.setdefault("_no_train_binding", None)
        if "_names" in self.__dict__:
            self._pack_hidden()

    def _apply(self, fn, recurse=True):
        # .to() / .half() / .cuda() give every parameter its own new tensor: pack again
        out = super()._apply(fn, recurse)
        self._pack_hidden()
        return out

    @property
    def in_features(self) -> int:
        """Width of the input's last dimension."""
        return self.widths[0]

    @property
    def out_features(self) -> int:
        """Width of the output's last dimension."""
        return self.widths[-1]

    @property
    def linears(self) -> list[nn.Linear]:
        """The layers, first to last: the ``nn.Linear`` children holding the parameters."""
        return [self._modules[n] for n in self._names]

    def weights(self) -> list[torch.Tensor]:
        """Every layer's weight, first to last, in ``nn.Linear``'s ``[out, in]`` layout:
        the tensors the op reads (``fm.fused_mlp(x, mlp.weights(), mlp.biases())``)."""
        return [op.linear_params(self, n)[0] for n in self._names]

    def biases(self) -> list[torch.Tensor] | None:
        """Every layer's bias ``[out]``, first to last; None for a module without bias."""
        return self._params()[1]

    def _params(self) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
        """(weights, biases or None) in one pass over the layers (the per-call path)."""
        wb = [op.linear_params(self, n) for n in self._names]
        return [w for w, _ in wb], ([b for _, b in wb] if self.has_bias else None)

    def spec(self, dtype: torch.dtype | None = None) -> MLPSpec:
        """The ``MLPSpec`` (widths, activations, bias, dtype) the dispatcher decides on.

        Args:
            dtype: the compute dtype; default the parameters' dtype.
        """
        dtype = dtype or self._modules[self._names[0]].weight.dtype
        if torch.compiler.is_compiling():  # no cache: filling it would fail a guard of
            # the traced code and compile it a second time
            return MLPSpec(self.widths, self.activation, self.output_activation,
                           self.has_bias, dtype)
        s = self._specs.get(dtype)
        if s is None:
            s = self._specs[dtype] = MLPSpec(self.widths, self.activation,
                                             self.output_activation, self.has_bias, dtype)
        return s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the MLP on ``x`` through the backend the dispatcher picks (or ``backend``).

        Args:
            x: ``[..., in_features]``, on the parameters' device; any leading dimensions.
                Under ``torch.autocast`` the op computes in the autocast dtype.

        Returns:
            ``[..., out_features]``, in ``x``'s dtype (the autocast dtype under autocast).

        Raises:
            ValueError: ``x``'s last dimension is not ``in_features``, or ``x`` is on
                another device or dtype than the parameters.
        """
        if self.softplus_beta != 1.0:  # rescaled parameters every call: the op's full path
            try:
                return op.fused_mlp(x, *self._params(), self.activation,
                                    self.output_activation, self.backend,
                                    op.module_recompute(self), softplus_beta=self.softplus_beta)
            except ValueError as e:
                op.raise_module_error(e, x, self.widths[0])
        bound = None
        # is_compiling() first: dynamo folds it to True and never reads the binding
        if not torch.compiler.is_compiling() and type(x) is torch.Tensor \
                and not op.transformed():
            bound = self._bound_train if torch.is_grad_enabled() else self._bound
            if bound is not None:
                if not bound.valid(self, x):
                    bound = None
                else:  # a valid binding may still pass a call on (a new row count)
                    y = bound.run(x)
                    if y is not None:
                        return y
        weights, biases = self._params()
        lean = (isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[-1] == self.widths[0]
                and not x.is_meta and not torch.is_autocast_enabled(x.device.type))
        if lean:  # every parameter on x's device and dtype (one layer moved alone is not)
            dt, dev = x.dtype, x.device
            for t in weights if biases is None else weights + biases:
                if t.dtype is not dt or t.device != dev:
                    lean = False
                    break
        if not lean:  # full validation (clear errors) and autocast handling
            try:
                return op.fused_mlp(x, weights, biases, self.activation,
                                    self.output_activation, self.backend,
                                    op.module_recompute(self))
            except ValueError as e:
                op.raise_module_error(e, x, self.widths[0])
        spec = self.spec(x.dtype)
        if bound is None and x.dim() == 2 and op.plain_eager(x):
            if not torch.is_grad_enabled():
                bound = self._bind(x, spec, weights, biases)
            elif not self.recompute and self._no_train_binding != self._train_key(x):
                bound = self._bind_train(x, spec, weights, biases)
            y = None if bound is None else bound.run(x)
            if y is not None:
                return y
        return op.call(x, weights, biases, spec, self.backend, op.module_recompute(self))

    def _bind(self, x, spec, weights, biases) -> "_BoundForward | None":
        """Bind no-grad calls on x's device and dtype to the backend's forward for these
        parameters, where the backend offers that (``bind_forward``)."""
        be = dispatch.choose(x.device, spec, self.backend)
        make = getattr(be, "bind_forward", None)
        run = None if make is None else make(spec, x.device, weights, biases)
        if run is None:
            run = _routed_forward(be, spec, x.device, weights, biases, self.backend)
        if run is None:
            return None
        self._bound = _BoundForward(self, x, run, "_bound")
        return self._bound

    def _bind_train(self, x, spec, weights, biases) -> "_BoundForward | None":
        """Bind grad-mode calls on x's device and dtype of the row counts that the
        backend runs as torch ops in training (op._torch_ops) to those ops: the same
        autograd graph as eager's, without the per-call questions (the wide-gelu train
        step at 16-512 rows ran 5-11% slower than eager's on the H200 host through the
        full path, h200-host-train-20261204.json). Calls that need no gradient, and other
        row counts, take the full path."""
        be = dispatch.choose(x.device, spec, self.backend, train=True)
        run = _routed_forward(be, spec, x.device, weights, biases, self.backend, train=True)
        if run is None:  # none for this device, dtype and choice (every narrow net):
            # not asked again on the train hot path until one of those changes
            self._no_train_binding = self._train_key(x)
            return None
        self._bound_train = _BoundForward(self, x, run, "_bound_train")
        return self._bound_train

    def _train_key(self, x) -> tuple:
        """What _bind_train's answer depends on besides the parameters."""
        return (x.dtype, x.device, self.backend, dispatch.generation,
                envvars.get(dispatch.ENV_VAR))

    def extra_repr(self) -> str:
        beta = f", softplus_beta={self.softplus_beta:g}" if self.softplus_beta != 1.0 else ""
        return (f"widths={list(self.widths)}, activation={self.activation!r}, "
                f"output_activation={self.output_activation!r}, bias={self.has_bias}{beta}")

    def to_sequential(self) -> nn.Sequential:
        """The equivalent eager nn.Sequential (same parameter values and state_dict keys)."""
        mods: dict[str, nn.Module] = {}  # insertion order is the chain's order
        for i, (name, lin) in enumerate(zip(self._names, self.linears)):
            new = nn.Linear(lin.in_features, lin.out_features, bias=self.has_bias,
                            device=lin.weight.device, dtype=lin.weight.dtype)
            new.load_state_dict(lin.state_dict())
            mods[name] = new
            last = i == len(self._names) - 1
            act = self.output_activation if last else self.activation
            if act != "none":  # after Linear "0" comes "1"; after "fc1", "fc1_act"
                key = str(int(name) + 1) if name.isdigit() else f"{name}_act"
                mods[key] = activations.to_module(act, self.softplus_beta)
        return nn.Sequential(OrderedDict(mods))

    @classmethod
    def from_sequential(cls, seq: nn.Sequential, *, backend: str | None = None,
                        recompute: bool | None = None) -> "FusedMLP":
        """A FusedMLP with exactly the parameter values of ``seq`` (shared copies, not views).

        seq must be Linear, act, Linear, act, ..., Linear[, out_act] with one hidden
        activation type throughout, all Linears with or all without bias. ValueError
        otherwise, saying which module does not fit.
        """
        plan = _plan(seq)
        if isinstance(plan, str):
            raise ValueError(f"seq: cannot fuse: {plan}")
        names, widths, act, out_act, bias, ref, beta = plan
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m._setup(widths, names, act, out_act, bias, ref.device, ref.dtype, backend, recompute,
                 softplus_beta=beta)
        with torch.no_grad():
            for name, lin in zip(names, m.linears):
                src = seq._modules[name]
                lin.weight.copy_(src.weight)
                if bias:
                    lin.bias.copy_(src.bias)
        m.train(seq.training)
        return m

    @classmethod
    def from_linears(cls, linears: dict, activation: str, output_activation: str = "none", *,
                     backend: str | None = None, training: bool = True) -> "FusedMLP":
        """A FusedMLP whose layers ARE ``linears`` (name -> nn.Linear, in chain order; shared,
        not copied), under those names, so the owner's state_dict keys stay (timm's Mlp:
        fc1, fc2). The caller checked that they chain (see convert.py)."""
        lins = list(linears.values())
        widths = [lins[0].in_features] + [l.out_features for l in lins]
        ref = lins[0].weight
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m._setup(widths, list(linears), activation, output_activation, lins[0].bias is not None,
                 ref.device, ref.dtype, backend, None, shared=dict(linears))
        m.train(training)
        return m


_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None) or (
    lambda: any(torch.is_autocast_enabled(d) for d in op.DEVICE_TYPES))


def _routed_forward(be, spec, device, weights, biases, backend, train: bool = False):
    """A bound no-grad forward for the row counts where ``be`` runs plain eager calls as
    the reference's torch ops (``Backend.torch_rows``, op._torch_ops), or None where it
    names none (or a backend is forced: then the kernels run at every row count). Those
    calls are small, host-bound ones (wide-gelu fp16 inference at 1-512 rows ran 0.63-1.02x
    eager on the H200 through the full path, h200-sweep-fp16-all-20261203.json); bound,
    they skip its per-call questions. Parameters are held by weak reference (the caller's
    ``valid`` checks each is still the same object first); other row counts return None:
    the full path. ``train``: grad-mode calls, the training ranges; a call where neither x
    nor any parameter requires a gradient returns None (the full path takes it as the
    no-grad call it is)."""
    ranges = be.torch_rows(spec, device, train)
    if not ranges or dispatch.requested(backend) is not None:
        return None
    forward = op.composite_forward
    wrefs = tuple(weakref.ref(w) for w in weights)
    brefs = None if biases is None else tuple(weakref.ref(b) for b in biases)

    def run(x):
        n = x.shape[0]
        for lo, hi in ranges:
            if lo <= n <= hi:
                ws = [r() for r in wrefs]
                bs = None if brefs is None else [r() for r in brefs]
                if train and not (x.requires_grad or any(w.requires_grad for w in ws) or (
                        bs is not None and any(b.requires_grad for b in bs))):
                    return None
                return forward(x, ws, bs, spec)
        return None
    return run


class _BoundForward:
    """A FusedMLP's no-grad eager forward on one device and dtype, bound to its parameters.

    Host time is the whole cost of a small call, and most of it went to asking again,
    every call, what cannot have changed: the spec, the backend, the parameters' dtype,
    device and layout. A bound call only checks that nothing it relies on did change
    (x's device, dtype and width; no autocast, compile, tracing or dispatch mode; the
    same forced backend, registry and fast-path switch; every Linear and every parameter
    the same object, at the same address) in ``valid``; otherwise the module takes its full path (and binds
    again where a parameter changed). ``run(x)`` is the backend's bound forward; it may
    return None for a call it does not take (the module's full path then runs it)."""

    __slots__ = ("dtype", "device", "in_features", "backend", "env", "generation",
                 "children", "params", "run", "attr")

    def __init__(self, module: FusedMLP, x: torch.Tensor, run, attr: str):
        self.dtype, self.device, self.in_features = x.dtype, x.device, module.widths[0]
        self.backend, self.env, self.generation = (
            module.backend, envvars.get(dispatch.ENV_VAR), dispatch.generation)
        # weak references: a replaced parameter's (or Linear's) memory is not kept alive
        # by this; a Linear replaced by another module (an adapter) unbinds
        self.children = tuple((n, weakref.ref(module._modules[n])) for n in module._names)
        self.params = tuple((lin._parameters, name, weakref.ref(p), p.data_ptr())
                            for lin in module.linears
                            for name, p in lin._parameters.items() if p is not None)
        self.run, self.attr = run, attr  # attr: the module's attribute holding it

    def valid(self, module: FusedMLP, x: torch.Tensor) -> bool:
        """Whether a call of ``module`` with ``x`` may take ``run``; the caller checked
        that x is a plain Tensor, the grad mode (bound per mode) and that nothing is being
        compiled or transformed."""
        if (x.dtype is not self.dtype or x.device != self.device or x.dim() != 2
                or x.shape[1] != self.in_features or module.backend != self.backend
                or dispatch.generation != self.generation
                or (self.backend is None and envvars.get(dispatch.ENV_VAR) != self.env)
                or _any_autocast() or not op.EAGER_FAST_PATH or op._dispatch_modes()
                or (module.recompute and self.attr == "_bound_train")):
            return False
        mods = module._modules
        for n, ref in self.children:
            if mods.get(n) is not ref():
                setattr(module, self.attr, None)
                return False
        for params, name, ref, ptr in self.params:
            p = params.get(name)
            if p is None or p is not ref() or p.data_ptr() != ptr:
                setattr(module, self.attr, None)  # the next eligible call binds again
                return False
        return True


def _plan(seq: nn.Sequential):
    """Parse a Sequential into (linear names, widths, act, out_act, bias, weight); or a reason.

    nn.Identity and Dropout(p=0) are skipped; activations are recognised by what they
    compute (inplace ones included)."""
    items = list(seq._modules.items())
    if not items or not isinstance(items[0][1], nn.Linear):
        return "the first module is not nn.Linear"
    for name, mod in items:
        if isinstance(mod, nn.Linear) and type(mod) is not nn.Linear:
            return (f"module {name!r} is {type(mod).__name__}, a wrapped or derived "
                    "nn.Linear (a parametrization, an adapter): only plain nn.Linear "
                    "layers are fused")
    names, widths, hidden_acts, out_act = [], [], [], "none"
    pending = None  # activation seen after the last Linear
    betas = set()  # of nn.Softplus(beta) modules (threshold 20: the registry's)
    for name, mod in items:
        if type(mod) is nn.Linear:
            if names:
                hidden_acts.append(pending or "none")
            if widths and mod.in_features != widths[-1]:
                return f"module {name!r}: in_features {mod.in_features} != {widths[-1]}"
            names.append(name)
            widths = widths or [mod.in_features]
            widths.append(mod.out_features)
            pending = None
            continue
        if type(mod) is nn.Identity:
            continue
        if isinstance(mod, nn.modules.dropout._DropoutNd):
            if mod.p == 0:
                continue
            return (f"module {name!r} is {type(mod).__name__}(p={mod.p}): dropout with p > 0 "
                    "is not fused (it is random in training); set p=0 to fuse")
        if (type(mod) is nn.Softplus and mod.threshold == activations.SOFTPLUS_THRESHOLD
                and mod.beta > 0):
            act, why = activations.ACTIVATIONS["softplus"], "class"
            betas.add(float(mod.beta))
        else:
            act, why = activations.recognise(mod)
        if act is None:
            return f"module {name!r}: not a supported activation ({why})"
        if pending is not None:
            return f"module {name!r}: two activations in a row"
        pending = act.name
    out_act = pending or "none"
    if len(set(hidden_acts)) > 1:
        return f"hidden activations differ: {hidden_acts}"
    lins = [seq._modules[n] for n in names]
    has_bias = {lin.bias is not None for lin in lins}
    if len(has_bias) > 1:
        return "some Linear layers have a bias and some do not"
    ref = lins[0].weight
    if any(l.weight.dtype != ref.dtype or l.weight.device != ref.device for l in lins):
        return "Linear layers differ in dtype or device"
    if len(betas) > 1:
        return f"Softplus modules with different betas: {sorted(betas)}"
    return (names, widths, (hidden_acts[0] if hidden_acts else "relu"), out_act,
            has_bias.pop(), ref, betas.pop() if betas else 1.0)
