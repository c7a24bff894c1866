"""Outputs and gradients of every usable backend against the float64 CPU reference."""
from __future__ import annotations

import functools

import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations

from conftest import (SERIALIZED, TOLERANCE, assert_close, chance_sum_size, is_slow, make_params,
                      reference, run_aot_compile, saved_z, tolerance)
from fusedmlp_xpu.backends.triton.narrow import backward as n_backward
from fusedmlp_xpu.backends.triton.narrow import forward as n_forward
from fusedmlp_xpu.backends.triton.narrow import launchers as n_launchers
from fusedmlp_xpu.backends.triton.narrow import tuning as n_tuning

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ACTS = sorted(activations.ACTIVATIONS)
WIDTHS = [16, 32, 64, 128, 256]  # 256: one wide case, past every narrow kernel's limit
DEPTHS = [1, 2, 3, 4, 5]  # hidden layers


def run(backend, widths, dtype, act="relu", out_act="none", bias=True, lead=(1037,),
        grad=False, noncontig=False, recompute=False):
    """Run fused_mlp forced to ``backend`` on fresh random data; compare with the reference."""
    name, dev = backend
    spec = fm.MLPSpec(tuple(widths), activations.get(act).name, activations.get(out_act).name,
                      bias, dtype)
    ok, why = fm.dispatch.REGISTRY[name].supports(spec, dev)
    if not ok:  # the dispatcher falls back for these; explain() shows the reason
        pytest.skip(f"{name} does not support this spec: {why}")
    be = fm.dispatch.REGISTRY[name]
    if grad:
        trains, why = be.train_support(spec, dev)
        if not trains:
            pytest.skip(f"{name} does not train this spec: {why}")
        if not recompute and not be.saves:
            pytest.skip(f"{name}'s backward always recomputes (recompute=False raises)")
    ws, bs = make_params(widths, bias, dtype, dev, requires_grad=grad)
    if noncontig:
        x = torch.randn(*lead, 2 * widths[0], device=dev).to(dtype)[..., ::2]
        assert not x.is_contiguous() or x.numel() <= widths[0]
    else:
        x = torch.randn(*lead, widths[0], device=dev).to(dtype)
    x.requires_grad_(grad)
    y = fm.fused_mlp(x, ws, bs, act, out_act, backend=name, recompute=recompute)
    tol = tolerance(name, dtype)
    if not grad:
        assert_close(y, reference(x, ws, bs, act, out_act), tol)
        return
    gy = torch.randn_like(y)
    y.backward(gy)
    kinks = saved_z(x, ws, bs, act, out_act, name)
    ry, rgx, rgw, rgb = reference(x, ws, bs, act, out_act, grad_y=gy, kinks_at=kinks)
    assert_close(y, ry, tol)
    assert_close(x.grad, rgx, tol, "grad x")
    for i, (w, r) in enumerate(zip(ws, rgw)):
        assert_close(w.grad, r, tol, f"grad weights[{i}]")
    for i, (b, r) in enumerate(zip(bs or [], rgb)):
        # the output layer's bias gradient is gy summed over the rows: with one output, one
        # number, which now and then cancels to near zero (fp32 failed at 8e-5 once)
        floor = (chance_sum_size(gy.reshape(-1, gy.shape[-1]))
                 if i == len(ws) - 1 and out_act == "none" else 0.0)
        assert_close(b.grad, r, tol, f"grad biases[{i}]", floor)


def _skip_big(backend, *sizes):
    if is_slow(*backend) and max(sizes) > 128:
        pytest.skip("emulated kernel on CPU: wide shapes are covered on the device")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_activations(inference_backend, dtype, act, grad):
    out_act = ACTS[(ACTS.index(act) + 3) % len(ACTS)]  # a different one at the output
    run(inference_backend, (32, 64, 64, 16), dtype, act, out_act, grad=grad)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("depth", DEPTHS)
def test_widths_depths(inference_backend, dtype, width, depth):
    _skip_big(inference_backend, width)
    lead = (37,) if is_slow(*inference_backend) else (1037,)
    run(inference_backend, (width,) + (width,) * depth + (width,), dtype, "silu", lead=lead)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_gradients_widths(backend, dtype, width, bias):
    _skip_big(backend, width)
    run(backend, (width, width, width, width), dtype, "gelu_tanh", "sigmoid", bias, grad=True)


@pytest.mark.parametrize("widths", [(3, 16, 5), (17, 33, 33, 9), (1, 64, 1), (100, 128, 128, 3),
                                    (64, 32, 32, 32, 64), (128, 16, 16, 100)])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_odd_feature_dims(backend, widths, grad):
    run(backend, widths, torch.float32, "tanh", "none", grad=grad)


