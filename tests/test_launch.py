"""The lean launch path (backends/triton/launch.py): which calls reuse a compiled kernel,
and what they hand its launcher. CPU: a stand-in kernel records every launch; GPU: real
kernels across changes of alignment and sizes, against the float64 reference."""
import functools
import os
import types

import pytest
import torch

import fusedmlp_xpu as fm

from conftest import BACKENDS, assert_close, reference, tolerance
from fusedmlp_xpu.backends.triton.narrow import backward as n_backward
from fusedmlp_xpu.backends.triton.narrow import forward as n_forward
from fusedmlp_xpu.backends.triton.narrow import launchers as n_launchers
from fusedmlp_xpu.backends.triton.narrow import reduce as n_reduce
from fusedmlp_xpu.backends.triton.narrow import tuning as n_tuning

launch = pytest.importorskip("fusedmlp_xpu.backends.triton.launch")


class _Param:
    def __init__(self, name, constexpr):
        self.name, self.is_constexpr = name, constexpr


class _FakeKernel:
    """Stands in for a JITFunction: ``fn[grid](...)`` "compiles" (counted) and returns a
    compiled kernel whose launcher records what it is handed."""

    params = [_Param("x_ptr", False), _Param("n", False), _Param("A", True), _Param("B", True)]

    def __init__(self):
        self.compiles, self.direct = 0, []

    def __getitem__(self, grid):
        def jit_launch(*args, **kwargs):
            self.compiles += 1
            self.kwargs = kwargs  # the last compile's constexprs and options
            return types.SimpleNamespace(run=lambda *a: self.direct.append(a),
                                         function="fn", packed_metadata="meta")
        return jit_launch


@pytest.fixture
def fake_cuda(monkeypatch):
    monkeypatch.setattr(launch, "enabled", lambda device: True)
    monkeypatch.setattr(launch, "_hooked", lambda: False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda idx: 1234, raising=False)
    return torch.device("cuda", 0)


def test_no_launch_hook_by_default():
    """Triton's default knobs (None, or an empty hook chain) leave the lean path on."""
    assert not launch._hooked()


def test_arg_key_separates_what_triton_specializes_on():
    buf = torch.zeros(64, dtype=torch.float16)
    k = launch.arg_key
    assert k(buf) != k(buf[1:])  # 16-byte aligned vs not
    assert k(buf) != k(buf.float())  # dtype
    assert k(buf[8:]) == k(buf)  # 16 bytes further: still aligned
    assert k(1) != k(17)  # == 1
    assert k(16) != k(17)  # divisible by 16
    assert k(17) == k(33)
    assert k(2 ** 31 + 16) != k(16)  # needs 64 bits
    assert k(None) != k(0)


def test_launcher_reuses_only_an_identical_specialization(fake_cuda):
    fn = _FakeKernel()
    la = launch.Launcher(fn)
    buf = torch.zeros(64, dtype=torch.float16)
    la.launch((3,), (buf, 17), dict(B=2, A=1), fake_cuda, num_warps=4)
    assert (fn.compiles, len(fn.direct)) == (1, 0)
    la.launch((5, 2), (buf, 33), dict(B=2, A=1), fake_cuda, num_warps=4)
    assert (fn.compiles, len(fn.direct)) == (1, 1)
    # grid, stream, function, metadata, no hooks, runtime args, constexprs in signature order
    assert fn.direct[0] == (5, 2, 1, 1234, "fn", "meta", None, None, None, buf, 33, 1, 2)
    assert la.direct == 1
    for changed in [((buf[1:], 33), dict(B=2, A=1), 4),  # misaligned pointer
                    ((buf, 32), dict(B=2, A=1), 4),  # a multiple of 16
                    ((buf, 1), dict(B=2, A=1), 4),  # equal to 1
                    ((buf.float(), 33), dict(B=2, A=1), 4),  # dtype
                    ((buf, 33), dict(B=3, A=1), 4),  # a constexpr
                    ((buf, 33), dict(B=2, A=1), 8)]:  # a launch option
        before = fn.compiles
        la.launch((1,), changed[0], changed[1], fake_cuda, num_warps=changed[2])
        assert fn.compiles == before + 1, changed
    assert len(fn.direct) == 1


def test_launcher_takes_tritons_path_when_a_hook_is_set(fake_cuda, monkeypatch):
    fn = _FakeKernel()
    la = launch.Launcher(fn)
    buf = torch.zeros(64, dtype=torch.float16)
    la.launch((1,), (buf, 17), {"A": 1, "B": 2}, fake_cuda)
    monkeypatch.setattr(launch, "_hooked", lambda: True)  # e.g. a profiler's launch hook
    la.launch((1,), (buf, 17), {"A": 1, "B": 2}, fake_cuda)
    assert (fn.compiles, len(fn.direct)) == (2, 0)


