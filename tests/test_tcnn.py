"""fusedmlp_xpu.tcnn: tiny-cuda-nn's config dicts and flat parameter layout over FusedMLP."""
from __future__ import annotations

import pytest
import torch

from fusedmlp_xpu import tcnn

CONFIG = {"otype": "FullyFusedMLP", "activation": "ReLU", "output_activation": "None",
          "n_neurons": 32, "n_hidden_layers": 2}


def reference(flat, x, n_in, n_out, width, hidden_layers, act, out_act):
    """tiny-cuda-nn's forward written from its layout, in float64: pad the input with 1s to
    a multiple of 16, row-major [out, in] layers back to back, slice the padded output."""
    pin, pout = -(-n_in // 16) * 16, -(-n_out // 16) * 16
    h = torch.cat([x.double(), torch.ones(x.shape[0], pin - n_in, dtype=torch.float64)], 1)
    shapes = [(width, pin)] + [(width, width)] * (hidden_layers - 1) + [(pout, width)]
    flat, off = flat.double(), 0
    for i, (r, c) in enumerate(shapes):
        h = h @ flat[off:off + r * c].reshape(r, c).T
        off += r * c
        h = act(h) if i < len(shapes) - 1 else out_act(h)
    assert off == flat.numel()
    return h[:, :n_out]


@pytest.mark.parametrize("n_in,n_out", [(3, 1), (16, 16), (5, 20)])
@pytest.mark.parametrize("otype", ["FullyFusedMLP", "CutlassMLP"])
def test_load_tcnn_params_matches_tcnn_layout(n_in, n_out, otype):
    cfg = {**CONFIG, "otype": otype, "activation": "Tanh", "output_activation": "Sigmoid"}
    net = tcnn.Network(n_in, n_out, cfg, dtype=torch.float32)
    flat = torch.randn(net.n_params(), generator=torch.Generator().manual_seed(0)) * 0.3
    net.load_tcnn_params(flat)
    x = torch.rand(37, n_in)
    y = net(x)
    assert y.shape == (37, n_out) and y.dtype == torch.float32
    ref = reference(flat, x, n_in, n_out, 32, 2, torch.tanh, torch.sigmoid)
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_round_trip():
    net = tcnn.Network(3, 4, CONFIG, dtype=torch.float32)
    flat = torch.randn(net.n_params())
    pout = 16
    flat[-(pout - 4) * 32:] = 0  # the output padding rows tiny-cuda-nn slices away
    net.load_tcnn_params(flat)
    torch.testing.assert_close(net.tcnn_params(), flat, rtol=0, atol=0)
    other = tcnn.Network(3, 4, CONFIG, seed=7, dtype=torch.float32)
    other.load_tcnn_params(net.tcnn_params().numpy())  # numpy arrays too
    x = torch.randn(9, 3)
    torch.testing.assert_close(other(x), net(x), rtol=0, atol=0)


def test_n_params_is_tcnns_count():
    net = tcnn.Network(3, 1, CONFIG)
    assert net.n_params() == 32 * 16 + 32 * 32 + 16 * 32
    assert tcnn.Network(3, 1, {**CONFIG, "n_hidden_layers": 1}).n_params() == 32 * 16 + 16 * 32


def test_half_output_by_default_and_both_input_dtypes():
    net = tcnn.Network(3, 2, CONFIG)  # tiny-cuda-nn's default precision: half
    for dt in (torch.float32, torch.float16):
        y = net(torch.rand(8, 3, dtype=dt))
        assert y.dtype == torch.float16 and y.shape == (8, 2)
    with pytest.raises(TypeError, match="x"):
        net(torch.rand(8, 3, dtype=torch.float64))


def test_training_gradients_reach_every_layer():
    net = tcnn.Network(2, 3, {**CONFIG, "activation": "LeakyReLU"}, dtype=torch.float32)
    x = torch.rand(11, 2, requires_grad=True)
    net(x).square().sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in net.parameters())


def test_seed_is_deterministic():
    a, b = tcnn.Network(3, 1, CONFIG, seed=1), tcnn.Network(3, 1, CONFIG, seed=1)
    assert torch.equal(a.tcnn_params(), b.tcnn_params())
    assert not torch.equal(a.tcnn_params(), tcnn.Network(3, 1, CONFIG, seed=2).tcnn_params())


def test_defaults_are_tcnns():
    net = tcnn.Network(3, 1, {"otype": "MLP"})
    assert (net.n_neurons, net.n_hidden_layers) == (128, 5)
    assert net.mlp.activation == "relu" and net.mlp.output_activation == "none"


