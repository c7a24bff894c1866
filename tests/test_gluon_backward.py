"""The Gluon recomputing backward (backends/triton/hopper_backward.py): on sm_90 GPUs every
gradient against the float64 reference, into NaN-poisoned outputs, over depths,
activations, in/out widths that TMA pads, dtypes, row counts with tails and several row
blocks per program, strided x, and the gradients asked for; through FusedMLP's train
step; on every machine its selection rule and its compile for sm_90."""
import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations
from fusedmlp_xpu.backends import triton as tb
from fusedmlp_xpu.backends.triton import common as tb_common
from fusedmlp_xpu.backends.triton.narrow import backward as n_backward, tuning as n_tuning
from fusedmlp_xpu.backends.triton.narrow import hopper_backward, hopper_forward
from fusedmlp_xpu.spec import MLPSpec

from conftest import (assert_close, case_seed, chance_sum_size, make_params, on_a_new_thread,
                      reference, saved_z, tolerance)


def _sm90() -> bool:
    return (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
            and hopper_forward.gluon is not None)


sm90 = pytest.mark.skipif(not _sm90(), reason="needs an sm_90 GPU and Triton's Gluon")

# (in, hidden, out, hidden layers): the bench's w64 and w32 shapes, 0..4 hidden-to-hidden
# weights, in/out padded by TMA (24 -> 32, 40 -> 64, 8 -> 16), out widths that are not
# multiples of 8 padded on the host (3 -> 8, 1 -> 8, 13 -> 16: tma_out), hidden 16 and
# 32 (their g and out widths below 64 padded to the sums' 64 rows)
NETS = [(64, 64, 64, 4), (64, 64, 64, 1), (64, 64, 64, 2), (64, 64, 64, 5), (24, 64, 40, 3),
        (16, 64, 8, 2), (64, 32, 64, 4), (24, 32, 40, 2), (32, 16, 8, 3), (64, 16, 64, 5),
        (32, 64, 3, 2), (32, 32, 1, 3), (16, 64, 13, 4)]
# with biases: up to 3 hidden-to-hidden weights
BIAS_NETS = [(64, 64, 64, 4), (64, 64, 64, 1), (24, 64, 40, 3), (16, 64, 48, 2),
             (64, 64, 16, 2), (64, 32, 64, 4), (32, 16, 8, 3), (32, 64, 3, 2), (8, 16, 5, 3)]
# tails, one program's single block, and several blocks a program (132 SMs x 128 rows)
ROWS = [1, 127, 129, 1000, 2 ** 17 + 37]


@pytest.fixture(autouse=True)
def _fresh_plans():
    n_backward._gluon_backward_plan.cache_clear()
    n_backward._gluon_eligible.cache_clear()
    yield
    n_backward._gluon_backward_plan.cache_clear()
    n_backward._gluon_eligible.cache_clear()


def _spec(net, act="relu", out_act="none", dtype=torch.float16, bias=False):
    IN, H, OUT, L = net
    return MLPSpec((IN,) + (H,) * L + (OUT,), act, out_act, bias, dtype)


def _plan_calls(monkeypatch, what) -> list:
    """A list that gets what(plan, x) at every call of the Gluon backward's plan."""
    calls = []
    real = hopper_backward.Plan.__call__

    def counting(self, grad_y, x, *a):
        calls.append(what(self, x))
        return real(self, grad_y, x, *a)

    monkeypatch.setattr(hopper_backward.Plan, "__call__", counting)
    return calls