def test_tuned_launcher_keys_on_tuning_values_and_uses_the_chosen_config(fake_cuda):
    fn = _FakeKernel()
    fn.params = [_Param("x_ptr", False), _Param("K", False), _Param("A", True),
                 _Param("BLOCK", True), _Param("EVEN", True)]
    class Tuner:  # picks BLOCK 64 for K > 100, else 16, like an autotuner would by timing
        best_config = None

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                self.best_config = types.SimpleNamespace(
                    kwargs={"BLOCK": 64 if args[1] > 100 else 16}, pre_hook=None)
                return fn[grid](*args, **kwargs)
            return run

    tl_ = launch.TunedLauncher(Tuner(), fn, {"EVEN": lambda a: a["K"] % a["BLOCK"] == 0},
                               tune=("K",))
    buf = torch.zeros(64, dtype=torch.float16)
    grid = lambda meta: (1000 // meta["BLOCK"],)  # noqa: E731
    tl_.launch(grid, (buf, 128), {"A": 7}, fake_cuda)
    tl_.launch(grid, (buf, 128), {"A": 7}, fake_cuda)
    assert (fn.compiles, len(fn.direct), tl_.direct) == (1, 1, 1)
    # the grid from the chosen config, the heuristic's value, constexprs in order
    assert fn.direct[0] == (15, 1, 1, 1234, "fn", "meta", None, None, None, buf, 128, 7, 64, True)
    tl_.launch(grid, (buf, 144), {"A": 7}, fake_cuda)  # same specialization, new tuning value
    assert (fn.compiles, len(fn.direct)) == (2, 1)


GPU = [(n, d) for n, d in BACKENDS if d.type == "cuda" and n == "triton"]


@pytest.mark.gpu
@pytest.mark.parametrize("widths", [(64, 64, 64, 64, 16), (64, 256, 64)], ids=["narrow", "wide"])
@pytest.mark.parametrize("backend", GPU, ids=[f"{n}-{d.type}" for n, d in GPU])
def test_fast_launches_follow_alignment_and_size_changes(backend, widths, monkeypatch):
    """The same module called with x aligned and misaligned, with 1, 16 and 1037 rows,
    in an order that revisits each: every result against the float64 reference. (Wide
    layers: cuBLAS's forward off, else these bias + ReLU layers launch no Triton kernel.)"""
    name, dev = backend
    monkeypatch.setenv("FUSEDMLP_WIDE_BLAS", "0")
    dt = torch.float16
    m = fm.FusedMLP(widths[0], widths[-1], widths[1], len(widths) - 2, device=dev, dtype=dt,
                    backend=name)
    tol = tolerance(name, dt)
    wide = pytest.importorskip("fusedmlp_xpu.backends.triton.wide")

    def lean_launches():
        return sum(la.direct for la in [*n_launchers._LAUNCHERS.values(),
                                        *wide.configs._tuned.values()])
    before = lean_launches()
    for rows, offset in [(1037, 0), (1037, 1), (16, 0), (1, 0), (1037, 0), (16, 1), (1037, 1)]:
        flat = torch.randn(rows * widths[0] + offset, device=dev, dtype=dt)
        x = flat[offset:].view(rows, widths[0])
        assert (x.data_ptr() % 16 == 0) == (offset == 0)
        with torch.no_grad():
            y = m(x)
        assert_close(y, reference(x, m.weights(), m.biases(), "relu", "none"), tol,
                     f"{rows} rows, offset {offset}")
    # the revisited specializations went through the lean path
    assert lean_launches() > before


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU, ids=[f"{n}-{d.type}" for n, d in GPU])
def test_bound_module_calls_follow_parameter_changes(backend):
    """A FusedMLP's bound no-grad calls (int addresses, module.py) on real kernels, with
    the parameters changed between calls in every way a user can: in place, re-pointed,
    replaced, unpacked, moved to another dtype. Each result against the float64
    reference of the current parameters."""
    name, dev = backend
    torch.manual_seed(0)
    m = fm.FusedMLP(64, 16, 64, 3, "tanh", bias=True, device=dev, dtype=torch.float16,
                    backend=name)
    x = torch.randn(1037, 64, device=dev, dtype=torch.float16)

    def renew(t):
        return torch.randn_like(t)

    changes = [
        ("none", lambda: None),
        ("bias in place", lambda: m.linears[0].bias.mul_(-2)),
        ("weight re-pointed", lambda: setattr(m.linears[-1].weight, "data",
                                              renew(m.linears[-1].weight))),
        ("state_dict assigned", lambda: m.load_state_dict(
            {k: renew(v) for k, v in m.state_dict().items()}, assign=True)),
        ("packed again", lambda: m._pack_hidden()),
        ("hidden weight re-pointed", lambda: setattr(m.linears[1].weight, "data",
                                                     renew(m.linears[1].weight))),
        ("to bf16", lambda: m.to(torch.bfloat16)),
    ]
    direct = sum(la.direct for la in n_launchers._LAUNCHERS.values())
    for what, change in changes:
        with torch.no_grad():
            change()
            xs = x.to(m.weights()[0].dtype)
            for _ in range(2):  # the second call of each takes the bound path if any
                y = m(xs)
                assert_close(y, reference(xs, m.weights(), m.biases(), "tanh", "none"),
                             tolerance(name, xs.dtype), what)
    assert m._bound is not None
    assert sum(la.direct for la in n_launchers._LAUNCHERS.values()) > direct


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GPU, ids=[f"{n}-{d.type}" for n, d in GPU])
def test_fast_backward_launches_follow_alignment_and_size_changes(backend):
    """Train steps of one module (the one-kernel backward where the device takes it,
    _OneKernelBackward) with x aligned and misaligned, and rows that change the kernels'
    specialization (1, 16, 1037; 70001: more row blocks than programs), in an order
    that revisits each: every output and gradient against the float64 reference."""
    name, dev = backend
    torch.manual_seed(0)
    dt = torch.float16
    m = fm.FusedMLP(64, 16, 32, 3, "tanh", bias=True, device=dev, dtype=dt, backend=name)
    tol = tolerance(name, dt)

    def direct():
        return sum(la.direct for k, la in n_launchers._LAUNCHERS.items() if k.startswith("bwd"))
    before = direct()
    for rows, offset in [(1037, 0), (1037, 1), (16, 0), (1, 0), (1037, 0), (70001, 0),
                         (16, 1), (1037, 1), (70001, 0), (1037, 0)]:
        flat = torch.randn(rows * 64 + offset, device=dev, dtype=dt)
        x = flat[offset:].view(rows, 64).requires_grad_()
        assert (x.data_ptr() % 16 == 0) == (offset == 0)
        m.zero_grad(set_to_none=True)
        y = m(x)
        gy = torch.randn_like(y)
        y.backward(gy)
        ry, rgx, rgw, rgb = reference(x, m.weights(), m.biases(), "tanh", "none", grad_y=gy)
        what = f"{rows} rows, offset {offset}"
        assert_close(y, ry, tol, what)
        assert_close(x.grad, rgx, tol, f"grad x, {what}")
        for i, (w, b) in enumerate(zip(m.weights(), m.biases())):
            assert_close(w.grad, rgw[i], tol, f"grad weights[{i}], {what}")
            assert_close(b.grad, rgb[i], tol, f"grad biases[{i}], {what}")
    if n_tuning._one_kernel(n_tuning._split_backward(dev, m.spec(dt)), m.spec(dt)):
        assert direct() > before  # the revisited specializations launched directly


