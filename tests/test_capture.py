"""Whole training steps captured: torch.compile(mode="reduce-overhead") of forward, loss,
backward and the optimizer step, and a plain CUDA-graph capture with a capturable Adam.
Each trains from the same weights as the same step run eagerly and must give the same
losses, with no recompile after warm-up. (CPU: the compiled step in default mode.)"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fusedmlp_xpu as fm

CUDA = torch.cuda.is_available()
STEPS = 12


def _model(kind, device):
    torch.manual_seed(0)
    if kind == "narrow":
        return fm.FusedMLP(32, 4, 64, 3, activation="silu", device=device)
    return nn.Sequential(fm.GatedMLP(64, 192, device=device), nn.Tanh(),
                         nn.Linear(64, 4, device=device))


def _data(device, steps, rows=512, d=32):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, d, generator=g).to(device),
             torch.randn(rows, 4, generator=g).to(device)) for _ in range(steps)]


def _opt(model, device, capturable=False):
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.Adam(model.parameters(), lr=1e-2, capturable=capturable, **kw)


def _step(model, opt):
    def step(x, t):
        # None, not zeros: under reduce-overhead the backward's CUDA-graph outputs become
        # the .grad buffers, and grads kept into the next step are found overwritten (for
        # nn.Linear models too: PyTorch issue 169545); a plain capture allocates them in
        # its own pool
        opt.zero_grad(set_to_none=True)
        loss = ((model(x) - t) ** 2).mean()
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def _eager_losses(model, device, data):
    step = _step(model, _opt(model, device))
    return torch.stack([step(x, t) for x, t in data]).cpu()


def _inputs(kind, device):
    d = 32 if kind == "narrow" else 64
    return _data(device, STEPS, d=d)


@pytest.mark.parametrize("kind", ["narrow", "gated"])
def test_compiled_whole_step_trains_as_eager(kind):
    device = torch.device("cuda" if CUDA else "cpu")
    mode = "reduce-overhead" if CUDA else "default"
    data = _inputs(kind, device)
    base = _model(kind, device)
    want = _eager_losses(copy.deepcopy(base), device, data)
    model = copy.deepcopy(base)
    opt = _opt(model, device, capturable=CUDA)
    torch._dynamo.reset()
    compiled = torch.compile(_step(model, opt), mode=mode)

    def step(x, t):
        # a new iteration: CUDA-graph trees may reuse the last one's output memory (what
        # torch's docs ask of a training loop under reduce-overhead)
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(x, t).clone()

    got = [step(x, t) for x, t in data[:3]]
    with torch._dynamo.config.patch(error_on_recompile=True):  # warmed up: none from here
        got += [step(x, t) for x, t in data[3:]]
    got = torch.stack(got).cpu()
    torch.testing.assert_close(got, want, rtol=2e-3, atol=1e-5)
    assert got[-1] < got[0]  # it trains


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["narrow", "gated"])
def test_cuda_graph_of_a_whole_step_with_capturable_adam(kind):
    if not CUDA:
        pytest.skip("CUDA graphs need a CUDA device")
    device = torch.device("cuda")
    data = _inputs(kind, device)
    base = _model(kind, device)
    want = _eager_losses(copy.deepcopy(base), device, data)
    model = copy.deepcopy(base)
    opt = _opt(model, device, capturable=True)
    step = _step(model, opt)
    static_x, static_t = (t.clone() for t in data[0])
    # warm-up on a side stream (compiles, tunes, creates Adam's state) on the first batch,
    # then back to the initial weights and a fresh state: the replays below start where
    # the eager run started
    snapshot = copy.deepcopy(model.state_dict())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(static_x, static_t)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(static_x, static_t)
    with torch.no_grad():
        model.load_state_dict(snapshot)
        for st in opt.state.values():
            for v in st.values():
                v.zero_()
    got = []
    for x, t in data:
        static_x.copy_(x)
        static_t.copy_(t)
        graph.replay()
        got.append(static_loss.clone())
    got = torch.stack(got).cpu()
    torch.testing.assert_close(got, want, rtol=2e-3, atol=1e-5)
