"""The standard benchmark configs (docs/benchmarks.md), in one table that profile and bench share.

Names are the ones used in code, JSON and reports. Only configs a ``FusedMLP`` can
express live here; ``wide-swiglu`` is a gated MLP and joins when the gated module does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MLPConfig:
    """One standard MLP shape. ``hidden_layers`` counts as FusedMLP (tiny-cuda-nn) does:
    hidden_layers + 1 matmuls."""

    name: str
    in_features: int
    hidden_features: int
    hidden_layers: int
    out_features: int
    activation: str = "relu"
    output_activation: str = "none"
    bias: bool = False
    #: the batch sizes (rows) the benchmark sweeps for this config
    batches: tuple[int, ...] = ()
    #: the regime of DESIGN.md: "narrow" (every width <= 128) or "wide"
    regime: str = "narrow"

    @property
    def widths(self) -> tuple[int, ...]:
        return ((self.in_features,) + (self.hidden_features,) * self.hidden_layers
                + (self.out_features,))

    def flops_per_row(self) -> int:
        """Multiply-adds x 2 of one forward row (bias and activation not counted)."""
        w = self.widths
        return 2 * sum(a * b for a, b in zip(w[:-1], w[1:]))

    def n_params(self) -> int:
        w = self.widths
        return sum(a * b + (b if self.bias else 0) for a, b in zip(w[:-1], w[1:]))

    def make(self, device=None, dtype=None, **kwargs):
        """A FusedMLP of this shape (``kwargs`` go to FusedMLP, e.g. backend=)."""
        from ..module import FusedMLP  # keeps this table importable without the op library

        return FusedMLP(self.in_features, self.out_features, self.hidden_features,
                        self.hidden_layers, self.activation, self.output_activation,
                        self.bias, device=device, dtype=dtype, **kwargs)


_NARROW_BATCHES = (2**16, 2**18, 2**20, 2**22)

CONFIGS: dict[str, MLPConfig] = {c.name: c for c in (
    MLPConfig("narrow-w32", 64, 32, 4, 64, batches=_NARROW_BATCHES),
    MLPConfig("narrow-w64", 64, 64, 4, 64, batches=_NARROW_BATCHES),
    MLPConfig("narrow-w128", 64, 128, 4, 64, batches=_NARROW_BATCHES),
    # Intel's SYCL paper (arXiv 2403.17607), Table I: width 64, 11 hidden layers
    MLPConfig("paper-table1", 64, 64, 11, 64, batches=(2**17,)),
    MLPConfig("nerf-density", 32, 64, 1, 16, batches=(2**20,)),
    # a batch that is no multiple of any block size, to catch tail handling in timing runs
    MLPConfig("odd-batch", 64, 64, 4, 64, batches=(2**20 + 37,)),
    MLPConfig("wide-gelu", 4096, 16384, 1, 4096, activation="gelu_tanh", bias=True,
              batches=(16, 8192), regime="wide"),
)}

DEFAULT_CONFIG = "narrow-w64"


def get(name: str) -> MLPConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"config: unknown config {name!r}; known: {', '.join(CONFIGS)}") from None


def positive_int(text: str) -> int:
    """An argparse type for --batch and --threads: a whole number >= 1."""
    import argparse

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return n


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
