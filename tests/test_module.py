"""FusedMLP, from_sequential, state_dict compatibility and fuse_mlps."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fusedmlp_xpu as fm

from fusedmlp_xpu.backends.reference import ReferenceBackend

from conftest import assert_close, reference, tolerance
from fusedmlp_xpu.backends.triton.narrow import operands as n_operands


def test_layer_count_and_layout():
    m = fm.FusedMLP(in_features=64, out_features=16, hidden_features=32, hidden_layers=4)
    assert m.widths == (64, 32, 32, 32, 32, 16)
    assert [tuple(w.shape) for w in m.weights()] == [(32, 64), (32, 32), (32, 32), (32, 32), (16, 32)]
    assert len(fm.FusedMLP(8, 4, 16, 0).weights()) == 1


def test_matches_reference(backend):
    name, dev = backend
    m = fm.FusedMLP(24, 10, 48, 3, "softplus", "sigmoid", device=dev, backend=name)
    x = torch.randn(3, 41, 24, device=dev)
    assert_close(m(x), reference(x, m.weights(), m.biases(), "softplus", "sigmoid"),
                 tolerance(name, torch.float32))


def _seq():
    return nn.Sequential(nn.Linear(12, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 32),
                         nn.GELU(approximate="tanh"), nn.Linear(32, 5), nn.Sigmoid())


def test_from_sequential_same_values_and_state_dict():
    seq = _seq()
    m = fm.FusedMLP.from_sequential(seq)
    assert (m.activation, m.output_activation) == ("gelu_tanh", "sigmoid")
    assert m.state_dict().keys() == seq.state_dict().keys()
    for k, v in seq.state_dict().items():
        assert torch.equal(m.state_dict()[k], v)
    x = torch.randn(9, 12)
    torch.testing.assert_close(m(x), seq(x))
    # and back: a FusedMLP's state_dict loads into the Sequential it replaces
    m2 = fm.FusedMLP.from_sequential(_seq())
    seq.load_state_dict(m2.state_dict())
    torch.testing.assert_close(seq(x), m2(x))
    torch.testing.assert_close(m2.to_sequential()(x), m2(x))


@pytest.mark.parametrize("seq, why", [
    (nn.Sequential(nn.Linear(4, 4), nn.Dropout(), nn.Linear(4, 4)), "Dropout"),
    (nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)),
     "hidden activations differ"),
    (nn.Sequential(nn.Linear(4, 4), nn.LeakyReLU(0.2), nn.Linear(4, 2)), "LeakyReLU"),
    (nn.Sequential(nn.Linear(4, 4, bias=False), nn.ReLU(), nn.Linear(4, 2)), "bias"),
    (nn.Sequential(nn.ReLU(), nn.Linear(4, 2)), "first module"),
])
def test_from_sequential_rejects(seq, why):
    with pytest.raises(ValueError, match=why):
        fm.FusedMLP.from_sequential(seq)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 32), nn.SiLU(),
                                     nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)
        self.heads = nn.ModuleList([
            nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4), nn.Softplus()),
            nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.25), nn.Linear(16, 4)),  # not fusable
        ])
        self.tail = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)),
                                  nn.BatchNorm1d(8))

    def forward(self, x):
        h = self.norm(self.encoder(x))
        return torch.cat([head(h) for head in self.heads], -1)


def test_fuse_mlps_keeps_outputs_and_gradients():
    torch.manual_seed(0)
    model = Model()
    fused = Model()
    fused.load_state_dict(model.state_dict())
    out = fm.fuse_mlps(fused)
    assert out is fused
    assert isinstance(fused.encoder, fm.FusedMLP) and isinstance(fused.heads[0], fm.FusedMLP)
    assert isinstance(fused.heads[1], nn.Sequential)  # Dropout(p>0): left alone
    assert isinstance(fused.tail, nn.Sequential) and isinstance(fused.tail[0], fm.FusedMLP)
    assert fused.state_dict().keys() == model.state_dict().keys()
    model.eval(), fused.eval()  # the dropout left in place: same (no) mask in both
    x = torch.randn(20, 8)
    torch.testing.assert_close(fused(x), model(x))
    model(x).square().sum().backward()
    fused(x).square().sum().backward()
    for (n, p), (_, q) in zip(model.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=n)


def test_fuse_mlps_root_sequential():
    seq = _seq()
    assert isinstance(fm.fuse_mlps(seq), fm.FusedMLP)


def test_spec_hash_and_pickle():
    """Specs key the per-call caches: equal specs hash equal, also after a pickle round trip."""
    import pickle

    a = fm.MLPSpec((16, 32, 8), "relu", "none", True, torch.float16)
    b = fm.MLPSpec((16, 32, 8), "relu", "none", True, torch.float16)
    c = pickle.loads(pickle.dumps(a))
    assert a == b == c and hash(a) == hash(b) == hash(c)
    assert a != fm.MLPSpec((16, 32, 8), "relu", "none", True, torch.float32)
    assert len({a, b, c}) == 1


def _back_to_back(ts) -> bool:
    step = ts[0].numel() * ts[0].element_size()
    return all(t.is_contiguous() and t.data_ptr() == ts[0].data_ptr() + i * step
               for i, t in enumerate(ts))


def test_hidden_layers_kept_back_to_back():
    """The hidden weights and biases share one buffer each (the fused kernel reads them in
    place) through construction, dtype moves, deepcopy and in-place optimizer steps; the
    parameters stay the same objects."""
    import copy

    m = fm.FusedMLP(16, 8, 32, 4)
    params = list(m.parameters())
    for step in ("init", "double", "deepcopy", "optimizer", "share_memory"):
        if step == "double":
            m = m.double()
        elif step == "deepcopy":
            m = copy.deepcopy(m)
            params = list(m.parameters())
        elif step == "optimizer":
            opt = torch.optim.Adam(m.parameters())
            m(torch.randn(5, 16, dtype=torch.float64)).sum().backward()
            opt.step()
        elif step == "share_memory":
            m.share_memory()
            assert all(p.is_shared() for p in m.parameters())
        assert list(m.parameters()) == params, step
        assert _back_to_back(m.weights()[1:-1]), step
        assert _back_to_back(m.biases()[1:-1]), step


def test_hidden_layers_not_back_to_back_still_right(backend):
    """Weights re-assigned into separate tensors (load_state_dict(assign=True)): the
    backend stacks a copy and the result is still right."""
    name, dev = backend
    m = fm.FusedMLP(16, 8, 32, 3, activation="silu", device=dev, backend=name)
    # each tensor in the back half of its own buffer: a gap before it, whatever the
    # allocator does (CUDA's caching allocator can place separate clones back to back)
    sd = {}
    for k, v in m.state_dict().items():
        buf = torch.empty(2 * v.numel(), device=dev, dtype=v.dtype)
        sd[k] = buf[v.numel():].view(v.shape).copy_(v + 0.01)
    m.load_state_dict(sd, assign=True)
    assert not _back_to_back(m.weights()[1:-1])
    x = torch.randn(37, 16, device=dev)
    with torch.no_grad():
        y = m(x)
    assert_close(y, reference(x, m.weights(), m.biases(), "silu", "none"),
                 tolerance(name, torch.float32))


def test_stacked_reads_in_place_only_when_back_to_back():
    buf = torch.randn(3, 4, 4)
    ws = list(buf)
    assert n_operands._stacked(ws) is ws[0]
    apart = [torch.randn(4, 4) for _ in range(3)]
    out = n_operands._stacked(apart)
    assert out.shape == (3, 4, 4) and torch.equal(out, torch.stack(apart))
    assert not n_operands._stacked([ws[0], ws[2], ws[1]]).data_ptr() == ws[0].data_ptr()
    strided = list(torch.randn(3, 4, 8)[:, :, ::2])
    assert n_operands._stacked(strided).is_contiguous()


def test_one_layer_in_another_dtype_is_an_error(backend):
    """A module with one Linear moved alone to another dtype: a clear error naming the
    parameter on every backend, never a silently mixed computation."""
    name, dev = backend
    m = fm.FusedMLP(16, 8, 32, 3, device=dev, backend=name)
    m.linears[2].double()
    with pytest.raises(TypeError, match=r"weights\[2\]"):
        m(torch.randn(5, 16, device=dev))



class _BindingBackend(ReferenceBackend):
    """The reference backend with a bound forward that runs with the parameters it was
    bound to: a bound call that missed a change would compute with stale weights."""

    name = "binding"

    def __init__(self):
        self.binds, self.runs = [], 0

    def bind_forward(self, spec, device, weights, biases):
        self.binds.append([w.data_ptr() for w in weights])
        # views of the memory bound to (as a kernel reading addresses would): in-place
        # changes show, a re-pointed or replaced parameter does not unless rebound
        weights = [w.detach() for w in weights]
        biases = None if biases is None else [b.detach() for b in biases]

        def run(x):
            self.runs += 1
            return ReferenceBackend.forward(self, x, weights, biases, spec, False)[0]
        return run


@pytest.fixture
def binding(monkeypatch):
    be = _BindingBackend()
    fm.dispatch.register(be)
    monkeypatch.setitem(fm.dispatch.ORDER, "cpu", ("binding", "reference"))
    yield be
    del fm.dispatch.REGISTRY["binding"]
    fm.dispatch.register(fm.dispatch.REGISTRY["reference"])  # void every binding choice


def test_bound_calls_follow_every_change(binding, monkeypatch):
    """No-grad eager calls run the backend's bound forward; every change it relies on
    (parameters replaced or re-pointed, the backend, the environment, autocast, grad
    mode, the registry, the fast-path switch, x's shape) is noticed, never computed with
    stale parameters: each result against the float64 reference of the current ones."""
    torch.manual_seed(0)
    m = fm.FusedMLP(12, 5, 16, 3, "tanh", bias=True)
    x = torch.randn(7, 12)

    def check(expect_bound, y=None, what=""):
        runs = binding.runs
        with torch.no_grad():
            out = m(x) if y is None else y()
        assert (binding.runs > runs) == expect_bound, what
        assert_close(out, reference(x, m.weights(), m.biases(), "tanh", "none"),
                     tolerance("reference", torch.float32), what)

    check(True, what="first call binds")
    check(True, what="bound")
    assert len(binding.binds) == 1
    with torch.no_grad():
        m.linears[1].weight.data = torch.randn(16, 16)  # re-pointed (and unpacked)
    check(True, what=".data re-pointed")
    assert len(binding.binds) == 2 and binding.binds[-1][1] == m.linears[1].weight.data_ptr()
    sd = {k: torch.randn_like(v) for k, v in m.state_dict().items()}
    m.load_state_dict(sd, assign=True)  # new Parameter objects
    check(True, what="load_state_dict(assign=True)")
    assert len(binding.binds) == 3
    with torch.no_grad():
        m.linears[0].bias.mul_(2)  # in place: the same memory, no new binding needed
    check(True, what="bias changed in place")
    assert len(binding.binds) == 3
    m.backend = "reference"
    check(False, what="backend changed")
    m.backend = None
    monkeypatch.setenv("FUSEDMLP_BACKEND", "reference")
    check(False, what="FUSEDMLP_BACKEND set")
    monkeypatch.delenv("FUSEDMLP_BACKEND")
    check(True, what="FUSEDMLP_BACKEND unset")
    runs = binding.runs
    y = m(x)  # grad enabled, parameters require grad: the autograd path
    assert binding.runs == runs and y.requires_grad
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.no_grad():
            assert m(x).dtype == torch.bfloat16 and binding.runs == runs
    monkeypatch.setattr(fm.op, "EAGER_FAST_PATH", False)
    check(False, what="fast path off")
    monkeypatch.setattr(fm.op, "EAGER_FAST_PATH", True)
    x3 = torch.randn(2, 3, 12)
    with torch.no_grad():
        y3 = m(x3)
    assert binding.runs == runs and y3.shape == (2, 3, 5)
    c = copy.deepcopy(m)
    assert c._bound is None
    with torch.no_grad():
        assert torch.equal(c(x), m(x))


def test_bound_calls_unbind_when_a_linear_is_replaced(monkeypatch):
    """A FusedMLP's bound no-grad calls (module.py, _BoundForward) hold the Linears'
    parameters: replacing a Linear by another module (an adapter) unbinds, so the call
    reports the wrapper instead of running the old weights. A stub backend that binds
    stands in for the GPU kernels."""
    from fusedmlp_xpu import dispatch

    class Binds(ReferenceBackend):
        name = "binds"
        runs = 0

        def bind_forward(self, spec, device, weights, biases):
            def run(x):
                Binds.runs += 1
                return self.forward(x, weights, biases, spec, False)[0]
            return run

    monkeypatch.setitem(dispatch.REGISTRY, "binds", Binds())
    monkeypatch.setitem(dispatch.ORDER, "cpu", ("binds", "reference"))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "_decisions", {})
    m = fm.FusedMLP(8, 4, 16, 1).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        m(x), m(x)
        assert Binds.runs == 2 and m._bound is not None

        class Adapter(nn.Module):  # a LoRA-like wrapper around the original Linear
            def __init__(self, base):
                super().__init__()
                self.base = base

            def forward(self, t):
                return 2 * self.base(t)

        name = m._names[0]
        m._modules[name] = Adapter(m._modules[name])
        with pytest.raises(TypeError, match=rf"FusedMLP\.{name}: expected the nn.Linear"):
            m(x)
        assert Binds.runs == 2 and m._bound is None


def _assert_eager_grads(m, seq, x, gy):
    """m's train call on x with grad_y ``gy`` gives x and every parameter exactly the
    gradients its nn.Sequential ``seq`` gives."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    m.zero_grad()
    seq.zero_grad()
    m(x1).backward(gy)
    seq(x2).backward(gy)
    assert torch.equal(x1.grad, x2.grad)
    for p, q in zip(m.parameters(), seq.parameters()):
        assert torch.equal(p.grad, q.grad)


def _routes_backend(monkeypatch, infer, train):
    """A stub backend, first on CPU, that runs plain eager calls of the ``infer`` /
    ``train`` row ranges as torch ops (Backend.torch_rows) and counts the calls of its
    own forward (its kernels, standing in for the GPU's): the class."""
    from fusedmlp_xpu import dispatch

    class Routes(ReferenceBackend):
        name = "routes"
        kernel_calls = 0

        def torch_rows(self, spec, device, train_):
            return train if train_ else infer

        def forward(self, x, weights, biases, spec, save):
            Routes.kernel_calls += 1
            return super().forward(x, weights, biases, spec, save)

    monkeypatch.setitem(dispatch.REGISTRY, "routes", Routes())
    monkeypatch.setitem(dispatch.ORDER, "cpu", ("routes", "reference"))
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "_decisions", {})
    return Routes