@pytest.mark.parametrize("tuning", [(1024, 2), (128, 32), (1024, 8)],
                         ids=lambda t: f"span{t[0]}-step{t[1]}")
def test_reduce_grads_sums_every_partial_at_each_tuning(monkeypatch, tuning):
    """The backward's reduction (_reduce_grads_kernel, interpreter) at the tunings of each
    device (_reduce_tuning): every layer's weight and bias gradient is the sum of its slot
    over all programs' partials, unpadded; padded widths 16, 64 and 128, a program count
    that no step divides."""
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    if not tb.common.interpreting():
        pytest.skip("the triton backend takes CPU tensors only under TRITON_INTERPRET=1")
    monkeypatch.setattr(n_reduce, "_reduce_tuning", lambda device_type: tuning)
    monkeypatch.setattr(n_reduce, "_reduce_layout",
                        functools.lru_cache(maxsize=8)(n_reduce._reduce_layout.__wrapped__))
    for widths in [(16, 8, 8, 12), (64, 32, 32, 32, 64), (100, 128, 128, 3)]:
        spec = fm.MLPSpec(widths, "relu", "none", True, torch.float16)
        T_P = n_launchers._launch_meta(spec, "cpu")["H_P"]
        W_SLOT, SLOT = T_P * T_P, T_P * T_P + T_P
        acc = torch.randn(37, spec.n_layers, SLOT)
        gws, gbs = n_reduce._reduce_grads(acc, spec, T_P, W_SLOT, SLOT, True, True,
                                    torch.empty(1, dtype=torch.float16))
        total = acc.double().sum(0)
        for i, (n, o) in enumerate(zip(widths[:-1], widths[1:])):
            assert_close(gws[i], total[i, :W_SLOT].view(T_P, T_P)[:o, :n], 1e-3,
                         f"{widths}: weight {i}")
            assert_close(gbs[i], total[i, W_SLOT:W_SLOT + o], 1e-3, f"{widths}: bias {i}")


def test_args_key_is_arg_key_of_each():
    buf = torch.zeros(64, dtype=torch.float16)
    p = torch.nn.Parameter(torch.zeros(8, dtype=torch.float32))
    args = (buf, buf, 17, buf, buf[1:], buf[1:], p, 1, p, None, 2 ** 40, True, buf)
    assert launch.args_key(args) == tuple(launch.arg_key(a) for a in args)


class _RecordingKernel(_FakeKernel):
    params = []  # no constexprs: the launcher's constexpr tail stays empty


@pytest.mark.parametrize("hidden_layers, save", [(4, False), (4, True), (6, False)],
                         ids=["persistent", "persistent-save", "per-block"])
