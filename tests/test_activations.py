"""The registry's derivatives agree with autograd of its functions (float64)."""
import pytest
import torch

from fusedmlp_xpu import activations
from fusedmlp_xpu.backends.reference import _times_grad


@pytest.mark.parametrize("name", sorted(activations.ACTIVATIONS))
def test_derivative_matches_autograd(name):
    act = activations.get(name)
    gen = torch.Generator().manual_seed(0)  # not the global generator: what ran before
    z = (torch.randn(4096, generator=gen, dtype=torch.float64) * 4).requires_grad_()
    z.data[:3] = torch.tensor([25.0, -25.0, 0.5], dtype=torch.float64)  # softplus threshold, tails
    (g,) = torch.autograd.grad(act.fn(z).sum(), z)
    # two float64 formulas of one derivative: torch's erf/tanh kernels and ours differ by up
    # to ~1e-11 absolute (seen in CI for gelu; 1e-12 failed there), a wrong formula by O(1)
    torch.testing.assert_close(act.grad(z.detach()), g, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", sorted(activations.ACTIVATIONS))
def test_backward_is_eagers(name, dtype):
    """Activation.backward(g, z) is eager autograd's g * fn'(z) bit for bit in every dtype
    (the kernel nn.Sequential's backward runs), NaN and infinities in the same places, and
    g * grad(z) in float64 where both are finite. The reference backend's product takes it
    outside autograd and the formula where autograd records (gradcheck: differentiable)."""
    act = activations.get(name)
    gen = torch.Generator().manual_seed(1)
    z = (torch.randn(4096, generator=gen, dtype=torch.float64) * 4)
    z[:8] = torch.tensor([25.0, -25.0, 0.0, float("nan"), float("inf"), -float("inf"), 1e-30,
                          -1e-30], dtype=torch.float64)
    g = torch.randn(4096, generator=gen, dtype=torch.float64)
    g[8] = float("nan")
    z, g = z.to(dtype), g.to(dtype)
    zl = z.clone().requires_grad_()
    (want,) = torch.autograd.grad(act.fn(zl), zl, g)
    got = act.backward(g, z)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(_times_grad(g, act, z), want, rtol=0, atol=0, equal_nan=True)
    if dtype == torch.float64:
        ok = z.isfinite() & g.isfinite()
        torch.testing.assert_close(got[ok], (g * act.grad(z))[ok], rtol=1e-10, atol=1e-10)
        zz = z[9:40].clone().requires_grad_()
        gg = g[9:40].clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda a, b: _times_grad(a, act, b), (gg, zz))


def test_ids_unique_and_stable():
    ids = {a.name: a.id for a in activations.ACTIVATIONS.values()}
    assert len(set(ids.values())) == len(ids)
    assert ids["none"] == 0 and ids["relu"] == 1  # kernels hard-code nothing else


@pytest.mark.parametrize("name", sorted(activations.ACTIVATIONS))
def test_module_roundtrip(name):
    assert activations.from_module(activations.to_module(name)).name == name


def test_unknown_name():
    with pytest.raises(ValueError, match="activation: unknown name 'mish'"):
        activations.get("mish")
