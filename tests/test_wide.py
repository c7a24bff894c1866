"""The wide-layer Triton kernels (backends/triton/wide.py), called with the Backend shapes.

On the CPU they run under Triton's interpreter (TRITON_INTERPRET=1) at small shapes;
tests marked ``gpu`` run wide and decode shapes on a cuda/xpu device. Every output is
allocated through memory.new_empty, which conftest poisons with NaN."""
from __future__ import annotations

import pytest
import torch

from fusedmlp_xpu import activations
from fusedmlp_xpu.backends import saved_widths
from fusedmlp_xpu.spec import MLPSpec

from conftest import (GRAD_VS_EAGER, SERIALIZED, TOLERANCE, assert_close, eager_errors,
                      make_params, reference, run_aot_compile)

triton = pytest.importorskip("triton")
wide = pytest.importorskip("fusedmlp_xpu.backends.triton.wide")
act_mod = pytest.importorskip("fusedmlp_xpu.backends.triton.act")
common = pytest.importorskip("fusedmlp_xpu.backends.triton.common")
tl = triton.language


def _devices():
    out = []
    if wide.configs.interpreting():
        out.append(torch.device("cpu"))
    if torch.cuda.is_available():
        out.append(torch.device("cuda"))
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        out.append(torch.device("xpu"))
    return out


DEVICES = _devices()
ACTS = sorted(activations.ACTIVATIONS)



@pytest.fixture(autouse=True)
def _first_config(monkeypatch):
    """Correctness, not speed: one config per kernel, no timing runs on a GPU."""
    monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "0")


@pytest.fixture(params=DEVICES or [None], ids=lambda d: getattr(d, "type", "none"))
def device(request):
    if request.param is None:
        pytest.skip("no cuda/xpu device and TRITON_INTERPRET unset")
    return request.param


def check(device, widths, dtype, act, out_act, bias=True, m=37, strided=True, grad=True,
          keep_saved=True, needs=(True, True, True)):
    """wide.forward/backward on fresh data vs the float64 reference (and, for 16-bit
    gradients, vs eager autograd in the same dtype, as the shared suite does)."""
    ws, bs = make_params(widths, bias, dtype, device)
    # strided: every other column of a wider buffer, so the kernels must honour strides
    x = torch.randn(m, 2 * widths[0], device=device).to(dtype)[:, ::2] if strided \
        else torch.randn(m, widths[0], device=device).to(dtype)
    spec = MLPSpec(tuple(widths), act, out_act, bias, dtype)
    tol = TOLERANCE[dtype]
    y, saved = wide.layers.forward(x, ws, bs, spec, grad)
    if not grad:
        assert saved is None
        assert_close(y, reference(x, ws, bs, act, out_act), tol)
        return
    assert saved.shape == (m, sum(saved_widths(spec)))  # the Backend contract: one tensor
    gy = torch.randn_like(y)
    gx, gw, gb = wide.layers.backward(gy, x, ws, bs, saved if keep_saved else None, spec, needs)
    # the reference's derivatives at the kernel's own pre-activations (see conftest.reference)
    kinks = list(saved.split(saved_widths(spec), dim=-1)) + ([y] if out_act == "none" else [])
    ref = reference(x, ws, bs, act, out_act, grad_y=gy, kinks_at=kinks)
    ry, rgx, rgw, rgb = ref
    assert_close(y, ry, tol)
    tols = [tol] * (1 + len(ws) + len(bs or []))
    if dtype != torch.float32 and m > 0:
        tols = [max(tol, GRAD_VS_EAGER * e) for e in eager_errors(x, ws, bs, act, out_act, gy, ref)]
    n = len(ws)
    if needs[0]:
        assert_close(gx, rgx, tols[0], "grad x")
    else:
        assert gx is None
    assert len(gw) == (n if needs[1] else 0)
    for i, g in enumerate(gw):
        assert_close(g, rgw[i], tols[1 + i], f"grad weights[{i}]")
    assert len(gb) == (n if needs[2] and bias else 0)
    for i, g in enumerate(gb):
        assert_close(g, rgb[i], tols[1 + n + i], f"grad biases[{i}]")


@pytest.mark.parametrize("act", ACTS)
def test_activations(device, act):
    """Every activation in the epilogue (hidden) and in the backward prologue (output)."""
    out_act = ACTS[(ACTS.index(act) + 4) % len(ACTS)]
    check(device, (20, 40, 33, 9), torch.float32, act, out_act)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [0, 1, 7, 37])
