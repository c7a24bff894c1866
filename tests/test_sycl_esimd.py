"""The sycl backend's ESIMD path (kernels/sycl/fused_mlp_esimd.cpp): which nets it takes
and why, the weight packing against dpas's VNNI definition, the dispatcher on a mocked
Max 1550, the kernels themselves on opencl:cpu through esimd_emu.hpp against float64
(forward and every gradient, each activation, widths 16-128, odd batches), and loading a
configuration from SPIR-V instead of source."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
import zlib

import pytest
import torch

import fusedmlp_xpu as fm
from conftest import BACKENDS, TOLERANCE, gradient_floors, rel_error
from fusedmlp_xpu import activations, dispatch

sycl = importlib.import_module("fusedmlp_xpu.backends.sycl")
esimd = importlib.import_module("fusedmlp_xpu.backends.sycl_esimd")

needs_sycl_cpu = pytest.mark.skipif(
    ("sycl", torch.device("cpu")) not in BACKENDS,
    reason="the sycl backend cannot run on opencl:cpu here (see `fusedmlp info`)")
HALF = (torch.float16, torch.bfloat16)


# --- which nets, and why ------------------------------------------------------------------
@pytest.mark.parametrize("widths,dtype,want", [
    ((64,) * 6, torch.float16, (64, 64, 64)),                 # narrow-w64
    ((64,) + (128,) * 4 + (64,), torch.bfloat16, (64, 128, 64)),  # narrow-w128: 128 KiB
    ((3, 16, 16, 5), torch.float16, (16, 16, 16)),
    ((17, 33, 33, 100), torch.bfloat16, (32, 64, 128)),
    ((64,) * 13, torch.float16, (64, 64, 64)),                # paper-table1, 104 KiB
    ((64,) + (128,) * 8 + (64,), torch.float16, (64, 128, 64)),  # 240 KiB: no SLM limit
])
def test_config_for_pads_on_chip(widths, dtype, want):
    cfg, why = esimd.config_for(fm.MLPSpec(widths, "relu", "none", False, dtype))
    assert cfg is not None, why
    assert (cfg.IN, cfg.H, cfg.OUT) == want and cfg.dtype == dtype
    assert "ESIMD" in why and "KiB" in why


@pytest.mark.parametrize("widths,dtype,reason", [
    ((64, 64, 64), torch.float32, "float16/bfloat16"),
    ((64, 16), torch.float16, "one layer"),
    ((64, 32, 64, 16), torch.float16, "hidden widths [32, 64] differ"),
    ((64, 129, 16), torch.float16, "width 129 over 128"),
])
def test_config_for_declines_with_reason(widths, dtype, reason):
    cfg, why = esimd.config_for(fm.MLPSpec(widths, "relu", "none", False, dtype))
    assert cfg is None and reason in why, why


def test_pack_tiles_is_dpas_vnni():
    """Tile (n, k) holds B[k][n] = m[16 n + n', 16 k + k'] at (k' // 2) * 32 + n' * 2 +
    k' % 2, as xmx::dpas reads its B operand; padding is zero."""
    m = torch.randn(20, 37)
    flat = esimd.pack_tiles(m, 32, 48)
    tiles = flat.view(2, 3, 256)
    p = torch.zeros(32, 48)
    p[:20, :37] = m
    for nt in range(2):
        for kt in range(3):
            for kk in range(16):
                for nn in range(16):
                    assert tiles[nt, kt, (kk // 2) * 32 + nn * 2 + kk % 2] == \
                        p[16 * nt + nn, 16 * kt + kk]


def test_backward_pack_is_the_forward_pack_of_w_transposed_in_reverse():
    spec = fm.MLPSpec((17, 32, 32, 9), "relu", "none", False, torch.float16)
    cfg = esimd.config_for(spec)[0]
    ws = [torch.randn(spec.widths[i + 1], spec.widths[i]) for i in range(spec.n_layers)]
    fwd = esimd.pack_forward(ws, cfg)
    bwd = esimd.pack_backward(ws, cfg)
    assert fwd.numel() == bwd.numel() == cfg.packed_bytes(spec.n_layers) // 2
    # the last layer comes first in the backward: W_2 [9, 32] as B tiles of g_2 W_2
    first = esimd.pack_tiles(ws[2].t(), 32, 16)
    assert torch.equal(bwd[: first.numel()], first)


def test_dpas_counts_are_the_widths_tile_products():
    w64 = esimd.EsimdConfig(torch.float16, 64, 64, 64)
    # 4 row groups x (first 4x4 + hidden 4x4 + last 4x4)
    assert w64.dpas("fwd") == w64.dpas("bwd") == 4 * 48
    w128 = esimd.EsimdConfig(torch.bfloat16, 64, 128, 16)
    assert w128.dpas("fwd") == 2 * (4 * 8 + 8 * 8 + 8 * 1)
    assert w64.dpas("wgrad") == esimd.WGRAD_ROWS // 16 * esimd.WGRAD_MR * (esimd.WGRAD_NR + 1)
    assert len(esimd.all_configs()) == 2 * 4 ** 3


def test_build_options_ask_for_large_grf_on_the_gpu_only():
    assert "-DFMLP_ESIMD_LARGE_GRF" in esimd.build_options(emulate=False)
    emulated = esimd.build_options(emulate=True)
    assert "-DFMLP_ESIMD_EMULATE" in emulated and "-DFMLP_ESIMD_LARGE_GRF" not in emulated


# --- the dispatcher on a (mocked) Max 1550 --------------------------------------------------
XPU = torch.device("xpu", 0)


@pytest.fixture
def max_1550(monkeypatch):
    monkeypatch.setattr(dispatch, "_decisions", {})
    monkeypatch.setitem(dispatch.REGISTRY, "sycl", sycl.SyclBackend())
    monkeypatch.setitem(dispatch._availability, "sycl", (True, "mocked available"))
    props = types.SimpleNamespace(name="Intel(R) Data Center GPU Max 1550",
                                  total_memory=128 << 30)
    monkeypatch.setattr(torch.xpu, "get_device_properties", lambda device=None: props)


def test_max_1550_runs_esimd_and_says_why(max_1550):
    spec = fm.MLPSpec((64,) * 6, "relu", "none", False, torch.bfloat16)
    ex = dispatch.explain_choice(XPU, spec)
    assert ex.backend == "sycl", str(ex)
    why = {c.name: c.reason for c in ex.considered}["sycl"]
    assert "ESIMD dpas kernel bf16_64_64_64" in why and "Max 1550" in why


@pytest.mark.parametrize("spec,reason", [
    (fm.MLPSpec((64, 64, 64), "relu", "none", False, torch.float32), "float16/bfloat16"),
    (fm.MLPSpec((64, 32, 64, 8), "relu", "none", False, torch.float16), "differ"),
])
def test_max_1550_portable_where_esimd_cannot(max_1550, spec, reason):
    ex = dispatch.explain_choice(XPU, spec)
    assert ex.backend == "sycl", str(ex)
    why = {c.name: c.reason for c in ex.considered}["sycl"]
    assert "portable SYCL kernel (not ESIMD" in why and reason in why


def test_esimd_switch_off_keeps_the_portable_kernels(max_1550, monkeypatch):
    monkeypatch.setenv(esimd.ENABLE_ENV, "0")
    spec = fm.MLPSpec((64,) * 6, "relu", "none", False, torch.float16)
    why = {c.name: c.reason for c in dispatch.explain_choice(XPU, spec).considered}["sycl"]
    assert f"portable SYCL kernel ({esimd.ENABLE_ENV}=0)" in why


# --- the kernels, emulated on opencl:cpu, against float64 ------------------------------------
# Four configurations a dtype (hidden 16/32/64/128; every one a compile of ~10 s), each
# activation as hidden and as output activation across them, biases or not, batches that
# are not a multiple of a thread's rows or a work-group's.
NETS = [(3, 16, 16, 5), (17, 32, 32, 32, 9), (64, 64, 64, 64, 64, 64), (100, 128, 128, 3)]
ACTS = sorted(activations.ACTIVATIONS)
CASES = [(NETS[i % 4], act, ACTS[(i + 4) % len(ACTS)], i % 2 == 0, (1, 37, 515)[i % 3])
         for i, act in enumerate(ACTS)]


def _run(widths, act, out_act, bias, rows, dtype, backend):
    g = torch.Generator().manual_seed(zlib.crc32(repr((widths, act, rows)).encode()))
    ws = [((torch.rand(widths[i + 1], widths[i], generator=g) * 2 - 1) / widths[i] ** 0.5)
          .to(dtype).requires_grad_() for i in range(len(widths) - 1)]
    bs = [(torch.rand(widths[i + 1], generator=g) - 0.5).to(dtype).requires_grad_()
          for i in range(len(widths) - 1)] if bias else None
    x = torch.randn(rows, widths[0], generator=g).to(dtype).requires_grad_()
    gy = torch.randn(rows, widths[-1], generator=g).to(dtype)
    y = fm.fused_mlp(x, ws, bs, act, output_activation=out_act, backend=backend)
    grads = torch.autograd.grad(y, [x, *ws, *(bs or [])], gy)
    return (x, ws, bs, gy), y, grads


def _assert_float64(x, ws, bs, act, out_act, gy, y, grads, dtype):
    """y and the gradients (of x, the weights, the biases) of the ESIMD path against the
    float64 reference on the same inputs; half-precision gradients of a deep net measured
    against eager's own error (gradient_floors)."""
    d = torch.float64
    xr = x.detach().to(d).requires_grad_()
    wr = [w.detach().to(d).requires_grad_() for w in ws]
    br = [b.detach().to(d).requires_grad_() for b in bs] if bs is not None else None
    yr = fm.fused_mlp(xr, wr, br, act, output_activation=out_act, backend="reference")
    refs = torch.autograd.grad(yr, [xr, *wr, *(br or [])], gy.to(d))
    tol = TOLERANCE[dtype]
    assert rel_error(y, yr) < tol
    floors = gradient_floors(x, ws, bs, act, out_act, gy)
    for i, (got, ref, floor) in enumerate(zip(grads, refs, floors)):
        assert rel_error(got, ref, floor) < 4 * tol, f"gradient {i}"


@needs_sycl_cpu
@pytest.mark.parametrize("dtype", HALF, ids=["f16", "bf16"])
@pytest.mark.parametrize("widths,act,out_act,bias,rows", CASES,
                         ids=[f"{c[1]}-{c[2]}-h{c[0][1]}" for c in CASES])
def test_esimd_emulated_matches_float64(widths, act, out_act, bias, rows, dtype):
    spec = fm.MLPSpec(widths, act, out_act, bias, dtype)
    assert "ESIMD" in sycl.SyclBackend().supports(spec, torch.device("cpu"))[1]
    (x, ws, bs, gy), y, grads = _run(widths, act, out_act, bias, rows, dtype, "sycl")
    _assert_float64(x, ws, bs if bias else None, act, out_act, gy, y, grads, dtype)


def _check_against_float64(widths, act, out_act, bias, rows, dtype, x=None, scale=1.0):
    """The ESIMD path (emulated) against float64, forward and every gradient; ``x`` a given
    input (any strides), ``scale`` on the weights."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((widths, act, rows, scale)).encode()))
    ws = [((torch.rand(widths[i + 1], widths[i], generator=g) * 2 - 1) * scale / widths[i] ** 0.5)
          .to(dtype).requires_grad_() for i in range(len(widths) - 1)]
    bs = [((torch.rand(widths[i + 1], generator=g) - 0.5) * scale).to(dtype).requires_grad_()
          for i in range(len(widths) - 1)] if bias else None
    if x is None:
        x = torch.randn(rows, widths[0], generator=g).to(dtype)
    x = x.detach().requires_grad_()
    gy = torch.randn(rows, widths[-1], generator=g).to(dtype)
    y = fm.fused_mlp(x, ws, bs, act, output_activation=out_act, backend="sycl")
    grads = torch.autograd.grad(y, [x, *ws, *(bs or [])], gy)
    _assert_float64(x, ws, bs if bias else None, act, out_act, gy, y, grads, dtype)
    return y


@needs_sycl_cpu
def test_esimd_column_major_x_and_padded_hidden_gather():
    """The host's fallbacks: a column-major x (column stride = rows: per-lane gathers
    with 64-bit offsets) and a hidden width of 24 (z columns not whole tiles: z and dL/dz
    by gathers and scatters), against float64."""
    rows = 45
    x = torch.randn(40, rows).to(torch.bfloat16).t()
    assert x.stride() == (1, rows)
    _check_against_float64((40, 24, 24, 33), "relu", "none", True, rows, torch.bfloat16, x=x)


@needs_sycl_cpu
@pytest.mark.parametrize("widths,act,rows,chunks", [
    ((16, 64, 64, 32), "gelu", 515, 3),   # x rows of 32 B: x gathered, z and dz by blocks
    ((64, 64, 64, 64), "relu", 77, 2),    # every surface by blocks, a chunk of 64 + 13 rows
    ((64, 32, 64), "silu", 1, 1),         # one row; two layers, no hidden loop
])
def test_esimd_weight_gradients_over_chunks(monkeypatch, widths, act, rows, chunks):
    """The weight-gradient launch split into row chunks (every layer's partials, one sum
    on the device), the I/O modes the emulated nets above leave out, against float64."""
    monkeypatch.setattr(esimd, "wgrad_chunks",
                        lambda n, tiles, device: min(chunks, -(-n // esimd.WGRAD_ROWS)))
    _check_against_float64(widths, act, "none", True, rows, torch.bfloat16)


@needs_sycl_cpu
def test_esimd_fp16_subnormals_survive():
    """Inputs, weights and biases scaled so most activations are fp16 subnormals (< 2^-14): a
    flushing float mode would give zeros; the kernels (fp_control denorm_hf_allow on the
    GPU, the emulation here) match float64."""
    g = torch.Generator().manual_seed(17)
    widths = (32, 32, 32, 32)
    ws = [((torch.rand(widths[i + 1], widths[i], generator=g) - 0.5) / 8).half()
          for i in range(3)]
    bs = [((torch.rand(widths[i + 1], generator=g) - 0.5) * 2.0 ** -15).half() for i in range(3)]
    # layer 1 maps x ~ 2^-16 into the subnormal range; layers 2 and 3 keep it there
    x = ((torch.rand(33, 32, generator=g) - 0.5) * 2.0 ** -14).half()
    y = fm.fused_mlp(x, ws, bs, "none", backend="sycl")
    d = torch.float64
    ref = fm.fused_mlp(x.to(d), [w.to(d) for w in ws], [b.to(d) for b in bs], "none",
                       backend="reference")
    assert (y.abs() < 2.0 ** -14).float().mean() > 0.9 and (y != 0).float().mean() > 0.9
    # fp16 subnormals carry fewer bits: the bound is the absolute step 2^-24 per rounding
    assert (y.double() - ref).abs().max() < 8 * 2.0 ** -24


@needs_sycl_cpu
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_esimd_matches_eager_in_the_operand_dtype(act):
    """Against eager PyTorch in bfloat16 (not float64): relu rounds once from fp32, gelu
    on the rounded z, both as eager does; the difference is the accumulation order only."""
    g = torch.Generator().manual_seed(3)
    widths = (64, 64, 64, 64)
    ws = [(torch.randn(widths[i + 1], widths[i], generator=g) / 8).bfloat16() for i in range(3)]
    bs = [torch.randn(widths[i + 1], generator=g).bfloat16() for i in range(3)]
    x = torch.randn(77, 64, generator=g).bfloat16()
    y = fm.fused_mlp(x, ws, bs, act, backend="sycl")
    h = x
    for i, (w, b) in enumerate(zip(ws, bs)):
        h = torch.nn.functional.linear(h, w, b)
        if i < 2:
            h = torch.relu(h) if act == "relu" else torch.nn.functional.gelu(h)
    assert rel_error(y, h.double()) < TOLERANCE[torch.bfloat16] / 4


@pytest.mark.parametrize("dtype", HALF)
def test_relu_and_none_round_once_exactly(dtype):
    """The epilogue's claim: for none and relu, round(act(round(z))) == round(act(z)), so
    one conversion from fp32 gives eager's result bit for bit; leaky_relu does not."""
    z = torch.randn(1 << 16, generator=torch.Generator().manual_seed(9)) * 10
    z[:5] = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")])
    def bits(t):
        return t.view(torch.int16)

    assert torch.equal(bits(torch.relu(z).to(dtype)), bits(torch.relu(z.to(dtype))))
    assert torch.equal(bits(z.to(dtype)), bits(z.to(dtype)))
    leaky = torch.nn.functional.leaky_relu
    assert not torch.equal(bits(leaky(z).to(dtype)), bits(leaky(z.to(dtype).float()).to(dtype)))


@pytest.mark.parametrize("surface,ok", [
    ((64 * 7, 64, 1, 64), True),          # contiguous rows of 128 B
    ((64 * 7, 96, 1, 64), True),          # a wider pitch, a multiple of 16 B
    ((64 * 7, 64, 1, 16), False),         # a row of 32 B: under the 64-B minimum
    ((64 * 7, 3, 1, 3), False),           # 3-D coordinates
    ((64 * 7 + 2, 64, 1, 64), False),     # base not 64-B aligned
    ((64 * 7, 68, 1, 64), False),         # pitch 136 B: not a multiple of 16
    ((64 * 7, 1, 4096, 64), False),       # column-major
])
def test_block_surface_rules(surface, ok):
    assert esimd.block_surface(*surface, 2) is ok


def test_io_mode_per_surface():
    x, y = (64 * 3, 64, 1, 64), (64 * 5, 64, 1, 64)
    full = esimd.IO_X | esimd.IO_Y | esimd.IO_Z
    assert esimd.io_mode(x, y, [(64 * 9, 256)], 64, 2) == full
    assert esimd.io_mode((64, 3, 1, 3), y, [(64 * 9, 256)], 64, 2) == esimd.IO_Y | esimd.IO_Z
    assert esimd.io_mode(x, None, [], 64, 2) == full                 # no y, no z: blocks
    assert esimd.io_mode(x, y, [(64 * 9, 72)], 24, 2) == esimd.IO_X | esimd.IO_Y  # z padded
    assert esimd.standard_io(16, 64) == esimd.IO_Y | esimd.IO_Z


@needs_sycl_cpu
def test_gpu_build_passes_the_front_end():
    """The GPU build's source (grf_size<256> and fp_control with fp16 subnormals kept)
    through the SYCL front end: the CPU device drops such images, so the PVC listing never
    shows them; this at least compiles the properties."""
    cfg = esimd.EsimdConfig(torch.float16, 64, 64, 64)
    src = esimd.source([cfg], ("fwd",))
    assert b"denorm_hf_allow" in src
    sycl.shim().build(sycl.cpu_queue().addressof_ref(), src, [], includes=esimd.includes(),
                      options=esimd.build_options(False))


def test_col_offsets_are_64_bit(tmp_path):
    """The gather fallback's offset arithmetic alone, as host C++: column 63 of a
    column-major x with 2^26 rows (63 columns x 2^27 bytes: past 2^32) keeps its high bits."""
    try:
        tc = sycl._toolchain()
    except sycl.SyclToolchainError as e:
        pytest.skip(str(e))
    src = tmp_path / "offsets.cpp"
    src.write_text('#define FMLP_ESIMD_EMULATE\n#include "fused_mlp_esimd.cpp"\n#include <cstdio>\n'
                   "int main() {\n"
                   "  auto o = fmlp_esimd::col_offsets<sycl::half>(48, int64_t(1) << 26);\n"
                   "  for (int i = 0; i < 16; ++i) std::printf(\"%llu\\n\", (unsigned long long)o[i]);\n"
                   "}\n")
    exe = tmp_path / "offsets"
    kernels = esimd.KERNEL_DIR
    res = subprocess.run([tc["cxx"], "-std=c++17", "-O0", "-DSYCL_DISABLE_FSYCL_SYCLHPP_WARNING",
                          f"-I{kernels}", f"-I{tc['include']}", str(src), "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    got = [int(v) for v in subprocess.run([str(exe)], capture_output=True, text=True,
                                          check=True).stdout.split()]
    assert got == [(48 + i) * (1 << 26) * 2 for i in range(16)]
    assert got[-1] > 2 ** 32


@needs_sycl_cpu
def test_esimd_no_rows_and_no_grad_needed():
    w = [torch.randn(32, 16, dtype=torch.float16, requires_grad=True),
         torch.randn(8, 32, dtype=torch.float16, requires_grad=True)]
    x = torch.randn(0, 16, dtype=torch.float16, requires_grad=True)
    y = fm.fused_mlp(x, w, None, "tanh", backend="sycl")
    assert y.shape == (0, 8)
    gw = torch.autograd.grad(y.sum(), w)
    assert all(torch.equal(g, torch.zeros_like(g)) for g in gw)


# --- loading a configuration from SPIR-V -------------------------------------------------------
@needs_sycl_cpu
def test_spirv_dir_loads_a_configuration_instead_of_source(tmp_path, monkeypatch):
    """The SPIR-V the runtime compiler made for a configuration (SYCL_DUMP_IMAGES=1, in a
    fresh process) loads through $FUSEDMLP_SYCL_SPIRV_DIR and computes the same result."""
    code = ("import torch, fusedmlp_xpu as fm\n"
            "w = [torch.randn(32, 16, dtype=torch.float16), torch.randn(8, 32, dtype=torch.float16)]\n"
            "fm.fused_mlp(torch.randn(3, 16, dtype=torch.float16), w, None, 'gelu', backend='sycl')\n")
    env = dict(os.environ, SYCL_DUMP_IMAGES="1")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(tmp_path.glob("*.spv")), "the runtime wrote no SPIR-V"
    monkeypatch.setenv(esimd.SPIRV_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(esimd, "_bundles", {})
    built = []
    real_build = sycl._Shim.build

    def recording(self, queue, source, names, *, spirv=False, **kw):
        built.append(spirv)
        return real_build(self, queue, source, names, spirv=spirv, **kw)

    monkeypatch.setattr(sycl._Shim, "build", recording)
    g = torch.Generator().manual_seed(5)
    w = [torch.randn(32, 16, generator=g).half(), torch.randn(8, 32, generator=g).half()]
    x = torch.randn(45, 16, generator=g).half()
    y = fm.fused_mlp(x, w, None, "gelu", backend="sycl")
    ref = fm.fused_mlp(x.double(), [v.double() for v in w], None, "gelu", backend="reference")
    assert built == [True]
    assert rel_error(y, ref) < TOLERANCE[torch.float16]


def test_spirv_dir_without_the_kernels_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "other.spv").write_bytes(b"\x03\x02\x23\x07 nothing of ours")
    monkeypatch.setenv(esimd.SPIRV_DIR_ENV, str(tmp_path))
    with pytest.raises(RuntimeError, match="no SPIR-V module"):
        esimd._spirv_module(["fmlp_esimd_fwd_f16_16_16_16"])


# --- the Max 1550 roofline of the report -----------------------------------------------------
def test_pvc_floors_follow_the_protocol():
    pvc = importlib.import_module("fusedmlp_xpu.bench.pvc")
    assert abs(pvc.MATRIX_PEAK_TFLOPS - 838.9) < 0.1  # Intel's 839 at 1.6 GHz
    rows = {(r["config"], r["rows"]): r for r in pvc.rows()}
    w64 = rows[("narrow-w64", 2**22)]
    flops = 2**22 * 2 * 5 * 64 * 64
    assert w64["floor_ms"] == pytest.approx(flops / 273e12 * 1e3)
    assert w64["bound"] == "matrix" and w64["dpas_per_row"] == 10
    w32 = rows[("narrow-w32", 2**22)]
    assert w32["bound"] == "memory"
    assert w32["floor_ms"] == pytest.approx(2**22 * 256 / 3.28e12 * 1e3)
    # padding is counted: nerf-density's out 16 needs no padding, in 32 neither
    assert rows[("nerf-density", 2**20)]["useful_fraction"] == 1.0


def test_pvc_roofline_in_the_docs_is_the_committed_run():
    """docs/intel.md's table is what the pvc module makes from the committed ISA run."""
    import re
    from pathlib import Path

    pvc = importlib.import_module("fusedmlp_xpu.bench.pvc")
    page = (Path(__file__).resolve().parents[1] / "docs" / "intel.md").read_text()
    m = re.search(r"--run ([A-Za-z0-9._+-]+)`", page)
    assert m, "docs/intel.md names no run of benchmarks/results/pvc.jsonl"
    table = pvc.markdown(pvc.load_isa(run=m.group(1)))
    assert table in page
    isa = pvc.load_isa(run=m.group(1))
    assert len(isa["kernels"]) == len({n for c in esimd.all_configs() for n in c.names()})
    assert all(k["spill_bytes"] == 0 and k["dpas"] == k["dpas_expected"] for k in isa["kernels"])
