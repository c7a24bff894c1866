"""tiny-cuda-nn's front door: its network configs, its parameter layout, over FusedMLP.

    from fusedmlp_xpu import tcnn
    net = tcnn.Network(3, 1, {"otype": "FullyFusedMLP", "activation": "ReLU",
                              "output_activation": "None", "n_neurons": 64,
                              "n_hidden_layers": 2})
    net.load_tcnn_params(flat)          # a flat vector trained by tiny-cuda-nn
    y = net(x)                          # x: [..., 3] float32 or half -> y: [..., 1]

What follows tiny-cuda-nn (read from its public source: ``network.cu``'s
``create_network`` for the config keys and defaults, ``networks/fully_fused_mlp.h`` and
``cutlass_mlp.h`` for the parameter layout, ``encodings/identity.h`` for the input padding,
``common_device.h`` for the activations):

- Config keys and defaults: ``otype`` ("MLP"; FullyFusedMLP, MegakernelMLP, CutlassMLP and
  MLP are the same network here), ``n_neurons`` (128), ``n_hidden_layers`` (5: that many
  hidden layers, n_hidden_layers + 1 matmuls), ``activation`` ("ReLU"),
  ``output_activation`` ("None"); names case-insensitive as there. ``feedback_alignment``
  is accepted only when false. No biases, as there.
- Activations: None, ReLU, LeakyReLU (slope 0.01), Sigmoid, Tanh map to the registry.
  tiny-cuda-nn's Softplus is log(1 + exp(10 x)) / 10: the registry's softplus with beta
  10 (FusedMLP's ``softplus_beta``; as torch's nn.Softplus(10), linear above x = 2, where
  the two differ by less than 2e-10; tiny-cuda-nn's own form overflows to inf from
  x = 8.9 in fp32, this one does not). Exponential, Sine and Squareplus are not in the
  registry: ValueError naming the key.
- Input: a bare tiny-cuda-nn Network is a NetworkWithInputEncoding with an Identity
  encoding, which pads the input to a multiple of 16 with the value 1 (so the padding
  columns of the first weight act as a bias). We do the same: the first layer has
  ``padded_input_dims`` columns and the padding is filled with ones; float32 or half input.
- Output dtype: tiny-cuda-nn returns its parameter precision (half by default, float32 in
  an fp32 build), whatever the input dtype. So does this: the output has the network's
  ``dtype`` (default torch.float16; pass dtype=torch.float32 for tiny-cuda-nn's fp32 build).
- Output width: tiny-cuda-nn computes 16-padded outputs and slices them; our last layer
  has exactly ``n_output_dims`` rows (any width), and the padding rows of an imported
  checkpoint, which only fed the sliced-off outputs, are dropped (exported as zeros).
- Parameters: one flat vector, the layers back to back, each weight row-major
  [rows = outputs, cols = inputs] (nn.Linear's layout): [n_neurons, padded_input_dims],
  (n_hidden_layers - 1) x [n_neurons, n_neurons], [padded_output_dims, n_neurons].
  Encoding parameters (none for Identity/Frequency) would follow the network's.
- Initial values: xavier-uniform from ``seed``, tiny-cuda-nn's scheme but not its numbers
  (its pcg32 stream is not reproduced); load a checkpoint for its exact values.

``NetworkWithInputEncoding`` takes the Identity (``scale``, ``offset``) and Frequency
(``n_frequencies``) encodings, as cheap torch ops; any other encoding (HashGrid, Grid,
OneBlob, SphericalHarmonics, TriangleWave, Composite, ...) is a ValueError that says to
encode with a torch module of your own and feed the result to ``Network``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .module import FusedMLP

ALIGNMENT = 16  # tiny-cuda-nn's FullyFusedMLP and CutlassMLP REQUIRED_ALIGNMENT()
OTYPES = ("fullyfusedmlp", "megakernelmlp", "cutlassmlp", "mlp")
DEFAULTS = {"otype": "MLP", "n_neurons": 128, "n_hidden_layers": 5, "activation": "ReLU",
            "output_activation": "None", "feedback_alignment": False}
ACTIVATIONS = {"none": "none", "relu": "relu", "leakyrelu": "leaky_relu",
               "sigmoid": "sigmoid", "tanh": "tanh", "softplus": "softplus"}
#: tiny-cuda-nn's Softplus: log(1 + exp(K_ACT x)) / K_ACT with K_ACT = 10
SOFTPLUS_BETA = 10.0
NOT_IN_REGISTRY = {
    "exponential": "exp(x) is not in the activation registry",
    "sine": "sin(x) is not in the activation registry",
    "squareplus": "squareplus is not in the activation registry",
}


def _next_multiple(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def _positive_int(name: str, v, minimum: int = 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    return v


def _activation(key: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"network_config[{key!r}]: expected a name (str), got "
                        f"{type(value).__name__}")
    v = value.lower()
    if v in ACTIVATIONS:
        return ACTIVATIONS[v]
    if v in NOT_IN_REGISTRY:
        raise ValueError(f"network_config[{key!r}]: {value!r} is not supported: "
                         f"{NOT_IN_REGISTRY[v]}")
    raise ValueError(f"network_config[{key!r}]: unknown activation {value!r}; tiny-cuda-nn "
                     f"names supported here: None, ReLU, LeakyReLU, Sigmoid, Tanh, Softplus")


def parse_network_config(config) -> dict:
    """tiny-cuda-nn's network config -> n_neurons, n_hidden_layers, activation names and
    softplus_beta (tiny-cuda-nn's 10 where either activation is its Softplus, else 1)."""
    if not isinstance(config, dict):
        raise TypeError(f"network_config: expected a dict, got {type(config).__name__}")
    unknown = sorted(set(config) - set(DEFAULTS) - {"n_input_dims", "n_output_dims"})
    if unknown:
        raise ValueError(f"network_config: unknown key(s) {unknown}; expected some of "
                         f"{sorted(DEFAULTS)}")
    c = {**DEFAULTS, **config}
    otype = c["otype"]
    if not isinstance(otype, str) or otype.lower() not in OTYPES:
        hint = (" (encodings: use NetworkWithInputEncoding)" if otype in
                ("NetworkWithInputEncoding",) else "")
        raise ValueError(f"network_config['otype']: {otype!r} is not supported; expected one "
                         f"of FullyFusedMLP, CutlassMLP, MLP, MegakernelMLP{hint}")
    if c["feedback_alignment"]:
        raise ValueError("network_config['feedback_alignment']: true is not supported")
    acts = {"activation": _activation("activation", c["activation"]),
            "output_activation": _activation("output_activation", c["output_activation"])}
    return {"n_neurons": _positive_int("network_config['n_neurons']", c["n_neurons"]),
            "n_hidden_layers": _positive_int("network_config['n_hidden_layers']",
                                             c["n_hidden_layers"], 0),
            **acts,
            "softplus_beta": SOFTPLUS_BETA if "softplus" in acts.values() else 1.0}


class Network(nn.Module):
    """tiny-cuda-nn's ``tcnn.Network(n_input_dims, n_output_dims, network_config, seed)``
    over one FusedMLP. x: [..., n_input_dims] (float32 or half) -> [..., n_output_dims] in
    the network's dtype (tiny-cuda-nn's convention: its parameter precision)."""

    def __init__(self, n_input_dims: int, n_output_dims: int, network_config: dict,
                 seed: int = 1337, *, dtype: torch.dtype = torch.float16, device=None,
                 backend: str | None = None):
        super().__init__()
        self.n_input_dims = _positive_int("n_input_dims", n_input_dims)
        self.n_output_dims = _positive_int("n_output_dims", n_output_dims)
        _positive_int("seed", seed, 0)
        if dtype not in (torch.float16, torch.float32, torch.bfloat16):
            raise TypeError(f"dtype: expected torch.float16, float32 or bfloat16, got {dtype}")
        cfg = parse_network_config(network_config)
        self.network_config = dict(network_config)
        self.n_neurons, self.n_hidden_layers = cfg["n_neurons"], cfg["n_hidden_layers"]
        self.padded_input_dims = _next_multiple(self.n_input_dims, ALIGNMENT)
        self.padded_output_dims = _next_multiple(self.n_output_dims, ALIGNMENT)
        self.mlp = FusedMLP(self.padded_input_dims, self.n_output_dims, self.n_neurons,
                            self.n_hidden_layers, cfg["activation"], cfg["output_activation"],
                            bias=False, device=device, dtype=dtype, backend=backend,
                            softplus_beta=cfg["softplus_beta"])
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for lin in self.mlp.linears:
                fan_out, fan_in = lin.weight.shape
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                w = (torch.rand(lin.weight.shape, generator=g, dtype=torch.float32) * 2 - 1)
                lin.weight.copy_(w * bound)

    @property
    def dtype(self) -> torch.dtype:
        return self.mlp.linears[0].weight.dtype

    def n_params(self) -> int:
        """Length of tiny-cuda-nn's flat parameter vector for this network."""
        return sum(r * c for r, c in self._tcnn_shapes())

    def _tcnn_shapes(self):
        ins = [self.padded_input_dims] + [self.n_neurons] * self.n_hidden_layers
        outs = [self.n_neurons] * self.n_hidden_layers + [self.padded_output_dims]
        return list(zip(outs, ins))

    def load_tcnn_params(self, flat) -> None:
        """Import tiny-cuda-nn's flat parameter vector (its layout: module docstring)."""
        if not isinstance(flat, torch.Tensor):
            try:
                flat = torch.as_tensor(flat)
            except Exception:
                raise TypeError(f"flat: expected a tensor or array, got "
                                f"{type(flat).__name__}") from None
        if flat.dim() != 1 or not flat.is_floating_point():
            raise ValueError(f"flat: expected a 1-D floating tensor, got shape "
                             f"{tuple(flat.shape)} and dtype {flat.dtype}")
        if flat.numel() != self.n_params():
            raise ValueError(f"flat: expected {self.n_params()} parameters for this config "
                             f"(layers {self._tcnn_shapes()}, padded to {ALIGNMENT}), got "
                             f"{flat.numel()}")
        offset = 0
        with torch.no_grad():
            for lin, (rows, cols) in zip(self.mlp.linears, self._tcnn_shapes()):
                w = flat[offset:offset + rows * cols].reshape(rows, cols)
                lin.weight.copy_(w[:lin.weight.shape[0]])  # drops the output padding rows
                offset += rows * cols

    def tcnn_params(self) -> torch.Tensor:
        """This network's parameters as tiny-cuda-nn's flat vector (output padding rows 0),
        float32, on the parameters' device."""
        parts = []
        for lin, (rows, cols) in zip(self.mlp.linears, self._tcnn_shapes()):
            w = lin.weight.detach().float()
            if rows > w.shape[0]:
                w = torch.cat([w, w.new_zeros(rows - w.shape[0], cols)])
            parts.append(w.reshape(-1))
        return torch.cat(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.float16):
            raise TypeError(f"x: expected float32 or float16 input (as tiny-cuda-nn), got "
                            f"{x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.n_input_dims:
            raise ValueError(f"x: expected [..., {self.n_input_dims}], got {tuple(x.shape)}")
        return self.mlp(_pad_with_ones(x.to(self.dtype), self.padded_input_dims))

    def extra_repr(self) -> str:
        return (f"n_input_dims={self.n_input_dims} (padded {self.padded_input_dims}), "
                f"n_output_dims={self.n_output_dims}, config={self.network_config}")


def _pad_with_ones(x: torch.Tensor, width: int) -> torch.Tensor:
    """tiny-cuda-nn's encodings pad their output to the network's alignment with 1s."""
    pad = width - x.shape[-1]
    return x if pad == 0 else torch.cat([x, x.new_ones(*x.shape[:-1], pad)], -1)


def _encoding(n_input_dims: int, config) -> tuple[str, dict, int]:
    if not isinstance(config, dict):
        raise TypeError(f"encoding_config: expected a dict, got {type(config).__name__}")
    otype = str(config.get("otype", "")).lower()
    if otype == "identity":
        extra = set(config) - {"otype", "scale", "offset"}
        params = {"scale": float(config.get("scale", 1.0)),
                  "offset": float(config.get("offset", 0.0))}
        width = n_input_dims
    elif otype == "frequency":
        extra = set(config) - {"otype", "n_frequencies"}
        params = {"n_frequencies": _positive_int("encoding_config['n_frequencies']",
                                                 config.get("n_frequencies", 12))}
        width = n_input_dims * 2 * params["n_frequencies"]
    else:
        raise ValueError(
            f"encoding_config['otype']: {config.get('otype')!r} is not supported; Identity "
            "and Frequency are. For a hash grid or another encoding, encode with a torch "
            "module of your own and feed its output to fusedmlp_xpu.tcnn.Network")
    if extra:
        raise ValueError(f"encoding_config: unknown key(s) {sorted(extra)} for {otype}")
    return otype, params, width


class NetworkWithInputEncoding(nn.Module):
    """tiny-cuda-nn's ``NetworkWithInputEncoding`` for the Identity and Frequency encodings
    (torch ops, then ``Network``). x: [..., n_input_dims] -> [..., n_output_dims]."""

    def __init__(self, n_input_dims: int, n_output_dims: int, encoding_config: dict,
                 network_config: dict, seed: int = 1337, *, dtype: torch.dtype = torch.float16,
                 device=None, backend: str | None = None):
        super().__init__()
        self.n_input_dims = _positive_int("n_input_dims", n_input_dims)
        self.encoding, self.encoding_params, width = _encoding(n_input_dims, encoding_config)
        self.network = Network(width, n_output_dims, network_config, seed, dtype=dtype,
                               device=device, backend=backend)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float()  # tiny-cuda-nn encodes float32 input
        if self.encoding == "identity":
            return x * self.encoding_params["scale"] + self.encoding_params["offset"]
        # per input dim d, per frequency f: sin(2^f pi x_d), cos(2^f pi x_d), interleaved
        n = self.encoding_params["n_frequencies"]
        scales = math.pi * 2.0 ** torch.arange(n, device=x.device, dtype=x.dtype)
        z = x.unsqueeze(-1) * scales  # [..., d, n]
        return torch.stack([torch.sin(z), torch.cos(z)], -1).reshape(*x.shape[:-1], -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.n_input_dims:
            raise ValueError(f"x: expected [..., {self.n_input_dims}], got {tuple(x.shape)}")
        return self.network(self.encode(x))

    def load_tcnn_params(self, flat) -> None:
        """The network's parameters come first in tiny-cuda-nn's vector; these encodings have
        none."""
        self.network.load_tcnn_params(flat)

    def tcnn_params(self) -> torch.Tensor:
        return self.network.tcnn_params()


__all__ = ["Network", "NetworkWithInputEncoding", "parse_network_config", "ALIGNMENT"]
