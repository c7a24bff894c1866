"""Gated MLPs: fusedmlp::gated_mlp ops, fused_gated_mlp, GatedMLP, fuse_gated_mlps.

Every implementation that can run here (the reference on each device; the Triton wide
kernels on cuda/xpu, and on the CPU under TRITON_INTERPRET=1 at small shapes) against a
float64 CPU reference computed with torch autograd."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations, gated

from conftest import GRAD_VS_EAGER, TOLERANCE, assert_close, devices, rel_error


def _impls():
    pairs = [("reference", d) for d in devices()]
    for d in devices():
        if gated._triton_usable(d, forced=True)[0]:
            pairs.append(("triton", d))
    return pairs


IMPLS = _impls()



@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    """Correctness, not speed: one config per kernel, no timing runs on a GPU."""
    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")


@pytest.fixture(params=IMPLS, ids=[f"{n}-{d.type}" for n, d in IMPLS])
def impl(request):
    return request.param


def make(d, hidden, d_out, bias, dtype, device, requires_grad=True, noncontig=False):
    """Fresh weights like nn.Linear's init (U(+-1/sqrt(fan_in))) and biases, or None.
    ``noncontig``: weights as transposed views, biases as stride-2 slices."""
    def u(*shape, fan_in):
        t = ((torch.rand(*shape, dtype=torch.float64) * 2 - 1) * fan_in ** -0.5).to(device, dtype)
        if noncontig:
            t = t.t().contiguous().t() if t.dim() == 2 else torch.stack([t, t], dim=1)[:, 0]
            assert not t.is_contiguous()
        return t.requires_grad_(requires_grad)

    ws = [u(hidden, d, fan_in=d), u(hidden, d, fan_in=d), u(d_out, hidden, fan_in=hidden)]
    bs = [u(hidden, fan_in=d), u(hidden, fan_in=d), u(d_out, fan_in=hidden)] if bias else None
    return ws, bs


def gated_reference(x, ws, bs, act, grad_y=None, dtype=torch.float64, device="cpu"):
    """down(act(gate(x)) * up(x)) by torch autograd in ``dtype`` (float64: the ground
    truth); returns y, or (y, [grad x, grad weights..., grad biases...])."""
    def leaf(t):
        return t.detach().to(device, dtype).requires_grad_(grad_y is not None)

    x_, w_ = leaf(x), [leaf(w) for w in ws]
    b_ = [leaf(b) for b in bs] if bs is not None else [None] * 3
    fn = activations.get(act).fn
    y = F.linear(fn(F.linear(x_, w_[0], b_[0])) * F.linear(x_, w_[1], b_[1]), w_[2], b_[2])
    if grad_y is None:
        return y.detach()
    inputs = [x_, *w_, *(b_ if bs is not None else [])]
    return y.detach(), list(torch.autograd.grad(y, inputs, leaf(grad_y).detach()))


def run(impl, act="silu", dtype=torch.float32, lead=(37,), dims=(24, 40, 20), bias=False,
        recompute=False, strided=False, noncontig=False):
    """fused_gated_mlp forced to ``impl`` on fresh data: output and every gradient."""
    name, dev = impl
    d, hidden, d_out = dims
    ws, bs = make(d, hidden, d_out, bias, dtype, dev, noncontig=noncontig)
    if strided:
        x = torch.randn(*lead, 2 * d, device=dev).to(dtype)[..., ::2]
    else:
        x = torch.randn(*lead, d, device=dev).to(dtype)
    x.requires_grad_()
    y = fm.fused_gated_mlp(x, *ws, act, backend=name, recompute=recompute, biases=bs)
    assert y.shape == (*lead, d_out) and y.dtype == dtype
    gy = torch.randn_like(y)
    y.backward(gy)
    ry, rgrads = gated_reference(x, ws, bs, act, gy)
    tol = TOLERANCE[dtype]
    assert_close(y, ry, tol)
    outs = [x.grad, *(w.grad for w in ws), *(b.grad for b in bs or [])]
    names = ["grad x", "grad w_gate", "grad w_up", "grad w_down"] + \
        (["grad b_gate", "grad b_up", "grad b_down"] if bias else [])
    tols = [tol] * len(outs)
    if dtype != torch.float32 and x.numel() > 0:
        # 16-bit gradients: within the table, or within GRAD_VS_EAGER x what eager
        # autograd in the same dtype gets on the same data (as the shared suite)
        _, eg = gated_reference(x, ws, bs, act, gy, dtype=dtype)
        tols = [max(tol, GRAD_VS_EAGER * rel_error(e, r)) for e, r in zip(eg, rgrads)]
    for out, r, t, what in zip(outs, rgrads, tols, names):
        assert_close(out, r, t, what)


@pytest.mark.parametrize("act", gated.GATE_ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_activations_and_bias(impl, act, bias):
    run(impl, act, bias=bias)


def test_noncontiguous_parameters(impl):
    """Transposed weights and strided biases: the same result as contiguous copies."""
    run(impl, "silu", bias=True, noncontig=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_dtypes_and_recompute(impl, dtype, recompute):
    run(impl, "gelu_tanh", dtype, recompute=recompute, strided=True)


@pytest.mark.parametrize("lead", [(0,), (1,), (7,), (2, 3, 5), (2, 0, 3)], ids=str)
def test_row_shapes(impl, lead):
    run(impl, "silu", lead=lead, dims=(17, 33, 9))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_whole_blocks(impl, dtype):
    """d, hidden and rows multiples of 16: the kernels' unmasked K loops."""
    run(impl, "silu", dtype, lead=(32,), dims=(32, 48, 16), bias=True)


