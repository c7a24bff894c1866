"""Property-based fuzzing of fused_mlp on every usable backend against the float64
reference: random widths, depths, rows (0, 1 and odd counts included), leading dims,
strided inputs, activations, output activations, bias, dtype and recompute; forward and
backward. A fixed example count and no deadline keep the CPU suite's budget (the
emulated kernels run tiny shapes); on a GPU the shapes grow."""
from __future__ import annotations

import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations

from conftest import (GRAD_VS_EAGER, assert_close, eager_errors, gradient_floors, is_slow,
                      make_params, reference, saved_z, term_size, tolerance)

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ACTS = sorted(activations.ACTIVATIONS)


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    """Correctness, not speed: the first config of each wide tuning list, no timing runs
    on a GPU (each new shape would otherwise autotune)."""
    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")


@st.composite
def cases(draw, slow: bool, dtype: torch.dtype):
    if slow:  # the interpreter: any width, tiny
        width, max_rows = st.integers(1, 40), 41
    else:  # a GPU: each new width compiles kernels (~1 s each), so a set of them
        width, max_rows = st.sampled_from([1, 3, 16, 17, 32, 64, 100, 128, 200]), 3000
    depth = draw(st.integers(0, 3 if slow else 5))
    hidden = draw(width)
    widths = (draw(width),) + (hidden,) * depth + (draw(width),)
    lead = draw(st.sampled_from([(), (1,), (2, 3)]))
    rows = draw(st.sampled_from([0, 1, 2]) | st.integers(3, max_rows))
    return dict(
        widths=widths, lead=lead + (rows,),
        strided=draw(st.booleans()),
        act=draw(st.sampled_from(ACTS)), out_act=draw(st.sampled_from(ACTS)),
        bias=draw(st.booleans()),
        dtype=dtype,
        recompute=draw(st.sampled_from([None, True, False])),
        grad=draw(st.booleans()),
    )


def _check(name, dev, c):
    widths, dtype, act, out_act = c["widths"], c["dtype"], c["act"], c["out_act"]
    spec = fm.MLPSpec(widths, act, out_act, c["bias"], dtype)
    if not fm.dispatch.REGISTRY[name].supports(spec, dev)[0]:
        return  # the dispatcher falls back for these (explain() says why)
    ws, bs = make_params(widths, c["bias"], dtype, dev, requires_grad=c["grad"])
    if c["strided"]:
        x = torch.randn(*c["lead"], 2 * widths[0], device=dev).to(dtype)[..., 1::2]
    else:
        x = torch.randn(*c["lead"], widths[0], device=dev).to(dtype)
    x.requires_grad_(c["grad"])
    y = fm.fused_mlp(x, ws, bs, act, out_act, backend=name, recompute=c["recompute"])
    assert y.shape == (*c["lead"], widths[-1]) and y.dtype == dtype
    tol = tolerance(name, dtype)
    # relative to the size of the terms summed where the output cancels below it
    size = term_size(x, ws, bs) if x.numel() else 0.0
    if not c["grad"] or y.numel() == 0:
        assert_close(y, reference(x, ws, bs, act, out_act), tol, floor=size)
        return
    gy = torch.randn_like(y)
    y.backward(gy)
    # derivatives at the backend's own pre-activations: a kink hit within rounding is not
    # a wrong gradient (conftest.reference)
    kinks = saved_z(x, ws, bs, act, out_act, name)
    ref = reference(x, ws, bs, act, out_act, grad_y=gy, kinks_at=kinks)
    assert_close(y, ref[0], tol, floor=size)
    got = [x.grad, *[w.grad for w in ws], *[b.grad for b in bs or []]]
    want = [ref[1], *ref[2], *ref[3]]
    # half precision: within GRAD_VS_EAGER x eager's own error in that dtype (a few rows
    # summed in fp16 can cancel to a tiny number whose relative error says nothing)
    eager = (eager_errors(x, ws, bs, act, out_act, gy, ref) if dtype != torch.float32
             else [0.0] * len(want))
    # sums over rows that cancelled by chance: relative to the size of their terms
    floors = gradient_floors(x, ws, bs, act, out_act, gy)
    for i, (g, r) in enumerate(zip(got, want)):
        assert_close(g, r, max(tol, GRAD_VS_EAGER * eager[i]), f"gradient {i}", floors[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_fuzz(backend, dtype):
    """One test per dtype: under pytest-xdist the three run side by side."""
    name, dev = backend
    slow = is_slow(name, dev)

    @settings(max_examples=5 if slow else 10, deadline=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(c=cases(slow, dtype))
    def run(c):
        _check(name, dev, c)

    run()
