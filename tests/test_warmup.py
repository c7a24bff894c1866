"""fm.warmup: compiles ahead by calling each fused module once per row count (no-grad, and
with a backward when training), changing no parameter, gradient or random state, and
refusing bad arguments by name."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import fusedmlp_xpu as fm


def test_warmup_calls_every_fused_module_and_changes_nothing(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(fm.FusedMLP(8, 4, 16, 2), nn.Tanh(), fm.GatedMLP(4, 12))
    seen = []
    for mod in fm.warmup.__globals__["fused_modules"](model):
        real = type(mod).forward
        monkeypatch.setattr(mod, "forward", lambda x, mod=mod, real=real: (
            seen.append((type(mod).__name__, tuple(x.shape), x.requires_grad)),
            real(mod, x))[1])
    before = [p.detach().clone() for p in model.parameters()]
    state = torch.get_rng_state()
    took = fm.warmup(model, [3, 5])
    assert took >= 0
    assert torch.equal(torch.get_rng_state(), state)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    want = []
    for name, d in (("FusedMLP", 8), ("GatedMLP", 4)):
        for n in (3, 5):
            want += [(name, (n, d), False), (name, (n, d), True)]  # training: forward + grad
    assert seen == want
    seen.clear()
    model.eval()
    fm.warmup(model, 7)
    assert [s[2] for s in seen] == [False, False]  # eval: no-grad calls only
    seen.clear()
    fm.warmup(model, 2, train=True)
    assert len(seen) == 4
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under the model's own autocast
        fm.warmup(model, 2, train=False)
    assert len(seen) == 2


@pytest.mark.parametrize("kw, err, match", [
    (dict(model=nn.Linear(2, 2), rows=4), ValueError, "model: holds no FusedMLP"),
    (dict(model="net", rows=4), TypeError, "model: expected an nn.Module"),
    (dict(model=fm.FusedMLP(4, 4, 8, 2), rows=0), ValueError, "rows: expected a positive"),
    (dict(model=fm.FusedMLP(4, 4, 8, 2), rows=[]), ValueError, "rows: expected a positive"),
    (dict(model=fm.FusedMLP(4, 4, 8, 2), rows=[2, True]), ValueError, "rows:"),
])
def test_warmup_refuses_bad_arguments_by_name(kw, err, match):
    with pytest.raises(err, match=match):
        fm.warmup(**kw)
