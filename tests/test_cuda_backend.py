"""The ``cuda`` backend (NVRTC-compiled kernels of kernels/cuda).

On the CPU: every kernel configuration compiles with NVRTC for sm_90a (ci/aot_cuda.py, no
spills), the disk cache, and the host code (configurations and their reasons, argument
packing, grid, the dispatcher's choice, the errors for training) with the device launch
stubbed. Skipped where cuda-python's NVRTC is not installed, unless
FUSEDMLP_REQUIRE_NVRTC=1 (CI) makes that a failure. On a GPU (marked ``gpu``): the forced
forward against the float64 reference for what the backend claims, outputs poisoned,
CUDA-graph capture, a launch from a new thread, and the clear errors for training."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu import dispatch
from fusedmlp_xpu.backends import cuda as cuda_backend
from fusedmlp_xpu.backends import cuda_build as cb
from fusedmlp_xpu.spec import MLPSpec

from conftest import (TOLERANCE, assert_close, make_params, on_its_own_thread, reference,
                      term_size)

ROOT = Path(__file__).resolve().parent.parent
SM90 = ((9, 0), 132, cb.SM90_SMEM)  # what device_info reports on an H200


def _nvrtc_or_skip():
    try:
        return cb.nvrtc_version()
    except cb.CudaToolchainError as e:
        if os.environ.get("FUSEDMLP_REQUIRE_NVRTC") == "1":
            pytest.fail(f"FUSEDMLP_REQUIRE_NVRTC=1 but {e}")
        pytest.skip(str(e))


@pytest.fixture
def nvrtc(tmp_path, monkeypatch):
    """NVRTC present; a private disk cache and an empty in-process memo."""
    _nvrtc_or_skip()
    monkeypatch.setenv("FUSEDMLP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cb, "_memo", {})
    return tmp_path


def _spec(widths, act="relu", out_act="none", bias=True, dtype=torch.float16):
    return MLPSpec(tuple(widths), act, out_act, bias, dtype)


# --- compiles (CPU) ------------------------------------------------------------------
def test_aot_compiles_every_configuration_without_spills(tmp_path):
    """ci/aot_cuda.py: every configuration the backend can produce for its table of nets
    compiles for sm_90a, within the spill budget; one line per kernel (the forward's, then
    the backward's)."""
    _nvrtc_or_skip()
    env = dict(os.environ, FUSEDMLP_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, str(ROOT / "ci" / "aot_cuda.py")], capture_output=True,
                       text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("fwd ")]
    # H 16/32/64/128 x fp16/bf16 x relu/none x bias, and the odd widths and activations
    assert len(lines) >= 40, r.stdout
    assert all(" 0 B spill" in ln for ln in lines), r.stdout
    # the sm_90a backward: its nets, every set of gradients, within its spill budget
    back = [ln for ln in r.stdout.splitlines() if ln.startswith("bwd ")]
    assert len(back) >= 60 and not any("OVER" in ln or "SERIAL" in ln for ln in back), r.stdout


def test_compile_reports_registers_and_uses_the_disk_cache(nvrtc, monkeypatch):
    cfg, _ = cb.forward_config(_spec((64, 64, 64, 64)))
    first = cb.compile_forward(cfg, "sm_90a")
    assert not first.cached and first.cubin[:4] == b"\x7fELF"
    stats = cb.ptxas_stats(first.log)
    assert 0 < stats["registers"] <= 255 and stats["spill_stores"] == 0, first.log
    assert list(nvrtc.glob("cuda/fused_mlp_forward-*.cubin"))
    # a new process (empty memo) reads the cubin back without NVRTC
    monkeypatch.setattr(cb, "_memo", {})
    monkeypatch.setattr(cb, "_nvrtc", lambda *a: pytest.fail("compiled again"))
    again = cb.compile_forward(cfg, "sm_90a")
    assert again.cached and again.cubin == first.cubin and again.key == first.key