def _tcnn_softplus(z):
    """tiny-cuda-nn's Softplus as its source writes it: log(1 + exp(10 z)) / 10 (float64:
    no overflow at the values these tests reach)."""
    return torch.log(1 + torch.exp(10 * z)) / 10


@pytest.mark.parametrize("act,out_act", [("Softplus", "None"), ("ReLU", "Softplus"),
                                         ("Softplus", "Softplus")])
def test_softplus_is_tcnns(act, out_act):
    """tiny-cuda-nn's Softplus (K_ACT 10) as either activation: y and every gradient of a
    loaded checkpoint against its formula in float64 (not torch's softplus)."""
    cfg = {**CONFIG, "activation": act, "output_activation": out_act}
    net = tcnn.Network(5, 3, cfg, dtype=torch.float32)
    assert net.mlp.softplus_beta == tcnn.SOFTPLUS_BETA
    gen = torch.Generator().manual_seed(4)
    flat = torch.randn(net.n_params(), generator=gen) * 0.3
    net.load_tcnn_params(flat)
    x = torch.randn(33, 5, generator=gen)
    acts = {"Softplus": _tcnn_softplus, "ReLU": torch.relu, "None": lambda h: h}
    f64 = flat.double().requires_grad_()
    want = reference(f64, x, 5, 3, 32, 2, acts[act], acts[out_act])
    y = net(x)
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-6)
    gy = torch.randn(y.shape, generator=gen)
    y.backward(gy)
    (want * gy.double()).sum().backward()
    got = torch.cat([w.grad.reshape(-1) for w in net.mlp.weights()])
    # the reference's last layer has 16 padded rows; ours only the 3 real ones
    want_g, off, parts = f64.grad, 0, []
    for (r, c), w in zip(net._tcnn_shapes(), net.mlp.weights()):
        parts.append(want_g[off:off + r * c].reshape(r, c)[:w.shape[0]].reshape(-1))
        off += r * c
    torch.testing.assert_close(got.double(), torch.cat(parts), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("cfg,exc,match", [
    ({**CONFIG, "activation": "Sine"}, ValueError, "activation"),
    ({**CONFIG, "activation": "Exponential"}, ValueError, "activation"),
    ({**CONFIG, "activation": "Squareplus"}, ValueError, "activation"),
    ({**CONFIG, "activation": "Swish"}, ValueError, "activation"),
    ({**CONFIG, "otype": "CutlassResNet"}, ValueError, "otype"),
    ({**CONFIG, "n_neurons": 0}, ValueError, "n_neurons"),
    ({**CONFIG, "n_hidden_layer": 2}, ValueError, "n_hidden_layer"),
    ({**CONFIG, "feedback_alignment": True}, ValueError, "feedback_alignment"),
    ("FullyFusedMLP", TypeError, "network_config"),
])
def test_bad_configs_name_the_key(cfg, exc, match):
    with pytest.raises(exc, match=match):
        tcnn.Network(3, 1, cfg)


def test_bad_arguments():
    net = tcnn.Network(3, 1, CONFIG)
    with pytest.raises(ValueError, match="n_input_dims"):
        tcnn.Network(0, 1, CONFIG)
    with pytest.raises(ValueError, match="flat: expected 2048"):
        net.load_tcnn_params(torch.zeros(10))
    with pytest.raises(ValueError, match="x: expected"):
        net(torch.rand(4, 5))


def test_frequency_encoding_is_tcnns_layout():
    enc = {"otype": "Frequency", "n_frequencies": 3}
    net = tcnn.NetworkWithInputEncoding(2, 1, enc, CONFIG, dtype=torch.float32)
    x = torch.rand(5, 2)
    e = net.encode(x)
    assert e.shape == (5, 12)
    # dim d, frequency f, sin then cos: sin(2^f pi x_d) at column d*2n + 2f
    torch.testing.assert_close(e[:, 1 * 6 + 2 * 2], torch.sin(4 * torch.pi * x[:, 1]))
    torch.testing.assert_close(e[:, 0 * 6 + 2 * 1 + 1], torch.cos(2 * torch.pi * x[:, 0]))
    assert net(x).shape == (5, 1) and net.network.padded_input_dims == 16
    ident = tcnn.NetworkWithInputEncoding(3, 1, {"otype": "Identity", "scale": 2.0}, CONFIG)
    assert ident(torch.rand(4, 3)).shape == (4, 1)


def test_other_encodings_say_what_to_use():
    with pytest.raises(ValueError, match="HashGrid.*torch module of your own"):
        tcnn.NetworkWithInputEncoding(3, 1, {"otype": "HashGrid"}, CONFIG)
