"""The dispatcher's choices and explanations."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch


def test_backends_table_lists_reference():
    table = {b.name: b for b in fm.backends()}
    assert table["reference"].available and table["reference"].reason
    for b in table.values():
        assert isinstance(b.available, bool) and b.reason


def test_cpu_picks_reference_and_explains():
    m = fm.FusedMLP(16, 8, 32, 2)
    ex = fm.explain(m, torch.randn(2, 16))
    assert ex.backend == "reference"
    text = str(ex)
    assert "chosen: reference" in text
    for b in fm.backends():
        assert b.name in text  # every known backend is listed with its reason


def test_order_per_device_type():
    assert dispatch.ORDER["cuda"][-1] == "reference" and dispatch.ORDER["xpu"][-1] == "reference"
    assert dispatch.ORDER["cuda"].index("cuda") < dispatch.ORDER["cuda"].index("triton")
    assert dispatch.ORDER["xpu"].index("sycl") < dispatch.ORDER["xpu"].index("triton")


def test_decisions_are_cached():
    spec = fm.MLPSpec((16, 16), dtype=torch.float32)
    dispatch._decisions.clear()
    a = dispatch.choose(torch.device("cpu"), spec)
    assert len(dispatch._decisions) == 1
    assert dispatch.choose(torch.device("cpu"), spec) is a and len(dispatch._decisions) == 1


def test_envvars_reads_what_os_environ_holds(monkeypatch):
    """The per-call environment reads (envvars.get) see every change at once, set or
    unset, with os.environ.get's defaults."""
    from fusedmlp_xpu import envvars

    name = "FUSEDMLP_TEST_SWITCH"
    monkeypatch.delenv(name, raising=False)
    assert envvars.get(name) is None and envvars.get(name, "1") == "1"
    for value in ("0", "", "triton", "é"):
        monkeypatch.setenv(name, value)
        assert envvars.get(name) == os.environ.get(name) == value
    monkeypatch.delenv(name)
    assert envvars.get(name, "x") == "x"


def _fake_backend(rows, infer_rows=()):
    """A backend that wins the CPU dispatch, names the row ranges ``rows`` (training) and
    ``infer_rows`` (no-grad) for torch ops, and records each forward (it computes nothing
    right: it must not be what runs)."""
    from fusedmlp_xpu.backends import Backend

    class Fake(Backend):
        name = "fake-rows"
        device_types = ("cpu",)
        calls: list = []

        def available(self):
            return True, "test backend"

        def supports(self, spec, device):
            return True, "everything"

        def forward(self, x, weights, biases, spec, save):
            self.calls.append(("forward", x.shape[0], save))
            y = x.new_full((x.shape[0], spec.out_features), float("nan"))
            return y, (x.new_zeros(x.shape[0], sum(spec.widths[1:-1])) if save else None)

        def backward(self, grad_y, x, weights, biases, saved, spec, needs):
            self.calls.append(("backward", x.shape[0]))
            return (None, [torch.zeros_like(w) for w in weights],
                    [torch.zeros_like(b) for b in biases or ()])

        def torch_rows(self, spec, device, train):
            return rows if train else infer_rows

    return Fake()


def _params(requires_grad=True):
    """8 -> 32 -> 4 weights and biases, float64, seeded."""
    torch.manual_seed(0)
    ts = [torch.randn(32, 8), torch.randn(4, 32), torch.randn(32), torch.randn(4)]
    ts = [t.double().requires_grad_(requires_grad) for t in ts]
    return ts[:2], ts[2:]


def _first_on_cpu(monkeypatch, be):
    """Make ``be`` the CPU's first choice (no forced backend, fresh decisions)."""
    monkeypatch.setitem(dispatch.REGISTRY, be.name, be)
    monkeypatch.setitem(dispatch.ORDER, "cpu", (be.name, "reference"))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    dispatch._decisions.clear()


