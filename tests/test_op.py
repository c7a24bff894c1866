"""The custom ops themselves: opcheck, torch.compile, torch.export, autocast, env override."""
from __future__ import annotations

import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch

from conftest import BACKENDS, assert_close, is_slow, make_params, reference, tolerance


def sample_inputs(device, dtype, requires_grad):
    """(x, weights, biases, activation, output_activation) covering odd shapes and options."""
    for widths, lead, bias, act, out_act in [
        ((16, 32, 8), (7,), True, "relu", "none"),
        ((13, 16, 16, 5), (2, 3), False, "gelu", "tanh"),
        ((32, 32), (0,), True, "silu", "sigmoid"),
    ]:
        ws, bs = make_params(widths, bias, dtype, device, requires_grad)
        x = torch.randn(*lead, widths[0], device=device, dtype=dtype, requires_grad=requires_grad)
        yield x, ws, bs, act, out_act


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_opcheck(backend, dtype):
    name, dev = backend
    for x, ws, bs, act, out_act in sample_inputs(dev, dtype, requires_grad=True):
        spec = fm.MLPSpec((x.shape[-1],) + tuple(w.shape[0] for w in ws), act, out_act,
                          bs is not None, dtype)
        if not dispatch.REGISTRY[name].supports(spec, dev)[0]:
            continue
        args = (x, ws, bs, act, out_act, name)
        torch.library.opcheck(torch.ops.fusedmlp.mlp.default, args)
        torch.library.opcheck(torch.ops.fusedmlp.mlp_train.default, args)
        with torch.no_grad():
            y, saved = torch.ops.fusedmlp.mlp_train(*args)
        gy = torch.randn_like(y)
        for needs in [(True, True, True), (False, True, False), (True, False, False)]:
            bargs = (gy, x.detach(), [w.detach() for w in ws],
                     None if bs is None else [b.detach() for b in bs],
                     saved, act, out_act, name, *needs)
            torch.library.opcheck(torch.ops.fusedmlp.mlp_backward.default, bargs)


def test_compile_fullgraph_matches_eager(backend):
    name, dev = backend
    if is_slow(name, dev):
        pytest.skip("compile with an emulated kernel: covered by the reference and the device")
    torch._dynamo.reset()
    mlp = fm.FusedMLP(16, 8, 32, 2, activation="gelu", output_activation="tanh",
                      device=dev, backend=name)
    compiled = torch.compile(mlp, fullgraph=True)
    x = torch.randn(5, 7, 16, device=dev, requires_grad=True)
    y_eager = mlp(x)
    y_comp = compiled(x)
    torch.testing.assert_close(y_comp, y_eager)
    (g_eager,) = torch.autograd.grad(y_eager.sum(), x)
    (g_comp,) = torch.autograd.grad(y_comp.sum(), x)
    torch.testing.assert_close(g_comp, g_eager)
    explanation = torch._dynamo.explain(mlp)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@pytest.mark.parametrize("kind", ["narrow", "gated"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "grad"])
def test_export_with_a_dynamic_batch(backend, kind, grad):
    """torch.export of a fused module: the graph holds the fusedmlp op (the training
    forward when grad is on, the inference op under no_grad), runs at a batch size it was
    not traced with, survives torch.export.save/load, and the loaded module trains (its
    gradients equal eager's)."""
    import io

    name, dev = backend
    if is_slow(name, dev):
        pytest.skip("export with an emulated kernel: covered by the reference and the device")
    torch.manual_seed(0)
    if kind == "narrow":
        m = fm.FusedMLP(16, 8, 32, 2, activation="gelu", device=dev, backend=name)
    else:
        if name not in ("reference", "triton"):
            pytest.skip(f"{name} has no gated kernels")
        m = fm.GatedMLP(16, 32, 8, device=dev, backend=name)
    eager = m.to_sequential() if kind == "narrow" else None
    n = torch.export.Dim("n", min=1, max=4096)
    with torch.set_grad_enabled(grad):
        ep = torch.export.export(m, (torch.randn(5, 16, device=dev),),
                                 dynamic_shapes={"x": {0: n}})
    ops = {str(nd.target) for nd in ep.graph.nodes if "fusedmlp" in str(nd.target)}
    want = ("gated_mlp" if kind == "gated" else "mlp") + ("_train" if grad else "")
    assert ops == {f"fusedmlp.{want}.default"}, ops
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    buf.seek(0)
    loaded = torch.export.load(buf).module()
    x = torch.randn(11, 16, device=dev, requires_grad=True)
    y = loaded(x)
    tol = tolerance(name, torch.float32)  # the inference kernel against the training one
    with torch.no_grad():
        assert_close(y, m(x).double().cpu(), tol)
    if grad:
        y.square().sum().backward()
        x2 = x.detach().clone().requires_grad_()
        (eager or m)(x2).square().sum().backward()
        assert_close(x.grad, x2.grad.double().cpu(), tol, "grad x")


