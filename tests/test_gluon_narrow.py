"""The Gluon narrow inference forward (backends/triton/hopper_forward.py): on sm_90 GPUs
against the float64 reference, into NaN-poisoned outputs, over widths, depths,
activations, biases, dtypes, row counts with tails and strided x; on every machine its
selection rule and (ci/aot_narrow.py) its compile for sm_90."""
import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations
from fusedmlp_xpu.backends import triton as tb
from fusedmlp_xpu.backends.triton.narrow import forward as n_forward, tuning as n_tuning
from fusedmlp_xpu.backends.triton.narrow import hopper_forward
from fusedmlp_xpu.spec import MLPSpec

from conftest import (SERIALIZED, assert_close, case_seed, make_params, on_a_new_thread,
                      on_its_own_thread, reference, tolerance)


def _sm90() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
            and hopper_forward.gluon is not None)


sm90 = pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU and Triton's Gluon")

# (in, hidden, out, hidden layers): the bench's shapes, depth 1 (no hidden-to-hidden
# weights) to 11, in/out padded by TMA (24, 40), the narrowest and widest hidden
NETS = [(64, 64, 64, 4), (64, 32, 64, 4), (64, 128, 64, 4), (64, 64, 64, 11),
        (24, 64, 40, 3), (32, 16, 8, 1), (128, 128, 128, 2), (16, 64, 16, 2)]
ROWS = [1, 63, 64, 65, 128, 129, 1000, 2 ** 14 + 37]


@pytest.fixture(autouse=True)
def _every_hidden_width(monkeypatch):
    """The kernel from hidden width 16 (the package takes it from MIN_HIDDEN), plans
    made afresh."""
    monkeypatch.setattr(hopper_forward, "MIN_HIDDEN", 16)
    n_forward._gluon_plan.cache_clear()
    n_forward._forward_plan.cache_clear()
    yield
    n_forward._gluon_plan.cache_clear()
    n_forward._forward_plan.cache_clear()


def _spec(net, act, out_act, bias, dtype):
    IN, H, OUT, L = net
    return MLPSpec((IN,) + (H,) * L + (OUT,), act, out_act, bias, dtype)


def _check(spec, rows, dev, x=None, gen=None, call=lambda f: f()):
    """The kernel's output of fresh random data against the float64 reference; ``call``
    runs the kernel's call."""
    ws, bs = make_params(spec.widths, spec.bias, spec.dtype, dev, gen=gen)
    if x is None:
        x = torch.randn(rows, spec.in_features, generator=gen).to(dev, spec.dtype)
    plan = n_forward._forward_plan(spec, dev, False)
    assert plan.gluon is not None, hopper_forward.eligible(spec, dev)
    # from any row count (GLUON_MIN_ROWS is the caller's rule)
    y = call(lambda: plan._gluon(x, ws, bs))
    assert y is not None
    ref = reference(x, ws, bs, spec.activation, spec.output_activation)
    assert_close(y, ref, tolerance("triton", spec.dtype))
    return x, ws, bs


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("net", NETS, ids=["x".join(map(str, n)) for n in NETS])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_gluon_forward_matches_reference(net, dtype, bias):
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(case_seed(net, bias))
    spec = _spec(net, "relu", "none", bias, dtype)
    for rows in ROWS:
        _check(spec, rows, dev, gen=gen)