@pytest.mark.parametrize("lead", [(0,), (1,), (7,), (1037,), (3, 5, 7), (2, 0, 4)], ids=str)
@pytest.mark.parametrize("noncontig", [False, True], ids=["contig", "strided"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_batch_shapes(inference_backend, lead, noncontig, grad):
    run(inference_backend, (32, 32, 32, 8), torch.float16, "relu", lead=lead,
        noncontig=noncontig, grad=grad)


@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_training_modes(backend, recompute, dtype):
    run(backend, (64, 64, 64, 64, 16), dtype, "leaky_relu", "softplus", grad=True,
        recompute=recompute)


def test_partial_grads(backend):
    """Only the weights require grad: x gets none, and what is computed is right."""
    name, dev = backend
    ws, bs = make_params((16, 32, 8), True, torch.float32, dev, requires_grad=True)
    bs[0].requires_grad_(False)
    x = torch.randn(100, 16, device=dev)
    y = fm.fused_mlp(x, ws, bs, "relu", backend=name)
    gy = torch.randn_like(y)
    y.backward(gy)
    _, _, rgw, rgb = reference(x, ws, bs, "relu", "none", grad_y=gy,
                               kinks_at=saved_z(x, ws, bs, "relu", "none", name))
    assert x.grad is None and bs[0].grad is None
    assert_close(ws[0].grad, rgw[0], tolerance(name, torch.float32), "grad weights[0]")
    assert_close(bs[1].grad, rgb[1], tolerance(name, torch.float32), "grad biases[1]")


def test_fresh_data_each_call(backend):
    """Two calls on different data give different, each correct, results (nothing cached)."""
    name, dev = backend
    ws, bs = make_params((16, 32, 8), True, torch.float32, dev)
    for _ in range(2):
        x = torch.randn(50, 16, device=dev)
        assert_close(fm.fused_mlp(x, ws, bs, backend=name), reference(x, ws, bs, "relu", "none"),
                     tolerance(name, torch.float32))


@pytest.mark.parametrize("widths", [(64, 64, 64), (17, 33, 33, 33, 9), (16, 32, 32, 32, 32, 32, 8),
                                    (64, 128, 128, 128, 128, 16), (64, 32, 32, 32, 48)],
                         ids=["0hidden", "2hidden-odd", "4hidden-32", "4hidden-128",
                              "hidden-narrower"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("resident", [False, True], ids=["weights-per-block", "weights-resident"])
def test_persistent_forward(backend, widths, grad, resident, monkeypatch):
    """The narrow forward as a persistent kernel (programs striding over row blocks, the
    layer loop unrolled), forced on: more row blocks than programs, a ragged last block;
    weights loaded per row block, or once per program (resident; up to 5 hidden layers).
    Its tiles pad in, hidden and out each on its own (17 -> 33 -> 9: 32, 64, 16; 64 ->
    32 -> 48: 64, 32, 64)."""
    name, dev = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    # (BLOCK_M, warps, stages, programs per SM); width 128 runs persistent only with its
    # weights resident (else the forward falls back to the per-block kernel), still right
    monkeypatch.setattr(n_tuning, "_persistent",
                        lambda device, spec, save=False: (64, 4, 2, 1, resident))
    run(backend, widths, torch.float16, act="silu", out_act="sigmoid", grad=grad, lead=(1037,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_hidden_128_forward_runs_resident(backend, grad, dtype, bias, monkeypatch):
    """narrow-w128's net (64 -> 128 x 4 -> 64) takes the persistent forward with its
    weights resident, at its CUDA tuning: 256 rows / 8 warps for inference, 64 / 4 storing
    z for training (with biases, loaded per row block: 128 / 8 both; forced on in the
    interpreter); more row blocks than programs, a ragged last block. On CUDA its train
    step's backward is the split one with the input-gradient chain resident."""
    name, dev = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    widths = (64,) + (128,) * 4 + (64,)
    spec = fm.MLPSpec(widths, "relu", "none", bias, dtype)
    want = n_tuning._persistent_nvidia(spec, grad)
    assert want is not None and want[4]
    if dev.type != "cuda":
        monkeypatch.setattr(n_tuning, "_persistent",
                            lambda device, spec, save=False: n_tuning._persistent_nvidia(spec,
                                                                                         save))
        rows = 5 * 256 + 37  # 4 programs off CUDA (_n_programs)
    else:
        rows = 150 * 256 + 37  # past one wave of 132 programs
    # plans made here stay here (a fresh cache, the module's own restored after)
    monkeypatch.setattr(n_forward, "_forward_plan", functools.lru_cache(maxsize=8)(
        n_forward._forward_plan.__wrapped__))
    run(backend, widths, dtype, bias=bias, grad=grad, lead=(rows,))
    assert n_forward._forward_plan(spec, dev, grad).persistent == want
    if dev.type == "cuda" and grad:
        split = n_tuning._split_backward(dev, spec)
        assert split.g_resident and split.g_unroll and not split.g_dw, split


def test_narrow_triton_kernels_compile_for_hopper():
    """The interpreter accepts code the GPU compiler rejects (seen on the H200: a tile whose
    shape changed inside a loop). Compile the narrow kernels for sm_90 ahead of time."""
    out = run_aot_compile("aot_narrow.py")
    # 7 kernels at two widths, the forward at width 128 with in/out 128 (one program per
    # row block), 4 with each width padded on its own, the persistent forward
    # resident at hidden 128 (inference, storing z; with biases, both), the split
    # backward's resident chain there, and the one-kernel backward (reading
    # z, or recomputing it) at width 64 and at hidden 32 between in/out 64, all on tensor
    # cores (the Gluon forward's lines are test_gluon_narrow.py's)
    triton_lines = [ln for ln in out.splitlines()
                    if not ln.startswith(("gluon", "so ", "sop ", "somm "))]
    assert sum("wgmma" in ln for ln in triton_lines) == 28, out
    # the second-order kernel (narrow/second_order_kernels.py; --quick: width 64, softplus
    # and relu, and the GPU default's few-row tuning, 16 rows x 4 warps, merged dW): on
    # tensor cores, pipelined; that default without spills
    so = [ln for ln in out.splitlines() if ln.startswith("so ")]
    assert len(so) == 3 and all("wgmma" in ln and SERIALIZED not in ln for ln in so), so
    assert "merged dW BLOCK_M 16   w4" in so[2] and "spill 0 B" in so[2], so
    # and the GEMM form's pointwise kernel, its four modes and two with a bias's sums, and
    # three reading z in place from the saved pre-activations (z rows 64)
    sop = [ln for ln in out.splitlines() if ln.startswith("sop mode") and "FAILED" not in ln]
    assert len(sop) == 9 and sum("z rows 64" in ln for ln in sop) == 3, out
    # the fused GEMM form's kernel (the GPU default), its six launches at width 64: its
    # products on tensor cores, pipelined, no spills
    somm = [ln for ln in out.splitlines() if ln.startswith("somm ")]
    assert len(somm) == 6 and all("wgmma" in ln and SERIALIZED not in ln
                                  and "spill 0 B" in ln for ln in somm), somm
    # ptxas runs every kernel's MMAs pipelined but the weight-gradient kernel's with biases
    # (its bias sum, a second MMA a row block: the known case, NOTES narrow history 37)
    serial = [ln for ln in triton_lines if SERIALIZED in ln]
    assert all(ln.startswith("dw ") for ln in serial), serial


@pytest.mark.parametrize("widths", [(16, 32, 32, 32, 8), (16, 256, 8)], ids=["narrow", "wide"])
@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "grad"])
def test_noncontiguous_parameters(backend, grad, widths):
    """Weights that are transposed views and biases that are strided slices (weight tying,
    slicing a bigger parameter): same result as contiguous copies."""
    name, dev = backend
    spec = fm.MLPSpec(widths, "silu", "none", True, torch.float32)
    if not fm.dispatch.REGISTRY[name].supports(spec, dev)[0]:
        pytest.skip(f"{name} does not support {widths}")
    ws, bs = make_params(widths, True, torch.float32, dev)
    ws = [w.t().contiguous().t() for w in ws]  # same values, column-major
    bs = [torch.stack([b, b], dim=1)[:, 0] for b in bs]  # same values, stride 2
    assert not any(t.is_contiguous() for t in ws + bs)
    for t in ws + bs:
        t.requires_grad_(grad)
    x = torch.randn(37, widths[0], device=dev, requires_grad=grad)
    y = fm.fused_mlp(x, ws, bs, "silu", backend=name)
    tol = tolerance(name, torch.float32)
    if not grad:
        assert_close(y, reference(x, ws, bs, "silu", "none"), tol)
        return
    gy = torch.randn_like(y)
    y.backward(gy)
    _, rgx, rgw, rgb = reference(x, ws, bs, "silu", "none", grad_y=gy)
    assert_close(x.grad, rgx, tol, "grad x")
    for i in range(len(ws)):
        assert_close(ws[i].grad, rgw[i], tol, f"grad weights[{i}]")
        assert_close(bs[i].grad, rgb[i], tol, f"grad biases[{i}]")


@pytest.mark.parametrize("widths", [(64, 64, 64), (17, 33, 33, 33, 9), (16, 128, 128, 3)],
                         ids=["0hidden", "2hidden-odd", "1hidden-128"])
@pytest.mark.parametrize("out_act", ["none", "tanh"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("g", [(1, False, False, False), (0, False, False, False),
                               (1, True, False, False), (0, True, False, False),
                               (1, True, True, False), (1, True, True, True),
                               (1, True, True, True, True)],
                         ids=["g-persistent", "g-per-block", "g-unrolled", "g-unrolled-per-block",
                              "g-unrolled-resident", "resident-one-kernel",
                              "one-kernel-recompute"])
def test_split_backward(backend, widths, out_act, bias, g, monkeypatch):
    """The narrow backward split in two kernels (stored g, then weight gradients summed in
    registers), forced on: every gradient against the reference, with the input-gradient
    kernel persistent or one program per row block, its layer loop unrolled or not, its
    weights loaded per row block or once per program (resident); and the resident chain
    summing the weight gradients itself (one kernel, Split.g_dw); with recompute=True
    that kernel computes the pre-activations again from x and nothing runs the forward
    a second time. Three programs, so each walks several row blocks."""
    name, dev = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    per_sm, unroll, resident, dw, *recompute = g
    recompute = bool(recompute)
    split = n_tuning.Split(64, 4, 2, g_block_m=64, g_warps=4, g_per_sm=per_sm, g_unroll=unroll,
                     g_stages=2, g_resident=resident, g_dw=dw)
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: split)
    # three programs: each strides over several row blocks on a GPU too (its partial
    # sums carried from block to block)
    monkeypatch.setattr(n_launchers, "_n_programs", lambda device, n_blocks, per_sm=1:
                        max(1, min(n_blocks, 3)))
    launched = []  # which backward kernels ran
    for mode in ("bwd_resident", "bwd_recompute", "g", "bwd", "dw"):
        la = n_launchers._launcher(mode)
        monkeypatch.setattr(la, "launch", lambda *a, _l=la.launch, _m=mode, **k:
                            launched.append(_m) or _l(*a, **k))
    saves = []  # the forward's save flags
    forward = tb.TritonBackend.forward
    monkeypatch.setattr(tb.TritonBackend, "forward", lambda self, *a: saves.append(a[-1])
                        or forward(self, *a))
    # recompute: left to the backend (None), which recomputes where the backward is the
    # one kernel; the other variants save explicitly
    run(backend, widths, torch.float16, act="gelu", out_act=out_act, bias=bias, grad=True,
        lead=(1037,), recompute=None if recompute else False)
    assert set(launched) == ({"bwd_recompute"} if recompute else {"bwd_resident"} if dw
                             else {"g", "dw"} if unroll else {"bwd", "dw"}), launched
    # the call's forward, then the reference's lookup of the saved z (saved_z): the
    # backward ran none
    assert saves == [not recompute, True], saves


def _one_kernel_forced(name, monkeypatch, per_sm):
    """The Triton backend's module with every narrow backward forced to the one kernel
    (64 rows / 4 warps / 2 stages, ``per_sm`` programs per SM); other backends skip."""
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: n_tuning.Split(
        64, 4, 2, g_block_m=64, g_warps=4, g_per_sm=per_sm, g_unroll=True, g_stages=2,
        g_resident=True, g_dw=True))
    return tb


def test_one_kernel_recomputes_for_the_input_gradient_alone(backend, monkeypatch):
    """Frozen weights (only x needs a gradient) with nothing saved: the recomputing one
    kernel runs, no forward runs again, no weight gradient is reduced, and x's gradient
    is right."""
    name, dev = backend
    tb = _one_kernel_forced(name, monkeypatch, per_sm=2)
    launched, saves = [], []
    for mode in ("bwd_recompute", "bwd_resident", "bwd", "g", "reduce"):
        la = n_launchers._launcher(mode)
        monkeypatch.setattr(la, "launch", lambda *a, _l=la.launch, _m=mode, **k:
                            launched.append(_m) or _l(*a, **k))
    forward = tb.TritonBackend.forward
    monkeypatch.setattr(tb.TritonBackend, "forward", lambda self, *a: saves.append(a[-1])
                        or forward(self, *a))
    ws, bs = make_params((17, 33, 33, 9), True, torch.float16, dev)
    x = torch.randn(300, 17, device=dev).to(torch.float16).requires_grad_()
    y = fm.fused_mlp(x, ws, bs, "gelu", backend=name)
    gy = torch.randn_like(y)
    y.backward(gy)
    assert launched == ["bwd_recompute"] and saves == [False], (launched, saves)
    _, rgx, _, _ = reference(x, ws, bs, "gelu", "none", grad_y=gy)
    assert_close(x.grad, rgx, tolerance(name, torch.float16), "grad x")


@pytest.mark.parametrize("per_block", [False, True], ids=["biases-held", "biases-per-block"])
def test_one_kernel_recompute_biases(backend, monkeypatch, per_block):
    """The recomputing one-kernel backward of a biased net, its biases held through the
    row-block loop or loaded for each block (BIAS_PER_BLOCK): every gradient against the
    reference; three programs, so each walks several row blocks."""
    name, dev = backend
    _one_kernel_forced(name, monkeypatch, per_sm=1)
    monkeypatch.setattr(n_tuning, "_bwd_bias_per_block", lambda spec: per_block)
    monkeypatch.setattr(n_launchers, "_n_programs", lambda device, n_blocks, per_sm=1:
                        max(1, min(n_blocks, 3)))
    plans, make = [], n_backward._backward_plan.__wrapped__  # made here, kept here
    monkeypatch.setattr(n_backward, "_backward_plan",
                        lambda *a: plans.append(make(*a)) or plans[-1])
    run(backend, (24, 64, 64, 64, 40), torch.float16, act="gelu", out_act="tanh",
        bias=True, grad=True, lead=(1037,), recompute=True)
    assert plans and all(p.recompute and p.consts["BIAS_PER_BLOCK"] == per_block
                         for p in plans), [p.consts for p in plans]


@pytest.mark.parametrize("one_kernel", [False, True], ids=["two-kernels", "one-kernel"])
def test_split_backward_partial_grads(backend, monkeypatch, one_kernel):
    """The split backward (two kernels, or the resident chain summing the weight
    gradients itself) when x needs no gradient and one bias needs none."""
    name, dev = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    split = n_tuning.Split(64, 4, 2)
    if one_kernel:
        split = split._replace(g_block_m=64, g_warps=4, g_unroll=True, g_stages=2,
                               g_resident=True, g_dw=True)
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: split)
    test_partial_grads(backend)


@pytest.mark.parametrize("widths", [(17, 33, 33, 33, 9), (16, 128, 128, 3)],
                         ids=["2hidden-odd", "1hidden-128"])
@pytest.mark.parametrize("out_act", ["none", "tanh"])
def test_split_backward_in_row_chunks(backend, widths, out_act, monkeypatch):
    """The split backward storing g a chunk of rows at a time (tuning.g_chunk_rows): 1037
    rows as four chunks of 256 and one of 13, each with its chain, weight-gradient kernel
    and reduction, the chunks' sums added in fp32; every gradient against the reference."""
    name, dev = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    split = n_tuning.Split(64, 4, 2, g_block_m=64, g_warps=4, g_per_sm=1, g_unroll=True,
                           g_stages=2)
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: split)
    monkeypatch.setattr(n_launchers, "_n_programs", lambda device, n_blocks, per_sm=1:
                        max(1, min(n_blocks, 3)))
    monkeypatch.setattr(n_tuning, "_CHUNK_ALIGN", 256)
    monkeypatch.setattr(n_tuning, "G_MAX_CHUNKS", 8)
    monkeypatch.setenv("FUSEDMLP_G_CHUNK_MB", "0.001")  # below one row block's g
    launched = []
    for mode in ("g", "dw", "reduce"):
        la = n_launchers._launcher(mode)
        monkeypatch.setattr(la, "launch", lambda *a, _l=la.launch, _m=mode, **k:
                            launched.append(_m) or _l(*a, **k))
    run(backend, widths, torch.float16, act="gelu", out_act=out_act, bias=True, grad=True,
        lead=(1037,))
    # (on a GPU the first chain is also launched once by _fits, the check that it fits)
    assert [m for m in launched if m != "g"] == ["dw", "reduce"] * 5, launched
    assert launched.count("g") in (5, 6), launched


def test_g_chunk_rows(monkeypatch):
    """The split backward's g chunks: whole within the budget; else the budget's rows,
    at most G_MAX_CHUNKS chunks, aligned; FUSEDMLP_G_CHUNK_MB=0 keeps g whole; a bad
    value names the variable."""
    monkeypatch.delenv("FUSEDMLP_G_CHUNK_MB", raising=False)
    row = 1024  # narrow-w128's g row in fp16: 4 layers x 128 x 2 bytes
    assert n_tuning.g_chunk_rows(1 << 18, row) == 1 << 18
    assert n_tuning.g_chunk_rows(1 << 20, row) == 1 << 18  # 256 MiB of g
    assert n_tuning.g_chunk_rows(1 << 22, row) == 1 << 20  # at most 4 chunks
    assert n_tuning.g_chunk_rows((1 << 20) + 37, row) % n_tuning._CHUNK_ALIGN == 0
    monkeypatch.setenv("FUSEDMLP_G_CHUNK_MB", "0")
    assert n_tuning.g_chunk_rows(1 << 22, row) == 1 << 22
    monkeypatch.setenv("FUSEDMLP_G_CHUNK_MB", "64")
    assert n_tuning.g_chunk_rows(1 << 18, row) == 1 << 16
    monkeypatch.setenv("FUSEDMLP_G_CHUNK_MB", "lots")
    with pytest.raises(ValueError, match="FUSEDMLP_G_CHUNK_MB"):
        n_tuning.g_chunk_rows(1 << 20, row)


@pytest.mark.parametrize("resident", [False, True], ids=["per-block", "resident"])
@pytest.mark.parametrize("act", ["softplus", "relu"])
def test_x_only_backward_from_saved_z_runs_the_chain_alone(backend, resident, act,
                                                            monkeypatch):
    """x's gradient alone from saved pre-activations (frozen weights; an eikonal step's
    first backward) with an unrolled chain: the chain runs storing no g, and no weight-
    gradient kernel; x's gradient against the reference, fp16, three programs."""
    name, dev = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    split = n_tuning.Split(64, 4, 2, g_block_m=64, g_warps=4, g_per_sm=1, g_unroll=True,
                           g_stages=2, g_resident=resident)
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: split)
    monkeypatch.setattr(n_launchers, "_n_programs", lambda device, n_blocks, per_sm=1:
                        max(1, min(n_blocks, 3)))
    launched = []
    for mode in ("bwd_resident", "bwd_recompute", "g", "bwd", "dw"):
        la = n_launchers._launcher(mode)
        monkeypatch.setattr(la, "launch", lambda *a, _l=la.launch, _m=mode, **k:
                            launched.append((_m, a[2].get("STORE_G"))) or _l(*a, **k))
    widths, dt = (32, 64, 64, 64, 16), torch.float16
    ws, bs = make_params(widths, True, dt, dev)
    x = torch.randn(1037, widths[0], device=dev).to(dt).requires_grad_()
    y = fm.fused_mlp(x, ws, bs, act, backend=name, recompute=False)
    gy = torch.randn_like(y)
    y.backward(gy)
    assert launched == [("g", False)], launched
    _, rgx, _, _ = reference(x, ws, bs, act, "none", grad_y=gy,
                             kinks_at=saved_z(x, ws, bs, act, "none", name))
    assert_close(x.grad, rgx, tolerance(name, dt), "grad x")


@pytest.mark.parametrize("fits_at", [0, 1], ids=["none-fits", "one-stage-fits"])
def test_unrolled_chain_that_does_not_fit_steps_down(backend, fits_at, monkeypatch):
    """An unrolled input-gradient chain the device refuses (Triton's OutOfResources; seen
    at padded width 128, and with Triton 3.9's pipeliner at 3 stages) tries one pipeline
    stage fewer, then runs the kernel with the layer loop: still right, and what fits is
    remembered, not tried again for that spec."""
    name, _ = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")
    la = n_launchers._launcher("g")

    class OutOfResources(Exception):
        pass

    tries = []
    launch = la.launch

    def refuse(grid, args, consts, *rest, **kwargs):
        tries.append(consts["STAGES"])
        if consts["STAGES"] > fits_at:
            raise OutOfResources("shared memory")
        return launch(grid, args, consts, *rest, **kwargs)

    monkeypatch.setattr(la, "launch", refuse)
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: n_tuning.Split(
        64, 4, 2, g_block_m=64, g_warps=4, g_unroll=True, g_stages=2))
    for _ in range(2):
        run(backend, (17, 33, 33, 9), torch.float16, act="gelu", grad=True, lead=(300,))
    if fits_at:  # 2 refused, 1 ran; the second step went straight to 1
        assert tries == [2, 1, 1]
    else:
        assert tries == [2, 1]
    assert [(k[0], v) for k, v in n_launchers._FIT.items()] == [("g", fits_at)]