@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_gated_tma_train_step(impl, monkeypatch, recompute):
    """A train step whose gated GEMM takes the one-GEMM TMA kernel and whose dh GEMM the
    TMA backward kernel, in column chunks that each store their h for the down
    projection's weight gradient (Hopper-class GPUs, or the interpreter with the row
    threshold lowered); bf16, every gradient checked."""
    name, dev = impl
    if name != "triton" or dev.type == "xpu" or (
            dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] < 9):
        pytest.skip("the TMA kernels run on Hopper-class CUDA GPUs and in the interpreter")
    wide = gated._wide()
    if wide.tma.TensorDescriptor is None:
        pytest.skip("this Triton has no host tensor descriptors")
    ran = []
    real = wide.tma._tma_launch
    monkeypatch.setattr(wide.tma, "_tma_launch", lambda k, *a, **kw: ran.append(k) or real(k, *a,
                                                                                           **kw))
    monkeypatch.setenv("FUSEDMLP_GLUON_WIDE", "0")  # sm_90's dh GEMM: test_gluon_wide.py
    if dev.type == "cpu":
        monkeypatch.setattr(wide.gated, "GATED_TMA_MIN_ROWS", 65)
        monkeypatch.setattr(wide.layers, "CHUNK_ALIGN", 16)
        lead, dims, cols = (85,), (40, 56, 24), 16
    else:
        lead, dims, cols = (wide.gated.GATED_TMA_MIN_ROWS + 85,), (520, 1144, 264), 256
    # h's chunks of `cols` columns, the last one narrower (56 = 3 x 16 + 8, 1144 = 4 x 256 + 120)
    monkeypatch.setattr(wide.gated, "GATED_H_CHUNK_BYTES", lead[0] * cols * 2)
    chunks = wide.layers._col_chunks(lead[0], dims[1], 2, wide.gated.GATED_H_CHUNK_BYTES)
    assert len(chunks) == (4 if dev.type == "cpu" else 5) and chunks[-1][1] == dims[1]
    run(impl, "silu", torch.bfloat16, lead=lead, dims=dims, recompute=recompute)
    assert wide.gated_kernels._gated_fwd_tma_kernel in ran
    # each chunk stored its h
    assert ran.count(wide.gated_kernels._gated_bwd_tma_kernel) == len(chunks)


@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_through_the_ops_autograd(impl, monkeypatch, recompute):
    """Eager calls normally skip the custom-op layer (op.EAGER_FAST_PATH); the ops' own
    autograd gives the same results."""
    monkeypatch.setattr(fm.op, "EAGER_FAST_PATH", False)
    run(impl, "silu", bias=True, recompute=recompute)


def test_recompute_saves_no_intermediate(impl):
    """recompute=True: autograd keeps x and the weights only (nothing [rows, hidden])."""
    name, dev = impl
    ws, _ = make(16, 48, 16, False, torch.float32, dev)
    x = torch.randn(20, 16, device=dev, requires_grad=True)
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t,
                                                  lambda t: t):
        fm.fused_gated_mlp(x, *ws, backend=name, recompute=True)
    assert (20, 48) not in shapes, shapes
    shapes.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t,
                                                  lambda t: t):
        fm.fused_gated_mlp(x, *ws, backend=name, recompute=False)
    assert shapes.count((20, 48)) == 2, shapes  # g and u, not act(g), not the product