def test_forward_plan_reuses_a_kernel_only_for_the_same_specialization(
        fake_cuda, monkeypatch, hidden_layers, save):
    """The narrow forward's plan (backends/triton _NarrowForward) keys its direct launches
    on x's rows and strides and the pointers' alignment only: a call that specializes like
    an earlier one is launched directly, with the same tensors, the right grid and sizes;
    any other call compiles (here: a stand-in kernel records compiles and launches)."""
    kernels = {"fwd": _RecordingKernel(), "fwd_persistent": _RecordingKernel()}
    monkeypatch.setattr(n_launchers, "_LAUNCHERS", {k: launch.Launcher(f) for k,
                                                    f in kernels.items()})
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_launchers, "_SM_COUNT", {0: 132})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from fusedmlp_xpu.backends import memory
    made = []  # outputs come from memory.new_empty (what the tests poison with NaN)
    real = memory.new_empty
    monkeypatch.setattr(memory, "new_empty", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    spec = fm.MLPSpec((64,) + (32,) * hidden_layers + (16,), "relu", "none", True,
                      torch.float16)
    plan = n_forward._NarrowForward(spec, fake_cuda, save)
    persistent = plan.persistent is not None
    assert persistent == (hidden_layers <= 4)
    k = kernels["fwd_persistent" if persistent else "fwd"]
    ws = [torch.randn(o, i, dtype=torch.float16) for i, o in zip(spec.widths, spec.widths[1:])]
    bs = [torch.randn(o, dtype=torch.float16) for o in spec.widths[1:]]

    def call(rows, offset=0, stride=64):
        flat = torch.randn(rows * stride + offset, dtype=torch.float16)
        x = flat[offset:].as_strided((rows, 64), (stride, 1))
        y, saved = plan(x, ws, bs)
        assert y.shape == (rows, 16) and (saved is None) != save
        assert y is made[-2 if save else -1] and (not save or saved is made[-1])
        return x, y, saved

    call(33)
    assert (k.compiles, len(k.direct)) == (1, 0)
    x, y, saved = call(45)  # same specialization: not 1, not a multiple of 16, 32-bit
    assert (k.compiles, len(k.direct)) == (1, 1)
    a = k.direct[-1]
    L = hidden_layers - 1
    # the tensors (hidden weights and biases stacked in a fresh copy here: not packed)
    assert a[9] is x and a[10] is ws[0] and a[12] is ws[-1] and a[13] is bs[0]
    assert a[15] is bs[-1] and a[16] is y and a[17] is (saved if save else y)
    sizes = a[18:]
    S = sum(spec.widths[1:-1])
    if persistent:
        assert a[0] == min(45 // 64 + 1, 132 * plan.persistent[3])
        assert sizes == (45, 64, 32, 16, 64, 1, 16, S if save else 16)
    else:
        assert a[0] == (45 + plan.tuning[0] - 1) // plan.tuning[0]
        assert sizes == (45, 64, 32, 16, L, 64, 1, 16, S if save else 16)
    for changed in [dict(rows=48), dict(rows=1), dict(rows=45, stride=72),
                    dict(rows=45, offset=1)]:
        before = k.compiles
        call(**changed)
        assert k.compiles == before + 1, changed
    assert len(k.direct) == 1
    general = []  # launch.py's own key is built only on the general path
    real_key = launch.args_key
    monkeypatch.setattr(launch, "args_key", lambda args: general.append(1) or real_key(args))
    call(45)
    assert not general and len(k.direct) == 2
    call(45, offset=1)  # misaligned: the launcher's own key (still lean), never the plan's
    assert len(plan._entries) == 4 and len(k.direct) == 3 and general
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # another device current
    before = (k.compiles, len(k.direct), len(general))
    call(45)
    # the general path (with its device guard), launched from launch.py's cache
    assert (k.compiles, len(k.direct)) == (before[0], before[1] + 1) and len(general) > before[2]
    monkeypatch.setattr(launch, "_hooked", lambda: True)  # e.g. a profiler's launch hook
    call(45)
    assert (k.compiles, len(k.direct)) == (before[0] + 1, before[1] + 1)


@pytest.mark.parametrize("recompute, needs", [
    (True, (True, True, True)), (False, (True, True, True)), (True, (True, False, False)),
    (True, (False, True, False))], ids=["recompute", "saved", "x-only", "w-only"])
def test_backward_plan_reuses_kernels_only_for_the_same_specialization(
        fake_cuda, monkeypatch, recompute, needs):
    """The one-kernel backward's plan (_OneKernelBackward) launches the chain and the
    reduction directly once both compiled for a specialization: x's rows and strides, the
    saved tensor's row stride, the row-block and program counts, the pointers'
    alignment. Any change there compiles (a stand-in kernel records compiles and
    launches); the gradients are views of the reduction's one output."""
    kernels = {"bwd_recompute": _RecordingKernel(), "bwd_resident": _RecordingKernel(),
               "reduce": _RecordingKernel()}
    monkeypatch.setattr(n_launchers, "_LAUNCHERS", {k: launch.Launcher(f) for k,
                                                    f in kernels.items()})
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_launchers, "_SM_COUNT", {0: 132})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from fusedmlp_xpu.backends import memory
    made = []
    real = memory.new_empty
    monkeypatch.setattr(memory, "new_empty", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    spec = fm.MLPSpec((64, 32, 32, 32, 16), "relu", "none", True, torch.float16)
    split = n_tuning._split_nvidia(spec)
    assert n_tuning._one_kernel(split, spec)
    plan = n_backward._OneKernelBackward(spec, fake_cuda, split, needs, recompute)
    chain = kernels["bwd_recompute" if recompute else "bwd_resident"]
    red = kernels["reduce"]
    grads = needs[1] or needs[2]
    ws = [torch.randn(o, i, dtype=torch.float16) for i, o in zip(spec.widths, spec.widths[1:])]
    bs = [torch.randn(o, dtype=torch.float16) for o in spec.widths[1:]]

    def call(rows, offset=0, stride=64):
        flat = torch.randn(rows * stride + offset, dtype=torch.float16)
        x = flat[offset:].as_strided((rows, 64), (stride, 1))
        gy = torch.randn(rows, 16, dtype=torch.float16)
        z = None if recompute else torch.randn(rows, 64, dtype=torch.float16)
        made.clear()
        gx, gws, gbs = plan(gy, x, ws, bs, z)
        assert (gx is made[0]) == needs[0] and (gx is None) != needs[0]
        if grads:
            out = made[-1]
            assert [g.shape for g in gws] == ([w.shape for w in ws] if needs[1] else [])
            assert [g.shape for g in gbs] == ([b.shape for b in bs] if needs[2] else [])
            for g in gws + gbs:
                assert g.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
        else:
            assert gws == [] and gbs == []
        return gy, x, z

    def counts():
        return chain.compiles, len(chain.direct), red.compiles, len(red.direct)

    call(45)
    assert counts() == (1, 0, int(grads), 0)
    gy, x, z = call(45)  # same specialization
    assert counts() == (1, 1, int(grads), int(grads))
    a = chain.direct[-1]
    assert a[9] is gy and a[10] is x and a[11] is ws[0] and a[13] is ws[-1]
    assert a[14] is (x if recompute else z) and a[15] is (made[0] if needs[0] else x)
    acc = a[16]
    assert acc.dtype == torch.float32 and acc.shape == (1, 4, 64 * 64 + 64)  # T_P 64
    if recompute:  # the biases, for the pre-activations
        assert a[17] is bs[0] and a[19] is bs[-1]
    assert a[0] == 1 and a[20:29] == (45, 64, 32, 16, 1, 16, 64, 1, 64)
    if grads:
        r = red.direct[-1]
        assert r[9] is acc and r[10] is made[-1] and r[11:16] == (1, 64, 32, 16, 2)
    general = []  # launch.py's own key is built only off the plan's direct path
    real_key = launch.args_key
    monkeypatch.setattr(launch, "args_key", lambda args: general.append(1) or real_key(args))
    call(45)
    assert not general and counts() == (1, 2, int(grads), 2 * int(grads))
    # 77 rows: M specializes as 45 does, but two row blocks (64 rows each) are not one
    for changed in [dict(rows=77), dict(rows=48), dict(rows=1), dict(rows=45, stride=72),
                    dict(rows=45, offset=1)]:
        before = counts()
        call(**changed)
        assert counts()[0] == before[0] + 1 and counts()[1] == before[1], changed
    assert call(77) and chain.direct[-1][0] == 2 and chain.direct[-1][20] == 77
    n = len(chain.direct)
    call(64 * 330 + 5)  # more row blocks than programs (2 per SM); as 77 rows
    assert len(chain.direct) == n + 1 and chain.direct[-1][0] == 2 * 132
    before = counts()
    call(64 * 320 - 1)  # the same but for 320 row blocks, a multiple of 16
    assert counts()[:2] == (before[0] + 1, before[1])
    monkeypatch.setattr(launch, "_hooked", lambda: True)  # e.g. a profiler's launch hook
    before = counts()
    call(45)
    assert counts()[:2] == (before[0] + 1, before[1])


def test_one_kernel_register_cap_reaches_the_gpu_compile_only(fake_cuda, monkeypatch):
    """Split.g_maxnreg: the one-kernel backward compiles with maxnreg on CUDA (ptxas caps
    its registers); off CUDA (the interpreter takes no such option) nothing is added."""
    spec = fm.MLPSpec((64, 32, 32, 32, 16), "relu", "none", False, torch.float16)
    split = n_tuning._split_nvidia(spec)._replace(g_maxnreg=168)
    assert n_tuning._one_kernel(split, spec)
    chain, red = _RecordingKernel(), _RecordingKernel()
    monkeypatch.setattr(n_launchers, "_LAUNCHERS", {"bwd_recompute": launch.Launcher(chain),
                                           "reduce": launch.Launcher(red)})
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_launchers, "_SM_COUNT", {0: 132})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for device, want in ((fake_cuda, {"maxnreg": 168}), (torch.device("cpu"), {})):
        assert n_backward._OneKernelBackward(spec, device, split, (True, True, False),
                                     True).options == want
    plan = n_backward._OneKernelBackward(spec, fake_cuda, split, (True, True, False), True)
    ws = [torch.randn(o, i, dtype=torch.float16) for i, o in zip(spec.widths, spec.widths[1:])]
    for _ in range(2):  # a compile, then a direct launch of what it kept
        plan(torch.randn(45, 16, dtype=torch.float16), torch.randn(45, 64, dtype=torch.float16),
             ws, None, None)
    assert chain.compiles == 1 and len(chain.direct) == 1
    assert chain.kwargs["maxnreg"] == 168 and chain.kwargs["num_warps"] == split.g_warps
    assert "maxnreg" not in red.kwargs


def test_bound_module_call_launches_with_the_current_addresses(fake_cuda, monkeypatch):
    """A FusedMLP's no-grad calls, once bound (module.py), launch the compiled kernel
    directly with the addresses of x, y and the parameters as ints; a parameter re-pointed
    rebinds to its new address, and hidden weights that no longer lie back to back leave
    the bound path (the plan then stacks a copy). A stand-in kernel records the launches;
    the module's tensors are CPU tensors standing for one device's."""
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    if not tb.common.interpreting():
        pytest.skip("the triton backend takes CPU tensors only under TRITON_INTERPRET=1")
    k = _RecordingKernel()
    monkeypatch.setattr(n_launchers, "_LAUNCHERS", {"fwd": launch.Launcher(k)})
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_forward, "_forward_plan",
                        functools.lru_cache(maxsize=8)(n_forward._NarrowForward))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: None)  # a CPU device's index
    m = fm.FusedMLP(64, 16, 32, 3, "tanh", bias=True, dtype=torch.float16, backend="triton")
    x = torch.randn(45, 64, dtype=torch.float16)
    with torch.no_grad():
        m(x)  # binds; the first launch of this specialization compiles
        assert (k.compiles, len(k.direct)) == (1, 0) and m._bound is not None
        y = m(x)
    assert len(k.direct) == 1
    a = k.direct[-1]
    ws, bs = m.weights(), m.biases()
    assert a[9:18] == (x.data_ptr(), ws[0].data_ptr(), ws[1].data_ptr(), ws[-1].data_ptr(),
                       bs[0].data_ptr(), bs[1].data_ptr(), bs[-1].data_ptr(), y.data_ptr(),
                       y.data_ptr())
    assert a[18:] == (45, 64, 32, 16, 2, 64, 1, 16, 16)
    with torch.no_grad():
        m.linears[0].weight.data = torch.randn(32, 64, dtype=torch.float16)
        m(x)
    assert k.compiles == 1 and len(k.direct) == 2
    assert k.direct[-1][10] == m.linears[0].weight.data_ptr() != a[10]
    with torch.no_grad():
        m.linears[2].weight.data = torch.randn(32, 32, dtype=torch.float16)  # unpacked
        m(x)
    hidden = k.direct[-1][11]  # a stacked copy, handed over as a tensor
    assert isinstance(hidden, torch.Tensor) and torch.equal(hidden[1], m.linears[2].weight)


