"""The host side of the sycl backend's ESIMD path (fusedmlp_xpu/backends/sycl_esimd.py):
the packed weights kept between calls (and packed again once an optimizer moved them: a
stale pack would be a silent wrong answer), and the weight-gradient partials reduced on
the device in one sum."""
from __future__ import annotations

import importlib

import pytest
import torch

import fusedmlp_xpu as fm
from conftest import BACKENDS, TOLERANCE, rel_error

esimd = importlib.import_module("fusedmlp_xpu.backends.sycl_esimd")

needs_sycl_cpu = pytest.mark.skipif(
    ("sycl", torch.device("cpu")) not in BACKENDS,
    reason="the sycl backend cannot run on opencl:cpu here (see `fusedmlp info`)")
CFG = esimd.EsimdConfig(torch.float16, 16, 32, 16)


@pytest.fixture
def counted_packs(monkeypatch):
    """The packers, counting their calls; the cache empty."""
    esimd.clear_packs()
    calls = {"fwd": 0, "bwd": 0}

    def counting(kind, real):
        def pack(weights, cfg):
            calls[kind] += 1
            return real(weights, cfg)
        return pack

    monkeypatch.setattr(esimd, "_PACKERS", {k: counting(k, f) for k, f in esimd._PACKERS.items()})
    yield calls
    esimd.clear_packs()


def _weights(requires_grad=False):
    g = torch.Generator().manual_seed(3)
    return [torch.randn(o, i, generator=g).half().requires_grad_(requires_grad)
            for o, i in ((32, 16), (32, 32), (16, 32))]


@pytest.mark.parametrize("kind,pack", [("fwd", esimd.pack_forward), ("bwd", esimd.pack_backward)])
def test_pack_is_kept_while_the_weights_are_unchanged(counted_packs, kind, pack):
    ws = _weights()
    first = esimd.packed(kind, ws, CFG)
    assert esimd.packed(kind, ws, CFG) is first
    assert counted_packs[kind] == 1
    assert torch.equal(first, pack(ws, CFG))


def test_pack_is_made_again_after_an_in_place_update(counted_packs):
    ws = _weights()
    old = esimd.packed("fwd", ws, CFG).clone()
    with torch.no_grad():
        ws[1].mul_(-2)  # what an optimizer does: in place, the same tensor and address
    new = esimd.packed("fwd", ws, CFG)
    assert counted_packs["fwd"] == 2
    assert torch.equal(new, esimd.pack_forward(ws, CFG)) and not torch.equal(new, old)


def test_a_new_tensor_at_a_freed_address_is_not_the_old_pack(counted_packs, monkeypatch):
    """Autocast's casts are new tensors every call; the allocator may give a new one the
    address of the last, at version 0 again: the weak reference tells them apart."""
    monkeypatch.setattr(esimd, "_identity", lambda ws: ("one address, version 0",))
    esimd.packed("fwd", _weights(), CFG)  # those weights are freed here
    ws = [w * 2 for w in _weights()]
    new = esimd.packed("fwd", ws, CFG)
    assert counted_packs["fwd"] == 2 and torch.equal(new, esimd.pack_forward(ws, CFG))


def test_inference_tensors_pack_every_call(counted_packs):
    with torch.inference_mode():
        ws = _weights()
    esimd.packed("fwd", ws, CFG)
    esimd.packed("fwd", ws, CFG)
    assert counted_packs["fwd"] == 2 and not esimd._packs


def test_the_cache_is_bounded(counted_packs):
    nets = [_weights() for _ in range(esimd.PACK_CACHE_SIZE + 3)]
    for ws in nets:
        esimd.packed("fwd", ws, CFG)
    assert len(esimd._packs) == esimd.PACK_CACHE_SIZE


# --- training with an optimizer, through the emulated kernels, against float64 --------------
OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.5, foreach=False),
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=0.05, foreach=True),
    "adamw-fused": lambda p: torch.optim.AdamW(p, lr=0.05, fused=True),
}


@needs_sycl_cpu
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_training_steps_never_run_a_stale_pack(counted_packs, opt):
    """Steps of an optimizer on a FusedMLP through the ESIMD path: after each step the
    forward and every gradient match float64 of the weights as they are now. A pack kept
    past optimizer.step() would compute with the old weights (the steps move them far
    past the tolerance, checked)."""
    dtype = torch.bfloat16  # Adam's eps (1e-8) is 0 in float16
    torch.manual_seed(11)
    mlp = fm.FusedMLP(16, 8, 32, 2, "tanh", bias=True, dtype=dtype, backend="sycl")
    optim = OPTIMIZERS[opt](mlp.parameters())
    x = torch.randn(77, 16).to(dtype)
    target = torch.randn(77, 8).to(dtype)
    ref = fm.FusedMLP(16, 8, 32, 2, "tanh", bias=True, dtype=torch.float64, backend="reference")
    before = None
    for step in range(3):
        y = mlp(x)
        loss = ((y.float() - target.float()) ** 2).mean()
        optim.zero_grad()
        loss.backward()
        with torch.no_grad():
            for r, p in zip(ref.parameters(), mlp.parameters()):
                r.copy_(p.double())
        ref.zero_grad()
        yr = ref(x.double())
        ((yr - target.double()) ** 2).mean().backward()
        assert rel_error(y, yr) < TOLERANCE[dtype], f"step {step}: forward"
        for i, (p, r) in enumerate(zip(mlp.parameters(), ref.parameters())):
            assert rel_error(p.grad, r.grad) < 4 * TOLERANCE[dtype], f"step {step}: grad {i}"
        if before is not None:  # the step moved the outputs well past the tolerance
            assert rel_error(yr, before) > 10 * TOLERANCE[dtype]
        before = yr.detach()
        optim.step()
    assert counted_packs["fwd"] == 3 and counted_packs["bwd"] == 3
    with torch.no_grad():  # unchanged weights: the forward's pack is reused
        mlp(x)
        mlp(x)
    assert counted_packs["fwd"] == 4


# --- the weight-gradient partials ---------------------------------------------------------------
def test_partials_reduce_in_one_sum_on_the_device():
    """Every layer's chunk partials in one buffer, padded to the widest layer, reduced by
    one sum (not one a layer), each layer's real widths cut out in the operand dtype; a
    bias partial's 16 columns are each the chunk's sum (dz^T times ones), column 0 read."""
    from torch.utils._python_dispatch import TorchDispatchMode

    spec = fm.MLPSpec((3, 40, 40, 40, 5), "relu", "none", True, torch.bfloat16)
    L, groups = spec.n_layers, 7
    pw = torch.randn(L, groups, 64, 64)
    pb = torch.randn(L, groups, 64, 16)

    class Sums(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Sums.n += func.overloadpacket is torch.ops.aten.sum
            return func(*args, **(kwargs or {}))

    with Sums():
        gw, gb = esimd.reduce_partials((pw, pb), spec, torch.bfloat16, True, True)
    assert Sums.n == 2  # one for the weights of every layer, one for the biases
    w = spec.widths
    for l in range(L):
        assert gw[l].shape == (w[l + 1], w[l]) and gw[l].dtype == torch.bfloat16
        assert torch.equal(gw[l], pw[l].sum(0)[: w[l + 1], : w[l]].bfloat16())
        assert torch.equal(gb[l], pb[l, :, :, 0].sum(0)[: w[l + 1]].bfloat16())
    assert esimd.reduce_partials((pw, None), spec, torch.bfloat16, True, False)[1] == []