def test_small_training_calls_record_torch_autograd(monkeypatch):
    """Plain eager training calls within the backend's torch_rows run as the reference's torch
    ops under torch's autograd (right values and gradients, the backend untouched); more
    rows, no-grad calls and a forced backend go to the backend itself."""
    from fusedmlp_xpu.backends.reference import ReferenceBackend

    be = _fake_backend(((1, 16),))
    _first_on_cpu(monkeypatch, be)
    try:
        ws, bs = _params()
        for rows in (1, 16):
            x = torch.randn(rows, 8, dtype=torch.float64, requires_grad=True)
            y = fm.fused_mlp(x, ws, bs, "gelu_tanh")
            assert y.grad_fn is not None and "EagerMLP" not in type(y.grad_fn).__name__
            ref, _ = ReferenceBackend().forward(x, ws, bs, y_spec(ws, bs), False)
            torch.testing.assert_close(y, ref)
            g = torch.autograd.grad(y, [x, *ws, *bs], torch.ones_like(y))
            r = torch.autograd.grad(ref, [x, *ws, *bs], torch.ones_like(y))
            for a, b in zip(g, r):
                torch.testing.assert_close(a, b)
        assert be.calls == []
        x = torch.randn(3, 2, 8, dtype=torch.float64, requires_grad=True)  # 6 rows, 3-D
        assert "EagerMLP" not in type(fm.fused_mlp(x, ws, bs).grad_fn).__name__
        assert be.calls == []
        for x, kw, want in ((torch.randn(17, 8, dtype=torch.float64, requires_grad=True), {},
                             ("forward", 17, True)),
                            (torch.randn(4, 8, dtype=torch.float64, requires_grad=True),
                             {"backend": be.name}, ("forward", 4, True))):
            be.calls.clear()
            fm.fused_mlp(x, ws, bs, **kw).sum().backward()
            assert be.calls == [want, ("backward", want[1])], be.calls
        be.calls.clear()
        with torch.no_grad():
            fm.fused_mlp(torch.randn(4, 8, dtype=torch.float64), ws, bs)
        assert be.calls == [("forward", 4, False)]
        be.calls.clear()
        monkeypatch.setenv(dispatch.ENV_VAR, be.name)  # forced through the environment
        fm.fused_mlp(torch.randn(4, 8, dtype=torch.float64, requires_grad=True), ws, bs)
        assert be.calls == [("forward", 4, True)]
    finally:
        dispatch._decisions.clear()


def test_no_grad_calls_in_the_backends_ranges_run_torch_ops(monkeypatch):
    """No-grad calls whose row count lies in the backend's inference ranges run as the
    reference's torch ops (right values, the backend untouched); rows outside them, and a
    forced backend, run the backend; explain().route says which, row count by row count."""
    from fusedmlp_xpu.backends.reference import ReferenceBackend

    be = _fake_backend((), ((4, 8), (32, 32)))
    _first_on_cpu(monkeypatch, be)
    try:
        ws, bs = _params(requires_grad=False)
        spec = y_spec(ws, bs)
        ex = fm.explain(spec, torch.empty(1, 8, dtype=torch.float64))
        for rows, torch_ops in ((3, False), (4, True), (8, True), (9, False), (32, True)):
            be.calls.clear()
            x = torch.randn(rows, 8, dtype=torch.float64)
            with torch.no_grad():
                y = fm.fused_mlp(x, ws, bs, "gelu_tanh")
            route = ex.route(x)
            assert route.startswith(f"{rows} rows, inference: ")
            if torch_ops:
                assert be.calls == [] and "torch ops" in route, (rows, be.calls, route)
                torch.testing.assert_close(y, ReferenceBackend().forward(x, ws, bs, spec,
                                                                         False)[0])
            else:
                assert be.calls == [("forward", rows, False)] and "fake-rows kernels" in route
        assert "training: the fake-rows kernels" in ex.route(4, train=True)
        be.calls.clear()
        with torch.no_grad():  # forced: the backend's own kernels at every row count
            fm.fused_mlp(torch.randn(4, 8, dtype=torch.float64), ws, bs, backend=be.name)
        assert be.calls == [("forward", 4, False)]
        forced = fm.explain(spec, torch.empty(1, 8, dtype=torch.float64), backend=be.name)
        assert "fake-rows kernels" in forced.route(4)
        with pytest.raises(TypeError, match="x: expected a tensor or a row count"):
            ex.route("4")
    finally:
        dispatch._decisions.clear()


