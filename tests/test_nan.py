"""NaN and Inf propagate as in eager torch, on every backend and kernel family: a diverging
training run must show NaN, as it does in eager (relu(NaN) is NaN, not 0; softplus(NaN)
is NaN, not 20). Non-finite values planted in x and in a weight; forward and backward;
the non-finite pattern of every output and gradient compared with eager's, element by
element."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations

from conftest import (BACKENDS, INFERENCE_BACKENDS, SECOND_ORDER_VARIANTS, devices, is_slow,
                      make_params, use_second_order_variant)

ACTS = sorted(activations.ACTIVATIONS)
# narrow: one fused kernel; wide: the GEMM-with-epilogue kernels (GPU only: 256 columns
# are past the interpreter's budget on the CPU)
SHAPES = {"narrow": (32, 64, 64, 16), "wide": (256, 512, 256)}


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    """Correctness, not speed: the first config of each wide tuning list, no timing runs
    on a GPU (each new shape would otherwise autotune)."""
    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")


def _eager(x, ws, bs, act, out_act):
    h = x
    for i, w in enumerate(ws):
        h = F.linear(h, w, None if bs is None else bs[i])
        a = out_act if i == len(ws) - 1 else act
        h = activations.get(a).fn(h)
    return h


def _same_pattern(got, want, what):
    assert torch.equal(torch.isnan(got.cpu()), torch.isnan(want.cpu())), f"{what}: NaN pattern"
    assert torch.equal(torch.isinf(got.cpu()), torch.isinf(want.cpu())), f"{what}: Inf pattern"


def _plant(x, ws, where):
    with torch.no_grad():
        if where == "x":
            x[3, 1] = float("nan")
            x[7, 0] = float("inf")
            x[9, 2] = -float("inf")
        else:
            ws[1][2, 5] = float("nan")


def _planted(name, dev, widths, act, out_act, where):
    """x, weights and biases for ``name`` on ``dev`` (fp32 on the CPU, fp16 on a GPU) with
    NaN/Inf planted (_plant); skips where the backend does not run the net."""
    dtype = torch.float32 if dev.type == "cpu" else torch.float16
    spec = fm.MLPSpec(widths, act, out_act, True, dtype)
    ok, why = fm.dispatch.REGISTRY[name].supports(spec, dev)
    if not ok:
        pytest.skip(f"{name}: {why}")
    ws, bs = make_params(widths, True, dtype, dev)
    x = torch.randn(37 if is_slow(name, dev) else 1037, widths[0], device=dev).to(dtype)
    _plant(x, ws, where)
    return x, ws, bs


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("where", ["x", "weight"])
def test_nonfinite_like_eager(backend, shape, act, where):
    name, dev = backend
    if is_slow(name, dev) and shape == "wide":
        pytest.skip("emulated kernel on CPU: the wide kernels are checked on the device")
    out_act = "softplus" if act == "relu" else "relu"
    x, ws, bs = _planted(name, dev, SHAPES[shape], act, out_act, where)
    leaves = [t.clone().requires_grad_() for t in [x, *ws, *bs]]
    n = len(ws)
    y = fm.fused_mlp(leaves[0], leaves[1:1 + n], leaves[1 + n:], act, out_act, backend=name)
    gy = torch.randn_like(y)
    y.backward(gy)
    # eager on the same device in the same dtype: where a large finite sum overflows fp16
    # is part of the pattern (against fp32 eager it was a coin toss per run)
    eager_leaves = [t.detach().clone().requires_grad_() for t in [x, *ws, *bs]]
    ye = _eager(eager_leaves[0], eager_leaves[1:1 + n], eager_leaves[1 + n:], act, out_act)
    ye.backward(gy)
    assert torch.isnan(ye).any()  # the planted value reaches the output
    _same_pattern(y, ye, "y")
    for i, (a, b) in enumerate(zip(leaves, eager_leaves)):
        _same_pattern(a.grad, b.grad, f"gradient {i}")


INFERENCE_ONLY = [p for p in INFERENCE_BACKENDS if p not in BACKENDS]


@pytest.mark.skipif(not INFERENCE_ONLY, reason="no inference-only backend here (the cuda "
                    "backend on an NVIDIA GPU); the others are checked with their gradients")
@pytest.mark.parametrize("pair", INFERENCE_ONLY, ids=[f"{n}-{d.type}" for n, d in INFERENCE_ONLY])
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("where", ["x", "weight"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_inference_only_nonfinite_like_eager(pair, act, where, bias):
    """The forward of a backend that only infers (the CUDA C++ kernels) has eager's
    NaN/Inf pattern, with and without biases (their kernels start the accumulators
    differently)."""
    name, dev = pair
    out_act = "softplus" if act == "relu" else "relu"
    x, ws, bs = _planted(name, dev, SHAPES["narrow"], act, out_act, where)
    bs = bs if bias else None
    with torch.no_grad():
        y = fm.fused_mlp(x, ws, bs, act, out_act, backend=name)
        ye = _eager(x, ws, bs, act, out_act)
    assert torch.isnan(ye).any()
    _same_pattern(y, ye, "y")


@pytest.mark.parametrize("dev", devices(), ids=str)
@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("act", ["silu", "gelu", "gelu_tanh"])
def test_gated_nonfinite_like_eager(dev, impl, act):
    from fusedmlp_xpu import gated

    if impl == "triton" and not gated._triton_usable(dev, forced=True)[0]:
        pytest.skip("the gated Triton kernels cannot run here")
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    d, hidden = (16, 32) if dev.type == "cpu" else (256, 512)
    x = torch.randn(33, d, device=dev, dtype=dtype)
    x[4, 2], x[6, 1] = float("nan"), float("inf")
    ws = [torch.randn(hidden, d, device=dev, dtype=dtype) * d ** -0.5,
          torch.randn(hidden, d, device=dev, dtype=dtype) * d ** -0.5,
          torch.randn(d, hidden, device=dev, dtype=dtype) * hidden ** -0.5]
    leaves = [t.clone().requires_grad_() for t in [x, *ws]]
    y = fm.fused_gated_mlp(*leaves, act, backend=impl)
    gy = torch.randn_like(y)
    y.backward(gy)
    el = [t.detach().cpu().float().requires_grad_() for t in [x, *ws]]
    ye = F.linear(activations.get(act).fn(F.linear(el[0], el[1])) * F.linear(el[0], el[2]),
                  el[3])
    ye.backward(gy.cpu().float())
    _same_pattern(y, ye, "y")
    for i, (a, b) in enumerate(zip(leaves, el)):
        _same_pattern(a.grad, b.grad, f"gradient {i}")


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("where", ["x", "weight"])
@pytest.mark.parametrize("variant", SECOND_ORDER_VARIANTS)
def test_eikonal_nonfinite_like_eager(backend, act, where, variant, monkeypatch):
    """Second order (the eikonal pattern: g = d y / d x with create_graph=True, a loss on y
    and g, backward): the non-finite pattern of x's and every parameter's gradient is
    eager's double backward's, element by element, on the backend's second-order path
    (and the Triton backend's alternative tunings)."""
    name, dev = backend
    use_second_order_variant(monkeypatch, name, variant)
    widths = SHAPES["narrow"]
    x, ws, bs = _planted(name, dev, widths, act, "none", where)
    v = torch.zeros(x.shape[0], widths[-1], device=dev, dtype=x.dtype)
    v[:, 0] = 1  # g: the gradient of the first output (an SDF value)

    def step(leaves, fn):
        n = len(ws)
        y = fn(leaves[0], leaves[1:1 + n], leaves[1 + n:])
        (g,) = torch.autograd.grad(y, leaves[0], v, create_graph=True)
        ((g * g).sum() + y.sum()).backward()

    leaves = [t.clone().requires_grad_() for t in [x, *ws, *bs]]
    step(leaves, lambda x_, w_, b_: fm.fused_mlp(x_, w_, b_, act, backend=name))
    eager = [t.detach().clone().requires_grad_() for t in [x, *ws, *bs]]
    step(eager, lambda x_, w_, b_: _eager(x_, w_, b_, act, "none"))
    assert torch.isnan(eager[1].grad).any() or torch.isinf(eager[1].grad).any()
    for i, (a, b) in enumerate(zip(leaves, eager)):
        _same_pattern(a.grad, b.grad, f"gradient {i}")