def test_recomputing_one_kernel_never_runs_at_one_stage(backend, monkeypatch):
    """The one-kernel backward that recomputes z, refused at 2 stages, is not tried at 1
    (64 rows / 4 warps / 1 stage read out of bounds on the H200): the backward saves by
    running the forward again and goes on as with z saved (the one kernel reading it);
    still right."""
    name, _ = backend
    if name != "triton":
        pytest.skip("the Triton narrow kernel's variant")

    class OutOfResources(Exception):
        pass

    tries, launched = [], []

    def refuse(grid, args, consts, *rest, **kwargs):
        tries.append(consts["STAGES"])
        raise OutOfResources("shared memory")

    monkeypatch.setattr(n_launchers._launcher("bwd_recompute"), "launch", refuse)
    for mode in ("bwd_resident", "g", "dw"):
        other = n_launchers._launcher(mode)
        monkeypatch.setattr(other, "launch", lambda *a, _l=other.launch, _m=mode, **k:
                            launched.append(_m) or _l(*a, **k))
    monkeypatch.setattr(n_launchers, "_FIT", {})
    monkeypatch.setattr(n_tuning, "_split_backward", lambda device, spec: n_tuning.Split(
        64, 4, 2, g_block_m=64, g_warps=4, g_per_sm=2, g_unroll=True, g_stages=2,
        g_resident=True, g_dw=True))
    for _ in range(2):
        run(backend, (17, 33, 33, 9), torch.float16, act="gelu", grad=True, lead=(300,),
            recompute=True)
    assert tries == [2]  # then remembered: the second step did not try again
    assert set(launched) == {"bwd_resident"}


