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


def _kind(t):
    """Each element's kind: 0 finite, 1 NaN, 2 infinite."""
    t = t.detach().cpu()
    return torch.isnan(t).to(torch.int8) + 2 * torch.isinf(t).to(torch.int8)


def _pattern_of_either(got, half, wide, what):
    """got's NaN/Inf pattern is eager's in its own half precision (``half``) or, element by
    element, eager's in fp32 on the same values (``wide``): a gradient eager rounds to
    exactly zero in fp16 (an underflow on its way down the layers) that meets an infinite
    input is NaN there, where a kernel that rounds once keeps a tiny non-zero and gets the
    infinity, as fp32 eager does (seen on the H100: the first weight's gradient, one
    element, inf against eager's NaN). Every other difference fails."""
    if wide is None:
        return _same_pattern(got, half, what)
    k, kh, kw = _kind(got), _kind(half), _kind(wide)
    bad = (k != kh) & (k != kw)
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{what}: non-finite pattern at {int(bad.sum())} elements, first "
                             f"{i}: {got[i].item()} against eager's {half[i].item()} in "
                             f"{half.dtype} and {wide[i].item()} in fp32")


def test_pattern_of_either_takes_one_eager_per_element():
    nan, inf = float("nan"), float("inf")
    half = torch.tensor([nan, 1.0, inf, nan])
    wide = torch.tensor([inf, 1.0, inf, nan])
    _pattern_of_either(torch.tensor([inf, 2.0, inf, nan]), half, wide, "g")  # fp32's inf
    _pattern_of_either(torch.tensor([nan, 2.0, -inf, nan]), half, wide, "g")
    for got in ([1.0, 2.0, inf, nan], [nan, nan, inf, nan], [nan, 1.0, inf, 0.0]):
        with pytest.raises(AssertionError, match="g: non-finite pattern at 1 elements"):
            _pattern_of_either(torch.tensor(got), half, wide, "g")


def _eager_in_fp32(leaves, run):
    """``run`` (eager on leaves, backward included) again on the leaves' values in fp32
    -> those leaves (their gradients set), or None where the leaves are fp32 already."""
    if leaves[0].dtype == torch.float32:
        return None
    wide = [t.detach().float().requires_grad_() for t in leaves]
    run(wide)
    return wide


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
    # (and in fp32, for the underflows of its own rounding: _pattern_of_either)
    def eager(ls):
        ye = _eager(ls[0], ls[1:1 + n], ls[1 + n:], act, out_act)
        ye.backward(gy.to(ye.dtype))
        return ye

    eager_leaves = [t.detach().clone().requires_grad_() for t in [x, *ws, *bs]]
    ye = eager(eager_leaves)
    assert torch.isnan(ye).any()  # the planted value reaches the output
    _same_pattern(y, ye, "y")
    wide = _eager_in_fp32(eager_leaves, eager)
    for i, (a, b) in enumerate(zip(leaves, eager_leaves)):
        _pattern_of_either(a.grad, b.grad, None if wide is None else wide[i].grad,
                           f"gradient {i}")


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
        (g,) = torch.autograd.grad(y, leaves[0], v.to(y.dtype), create_graph=True)
        ((g * g).sum() + y.sum()).backward()

    leaves = [t.clone().requires_grad_() for t in [x, *ws, *bs]]
    step(leaves, lambda x_, w_, b_: fm.fused_mlp(x_, w_, b_, act, backend=name))
    eager = [t.detach().clone().requires_grad_() for t in [x, *ws, *bs]]

    def on_eager(ls):
        step(ls, lambda x_, w_, b_: _eager(x_, w_, b_, act, "none"))

    on_eager(eager)
    assert torch.isnan(eager[1].grad).any() or torch.isinf(eager[1].grad).any()
    wide = _eager_in_fp32(eager, on_eager)
    for i, (a, b) in enumerate(zip(leaves, eager)):
        _pattern_of_either(a.grad, b.grad, None if wide is None else wide[i].grad,
                           f"gradient {i}")