class _PadsKernel(_FakeKernel):
    """Records the padded tile widths a launch asks for (its only constexprs)."""
    params = [_Param("IN_P", True), _Param("H_P", True), _Param("OUT_P", True)]


@pytest.mark.parametrize("hidden_layers, save", [(4, False), (4, True), (6, False)],
                         ids=["persistent", "persistent-save", "per-block"])
def test_forward_pads_each_width_on_its_own(fake_cuda, monkeypatch, hidden_layers, save):
    """Both narrow forward kernels get in, hidden and out padded each to its own power of
    two (64 -> 32 -> 16 here: fewer multiply-adds than tiles of 64 throughout), and every
    tile at the widest with OWN_PADDING off."""
    spec = fm.MLPSpec((64,) + (32,) * hidden_layers + (16,), "relu", "none", True,
                      torch.float16)
    ws = [torch.randn(o, i, dtype=torch.float16) for i, o in zip(spec.widths, spec.widths[1:])]
    bs = [torch.randn(o, dtype=torch.float16) for o in spec.widths[1:]]
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_launchers, "_SM_COUNT", {0: 132})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for own, pads in ((True, (64, 32, 16)), (False, (64, 64, 64))):
        kernels = {"fwd": _PadsKernel(), "fwd_persistent": _PadsKernel()}
        monkeypatch.setattr(n_launchers, "_LAUNCHERS",
                            {k: launch.Launcher(f) for k, f in kernels.items()})
        monkeypatch.setattr(n_tuning, "OWN_PADDING", own)
        plan = n_forward._NarrowForward(spec, fake_cuda, save)
        k = kernels["fwd_persistent" if plan.persistent is not None else "fwd"]
        for _ in range(2):  # the second launch is direct: the constexprs ride at its end
            plan(torch.randn(45, 64, dtype=torch.float16), ws, bs)
        assert len(k.direct) == 1 and k.direct[-1][-3:] == pads, own


