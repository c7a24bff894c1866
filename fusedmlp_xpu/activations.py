"""The activation registry: one entry per activation, shared by every backend.

Each entry holds the reference function, its derivative with respect to the
pre-activation ``z``, the integer id that kernels receive, and the
``torch.nn`` module classes that ``fuse_mlps`` recognises as that activation.
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


def _softplus_grad(z):
    bz = z * SOFTPLUS_BETA
    return torch.where(bz > SOFTPLUS_THRESHOLD, torch.ones_like(z), torch.sigmoid(bz))


_ENTRIES = [
    Activation("none", 0, lambda z: z, lambda z: torch.ones_like(z)),
    # the derivative as torch's relu backward takes it: 0 where z <= 0, else 1 (NaN: 1)
    Activation("relu", 1, torch.relu, lambda z: (z <= 0).logical_not().to(z.dtype)),
    Activation(
        "leaky_relu",
        2,
        lambda z: F.leaky_relu(z, LEAKY_RELU_SLOPE),
        lambda z: torch.where(z > 0, torch.ones_like(z), torch.full_like(z, LEAKY_RELU_SLOPE)),
    ),
    Activation("gelu", 3, F.gelu, _gelu_grad),
    Activation("gelu_tanh", 4, lambda z: F.gelu(z, approximate="tanh"), _gelu_tanh_grad),
    Activation("silu", 5, F.silu, _silu_grad),
    Activation("sigmoid", 6, torch.sigmoid, lambda z: torch.sigmoid(z) * (1.0 - torch.sigmoid(z))),
    Activation("tanh", 7, torch.tanh, lambda z: 1.0 - torch.tanh(z) ** 2),
    Activation(
        "softplus",
        8,
        lambda z: F.softplus(z, SOFTPLUS_BETA, SOFTPLUS_THRESHOLD),
        _softplus_grad,
    ),
]

ACTIVATIONS: dict[str, Activation] = {a.name: a for a in _ENTRIES}
BY_ID: dict[int, Activation] = {a.id: a for a in _ENTRIES}
ALIASES = {None: "none", "identity": "none", "linear": "none", "swish": "silu"}


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


def to_module(name: str) -> nn.Module:
    """The torch.nn module computing the same function (used to build eager baselines)."""
    return {
        "none": nn.Identity,
        "relu": nn.ReLU,
        "leaky_relu": lambda: nn.LeakyReLU(LEAKY_RELU_SLOPE),
        "gelu": nn.GELU,
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": nn.SiLU,
        "sigmoid": nn.Sigmoid,
        "tanh": nn.Tanh,
        "softplus": lambda: nn.Softplus(SOFTPLUS_BETA, SOFTPLUS_THRESHOLD),
    }[get(name).name]()