def test_only_weights_need_grad(impl):
    name, dev = impl
    ws, bs = make(16, 24, 8, True, torch.float32, dev)
    ws[1].requires_grad_(False)
    bs[0].requires_grad_(False)
    x = torch.randn(9, 16, device=dev)
    y = fm.fused_gated_mlp(x, *ws, backend=name, biases=bs)
    gy = torch.randn_like(y)
    y.backward(gy)
    _, r = gated_reference(x, ws, bs, "silu", gy)
    assert x.grad is None and ws[1].grad is None and bs[0].grad is None
    tol = TOLERANCE[torch.float32]
    assert_close(ws[0].grad, r[1], tol, "grad w_gate")
    assert_close(ws[2].grad, r[3], tol, "grad w_down")
    assert_close(bs[2].grad, r[6], tol, "grad b_down")


def test_opcheck(impl):
    """Schema, fake and autograd registrations agree with the kernels (opcheck's checks;
    fp16 on the Triton kernels, fp32 on the reference, to keep the interpreter cheap)."""
    name, dev = impl
    dtype = torch.float32 if name == "reference" else torch.float16
    ws, bs = make(16, 24, 8, True, dtype, dev)
    x = torch.randn(2, 5, 16, device=dev, dtype=dtype, requires_grad=True)
    det = [w.detach() for w in ws]
    torch.library.opcheck(torch.ops.fusedmlp.gated_mlp.default, (x, *ws, None, "silu", name))
    args = (x, *ws, bs, "gelu_tanh", name)
    torch.library.opcheck(torch.ops.fusedmlp.gated_mlp_train.default, args)
    with torch.no_grad():
        y, g, u = torch.ops.fusedmlp.gated_mlp_train(*args)
    gy = torch.randn_like(y)
    db = [t.detach() for t in bs]
    for saved, needs in [([g, u], (True, True, True)), ([], (False, True, False))]:
        torch.library.opcheck(torch.ops.fusedmlp.gated_mlp_backward.default,
                              (gy, x.detach(), *det, db, saved, "gelu_tanh", name, *needs))


def test_compile_fullgraph_no_graph_break():
    """torch.compile sees through the ops (reference path on the CPU)."""
    torch._dynamo.reset()
    m = fm.GatedMLP(16, 32, activation="gelu_tanh", bias=True, backend="reference")
    x = torch.randn(3, 5, 16, requires_grad=True)
    compiled = torch.compile(m, fullgraph=True)
    y_eager, y_comp = m(x), compiled(x)
    torch.testing.assert_close(y_comp, y_eager)
    (g_eager,) = torch.autograd.grad(y_eager.sum(), x)
    (g_comp,) = torch.autograd.grad(y_comp.sum(), x)
    torch.testing.assert_close(g_comp, g_eager)
    explanation = torch._dynamo.explain(m)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_autocast():
    ws, _ = make(16, 24, 16, False, torch.float32, "cpu")
    x = torch.randn(7, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fm.fused_gated_mlp(x, *ws, backend="reference")
    assert y.dtype == torch.bfloat16
    assert_close(y, gated_reference(x.bfloat16(), [w.bfloat16() for w in ws], None, "silu"),
                 TOLERANCE[torch.bfloat16])
    y.float().sum().backward()
    assert ws[0].grad.dtype == torch.float32


# --- modules ------------------------------------------------------------------------
class LlamaStyleMLP(nn.Module):
    """The shape of Llama/Mistral's MLP block (written here; no transformers import)."""

    def __init__(self, d, hidden, act_fn, bias=False):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=bias)
        self.up_proj = nn.Linear(d, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, d, bias=bias)
        self.act_fn = act_fn

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, act_fn, bias=False):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.mlp = LlamaStyleMLP(16, 40, act_fn, bias)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