@pytest.mark.parametrize("chain", ["resident", "unrolled", "layer-loop", None, "one-kernel"],
                         ids=["resident", "unrolled", "layer-loop", "fused", "one-kernel"])
def test_backward_pads_each_width_on_its_own(monkeypatch, chain):
    """The split backward's input-gradient chain, where it keeps its weights resident,
    gets in, hidden and out padded each to its own power of two (128 -> 32 -> 16), its
    weight-gradient kernel the same but none below 64 (narrower tiles were slower there
    on the H200), the scratch slot the widest (T_P 128); every tile at the widest with
    OWN_PADDING off. A chain loading its weights per row block (wrong input gradients on
    the H200 with in padded narrower than hidden) and the fused backward kernel (it adds
    [T_P, T_P] partials into the scratch) keep the widest throughout."""
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    spec = fm.MLPSpec((128, 32, 32, 16), "relu", "none", True, torch.float16)
    ws = [torch.randn(o, i, dtype=torch.float16) for i, o in zip(spec.widths, spec.widths[1:])]
    bs = [torch.randn(o, dtype=torch.float16) for o in spec.widths[1:]]
    x, gy = torch.randn(45, 128, dtype=torch.float16), torch.randn(45, 16, dtype=torch.float16)
    z = torch.randn(45, 64, dtype=torch.float16)  # the saved pre-activations (2 x 32)
    launched = []

    class Recorder:
        def __init__(self, mode):
            self.mode = mode

        def launch(self, grid, args, consts, *rest, **kwargs):
            launched.append((self.mode, consts))

    monkeypatch.setattr(n_launchers, "_launcher", Recorder)
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: None if chain is None else
                        n_tuning.Split(64, 4, 2, g_block_m=64, g_warps=4,
                                       g_unroll=chain != "layer-loop",
                                 g_resident=chain in ("resident", "one-kernel"),
                                 g_dw=chain == "one-kernel"))
    widest = (128, 128, 128)
    for own, pads, dw in ((True, (128, 32, 16), (128, 64, 64)), (False, widest, widest)):
        monkeypatch.setattr(n_tuning, "OWN_PADDING", own)
        # the one-kernel plan reads the padding when it is made
        monkeypatch.setattr(n_backward, "_backward_plan", functools.lru_cache(maxsize=8)(
            n_backward._OneKernelBackward))
        launched.clear()
        tb.TritonBackend().backward(gy, x, ws, bs, z, spec, (True, True, True))
        got = {m: tuple(c[k] for k in ("IN_P", "H_P", "OUT_P")) for m, c in launched
               if m != "reduce"}
        if chain is None:
            assert got == {"bwd": widest}, own
        elif chain == "one-kernel":  # the chain sums the weight gradients: no dW kernel
            assert got == {"bwd_resident": pads}, own
            assert dict(launched)["bwd_resident"]["T_P"] == 128
        else:
            assert got == {"bwd" if chain == "layer-loop" else "g":
                           pads if chain == "resident" else widest, "dw": dw}, own
            assert dict(launched)["dw"]["T_P"] == 128
        assert dict(launched)["reduce"]["T_P"] == 128


def test_one_kernel_backward_pads_in_no_narrower_than_hidden(monkeypatch):
    """The one-kernel backward pads each width on its own, except in, which it pads no
    narrower than hidden (a NaN first-layer weight gradient on the H200 otherwise)."""
    monkeypatch.setattr(n_tuning, "OWN_PADDING", True)
    pads = n_tuning._one_kernel_pads(fm.MLPSpec((17, 33, 33, 33, 9), dtype=torch.float16))
    assert pads == dict(IN_P=64, H_P=64, OUT_P=16)
    assert n_tuning._own_pads(fm.MLPSpec((17, 33, 33, 33, 9), dtype=torch.float16))["IN_P"] == 32
    pads = n_tuning._one_kernel_pads(fm.MLPSpec((64, 32, 32, 48), dtype=torch.float16))
    assert pads == dict(IN_P=64, H_P=32, OUT_P=64)


def _tuned_fake(wide, fn, block_n):
    """A TunedLauncher over a stand-in autotuner that "picks" BLOCK_N = block_n(args) and
    launches the recording kernel ``fn``."""
    class Tuner:
        best_config = None

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                self.best_config = types.SimpleNamespace(kwargs={
                    "BLOCK_M": 16, "BLOCK_N": block_n(args), "BLOCK_K": 32}, pre_hook=None)
                return fn[grid](*args, **kwargs)
            return run

    return launch.TunedLauncher(Tuner(), fn, {"EVEN_K": wide.configs._even_k},
                                tune=("M_BUCKET", "N", "K", "K2"))


