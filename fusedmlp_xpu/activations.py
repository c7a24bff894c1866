"""The activation registry: one entry per activation, shared by every backend.

Each entry holds the reference function, its derivative with respect to the
pre-activation ``z``, and the integer id that kernels receive. ``recognise`` tells the
converters which entry a module or function computes: exact torch classes first, then
any other module or callable by its float64 fingerprint on a fixed probe (so
transformers' ``SiLUActivation``, ``NewGELUActivation``, timm's own classes or
``act_fn = F.silu`` are all found, and a lookalike that computes something else is not).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

# Fixed parameters of the parametrised activations (the torch defaults). A
# module with other values is not fused, so results never change silently.
LEAKY_RELU_SLOPE = 0.01
SOFTPLUS_BETA = 1.0
SOFTPLUS_THRESHOLD = 20.0
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class Activation:
    name: str
    id: int  # the value kernels see; never renumber an existing entry
    fn: Callable[[torch.Tensor], torch.Tensor]
    grad: Callable[[torch.Tensor], torch.Tensor]  # d fn / d z, evaluated at z
    #: d^2 fn / d z^2, evaluated at z; None where it is zero (almost everywhere: relu,
    #: leaky relu, none), as torch's double backward takes it
    grad2: Callable[[torch.Tensor], torch.Tensor] | None = None
    #: (g, z) -> g * fn'(z) by the kernel eager autograd runs for fn (``threshold_backward``
    #: for relu, ``silu_backward``, ...): one pass where ``grad`` takes several, the same
    #: rounding and NaN handling as nn.Sequential's backward. g and z share a dtype. Not
    #: differentiable for every activation (torch has no derivative of silu_backward):
    #: a backward that autograd records takes ``grad`` instead.
    backward: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def _gelu_grad(z):
    cdf = 0.5 * (1.0 + torch.erf(z * (1.0 / math.sqrt(2.0))))
    pdf = torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
    return cdf + z * pdf


def _gelu_tanh_grad(z):
    inner = _SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)
    t = torch.tanh(inner)
    dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * z * z)
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * dinner


def _silu_grad(z):
    s = torch.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def _gelu_grad2(z):
    pdf = torch.exp(-0.5 * z * z) * (1.0 / math.sqrt(2.0 * math.pi))
    return pdf * (2.0 - z * z)


def _gelu_tanh_grad2(z):
    inner = _SQRT_2_OVER_PI * (z + 0.044715 * z * z * z)
    t = torch.tanh(inner)
    dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * z * z)
    ddinner = _SQRT_2_OVER_PI * 6.0 * 0.044715 * z
    return (1.0 - t * t) * (dinner + 0.5 * z * (ddinner - 2.0 * t * dinner * dinner))


def _silu_grad2(z):
    s = torch.sigmoid(z)
    return s * (1.0 - s) * (2.0 + z * (1.0 - 2.0 * s))


def _sigmoid_grad2(z):
    s = torch.sigmoid(z)
    return s * (1.0 - s) * (1.0 - 2.0 * s)


def _tanh_grad2(z):
    t = torch.tanh(z)
    return -2.0 * t * (1.0 - t * t)


def _softplus_grad2(z):
    bz = z * SOFTPLUS_BETA
    s = torch.sigmoid(bz)
    return torch.where(bz > SOFTPLUS_THRESHOLD, torch.zeros_like(z),
                       SOFTPLUS_BETA * s * (1.0 - s))


def _softplus_grad(z):
    bz = z * SOFTPLUS_BETA
    return torch.where(bz > SOFTPLUS_THRESHOLD, torch.ones_like(z), torch.sigmoid(bz))


_aten = torch.ops.aten

_ENTRIES = [
    Activation("none", 0, lambda z: z, lambda z: torch.ones_like(z),
               backward=lambda g, z: g),
    # the derivative as torch's relu backward takes it: 0 where z <= 0, else 1 (NaN: 1)
    Activation("relu", 1, torch.relu, lambda z: (z <= 0).logical_not().to(z.dtype),
               backward=lambda g, z: _aten.threshold_backward(g, z, 0)),
    Activation(
        "leaky_relu",
        2,
        lambda z: F.leaky_relu(z, LEAKY_RELU_SLOPE),
        lambda z: torch.where(z > 0, torch.ones_like(z), torch.full_like(z, LEAKY_RELU_SLOPE)),
        backward=lambda g, z: _aten.leaky_relu_backward(g, z, LEAKY_RELU_SLOPE, False),
    ),
    Activation("gelu", 3, F.gelu, _gelu_grad, _gelu_grad2,
               backward=lambda g, z: _aten.gelu_backward(g, z)),
    Activation("gelu_tanh", 4, lambda z: F.gelu(z, approximate="tanh"), _gelu_tanh_grad,
               _gelu_tanh_grad2,
               backward=lambda g, z: _aten.gelu_backward(g, z, approximate="tanh")),
    Activation("silu", 5, F.silu, _silu_grad, _silu_grad2,
               backward=lambda g, z: _aten.silu_backward(g, z)),
    # sigmoid's and tanh's backward kernels take the output, as eager saves it
    Activation("sigmoid", 6, torch.sigmoid, lambda z: torch.sigmoid(z) * (1.0 - torch.sigmoid(z)),
               _sigmoid_grad2,
               backward=lambda g, z: _aten.sigmoid_backward(g, torch.sigmoid(z))),
    Activation("tanh", 7, torch.tanh, lambda z: 1.0 - torch.tanh(z) ** 2, _tanh_grad2,
               backward=lambda g, z: _aten.tanh_backward(g, torch.tanh(z))),
    Activation(
        "softplus",
        8,
        lambda z: F.softplus(z, SOFTPLUS_BETA, SOFTPLUS_THRESHOLD),
        _softplus_grad,
        _softplus_grad2,
        backward=lambda g, z: _aten.softplus_backward(g, z, SOFTPLUS_BETA,
                                                      SOFTPLUS_THRESHOLD),
    ),
]

ACTIVATIONS: dict[str, Activation] = {a.name: a for a in _ENTRIES}
BY_ID: dict[int, Activation] = {a.id: a for a in _ENTRIES}
ALIASES = {None: "none", "identity": "none", "linear": "none", "swish": "silu"}
#: the activations a gated MLP (act(x Wg^T) * (x Wu^T)) runs: SwiGLU and GEGLU
GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def get(name) -> Activation:
    """Look an activation up by name (or alias); ``TypeError``/``ValueError`` otherwise."""
    name = ALIASES.get(name, name)
    if not isinstance(name, str):
        raise TypeError(f"activation: expected a name (str) or None, got {type(name).__name__}")
    try:
        return ACTIVATIONS[name.lower()]
    except KeyError:
        raise ValueError(
            f"activation: unknown name {name!r}; expected one of {sorted(ACTIVATIONS)}"
        ) from None


def from_module(module: nn.Module) -> Activation | None:
    """The registry entry equal to an activation module, or None if it is not one we fuse."""
    if isinstance(module, nn.Identity):
        return ACTIVATIONS["none"]
    if type(module) is nn.ReLU:
        return ACTIVATIONS["relu"]
    if type(module) is nn.LeakyReLU:
        return ACTIVATIONS["leaky_relu"] if module.negative_slope == LEAKY_RELU_SLOPE else None
    if type(module) is nn.GELU:
        return ACTIVATIONS["gelu_tanh" if module.approximate == "tanh" else "gelu"]
    if type(module) is nn.SiLU:
        return ACTIVATIONS["silu"]
    if type(module) is nn.Sigmoid:
        return ACTIVATIONS["sigmoid"]
    if type(module) is nn.Tanh:
        return ACTIVATIONS["tanh"]
    if type(module) is nn.Softplus:
        ok = module.beta == SOFTPLUS_BETA and module.threshold == SOFTPLUS_THRESHOLD
        return ACTIVATIONS["softplus"] if ok else None
    return None


# The probe: both signs, the kinks and thresholds of the registry's functions (0, softplus's
# 20), large values (saturation, overflow of a naive formula) and tiny ones (slopes near 0).
_PROBE = torch.cat([
    torch.linspace(-8.0, 8.0, 161, dtype=torch.float64),
    torch.tensor([-1e4, -300.0, -50.0, -20.5, -19.5, -1e-3, -1e-8, 0.0, 1e-8, 1e-3, 19.5,
                  20.5, 50.0, 300.0, 1e4], dtype=torch.float64),
])
# float64 agreement needed to call two functions the same: what reordered float64 arithmetic
# leaves (~1e-16 relative), with room; a real difference (gelu vs gelu_tanh: 5e-4,
# slope 0.2 vs 0.01, x 1.01) is orders of magnitude above it
FINGERPRINT_TOL = 1e-12
_FUNCTIONS = {F.relu: "relu", torch.relu: "relu", F.gelu: "gelu", F.silu: "silu",
              torch.sigmoid: "sigmoid", F.sigmoid: "sigmoid", torch.tanh: "tanh",
              F.tanh: "tanh", F.softplus: "softplus"}


def fingerprint_match(fn) -> Activation | None:
    """The registry entry that ``fn`` (a module or a callable on tensors) computes, by its
    float64 values on a fixed probe within FINGERPRINT_TOL; None if it matches none or fails."""
    try:
        with torch.no_grad():
            y = fn(_PROBE.clone())  # a clone: fn may work in place
    except Exception:
        return None
    if not isinstance(y, torch.Tensor) or y.shape != _PROBE.shape or y.dtype != torch.float64:
        return None
    for a in _ENTRIES:
        ref = a.fn(_PROBE)
        if torch.allclose(y, ref, rtol=FINGERPRINT_TOL, atol=FINGERPRINT_TOL):
            return a
    return None


def recognise(obj) -> tuple[Activation | None, str]:
    """(registry entry, how it was recognised) for an activation module or function, or
    (None, why not). Exact torch classes and functions first; then a parameter-free module
    or any callable by its fingerprint. A module with parameters or buffers is never fused
    (the fused op would drop what it holds, and a trained value may drift from the probe's)."""
    if isinstance(obj, nn.Module):
        a = from_module(obj)
        if a is not None:
            return a, "class"
        if isinstance(obj, nn.modules.dropout._DropoutNd):  # identity in eval mode only
            return None, f"{obj!r} is dropout, not an activation"
        if type(obj) in (nn.LeakyReLU, nn.Softplus):
            return None, f"{obj!r}: parameters other than the registry's fixed ones"
        if next(obj.parameters(), None) is not None or next(obj.buffers(), None) is not None:
            return None, f"{type(obj).__name__} holds parameters or buffers"
    elif not callable(obj):
        return None, f"{type(obj).__name__} is not callable"
    else:
        name = _FUNCTIONS.get(obj)
        if name is not None:
            return ACTIVATIONS[name], "function"
    a = fingerprint_match(obj)
    if a is not None:
        return a, "fingerprint"
    label = (type(obj).__name__ if isinstance(obj, nn.Module)
             else getattr(obj, "__name__", repr(obj)))
    return None, (f"{label} computes none of {sorted(ACTIVATIONS)} (or fails) on a float64 "
                  "CPU probe")


def to_module(name: str, softplus_beta: float = SOFTPLUS_BETA) -> nn.Module:
    """The torch.nn module computing the same function (used to build eager baselines);
    softplus with ``softplus_beta``."""
    return {
        "none": nn.Identity,
        "relu": nn.ReLU,
        "leaky_relu": lambda: nn.LeakyReLU(LEAKY_RELU_SLOPE),
        "gelu": nn.GELU,
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": nn.SiLU,
        "sigmoid": nn.Sigmoid,
        "tanh": nn.Tanh,
        "softplus": lambda: nn.Softplus(softplus_beta, SOFTPLUS_THRESHOLD),
    }[get(name).name]()