def test_routed_train_calls_bind_to_torch_ops(monkeypatch):
    """Grad-mode calls of the row counts a backend trains as torch ops bind to those ops
    (module._bind_train): eager's autograd graph, so the same gradients as the
    nn.Sequential's, into the module's own parameters; other row counts, calls needing no
    gradient, recompute=True and a replaced parameter take the full path (or bind again).
    A stub backend with training routes and counting kernel paths stands in for the
    GPU's."""
    Routes = _routes_backend(monkeypatch, infer=(), train=((1, 4),))
    m = fm.FusedMLP(8, 4, 16, 1, activation="gelu")
    seq = m.to_sequential()
    for rows in (3, 1, 4):  # routed: torch ops, eager's gradients exactly
        _assert_eager_grads(m, seq, torch.randn(rows, 8), torch.randn(rows, 4))
    assert Routes.kernel_calls == 0 and m._bound_train is not None and m._bound is None
    bound = m._bound_train
    m(torch.randn(7, 8, requires_grad=True)).sum().backward()  # not routed: the kernels
    assert Routes.kernel_calls == 1 and m._bound_train is bound
    for p in m.parameters():
        p.requires_grad_(False)
    m(torch.randn(2, 8))  # nothing needs a gradient: the full path's no-grad choice
    assert Routes.kernel_calls == 2
    for p in m.parameters():
        p.requires_grad_(True)
    m.linears[0].weight = nn.Parameter(torch.zeros_like(m.linears[0].weight))
    x = torch.randn(2, 8, requires_grad=True)
    m(x).sum().backward()  # a new parameter: bound again, to it; its gradient lands
    assert m._bound_train is not bound and m._bound_train is not None
    assert m.linears[0].weight.grad is not None
    m.recompute = True  # the op's node (it recomputes); never the torch ops' graph
    calls = Routes.kernel_calls
    m(torch.randn(2, 8, requires_grad=True)).sum().backward()
    assert Routes.kernel_calls > calls


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_routed_train_calls_on_cuda_match_eager(dtype):
    """On a GPU with the real routes (backends/triton/routes.py: wide train calls of
    1-4096 rows run as torch ops): the bound train call's gradients are eager's exactly
    (the same ops), and the binding is taken and kept."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    m = fm.FusedMLP(512, 512, 2048, 1, activation="gelu", device=dev, dtype=dtype)
    seq = m.to_sequential()
    for rows in (16, 512, 16):
        x = torch.randn(rows, 512, device=dev, dtype=dtype)
        _assert_eager_grads(m, seq, x, torch.randn(rows, 512, device=dev, dtype=dtype))
    assert m._bound_train is not None, fm.explain(m, x).route(x, train=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_training_records_torchs_graph(dtype):
    """On the CPU an unforced FusedMLP trains through torch's own autograd graph of the
    reference's ops (ReferenceBackend.torch_rows; benchmarks/cpu_eager.py measured the
    op's node slower there): its gradients and an eikonal double backward are
    nn.Sequential's bit for bit, and explain's route says so. Forced to the reference,
    or with recompute=True, the op's own node runs."""
    torch.manual_seed(0)
    kw = dict(activation="softplus", output_activation="tanh", dtype=dtype)
    m = fm.FusedMLP(8, 4, 16, 2, **kw)
    seq = m.to_sequential()
    x = torch.randn(33, 8, dtype=dtype)
    for _ in range(2):  # the full path, then the bound one (module._bind_train)
        _assert_eager_grads(m, seq, x, torch.randn(33, 4, dtype=dtype))
    assert m._bound_train is not None
    assert "torch's own autograd graph" in fm.explain(m, x).route(x, train=True)

    def eikonal(net):
        net.zero_grad()
        xx = x.clone().requires_grad_()
        y = net(xx)
        g, = torch.autograd.grad(y[:, 0].sum(), xx, create_graph=True)
        (y.square().mean() + g.square().sum()).backward()
        return [xx.grad] + [p.grad for p in net.parameters()]
    for a, b in zip(eikonal(m), eikonal(seq)):
        assert torch.equal(a, b)
    forced = fm.FusedMLP(8, 4, 16, 2, **kw, backend="reference")
    recomputing = fm.FusedMLP(8, 4, 16, 2, **kw, recompute=True)
    for node in (forced, recomputing):
        y = node(x.clone().requires_grad_())
        assert type(y.grad_fn).__name__ == "_EagerMLPBackward", y.grad_fn
    assert fm.explain(forced, x).route(x, train=True).endswith("the reference's torch ops")


