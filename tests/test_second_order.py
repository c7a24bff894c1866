"""Second derivatives through the ops: gradgradcheck in float64, and the eikonal pattern of
neural SDFs (y, dy/dx with create_graph=True, a loss on both, backward to the weights and
x) on every usable backend against float64 torch autograd."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations, gated, op, second_order

from conftest import (GRAD_VS_EAGER, SECOND_ORDER_VARIANTS, assert_close, case_seed, devices,
                      is_slow, make_params, rel_error, tolerance, use_second_order_variant)

ACTS = sorted(activations.ACTIVATIONS)


@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    """Correctness, not speed: the first config of each wide tuning list, no timing runs
    on a GPU (each new shape would otherwise autotune)."""
    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")


@pytest.fixture(params=[True, False], ids=["eager-path", "op-path"])
def op_path(request, monkeypatch):
    """Both call paths: the eager autograd.Function and the custom ops' autograd."""
    monkeypatch.setattr(op, "EAGER_FAST_PATH", request.param)


def _leaves(*shapes, gen):
    return [torch.randn(*s, dtype=torch.float64, generator=gen).requires_grad_()
            for s in shapes]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recompute", [None, True, False], ids=["auto", "recompute", "save"])
def test_gradgradcheck(act, bias, recompute, op_path):
    """Every activation, with and without bias, each paired with a different output
    activation, every recompute mode, both call paths: the op's node (the reference
    forced; unforced, a CPU training call records torch's own graph)."""
    out_act = ACTS[(ACTS.index(act) + 4) % len(ACTS)]
    gen = torch.Generator().manual_seed(case_seed(act, bias))
    x, w1, w2, w3 = _leaves((4, 3), (5, 3), (5, 5), (2, 5), gen=gen)
    bs = _leaves((5,), (5,), (2,), gen=gen) if bias else []

    def f(x, w1, w2, w3, *bs):
        return fm.fused_mlp(x, [w1, w2, w3], list(bs) if bias else None, act, out_act,
                            recompute=recompute, backend="reference")

    assert torch.autograd.gradcheck(f, (x, w1, w2, w3, *bs))
    assert torch.autograd.gradgradcheck(f, (x, w1, w2, w3, *bs))


def test_issue_repro():
    """The report's repro: tanh, two layers, default recompute."""
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w1 = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(
        lambda x, a, b: fm.fused_mlp(x, [a, b], activation="tanh"), (x, w1, w2))


@pytest.mark.parametrize("act", gated.GATE_ACTIVATIONS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "save"])
def test_gated_gradgradcheck(act, bias, recompute, op_path):
    gen = torch.Generator().manual_seed(7)
    x, wg, wu, wd = _leaves((3, 4), (6, 4), (6, 4), (2, 6), gen=gen)
    bs = _leaves((6,), (6,), (2,), gen=gen) if bias else []

    def f(x, wg, wu, wd, *bs):
        # the node (the reference forced; unforced, a CPU training call is torch's graph)
        return fm.fused_gated_mlp(x, wg, wu, wd, act, recompute=recompute,
                                  biases=list(bs) if bias else None, backend="reference")

    assert torch.autograd.gradcheck(f, (x, wg, wu, wd, *bs))
    assert torch.autograd.gradgradcheck(f, (x, wg, wu, wd, *bs))


# --- the eikonal pattern on every backend ----------------------------------------------
def _eikonal_grads(forward, x, params):
    """loss = mean y^2 + mean (|d y0 / dx| - 1)^2; its gradients w.r.t. x and params."""
    y = forward(x)
    g, = torch.autograd.grad(y[..., 0].sum(), x, create_graph=True)
    loss = y.float().square().mean() + (g.float().norm(dim=-1) - 1).square().mean()
    return torch.autograd.grad(loss, [x, *params])


def _eager(ws, bs, act):
    def f(x):
        h = x
        for i, w in enumerate(ws):
            h = F.linear(h, w, None if bs is None else bs[i])
            if i < len(ws) - 1:
                h = activations.get(act).fn(h)
        return h
    return f