def test_persistent_forward_choice_follows_the_sweeps(monkeypatch):
    """The forward runs persistent with its weights resident where it was timed faster:
    up to 4 hidden-to-hidden weights at padded widths <= 64, and at hidden 128 where the
    weight tiles take no more than narrow-w128's (in/out 64, 3 hidden-to-hidden weights),
    with its own tuning for inference and for the forward storing z, and another for
    biased nets (their biases loaded per row block). Wider in/out, a fourth hidden weight
    at 128, fp32 and deeper nets stay per-block; the plan never runs the kernel that loads
    its weights per row block past width 64."""
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    MLPSpec = fm.MLPSpec
    choice = n_tuning._persistent_nvidia
    w128 = MLPSpec((64,) + (128,) * 4 + (64,), bias=False, dtype=torch.float16)
    assert choice(w128) == (256, 8, 2, 1, True) and choice(w128, True) == (64, 4, 3, 2, True)
    assert choice(MLPSpec((64, 128, 128, 64), bias=False, dtype=torch.bfloat16))[0] == 256
    assert choice(MLPSpec((64, 32, 32, 64), dtype=torch.float16)) == (64, 4, 3, 3, True)
    assert choice(MLPSpec((64, 64, 64, 64), dtype=torch.float16), True) == (64, 4, 3, 2, True)
    for widths, dtype in [((64,) + (128,) * 5 + (64,), torch.float16),  # 4 hidden weights
                          ((128,) + (128,) * 4 + (128,), torch.float16),  # in/out 128
                          ((128, 64, 64, 64), torch.float16),  # in 128 around hidden 64
                          ((64,) + (64,) * 6 + (64,), torch.float16),  # 5 hidden weights
                          ((64,) + (128,) * 4 + (64,), torch.float32)]:
        assert choice(MLPSpec(widths, bias=False, dtype=dtype)) is None, widths
        assert choice(MLPSpec(widths, bias=False, dtype=dtype), True) is None, widths
    # hidden 128 with biases: loaded per row block, at 128 rows / 8 warps (1 stage for
    # inference, 2 storing z)
    biased = MLPSpec((64,) + (128,) * 4 + (64,), bias=True, dtype=torch.float16)
    assert choice(biased) == (128, 8, 1, 1, True) and choice(biased, True) == (128, 8, 2, 1, True)
    assert n_tuning._bias_per_block(n_tuning._own_pads(biased))
    assert not n_tuning._bias_per_block(n_tuning._own_pads(MLPSpec((64, 64, 64, 64),
                                                                   dtype=torch.float16)))
    # a plan past width 64 with a persistent choice that loads weights per row block (or
    # whose net is too deep for resident tiles): the per-block kernel
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(n_launchers, "_SM_COUNT", {0: 132})
    monkeypatch.setattr(tb.launch, "enabled", lambda device: False)
    assert n_forward._NarrowForward(w128, cuda, False).persistent == (256, 8, 2, 1, True)
    assert n_forward._NarrowForward(w128, cuda, True).persistent == (64, 4, 3, 2, True)
    # explain() names it
    be = fm.dispatch.REGISTRY["triton"]
    assert "persistent programs, 256 rows / 8 warps, weights resident" in be.supports(w128,
                                                                                     cuda)[1]
    assert "persistent programs, 128 rows / 8 warps, weights resident" in be.supports(
        biased, cuda)[1]
    assert "persistent" not in be.supports(MLPSpec((128,) * 6, dtype=torch.float16), cuda)[1]
    monkeypatch.setattr(n_tuning, "_persistent", lambda device, spec, save=False: (64, 4, 2, 1,
                                                                                   False))
    assert n_forward._NarrowForward(w128, cuda, False).persistent is None
    assert n_forward._NarrowForward(MLPSpec((64, 64, 64), dtype=torch.float16), cuda,
                             False).persistent == (64, 4, 2, 1, False)


