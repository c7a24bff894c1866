"""MLPSpec: what a fused MLP computes, independent of the data; and input validation.

Validation happens once, here, in front of every backend. Dtype rule: there is no
implicit promotion. ``x``, every weight and every bias must share one floating
dtype (float16, bfloat16 or float32; float64 is accepted for reference checks).
Under ``torch.autocast`` the op casts everything to the autocast dtype first.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

from . import activations

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Bounds on what a module may be built with: far above any MLP this op is for (the widest
#: released transformer FFN is ~53k wide), low enough that a typo (hidden_layers=10**9)
#: fails at once with a message instead of building modules until memory runs out.
MAX_WIDTH = 1 << 20
MAX_HIDDEN_LAYERS = 1024


@dataclass(frozen=True)
class MLPSpec:
    """widths = (in_features, hidden..., out_features); one matmul per consecutive pair."""

    widths: tuple[int, ...]
    activation: str = "relu"
    output_activation: str = "none"
    bias: bool = True
    dtype: torch.dtype = torch.float32

    def __hash__(self) -> int:
        # specs key every per-call cache (dispatch, tuning, launch constants): hash once,
        # on first use (a spec built while tracing may hold symbolic sizes)
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.widths, self.activation, self.output_activation, self.bias,
                      self.dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __reduce__(self):  # never carry a hash across processes (str hashes are salted)
        return (MLPSpec, (self.widths, self.activation, self.output_activation, self.bias,
                          self.dtype))

    @property
    def in_features(self) -> int:
        return self.widths[0]

    @property
    def out_features(self) -> int:
        return self.widths[-1]

    @property
    def n_layers(self) -> int:
        """Number of matmuls."""
        return len(self.widths) - 1

    @property
    def activation_id(self) -> int:
        return activations.ACTIVATIONS[self.activation].id

    @property
    def output_activation_id(self) -> int:
        return activations.ACTIVATIONS[self.output_activation].id

    def flops(self, rows: int) -> int:
        """Multiply-add FLOPs of one forward over ``rows`` rows."""
        return 2 * rows * sum(a * b for a, b in zip(self.widths[:-1], self.widths[1:]))


def validate(x, weights, biases, activation, output_activation) -> MLPSpec:
    """Check the op's inputs; return their spec. Raises TypeError/ValueError naming the argument.

    x: [..., in_features]; weights[i]: [out_i, in_i] (nn.Linear layout), in_{i+1} == out_i;
    biases: None or one [out_i] tensor per weight.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"x: expected a floating dtype {[str(d) for d in FLOAT_DTYPES]}, got {x.dtype}"
        )
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dimension [..., in_features], got a scalar")
    # exact list/tuple first: the Sequence ABC check costs ~1 us a call
    if weights is None or type(weights) not in (list, tuple) and (
            isinstance(weights, torch.Tensor) or not isinstance(weights, Sequence)) or not weights:
        raise TypeError("weights: expected a non-empty list of 2-D tensors [out, in]")
    act = activations.get(activation)
    out_act = activations.get(output_activation)

    widths = [x.shape[-1]]
    dev, dt = x.device, x.dtype
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"weights[{i}]: expected a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 2:
            raise ValueError(f"weights[{i}]: expected 2-D [out, in], got shape {tuple(w.shape)}")
        if w.shape[1] != widths[-1]:
            what = "x.shape[-1]" if i == 0 else f"weights[{i - 1}].shape[0]"
            raise ValueError(
                f"weights[{i}]: expected in_features {widths[-1]} (= {what}), "
                f"got shape {tuple(w.shape)}"
            )
        _same(w, dev, dt, i, "weights")
        widths.append(w.shape[0])

    if biases is not None:
        if type(biases) not in (list, tuple) and (
                isinstance(biases, torch.Tensor) or not isinstance(biases, Sequence)):
            raise TypeError("biases: expected None or a list of 1-D tensors")
        if len(biases) != len(weights):
            raise ValueError(
                f"biases: expected one per weight ({len(weights)}), got {len(biases)}"
            )
        for i, b in enumerate(biases):
            if not isinstance(b, torch.Tensor):
                raise TypeError(f"biases[{i}]: expected a torch.Tensor, got {type(b).__name__}")
            if b.dim() != 1 or b.shape[0] != widths[i + 1]:
                raise ValueError(
                    f"biases[{i}]: expected shape ({widths[i + 1]},), got {tuple(b.shape)}"
                )
            _same(b, dev, dt, i, "biases")
    return _spec(tuple(int(w) for w in widths), act.name, out_act.name, biases is not None,
                 x.dtype)


def check_size(name: str, value, least: int = 1, most: int = MAX_WIDTH) -> int:
    """``value`` as a size argument: an int (not a bool) in [least, most]; else an error
    naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if not least <= value <= most:
        raise ValueError(f"{name}: expected an int in [{least}, {most}], got {value}")
    return value


def check_backend(backend) -> None:
    """``backend`` must be None (the dispatcher chooses) or a non-empty name."""
    if backend is not None and (not isinstance(backend, str) or not backend):
        raise ValueError(f"backend: expected None (choose automatically) or a backend name "
                         f"such as 'triton' or 'reference', got {backend!r}")


def check_recompute(recompute) -> None:
    """``recompute`` must be None (the backend chooses), True or False."""
    if recompute is not None and type(recompute) is not bool:
        raise TypeError(f"recompute: expected None, True or False, got {recompute!r}")


@functools.lru_cache(maxsize=1024)
def _spec(widths, activation, output_activation, bias, dtype) -> MLPSpec:
    """One MLPSpec per distinct value (building the frozen dataclass costs ~2 us a call)."""
    return MLPSpec(widths, activation, output_activation, bias, dtype)


def _same(t: torch.Tensor, dev: torch.device, dt: torch.dtype, i: int, what: str) -> None:
    """t on x's device ``dev`` and of its dtype ``dt``; else an error naming what[i]."""
    if t.device != dev:
        raise ValueError(
            f"{what}[{i}]: expected device {dev} (the device of x), got {t.device}; "
            "move the module or the input with .to(device)"
        )
    if t.dtype != dt:
        raise TypeError(
            f"{what}[{i}]: expected dtype {dt} (the dtype of x), got {t.dtype}; "
            "the op does not promote: cast the module or the input, or use torch.autocast"
        )