@sm90
@pytest.mark.gpu
def test_first_cuda_work_of_a_thread(monkeypatch):
    """The kernel as a thread's first CUDA work, its launch kept from another thread:
    Triton's launcher needs a current context for the descriptors (launch.bind_context)."""
    _check(_spec((64, 64, 64, 4), "relu", "none", False, torch.float16), 5000,
           torch.device("cuda"), gen=torch.Generator().manual_seed(7),
           call=lambda f: on_a_new_thread(monkeypatch, f))


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("act", sorted(activations.ACTIVATIONS))
def test_gluon_forward_every_activation(act):
    """Each registry activation as the hidden and as the output activation."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    for out_act in ("none", act):
        _check(_spec((64, 64, 32, 2), act, out_act, True, torch.float16), 777, dev, gen=gen)


@sm90
@pytest.mark.gpu
def test_gluon_forward_strided_and_refused_inputs():
    """x as every other row of a wider tensor (TMA reads the stride); x whose rows are
    not 16-byte aligned goes to the Triton kernel (None here), and still right."""
    dev = torch.device("cuda")
    spec = _spec((64, 64, 64, 3), "gelu", "none", True, torch.float16)
    wide = torch.randn(3001, 128, device=dev, dtype=torch.float16)
    _check(spec, None, dev, x=wide[:, 32:96])
    odd = torch.randn(500, 65, device=dev, dtype=torch.float16)[:, :64]
    plan = n_forward._forward_plan(spec, dev, False)
    ws, bs = make_params(spec.widths, True, spec.dtype, dev)
    assert not plan.gluon.accepts(odd)
    assert plan._gluon(odd, ws, bs) is None
    # a bias 2 bytes past an aligned address: the kept launch assumes aligned pointers
    shifted = [torch.empty(b.numel() + 1, device=dev, dtype=b.dtype)[1:].copy_(b)
               for b in bs]
    assert plan._gluon(wide[:, 32:96], ws, shifted) is None
    with torch.no_grad():
        y = fm.fused_mlp(odd, ws, bs, "gelu", backend="triton")
    assert_close(y, reference(odd, ws, bs, "gelu", "none"), tolerance("triton", spec.dtype))


@sm90
@pytest.mark.gpu
def test_module_inference_takes_the_gluon_kernel_from_min_rows(monkeypatch):
    """FusedMLP's no-grad calls (the bound fast path and the general one) launch the
    Gluon kernel from GLUON_MIN_ROWS rows and the Triton kernel below; both right."""
    dev = torch.device("cuda")
    calls = []
    real = hopper_forward.Plan.__call__

    def counting(self, *a):
        calls.append(a[0].shape[0])
        return real(self, *a)

    monkeypatch.setattr(hopper_forward.Plan, "__call__", counting)
    # silu: smooth, so the gradient check below has no mask flips at relu's kink
    m = fm.FusedMLP(64, 64, 64, 4, activation="silu", bias=True, device=dev,
                    dtype=torch.float16, backend="triton")
    big = n_tuning.GLUON_MIN_ROWS + 5
    for rows in (big, big, n_tuning.GLUON_MIN_ROWS - 1, big + 64):
        x = torch.randn(rows, 64, device=dev, dtype=torch.float16)
        with torch.no_grad():
            y = m(x)
        assert_close(y, reference(x, m.weights(), m.biases(), "silu", "none"),
                     tolerance("triton", torch.float16))
    assert calls == [big, big, big + 64]
    # a train step's forward takes it too where the backward recomputes the
    # pre-activations from x (it then saves nothing); the gradients stay right
    x = torch.randn(big, 64, device=dev, dtype=torch.float16, requires_grad=True)
    gy = torch.randn(big, 64, device=dev, dtype=torch.float16)
    y = m(x)
    y.backward(gy)
    recomputes = tb.TritonBackend().recomputes(m.spec(torch.float16), dev)
    assert len(calls) == 3 + recomputes
    ref = reference(x, m.weights(), m.biases(), "silu", "none", grad_y=gy)
    tol = tolerance("triton", torch.float16)
    assert_close(y, ref[0], tol)
    assert_close(x.grad, ref[1], tol, "grad x")
    for w, rw in zip(m.weights(), ref[2]):
        assert_close(w.grad, rw, tol, "grad w")


@sm90
@pytest.mark.gpu
def test_gluon_forward_in_a_cuda_graph():
    """Captured and replayed on new data: TMA descriptors travel as kernel parameters."""
    dev = torch.device("cuda")
    m = fm.FusedMLP(64, 64, 64, 4, device=dev, dtype=torch.float16, backend="triton")
    x = torch.randn(n_tuning.GLUON_MIN_ROWS * 2, 64, device=dev, dtype=torch.float16)
    with torch.no_grad():
        m(x)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = m(x)
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
    assert_close(y, reference(x, m.weights(), m.biases(), "relu", "none"),
                 tolerance("triton", torch.float16))


@sm90
@pytest.mark.gpu
def test_gluon_forward_captured_on_a_new_thread():
    """Captured on a thread whose first launch of the kernel is inside the capture
    (launch.bind_context runs there: it must not end the capture), replayed on new data."""
    dev = torch.device("cuda")
    m = fm.FusedMLP(64, 64, 64, 4, device=dev, dtype=torch.float16, backend="triton")
    x = torch.randn(n_tuning.GLUON_MIN_ROWS * 2, 64, device=dev, dtype=torch.float16)
    with torch.no_grad():
        m(x)  # compiled, its launch kept
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()

    def capture():
        with torch.no_grad(), torch.cuda.graph(g):
            return m(x)

    y = on_its_own_thread(capture)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert_close(y, reference(x, m.weights(), m.biases(), "relu", "none"),
                 tolerance("triton", torch.float16))


def test_eligibility_rule_and_reasons(monkeypatch):
    """Which nets may take the kernel, and explain()'s reason where one may not (the
    checks before the device's own are plain Python)."""
    cpu = torch.device("cpu")
    ok = _spec((64, 64, 64, 4), "relu", "none", False, torch.float16)
    assert hopper_forward.eligible(ok, cpu)[1].startswith("not a CUDA device")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cuda = torch.device("cuda", 0)
    if hopper_forward.gluon is None:
        assert "no Gluon" in hopper_forward.eligible(ok, cuda)[1]
        return
    assert hopper_forward.eligible(ok, cuda) == (True, "")
    for spec, why in [
            (_spec((64, 64, 64, 4), "relu", "none", False, torch.float32), "fp16 and bf16"),
            (_spec((64, 48, 64, 4), "relu", "none", False, torch.float16), "power of two"),
            (_spec((60, 64, 64, 4), "relu", "none", False, torch.float16), "multiples of 8"),
            (_spec((64, 64, 12, 4), "relu", "none", False, torch.float16), "multiples of 8"),
            (_spec((128, 128, 128, 16), "relu", "none", False, torch.float16), "do not fit")]:
        assert why in hopper_forward.eligible(spec, cuda)[1], spec
    monkeypatch.setattr(hopper_forward, "MIN_HIDDEN", 64)
    for spec, why in [
            (_spec((64, 32, 64, 4), "relu", "none", False, torch.float16), "measured faster")]:
        assert why in hopper_forward.eligible(spec, cuda)[1], spec
    monkeypatch.setenv(hopper_forward.ENV, "0")
    assert hopper_forward.eligible(ok, cuda)[1] == f"{hopper_forward.ENV}=0"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (10, 0))
    monkeypatch.delenv(hopper_forward.ENV)
    assert "sm_90 only" in hopper_forward.eligible(ok, cuda)[1]