def test_a_first_build_says_what_it_compiled(nvrtc, monkeypatch, capsys):
    """A kernel NVRTC compiles (not read from the disk cache) is named on stderr once a
    process, as Triton's first launches are (notes.note_compile)."""
    from fusedmlp_xpu.backends import notes

    monkeypatch.setattr(notes, "_told", [])
    monkeypatch.setattr(notes.LOG, "hasHandlers", lambda: False)  # pytest adds handlers
    monkeypatch.delenv(notes.QUIET_ENV, raising=False)
    cfg, _ = cb.forward_config(_spec((16, 16, 8)), family="wgmma")
    assert not cuda_backend.build(cfg, cb.compile_forward, "sm_90a").cached
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compiled fmlp_forward_sm90 (16->16x1->8" in err
    monkeypatch.setattr(cb, "_memo", {})
    monkeypatch.setattr(notes, "_told", [])
    assert cuda_backend.build(cfg, cb.compile_forward, "sm_90a").cached  # the disk cache
    assert capsys.readouterr().err == ""


def test_cache_key_changes_with_source_options_and_version():
    base = cb.cache_key(b"src", {"h": b"x"}, ["-DA=1"], (13, 0))
    assert base == cb.cache_key(b"src", {"h": b"x"}, ["-DA=1"], (13, 0))
    assert len({base, cb.cache_key(b"src2", {"h": b"x"}, ["-DA=1"], (13, 0)),
                cb.cache_key(b"src", {"h": b"y"}, ["-DA=1"], (13, 0)),
                cb.cache_key(b"src", {"h": b"x"}, ["-DA=2"], (13, 0)),
                cb.cache_key(b"src", {"h": b"x"}, ["-DA=1"], (13, 1))}) == 5


def test_changed_source_compiles_anew(nvrtc, monkeypatch, tmp_path):
    cfg, _ = cb.forward_config(_spec((32, 32, 32)))
    first = cb.compile_forward(cfg, "sm_90a")
    edited = tmp_path / "fused_mlp_forward.cu"
    edited.write_text(cb.FORWARD_SOURCE.read_text() + "\n// an edit\n")
    monkeypatch.setattr(cb, "FORWARD_SOURCE", edited)
    second = cb.compile_forward(cfg, "sm_90a")
    assert second.key != first.key and not second.cached


def test_host_and_kernel_agree_on_shared_memory(nvrtc):
    """The kernel static_asserts the host's count (FMLP_SMEM_BYTES): a wrong one fails."""
    cfg, _ = cb.forward_config(_spec((17, 33, 33, 9)))
    defines = dict(cfg.defines(), FMLP_SMEM_BYTES=cfg.smem_bytes() + 16)
    with pytest.raises(cb.CudaToolchainError, match="disagree on shared memory"):
        cb.compile_cubin(cb.FORWARD_SOURCE, defines, "sm_90a")


def test_ptxas_stats_parses_the_log():
    log = ("ptxas info    : Compiling entry function 'fmlp_forward' for 'sm_90a'\n"
           "ptxas         .     24 bytes stack frame, 20 bytes spill stores, 32 bytes spill "
           "loads\nptxas info    : Used 128 registers, used 1 barriers, 1024 bytes smem\n")
    assert cb.ptxas_stats(log) == {"registers": 128, "spill_stores": 20, "spill_loads": 32,
                                   "stack": 24, "static_smem": 1024}


# --- configurations (CPU) ------------------------------------------------------------
@pytest.mark.parametrize("spec, why", [
    (_spec((64, 64, 64), dtype=torch.float32), "float16, bfloat16"),
    (_spec((64, 64)), "n_layers >= 2"),
    (_spec((64, 64, 32, 64)), "one hidden width"),
    (_spec((64, 256, 64)), "limit 128"),
    (_spec((16,) * 40), "limit 32"),
], ids=["fp32", "one-layer", "unequal-hidden", "wide", "deep"])
def test_unsupported_specs_say_why(spec, why):
    cfg, reason = cb.forward_config(spec)
    assert cfg is None and why in reason


def test_padding_and_shared_memory():
    """Widths pad to 16, weight rows 16 bytes longer; fp32 biases; two buffers a warp."""
    cfg, _ = cb.forward_config(_spec((17, 33, 33, 9), bias=True))
    in_p, h_p, out_p = 32, 48, 16
    weights = h_p * (in_p + 8) + (1 * h_p + out_p) * (h_p + 8)
    biases = 2 * h_p + out_p
    buffers = 2 * cfg.warps * cfg.rows_per_warp * (max(in_p, out_p) + 8)
    assert cfg.smem_bytes() == 2 * weights + 4 * biases + 2 * buffers
    assert cfg.defines()["FMLP_L_HID"] == 1 and cfg.defines()["FMLP_SMEM_BYTES"] == \
        cfg.smem_bytes()


def test_tuning_rule():
    assert cb.tuning(_spec((64,) + (16,) * 5 + (64,))) == (2, 16)
    assert cb.tuning(_spec((64,) + (32,) * 5 + (64,))) == (2, 16)
    assert cb.tuning(_spec((64,) + (64,) * 5 + (64,))) == (1, 16)
    assert cb.tuning(_spec((64,) + (128,) * 5 + (64,))) == (1, 8)
    assert cb.tuning(_spec((16, 16, 16))) == (4, 16)


def test_smaller_shared_memory_takes_fewer_warps_then_says_why():
    spec = _spec((64,) + (64,) * 5 + (64,))
    full, _ = cb.forward_config(spec)
    small, _ = cb.forward_config(spec, 99 * 1024)  # sm_86/89/120
    assert small.warps < full.warps and small.smem_bytes() <= 99 * 1024
    deep = _spec((128,) * 8)
    cfg, why = cb.forward_config(deep)
    assert cfg is None and "shared memory" in why and "227 KB" in why


def test_wgmma_family_configuration():
    """The wgmma forward on Hopper only; whole warpgroups of 16-row warps (4 up to width
    64, 3 above, fewer where shared memory is short); weights unpadded in shared memory."""
    assert cb.family_for((9, 0)) == "wgmma"
    assert [cb.family_for(c) for c in ((8, 0), (8, 9), (10, 0), (12, 0))] == ["mma"] * 4
    w64, w128 = _spec((64,) + (64,) * 5 + (64,)), _spec((64,) + (128,) * 5 + (64,))
    cfg, _ = cb.forward_config(w64, family="wgmma")
    assert (cfg.family, cfg.mt, cfg.warps, cfg.kernel) == ("wgmma", 1, 16, "fmlp_forward_sm90")
    assert cfg.source.name == "fused_mlp_forward_sm90.cu"
    assert cb.forward_config(w128, family="wgmma")[0].warps == 12
    mma, _ = cb.forward_config(w64)
    assert mma.family == "mma" and cfg.smem_bytes() < mma.smem_bytes()
    small, _ = cb.forward_config(w64, 99 * 1024, "wgmma")
    assert small.warps == 8 and small.smem_bytes() <= 99 * 1024
    for bad in (dict(mt=2, warps=8), dict(mt=1, warps=6)):
        with pytest.raises(ValueError, match="whole warpgroups"):
            cb.ForwardConfig(**{**cfg.__dict__, **bad})
    with pytest.raises(ValueError, match="family"):
        cb.ForwardConfig(**{**cfg.__dict__, "family": "wmma"})
    with pytest.raises(cb.CudaToolchainError, match="sm_90a"):
        cb.compile_forward(cfg, "sm_89")


# --- host side of a launch (CPU, launch stubbed) -------------------------------------
class _FakeKernel:
    threads, smem, max_ctas = 512, 1 << 17, 132


@pytest.fixture
def stubbed(monkeypatch):
    """The backend's forward on CPU tensors with an H200's properties and the driver
    stubbed: what would be launched is recorded, nothing runs."""
    launches = []
    monkeypatch.setattr(cuda_backend, "device_info", lambda device: SM90)
    monkeypatch.setattr(cuda_backend, "forward_kernel", lambda device, cfg: _FakeKernel())
    monkeypatch.setattr(cuda_backend, "launch",
                        lambda kernel, grid, params, device: launches.append((grid, params)))
    return launches


def test_forward_packs_pointers_strides_and_grid(stubbed):
    ws, bs = make_params((24, 64, 64, 40), True, torch.float16, "cpu")
    x = torch.randn(1037, 24).half()
    spec = _spec((24, 64, 64, 40))
    y, saved = cuda_backend.CudaBackend().forward(x, ws, bs, spec, False)
    assert saved is None and y.shape == (1037, 40) and y.is_contiguous()
    (grid, p), = stubbed
    cfg, _ = cb.forward_config(spec)
    assert grid == cuda_backend.grid_size(1037, cfg, _FakeKernel.max_ctas)
    assert (p.x, p.y, p.n_rows, p.ld_x, p.ld_y) == (x.data_ptr(), y.data_ptr(), 1037, 24, 40)
    assert [p.w[i] for i in range(3)] == [w.data_ptr() for w in ws]
    assert [p.b[i] for i in range(3)] == [b.data_ptr() for b in bs]
    assert p.w[3] is None and p.b[3] is None


def test_forward_copies_only_what_the_kernel_cannot_read(stubbed):
    """x with a column stride or misaligned rows, transposed weights and strided biases
    are copied to contiguous, 16-byte aligned tensors; the rest is read in place."""
    ws, bs = make_params((32, 32, 16), True, torch.float16, "cpu")
    wide = torch.randn(50, 64).half()
    strided = wide[:, ::2]  # column stride 2
    ws_t = [w.t().contiguous().t() for w in ws]
    bs_s = [torch.stack([b, b], 1)[:, 0] for b in bs]
    cuda_backend.CudaBackend().forward(strided, ws_t, bs_s, _spec((32, 32, 16)), False)
    (_, p), = stubbed
    assert p.x != strided.data_ptr() and p.ld_x == 32 and p.x % 16 == 0
    assert all(p.w[i] % 16 == 0 and p.w[i] != ws_t[i].data_ptr() for i in range(2))
    # rows of a slice at an odd offset: 16-byte alignment lost, copied
    x_off = torch.randn(50 * 32 + 1).half()[1:].view(50, 32)
    assert cuda_backend.kernel_input(x_off, 32).data_ptr() % 16 == 0
    # in_features 17 (the element-wise path): any row stride, read in place
    x17 = torch.randn(50, 20).half()[:, :17]
    assert cuda_backend.kernel_input(x17, 17) is x17


def test_no_rows_launches_nothing(stubbed):
    ws, bs = make_params((16, 16, 8), False, torch.float16, "cpu")
    y, _ = cuda_backend.CudaBackend().forward(torch.empty(0, 16).half(), ws, bs,
                                              _spec((16, 16, 8), bias=False), False)
    assert y.shape == (0, 8) and not stubbed


class _FakeLibcuda:
    """The three driver entry points a launch calls, recording their arguments."""

    def __init__(self, current):
        self.current, self.calls = current, []

    def cuCtxGetCurrent(self, out):
        out._obj.value = self.current
        return 0

    def cuCtxSetCurrent(self, ctx):
        self.calls.append(("set", ctx))
        self.current = ctx
        return 0

    def cuLaunchKernel(self, *args):
        self.calls.append(("launch", args))
        return self.result

    result = 0


def test_launch_passes_the_driver_what_it_needs(monkeypatch):
    """The ctypes launch: the function handle, grid, block, shared memory, torch's current
    stream and a pointer to the one argument; the primary context made current only
    where it is not; a driver error raised with its code."""
    lib = _FakeLibcuda(current=None)  # a new thread: no current context
    monkeypatch.setattr(cuda_backend, "_libcuda", lambda: lib)
    monkeypatch.setitem(cuda_backend._contexts.primary, 0, 0xC0)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda index: types.SimpleNamespace(cuda_stream=0x5))
    kernel = types.SimpleNamespace(handle=0xF00, threads=512, smem=1 << 17)
    p = cb.ForwardParams()
    p.n_rows = 1037
    cuda_backend.launch(kernel, 7, p, torch.device("cuda", 0))
    (what, ctx), (kind, args) = lib.calls
    assert (what, ctx) == ("set", 0xC0) and kind == "launch"
    assert args[:9] == (0xF00, 7, 1, 1, 512, 1, 1, 1 << 17, 0x5) and args[10] is None
    arg0 = ctypes.cast(args[9], ctypes.POINTER(ctypes.c_void_p))[0]
    assert arg0 == ctypes.addressof(p)
    cuda_backend.launch(kernel, 1, p, torch.device("cuda", 0))
    assert [c[0] for c in lib.calls] == ["set", "launch", "launch"]  # already current
    lib.result = 1
    with pytest.raises(RuntimeError, match="cuLaunchKernel failed: CUresult 1"):
        cuda_backend.launch(kernel, 1, p, torch.device("cuda", 0))