@pytest.mark.gpu
@pytest.mark.parametrize("backend", [b for b in BACKENDS if b[0] == "triton" and b[1].type
                                     == "cuda"], ids=lambda b: f"{b[0]}-{b[1].type}")
def test_compiled_train_step_takes_the_recomputing_backward(backend, monkeypatch):
    """A compiled fp16 narrow FusedMLP's train steps, where the backend recomputes (the
    one-kernel backward): the forward saves nothing, and y and every gradient match the
    float64 reference, over two row counts."""
    name, dev = backend
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    torch._dynamo.reset()
    torch.manual_seed(0)
    dt = torch.float16
    m = fm.FusedMLP(64, 64, 32, 4, "tanh", bias=True, device=dev, dtype=dt, backend=name)
    if not dispatch.REGISTRY[name].recomputes(m.spec(dt), dev):
        pytest.skip("this device's backward does not recompute (no one-kernel backward)")
    saves = []
    real = tb.TritonBackend.forward
    monkeypatch.setattr(tb.TritonBackend, "forward",
                        lambda self, *a: saves.append(a[-1]) or real(self, *a))
    compiled = torch.compile(m, fullgraph=True)
    tol = tolerance(name, dt)
    for rows in (1037, 4096):
        x = torch.randn(rows, 64, device=dev, dtype=dt, requires_grad=True)
        m.zero_grad(set_to_none=True)
        y = compiled(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        ry, rgx, rgw, rgb = reference(x, m.weights(), m.biases(), "tanh", "none", grad_y=gy)
        assert_close(y, ry, tol, f"{rows} rows")
        assert_close(x.grad, rgx, tol, f"grad x, {rows} rows")
        for i, (w, b) in enumerate(zip(m.weights(), m.biases())):
            assert_close(w.grad, rgw[i], tol, f"grad weights[{i}], {rows} rows")
            assert_close(b.grad, rgb[i], tol, f"grad biases[{i}], {rows} rows")
    assert saves and not any(saves), saves  # nothing saved, nothing run again to save


@pytest.mark.parametrize("recompute", [None, False, True], ids=["backend", "save", "recompute"])
def test_compile_takes_the_backends_recompute_choice(recompute, monkeypatch):
    """Under torch.compile, recompute=None asks the backend once, while tracing (here a
    reference backend that says "recompute"): the graph holds the recomputing op, not the
    saving one, and right gradients; an explicit choice wins. Two calls, one graph: the
    answer is a constant, not guarded on the dispatcher's or the module's caches."""
    from torch._dynamo.utils import counters

    be = dispatch.REGISTRY["reference"]
    monkeypatch.setattr(type(be), "recomputes", lambda self, spec, device: True)
    torch._dynamo.reset()
    counters.clear()
    ops = []
    mlp = fm.FusedMLP(16, 8, 32, 2, activation="gelu", backend="reference",
                      recompute=recompute)

    def backend_of_graph(gm, example_inputs):
        ops.extend(n.target for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(mlp, fullgraph=True, backend=backend_of_graph)
    x = torch.randn(5, 7, 16, requires_grad=True)
    for _ in range(2):
        x.grad = None
        compiled(x).sum().backward()
        dispatch.choose(x.device, fm.MLPSpec((3, 5, 7)))  # the dispatcher's cache grows
    saving = torch.ops.fusedmlp.mlp_train.default in ops
    assert saving == (recompute is False), ops
    assert counters["stats"]["unique_graphs"] == 1
    (gx,) = torch.autograd.grad(mlp.to_sequential()(x).sum(), x)
    torch.testing.assert_close(x.grad, gx)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_computes_in_autocast_dtype(backend, dtype):
    name, dev = backend
    ws, bs = make_params((16, 32, 8), True, torch.float32, dev, requires_grad=True)
    x = torch.randn(33, 16, device=dev)
    with torch.autocast(dev.type, dtype=dtype):
        y = fm.fused_mlp(x, ws, bs, "relu", backend=name)
        mlp = fm.FusedMLP(16, 8, 32, 1, device=dev, backend=name)
        y2 = mlp(x)
    assert y.dtype == dtype and y2.dtype == dtype
    rounded = [w.to(dtype) for w in ws], [b.to(dtype) for b in bs]
    assert_close(y, reference(x.to(dtype), *rounded, "relu", "none"), tolerance(name, dtype))
    y.float().sum().backward()
    assert ws[0].grad.dtype == torch.float32  # gradients flow back to the fp32 masters


@pytest.mark.readme
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_ops_autograd_in_eager(backend, monkeypatch, recompute):
    """Plain eager calls normally take a leaner path; the ops' own autograd must hold too."""
    import fusedmlp_xpu.op as op_module

    monkeypatch.setattr(op_module, "EAGER_FAST_PATH", False)
    name, dev = backend
    ws, bs = make_params((16, 32, 32, 8), True, torch.float32, dev, requires_grad=True)
    x = torch.randn(3, 37, 16, device=dev, requires_grad=True)
    y = fm.fused_mlp(x, ws, bs, "silu", "tanh", backend=name, recompute=recompute)
    gy = torch.randn_like(y)
    y.backward(gy)
    ry, rgx, rgw, rgb = reference(x, ws, bs, "silu", "tanh", grad_y=gy)
    tol = tolerance(name, torch.float32)
    assert_close(y, ry, tol)
    assert_close(x.grad, rgx, tol, "grad x")
    for i in range(3):
        assert_close(ws[i].grad, rgw[i], tol, f"grad weights[{i}]")
        assert_close(bs[i].grad, rgb[i], tol, f"grad biases[{i}]")


def test_env_var_forces_backend(monkeypatch):
    x = torch.randn(4, 16)
    ws, bs = make_params((16, 8), True, torch.float32, "cpu")
    monkeypatch.setenv(dispatch.ENV_VAR, "no-such-backend")
    with pytest.raises(ValueError, match="FUSEDMLP_BACKEND: unknown backend 'no-such-backend'"):
        fm.fused_mlp(x, ws, bs)
    monkeypatch.setenv(dispatch.ENV_VAR, "reference")
    assert fm.explain(fm.MLPSpec((16, 8)), x).backend == "reference"


def test_unavailable_forced_backend_is_an_error(monkeypatch):
    """A forced backend that cannot run raises, naming it and why; never a silent fallback."""

    class Never(fm.dispatch.Backend):
        name, device_types = "never", ("cpu",)

        def available(self):
            return True, "test backend"

        def supports(self, spec, device):
            return False, "width over this backend's limit"

    monkeypatch.setitem(dispatch.REGISTRY, "never", Never())
    dispatch._decisions.clear()
    x = torch.randn(4, 16)
    ws, _ = make_params((16, 8), False, torch.float32, "cpu")
    with pytest.raises(fm.BackendUnavailableError, match="'never'.*width over this backend's limit"):
        fm.fused_mlp(x, ws, backend="never")
    monkeypatch.setenv(dispatch.ENV_VAR, "never")
    with pytest.raises(fm.BackendUnavailableError, match="never"):
        fm.fused_mlp(x, ws)


def _zero_fills(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.key for e in prof.key_averages() if e.key in ("aten::zeros", "aten::zero_")]


@pytest.mark.parametrize("which", ["mlp_train", "gated_mlp_train"])
def test_train_ops_get_no_zero_grads_for_saved_outputs(monkeypatch, which):
    """The train ops return their saved intermediates as outputs; autograd must not build
    zero-filled gradients for them (a [rows, hidden] tensor each, at the step's peak)."""
    import fusedmlp_xpu.op as op_module
    from fusedmlp_xpu import gated

    monkeypatch.setattr(op_module, "EAGER_FAST_PATH", False)
    x = torch.randn(5, 16, requires_grad=True)
    if which == "mlp_train":
        ws, bs = make_params((16, 32, 8), False, torch.float32, "cpu", requires_grad=True)
        step = lambda: fm.fused_mlp(x, ws, None, "relu", backend="reference").sum().backward()  # noqa: E731
    else:
        ws, _ = make_params((16, 32, 16), False, torch.float32, "cpu", requires_grad=True)
        wu = torch.randn(32, 16, requires_grad=True)
        step = lambda: gated.fused_gated_mlp(x, ws[0], wu, ws[1], backend="reference").sum().backward()  # noqa: E731
    assert _zero_fills(step) == []
    assert x.grad is not None and torch.isfinite(x.grad).all()