def test_tuning_fills_shared_memory_without_overflowing_it():
    """The most programs per SM (up to 3), then the most x stages (up to 2), that fit the
    sm_90 limits; the bench's nets get what the H200 sweep measured fastest."""
    for net in NETS:
        spec = _spec(net, "relu", "none", False, torch.float16)
        t = hopper_forward.tuning(spec)
        assert t is not None, net
        bm, stages, per_sm, warps = t
        assert warps * 16 == bm  # 64 rows a warpgroup
        need = hopper_forward.smem_bytes(spec, bm, stages)
        assert need <= hopper_forward.SMEM_BYTES
        assert per_sm * (need + hopper_forward.SMEM_RESERVED) <= hopper_forward.SMEM_PER_SM
        if warps == 8:  # a deep net at hidden <= 64: no second 64-row program fits
            assert per_sm == 1 and net[1] <= 64
            assert hopper_forward.smem_bytes(spec, 64, 1) * 2 + 2 * hopper_forward.SMEM_RESERVED \
                > hopper_forward.SMEM_PER_SM
            continue
        more = [(per_sm + 1, 1)] if per_sm < 3 else []
        more += [(per_sm, stages + 1)] if stages < 2 else []
        for p, s in more:  # one more program or one more stage would not fit
            n = hopper_forward.smem_bytes(spec, bm, s)
            assert n > hopper_forward.SMEM_BYTES or p * (n + hopper_forward.SMEM_RESERVED) \
                > hopper_forward.SMEM_PER_SM, (net, p, s)
    w64 = _spec((64, 64, 64, 4), "relu", "none", False, torch.float16)
    assert hopper_forward.tuning(w64) == (64, 1, 3, 4)
    paper = _spec((64, 64, 64, 11), "relu", "none", False, torch.float16)
    assert hopper_forward.tuning(paper) == (128, 1, 1, 8)
    w128 = _spec((64, 128, 64, 4), "relu", "none", False, torch.float16)
    assert hopper_forward.tuning(w128) == (64, 2, 1, 4)