def test_rows_and_dtypes(device, dtype, m):
    """Row counts below, at and across the block; K and N not multiples of the block."""
    check(device, (24, 40, 17), dtype, "gelu_tanh", "none", m=m, strided=m % 2 == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_whole_blocks(device, dtype):
    """Every K a multiple of the block: the unmasked (EVEN_K) loads, rows included."""
    check(device, (32, 48, 32), dtype, "silu", "none", m=32, strided=False)


@pytest.mark.parametrize("needs", [(True, False, False), (False, True, False),
                                   (False, False, True), (False, True, True)], ids=str)
def test_partial_needs(device, needs):
    check(device, (16, 24, 8), torch.float32, "silu", "tanh", needs=needs)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_recompute_when_nothing_saved(device, bias):
    check(device, (16, 40, 24, 12), torch.float16, "gelu", "none", bias=bias, keep_saved=False)


@pytest.mark.parametrize("m", [0, 37])
def test_hidden_grads_in_column_chunks(device, monkeypatch, m):
    """Weight gradients of hidden layers built from h in column chunks (the memory
    bound of wide layers), forced small here: chunks of 16 columns, a ragged last one."""
    monkeypatch.setattr(wide.layers, "H_CHUNK_BYTES", 37 * 16 * 4)
    monkeypatch.setattr(wide.layers, "CHUNK_ALIGN", 16)
    assert len(wide.layers._col_chunks(37, 40, 4)) == 3
    check(device, (16, 40, 24, 8), torch.float32, "gelu", "softplus", m=m)


def test_col_chunks_cover_columns():
    for rows, cols, esize in [(8192, 16384, 2), (8192, 14336, 2), (16, 4096, 2), (8192, 300, 4)]:
        chunks = wide.layers._col_chunks(rows, cols, esize)
        assert chunks[0][0] == 0 and chunks[-1][1] == cols
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert all((c1 - c0) * rows * esize <= wide.layers.H_CHUNK_BYTES
                   or c1 - c0 <= wide.layers.CHUNK_ALIGN
                   for c0, c1 in chunks)
    assert len(wide.layers._col_chunks(8192, 16384, 2)) == 2  # wide-gelu train: 2 x 128 MiB


def test_forward_only(device):
    check(device, (16, 33, 8), torch.bfloat16, "relu", "sigmoid", grad=False)


def test_tile_order_covers_every_tile(device):
    """More row blocks than GROUP_M (8) and several column blocks: the grouped program
    order must still write each output tile exactly once (NaN poison shows a miss)."""
    m = 16 * 9 + 3 if device.type == "cpu" else 4096 + 3
    check(device, (16, 48), torch.float32, "none", "none", m=m, grad=False)


def test_tuning_buckets():
    assert [wide.configs._bucket(m) for m in (1, 16, 17, 64, 65, 8192, 10**6)] == \
        [16, 16, 32, 64, 128, 8192, 8192]
    for m in range(1, 5000):  # the plain-int bucket against Triton's next_power_of_2
        p2 = triton.next_power_of_2(m)
        assert wide.configs._bucket(m) == (max(16, p2) if m <= 64 else min(p2, 8192)), m


def test_grid_counts_every_tile():
    meta = {"BLOCK_M": 64, "BLOCK_N": 128}
    for M, N in [(1, 1), (64, 128), (65, 129), (1000, 4096), (8192, 16384)]:
        assert wide.configs._grid(M, N)(meta) == (triton.cdiv(M, 64) * triton.cdiv(N, 128),)


def test_config_lists_are_well_formed():
    for fn in (wide.configs._configs_nvidia, wide.configs._configs_intel,
               wide.configs._configs_interpreter):
        for dual in (False, True):
            cfgs = fn(dual)
            assert cfgs, fn.__name__
            for c in cfgs:
                assert c.kwargs["BLOCK_M"] >= 16 and c.kwargs["BLOCK_K"] >= 16, c
            # both the decode and the large-M prune keep at least one config
            assert wide.configs._prune(cfgs, {"M_BUCKET": 16})
            assert wide.configs._prune(cfgs, {"M_BUCKET": 8192})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("m", [16, 8192])
def test_prune_fits_shared_memory(monkeypatch, dtype, dual, m):
    """Every config the prune hands the autotuner (or the one taken without tuning) fits
    the device's shared memory for the operands' element size: the 16-bit lists at fp32
    asked 245-295 KB on the H200 (limit 227 KB) and failed to launch."""
    limit = 227 * 1024
    monkeypatch.setattr(wide.configs, "_smem_limit", lambda device: limit)
    x = torch.empty(2, 2, dtype=dtype)
    for autotune in ("1", "0"):
        monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", autotune)
        cfgs = wide.configs._prune(wide.configs._configs_nvidia(dual), {"x_ptr": x, "M_BUCKET": m},
                                   dual=dual)
        assert cfgs
        for c in cfgs:
            assert wide.configs._smem_bytes(c, x.element_size(), dual) <= limit, c
    if dtype == torch.bfloat16:  # the lists were made for 16-bit operands: kept as they are
        monkeypatch.setenv("FUSEDMLP_WIDE_AUTOTUNE", "1")
        cfgs = wide.configs._configs_nvidia(dual)
        assert wide.configs._prune(cfgs, {"x_ptr": x, "M_BUCKET": m}, dual=dual) == \
            [c for c in cfgs if (c.kwargs["BLOCK_M"] <= 64) == (m <= 64)]


def test_kernels_compile_for_hopper():
    """The interpreter accepts code the GPU compiler may not: compile every kernel variant
    for sm_90 ahead of time (no GPU needed; one large and one decode config each)."""
    out = run_aot_compile("aot_wide.py")
    assert out.count("wgmma") >= len(wide.configs._KERNELS), out  # tensor cores, Hopper MMA
    if wide.tma.TensorDescriptor is not None:  # the TMA forward: tensor cores fed by TMA copies
        # fwd, fwd + z, gated, + g, u, dx, gated dh; fwd, fwd + z and dx with the hardware tanh
        assert out.count("wgmma tma ") == 9, out
        assert "sk_fixup " in out and "FAILED" not in out, out  # the stream-K fixup
    gluon = [ln for ln in out.splitlines() if ln.startswith("gluon-ws ")]
    if gluon:  # the warp-specialized dx and gated dh (hopper_gemm.py), with and without h
        assert len(gluon) == 4 and all("wgmma setmaxnreg" in ln for ln in gluon), gluon
    # what runs at M 8192 (the TMA and Gluon kernels) keeps its MMAs pipelined (ptxas
    # serializes some configs of the pointer kernels' autotuning lists: NOTES wide history 20)
    fast = [ln for ln in out.splitlines() if "wgmma tma " in ln or ln.startswith("gluon-ws ")]
    assert not [ln for ln in fast if SERIALIZED in ln], out


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 37, 64, 1000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_device_wide_and_decode(m, dtype):
    """Transformer-sized widths on the device, decode row counts included."""
    devs = [d for d in DEVICES if d.type != "cpu"]
    if not devs:
        pytest.skip("needs a cuda/xpu device")
    check(devs[0], (512, 2048, 512), dtype, "gelu_tanh", "none", m=m)


def test_act_id_rule(monkeypatch):
    """The PTX forms (act.APPROX) only on a compiled NVIDIA device: the hardware tanh for
    gelu_tanh and tanh with 16-bit operands unless switched off, softplus's lg2 always;
    the narrow kernels take the softplus one only."""
    monkeypatch.setattr(common, "interpreting", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv(common.APPROX_ENV, raising=False)
    cuda, approx = torch.device("cuda", 0), act_mod.APPROX.value
    for act in ACTS:
        base = activations.ACTIVATIONS[act].id
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            tanh = act in ("gelu_tanh", "tanh") and dtype != torch.float32
            want = base + approx * (tanh or act == "softplus")
            assert wide.configs.act_id(act, cuda, dtype) == want, (act, dtype)
            spec = MLPSpec((8, 16, 4), act, act, dtype=dtype)
            narrow = base + approx * (act == "softplus")
            assert common.narrow_act_ids(spec, "cuda") == (narrow, narrow), (act, dtype)
            assert common.narrow_act_ids(spec, "cpu") == (base, base), (act, dtype)
        for dev in ("cpu", "xpu"):
            assert wide.configs.act_id(act, torch.device(dev), torch.bfloat16) == base
    monkeypatch.setenv(common.APPROX_ENV, "0")
    assert wide.configs.act_id("gelu_tanh", cuda, torch.bfloat16) == activations.ACTIVATIONS[
        "gelu_tanh"].id
    monkeypatch.delenv(common.APPROX_ENV)
    monkeypatch.setattr(common, "interpreting", lambda: True)
    assert wide.configs.act_id("tanh", cuda, torch.bfloat16) == activations.ACTIVATIONS["tanh"].id
    assert wide.configs.act_id("softplus", cuda, torch.float16) == activations.ACTIVATIONS[
        "softplus"].id
    monkeypatch.setattr(common, "interpreting", lambda: False)
    monkeypatch.setattr(torch.version, "hip", "6.0")  # ROCm devices are "cuda" too: no PTX
    assert wide.configs.act_id("tanh", cuda, torch.bfloat16) == activations.ACTIVATIONS["tanh"].id
    assert wide.configs.act_id("softplus", cuda, torch.float32) == activations.ACTIVATIONS[
        "softplus"].id


@triton.jit
def _act_probe_kernel(z_ptr, y_ptr, d_ptr, n, ACT: tl.constexpr):
    i = tl.program_id(0) * 1024 + tl.arange(0, 1024)
    z = tl.load(z_ptr + i, mask=i < n)
    tl.store(y_ptr + i, act_mod.act(z, ACT), mask=i < n)
    tl.store(d_ptr + i, act_mod.act_grad(z, ACT), mask=i < n)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ["gelu_tanh", "tanh", "softplus"])
def test_approx_activations(act):
    """act and act' through the PTX forms against float64, elementwise, over [-12, 12]:
    the hardware tanh's act within 1e-3 max(1, |z|), act' within 5e-3 (it takes
    1 - tanh^2, where tanh.approx's error counts most); softplus's lg2 within 1e-6
    max(1, |z|) (its act' is the portable sigmoid); the portable forms within 1e-5."""
    if not torch.cuda.is_available() or torch.version.hip is not None:
        pytest.skip("needs an NVIDIA GPU")
    z = torch.linspace(-12, 12, 100_003, device="cuda", dtype=torch.float64)
    z = z + torch.rand_like(z) * 1e-4  # fresh points each run
    zd = z.detach().requires_grad_()
    ref = activations.ACTIVATIONS[act].fn(zd)
    (dref,) = torch.autograd.grad(ref.sum(), zd)
    base = activations.ACTIVATIONS[act].id
    scale = z.abs().clamp(min=1)
    fast = (1e-6, 1e-5) if act == "softplus" else (1e-3, 5e-3)
    for act_id, bound_y, bound_d in ((base + act_mod.APPROX.value, *fast), (base, 1e-5, 1e-5)):
        y, d = (torch.full_like(z, float("nan"), dtype=torch.float32) for _ in range(2))
        _act_probe_kernel[(triton.cdiv(z.numel(), 1024),)](z.float(), y, d, z.numel(),
                                                           ACT=act_id)
        err_y = ((y.double() - ref.detach()).abs() / scale).max().item()
        err_d = ((d.double() - dref).abs() / scale).max().item()
        print(f"{act} id {act_id}: act error {err_y:.2e}, act' error {err_d:.2e}")
        assert err_y < bound_y and err_d < bound_d, (act_id, err_y, err_d)


def _tma_spy(monkeypatch):
    """The TMA kernels launched through wide._tma_launch, by name."""
    ran = []
    launch = wide.tma._tma_launch

    def spy(kernel, *args, **kwargs):
        ran.append(getattr(kernel, "__name__", None) or kernel.fn.__name__)
        return launch(kernel, *args, **kwargs)
    monkeypatch.setattr(wide.tma, "_tma_launch", spy)
    return ran


def _tma_shape(device):
    """(M, N, K): more tiles than programs (each persistent program walks several, the
    last ones partly past M and N) and a K that is not a whole number of K blocks."""
    return (85, 56, 40) if device.type == "cpu" else (17 * 128 - 43, 9 * 256 - 8, 520)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("save", [False, True], ids=["infer", "save"])
def test_tma_forward(device, monkeypatch, dtype, save):
    """The TMA forward kernel against the float64 reference, its saved pre-activations
    too; the spy proves it, not the pointer kernel, ran (cuBLAS's forward off)."""
    _needs_tma(device)
    monkeypatch.setenv(wide.cublas.BLAS_ENV, "0")
    ran = _tma_spy(monkeypatch)
    M, N, K = _tma_shape(device)
    x = torch.randn(M, K, device=device).to(dtype)
    w = (torch.randn(N, K, device=device) / K ** 0.5).to(dtype)
    b = torch.randn(N, device=device).to(dtype)
    z_ref = x.double().cpu() @ w.double().cpu().t() + b.double().cpu()
    tol = TOLERANCE[dtype]
    y, z = wide.layers.linear(x, w, b, "gelu_tanh", save)
    assert_close(y, activations.ACTIVATIONS["gelu_tanh"].fn(z_ref), tol)
    assert (z is not None) == save
    if save:
        assert_close(z, z_ref, tol, "z")
    assert ran == ["_linear_fwd_tma_kernel"]


def _stream_k_shapes(device):
    """(M, N, K) whose tiles leave a last partial wave short enough to split: in the
    interpreter (4 programs of 16x16x16 tiles) and on an H200 (132 of 128x256x64, at
    most 7 tiles split): several contributors a tile, contributors that each take a
    tile whole, partial last tiles along M, N and K, and fewer K iterations in the
    tail than programs, so that programs with nothing to do fall between a tile's
    contributors."""
    if device.type == "cpu":
        return [(80, 48, 64), (80, 48, 16), (65, 40, 24), (100, 72, 40), (80, 16, 32)]
    return [(7 * 128, 19 * 256 - 96, 4096), (9 * 128 - 5, 15 * 256 - 8, 520),
            (6 * 128 - 1, 23 * 256, 4096), (6 * 128 - 1, 23 * 256, 1000)]


@pytest.mark.parametrize("save", [False, True], ids=["infer", "save"])
def test_tma_forward_stream_k(device, monkeypatch, save):
    """The TMA forward's stream-K tail (its last partial wave split along K, partial
    sums finished by the fixup kernel) against the float64 reference, y and z, at shapes
    where the tail has work; the same inputs give the same bits twice (the partial
    sums are added in a fixed order); with FUSEDMLP_WIDE_STREAM_K=0 no tail is planned."""
    _needs_tma(device)
    fixups = []
    fixup = wide.gemm_kernels._stream_k_fixup_kernel

    class Spy:
        def __getitem__(self, grid):
            fixups.append(grid)
            return fixup[grid]
    monkeypatch.setattr(wide.gemm_kernels, "_stream_k_fixup_kernel", Spy())
    tol = TOLERANCE[torch.float16]
    for M, N, K in _stream_k_shapes(device):
        cfg = wide.configs._tma_config(device, "fwd_z" if save else "fwd")
        sk = wide.tma._stream_k_tiles(device, M, N, cfg)
        assert 0 < sk < wide.tma._programs(device)
        x = torch.randn(M, K, device=device).to(torch.float16)
        w = (torch.randn(N, K, device=device) / K ** 0.5).to(torch.float16)
        b = torch.randn(N, device=device).to(torch.float16)
        z_ref = x.double().cpu() @ w.double().cpu().t() + b.double().cpu()
        before = len(fixups)
        y, z = wide.layers.linear(x, w, b, "tanh", save)
        assert_close(y, torch.tanh(z_ref), tol, f"y {M}x{N}x{K}")
        if save:
            assert_close(z, z_ref, tol, f"z {M}x{N}x{K}")
        assert len(fixups) == before + 1 and fixups[-1][0] == sk  # this call's tail
        y2, _ = wide.layers.linear(x, w, b, "tanh", save)
        assert torch.equal(y, y2)
    monkeypatch.setenv(wide.tma.STREAM_K_ENV, "0")
    assert wide.tma._stream_k_tiles(device, M, N, cfg) == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tma_train_step(device, monkeypatch, dtype):
    """A two-layer train step whose forward GEMMs both take the TMA kernel, storing z for
    the backward, and whose hidden layer's input gradient (gelu' epilogue, h stored) takes
    the TMA dx kernel, against the float64 reference (cuBLAS's GEMMs off: the second
    layer's forward would be torch.addmm)."""
    _needs_tma(device)
    monkeypatch.setenv(wide.cublas.BLAS_ENV, "0")
    monkeypatch.setenv("FUSEDMLP_GLUON_WIDE", "0")  # sm_90's dx: test_gluon_wide.py
    ran = _tma_spy(monkeypatch)
    widths, m = ((40, 56, 48), 130) if device.type == "cpu" else ((1032, 2296, 2056), 2133)
    check(device, widths, dtype, "gelu_tanh", "none", m=m, strided=False)
    assert ran[:2] == ["_linear_fwd_tma_kernel"] * 2
    assert ran[2:] and set(ran[2:]) == {"_dx_tma_kernel"}  # one per column chunk


def _gated_tma_shape(device, monkeypatch):
    """(M, hidden, d) for the gated TMA kernel: more tiles than programs, partial last
    tiles, a K that is not whole K blocks. On the CPU the row threshold is lowered so the
    interpreter runs the kernel at a small shape."""
    if device.type == "cpu":
        monkeypatch.setattr(wide.gated, "GATED_TMA_MIN_ROWS", 65)
        return 85, 56, 40
    return wide.gated.GATED_TMA_MIN_ROWS + 85, 9 * 128 - 8, 520


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("save", [False, True], ids=["infer", "save"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias-strided"])
def test_gated_tma_forward(device, monkeypatch, dtype, save, bias):
    """The gated GEMM as one TMA GEMM over the interleaved weights, against the float64
    reference: h, and g and u when saved. Without biases the kernel reads the two
    weights in place (wide.weight_pair); with biases the weights are transposed views,
    so it reads their interleaved copy, and the biases are strided."""
    _needs_tma(device)
    M, H, K = _gated_tma_shape(device, monkeypatch)
    ran = _tma_spy(monkeypatch)
    x = torch.randn(M, K, device=device).to(dtype)
    wg, wu = ((torch.randn(H, K, device=device) / K ** 0.5).to(dtype) for _ in range(2))
    bg = bu = None
    if bias:
        wg, wu = wg.t().contiguous().t(), wu.t().contiguous().t()
        bg, bu = (torch.randn(2 * H, device=device).to(dtype)[::2] for _ in range(2))
    h, saved = wide.gated.gated_hidden(x, wg, wu, "silu", save, bg, bu)
    x64, f64 = x.double().cpu(), lambda t: 0 if t is None else t.double().cpu()
    g_ref, u_ref = x64 @ f64(wg).t() + f64(bg), x64 @ f64(wu).t() + f64(bu)
    tol = TOLERANCE[dtype]
    assert_close(h, torch.nn.functional.silu(g_ref) * u_ref, tol)
    assert len(saved) == (2 if save else 0)
    if save:
        assert_close(saved[0], g_ref, tol, "g")
        assert_close(saved[1], u_ref, tol, "u")
    assert ran == ["_gated_fwd_tma_kernel"]


def test_gated_tma_only_where_it_applies(device, monkeypatch):
    """Fewer rows than GATED_TMA_MIN_ROWS, fp32, a d whose interleaved weight rows are not
    whole 16 bytes (x a column slice with aligned rows), or FUSEDMLP_WIDE_TMA=0 keep the
    two-accumulator pointer kernel -- which computes the same."""
    if device.type != "cpu":
        pytest.skip("the rule is the same everywhere; checked once, in the interpreter")
    M, H, K = _gated_tma_shape(device, monkeypatch)
    ran = _tma_spy(monkeypatch)
    for x in (torch.randn(64, K, dtype=torch.float16), torch.randn(M, K),
              torch.randn(M, K + 8, dtype=torch.float16)[:, :K - 4]):
        k = x.shape[1]
        wg, wu = (torch.randn(H, k) / k ** 0.5 for _ in range(2))
        h, _ = wide.gated.gated_hidden(x, wg.to(x.dtype), wu.to(x.dtype), "silu", False)
        ref = torch.nn.functional.silu(x.double() @ wg.double().t()) * (x.double() @ wu.double().t())
        assert_close(h, ref, TOLERANCE[x.dtype])
    assert ran == []
    wg, wu = (torch.randn(H, K, dtype=torch.float16) for _ in range(2))
    _tma_env_switch(monkeypatch, ran, "_gated_fwd_tma_kernel", lambda: wide.gated.gated_hidden(
        torch.randn(M, K, dtype=torch.float16), wg, wu, "silu", False))


def _pair_layouts(H, K, dtype, device):
    """(name, w_gate, w_up, read in place?) for the layouts weight_pair handles."""
    w = (torch.randn(2 * H, K, device=device) / K ** 0.5).to(dtype)
    a, b = w[:H].clone(), w[H:].clone()
    return [("separate", a, b, True),
            ("up-below-gate", w[H:], w[:H], True),  # swap: the base is w_up
            ("interleaved-storage", w[0::2], w[1::2], True),
            ("concatenated", w[:H], w[H:], True),
            ("different-strides", a, w[H:].t().contiguous().t(), False)]


@pytest.mark.parametrize("layout", range(5), ids=["separate", "up-below-gate",
                                                   "interleaved-storage", "concatenated",
                                                   "different-strides"])
def test_gated_tma_weight_pair(device, monkeypatch, layout):
    """The gated TMA kernel reads the two weights in place through one pair descriptor
    whatever their order in memory (a swapped pair must still give g from w_gate), and
    copies them interleaved only where no such descriptor exists; biases follow the
    weights' order. Against the float64 reference, g and u saved."""
    _needs_tma(device)
    M, H, K = _gated_tma_shape(device, monkeypatch)
    ran = _tma_spy(monkeypatch)
    copies = []
    real = wide.tma.interleave
    monkeypatch.setattr(wide.tma, "interleave", lambda a, b: copies.append(a.dim()) or real(a, b))
    name, wg, wu, in_place = _pair_layouts(H, K, torch.bfloat16, device)[layout]
    assert (wide.tma.weight_pair(wg, wu) is not None) == in_place
    x = torch.randn(M, K, device=device).to(torch.bfloat16)
    bg, bu = (torch.randn(H, device=device).to(torch.bfloat16) for _ in range(2))
    h, (g, u) = wide.gated.gated_hidden(x, wg, wu, "gelu_tanh", True, bg, bu)
    x64, f64 = x.double().cpu(), lambda t: t.double().cpu()
    g_ref, u_ref = x64 @ f64(wg).t() + f64(bg), x64 @ f64(wu).t() + f64(bu)
    tol = TOLERANCE[torch.bfloat16]
    assert_close(g, g_ref, tol, "g")
    assert_close(u, u_ref, tol, "u")
    assert_close(h, torch.nn.functional.gelu(g_ref, approximate="tanh") * u_ref, tol)
    assert ran == ["_gated_fwd_tma_kernel"]
    assert copies == ([1] if in_place else [2, 1]), name  # the biases are always interleaved


def test_weight_pair_rules():
    """weight_pair's view where it exists (strides, base, swap) and None where it does not."""
    w = torch.randn(8, 16, dtype=torch.float16)
    base, strides, swap = wide.tma.weight_pair(w[:4], w[4:])
    assert base.data_ptr() == w.data_ptr() and strides == (16, 64, 1) and not swap
    base, strides, swap = wide.tma.weight_pair(w[4:], w[:4])
    assert base.data_ptr() == w.data_ptr() and strides == (16, 64, 1) and swap
    assert wide.tma.weight_pair(w[0::2], w[1::2])[1:] == ((32, 16, 1), False)
    a, b = torch.randn(4, 16).half(), torch.randn(4, 16).half()  # separate storages
    assert wide.tma.weight_pair(a, b) is not None
    flat = w.view(-1)
    for why, a, b in (("one tensor twice", w[:4], w[:4]),
                      ("shapes differ", w[:4], w[4:8, :8]),
                      ("dtypes differ", w[:4], w[4:].float()),
                      ("b 130 bytes from a", w[:4, :8], w[4:, 1:9]),
                      ("column stride 16", w[:4].t(), w[4:].t()),
                      ("30-byte rows", flat[:60].view(4, 15), flat[64:124].view(4, 15)),
                      ("overlapping rows", flat.as_strided((4, 16), (8, 1)),
                       flat.as_strided((4, 16), (8, 1), 64))):
        assert wide.tma.weight_pair(a, b) is None, why


def test_interleave():
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    i = wide.tma.interleave(a, b)
    assert torch.equal(i[0::2], a) and torch.equal(i[1::2], b) and i.is_contiguous()
    assert torch.equal(wide.tma.interleave(a[:, 0], b[:, 0]), torch.stack((a[:, 0], b[:, 0]),
                                                                          1).flatten())


@pytest.mark.parametrize("subtile", [False, True], ids=["whole", "subtile"])
@pytest.mark.parametrize("kind", ["dx", "gated_bwd"])
def test_tma_epilogue_halves(device, kind, subtile):
    """The TMA kernels with heavy epilogues, their epilogue taken whole or in two halves
    of the tile (SUBTILE): the input gradient with gelu' and h = gelu(z) stored, and the
    gated dh GEMM with dg, du and h = silu(g) u stored. Against the float64 reference,
    every output NaN-poisoned, partial tiles at the edges."""
    _needs_tma(device)
    if wide.tma.TensorDescriptor is None:
        pytest.skip("this Triton has no host tensor descriptors")
    cfg = wide.configs._tma_config(device, kind)[:5] + (subtile,)
    M, N, K = _tma_shape(device)
    dt = torch.bfloat16
    a = torch.randn(M, K, device=device).to(dt)
    w = (torch.randn(K, N, device=device) / K ** 0.5).to(dt)  # [out, in]: read as [K, N]
    z = torch.randn(M, N, device=device).to(dt)
    u = torch.randn(M, N, device=device).to(dt)
    outs = [torch.full((M, N), float("nan"), device=device, dtype=dt) for _ in range(3)]
    acc = a.double().cpu() @ w.double().cpu()
    z64 = z.double().cpu().requires_grad_()
    if kind == "dx":
        act = torch.nn.functional.gelu(z64, approximate="tanh")
        refs = [acc * torch.autograd.grad(act.sum(), z64)[0], act.detach()]
        assert wide.tma._dx_tma(a, w, z, outs[0], outs[1], "gelu_tanh", cfg)
    else:
        u64 = u.double().cpu()
        act = torch.nn.functional.silu(z64)
        refs = [acc * u64 * torch.autograd.grad(act.sum(), z64)[0], acc * act.detach(),
                act.detach() * u64]
        assert wide.tma._gated_bwd_tma(a, w, z, u, outs[0], outs[1], "silu", cfg, outs[2])
    for what, out, ref in zip(("out/dg", "h/du", "h"), outs, refs):
        assert_close(out, ref, TOLERANCE[dt], what)


def _needs_tma(device):
    if device.type == "xpu":
        pytest.skip("the TMA path is CUDA (Hopper+) and interpreter only")
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
        pytest.skip("TMA needs sm_90+")


class _Refused(Exception):
    pass


_Refused.__name__ = "OutOfResources"  # what Triton raises when shared memory runs out


def test_tma_launch_steps_stages_down(monkeypatch):
    """A config the device refuses runs with fewer stages (remembered); when not even one
    stage fits, _tma_launch says so and the caller takes the pointer kernel."""
    tried = []

    class Kernel:
        def __init__(self, fits):
            self.fits = fits

        def __getitem__(self, grid):
            def run(*args, num_stages, **kwargs):
                tried.append(num_stages)
                if num_stages > self.fits:
                    raise _Refused("shared memory")
            return run
    monkeypatch.setattr(wide.tma, "TensorDescriptor", type("D", (), {
        "from_tensor": staticmethod(lambda t, block: (t, block))}))
    monkeypatch.setattr(wide.tma, "_TMA_FIT", {})
    t, dev = torch.empty(4, 4), torch.device("cpu")
    cfg = (16, 16, 16, 1, 3)
    fits = Kernel(1)
    assert wide.tma._tma_launch(fits, dev, cfg, 64, 64, [(t, "m", "k")], (), {"A": 1})
    assert wide.tma._tma_launch(fits, dev, cfg, 64, 64, [(t, "m", "k")], (), {"A": 1})
    assert tried == [3, 2, 1, 1]  # the second call starts at what fitted
    assert not wide.tma._tma_launch(Kernel(0), dev, cfg, 64, 64, [(t, "m", "k")], (), {"A": 1})


def test_tma_path_is_taken_only_where_it_applies(device, monkeypatch):
    """fp32, a row stride the TMA engine cannot take (not a multiple of 16 bytes), few
    rows, or FUSEDMLP_WIDE_TMA=0 keep the pointer kernels -- which still compute right."""
    if device.type != "cpu":
        pytest.skip("the rule is the same everywhere; checked once, in the interpreter")
    ran = _tma_spy(monkeypatch)
    M, N, K = _tma_shape(device)
    w = torch.randn(N, K, dtype=torch.float16) / K ** 0.5
    cases = [torch.randn(M, K), torch.randn(M, K + 1, dtype=torch.float16)[:, :K],
             torch.randn(64, K, dtype=torch.float16)]
    for x in cases:
        y, _ = wide.layers.linear(x, w.to(x.dtype), None, "relu", False)
        assert_close(y, torch.relu(x.double() @ w.double().t()), TOLERANCE[x.dtype])
    _tma_env_switch(monkeypatch, ran, "_linear_fwd_tma_kernel", lambda: wide.layers.linear(
        torch.randn(M, K, dtype=torch.float16), w, None, "relu", False))


def _tma_env_switch(monkeypatch, ran, kernel, call):
    """With nothing launched through TMA so far (``ran`` empty): FUSEDMLP_WIDE_TMA=0
    keeps ``call`` off the TMA kernels, =1 puts it on ``kernel``."""
    assert ran == []
    monkeypatch.setenv(wide.tma.TMA_ENV, "0")
    call()
    assert ran == []
    monkeypatch.setenv(wide.tma.TMA_ENV, "1")
    call()
    assert ran == [kernel]


def test_tma_rule_on_cuda_devices(monkeypatch):
    """The CUDA side of the TMA rule, without a GPU: a device before Hopper (no programs
    recorded) never takes it, and a Hopper-class one only with a full wave of tiles."""
    if wide.tma.TensorDescriptor is None:
        pytest.skip("this Triton has no host tensor descriptors")
    cuda = torch.device("cuda", 0)
    x, w, y = torch.empty(4096, 512, dtype=torch.bfloat16), \
        torch.empty(1024, 512, dtype=torch.bfloat16), torch.empty(4096, 1024, dtype=torch.bfloat16)
    cfg = wide.configs._tma_config_nvidia("fwd")
    tiles = triton.cdiv(4096, cfg[0]) * triton.cdiv(1024, cfg[1])  # 32 x 4
    monkeypatch.setattr(wide.tma, "_PROGRAMS", {("cuda", 0): 0})
    assert not wide.tma._tma_ok(cuda, 4096, 1024, cfg, x, w, y)
    monkeypatch.setattr(wide.tma, "_PROGRAMS", {("cuda", 0): tiles})
    assert wide.tma._tma_ok(cuda, 4096, 1024, cfg, x, w, y)
    monkeypatch.setattr(wide.tma, "_PROGRAMS", {("cuda", 0): tiles + 1})
    assert not wide.tma._tma_ok(cuda, 4096, 1024, cfg, x, w, y)
    monkeypatch.setattr(wide.tma, "_PROGRAMS", {("xpu", 0): 64})
    assert not wide.tma._tma_ok(torch.device("xpu", 0), 4096, 1024, cfg, x, w, y)


def test_stream_k_rule_on_cuda_devices(monkeypatch):
    """Which last waves the TMA forward splits on a 132-SM device (no GPU needed): short
    ones only (wide-gelu's first GEMM, 4 tiles past 31 waves), not the 100 tiles past 7
    waves of its second, whose split read more than it saved on the H200; none when the
    tiles fill whole waves or FUSEDMLP_WIDE_STREAM_K=0."""
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(wide.tma, "_PROGRAMS", {("cuda", 0): 132})
    cfg = wide.configs._tma_config_nvidia("fwd")
    assert wide.tma._stream_k_tiles(cuda, 8192, 16384, cfg) == 4
    assert wide.tma._stream_k_tiles(cuda, 8192, 4096, cfg) == 0
    assert wide.tma._stream_k_tiles(cuda, 132 * 128, 256, cfg) == 0  # whole waves
    assert wide.tma._stream_k_tiles(cuda, 128, 7 * 256, cfg) == 0  # under one wave
    monkeypatch.setenv(wide.tma.STREAM_K_ENV, "0")
    assert wide.tma._stream_k_tiles(cuda, 8192, 16384, cfg) == 0


def _pointer_kernel_spy(monkeypatch):
    """The names ("dx", "dw", ...) of the autotuned pointer kernels looked up to launch."""
    launched = []
    real = wide.configs._kernel

    def spy(name, dev):
        launched.append(name)
        return real(name, dev)
    monkeypatch.setattr(wide.configs, "_kernel", spy)
    # grad_input's plans look their kernel up once: a fresh plan each call, so each looks
    monkeypatch.setattr(wide.layers, "_dx_plan", wide.layers._DxLaunch)
    return launched


@pytest.mark.parametrize("g_act", ["none", "tanh"])
def test_grad_weight_paths(device, monkeypatch, g_act):
    """dW = (g * g_act'(g_z))^T h into a column slice of a wider buffer (as the chunked
    backward writes it), against the float64 reference: without a prologue it is one
    torch.mm on CUDA (no Triton dW launch) unless FUSEDMLP_WIDE_BLAS=0; with one, or
    on any other device, the Triton kernel runs."""
    launched = _pointer_kernel_spy(monkeypatch)
    M, n_out, n_in = (70, 24, 40) if device.type == "cpu" else (1000, 384, 520)
    for blas in ("1", "0"):
        monkeypatch.setenv(wide.cublas.BLAS_ENV, blas)
        launched.clear()
        g = torch.randn(M, n_out, device=device).to(torch.bfloat16)
        gz = torch.randn(M, n_out, device=device).to(torch.bfloat16)
        h = torch.randn(M, n_in, device=device).to(torch.bfloat16)
        buf = torch.full((n_out, 2 * n_in), float("nan"), device=device, dtype=torch.bfloat16)
        dw, db = wide.layers.grad_weight(g, h, gz if g_act != "none" else None, g_act,
                                  bias_grad=True, out=buf[:, n_in:])
        g64 = g.double().cpu()
        if g_act != "none":
            g64 = g64 * activations.ACTIVATIONS[g_act].grad(gz.double().cpu())
        assert_close(dw, g64.t() @ h.double().cpu(), TOLERANCE[torch.bfloat16], "dW")
        assert_close(db, g64.sum(0), TOLERANCE[torch.bfloat16], "db")
        assert torch.isnan(buf[:, :n_in]).all()  # nothing written outside the slice
        blas_ran = device.type == "cuda" and blas == "1" and g_act == "none"
        assert launched == ([] if blas_ran else ["dw"])


@pytest.mark.parametrize("dual", [False, True], ids=["single", "dual"])
def test_grad_input_paths(device, monkeypatch, dual):
    """dx = g W (+ g2 W2, the gated dx) with no activation or prologue, into a column
    slice of a wider buffer, against the float64 reference: torch.mm (and addmm_) on
    CUDA, no Triton launch, unless FUSEDMLP_WIDE_BLAS=0; the Triton kernel elsewhere."""
    launched = _pointer_kernel_spy(monkeypatch)
    M, n_out, n_in = (70, 24, 40) if device.type == "cpu" else (1000, 384, 520)
    for blas in ("1", "0"):
        monkeypatch.setenv(wide.cublas.BLAS_ENV, blas)
        launched.clear()
        g, g2 = (torch.randn(M, n_out, device=device).to(torch.bfloat16) for _ in range(2))
        w, w2 = (torch.randn(n_out, n_in, device=device).to(torch.bfloat16) for _ in range(2))
        buf = torch.full((M, 2 * n_in), float("nan"), device=device, dtype=torch.bfloat16)
        kw = dict(g2=g2, w2=w2) if dual else {}
        dx, h = wide.layers.grad_input(g, w, out=buf[:, n_in:], **kw)
        ref = g.double().cpu() @ w.double().cpu()
        if dual:
            ref = ref + g2.double().cpu() @ w2.double().cpu()
        assert h is None
        assert_close(dx, ref, TOLERANCE[torch.bfloat16], "dx")
        assert torch.isnan(buf[:, :n_in]).all()  # nothing written outside the slice
        blas_ran = device.type == "cuda" and blas == "1"
        assert launched == ([] if blas_ran else ["dx"])


@pytest.mark.parametrize("act,bias", [("none", True), ("none", False), ("gelu_tanh", True),
                                      ("relu", True), ("gelu_tanh", False), ("silu", True)])
def test_forward_blas_paths(device, monkeypatch, request, act, bias):
    """An inference layer (no z stored) whose epilogue cuBLAS(Lt) has - bias, bias + GELU
    (tanh) or ReLU, or nothing - is one torch op on CUDA from BLAS_FWD_MIN_ROWS rows, unless
    FUSEDMLP_WIDE_BLAS=0, or GELU(tanh) has the hardware tanh (not with
    FUSEDMLP_APPROX_TANH=0) past BLAS_LT_GELU_MAX_ROWS rows; fewer rows (if any), other
    epilogues, a stored z and other devices run the Triton kernels. Each path against the
    float64 reference, into poisoned outputs."""
    ran = []
    real = wide.cublas._blas_linear
    monkeypatch.setattr(wide.cublas, "_blas_linear", lambda *a: ran.append(a[3]) or real(*a))
    big = device.type == "cuda"
    K, N = (40, 24) if not big else (520, 384)
    w = (torch.randn(N, K, device=device) / K ** 0.5).to(torch.bfloat16)
    b = torch.randn(N, device=device).to(torch.bfloat16) if bias else None
    fn = activations.ACTIVATIONS[act].fn
    request.addfinalizer(wide.layers._linear_plan.cache_clear)  # no plan of FUSEDMLP_APPROX_TANH=0
    # the hardware tanh is CUDA's alone: elsewhere the third pass would repeat the first
    for blas, approx in (("1", "1"), ("0", "1"), ("1", "0"))[:3 if big else 2]:
        monkeypatch.setenv(wide.cublas.BLAS_ENV, blas)
        monkeypatch.setenv(wide.configs.APPROX_ENV, approx)
        wide.layers._linear_plan.cache_clear()  # the hardware tanh is a plan's choice
        cases = [(wide.cublas.BLAS_FWD_MIN_ROWS, False), (wide.cublas.BLAS_FWD_MIN_ROWS + 200,
                                                          False),
                 (wide.cublas.BLAS_FWD_MIN_ROWS + 3, True), (wide.cublas.BLAS_LT_GELU_MAX_ROWS,
                                                             False),
                 (wide.cublas.BLAS_LT_GELU_MAX_ROWS + 1, False)]
        if wide.cublas.BLAS_FWD_MIN_ROWS > 1:
            cases.append((wide.cublas.BLAS_FWD_MIN_ROWS - 1, False))
        for M, save in cases:
            ran.clear()
            x = torch.randn(M, K, device=device).to(torch.bfloat16)
            y, z = wide.layers.linear(x, w, b, act, save)
            z64 = x.double().cpu() @ w.double().cpu().t()
            if b is not None:
                z64 = z64 + b.double().cpu()
            assert_close(y, fn(z64), TOLERANCE[torch.bfloat16], f"y ({act}, {M} rows)")
            assert (z is None) == (not save)
            # GELU(tanh) keeps the Triton kernel where that has the hardware tanh, past
            # BLAS_LT_GELU_MAX_ROWS rows
            lt_gelu = act == "gelu_tanh" and (
                approx == "0" or M <= wide.cublas.BLAS_LT_GELU_MAX_ROWS)
            want = (big and blas == "1" and not save and M >= wide.cublas.BLAS_FWD_MIN_ROWS
                    and (act == "none" or (bias and (act == "relu" or lt_gelu))))
            assert ran == ([act] if want else []), (M, save, blas)