def _check(spec, rows, dev, gen, x=None, need=(True, True, True), call=lambda f: f()):
    """The kernel's gradients (need: grad_x, grad_weights, grad_biases where the net has
    them) of fresh random data against the float64 reference, the derivatives taken at
    the kernel's pre-activations; ``call`` runs the kernel's call."""
    need = (need[0], need[1], need[2] and spec.bias)
    plan = n_backward._gluon_backward_plan(spec, dev, *need)
    assert plan is not None, hopper_backward.eligible(spec, dev)
    ws, bs = make_params(spec.widths, spec.bias, spec.dtype, dev, gen=gen)
    if x is None:
        x = torch.randn(rows, spec.in_features, generator=gen).to(dev, spec.dtype)
    gy = torch.randn(x.shape[0], spec.out_features, generator=gen).to(dev, spec.dtype)
    out = call(lambda: n_backward._gluon_backward(plan, gy, x, ws, bs))
    assert out is not None
    gx, gws, gbs = out
    kinks = saved_z(x, ws, bs, spec.activation, spec.output_activation, "triton")
    _, rgx, rgw, rgb = reference(x, ws, bs, spec.activation, spec.output_activation,
                                 grad_y=gy, kinks_at=kinks)
    tol = tolerance("triton", spec.dtype)
    if need[0]:
        assert_close(gx, rgx, tol, "grad x")
    else:
        assert gx is None
    if need[1]:
        assert len(gws) == len(ws)
        for i, (g, r) in enumerate(zip(gws, rgw)):
            assert_close(g, r, tol, f"grad weights[{i}]")
    else:
        assert gws == []
    if need[2]:
        assert len(gbs) == len(bs)
        for i, (g, r) in enumerate(zip(gbs, rgb)):
            # the output bias's gradient is grad_y summed over the rows: it can cancel
            floor = (chance_sum_size(gy) if i == len(bs) - 1 and spec.output_activation ==
                     "none" else 0.0)
            assert_close(g, r, tol, f"grad biases[{i}]", floor)
    else:
        assert gbs == []