def test_gluon_kernel_compiles_for_sm90():
    """ci/aot_narrow.py --quick compiles the Gluon forward and the warp-specialized Gluon
    backward (hopper_backward.py) for sm_90 (no GPU needed) with this Triton, each with
    the shared memory its tuning counted."""
    from conftest import run_aot_compile

    if hopper_forward.gluon is None:
        pytest.skip(f"no Gluon: {hopper_forward.IMPORT_ERROR}")
    out = run_aot_compile("aot_narrow.py")
    lines = [ln for ln in out.splitlines() if ln.startswith("gluon")]
    assert len(lines) >= 3, out[-2000:]
    assert all("wgmma" in ln for ln in lines), lines
    bwd = [ln for ln in lines if ln.startswith("gluon-bwd")]
    assert bwd and all("setmaxnreg" in ln for ln in bwd), lines
    assert not [ln for ln in lines if SERIALIZED in ln], lines  # MMAs pipelined by ptxas


def test_kept_descriptors_build_their_tma_map_once(monkeypatch):
    """gluon.memoizing: Triton's make_tensordesc_arg runs once per kept descriptor and
    kernel (its metadata object), every call for other descriptors (the user's own), and
    each call gets a fresh list of the same arguments; FUSEDMLP_FAST_LAUNCH=0 keeps none."""
    from fusedmlp_xpu.backends.triton import gluon as g

    if g.gluon is None:
        pytest.skip(f"no Gluon: {g.IMPORT_ERROR}")
    calls = []

    def real(arg, metadata, *rest):
        calls.append((arg, metadata))
        return [object(), *arg.shape, *arg.strides]

    memo = g.memoizing(real)
    t = torch.empty(256, 64, dtype=torch.float16)
    lay = g.gl.NVMMASharedLayout.get_default_for([64, 64], g.gl.float16)
    kept = g.kept_descriptor(t, [256, 64], [64, 1], [64, 64], lay)
    other = g.TensorDescriptor(g.Addr(t), [256, 64], [64, 1], [64, 64], lay)
    if not hasattr(kept, "_fmlp_maps"):
        pytest.skip("this Triton has no make_tensordesc_arg to memoize")
    m1, m2 = {"swizzle": 128}, {"swizzle": 128}
    a, b = memo(kept, m1), memo(kept, m1)
    assert a == b and a is not b and a[1:] == [256, 64, 64, 1]
    memo(kept, m2)
    memo(other, m1)
    memo(other, m1)
    assert [(x is kept, m is m1) for x, m in calls] == [
        (True, True), (True, False), (False, True), (False, True)]
    monkeypatch.setenv("FUSEDMLP_FAST_LAUNCH", "0")
    assert not hasattr(g.kept_descriptor(t, [256, 64], [64, 1], [64, 64], lay), "_fmlp_maps")
