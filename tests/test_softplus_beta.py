"""softplus_beta: softplus as nn.Softplus(beta) (NeuS-style SDFs use beta = 100), on every
backend, first and second order, against float64 eager torch; the Sequential round trip
and the converter; bad values refused by name."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusedmlp_xpu as fm

from conftest import GRAD_VS_EAGER, assert_close, is_slow, tolerance

BETA = 100.0


def _eager(x, ws, bs, act, out_act, beta):
    def f(h, a):
        return {"softplus": lambda t: F.softplus(t, beta), "relu": torch.relu,
                "tanh": torch.tanh, "none": lambda t: t}[a](h)
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = f(F.linear(h, w, b), out_act if i == len(ws) - 1 else act)
    return h


def _params(widths, dtype, device, seed):
    g = torch.Generator().manual_seed(seed)
    ws = [(torch.rand(b, a, generator=g, dtype=torch.float64) * 2 - 1) * a ** -0.5
          for a, b in zip(widths[:-1], widths[1:])]
    bs = [(torch.rand(b, generator=g, dtype=torch.float64) * 2 - 1) * 0.1 for b in widths[1:]]
    return ([w.to(device, dtype).requires_grad_() for w in ws],
            [b.to(device, dtype).requires_grad_() for b in bs])


@pytest.mark.parametrize("acts", [("softplus", "none"), ("softplus", "softplus"),
                                  ("relu", "softplus"), ("softplus", "tanh")], ids=str)
def test_softplus_beta_matches_eager_on_every_backend(backend, acts):
    name, dev = backend
    act, out_act = acts
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    widths = (16, 32, 32, 32, 4) if is_slow(name, dev) else (32, 64, 64, 64, 16)
    spec = fm.MLPSpec(widths, act, out_act, True, dtype)
    if not fm.dispatch.REGISTRY[name].supports(spec, dev)[0]:
        pytest.skip(f"{name} does not take {spec}")
    ws, bs = _params(widths, dtype, dev, 0)
    x = (torch.rand(37, widths[0], generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64) * 0.2 - 0.1).to(dev, dtype).requires_grad_()
    y = fm.fused_mlp(x, ws, bs, act, out_act, backend=name, softplus_beta=BETA)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2),
                     dtype=torch.float64).to(dev, dtype)
    y.backward(gy)
    up = [t.detach().cpu().double().requires_grad_() for t in [x, *ws, *bs]]
    n = len(ws)
    ref = _eager(up[0], up[1:1 + n], up[1 + n:], act, out_act, BETA)
    want = torch.autograd.grad(ref, up, gy.cpu().double())
    tol = tolerance(name, dtype)
    assert_close(y, ref.detach(), tol)
    # half precision (GPU): gradients within GRAD_VS_EAGER x the dtype's tolerance (the
    # suite's eager_errors knows the registry's beta-1 softplus only)
    bound = tol if dtype == torch.float32 else GRAD_VS_EAGER * tol
    for i, (t, w) in enumerate(zip([x, *ws, *bs], want)):
        assert_close(t.grad, w, bound, f"gradient {i}")


@pytest.mark.parametrize("backend", [None, "reference"], ids=["unforced", "node"])
def test_softplus_beta_second_derivatives(backend):
    """gradgradcheck in float64 through the op with beta (the rescaling and the op's
    differentiable backward: the reference forced; unforced, a CPU training call records
    torch's own graph), and an eikonal-style gradient against eager's."""
    torch.manual_seed(0)
    widths = (3, 8, 8, 2)
    ws, bs = _params(widths, torch.float64, torch.device("cpu"), 3)
    x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)

    def f(x, *p):
        return fm.fused_mlp(x, p[:3], p[3:], "softplus", softplus_beta=BETA, backend=backend)
    assert torch.autograd.gradgradcheck(f, (x, *ws, *bs))
    y = f(x, *ws, *bs)
    (g,) = torch.autograd.grad(y[:, 0].sum(), x, create_graph=True)
    (g.norm(dim=-1) - 1).pow(2).sum().backward()
    got = [t.grad.clone() for t in ws]
    for t in [x, *ws, *bs]:
        t.grad = None
    ye = _eager(x, ws, bs, "softplus", "none", BETA)
    (ge,) = torch.autograd.grad(ye[:, 0].sum(), x, create_graph=True)
    (ge.norm(dim=-1) - 1).pow(2).sum().backward()
    for a, w in zip(got, ws):
        torch.testing.assert_close(a, w.grad)


def test_sequential_round_trip_and_converter():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 16), nn.Softplus(beta=BETA), nn.Linear(16, 16),
                        nn.Softplus(beta=BETA), nn.Linear(16, 4))
    x = torch.randn(6, 8)
    m = fm.FusedMLP.from_sequential(seq)
    assert m.activation == "softplus" and m.softplus_beta == BETA
    assert "softplus_beta=100" in repr(m)
    torch.testing.assert_close(m(x), seq(x))
    back = m.to_sequential()
    assert isinstance(back[1], nn.Softplus) and back[1].beta == BETA
    torch.testing.assert_close(back(x), seq(x))
    assert list(back.state_dict()) == list(seq.state_dict())
    model = nn.Sequential(nn.Sequential(*[type(mod)(**({"beta": BETA} if isinstance(
        mod, nn.Softplus) else {"in_features": mod.in_features,
                                "out_features": mod.out_features}))
        for mod in seq]))
    model[0].load_state_dict(seq.state_dict())
    out, report = fm.fuse_mlps(model, report=True)
    assert isinstance(out[0], fm.FusedMLP) and out[0].softplus_beta == BETA, str(report)
    torch.testing.assert_close(out(x), seq(x))
    mixed = nn.Sequential(nn.Linear(8, 16), nn.Softplus(beta=BETA), nn.Linear(16, 16),
                          nn.Softplus(beta=2.0), nn.Linear(16, 4))
    with pytest.raises(ValueError, match="different betas"):
        fm.FusedMLP.from_sequential(mixed)


@pytest.mark.parametrize("beta", [0, -1.0, float("nan"), float("inf"), True, "100"])
def test_bad_softplus_beta_is_refused_by_name(beta):
    ws = [torch.randn(4, 3), torch.randn(2, 4)]
    with pytest.raises(ValueError, match="softplus_beta: expected a positive finite"):
        fm.fused_mlp(torch.randn(5, 3), ws, None, "softplus", softplus_beta=beta)
    with pytest.raises(ValueError, match="softplus_beta"):
        fm.FusedMLP(3, 2, 4, 1, activation="softplus", softplus_beta=beta)


def test_softplus_beta_without_softplus_is_refused():
    ws = [torch.randn(4, 3), torch.randn(2, 4)]
    with pytest.raises(ValueError, match="softplus_beta: 100.0 given, but neither"):
        fm.fused_mlp(torch.randn(5, 3), ws, None, "relu", softplus_beta=100.0)
    fm.fused_mlp(torch.randn(5, 3), ws, None, "relu", softplus_beta=1.0)  # the default