@pytest.mark.parametrize("rows, want", [(1, 1), (256, 1), (257, 2), (1 << 22, 132)])
def test_grid_size(rows, want):
    """narrow-w64: 16 rows a warp, 16 warps, so 256 rows a CTA; at most 132 CTAs."""
    cfg, _ = cb.forward_config(_spec((64,) + (64,) * 5 + (64,)))
    assert cfg.rows_per_warp * cfg.warps == 256
    assert cuda_backend.grid_size(rows, cfg, 132) == want


def test_grid_covers_every_row_block():
    cfg, _ = cb.forward_config(_spec((64,) + (64,) * 5 + (64,)))
    for rows in (1, 255, 256, 257, 5000, 1 << 20):
        g = cuda_backend.grid_size(rows, cfg, 132)
        blocks = -(-rows // cfg.rows_per_warp)
        assert 1 <= g <= 132 and (g == 132 or g * cfg.warps >= blocks)


def test_training_raises_clearly(stubbed, monkeypatch):
    monkeypatch.delenv(cuda_backend.BACKWARD_ENV, raising=False)
    be = cuda_backend.CudaBackend()
    ws, bs = make_params((16, 64, 8), True, torch.float16, "cpu")
    x = torch.randn(4, 16).half()
    spec = _spec((16, 64, 8))
    # the backward always recomputes: a saving forward (recompute=False) is refused
    with pytest.raises(NotImplementedError, match="recompute=False is not supported"):
        be.forward(x, ws, bs, spec, True)
    assert not be.saves and be.recomputes(spec, torch.device("cuda"))
    # off unless FUSEDMLP_CUDA_BACKWARD=1 (not yet sanitized or timed on a GPU)
    with pytest.raises(NotImplementedError, match="inference only .* FUSEDMLP_CUDA_BACKWARD=1"):
        be.backward(torch.randn(4, 8).half(), x, ws, bs, None, spec, (True, True, True))
    ok, why = be.train_support(spec, torch.device("cuda", 0))
    assert not ok and "not yet sanitized or timed" in why


# --- the dispatcher's view (CPU, device properties stubbed) ---------------------------
@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(cuda_backend, "device_info", lambda device: SM90)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(dispatch, "_decisions", {})
    monkeypatch.setitem(dispatch._availability, "cuda", (True, "stubbed"))
    monkeypatch.delenv(cuda_backend.BACKWARD_ENV, raising=False)
    return torch.device("cuda", 0)


def test_chosen_unforced_only_where_measured(h200, monkeypatch):
    # biases were not timed: not taken
    spec = _spec((64,) + (64,) * 5 + (64,))
    ex = dispatch.explain_choice(h200, spec, None)
    c = next(c for c in ex.considered if c.name == "cuda")
    assert not c.taken and "not measured faster than triton on sm_90 for this spec" in c.reason
    assert ex.backend != "cuda"
    # an entry covers the specs of its hidden width, dtype, activations and bias only
    w64 = _spec((32, 64, 16), bias=False, dtype=torch.bfloat16)
    monkeypatch.setitem(cuda_backend.MEASURED_WINS, cuda_backend.win_key((9, 0), w64), "w.json")
    for measured in (w64, _spec((64,) * 12, bias=False, dtype=torch.bfloat16)):
        assert dispatch.explain_choice(h200, measured, None).backend == "cuda"
    for other in (_spec((64, 128, 64), bias=False, dtype=torch.bfloat16),
                  _spec((64, 64, 64), bias=False), _spec((64, 64, 64), dtype=torch.bfloat16),
                  _spec((64, 64, 64), "gelu", bias=False, dtype=torch.bfloat16)):
        assert dispatch.explain_choice(h200, other, None).backend != "cuda"
    # a measured inference win is taken for inference; training calls take triton
    monkeypatch.setitem(cuda_backend.MEASURED_WINS, cuda_backend.win_key((9, 0), spec), "x.json")
    ex = dispatch.explain_choice(h200, spec, None)
    c = next(c for c in ex.considered if c.name == "cuda")
    assert ex.backend == "cuda" and c.taken and "measured faster" in c.reason
    ex = dispatch.explain_choice(h200, spec, None, train=True)
    c = next(c for c in ex.considered if c.name == "cuda")
    assert not c.taken and "inference only" in c.reason and ex.backend != "cuda"
    assert "for training" in str(ex)


def test_forced_takes_it_or_names_why_not(h200):
    spec = _spec((64,) + (64,) * 5 + (64,))
    ex = dispatch.explain_choice(h200, spec, "cuda")
    assert ex.backend == "cuda" and "fully-fused wgmma forward" in ex.considered[0].reason
    with pytest.raises(dispatch.BackendUnavailableError,
                       match="backend 'cuda' cannot run this input: cuda: dtype torch.float32"):
        dispatch.choose(h200, _spec((64, 64, 64), dtype=torch.float32), "cuda")
    with pytest.raises(dispatch.BackendUnavailableError, match="limit 128"):
        dispatch.choose(h200, _spec((64, 256, 64)), "cuda")
    with pytest.raises(dispatch.BackendUnavailableError,
                       match="'cuda' cannot run this input: cuda: inference only"):
        dispatch.choose(h200, spec, "cuda", train=True)


def test_old_gpu_is_not_supported(monkeypatch):
    monkeypatch.setattr(cuda_backend, "device_info", lambda device: ((7, 5), 40, 64 * 1024))
    ok, why = cuda_backend.CudaBackend().supports(_spec((16, 16, 16)), torch.device("cuda"))
    assert not ok and "compute capability 8.0" in why


def test_unavailable_names_the_install(monkeypatch):
    def missing():
        raise cb.CudaToolchainError(cb._MISSING)

    monkeypatch.setattr(cb, "nvrtc_version", missing)
    ok, why = cuda_backend.CudaBackend().available()
    assert not ok and "pip install 'fusedmlp-xpu[cuda]'" in why


# --- on the GPU ----------------------------------------------------------------------
def _gpu_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    ok, why = dispatch.availability("cuda")
    if not ok:
        pytest.skip(why)
    if torch.cuda.get_device_capability() < cb.MIN_CAPABILITY:
        pytest.skip("needs compute capability 8.0")
    return torch.device("cuda")


def _check_forward(widths, dtype, act="relu", out_act="none", bias=True, rows=1037,
                   x=None):
    dev = _gpu_or_skip()
    ws, bs = make_params(widths, bias, dtype, dev)
    if x is None:
        x = torch.randn(rows, widths[0], device=dev).to(dtype)
    with torch.no_grad():
        y = fm.fused_mlp(x, ws, bs, act, out_act, backend="cuda")
    # a few rows of a shallow net can cancel to near zero by chance: there the output's
    # rounding scales with the terms it sums (conftest.term_size; through deep nets that
    # bound grows far past the output, so it is left out there)
    floor = 1e-3 * term_size(x, ws, bs) if len(widths) <= 4 else 0.0
    assert_close(y, reference(x, ws, bs, act, out_act), TOLERANCE[dtype], floor=floor)
    return y


DTYPES = [torch.float16, torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("hidden", [16, 32, 64, 128])
@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("acts", [("relu", "none"), ("none", "none")], ids=["relu", "none"])
def test_forward_widths(dtype, hidden, depth, bias, acts):
    _check_forward((64,) + (hidden,) * depth + (64,), dtype, *acts, bias=bias)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("act", sorted(fm.activations.ACTIVATIONS))
def test_forward_activations(dtype, act):
    names = sorted(fm.activations.ACTIVATIONS)
    out_act = names[(names.index(act) + 3) % len(names)]
    _check_forward((32, 64, 64, 16), dtype, act, out_act)


@pytest.mark.gpu
@pytest.mark.parametrize("widths", [(3, 16, 5), (17, 33, 33, 9), (1, 64, 1), (100, 128, 128, 3),
                                    (128, 16, 16, 100), (24, 64, 64, 40), (128, 128, 128, 128),
                                    (8, 32, 32, 8), (16, 64, 64, 16), (8, 128, 128, 8),
                                    (64,) + (64,) * 11 + (64,)], ids=str)
@pytest.mark.parametrize("rows", [1, 7, 1037])
def test_forward_odd_widths(widths, rows):
    _check_forward(widths, torch.float16, "tanh", "none", rows=rows)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 31, 33, 255, 257, 1 << 20, (1 << 20) + 37])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_forward_rows(rows, dtype):
    """Ragged last row blocks, fewer rows than warps, more row blocks than the grid."""
    _check_forward((64,) + (64,) * 4 + (64,), dtype, rows=rows)