def test_routed_rows_bind_to_torch_ops(monkeypatch):
    """No-grad calls of the row counts a backend runs as torch ops (Backend.torch_rows:
    the wide layers' small calls on CUDA) bind to those ops (module._routed_forward): the
    same result as the full path, none of its per-call questions; other row counts, a
    replaced parameter and a forced backend take the full path. A stub backend with
    routes and a counting kernel path stands in for the GPU's."""
    Routes = _routes_backend(monkeypatch, infer=((1, 4), (10, 12)), train=((1, 4), (10, 12)))
    m = fm.FusedMLP(8, 4, 16, 1, activation="gelu_tanh").eval()
    seq = m.to_sequential()
    with torch.no_grad():
        for rows in (3, 11, 4, 1):  # routed: torch ops, never the backend's forward
            x = torch.randn(rows, 8)
            assert torch.allclose(m(x), seq(x), rtol=0, atol=1e-6)
        assert Routes.kernel_calls == 0 and m._bound is not None
        bound = m._bound
        x = torch.randn(7, 8)  # not routed: the backend's forward, the binding kept
        assert torch.allclose(m(x), seq(x), rtol=0, atol=1e-6)
        assert Routes.kernel_calls == 1 and m._bound is bound
        m.linears[0].weight = nn.Parameter(torch.zeros_like(m.linears[0].weight))
        x = torch.randn(2, 8)  # a new parameter: bound again, to it
        assert torch.allclose(m(x), m.to_sequential()(x), rtol=0, atol=1e-6)
        assert m._bound is not bound and m._bound is not None
        f = fm.FusedMLP(8, 4, 16, 1, backend="routes").eval()
        f(x)  # a forced backend runs its kernels at every row count
        assert Routes.kernel_calls == 2 and f._bound is None
