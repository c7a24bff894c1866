"""The warp-specialized Gluon GEMMs of the wide backward (backends/triton/hopper_gemm.py):
the input gradient through an activation and the gated dh GEMM. On an sm_90 GPU their
outputs against float64 into NaN-poisoned tensors, at shapes with partial tiles in M, N
and K, one tile a program or several (both consumers, the ring wrapping), column-chunk
views, and the wide train steps that take them; on any machine the rule that picks them.
Their compile for sm_90 is checked with wide.py's kernels (test_wide.py, ci/aot_wide.py)."""
from __future__ import annotations

import pytest
import torch

from fusedmlp_xpu import activations

from conftest import assert_close, make_params, on_a_new_thread, reference, tolerance

pytest.importorskip("triton")
gw = pytest.importorskip("fusedmlp_xpu.backends.triton.wide.hopper_gemm")
wide = pytest.importorskip("fusedmlp_xpu.backends.triton.wide")


def _sm90() -> bool:
    return (gw.gluon is not None and torch.cuda.is_available()
            and torch.cuda.get_device_capability()[0] == 9)


needs_sm90 = pytest.mark.skipif(not _sm90(), reason="the Gluon kernels run on sm_90 GPUs")
#: (M, N, K): fewer tiles than programs with K tails; then several tiles a program
SHAPES = [(1000, 1032, 328), (129, 264, 72), (2048, 2056, 200), (3000, 1544, 1000)]
TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _act64(act: str, z: torch.Tensor):
    """act(z) and act'(z) in float64 on the CPU (where assert_close compares)."""
    a = activations.ACTIVATIONS[act]
    z = z.double().cpu()
    return a.fn(z), a.grad(z)


def _mm64(a, b):
    return a.double().cpu() @ b.double().cpu()


def _nan(M, N, like):
    return torch.full((M, N), float("nan"), device=like.device, dtype=like.dtype)


def _operands(M, N, K, dtype):
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev, dtype=dtype)
    b = (torch.randn(K, N, device=dev) / K ** 0.5).to(dtype)
    return a, b, torch.randn(M, N, device=dev, dtype=dtype), \
        torch.randn(M, N, device=dev, dtype=dtype)


@needs_sm90
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("act", ["gelu_tanh", "silu", "relu"])
def test_dx(shape, dtype, act):
    """out = (g @ w) * act'(z), h = act(z); and out alone."""
    M, N, K = shape
    g, w, z, _ = _operands(M, N, K, dtype)
    h_ref, d = _act64(act, z)
    out_ref = _mm64(g, w) * d
    for store_h in (True, False):
        out, h = _nan(M, N, g), (_nan(M, N, g) if store_h else None)
        gw.launch_ws(gw.DX, wide.configs.act_id(act, g), g, w, z, None, out, None, h)
        assert_close(out, out_ref, TOL[dtype], f"out {shape}")
        if store_h:
            assert_close(h, h_ref, TOL[dtype], f"h {shape}")