@pytest.mark.gpu
def test_forward_2_pow_22_rows():
    y = _check_forward((64,) + (64,) * 4 + (64,), torch.float16, rows=1 << 22)
    assert y.shape == (1 << 22, 64)


@pytest.mark.gpu
def test_strided_and_leading_dims():
    dev = _gpu_or_skip()
    wide = torch.randn(1037, 128, device=dev).half()
    _check_forward((64, 32, 32, 16), torch.float16, x=wide[:, ::2])
    _check_forward((64, 32, 32, 16), torch.float16, x=wide[:, 3:67])  # misaligned rows
    ws, bs = make_params((64, 32, 32, 16), True, torch.float16, dev)
    x = torch.randn(3, 5, 7, 64, device=dev).half()
    with torch.no_grad():
        y = fm.fused_mlp(x, ws, bs, backend="cuda")
    assert y.shape == (3, 5, 7, 16)
    assert_close(y, reference(x, ws, bs, "relu", "none"), TOLERANCE[torch.float16])


@pytest.mark.gpu
def test_cuda_graph_capture():
    """A forward captured in a CUDA graph and replayed on new data in the same input."""
    dev = _gpu_or_skip()
    ws, bs = make_params((64, 64, 64, 64, 64), True, torch.float16, dev)
    static_x = torch.randn(4099, 64, device=dev).half()
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fm.fused_mlp(static_x, ws, bs, backend="cuda")  # compile, load: before capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_y = fm.fused_mlp(static_x, ws, bs, backend="cuda")
        for _ in range(2):
            static_x.copy_(torch.randn_like(static_x))
            g.replay()
            torch.cuda.synchronize()
            assert_close(static_y, reference(static_x, ws, bs, "relu", "none"),
                         TOLERANCE[torch.float16])


