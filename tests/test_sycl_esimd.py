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
    ((64,) + (128,) * 5 + (64,), torch.float16, "over the 128 KiB of shared local memory"),
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
    # 2 row groups x (first 4x4 + hidden 4x4 + last 4x4)
    assert w64.dpas("fwd") == w64.dpas("bwd") == 2 * 48
    w128 = esimd.EsimdConfig(torch.bfloat16, 64, 128, 16)
    assert w128.dpas("fwd") == 1 * (4 * 8 + 8 * 8 + 8 * 1)
    assert w64.dpas("wgrad") == esimd.WGRAD_MR * esimd.WGRAD_NR
    assert len(esimd.all_configs()) == 2 * 4 ** 3


def test_build_options_ask_for_large_grf_on_the_gpu_only():
    assert "-DFMLP_ESIMD_LARGE_GRF" in esimd.build_options(emulate=False)
    assert esimd.build_options(emulate=True) == ["-DFMLP_ESIMD_EMULATE"]


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


@needs_sycl_cpu
@pytest.mark.parametrize("dtype", HALF, ids=["f16", "bf16"])
@pytest.mark.parametrize("widths,act,out_act,bias,rows", CASES,
                         ids=[f"{c[1]}-{c[2]}-h{c[0][1]}" for c in CASES])
def test_esimd_emulated_matches_float64(widths, act, out_act, bias, rows, dtype):
    spec = fm.MLPSpec(widths, act, out_act, bias, dtype)
    assert "ESIMD" in sycl.SyclBackend().supports(spec, torch.device("cpu"))[1]
    (x, ws, bs, gy), y, grads = _run(widths, act, out_act, bias, rows, dtype, "sycl")
    d = torch.float64
    xr = x.detach().to(d).requires_grad_()
    wr = [w.detach().to(d).requires_grad_() for w in ws]
    br = [b.detach().to(d).requires_grad_() for b in bs] if bias else None
    yr = fm.fused_mlp(xr, wr, br, act, output_activation=out_act, backend="reference")
    refs = torch.autograd.grad(yr, [xr, *wr, *(br or [])], gy.to(d))
    tol = TOLERANCE[dtype]
    assert rel_error(y, yr) < tol
    floors = gradient_floors(x, ws, bs, act, out_act, gy)
    for i, (got, ref, floor) in enumerate(zip(grads, refs, floors)):
        # half-precision gradients of a deep net: eager's own error is the yardstick
        assert rel_error(got, ref, floor) < 4 * tol, f"gradient {i}"


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
    assert len(isa["kernels"]) == len(esimd.all_configs()) * 2 + len(esimd.HALF)
    assert all(k["spill_bytes"] == 0 and k["dpas"] == k["dpas_expected"] for k in isa["kernels"])
