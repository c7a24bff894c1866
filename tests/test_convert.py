"""The converters' rules, on torch modules alone: activations recognised by what they
compute, Sequentials with Identity / Dropout / inplace activations, the report and the
warning when nothing is swapped. Real packages' models: test_real_models.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations


class Wrapped(nn.Module):
    """A brand-new activation class around a known function."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@pytest.mark.parametrize("obj,name", [
    (Wrapped(F.silu), "silu"), (Wrapped(lambda x: x * torch.sigmoid(x)), "silu"),
    (Wrapped(lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))), "gelu"),
    (Wrapped(lambda x: F.gelu(x, approximate="tanh")), "gelu_tanh"),
    (Wrapped(lambda x: F.leaky_relu(x, 0.01)), "leaky_relu"),
    (nn.SiLU(inplace=True), "silu"), (nn.ReLU(inplace=True), "relu"), (F.silu, "silu"),
    (lambda x: torch.tanh(x), "tanh"), (nn.GELU(approximate="tanh"), "gelu_tanh"),
])
def test_recognised_by_what_it_computes(obj, name):
    a, _ = activations.recognise(obj)
    assert a is not None and a.name == name


@pytest.mark.parametrize("obj", [
    Wrapped(lambda x: F.silu(x) * 1.01), Wrapped(lambda x: F.leaky_relu(x, 0.2)),
    nn.LeakyReLU(0.2), nn.Softplus(beta=10), nn.PReLU(), nn.Hardswish(), nn.Dropout(0.5).eval(),
    Wrapped(lambda x: x.float()), "silu", nn.Linear(3, 3),
])
def test_wrong_functions_are_not_fused(obj):
    a, why = activations.recognise(obj)
    assert a is None and why


def test_new_wrapper_class_still_fuses_and_wrong_one_does_not():
    torch.manual_seed(0)
    good = nn.Sequential(nn.Linear(8, 16), Wrapped(F.silu), nn.Linear(16, 4))
    bad = nn.Sequential(nn.Linear(8, 16), Wrapped(lambda x: F.silu(x) * 1.01), nn.Linear(16, 4))
    x = torch.randn(5, 8)
    y = good(x)
    fused = fm.fuse_mlps(good)
    assert isinstance(fused, fm.FusedMLP) and fused.activation == "silu"
    torch.testing.assert_close(fused(x), y)
    with pytest.warns(UserWarning, match="nothing swapped"):
        out, rep = fm.fuse_mlps(bad, report=True)
    assert out is bad and "computes none" in rep.left[0].reason


def test_sequential_with_identity_dropout0_and_inplace():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Linear(8, 16), nn.Identity(), nn.ReLU(inplace=True), nn.Dropout(0.0),
                        nn.Linear(16, 16), nn.ReLU(inplace=True), nn.Dropout(p=0),
                        nn.Linear(16, 3), nn.Dropout(0.0))
    keys = list(seq.state_dict())
    x = torch.randn(6, 8)
    y = seq(x)
    fused, rep = fm.fuse_mlps(seq, report=True)
    assert isinstance(fused, fm.FusedMLP) and fused.widths == (8, 16, 16, 3), str(rep)
    assert list(fused.state_dict()) == keys
    torch.testing.assert_close(fused(x), y)
    assert rep.swapped[0].path == ""


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_dropout_p_positive_is_left_with_the_reason(train):
    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))
    seq.train(train)
    with pytest.warns(UserWarning, match="nothing swapped"):
        out, rep = fm.fuse_mlps(seq, report=True)
    assert out is seq and "p > 0" in rep.left[0].reason


def test_wrapped_linears_are_left_with_the_reason():
    """A parametrized (or adapter-wrapped) Linear is not what the op would read: the MLP
    stays as it is, the report says why; an MLP wrapped after fusing raises instead
    (test_gated.py)."""
    from torch.nn.utils import parametrize

    class Twice(nn.Module):
        def forward(self, w):
            return 2 * w

    seq = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    parametrize.register_parametrization(seq[2], "weight", Twice())
    with pytest.warns(UserWarning, match="nothing swapped"):
        model, report = fm.fuse_mlps(nn.Sequential(seq), report=True)
    assert model[0] is seq
    assert "module '2' is ParametrizedLinear, a wrapped or derived nn.Linear" in str(report)


def test_report_lists_every_candidate():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
            self.b = nn.Sequential(nn.Linear(4, 8), nn.Mish(), nn.Linear(8, 4))
            self.conv = nn.Sequential(nn.Conv1d(4, 4, 1), nn.ReLU())  # not a candidate

    net, rep = fm.fuse_mlps(Net(), report=True)
    assert isinstance(net.a, fm.FusedMLP) and isinstance(net.b, nn.Sequential)
    assert [(c.path, c.swapped) for c in rep.candidates] == [("a", True), ("b", False)]
    assert "Mish" in rep.left[0].reason
    text = str(rep)
    assert "swapped  a" in text and "left     b" in text
    # the old call signature still returns the model alone
    assert isinstance(fm.fuse_mlps(nn.Sequential(nn.Linear(3, 3))), fm.FusedMLP)


def test_nothing_found_warns():
    with pytest.warns(UserWarning, match="no MLP-like module found"):
        fm.fuse_mlps(nn.Conv2d(3, 3, 1))
    with pytest.warns(UserWarning, match="no MLP-like module found"):
        fm.fuse_gated_mlps(nn.Sequential(nn.Linear(3, 3)))


def test_gated_modules_are_pointed_to_fuse_gated_mlps():
    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(4, 8), nn.Linear(4, 8)
            self.down_proj, self.act_fn = nn.Linear(8, 4), nn.SiLU()

    with pytest.warns(UserWarning):
        _, rep = fm.fuse_mlps(nn.Sequential(MLP()), report=True)
    assert "fuse_gated_mlps" in rep.left[0].reason


def test_gated_mlp_with_more_than_projections_is_left():
    class Sparse(nn.Module):  # forward would use the norm: not the op's computation
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(4, 8), nn.Linear(4, 8)
            self.down_proj, self.act_fn = nn.Linear(8, 4), nn.SiLU()
            self.norm = nn.LayerNorm(8)

    with pytest.warns(UserWarning):
        out, rep = fm.fuse_gated_mlps(Sparse(), report=True)
    assert isinstance(out, Sparse) and "norm" in rep.left[0].reason


@pytest.mark.parametrize("kw,exc", [({"report": 1}, TypeError), ({"recompute": "no"}, TypeError)])
def test_bad_arguments(kw, exc):
    with pytest.raises(exc, match=next(iter(kw))):
        fm.fuse_gated_mlps(nn.Linear(2, 2), **kw)
    with pytest.raises(TypeError, match="model"):
        fm.fuse_mlps("not a module")