def test_split_choice_follows_the_sweeps(monkeypatch):
    """The split backward goes on where it was measured faster: up to 5 hidden layers
    (timed at 4) at padded width <= 64 with the input-gradient chain unrolled; deeper only
    at hidden width <= 32, keyed by the hidden width, not the padded one (hidden 32 with
    in/out 64 pads to 64 like hidden 64, where the fused kernel stays); always at padded
    width 128: with the chain resident and unrolled where its weight tiles take no more
    than narrow-w128's, else with the chain's layer loop (the unrolled chain that loads
    its weights per row block did not pipeline there); never for fp32 (not swept)."""
    tb = pytest.importorskip("fusedmlp_xpu.backends.triton")
    from fusedmlp_xpu.spec import MLPSpec

    def split(widths, dtype=torch.float16):
        return n_tuning._split_nvidia(MLPSpec(widths, dtype=dtype))

    for hidden in (32, 64):
        assert split((64,) + (hidden,) * 4 + (64,)).g_unroll
    # up to 4 hidden-to-hidden weights at hidden <= 64, with biases or not: one kernel
    # (the resident chain summing the weight gradients itself), and training recomputes
    # the pre-activations in it by default
    be, cuda = tb.TritonBackend(), torch.device("cuda")
    for widths in ((64, 32, 32, 64), (64,) + (64,) * 5 + (64,), (16, 16, 16)):
        for bias in (False, True):
            spec = MLPSpec(widths, bias=bias, dtype=torch.float16)
            one = n_tuning._split_nvidia(spec)
            assert one.g_resident and one.g_dw, (widths, bias)
            assert be.recomputes(spec, cuda), (widths, bias)
            assert "recomputing the pre-activations" in be.supports(spec, cuda)[1]  # explain()
    # an activation of transcendentals at hidden 64 (the sdf net): not the one kernel
    # (tuning._curved); training recomputes only where the Gluon backward takes the net on
    # an sm_90 device (narrow_backward.gluon_takes; never for gelu: tuning.GLUON_SAVES),
    # else the two kernels read the z the forward saved; at hidden 32 still the one kernel
    sdf = MLPSpec((32,) + (64,) * 4 + (16,), "softplus", bias=True, dtype=torch.float16)
    assert not n_tuning._split_nvidia(sdf).g_dw
    assert be.recomputes(sdf, cuda) == tb.narrow_backward.gluon_takes(sdf, cuda)
    gelu = MLPSpec((64,) * 4, "gelu", bias=True, dtype=torch.float16)
    assert not n_tuning._split_nvidia(gelu).g_dw and not be.recomputes(gelu, cuda)
    assert n_tuning._split_nvidia(MLPSpec((32,) + (32,) * 4 + (16,), "tanh",
                                          dtype=torch.float16)).g_dw
    # without the one kernel: the two kernels, the chain resident at hidden 32 only
    monkeypatch.setattr(n_tuning, "ONE_KERNEL_BACKWARD", False)
    two = split((64, 32, 32, 64))
    assert two.g_resident and not two.g_dw and two.g_stages == 3
    assert not split((64, 64, 64, 64)).g_resident
    # (the forward saves z for them unless the Gluon backward takes the net: sm_90)
    s32 = MLPSpec((64, 32, 32, 64), dtype=torch.float16)
    assert be.recomputes(s32, cuda) == tb.narrow_backward.gluon_takes(s32, cuda)
    monkeypatch.undo()
    # deeper, wider, fp32 or not on CUDA: saved
    for widths, dtype, dev in [((64,) + (32,) * 6 + (64,), torch.float16, cuda),
                               ((64, 128, 128, 64), torch.float16, cuda),
                               ((64, 32, 32, 64), torch.float32, cuda),
                               ((64, 32, 32, 64), torch.float16, torch.device("cpu"))]:
        assert not be.recomputes(MLPSpec(widths, dtype=dtype), dev), (widths, dtype, dev)
    assert split((64,) + (32,) * 11 + (64,)).g_unroll is False
    assert split((64,) + (64,) * 11 + (64,)) is None
    # hidden 128 where its weight tiles fit as narrow-w128's: the chain resident and
    # unrolled; wider in/out or a fourth hidden weight: per row block with its layer loop
    w128 = split((64, 128, 128, 128, 128, 64))
    assert w128.g_resident and w128.g_unroll and w128.g_per_sm == 1 and not w128.g_dw
    assert split((128, 128, 128, 128, 128, 128)).g_unroll is False
    assert split((64,) + (128,) * 5 + (64,)).g_unroll is False
    assert split((64, 32, 32, 64), torch.float32) is None
    # the recomputing one kernel loads its biases per row block from padded hidden 64
    assert n_tuning._bwd_bias_per_block(MLPSpec((64,) + (64,) * 4 + (64,), bias=True))
    assert not n_tuning._bwd_bias_per_block(MLPSpec((64,) + (32,) * 4 + (64,), bias=True))


def test_fp32_tanh_output_near_zero(backend):
    """A tanh output layer whose pre-activations sit near 0 (where 2 sigmoid(2z) - 1 cancels:
    1.3e-5 relative on the Triton kernels before) stays within fp32's bound."""
    name, dev = backend
    ws, bs = make_params((16, 32, 8), True, torch.float32, dev)
    ws = [w * 0.05 for w in ws]
    bs = [b * 1e-3 for b in bs]  # outputs ~1e-4: the old form's error was ~1e-3 there
    x = torch.randn(203, 16, device=dev) * 0.05
    y = fm.fused_mlp(x, ws, bs, "tanh", "tanh", backend=name)
    # on the CPU every backend's dots are exact fp32 (no tf32): the fp32 bound itself
    tol = TOLERANCE[torch.float32] if dev.type == "cpu" else tolerance(name, torch.float32)
    assert_close(y, reference(x, ws, bs, "tanh", "tanh"), tol)