def test_wide_linear_plan_reuses_a_kernel_only_for_the_same_specialization(
        fake_cuda, monkeypatch):
    """The wide forward GEMM's plan (wide._LinearForward) launches the autotuned config's
    kernel directly only for a call that specializes like an earlier one: same row bucket,
    rows and x/w strides alike, aligned pointers; the same tensors, the grid from the
    chosen config's tiles."""
    wide = pytest.importorskip("fusedmlp_xpu.backends.triton.wide")
    names = ["x_ptr", "w_ptr", "b_ptr", "y_ptr", "z_ptr", "M", "N", "K", "M_BUCKET", "s_xm",
             "s_xk", "s_wn", "s_wk", "s_ym", "s_yn", "s_zm", "s_zn"]
    fn = _RecordingKernel()
    fn.params = [_Param(n, False) for n in names]

    # "tunes" BLOCK_N by the row bucket, like an autotuner would by timing
    kernel = _tuned_fake(wide, fn, lambda args: 32 if args[8] <= 16 else 64)
    monkeypatch.setattr(wide.configs, "_kernel", lambda name, device: kernel)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    N, K = 200, 96
    plan = wide.layers._LinearForward(fake_cuda, torch.float16, N, K, "gelu", True, False)
    w = torch.randn(N, K, dtype=torch.float16)
    b = torch.randn(N, dtype=torch.float16)

    def call(rows, offset=0, wt=w):
        flat = torch.randn(rows * K + offset, dtype=torch.float16)
        x = flat[offset:].view(rows, K)
        y, z = plan(x, wt, b)
        assert y.shape == (rows, N) and z is None
        return x, y

    call(13)
    assert (fn.compiles, len(fn.direct)) == (1, 0)
    x, y = call(11)  # bucket 16, not 1, not a multiple of 16: same specialization
    assert (fn.compiles, len(fn.direct)) == (1, 1)
    a = fn.direct[-1]
    assert a[0] == 1 * ((N + 31) // 32)  # one row block of 16, column blocks of 32
    assert a[9] is x and a[10] is w and a[11] is b and a[12] is y and a[13] is y
    assert a[14:] == (11, N, K, 16, K, 1, K, 1, N, 1, N, 1)
    wt = torch.randn(K, N, dtype=torch.float16).t()  # a transposed weight: other strides
    for changed in [dict(rows=16), dict(rows=1), dict(rows=20), dict(rows=11, wt=wt)]:
        before = fn.compiles
        call(**changed)
        assert fn.compiles == before + 1, changed
    assert len(fn.direct) == 1
    x, y = call(27)  # bucket 32 seen (rows 20): its own config's tiles
    assert len(fn.direct) == 2 and fn.direct[-1][0] == 2 * ((N + 63) // 64)
    general = []  # launch.py's own key is built only on the general path
    real_key = launch.args_key
    monkeypatch.setattr(launch, "args_key", lambda args: general.append(1) or real_key(args))
    call(11, offset=1)  # a misaligned x: launch.py's own key, never the plan's
    call(11, offset=1)
    assert general and len(fn.direct) == 3 and len(plan._entries) == 5


def test_wide_dx_plan_launches_directly_only_with_dense_strides(fake_cuda, monkeypatch):
    """grad_input's pointer-kernel plan (wide._DxLaunch): with every operand dense and
    aligned the strides are fixed by the plan's widths, so a call of an earlier row bucket
    and row specialization is launched directly with the same tensors and the chosen
    tiles' grid; column views (other strides) and misaligned pointers take the general
    path every time."""
    wide = pytest.importorskip("fusedmlp_xpu.backends.triton.wide")
    names = ["g_ptr", "w_ptr", "zg_ptr", "g2_ptr", "w2_ptr", "z_ptr", "out_ptr", "h_ptr", "M",
             "N", "K", "K2", "M_BUCKET", "s_gm", "s_gk", "s_wn", "s_wk", "s_zgm", "s_zgk",
             "s_g2m", "s_g2k", "s_w2n", "s_w2k", "s_zm", "s_zn", "s_om", "s_on", "s_hm", "s_hn"]
    fn = _RecordingKernel()
    fn.params = [_Param(n, False) for n in names]
    kernel = _tuned_fake(wide, fn, lambda args: 32 if args[12] <= 16 else 64)
    monkeypatch.setattr(wide.configs, "_kernel", lambda name, device: kernel)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    N, K = 96, 40  # w: [K, N] (the layer's [out, in])
    plan = wide.layers._DxLaunch(fake_cuda, torch.float16, N, K, K, "none", "gelu", False, True)
    monkeypatch.setattr(wide.layers, "_dx_plan", lambda *key: plan)
    w = torch.randn(K, N, dtype=torch.float16)

    def call(rows, offset=0, cols=None):
        flat = torch.randn(rows * K + offset, dtype=torch.float16)
        g = flat[offset:].view(rows, K)
        z = torch.randn(rows, N, dtype=torch.float16)
        ww, zz = (w, z) if cols is None else (w[:, :cols], z[:, :cols])
        out, h = wide.layers.grad_input(g, ww, zz, "gelu", store_h=True)
        return g, ww, zz, out, h

    call(13)
    assert (fn.compiles, len(fn.direct)) == (1, 0)
    g, ww, z, out, h = call(11)  # bucket 16, same specialization of rows
    assert (fn.compiles, len(fn.direct)) == (1, 1)
    a = fn.direct[-1]
    assert a[0] == (N + 31) // 32
    assert a[9:17] == (g, ww, g, g, ww, z, out, h) and all(
        x is y for x, y in zip(a[9:17], (g, ww, g, g, ww, z, out, h)))
    assert a[17:] == (11, N, K, K, 16, K, 1, 1, N, K, 1, K, 1, 1, N, N, 1, N, 1, N, 1)
    for changed in [dict(rows=16), dict(rows=40)]:
        before = fn.compiles
        call(**changed)
        assert fn.compiles == before + 1, changed
    general = []  # launch.py's own key is built only on the general path
    real_key = launch.args_key
    monkeypatch.setattr(launch, "args_key", lambda args: general.append(1) or real_key(args))
    for changed in [dict(rows=11, offset=1), dict(rows=11, cols=64)]:  # misaligned g;
        for _ in range(2):  # column views of w and z (strides not dense): never kept
            general.clear()
            call(**changed)
            assert general and len(plan._direct.entries) == 3, changed
    general.clear()
    direct = len(fn.direct)
    call(11)
    assert not general and len(fn.direct) == direct + 1


def test_wide_gated_plan_reuses_a_kernel_only_for_the_same_specialization(
        fake_cuda, monkeypatch):
    """The gated GEMM's plan (wide._GatedForward) as the linear one: a direct launch only
    for a call that specializes like an earlier one (row bucket; rows and x/Wg/Wu strides
    alike; aligned pointers), handing over the same tensors."""
    wide = pytest.importorskip("fusedmlp_xpu.backends.triton.wide")
    names = ["x_ptr", "wg_ptr", "wu_ptr", "bg_ptr", "bu_ptr", "h_ptr", "g_ptr", "u_ptr", "M",
             "N", "K", "M_BUCKET", "s_xm", "s_xk", "s_gwn", "s_gwk", "s_uwn", "s_uwk", "s_hm",
             "s_hn", "s_gm", "s_gn", "s_um", "s_un"]
    fn = _RecordingKernel()
    fn.params = [_Param(n, False) for n in names]

    kernel = _tuned_fake(wide, fn, lambda args: 32)
    monkeypatch.setattr(wide.configs, "_kernel", lambda name, device: kernel)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    H, K = 100, 48
    for save in (False, True):
        plan = wide.gated._GatedForward(fake_cuda, torch.float16, H, K, "silu", False, save)
        wg, wu = torch.randn(H, K, dtype=torch.float16), torch.randn(H, K, dtype=torch.float16)
        before = (fn.compiles, len(fn.direct))

        def call(rows, offset=0, wu=wu):
            flat = torch.randn(rows * K + offset, dtype=torch.float16)
            x = flat[offset:].view(rows, K)
            h, saved = plan(x, wg, wu, None, None)
            assert h.shape == (rows, H) and len(saved) == (2 if save else 0)
            return x, h, saved

        call(13)
        x, h, saved = call(11)
        assert (fn.compiles, len(fn.direct)) == (before[0] + 1, before[1] + 1)
        a = fn.direct[-1]
        assert a[0] == (H + 31) // 32
        gg, uu = saved if save else (h, h)
        assert a[9] is x and a[10] is wg and a[11] is wu and a[12] is wg and a[13] is wu
        assert a[14] is h and a[15] is gg and a[16] is uu
        assert a[17:] == (11, H, K, 16, K, 1, K, 1, K, 1, H, 1, H, 1, H, 1)
        wt = torch.randn(K, H, dtype=torch.float16).t()  # a transposed Wu: other strides
        for changed in [dict(rows=16), dict(rows=40), dict(rows=11, wu=wt),
                        dict(rows=11, offset=1)]:
            n = fn.compiles
            call(**changed)
            assert fn.compiles == n + 1, changed
        call(11, offset=1)  # misaligned: never kept, so the general path again
        assert len(fn.direct) == before[1] + 1 + 1  # ...which launch.py takes directly
        assert len(plan._direct.entries) == 4


def test_a_slow_first_launch_says_once_what_it_compiled(monkeypatch, capsys, caplog):
    """A launch through Triton's own path that takes COMPILE_NOTE_S or longer (a first
    call compiling) prints one line on stderr a process, naming the kernel and the time;
    every such launch goes to the "fusedmlp_xpu" logger at INFO; FUSEDMLP_QUIET=1 keeps
    stderr quiet; a fast launch says nothing."""
    import logging
    import time

    from fusedmlp_xpu.backends import notes

    monkeypatch.setattr(notes, "_told", [])
    monkeypatch.setattr(launch, "COMPILE_NOTE_S", 0.05)
    monkeypatch.setattr(launch.LOG, "hasHandlers", lambda: False)  # pytest adds handlers
    monkeypatch.delenv(launch.QUIET_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="fusedmlp_xpu")
    slow = lambda: time.sleep(0.06) or "compiled"  # noqa: E731
    assert launch._through_triton("_fast_kernel", lambda: 3) == 3
    assert capsys.readouterr().err == "" and not caplog.records
    assert launch._through_triton("_fwd_kernel", slow) == "compiled"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiled _fwd_kernel in 0." in err
    assert "fusedmlp_xpu.warmup" in err and launch.QUIET_ENV in err
    launch._through_triton("_bwd_kernel", slow)
    assert capsys.readouterr().err == ""  # once a process
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "fusedmlp_xpu: compiled _fwd_kernel", "fusedmlp_xpu: compiled _bwd_kernel"]
    monkeypatch.setattr(notes, "_told", [])
    monkeypatch.setenv(launch.QUIET_ENV, "1")
    launch._through_triton("_fwd_kernel", slow)
    assert capsys.readouterr().err == ""


def test_emulated_bf16_rounds_to_nearest_even():
    """The CPU suite checks bf16 kernels in Triton's interpreter: its fp32 -> bf16 cast
    must round as a GPU does (conftest), bit for bit with torch, over every kind of
    float32 (subnormals, ties, overflow to inf, NaN)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("runs the Triton interpreter's cast; a GPU rounds in hardware")
    import triton
    import triton.language as tl

    @triton.jit
    def narrow(x, y, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        tl.store(y + o, tl.load(x + o, mask=o < n).to(tl.bfloat16), mask=o < n)

    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (4000,), generator=g).to(torch.int32)
    ties = (torch.randn(64, generator=g).view(torch.int32) & ~0xFFFF) | 0x8000
    x = torch.cat([bits.view(torch.float32), ties.view(torch.float32), torch.tensor(
        [float("inf"), -float("inf"), 3.4e38, -3.4e38, 0.0, -0.0, 1e-40, 1.00390625])])
    y = torch.full_like(x, float("nan"), dtype=torch.bfloat16)
    narrow[(1,)](x, y, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))
    nan = torch.isnan(x)
    assert torch.isnan(y[nan]).all()
    assert torch.equal(y[~nan].view(torch.int16), x[~nan].to(torch.bfloat16).view(torch.int16))
