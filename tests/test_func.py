"""torch.func transforms and forward-mode AD on fused_mlp, FusedMLP and GatedMLP, on every
usable backend, against the same functions written with eager torch ops.

Kernels see plain buffers, so under a transform the op computes as composite torch ops
(op.composite_forward): these tests hold that path to eager's numbers, and check that no
backend's kernel runs on a transformed tensor (which would drop a tangent or a batch
dimension without a word)."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, vmap

import fusedmlp_xpu as fm

from conftest import devices

TRANSFORMS = {
    "grad": lambda f, x: grad(lambda t: f(t).sum())(x),
    "jacrev": lambda f, x: jacrev(f)(x),
    "jacfwd": lambda f, x: jacfwd(f)(x),
    "vmap": lambda f, x: vmap(f)(x),
    "vmap-grad": lambda f, x: vmap(grad(lambda r: f(r).sum()))(x),
    "hessian": lambda f, x: hessian(lambda r: f(r).sum())(x[0]),
}


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_transforms_on_fused_mlp(backend, name):
    be, dev = backend
    torch.manual_seed(0)
    ws = [torch.randn(16, 3, device=dev) * 0.5, torch.randn(16, 16, device=dev) * 0.3,
          torch.randn(2, 16, device=dev) * 0.3]
    bs = [torch.randn(w.shape[0], device=dev) * 0.1 for w in ws]
    x = torch.randn(5, 3, device=dev)

    def fused(t):
        return fm.fused_mlp(t, ws, bs, "softplus", "tanh", backend=be)

    def eager(t):
        h = F.softplus(F.linear(t, ws[0], bs[0]))
        h = F.softplus(F.linear(h, ws[1], bs[1]))
        return torch.tanh(F.linear(h, ws[2], bs[2]))

    _close(TRANSFORMS[name](fused, x), TRANSFORMS[name](eager, x))


def test_grad_of_module_parameters(backend):
    """torch.func.grad over a FusedMLP's parameters via functional_call."""
    be, dev = backend
    m = fm.FusedMLP(3, 2, 16, 2, activation="silu", device=dev, backend=be)
    seq = m.to_sequential()
    x = torch.randn(7, 3, device=dev)

    def loss(model, params):
        return functional_call(model, params, (x,)).square().sum()

    a = grad(lambda p: loss(m, p))(dict(m.named_parameters()))
    b = grad(lambda p: loss(seq, p))(dict(seq.named_parameters()))
    assert a.keys() == b.keys()
    for k in a:
        _close(a[k], b[k])


@pytest.mark.parametrize("no_grad", [False, True], ids=["grad-mode", "no-grad"])
def test_forward_mode_ad(backend, no_grad):
    """A dual tensor through the module (its bound no-grad forward too) keeps its tangent."""
    be, dev = backend
    m = fm.FusedMLP(4, 3, 16, 2, activation="gelu", device=dev, backend=be)
    seq = m.to_sequential()
    x, t = torch.randn(6, 4, device=dev), torch.randn(6, 4, device=dev)
    with torch.set_grad_enabled(not no_grad):
        for _ in range(2):  # the second call runs a bound forward where a backend has one
            with fwAD.dual_level():
                got = fwAD.unpack_dual(m(fwAD.make_dual(x, t)))
            with fwAD.dual_level():
                want = fwAD.unpack_dual(seq(fwAD.make_dual(x, t)))
            assert got.tangent is not None
            _close(got.primal, want.primal)
            _close(got.tangent, want.tangent)


@pytest.mark.parametrize("dev", devices(), ids=str)
@pytest.mark.parametrize("name", ["grad", "jacrev", "jacfwd", "vmap"])
def test_transforms_on_gated_mlp(dev, name):
    m = fm.GatedMLP(6, 12, 4, activation="silu", bias=True, device=dev)
    x = torch.randn(5, 6, device=dev)

    def eager(t):
        return m.down_proj(F.silu(m.gate_proj(t)) * m.up_proj(t))

    _close(TRANSFORMS[name](m, x), TRANSFORMS[name](eager, x))