def test_inference_only_backend_never_takes_a_training_call(monkeypatch):
    """A backend that does not train (Backend.trains False) runs no-grad calls; every call
    autograd will differentiate, the ops' training forward and backward, and the eikonal
    node go to the next backend, with right gradients; forced, a training call is an
    error naming why; explain(train=True) says which backend trains."""
    from fusedmlp_xpu.backends.reference import ReferenceBackend

    be = _fake_backend(())
    be.trains = False
    _first_on_cpu(monkeypatch, be)
    try:
        ws, bs = _params()
        spec = y_spec(ws, bs)
        with torch.no_grad():
            fm.fused_mlp(torch.randn(4, 8, dtype=torch.float64), ws, bs, "gelu_tanh")
        assert be.calls == [("forward", 4, False)]
        be.calls.clear()
        ref = ReferenceBackend()
        for recompute in (None, True, False):
            x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
            y = fm.fused_mlp(x, ws, bs, "gelu_tanh", recompute=recompute)
            g = torch.autograd.grad(y, [x, *ws, *bs], torch.ones_like(y))
            want = ref.forward(x, ws, bs, spec, False)[0]
            r = torch.autograd.grad(want, [x, *ws, *bs], torch.ones_like(want))
            torch.testing.assert_close(y, want)
            for a, b in zip(g, r):
                torch.testing.assert_close(a, b)
        x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)  # eikonal
        y = fm.fused_mlp(x, ws, bs, "gelu_tanh")
        (gx,) = torch.autograd.grad(y.sum(), x, create_graph=True)
        gx.square().sum().backward()
        assert be.calls == []
        x = torch.randn(1, 8, dtype=torch.float64)
        assert fm.explain(spec, x).backend == be.name
        ex = fm.explain(spec, x, train=True)
        assert ex.backend == "reference" and "for training" in str(ex)
        assert "inference only" in ex.considered[0].reason
        with pytest.raises(fm.BackendUnavailableError, match="inference only"):
            fm.fused_mlp(x.requires_grad_(), ws, bs, "gelu_tanh", backend=be.name)
        with pytest.raises(TypeError, match="train: expected a bool"):
            fm.explain(spec, x, train="yes")
    finally:
        dispatch._decisions.clear()


def y_spec(ws, bs):
    return fm.MLPSpec((ws[0].shape[1], ws[0].shape[0], ws[1].shape[0]), "gelu_tanh",
                      "none", True, torch.float64)


def test_wide_routes_name_their_ranges(monkeypatch):
    """backends/triton/routes.py: the ranges read back as words for explain(); a rule's
    work bounds (rows x d x hidden) cut its rows per layer size; a device with no rule (the
    CPU) runs the kernels at every row count."""
    from fusedmlp_xpu.backends.triton import routes

    assert routes.describe(((1, 4096),)) == "1-4096 rows"
    assert routes.describe(((128, 2048), (16384, 16384))) == "128-2048 and 16384 rows"
    assert routes.describe(((1, 1), (8, 9), (64, 64))) == "1, 8-9 and 64 rows"
    cpu = torch.device("cpu")
    for gated in (False, True):
        for train in (False, True):
            assert routes.torch_rows(cpu, gated, train, 2048, 5632) == ()
    rules = (routes.Rule(True, False, ((1, 2048),), "a.json", min_work=1e6),
             routes.Rule(False, False, ((1, 2048),), "b.json", max_work=1e6),
             routes.Rule(False, True, ((1, 64), (100, 200)), "c.json"))
    monkeypatch.setattr(routes, "_rules", lambda device: rules)
    monkeypatch.setattr(routes, "_cache", {})
    assert routes.torch_rows(cpu, True, False, 100, 100) == ((100, 2048),)  # >= 1e6 of work
    assert routes.torch_rows(cpu, True, False, 1000, 1000) == ((1, 2048),)
    assert routes.torch_rows(cpu, True, False, 1, 1) == ()  # 2048 rows: 2e3 of work
    assert routes.torch_rows(cpu, False, False, 100, 100) == ((1, 99),)  # < 1e6
    assert routes.torch_rows(cpu, False, False, 1000, 1000) == ()
    assert routes.torch_rows(cpu, False, True, 8, 8) == ((1, 64), (100, 200))
    assert routes.describe_rules(cpu, True, False) == \
        "1-2048 rows where rows x d x hidden >= 1e+06"
    assert routes.describe_rules(cpu, True, True) == ""
    from fusedmlp_xpu.bench import results as tables

    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    runs = {r["run"] for t in results.glob("*.jsonl") for r in tables.read(str(t))}
    for rules in routes.CUDA_RULES.values():  # every rule names its committed measurement
        assert all(r.rows and Path(r.source).stem in runs for r in rules), rules
        assert all(1 <= lo <= hi for r in rules for lo, hi in r.rows)


def test_gated_inference_route_at_512_rows_is_the_measured_pair_only(monkeypatch):
    """The H100 sweep's one gated inference case below 0.98x eager (2048/5632 at 512 rows)
    runs as torch ops on sm_90; its neighbours the kernels won (2048/8192 at 512 rows,
    4096/11008 at 128) keep the kernels."""
    from fusedmlp_xpu.backends.triton import routes

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(routes, "_cache", {})
    dev = torch.device("cuda", 0)

    def routed(d, hidden, rows):
        return any(lo <= rows <= hi for lo, hi in routes.torch_rows(dev, True, False, d, hidden))

    assert routed(2048, 5632, 512)
    assert not routed(2048, 8192, 512) and not routed(4096, 11008, 128)
    assert not routed(2048, 5632, 256)
    assert routed(4096, 14336, 256)  # the 1e10 rule, unchanged