@needs_sm90
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("act", ["silu", "gelu_tanh", "gelu"])
def test_gated_dh(shape, dtype, act):
    """dh = dy @ wd; dg = dh u act'(g), du = dh act(g), h = act(g) u: whole, and in two
    column chunks of views (as the train step runs it) storing h."""
    M, N, K = shape
    dy, wd, g, u = _operands(M, N, K, dtype)
    a, d = _act64(act, g)
    dh, u64 = _mm64(dy, wd), u.double().cpu()
    refs = (dh * u64 * d, dh * a, a * u64)
    aid = wide.configs.act_id(act, g)
    dg, du = _nan(M, N, g), _nan(M, N, g)
    gw.launch_ws(gw.GATED, aid, dy, wd, g, u, dg, du, None)
    assert_close(dg, refs[0], TOL[dtype], "dg")
    assert_close(du, refs[1], TOL[dtype], "du")
    dg, du, h = _nan(M, N, g), _nan(M, N, g), _nan(M, N, g)
    c = 8 * (N // 16)
    for c0, c1 in ((0, c), (c, N)):
        gw.launch_ws(gw.GATED, aid, dy, wd[:, c0:c1], g[:, c0:c1], u[:, c0:c1], dg[:, c0:c1],
                     du[:, c0:c1], h[:, c0:c1])
    for out, ref, what in zip((dg, du, h), refs, ("dg", "du", "h")):
        assert_close(out, ref, TOL[dtype], f"{what} in chunks")


@needs_sm90
@pytest.mark.parametrize("act", sorted(set(activations.ACTIVATIONS) - {"none"}))
def test_every_activation(act):
    """Both epilogues with every activation of the registry (bf16, several tiles a
    program)."""
    M, N, K = 2048, 2056, 200
    a, b, e0, e1 = _operands(M, N, K, torch.bfloat16)
    aid = wide.configs.act_id(act, a)
    h_ref, d = _act64(act, e0)
    prod, e1_64 = _mm64(a, b), e1.double().cpu()
    out, h = _nan(M, N, a), _nan(M, N, a)
    gw.launch_ws(gw.DX, aid, a, b, e0, None, out, None, h)
    assert_close(out, prod * d, TOL[torch.bfloat16], "dx out")
    assert_close(h, h_ref, TOL[torch.bfloat16], "dx h")
    dg, du, h = _nan(M, N, a), _nan(M, N, a), _nan(M, N, a)
    gw.launch_ws(gw.GATED, aid, a, b, e0, e1, dg, du, h)
    assert_close(dg, prod * e1_64 * d, TOL[torch.bfloat16], "dg")
    assert_close(du, prod * h_ref, TOL[torch.bfloat16], "du")
    assert_close(h, h_ref * e1_64, TOL[torch.bfloat16], "gated h")


@needs_sm90
def test_first_cuda_work_of_a_thread(monkeypatch):
    """This kernel and the train forward's TMA kernel as a thread's first CUDA work (as on
    autograd's device thread when a backward starts at the op): Triton's launcher needs a
    current context for their descriptors (launch.bind_context)."""
    from fusedmlp_xpu.spec import MLPSpec

    M, N, K = 2048, 2056, 200
    g, w, z, _ = _operands(M, N, K, torch.bfloat16)
    _, d = _act64("gelu_tanh", z)
    out = _nan(M, N, g)
    aid = wide.configs.act_id("gelu_tanh", g)
    on_a_new_thread(monkeypatch, lambda: gw.launch_ws(gw.DX, aid, g, w, z, None, out, None,
                                                      None),
                    between=lambda: out.fill_(float("nan")))
    assert_close(out, _mm64(g, w) * d, TOL[torch.bfloat16], "out")
    dev = torch.device("cuda")
    spec = MLPSpec((1032, 2296, 2056), "gelu_tanh", "none", True, torch.bfloat16)
    ws, bs = make_params(spec.widths, True, spec.dtype, dev)
    x = torch.randn(2133, 1032, device=dev, dtype=spec.dtype)
    tma = []
    real = wide.tma._tma_launch
    monkeypatch.setattr(wide.tma, "_tma_launch", lambda *a: tma.append(1) or real(*a))
    y, _ = on_a_new_thread(monkeypatch, lambda: wide.layers.forward(x, ws, bs, spec, True))
    assert len(tma) >= 2  # once a call
    assert_close(y, reference(x, ws, bs, "gelu_tanh", "none"),
                 tolerance("triton", torch.bfloat16))


def _spy(monkeypatch) -> list:
    """The epilogues (gw.DX / gw.GATED) of the launches through launch_ws."""
    ran = []
    real = gw.launch_ws
    monkeypatch.setattr(gw, "launch_ws", lambda epi, *a, **kw: ran.append(epi) or real(epi, *a, **kw))
    return ran


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_wide_train_step_takes_it(monkeypatch, dtype):
    """A two-layer gelu_tanh train step: the hidden layer's input gradient (h stored for
    the weight gradient) goes through the Gluon kernel, once per column chunk; every
    gradient against float64 (test_wide.check). FUSEDMLP_GLUON_WIDE=0 takes wide.py's
    TMA kernel instead."""
    from test_wide import check

    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")
    ran = _spy(monkeypatch)
    dev = torch.device("cuda")
    check(dev, (1032, 2296, 2056), dtype, "gelu_tanh", "none", m=2133, strided=False)
    assert ran and set(ran) == {gw.DX}
    ran.clear()
    monkeypatch.setenv(gw.ENV, "0")
    check(dev, (1032, 2296, 2056), dtype, "gelu_tanh", "none", m=2133, strided=False)
    assert ran == []


@needs_sm90
@pytest.mark.parametrize("recompute", [False, True], ids=["save", "recompute"])
def test_gated_train_step_takes_it(monkeypatch, recompute):
    """A gated (silu) train step: the dh GEMM goes through the Gluon kernel in column
    chunks, each storing its h for the down projection's weight gradient; every gradient
    against float64 (test_gated.run)."""
    from test_gated import run

    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")
    ran = _spy(monkeypatch)
    lead, dims, cols = (wide.gated.GATED_TMA_MIN_ROWS + 85,), (520, 1144, 264), 256
    monkeypatch.setattr(wide.gated, "GATED_H_CHUNK_BYTES", lead[0] * cols * 2)
    chunks = wide.layers._col_chunks(lead[0], dims[1], 2, wide.gated.GATED_H_CHUNK_BYTES)
    run(("triton", torch.device("cuda")), "silu", torch.bfloat16, lead=lead, dims=dims,
        recompute=recompute)
    assert ran.count(gw.GATED) == len(chunks) == 5


def test_selection_rule(monkeypatch):
    """CUDA sm_90 and fp16/bf16 only (the device check is hopper_forward's), and off with
    FUSEDMLP_GLUON_WIDE=0 or FUSEDMLP_GLUON=0; wide._warp_specialized never on the CPU."""
    cpu = torch.device("cpu")
    assert not gw.available(cpu, torch.bfloat16)
    assert wide.layers._warp_specialized(cpu, torch.bfloat16) is None
    if gw.gluon is None:
        pytest.skip("no Gluon in this Triton")
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(gw, "_device_ok", lambda d, t: t in (torch.float16, torch.bfloat16))
    assert gw.available(cuda, torch.bfloat16) and gw.available(cuda, torch.float16)
    assert not gw.available(cuda, torch.float32)
    assert wide.layers._warp_specialized(cuda, torch.bfloat16) is gw
    monkeypatch.setenv(gw.ENV, "0")
    assert not gw.available(cuda, torch.bfloat16)
    assert wide.layers._warp_specialized(cuda, torch.bfloat16) is None
    monkeypatch.setenv(gw.ENV, "1")
    monkeypatch.setenv("FUSEDMLP_GLUON", "0")
    assert not gw.available(cuda, torch.bfloat16)


def test_shared_memory_rule():
    """Four ring stages for both epilogues, with and without h, within sm_90's 227 KB (the
    compile's own count is checked against smem_bytes in ci/aot_wide.py)."""
    for epi in (gw.DX, gw.GATED):
        for store_h in (False, True):
            assert gw.stages(epi, store_h) == 4
            assert gw.smem_bytes(epi, store_h, 4) <= 227 * 1024
            assert gw.smem_bytes(epi, store_h, 5) > gw.smem_bytes(epi, store_h, 4)
    assert gw.smem_bytes(gw.GATED, True, 4) - gw.smem_bytes(gw.DX, True, 4) == \
        gw.BLOCK_M * gw.BLOCK_N * 2  # one more input tile (u); h goes out through g's


def test_explain_says_so(monkeypatch):
    """explain() of a wide net on an sm_90 device names the Gluon backward GEMM, and not
    where it is turned off (the device check stubbed: no GPU needed)."""
    import importlib

    from fusedmlp_xpu.spec import MLPSpec

    tb = importlib.import_module("fusedmlp_xpu.backends.triton")

    if gw.gluon is None:
        pytest.skip("no Gluon in this Triton")
    monkeypatch.setattr(gw, "_device_ok", lambda d, t: True)
    spec = MLPSpec((512, 2048, 512), "gelu_tanh", "none", True, torch.bfloat16)
    cuda = torch.device("cuda", 0)
    ok, why = tb.TritonBackend().supports(spec, cuda)
    assert ok and "warp-specialized Gluon GEMM" in why, why
    monkeypatch.setenv(gw.ENV, "0")
    assert "Gluon" not in tb.TritonBackend().supports(spec, cuda)[1]
