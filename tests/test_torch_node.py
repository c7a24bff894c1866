"""torch_node: few-row training calls as torch's ops under one autograd node.

Values and every gradient against torch's own autograd over the same ops (float64, so
a wrong derivative cannot hide in rounding), the gradients asked for alone, the saved
tensors against eager's, and double backward."""
import pytest
import torch
import torch.nn.functional as F

from fusedmlp_xpu import activations, torch_node
from fusedmlp_xpu.spec import MLPSpec

ACTS = sorted(activations.ACTIVATIONS)
DT = torch.float64


def _params(widths, bias, seed):
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(o, i, generator=g, dtype=DT) / i ** 0.5).requires_grad_()
          for i, o in zip(widths[:-1], widths[1:])]
    bs = [torch.randn(o, generator=g, dtype=DT).requires_grad_() for o in widths[1:]] \
        if bias else None
    return ws, bs


def _eager(x, ws, bs, act, out_act):
    """What nn.Linear layers and activation modules compute, with torch's graph."""
    h = x
    for i, w in enumerate(ws):
        z = F.linear(h, w, None if bs is None else bs[i])
        h = activations.ACTIVATIONS[act if i < len(ws) - 1 else out_act].fn(z)
    return h


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("out_act", ["none", "sigmoid", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(7,), (2, 3)])
def test_mlp_node_matches_torch_autograd(act, out_act, bias, lead):
    widths = (5, 9, 6, 4)
    ws, bs = _params(widths, bias, hash((act, out_act, bias, lead)) % 1000)
    x = torch.randn(*lead, widths[0], dtype=DT, requires_grad=True)
    spec = MLPSpec(widths, act, out_act, bias, DT)
    y = torch_node.mlp(x, ws, bs, spec)
    assert type(y.grad_fn).__name__ == "_MLPNodeBackward"
    ref = _eager(x, ws, bs, act, out_act)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    inputs = [x, *ws, *(bs or ())]
    got = torch.autograd.grad(y, inputs, gy)
    want = torch.autograd.grad(ref, inputs, gy)
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"input {i}")


@pytest.mark.parametrize("which", ["x", "w0", "w2", "b1", "b2"])
def test_mlp_node_gradients_asked_alone(which):
    """Only the asked input needs a gradient: it is right, and nothing else is made."""
    widths = (4, 8, 8, 3)
    ws, bs = _params(widths, True, 3)
    for t in ws + bs:
        t.requires_grad_(False)
    x = torch.randn(6, 4, dtype=DT)
    target = {"x": x, "w0": ws[0], "w2": ws[2], "b1": bs[1], "b2": bs[2]}[which]
    target.requires_grad_(True)
    spec = MLPSpec(widths, "gelu_tanh", "none", True, DT)
    gy = torch.randn(6, 3, dtype=DT)
    got, = torch.autograd.grad(torch_node.mlp(x, ws, bs, spec), [target], gy)
    want, = torch.autograd.grad(_eager(x, ws, bs, "gelu_tanh", "none"), [target], gy)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _saved_bytes(fn, inputs):
    """Bytes of the distinct storages, besides the inputs', that the autograd graph of
    fn() keeps for backward: the memory a training step holds until then."""
    seen, own = {}, {t.untyped_storage().data_ptr() for t in inputs}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            seen[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn()
    return y, sum(seen.values())


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "tanh"])
def test_mlp_node_saves_what_eager_saves(act):
    widths = (16, 64, 64, 16)
    ws, bs = _params(widths, True, 5)
    x = torch.randn(32, 16, dtype=DT, requires_grad=True)
    spec = MLPSpec(widths, act, "none", True, DT)
    _, ours = _saved_bytes(lambda: torch_node.mlp(x, ws, bs, spec), [x, *ws, *bs])
    _, eager = _saved_bytes(lambda: _eager(x, ws, bs, act, "none"), [x, *ws, *bs])
    assert 0 < ours <= eager, (ours, eager)


def test_mlp_node_double_backward():
    widths = (3, 5, 2)
    ws, bs = _params(widths, True, 7)
    x = torch.randn(4, 3, dtype=DT, requires_grad=True)
    spec = MLPSpec(widths, "gelu", "tanh", True, DT)
    assert torch.autograd.gradgradcheck(lambda x, *p: torch_node.mlp(x, p[:2], p[2:], spec),
                                        (x, *ws, *bs))


def _gated_eager(x, wg, wu, wd, biases, act):
    bg, bu, bd = biases or (None, None, None)
    return F.linear(activations.ACTIVATIONS[act].fn(F.linear(x, wg, bg)) * F.linear(x, wu, bu),
                    wd, bd)


def _gated_params(d, hidden, out, bias, seed):
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.randn(o, i, generator=g, dtype=DT) / i ** 0.5).requires_grad_()
          for o, i in ((hidden, d), (hidden, d), (out, hidden))]
    bs = [torch.randn(n, generator=g, dtype=DT).requires_grad_() for n in (hidden, hidden, out)] \
        if bias else None
    return ws, bs


@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(5,), (2, 3)])
def test_gated_node_matches_torch_autograd(act, bias, lead):
    ws, bs = _gated_params(6, 10, 4, bias, 11)
    x = torch.randn(*lead, 6, dtype=DT, requires_grad=True)
    y = torch_node.gated(x, *ws, bs, act)
    assert type(y.grad_fn).__name__ == "_GatedNodeBackward"
    ref = _gated_eager(x, *ws, bs, act)
    torch.testing.assert_close(y, ref, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    inputs = [x, *ws, *(bs or ())]
    for i, (a, b) in enumerate(zip(torch.autograd.grad(y, inputs, gy),
                                   torch.autograd.grad(ref, inputs, gy))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"input {i}")


@pytest.mark.parametrize("which", range(7))
def test_gated_node_gradients_asked_alone(which):
    ws, bs = _gated_params(6, 10, 4, True, 13)
    x = torch.randn(5, 6, dtype=DT)
    inputs = [x, *ws, *bs]
    for t in inputs:
        t.requires_grad_(False)
    inputs[which].requires_grad_(True)
    gy = torch.randn(5, 4, dtype=DT)
    got, = torch.autograd.grad(torch_node.gated(x, *ws, bs, "silu"), [inputs[which]], gy)
    want, = torch.autograd.grad(_gated_eager(x, *ws, bs, "silu"), [inputs[which]], gy)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_gated_node_saves_what_eager_saves_and_double_backward():
    ws, bs = _gated_params(8, 24, 8, True, 17)
    x = torch.randn(16, 8, dtype=DT, requires_grad=True)
    _, ours = _saved_bytes(lambda: torch_node.gated(x, *ws, bs, "silu"), [x, *ws, *bs])
    _, eager = _saved_bytes(lambda: _gated_eager(x, *ws, bs, "silu"), [x, *ws, *bs])
    assert 0 < ours <= eager, (ours, eager)
    ws, bs = _gated_params(3, 4, 2, True, 19)
    x = torch.randn(3, 3, dtype=DT, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda x, *p: torch_node.gated(x, *p[:3], p[3:], "gelu_tanh"), (x, *ws, *bs))