@pytest.mark.gpu
def test_launch_from_a_new_thread():
    """A thread whose first CUDA work this is (no current context yet) launches too."""
    dev = _gpu_or_skip()
    ws, bs = make_params((32, 32, 32, 8), True, torch.float16, dev)
    x = torch.randn(300, 32, device=dev).half()

    def body():
        with torch.no_grad():
            y = fm.fused_mlp(x, ws, bs, backend="cuda")
        torch.cuda.synchronize()
        return y

    y = on_its_own_thread(body)
    assert_close(y, reference(x, ws, bs, "relu", "none"), TOLERANCE[torch.float16])


@pytest.mark.gpu
@pytest.mark.parametrize("recompute", [None, False, True])
def test_forced_training_fails_clearly(recompute, monkeypatch):
    dev = _gpu_or_skip()
    ws, bs = make_params((32, 32, 32, 8), True, torch.float16, dev, requires_grad=True)
    x = torch.randn(64, 32, device=dev).half()
    # the dispatcher refuses it before any kernel runs (train_support: the backward is off)
    monkeypatch.delenv(cuda_backend.BACKWARD_ENV, raising=False)
    with pytest.raises(fm.BackendUnavailableError, match="cuda: inference only"):
        fm.fused_mlp(x, ws, bs, backend="cuda", recompute=recompute).sum().backward()