@pytest.mark.parametrize("act", ["softplus", "tanh", "silu", "gelu", "relu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recompute", [None, False], ids=["auto", "save"])
def test_eikonal_against_float64(backend, act, dtype, recompute):
    name, dev = backend
    slow = is_slow(name, dev)
    if slow and (dtype is not torch.float32 or recompute is False):
        pytest.skip("emulated kernel on CPU: fp32, one mode (the GPU run covers the rest)")
    if dtype is not torch.float32 and act == "relu":
        pytest.skip("relu's mask flips at rounding-level pre-activations in half precision")
    widths = (3, 32, 32, 4)
    spec = fm.MLPSpec(widths, act, "none", True, dtype)
    ok, why = fm.dispatch.REGISTRY[name].supports(spec, dev)
    if not ok:
        pytest.skip(f"{name}: {why}")
    ws, bs = make_params(widths, True, dtype, dev, requires_grad=True)
    x = torch.randn(37 if slow else 1037, 3, device=dev).to(dtype).requires_grad_()
    got = _eikonal_grads(
        lambda t: fm.fused_mlp(t, ws, bs, act, backend=name, recompute=recompute), x, ws + bs)

    def up(t):
        return t.detach().to("cpu", torch.float64).requires_grad_()

    w64, b64, x64 = [up(w) for w in ws], [up(b) for b in bs], up(x)
    want = _eikonal_grads(_eager(w64, b64, act), x64, w64 + b64)
    eager = [0.0] * len(want)
    if dtype is not torch.float32:
        # second derivatives in half precision sit near the table's bound in eager torch
        # too (fp16 softplus: 0.9e-2 over 10 seeds): allow GRAD_VS_EAGER x eager's error
        # in the same dtype on the same data; a wrong formula is off by O(1)
        def same(t):
            return t.detach().cpu().requires_grad_()

        wl, bl, xl = [same(w) for w in ws], [same(b) for b in bs], same(x)
        eager = [rel_error(g, r) for g, r in zip(
            _eikonal_grads(_eager(wl, bl, act), xl, wl + bl), want)]
    for i, (g, r) in enumerate(zip(got, want)):
        assert g.dtype == dtype
        tol = max(tolerance(name, dtype), GRAD_VS_EAGER * eager[i])
        assert_close(g, r, tol, f"eikonal gradient {i} ({'x' if i == 0 else 'param'})")


def test_module_eikonal_matches_sequential():
    """FusedMLP (the module path) against its own nn.Sequential, in float64."""
    m = fm.FusedMLP(3, 4, 16, 2, activation="softplus", dtype=torch.float64)
    seq = m.to_sequential()
    x = torch.randn(9, 3, dtype=torch.float64, requires_grad=True)
    a = _eikonal_grads(m, x, list(m.parameters()))
    b = _eikonal_grads(seq, x, list(seq.parameters()))
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("act", ["softplus", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [3001, 20000])
def test_sdf_net_eikonal_against_float64(act, dtype, rows):
    """The sdf-eikonal config's net (32 -> 64 x 4 -> 16, biases), whose forward saves nothing
    on sm_90 (its first backward is the Gluon kernel, x alone, the derivative taken from
    the stored activation): the eikonal gradients against float64 autograd, within
    GRAD_VS_EAGER x eager's own error in that dtype."""
    dev = torch.device("cuda")
    widths = (32, 64, 64, 64, 64, 16)
    ws, bs = make_params(widths, True, dtype, dev, requires_grad=True)
    x = torch.randn(rows, 32, device=dev).to(dtype).requires_grad_()
    got = _eikonal_grads(lambda t: fm.fused_mlp(t, ws, bs, act, backend="triton"), x, ws + bs)

    def up(t, dt=torch.float64, to="cpu"):
        return t.detach().to(to, dt).requires_grad_()

    w64, b64, x64 = [up(w) for w in ws], [up(b) for b in bs], up(x)
    want = _eikonal_grads(_eager(w64, b64, act), x64, w64 + b64)
    wl, bl, xl = ([up(w, dtype, dev) for w in ws], [up(b, dtype, dev) for b in bs],
                  up(x, dtype, dev))
    eager = [rel_error(g, r) for g, r in zip(_eikonal_grads(_eager(wl, bl, act), xl, wl + bl),
                                             want)]
    for i, (g, r) in enumerate(zip(got, want)):
        tol = max(tolerance("triton", dtype), GRAD_VS_EAGER * eager[i])
        assert_close(g, r, tol, f"eikonal gradient {i} ({'x' if i == 0 else 'param'})")



@pytest.mark.parametrize("dev", devices(), ids=str)
def test_gated_eikonal_matches_eager(dev):
    m = fm.GatedMLP(8, 16, 4, activation="gelu_tanh", bias=True, device=dev,
                    dtype=torch.float64 if dev.type == "cpu" else torch.float32)

    def eager(x):
        return m.down_proj(F.gelu(m.gate_proj(x), approximate="tanh") * m.up_proj(x))

    x = torch.randn(11, 8, device=dev, dtype=m.gate_proj.weight.dtype, requires_grad=True)
    a = _eikonal_grads(m, x, list(m.parameters()))
    b = _eikonal_grads(eager, x, list(m.parameters()))
    tol = 1e-12 if dev.type == "cpu" else 1e-5
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, rtol=tol, atol=tol)


def test_compiled_double_backward_raises_clearly():
    """torch.compile's autograd cannot run double backward (nn.Linear chains neither):
    torch's own error, never a wrong number."""
    torch._dynamo.reset()
    m = fm.FusedMLP(3, 2, 8, 1, activation="tanh")
    x = torch.randn(5, 3, requires_grad=True)
    y = torch.compile(m)(x)
    g, = torch.autograd.grad(y.sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        g.square().sum().backward()


# --- the closed-form input-gradient node (second_order.InputGrad) ----------------------
def _input_grad_fn(act, out_act, bias, recompute=None):
    """f(v, x, *params) = (dy/dx)^T v with create_graph=True, y the fused MLP: autograd.grad
    asks for x's gradient only, so the op hands back the InputGrad node. The reference
    forced: unforced on the CPU it records torch's own graph (ReferenceBackend.torch_rows)."""
    def f(v, x, *params):
        n = 3
        ws, bs = list(params[:n]), (list(params[n:]) if bias else None)
        y = fm.fused_mlp(x, ws, bs, act, out_act, recompute=recompute, backend="reference")
        g, = torch.autograd.grad(y, x, v, create_graph=True)
        assert type(g.grad_fn).__name__ == "InputGradBackward", g.grad_fn
        return g
    return f


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_input_grad_gradcheck(act, bias, op_path):
    """The closed form's gradients for v, x, every weight and bias against finite
    differences (gradcheck), and its third derivatives (gradgradcheck: the recompute)."""
    out_act = ACTS[(ACTS.index(act) + 3) % len(ACTS)]
    gen = torch.Generator().manual_seed(case_seed(act, bias, "ig"))
    v, x, w1, w2, w3 = _leaves((4, 2), (4, 3), (5, 3), (5, 5), (2, 5), gen=gen)
    bs = _leaves((5,), (5,), (2,), gen=gen) if bias else []
    f = _input_grad_fn(act, out_act, bias)
    assert torch.autograd.gradcheck(f, (v, x, w1, w2, w3, *bs))
    if act in ("tanh", "softplus"):  # third order: two activations are enough (slow)
        assert torch.autograd.gradgradcheck(f, (v, x, w1, w2, w3, *bs))


@pytest.mark.parametrize("act", ["softplus", "gelu_tanh", "relu"])
def test_input_grad_matches_recorded_backward(act, monkeypatch):
    """The eikonal gradients with the closed form and with the recorded backward
    (second_order.ENABLED off) agree in float64; the node is taken only where the backward
    needs x's gradient alone (.backward(create_graph=True) also needs the weights')."""
    m = fm.FusedMLP(3, 4, 16, 3, activation=act, output_activation="tanh",
                    dtype=torch.float64, backend="reference")  # the node (unforced: torch's)
    x = torch.randn(21, 3, dtype=torch.float64, requires_grad=True)
    closed = _eikonal_grads(m, x, list(m.parameters()))
    monkeypatch.setattr(second_order, "ENABLED", False)
    recorded = _eikonal_grads(m, x, list(m.parameters()))
    for a, b in zip(closed, recorded):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    monkeypatch.setattr(second_order, "ENABLED", True)
    y = m(x)
    y.sum().backward(create_graph=True)
    assert type(x.grad.grad_fn).__name__ != "InputGradBackward"
    y = m(x)
    g, = torch.autograd.grad(y.sum(), x, create_graph=True)
    assert type(g.grad_fn).__name__ == "InputGradBackward"


def _eager_second_order(act, out_act):
    """What eager torch computes for Backend.second_order's outputs: the net as F.linear and
    the registry's activations, g = autograd.grad(y, x, v, create_graph=True), then g's
    gradients against gg (torch's own double backward, in the operands' dtype)."""
    def f(gg, v, x, ws, bs, spec, needs):
        leaves = [t.detach().requires_grad_() for t in [v, x, *ws, *(bs or [])]]
        v, x, ws, bs = leaves[0], leaves[1], leaves[2:2 + len(ws)], leaves[2 + len(ws):]
        h = x
        for i, w in enumerate(ws):
            h = F.linear(h, w, bs[i] if bs else None)
            h = activations.get(act if i < len(ws) - 1 else out_act).fn(h)
        g, = torch.autograd.grad(h, x, v, create_graph=True)
        out = torch.autograd.grad(g, leaves, gg, allow_unused=True)
        out = [torch.zeros_like(t) if o is None else o for o, t in zip(out, leaves)]
        return out[0], out[1], out[2:2 + len(ws)], out[2 + len(ws):]
    return f


#: activations whose derivative jumps at 0 (no second derivative in the registry)
KINKED = frozenset(n for n, a in activations.ACTIVATIONS.items()
                   if a.grad2 is None and n != "none")


def _off_the_kinks(x, ws, bs, act, out_act, dtype):
    """Which rows of x (float64 holding ``dtype`` values) keep every pre-activation of a
    kinked activation (relu, leaky_relu) farther from 0 than rounding its inputs to
    ``dtype`` can move it (eps x sum |w| |a| a layer, growing with depth). Within that
    margin the derivative's side (1 or 0.01 for leaky_relu) is rounding's choice, and the
    second order's v and x gradients through it differ from float64 by a whole step on
    that row: one such row of 3001 put the one kernel at 1.9e-2 against eager's 8e-4 in
    fp16 (gelu / leaky_relu 8-32-32-8; reproduced in Triton's interpreter), because eager
    and the GEMM form round alike and land on the same side."""
    eps = torch.finfo(dtype).eps
    h, keep = x, torch.ones(x.shape[0], dtype=torch.bool)
    for i, w in enumerate(ws):
        z = F.linear(h, w, None if bs is None else bs[i])
        name = act if i < len(ws) - 1 else out_act
        if name in KINKED:
            keep &= (z.abs() > (i + 1) * eps * (h.abs() @ w.abs().t())).all(1)
        h = activations.get(name).fn(z)
    return keep


SECOND_ORDER_CASES = [  # act, output act, bias, widths: every activation, 0-4 hidden layers
    ("softplus", "none", True, (3, 32, 32, 32, 32, 16)),
    ("tanh", "sigmoid", False, (7, 16, 16)),
    ("silu", "gelu", True, (5, 24, 24, 24, 3)),
    ("gelu_tanh", "tanh", True, (4, 16, 16, 2)),
    ("relu", "none", True, (3, 16, 16, 16, 4)),
    ("sigmoid", "softplus", False, (2, 16, 16, 16, 1)),
    ("gelu", "leaky_relu", True, (8, 32, 32, 8)),
]


@pytest.mark.parametrize("case", SECOND_ORDER_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{len(c[3])}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", SECOND_ORDER_VARIANTS)
def test_backend_second_order_kernel(backend, case, dtype, variant, monkeypatch):
    """A backend's second-order kernel (Backend.second_order) against the closed form in
    float64 on fresh data, outputs poisoned; in half precision within GRAD_VS_EAGER x the
    error of eager torch's own double backward in that dtype on the same data. variant:
    the Triton tunings the benchmark times besides the default (Tuning.merge_dw, the GEMM
    form Tuning.split)."""
    name, dev = backend
    be = fm.dispatch.REGISTRY[name]
    use_second_order_variant(monkeypatch, name, variant)
    slow = is_slow(name, dev)
    if slow and dtype is not torch.float32 and variant not in ("split", "fused"):
        pytest.skip("emulated kernel on CPU: fp32 (the GPU run covers fp16/bf16)")
    act, out_act, bias, widths = case
    spec = fm.MLPSpec(widths, act, out_act, bias, dtype)
    ok, why = be.supports(spec, dev)
    if not ok:
        pytest.skip(f"{name}: {why}")
    gen = torch.Generator().manual_seed(case_seed(*case))
    # the GEMM form's pointwise kernels in blocks of 1024 elements: several, the last cut
    M = (197 if variant in ("split", "fused") else 37) if slow else 3001
    ws = [torch.randn(b, a, generator=gen, dtype=torch.float64) / a ** 0.5
          for a, b in zip(widths[:-1], widths[1:])]
    bs = [0.1 * torch.randn(b, generator=gen, dtype=torch.float64) for b in widths[1:]] \
        if bias else None
    x, v, gg = (torch.randn(4 * M, w, generator=gen, dtype=torch.float64)
                for w in (widths[0], widths[-1], widths[0]))
    # the float64 reference takes the very values the kernel sees (rounded to dtype)
    x, v, gg, *ws = (t.to(dtype).double() for t in (x, v, gg, *ws))
    bs = None if bs is None else [b.to(dtype).double() for b in bs]
    # and rows off the kinks (_off_the_kinks): M of them
    keep = _off_the_kinks(x, ws, bs, act, out_act, dtype).nonzero().flatten()[:M]
    assert len(keep) == M, f"{len(keep)} of {4 * M} rows off the kinks, {M} wanted"
    x, v, gg = x[keep], v[keep], gg[keep]
    needs = (True, True, True, bias)

    def run(fn, dt, device):
        to = lambda t: t.to(device, dt)  # noqa: E731
        return fn(to(gg), to(v), to(x), [to(w) for w in ws],
                  None if bs is None else [to(b) for b in bs],
                  fm.MLPSpec(widths, act, out_act, bias, dt), needs)

    got = run(be.second_order, dtype, dev)
    if got is None:
        pytest.skip(f"{name} has no second-order kernel (the torch-op closed form runs)")
    want = run(second_order.grads, torch.float64, "cpu")
    same = run(_eager_second_order(act, out_act), dtype, dev) \
        if dtype is not torch.float32 else None
    flat = lambda out: [out[0], out[1], *out[2], *out[3]]  # noqa: E731
    for i, (g, r) in enumerate(zip(flat(got), flat(want))):
        assert g.dtype == dtype and g.shape == r.shape
        if r.abs().max() == 0:  # no curvature: exactly zero (relu's x and bias gradients)
            assert not g.any(), f"output {i} should be zero"
            continue
        tol = tolerance(name, dtype)
        if same is not None:
            tol = max(tol, GRAD_VS_EAGER * rel_error(flat(same)[i], r))
        assert_close(g, r, tol, f"second-order output {i}")


@pytest.mark.parametrize("name", ["reference", "triton"])
def test_explain_names_the_second_order_path(name):
    ok, _ = fm.dispatch.availability(name)
    if not ok:
        pytest.skip(f"{name} not available")
    spec = fm.MLPSpec((3, 64, 64, 16), "softplus", "none", True, torch.float32)
    # the device triton runs here (CPU tensors only in the interpreter)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    text = str(fm.dispatch.explain_choice(dev, spec, name))
    assert "second derivatives" in text and "closed form" in text, text


def test_kernel_benchmark_checks_each_tuning(tmp_path):
    """benchmarks/second_order.py: each tuning checked against float64 before it is timed,
    the JSON written with the environment; a malformed tuning is an argument error."""
    if not fm.dispatch.availability("triton")[0]:
        pytest.skip("triton not available")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "second_order.py"
    spec = importlib.util.spec_from_file_location("bench_second_order", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = 24 if not torch.cuda.is_available() else 4096
    out = tmp_path / "so.jsonl"
    assert mod.main(["--out", str(out), "--run", "so", "--rows", str(rows), "--tunings",
                     "16x4x1", "16x2x2", "--repeats", "1"]) == 0
    from fusedmlp_xpu.bench import results

    got = results.documents(results.read(str(out)))["so"]
    assert got["env"] and got["rows"] == rows and len(got["tunings"]) == 2
    for rec in got["tunings"]:
        assert rec["ok"] and rec["ms"] > 0 and rec["max_rel_error"] <= got["error_bound"]
    assert got["eager_double_backward_ms"] > 0 and got["closed_form_torch_ops_ms"] > 0
    assert got["first_backward_x_ms"] > 0 and got["forward_train_ms"] > 0
    assert got["backward_weights_ms"] > 0
    with pytest.raises(SystemExit):
        mod.main(["--out", str(out), "--tunings", "16x3x1"])


def test_tuning_override_from_the_environment(monkeypatch):
    """FUSEDMLP_SECOND_ORDER_TUNING picks the kernel's tuning (the benchmark's spelling); a
    malformed value is an error naming the variable, not a silent default."""
    if not fm.dispatch.availability("triton")[0]:
        pytest.skip("triton not available")
    from fusedmlp_xpu.backends.triton.narrow import second_order as kernel

    cpu = torch.device("cpu")
    default = kernel.tuning(cpu, 64)
    monkeypatch.setenv("FUSEDMLP_SECOND_ORDER_TUNING", "32x8x2m")
    assert kernel.tuning(cpu, 64) == kernel.Tuning(32, 8, 2, True) != default
    monkeypatch.setenv("FUSEDMLP_SECOND_ORDER_TUNING", "split")
    assert kernel.tuning(cpu, 64).split
    monkeypatch.setenv("FUSEDMLP_SECOND_ORDER_TUNING", "32x3x1")
    with pytest.raises(ValueError, match="FUSEDMLP_SECOND_ORDER_TUNING.*32x3x1"):
        kernel.tuning(cpu, 64)


def test_gpu_default_by_rows_and_capture(monkeypatch):
    """On CUDA the one kernel (SMALL) up to SMALL_ROWS rows at widths up to 64 where no
    CUDA graph is being captured, else the GEMM form (FUSED); the input gradient's node
    asks for the pass form with its row count, and explain names both."""
    if not fm.dispatch.availability("triton")[0]:
        pytest.skip("triton not available")
    from fusedmlp_xpu.backends.triton.narrow import second_order as kernel

    cuda, n = torch.device("cuda", 0), kernel.SMALL_ROWS
    # a CPU-only torch: no graph can be captured, and explain still answers for CUDA
    assert kernel.tuning(cuda, 64, n) == kernel.SMALL
    assert "up to" in str(fm.dispatch.explain_choice(cuda, fm.MLPSpec((3, 64, 1)), "triton"))
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert kernel.tuning(cuda, 64, n) == kernel.tuning(cuda, 32, 1) == kernel.SMALL
    for P, rows in ((64, n + 1), (128, 1000), (64, None)):
        assert kernel.tuning(cuda, P, rows) == kernel.FUSED, (P, rows)
    assert kernel.tuning(torch.device("xpu", 0), 64, 1000) == kernel.FUSED
    capturing[0] = True
    assert kernel.tuning(cuda, 64, 1000) == kernel.FUSED
    capturing[0] = False
    monkeypatch.setenv("FUSEDMLP_SECOND_ORDER_TUNING", "fused")
    assert kernel.tuning(cuda, 64, 1000) == kernel.FUSED
    monkeypatch.delenv("FUSEDMLP_SECOND_ORDER_TUNING")
    be = fm.dispatch.REGISTRY["triton"]
    spec = fm.MLPSpec((32, 64, 64, 16), "softplus", "none", True, torch.float16)
    assert be.second_order_form(spec, cuda, n) is None
    assert isinstance(be.second_order_form(spec, cuda, n + 1), kernel.GemmForm)
    asked = []
    real = be.second_order_form
    monkeypatch.setattr(be, "second_order_form",
                        lambda spec, device, rows=None: asked.append(rows) or real(spec, device,
                                                                                    rows))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # cpu: interpreted
    x = torch.randn(2, 5, 3, device=dev, requires_grad=True)
    ws = [torch.randn(8, 3, device=dev), torch.randn(1, 8, device=dev)]
    y = fm.fused_mlp(x, [w.requires_grad_() for w in ws], None, "softplus", backend="triton")
    torch.autograd.grad(y.sum(), x, create_graph=True)
    assert asked == [10]  # the rows of x [2, 5, 3]
    text = str(fm.dispatch.explain_choice(cuda, spec, "triton"))
    assert f"up to {n} rows" in text and "in one kernel, 16 rows x 4 warps x 2 per SM" in text
    assert "row-block GEMM kernels" in text, text


@pytest.mark.parametrize("name", ["reference", "triton"])
def test_eikonal_first_backward_reads_the_saved_forward(name, op_path, monkeypatch):
    """g = dy/dx (create_graph=True) after a forward that saved its pre-activations reads
    them: no second forward (on the H200 the sdf net's forward is 0.6 ms of an 11 ms
    eikonal step at 2^20 rows); the eikonal gradients stay those of float64 eager."""
    be = fm.dispatch.REGISTRY[name]
    if not fm.dispatch.availability(name)[0]:
        pytest.skip(f"{name} not available")
    spec_dt = torch.float32
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = fm.FusedMLP(3, 4, 16, 2, activation="softplus", backend=name, dtype=spec_dt,
                    device=dev)
    x = torch.randn(9, 3, dtype=spec_dt, device=dev, requires_grad=True)
    if be.recomputes(m.spec(spec_dt), x.device):
        pytest.skip(f"{name} saves nothing here: its backward recomputes by design")
    calls = []
    real = type(be).forward
    monkeypatch.setattr(type(be), "forward",
                        lambda self, *a: calls.append(a[-1]) or real(self, *a))
    y = m(x)
    assert calls == [True], calls  # one training forward, saving
    (g,) = torch.autograd.grad(y[:, 0].sum(), x, create_graph=True)
    assert calls == [True], f"the first backward ran the forward again: {calls}"
    loss = (g.norm(dim=-1) - 1).pow(2).mean() + y.abs().mean()
    got = torch.autograd.grad(loss, [x, *m.parameters()])
    seq = m.to_sequential().double().cpu()
    x64 = x.detach().double().cpu().requires_grad_()
    y64 = seq(x64)
    (g64,) = torch.autograd.grad(y64[:, 0].sum(), x64, create_graph=True)
    loss64 = (g64.norm(dim=-1) - 1).pow(2).mean() + y64.abs().mean()
    want = torch.autograd.grad(loss64, [x64, *seq.parameters()])
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a.cpu(), b, tolerance(name, spec_dt), f"eikonal gradient {i}")


def _eikonal_step_grads(net, x, params, loss_on_y=True, retain=False, g_on_thread=False):
    y = net(x)
    out = []
    first = lambda: out.extend(torch.autograd.grad(y[:, 0].sum(), x, create_graph=True))
    if g_on_thread:  # numbers the nodes this backward makes from 0: they run after y's own
        t = threading.Thread(target=first)
        t.start()
        t.join()
    else:
        first()
    (g,) = out
    loss = (g.norm(dim=-1) - 1).pow(2).mean() + 0.1 * g.pow(2).mean()
    if loss_on_y:
        loss = loss + y.abs().mean() + 0.1 * y[:, 1:].pow(2).mean()
    def grads(**kw):  # g alone does not depend on the last bias: its gradient is zero
        got = torch.autograd.grad(loss, [x, *params], allow_unused=True, **kw)
        return [torch.zeros_like(t) if a is None else a for a, t in zip(got, [x, *params])]

    first = grads(retain_graph=retain)
    return (first, grads()) if retain else first


@pytest.mark.parametrize("name", ["reference", "triton", "triton-fused"])
@pytest.mark.parametrize("case", ["y-and-g", "g-alone", "retained",
                                  "y-and-g-mlp-first", "retained-mlp-first"])
@pytest.mark.parametrize("recompute", [True, False], ids=["recompute", "save"])
def test_eikonal_backward_pass_runs_once(name, case, recompute, op_path, monkeypatch):
    """A loss on y and on g = dy/dx (the eikonal step): whichever of InputGrad's node and
    the MLP's own autograd runs first leaves its part of the last pass to the other, which
    runs it once from both gradients, so y's first-order backward calls no backend backward
    (on the CPU InputGrad comes first, unless g's backward ran on another thread: then the
    MLP's node; a GPU's order is its own); with a loss on g alone InputGrad keeps the pass;
    a retained graph's second backward computes the first pass again and gives the same
    gradients. Every gradient against float64 eager."""
    name, variant = (name.split("-") + ["split"])[:2] if name != "reference" else (name, "")
    if not fm.dispatch.availability(name)[0]:
        pytest.skip(f"{name} not available")
    use_second_order_variant(monkeypatch, name, variant)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = fm.FusedMLP(3, 4, 16, 2, activation="softplus", backend=name, dtype=torch.float32,
                    device=dev, recompute=recompute)
    be = fm.dispatch.REGISTRY[name]
    form = second_order.pass_form(be, m.spec(torch.float32), dev)
    assert form is not None
    finishes, backwards = [], []
    real_finish, real_backward = type(form).finish, type(be).backward
    monkeypatch.setattr(type(form), "finish", lambda self, st, gy, needs: (
        finishes.append(gy is not None) or real_finish(self, st, gy, needs)))
    monkeypatch.setattr(type(be), "backward",
                        lambda self, *a: backwards.append(1) or real_backward(self, *a))
    takes, real_take = [], second_order.take_over
    monkeypatch.setattr(second_order, "take_over", lambda *a: (
        lambda r: takes.append("left" if r is second_order.LEFT else r is not None) or r)(
        real_take(*a)))
    mlp_first, case = case.endswith("-mlp-first"), case.removesuffix("-mlp-first")
    x = torch.randn(33, 3, device=dev, requires_grad=True)
    got = _eikonal_step_grads(m, x, list(m.parameters()),
                              case != "g-alone", case == "retained", mlp_first)
    assert not backwards, "y's first-order backward ran a backend backward of its own"
    assert finishes == {"y-and-g": [True], "g-alone": [False],
                        "retained": [True, True]}[case], finishes
    if dev.type == "cpu":
        runs = {"y-and-g": 1, "g-alone": 0, "retained": 2}[case]
        assert takes == ["left" if mlp_first else True] * runs, takes
    seq = m.to_sequential().double().cpu()
    x64 = x.detach().double().cpu().requires_grad_()
    want = _eikonal_step_grads(seq, x64, list(seq.parameters()), case != "g-alone")
    for run in (got if case == "retained" else [got]):
        for i, (a, b) in enumerate(zip(run, want)):
            assert_close(a.cpu(), b, tolerance(name, torch.float32), f"eikonal gradient {i}")
    if case == "retained":
        for a, b in zip(*got):
            assert torch.equal(a, b)


def test_second_order_tuning_spellings():
    """FUSEDMLP_SECOND_ORDER_TUNING's words (Tuning.parse): what each names, and a clear
    error naming a bad one."""
    from fusedmlp_xpu.backends.triton.narrow import second_order as kernel

    assert kernel.Tuning.parse("split") == kernel.SPLIT
    assert kernel.Tuning.parse(" Fused ") == kernel.FUSED
    t = kernel.Tuning.parse("fused64x8")
    assert (t.split, t.fuse, t.block_m, t.warps) == (True, True, 64, 8)
    t = kernel.Tuning.parse("32x4x2m")
    assert (t.split, t.block_m, t.warps, t.per_sm, t.merge_dw) == (False, 32, 4, 2, True)
    for bad in ("fused3x2", "fused64", "fused64x3", "32x4", "splitx"):
        with pytest.raises(ValueError, match=repr(bad)):
            kernel.Tuning.parse(bad)


@pytest.mark.parametrize("name", ["reference", "triton-fused"])
@pytest.mark.parametrize("g_on_thread", [False, True], ids=["input-grad-first", "mlp-first"])
def test_eikonal_two_input_gradients_of_one_y(name, g_on_thread, op_path, monkeypatch):
    """Two input gradients of the same y (two columns), a loss on both and on y: each
    InputGrad node and the MLP node share backward passes; no gradient may be dropped or
    counted twice, in either node order. Against float64 eager."""
    name, variant = (name.split("-") + [""])[:2]
    if not fm.dispatch.availability(name)[0]:
        pytest.skip(f"{name} not available")
    use_second_order_variant(monkeypatch, name, variant)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = fm.FusedMLP(3, 4, 16, 2, activation="tanh", backend=name, dtype=torch.float32,
                    device=dev)
    x = torch.randn(29, 3, device=dev, requires_grad=True)

    def step(net, x, params):
        y = net(x)
        out = []
        first = lambda: out.extend(  # noqa: E731
            torch.autograd.grad(y[:, c].sum(), x, create_graph=True)[0] for c in (0, 3))
        if g_on_thread:
            t = threading.Thread(target=first)
            t.start()
            t.join()
        else:
            first()
        g0, g3 = out
        loss = (g0.norm(dim=-1) - 1).pow(2).mean() + 0.3 * g3.pow(2).mean() + y.pow(2).mean()
        return torch.autograd.grad(loss, [x, *params])

    got = step(m, x, list(m.parameters()))
    seq = m.to_sequential().double().cpu()
    x64 = x.detach().double().cpu().requires_grad_()
    want = step(seq, x64, list(seq.parameters()))
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(a.cpu(), b, tolerance(name, torch.float32), f"gradient {i}")