@pytest.mark.parametrize("act_fn,name", [(nn.SiLU(), "silu"), (nn.GELU("tanh"), "gelu_tanh"),
                                         (nn.GELU(), "gelu"), (F.silu, "silu")],
                         ids=["SiLU", "GELU-tanh", "GELU", "F.silu"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_fuse_gated_mlps(act_fn, name, bias):
    model = nn.Sequential(Block(act_fn, bias), Block(act_fn, bias)).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    before_keys = list(model.state_dict())
    expected = model(x)
    params = [p for p in model.parameters()]
    out = fm.fuse_gated_mlps(model)
    assert out is model
    for blk in model:
        assert isinstance(blk.mlp, fm.GatedMLP) and blk.mlp.activation == name
    assert list(model.state_dict()) == before_keys  # loadable both ways
    assert all(a is b for a, b in zip(model.parameters(), params))  # shared, not copied
    torch.testing.assert_close(model(x), expected)


def test_fuse_gated_mlps_leaves_unsupported_alone():
    model = nn.Sequential(Block(nn.ReLU()))
    with pytest.warns(UserWarning, match="nothing swapped"):
        assert fm.fuse_gated_mlps(model) is model
    assert isinstance(model[0].mlp, LlamaStyleMLP)
    top = LlamaStyleMLP(8, 16, nn.SiLU())
    assert isinstance(fm.fuse_gated_mlps(top), fm.GatedMLP)  # the model itself


def test_module_state_dict_and_shapes():
    m = fm.GatedMLP(16, 40, 12, bias=True)
    assert sorted(m.state_dict()) == sorted(
        f"{p}.{t}" for p in ("gate_proj", "up_proj", "down_proj") for t in ("weight", "bias"))
    ref = LlamaStyleMLP(16, 40, nn.SiLU(), bias=True)
    ref.down_proj = nn.Linear(40, 12)
    m.load_state_dict(ref.state_dict())
    x = torch.randn(4, 16)
    torch.testing.assert_close(m(x), ref(x))
    assert fm.GatedMLP(8, 16).down_proj.out_features == 8  # out defaults to in


# --- errors -------------------------------------------------------------------------
def test_errors_name_the_argument():
    ws, bs = make(16, 24, 8, True, torch.float32, "cpu", requires_grad=False)
    x = torch.randn(3, 16)
    cases = [
        ((x[:, :8], *ws), {}, ValueError, "w_gate: expected"),
        ((x, ws[0], ws[1][:, :8], ws[2]), {}, ValueError, "w_up: expected"),
        ((x, ws[0], ws[1], ws[2][:, :8]), {}, ValueError, "w_down: expected"),
        ((x, ws[0].half(), *ws[1:]), {}, TypeError, "w_gate: expected dtype"),
        ((x, *ws), {"activation": "relu"}, ValueError, "activation: the gated MLP supports"),
        ((x, *ws), {"activation": "nope"}, ValueError, "activation: unknown"),
        (("x", *ws), {}, TypeError, "x: expected a torch.Tensor"),
        ((x, *ws), {"biases": bs[:2]}, TypeError, "biases: expected"),
        ((x, *ws), {"biases": [bs[0], bs[1], bs[0]]}, ValueError, r"biases\[2\]: expected shape"),
        ((x, *ws), {"backend": "no-such"}, ValueError, "backend: unknown backend 'no-such'"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            fm.fused_gated_mlp(*args, **kw)
    with pytest.raises(ValueError, match="hidden_features"):
        fm.GatedMLP(16, 0)
    with pytest.raises(ValueError, match="activation"):
        fm.GatedMLP(16, 32, activation="tanh")


def test_module_calls_skip_validation_only_when_lean(monkeypatch):
    """A gated module's call skips validate() (host time) only for a plain tensor of the
    module's width, dtype and device outside autocast; every other call is validated and
    its error names x. Same numbers either way."""
    m = fm.GatedMLP(16, 24, 8, bias=True)
    x = torch.randn(3, 16)
    full = m(x)
    calls = []
    real = gated.validate
    monkeypatch.setattr(gated, "validate", lambda *a: calls.append(1) or real(*a))
    assert torch.equal(m(x), full) and calls == []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert m(x).dtype == torch.bfloat16
    assert calls == [1]
    for bad, exc, msg in ((x.double(), TypeError, "w_gate: expected dtype"),
                          (x[:, :8], ValueError, "x: expected last dimension 16")):
        with pytest.raises(exc, match=msg):
            m(bad)
    assert len(calls) == 3
    m.up_proj.bias = None  # one projection without its bias: the full path says so
    with pytest.raises(TypeError, match=r"biases\[1\]"):
        m(x)


def test_wrapped_linears_after_fusing_are_an_error():
    """A child Linear wrapped after fusing (a parametrization here; LoRA adapters alike)
    is no longer what the op reads: every fused module says so, naming the child, rather
    than computing without the wrapper's change."""
    from torch.nn.utils import parametrize

    class Twice(nn.Module):
        def forward(self, w):
            return 2 * w

    x = torch.randn(3, 8)
    lins = {n: nn.Linear(8 if n != "fc2" else 16, 16 if n != "fc2" else 8)
            for n in ("fc1_g", "fc1_x", "fc2")}
    view = fm.GatedMLPView(lins, ("fc1_g", "fc1_x"), "fc2", "silu")
    narrow = fm.FusedMLP(8, 4, 16, 1)
    for m, child in ((fm.GatedMLP(8, 16), "up_proj"), (view, "fc1_x"),
                     (narrow, narrow._names[0])):
        m(x)
        parametrize.register_parametrization(m._modules[child], "weight", Twice())
        with pytest.raises(TypeError, match=rf"{type(m).__name__}\.{child}: expected the "
                                            r"nn.Linear .* found ParametrizedLinear"):
            m(x)


def test_forced_backend_without_kernels_is_an_error(monkeypatch):
    ws, _ = make(16, 24, 8, False, torch.float32, "cpu", requires_grad=False)
    x = torch.randn(3, 16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(fm.BackendUnavailableError, match="'triton' cannot run"):
        fm.fused_gated_mlp(x, *ws, backend="triton")
    # the automatic choice on the CPU is the reference, never the interpreter
    assert gated.choose(torch.device("cpu")) is gated._Reference


@pytest.mark.gpu
def test_device_memory_kept_and_peak():
    """Memory kept from forward to backward: recompute < save (g, u) < eager (g, act(g), u,
    h); and the train step's peak below eager's (wide, bf16). The kernels forced: at these
    4096 rows the automatic choice trains with torch's ops (WIDE_TORCH_TRAIN_ROWS)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a cuda device")
    dev, dt = torch.device("cuda"), torch.bfloat16
    ref = LlamaStyleMLP(1024, 4096, nn.SiLU()).to(dev, dt)
    kept, peak = {}, {}
    for mode in ("eager", "save", "recompute"):
        m = ref if mode == "eager" else gated.GatedMLP.from_module(
            ref, backend="triton", recompute=mode == "recompute")
        x = torch.randn(4096, 1024, device=dev, dtype=dt, requires_grad=True)
        m(x).sum().backward()  # warm-up: autotuning, allocator
        ref.zero_grad(set_to_none=True)
        x.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        y = m(x)
        kept[mode] = torch.cuda.memory_allocated() - base
        y.sum().backward()
        torch.cuda.synchronize()
        peak[mode] = torch.cuda.max_memory_allocated() - base
        del y
        ref.zero_grad(set_to_none=True)
    assert kept["recompute"] < kept["save"] < kept["eager"], kept
    assert peak["save"] < peak["eager"], peak


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64, 300])
def test_device_decode_and_wide(m):
    if not any(d.type != "cpu" for n, d in IMPLS if n == "triton"):
        pytest.skip("needs Triton on a cuda/xpu device")
    dev = next(d for n, d in IMPLS if n == "triton" and d.type != "cpu")
    run(("triton", dev), "silu", torch.bfloat16, lead=(m,), dims=(512, 1536, 512))


def test_small_training_calls_record_torch_autograd(monkeypatch):
    """Plain eager training calls of _torch_rows's row counts, with the wide kernels
    chosen automatically, run as the reference's torch ops under torch's autograd (right
    gradients, the kernels untouched); more rows, no-grad calls and a forced backend run
    the kernels."""
    calls = []

    class Kernels:  # stands in for the wide kernels: records, computes nothing right
        name = "triton"

        @staticmethod
        def gated_forward(x, w_gate, w_up, w_down, activation, save, biases=None):
            calls.append(("forward", x.shape[0], save))
            m, h = x.shape[0], w_gate.shape[0]
            return (x.new_full((m, w_down.shape[0]), float("nan")),
                    [x.new_zeros(m, h), x.new_zeros(m, h)] if save else [])

        @staticmethod
        def gated_backward(grad_y, x, w_gate, w_up, w_down, saved, activation, needs,
                           biases=None):
            calls.append(("backward", x.shape[0]))
            return torch.zeros_like(x), [torch.zeros_like(w) for w in (w_gate, w_up, w_down)], []

    real_choose = gated.choose
    monkeypatch.setattr(gated, "choose", lambda device, backend=None: (
        Kernels if backend in (None, "", "triton") else real_choose(device, backend)))
    monkeypatch.setattr(gated, "_torch_rows",
                        lambda device, train, d, hidden: ((1, 16),) if train else ((32, 64),))
    monkeypatch.delenv(fm.dispatch.ENV_VAR, raising=False)
    ws, _ = make(8, 24, 8, False, torch.float64, torch.device("cpu"))
    for rows in (1, 16):
        x = torch.randn(rows, 8, dtype=torch.float64, requires_grad=True)
        y = fm.fused_gated_mlp(x, *ws)
        gy = torch.randn_like(y)
        g = torch.autograd.grad(y, [x, *ws], gy)
        ref, r = gated_reference(x.detach(), ws, None, "silu", gy)
        torch.testing.assert_close(y, ref)
        for a, b in zip(g, r):
            torch.testing.assert_close(a, b)
    assert calls == []
    for rows, kw in ((17, {}), (4, {"backend": "triton"})):
        x = torch.randn(rows, 8, dtype=torch.float64, requires_grad=True)
        fm.fused_gated_mlp(x, *ws, **kw).sum().backward()
        assert calls == [("forward", rows, True), ("backward", rows)], calls
        calls.clear()
    with torch.no_grad():
        fm.fused_gated_mlp(torch.randn(4, 8, dtype=torch.float64), *ws)
    assert calls == [("forward", 4, False)]
    calls.clear()
    # no-grad calls in the inference ranges: torch ops, right values, kernels untouched
    for rows in (32, 64):
        x = torch.randn(rows, 8, dtype=torch.float64)
        with torch.no_grad():
            y = fm.fused_gated_mlp(x, *ws)
        torch.testing.assert_close(y, gated_reference(x, ws, None, "silu"))
    assert calls == []
    with torch.no_grad():
        fm.fused_gated_mlp(torch.randn(32, 8, dtype=torch.float64), *ws, backend="triton")
    assert calls == [("forward", 32, False)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cpu_training_records_torchs_graph(dtype, monkeypatch):
    """On the CPU an unforced GatedMLP trains through torch's own autograd graph of the
    reference's ops (gated._torch_rows: the node was slower there): x's and every
    parameter's gradients are eager Llama MLP's bit for bit, explain's route says so;
    forced to the reference the op's node runs."""
    monkeypatch.delenv(fm.dispatch.ENV_VAR, raising=False)
    torch.manual_seed(0)
    g = fm.GatedMLP(16, 40, activation="silu", bias=True, dtype=dtype)
    x = torch.randn(9, 16, dtype=dtype)
    gy = torch.randn(9, 16, dtype=dtype)

    def grads(fn, params):
        xx = x.clone().requires_grad_()
        return torch.autograd.grad(fn(xx), [xx, *params], gy)
    lin = [g.gate_proj, g.up_proj, g.down_proj]
    eager = grads(lambda t: lin[2](F.silu(lin[0](t)) * lin[1](t)), list(g.parameters()))
    for a, b in zip(grads(g, list(g.parameters())), eager):
        assert torch.equal(a, b)
    assert "torch's own autograd graph" in fm.explain(g, x).route(x, train=True)
    forced = fm.GatedMLP(16, 40, activation="silu", bias=True, dtype=dtype,
                         backend="reference")
    y = forced(x.clone().requires_grad_())
    assert type(y.grad_fn).__name__ == "_EagerGatedBackward", y.grad_fn


def test_explain_gated_modules():
    """explain() takes a GatedMLP and a converted (packed) GatedMLPView, saying which
    implementation runs and why not the other; a forced backend that cannot run says so."""
    g = fm.GatedMLP(8, 16, 4, bias=True)
    ex = fm.explain(g, torch.randn(2, 8))
    assert ex.spec.widths == (8, 16, 4) and ex.spec.bias
    assert ex.backend in ("triton", "reference") and len(ex.considered) == 2
    assert all(c.reason for c in ex.considered)
    assert fm.explain(g, torch.randn(2, 8), backend="reference").backend == "reference"

    class Packed(nn.Module):  # Phi-3's layout
        def __init__(self):
            super().__init__()
            self.gate_up_proj = nn.Linear(8, 32, bias=False)
            self.down_proj = nn.Linear(16, 8, bias=False)
            self.activation_fn = nn.SiLU()

    view = fm.fuse_gated_mlps(nn.Sequential(Packed()))[0]
    assert isinstance(view, fm.GatedMLPView)
    assert fm.explain(view, torch.randn(3, 8)).spec.widths == (8, 16, 8)