CASES = [(net, False) for net in NETS] + [(net, True) for net in BIAS_NETS]


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("net,bias", CASES,
                         ids=["x".join(map(str, n)) + ("-bias" if b else "") for n, b in CASES])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gluon_backward_matches_reference(net, bias, dtype, poison):
    """Every gradient, without and with biases (the forward again with them, their
    gradients summed on the tensor cores)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(case_seed(net, bias))
    for rows in ROWS:
        _check(_spec(net, dtype=dtype, bias=bias), rows, dev, gen)


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("act", sorted(activations.ACTIVATIONS))
def test_gluon_backward_every_activation(act, poison):
    """Each registry activation as the hidden one (those that keep the pre-activation fit
    one hidden-to-hidden weight at hidden 64, three at 32) and as the output one."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(11)
    for out_act in ("none", act):
        _check(_spec((64, 64, 32, 2), act, out_act), 3001, dev, gen)
        _check(_spec((64, 64, 64, 4), "relu", out_act), 3001, dev, gen)
        _check(_spec((64, 64, 64, 2), act, out_act, bias=True), 3001, dev, gen)
        _check(_spec((64, 32, 64, 4), act, out_act, bias=True), 3001, dev, gen)


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("act", ["softplus", "tanh", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_module_sdf_net_derivative_from_output(monkeypatch, poison, act, dtype):
    """The sdf net (32 -> 64 x 4 -> 16, biases), whose z tiles would not fit, trains
    through the Gluon backward with the derivative taken from the stored activation: the
    forward saves nothing (recomputes), at a row count below GLUON_MIN_ROWS too (the
    one-kernel Triton backward does not take this net) and with inputs large enough to
    saturate the activations; every gradient against the float64 reference."""
    dev = torch.device("cuda")
    calls = _plan_calls(monkeypatch, lambda plan, x: x.shape[0])
    m = fm.FusedMLP(32, 16, 64, 4, act, device=dev, dtype=dtype, backend="triton")
    assert not hopper_backward.keeps_z(m.spec().activation_id)
    assert tb.TritonBackend().recomputes(m.spec(), dev)
    assert "derivative from its stored output" in str(fm.explain(m, torch.zeros(
        1, 32, device=dev, dtype=dtype), train=True))
    gen = torch.Generator().manual_seed(17)
    tol = tolerance("triton", dtype)
    for rows, scale in ((n_tuning.GLUON_MIN_ROWS + 77, 1.0), (3001, 1.0), (3001, 8.0)):
        x = (scale * torch.randn(rows, 32, generator=gen)).to(dev, dtype).requires_grad_()
        gy = torch.randn(rows, 16, generator=gen).to(dev, dtype)
        m.zero_grad()
        m(x).backward(gy)
        ws, bs = m.weights(), m.biases()
        _, rgx, rgw, rgb = reference(x, ws, bs, act, "none", grad_y=gy)
        assert_close(x.grad, rgx, tol, "grad x")
        for i, (w, rw) in enumerate(zip(ws, rgw)):
            assert_close(w.grad, rw, tol, f"grad weights[{i}]")
        for i, (b, rb) in enumerate(zip(bs, rgb)):
            floor = chance_sum_size(gy) if i == len(bs) - 1 else 0.0
            assert_close(b.grad, rb, tol, f"grad biases[{i}]", floor)
    assert calls == [n_tuning.GLUON_MIN_ROWS + 77, 3001, 3001]


@sm90
@pytest.mark.gpu
def test_gluon_backward_partial_needs_and_strided_x(poison):
    """grad_x alone, the weights' alone; x as every other row of a wider tensor; x whose
    rows TMA cannot read is refused (None: the caller takes the Triton kernels)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(5)
    spec = _spec((64, 64, 64, 4))
    _check(spec, 5000, dev, gen, need=(True, False, False))
    _check(spec, 5000, dev, gen, need=(False, True, False))
    biased = _spec((64, 64, 64, 4), bias=True)
    _check(biased, 5000, dev, gen, need=(False, False, True))
    _check(biased, 5000, dev, gen, need=(True, True, False))
    wide = torch.randn(3001, 128, generator=gen).to(dev, spec.dtype)
    _check(spec, None, dev, gen, x=wide[:, 32:96])
    odd = torch.randn(500, 65, device=dev, dtype=spec.dtype)[:, :64]
    plan = n_backward._gluon_backward_plan(spec, dev, True, True)
    ws, _ = make_params(spec.widths, False, spec.dtype, dev)
    assert n_backward._gluon_backward(plan, torch.randn(500, 64, device=dev, dtype=spec.dtype),
                              odd, ws) is None


@sm90
@pytest.mark.gpu
def test_x_alone_many_calls_two_stages():
    """grad_x alone (the eikonal step's first backward) with two x stages and many blocks a
    program, called again and again: a chain that reads two blocks' x before the loader
    waits must not leave it waiting on a barrier phase already passed (each stage has its
    own). Every call's result equals the first."""
    dev = torch.device("cuda")
    spec = _spec((32, 64, 16, 4), "softplus", bias=True)
    assert hopper_backward.tuning(spec) == (2, 2)
    plan = n_backward._gluon_backward_plan(spec, dev, True, False, False)
    gen = torch.Generator().manual_seed(23)
    ws, bs = make_params(spec.widths, True, spec.dtype, dev, gen=gen)
    x = torch.randn(1 << 18, 32, generator=gen).to(dev, spec.dtype)
    gy = torch.randn(1 << 18, 16, generator=gen).to(dev, spec.dtype)
    first = n_backward._gluon_backward(plan, gy, x, ws, bs)[0].clone()
    for _ in range(300):
        gx = n_backward._gluon_backward(plan, gy, x, ws, bs)[0]
    torch.cuda.synchronize()
    assert torch.equal(gx, first)


@sm90
@pytest.mark.gpu
def test_first_cuda_work_of_a_thread(monkeypatch):
    """The kernel as a thread's first CUDA work, its launch kept from another thread (as
    on autograd's device thread when a backward starts at the op): Triton's launcher
    needs a current context for the descriptors (launch.bind_context)."""
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)
    _check(_spec((64, 64, 64, 4)), 5000, dev, gen,
           call=lambda f: on_a_new_thread(monkeypatch, f))


@sm90
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_module_train_step_pads_an_out_width_of_3(monkeypatch, poison, dtype):
    """The loop-image net (32 -> 64 x 2 -> 3, biases, a sigmoid output) trains through the
    Gluon backward with its out width padded to 8 on the host; every gradient, through
    the module, against the float64 reference, and the gradients' shapes the real ones."""
    dev = torch.device("cuda")
    calls = _plan_calls(monkeypatch, lambda plan, x: plan.OUT)
    m = fm.FusedMLP(32, 3, 64, 2, output_activation="sigmoid", device=dev, dtype=dtype,
                    backend="triton")
    rows = n_tuning.GLUON_MIN_ROWS * 4 + 3
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(rows, 32, generator=gen).to(dev, dtype).requires_grad_()
    gy = torch.randn(rows, 3, generator=gen).to(dev, dtype)
    m(x).backward(gy)
    assert calls == [8]
    ws, bs = m.weights(), m.biases()
    kinks = saved_z(x, ws, bs, "relu", "sigmoid", "triton")
    _, rgx, rgw, rgb = reference(x, ws, bs, "relu", "sigmoid", grad_y=gy, kinks_at=kinks)
    tol = tolerance("triton", dtype)
    assert_close(x.grad, rgx, tol, "grad x")
    for i, (w, rw) in enumerate(zip(ws, rgw)):
        assert w.grad.shape == w.shape
        assert_close(w.grad, rw, tol, f"grad weights[{i}]")
    for i, (b, rb) in enumerate(zip(bs, rgb)):
        assert b.grad.shape == b.shape
        assert_close(b.grad, rb, tol, f"grad biases[{i}]")


@sm90
@pytest.mark.gpu
def test_module_train_step_takes_the_gluon_backward(monkeypatch, poison):
    """FusedMLP's train step from GLUON_MIN_ROWS rows runs the Gluon backward (and the
    Triton kernels below); the gradients, through the module, stay right. A sum's
    gradient (broadcast, no rows in memory) and a column slice of a wider gradient are
    made dense first."""
    dev = torch.device("cuda")
    calls = _plan_calls(monkeypatch, lambda plan, x: x.shape[0])
    m = fm.FusedMLP(64, 64, 64, 4, bias=False, device=dev, dtype=torch.float16,
                    backend="triton")
    big = n_tuning.GLUON_MIN_ROWS + 5
    tol = tolerance("triton", torch.float16)
    for rows in (big, n_tuning.GLUON_MIN_ROWS - 1):
        x = torch.randn(rows, 64, device=dev, dtype=torch.float16, requires_grad=True)
        gy = torch.randn(rows, 64, device=dev, dtype=torch.float16)
        m.zero_grad()
        m(x).backward(gy)
        kinks = saved_z(x, m.weights(), None, "relu", "none", "triton")
        ref = reference(x, m.weights(), None, "relu", "none", grad_y=gy, kinks_at=kinks)
        assert_close(x.grad, ref[1], tol, "grad x")
        for w, rw in zip(m.weights(), ref[2]):
            assert_close(w.grad, rw, tol, "grad w")
    assert calls == [big]
    x = torch.randn(big, 64, device=dev, dtype=torch.float16)
    gy = torch.ones(big, 64, dtype=torch.float16, device=dev)
    kinks = saved_z(x, m.weights(), None, "relu", "none", "triton")
    ref = reference(x, m.weights(), None, "relu", "none", grad_y=gy, kinks_at=kinks)
    # grad_y strides (0, 0) from a sum, (0, 1) from a column sum's sum
    for loss in (lambda y: y.sum(), lambda y: y.sum(0).sum()):
        m.zero_grad()
        loss(m(x)).backward()
        for w, rw in zip(m.weights(), ref[2]):
            assert_close(w.grad, rw, tol, "grad w (sum)")
    # a column slice (row stride 128) from cat's backward: copied dense, then the kernel
    wc = torch.randn(big, 128, device=dev, dtype=torch.float16)
    ref = reference(x, m.weights(), None, "relu", "none", grad_y=wc[:, :64].contiguous(),
                    kinks_at=kinks)
    m.zero_grad()
    (torch.cat([m(x), torch.zeros_like(x)], dim=1) * wc).sum().backward()
    for w, rw in zip(m.weights(), ref[2]):
        assert_close(w.grad, rw, tol, "grad w (column slice)")
    assert calls == [big, big, big, big]


def test_eligibility_rule_and_reasons(monkeypatch):
    """Which nets may take the kernel, and explain()'s reason where one may not."""
    cpu = torch.device("cpu")
    ok = _spec((64, 64, 64, 4))
    assert hopper_backward.eligible(ok, cpu)[1].startswith("not a CUDA device")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cuda = torch.device("cuda", 0)
    if hopper_forward.gluon is None:
        assert "no Gluon" in hopper_backward.eligible(ok, cuda)[1]
        return
    assert hopper_backward.eligible(ok, cuda) == (True, "")
    for net in [(64, 32, 64, 4), (32, 16, 8, 3), (64, 64, 16, 4), (32, 64, 3, 2),
                (32, 64, 57, 2)]:
        assert hopper_backward.eligible(_spec(net, bias=net[3] < 4), cuda) == (True, ""), net
    # out widths padded to a multiple of 8 on the host; explain() says so
    assert hopper_backward.tma_out(_spec((32, 64, 3, 2))).widths == (32, 64, 64, 8)
    assert hopper_backward.tma_out(_spec((32, 64, 57, 2))).out_features == 64
    padded = _spec((32, 64, 3, 2))
    assert hopper_backward.tma_out(_spec((32, 64, 16, 2))) == _spec((32, 64, 16, 2))
    monkeypatch.setattr(tb.TritonBackend, "recomputes", lambda self, s, d: True)
    assert "out width padded with 5 zero columns" in tb.TritonBackend().supports(
        padded, cuda)[1]
    assert hopper_backward.eligible(_spec((64, 64, 64, 4), bias=True), cuda) == (True, "")
    for spec, why in [
            (_spec((64, 64, 64, 4), dtype=torch.float32), "fp16 and bf16"),
            (_spec((64, 48, 64, 4)), "hidden width 48"),
            (_spec((64, 128, 64, 4)), "hidden width 128"),
            (_spec((60, 64, 64, 4)), "in width not a multiple of 8"),
            (_spec((128, 64, 64, 4)), "up to 64"),
            (_spec((64, 64, 65, 4)), "out width above 64"),
            (_spec((64, 64, 64, 6)), "hidden-to-hidden"),
            (_spec((64, 64, 64, 4), "gelu"), "do not fit"),
            (_spec((64, 64, 64, 5), bias=True), "biases with more than 3")]:
        assert why in hopper_backward.eligible(spec, cuda)[1], spec
    # softplus, tanh and sigmoid take the derivative from the stored activation: the sdf
    # net fits, and training recomputes (the one-kernel Triton backward does not take
    # it); gelu keeps its z tiles and does not fit
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for act in ("softplus", "tanh", "sigmoid", "gelu"):
        sdf = _spec((32, 64, 16, 4), act, bias=True)
        fits = act != "gelu"
        assert hopper_backward.keeps_z(sdf.activation_id) is not fits
        assert hopper_backward.from_output(sdf.activation_id) is fits
        assert hopper_backward.eligible(sdf, cuda)[0] is fits, act
        assert n_backward.gluon_takes(sdf, cuda) is fits
        assert tb.TritonBackend().recomputes(sdf, cuda) is fits
        assert not n_tuning._one_kernel(n_tuning._split_backward(cuda, sdf), sdf)
        assert not n_backward.gluon_takes(sdf, cpu)
    assert hopper_backward.keeps_z(4 + tb_common.APPROX)  # gelu_tanh's PTX form keeps z
    assert not hopper_backward.keeps_z(8 + tb_common.APPROX)  # softplus's does not
    monkeypatch.setenv(hopper_backward.ENV, "0")  # the switch is read on every call
    assert not n_backward.gluon_takes(_spec((32, 64, 16, 4), "softplus", bias=True), cuda)
    monkeypatch.setenv(hopper_forward.ENV, "0")
    assert hopper_backward.eligible(ok, cuda)[1] == f"{hopper_forward.ENV}=0"


def test_tma_refuses_broadcast_and_misaligned_rows():
    """Both Gluon kernels read x (and grad_y) by TMA only where its rows are real rows:
    a broadcast (zero row stride, a column sum's gradient), a transposed or a misaligned
    tensor takes the Triton kernels (or is made dense first)."""
    t = torch.zeros(300, 64, dtype=torch.float16)
    assert hopper_forward.tma_rows(t) and hopper_backward.Plan.accepts(t, t)
    assert hopper_forward.Plan.accepts(t)
    row = torch.zeros(64, dtype=torch.float16).expand(300, 64)  # strides (0, 1)
    for bad in (row, t.t(), torch.zeros(300, 65, dtype=torch.float16)[:, :64],
                torch.zeros(300 * 64 + 1, dtype=torch.float16)[1:].view(300, 64)):
        assert not hopper_forward.tma_rows(bad)
        assert not hopper_backward.Plan.accepts(t, bad)
        assert not hopper_backward.Plan.accepts(bad, t)
        assert not hopper_forward.Plan.accepts(bad)
    # the backward makes grad_y dense where TMA cannot read its rows (a broadcast, a
    # column slice); a readable one is passed as it is
    for bad in (row, torch.zeros(300, 65, dtype=torch.float16)[:, :64]):
        dense = hopper_backward.Plan.rows(bad)
        assert hopper_forward.tma_rows(dense) and torch.equal(dense, bad)
    assert hopper_backward.Plan.rows(t) is t


def test_tuning_fits_shared_memory():
    """Three chains at hidden <= 32 where they fit, else two; two x stages where they fit,
    else one; the count matches what the sm_90 compile allocates (ci/aot_narrow.py checks
    it) and stays under the limit; the warpgroups' registers fit the launch's."""
    for net in NETS + BIAS_NETS:
        for act in ("relu", "gelu"):
            spec = _spec(net, act, bias=net in BIAS_NETS)
            t = hopper_backward.tuning(spec)
            if t is None:
                assert hopper_backward.smem_bytes(spec, 2, 1) > hopper_forward.SMEM_BYTES
                continue
            chains, stages = t
            assert hopper_backward.smem_bytes(spec, chains, stages) <= hopper_forward.SMEM_BYTES
            if stages == 1:
                assert hopper_backward.smem_bytes(spec, chains, 2) > hopper_forward.SMEM_BYTES
            if chains == 2 and net[1] <= 32:
                assert hopper_backward.smem_bytes(spec, 3, 1) > hopper_forward.SMEM_BYTES
            if hopper_forward.gluon is not None:
                c = hopper_backward.kernel_consts(spec, True, True, spec.bias)
                assert (c["CHAINS"], c["X_STAGES"]) == t
                assert (chains * c["CHAIN_REGS"] + c["SUM_REGS"]
                        <= (chains + 1) * hopper_backward.maxnreg(chains))
    assert hopper_backward.tuning(_spec((64, 64, 64, 4))) == (2, 2)
    assert hopper_backward.tuning(_spec((64, 64, 64, 5))) == (2, 1)
    assert hopper_backward.tuning(_spec((64, 64, 64, 2), "gelu")) == (2, 2)
    assert hopper_backward.tuning(_spec((64, 64, 64, 3), "gelu")) == (2, 1)
    assert hopper_backward.tuning(_spec((64, 64, 64, 4), "gelu")) is None
    assert hopper_backward.tuning(_spec((64, 64, 64, 4), bias=True)) == (2, 2)
    assert hopper_backward.tuning(_spec((64, 32, 64, 4))) == (3, 1)
    assert hopper_backward.tuning(_spec((32, 16, 8, 3))) == (3, 2)
    assert hopper_backward.tuning(_spec((64, 32, 64, 4), "gelu", bias=True)) == (2, 2)
    assert hopper_backward.maxnreg(2) == 168 and hopper_backward.maxnreg(3) == 128


def test_row_descriptors_kept_per_address_without_the_tensor():
    """Both Gluon plans keep x's, grad_y's and their outputs' TMA descriptors per (address,
    rows, row stride) (host time: the caching allocator hands the same blocks back), at
    most ROW_DESCS, and none keeps its tensor alive."""
    if hopper_forward.gluon is None:
        pytest.skip(f"no Gluon: {hopper_forward.IMPORT_ERROR}")
    import gc
    import weakref

    from triton.experimental.gluon import language as gl

    lay = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
    cache = {}
    t = torch.zeros(300, 64, dtype=torch.float16)
    d = hopper_forward.row_desc(cache, t, [64, 64], lay)
    assert list(d.shape) == [300, 64] and list(d.strides) == [64, 1]
    assert d.base.data_ptr() == t.data_ptr()
    assert hopper_forward.row_desc(cache, t, [64, 64], lay) is d
    same = t.view(300, 64)  # another tensor at the same address: the same descriptor
    assert hopper_forward.row_desc(cache, same, [64, 64], lay) is d
    fewer = hopper_forward.row_desc(cache, t[:200], [64, 64], lay)
    assert fewer is not d and list(fewer.shape) == [200, 64]
    strided = torch.zeros(300, 128, dtype=torch.float16)[:, 64:]
    sd = hopper_forward.row_desc(cache, strided, [64, 64], lay)
    assert list(sd.strides) == [128, 1] and sd.base.data_ptr() == strided.data_ptr()
    for i in range(2 * hopper_forward.ROW_DESCS):
        hopper_forward.row_desc(cache, t[: i + 1], [64, 64], lay)
        assert len(cache) <= hopper_forward.ROW_DESCS
    u = torch.zeros(100, 64, dtype=torch.float16)
    hopper_forward.row_desc(cache, u, [64, 64], lay)
    ref = weakref.ref(u)
    del u
    gc.collect()
    assert ref() is None


def test_recompute_benchmark_checks_then_times(tmp_path, monkeypatch):
    """benchmarks/narrow_recompute.py: every variant's gradients checked against float64
    before it is timed (a variant beyond the bound is reported WRONG and not timed), the
    JSON written with the environment and what the backend takes by default."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "narrow_recompute.py"
    spec = importlib.util.spec_from_file_location("bench_narrow_recompute", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from fusedmlp_xpu.bench import results

    out = tmp_path / "rc.jsonl"
    assert mod.main(["--out", str(out), "--run", "rc", "--nets", "sdf-softplus", "--rows", "40",
                     "--rounds", "1"]) == 0
    got = results.documents(results.read(str(out)))["rc"]
    assert got["env"] and len(got["records"]) == 1
    rec = got["records"][0]
    assert rec["widths"] == [32, 64, 64, 64, 64, 16] and rec["rows"] == 40
    assert isinstance(rec["default_recomputes"], bool) and rec["explain"]
    for v in ("recompute", "save", "eager"):
        assert rec[f"{v}_ms"] > 0 and rec[f"{v}_max_rel_err"] < mod.TOL[torch.float16]
    # a variant whose gradients are off is not timed
    real = mod._error
    calls = []

    def off_for_save(got_, ref):
        calls.append(None)
        return 1.0 if len(calls) == 2 else real(got_, ref)  # the second variant: save

    monkeypatch.setattr(mod, "_error", off_for_save)
    logs = []
    recs = mod.run(["sdf-softplus"], [40], torch.float16, 1, torch.device("cpu"), logs.append)
    assert "save_ms" not in recs[0] and recs[0]["recompute_ms"] > 0
    assert any(line.startswith("WRONG sdf-softplus 40 save") for line in logs)