@pytest.mark.gpu
def test_dispatched_unforced_only_where_measured():
    dev = _gpu_or_skip()
    x = torch.empty(1, 64, device=dev, dtype=torch.float16)
    cap = torch.cuda.get_device_capability(dev)
    for hidden in (64, 128):
        m = fm.FusedMLP(64, 64, hidden, 4, bias=False, device=dev, dtype=torch.float16)
        ex = fm.explain(m, x)
        measured = cuda_backend.win_key(cap, m.spec(x.dtype)) in cuda_backend.MEASURED_WINS
        assert (ex.backend == "cuda") == (measured and cuda_backend.CudaBackend().available()[0])
        if ex.backend != "cuda":
            assert "not measured faster than triton" in next(
                c.reason for c in ex.considered if c.name == "cuda")


def test_bench_times_named_backends_side_by_side():
    """fusedmlp bench --backends triton cuda: each named backend forced on a copy of the
    same module; one that cannot run the config is left out, saying why."""
    from fusedmlp_xpu.bench import narrow as bench

    fused = bench.CONFIGS["narrow-w64"].make(torch.device("cpu"), torch.float32)
    logged = []
    models = bench._fused_models(fused, ["reference", "cuda"], torch.randn(2, 64),
                                 logged.append, False)
    assert list(models) == ["reference"] and models["reference"].backend == "reference"
    assert models["reference"].linears[0].weight is not fused.linears[0].weight
    assert torch.equal(models["reference"].linears[0].weight, fused.linears[0].weight)
    assert logged and "cuda: cannot run this config" in logged[0]
    assert list(bench._fused_models(fused, None, torch.randn(2, 64), logged.append,
                                    True)) == ["reference"]
