"""The cuda backend's backward (kernels/cuda/fused_mlp_backward_sm90.cu): its configuration
rules, the host's reading of the kernel's
partials (the wgmma accumulator layout, emulated per thread), the host path with the
launch emulated, the dispatcher's gate (FUSEDMLP_CUDA_BACKWARD); and on an sm_90 GPU the
kernel itself against float64 autograd. The GPU cases have not run yet."""
from __future__ import annotations

import dataclasses
import os
import re

import torch
import torch.nn.functional as F
import pytest

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations, dispatch
from fusedmlp_xpu.backends import cuda as cuda_backend
from fusedmlp_xpu.backends import cuda_build as cb
from fusedmlp_xpu.spec import MLPSpec

from conftest import TOLERANCE, make_params, reference, rel_error
from test_cuda_backend import SM90, h200  # noqa: F401  (a fixture)

ENV = cuda_backend.BACKWARD_ENV


@pytest.fixture(autouse=True)
def _racecheck_cleared(request, monkeypatch):
    """The kernel refuses to train until racecheck clears it (cuda.RACECHECK_CLEAN): its
    own tests run it regardless, except the test of that refusal."""
    if "held_back" not in request.node.name and "racecheck" not in request.node.name:
        monkeypatch.setattr(cuda_backend, "RACECHECK_CLEAN", "tests")


def _spec(widths, act="relu", out_act="none", bias=False, dtype=torch.float16):
    return MLPSpec(tuple(widths), act, out_act, bias, dtype)


W64 = (64,) + (64,) * 4 + (64,)  # narrow-w64: 5 layers
NETS = [  # (widths, activation, output activation, bias)
    (W64, "relu", "none", False),
    ((32, 64, 64, 3), "relu", "none", False),  # loop-image's net
    ((32,) + (64,) * 4 + (16,), "softplus", "none", True),  # the sdf net
    (W64, "tanh", "sigmoid", True),
    ((17, 64, 64, 9), "leaky_relu", "relu", True),
    ((64, 64, 48), "none", "tanh", False),
    ((64,) + (32,) * 4 + (64,), "relu", "none", False),  # narrow-w32
    ((3, 16, 16, 5), "tanh", "sigmoid", True),
]


# --- configuration -----------------------------------------------------------------------
@pytest.mark.parametrize("spec, why", [
    (_spec((64, 128, 64)), "hidden width 128"),
    (_spec((64, 48, 64)), "hidden width 48: the CUDA backward takes 16, 32, 64"),
    (_spec((96, 64, 64)), "in/out widths 96/64"),
    (_spec((64, 64, 64), "gelu"), "activation ids [3]"),
    (_spec((64, 64, 64), "relu", "silu"), "activation ids [5]"),
    (_spec((64,) + (64,) * 5 + (64,)), "4 hidden-to-hidden layers"),
    (_spec((64, 64, 64), dtype=torch.float32), "dtype torch.float32"),
])
def test_unsupported_specs_say_why(spec, why):
    cfg, reason = cb.backward_config(spec, True, True)
    assert cfg is None and why in reason


def test_configuration_counts():
    cfg, _ = cb.backward_config(_spec(W64), True, True)
    assert cfg.warps == 12 and cfg.threads == 384
    # the forward's weights but the last (no output activation: y is not needed), the 5
    # transposed, the mbarriers, per chain x^T + 4 h^T + 2 g^T (7 x 8 KB), 8 warps' 2 buffers
    assert cfg.g_bufs == 2 and cfg.defines()["FMLP_G_BUFS"] == 2
    assert cfg.smem_bytes() == (4 + 5) * 8192 + 128 + 2 * 7 * 8192 + 2 * 8 * 16 * 72 * 2
    assert cfg.smem_bytes() <= cb.SM90_SMEM
    # three chains at hidden widths up to 32 (the Gluon kernel's count there)
    w32, _ = cb.backward_config(_spec((64,) + (32,) * 4 + (64,)), True, True)
    assert (w32.chains, w32.g_bufs, w32.threads) == (3, 2, 512)
    assert w32.defines()["FMLP_WARPS"] == 16
    # where two g^T tiles a chain do not fit, one
    big, _ = cb.backward_config(_spec(W64, "tanh", "sigmoid", True), True, True)
    assert big.g_bufs == 1 and big.smem_bytes() <= cb.SM90_SMEM
    assert dataclasses.replace(big, g_bufs=2).smem_bytes() > cb.SM90_SMEM
    assert cfg.partial_floats() == 5 * 128 * 32
    cfg, _ = cb.backward_config(_spec((32, 64, 64, 3), bias=True), False, True)
    # no W_0^T without grad_x; 4 bias accumulators a thread a layer
    assert cfg.partial_floats() == 128 * (16 + 4) + 2 * 128 * (32 + 4)
    assert cfg.layer_shapes() == [(64, 32), (64, 64), (3, 64)]
    d = cfg.defines()
    assert d["FMLP_NEED_X"] == 0 and d["FMLP_NEED_WB"] == 1 and d["FMLP_WARPS"] == 12


@pytest.mark.parametrize("widths", [(24, 64, 64, 40), (5, 16, 16, 16, 64)])
def test_partial_index_reads_the_accumulator_layout(widths):
    """Lay dense gradients out as the summing warpgroup's registers hold them (PTX's wgmma
    m64nN accumulator: thread 32 w + 4 g + t has, for each 8-column tile i, d[4 i .. 4 i +
    3] = (row 16 w + g, columns 8 i + 2 t, + 1), (row 16 w + g + 8, the same)), written
    thread-major as the kernel writes them; partial_index must read them back."""
    cfg, _ = cb.backward_config(_spec(widths, bias=True), True, True)
    dense = [torch.randn(o, i, dtype=torch.float64) for o, i in cfg.layer_shapes()]
    bias = [torch.randn(o, dtype=torch.float64) for o, _ in cfg.layer_shapes()]
    partial = torch.full((cfg.partial_floats(),), float("nan"), dtype=torch.float64)
    base = 0
    for (rows, cols), n, w, b in zip(cfg.layer_shapes(), cfg._columns(), dense, bias):
        for thread in range(128):
            warp, lane = divmod(thread, 32)
            g, t = divmod(lane, 4)
            regs = []
            for i in range(n // 8):
                for r in (16 * warp + g, 16 * warp + g + 8):
                    for c in (8 * i + 2 * t, 8 * i + 2 * t + 1):
                        regs.append(w[r, c] if r < rows and c < cols else 0.0)
            partial[base + thread * (n // 2): base + (thread + 1) * (n // 2)] = torch.tensor(regs)
        base += 128 * (n // 2)
        for thread in range(128):  # the n8 bias accumulator: every column the sum
            warp, lane = divmod(thread, 32)
            g = lane // 4
            partial[base + 4 * thread: base + 4 * thread + 4] = torch.tensor(
                [b[r] if r < rows else 0.0 for r in (16 * warp + g,) * 2
                 + (16 * warp + g + 8,) * 2])
        base += 128 * 4
    for (wi, bi), w, b in zip(cfg.partial_index(), dense, bias):
        assert torch.equal(partial[wi].view_as(w), w) and torch.equal(partial[bi], b)


# --- the kernel's shared-memory layouts, emulated from PTX's definitions ------------------
def cm_offset(np_, n, k):
    """fmlp_sm90.cuh cm_offset: the core-matrix layout with np_ rows (n), K-major."""
    return ((k >> 3) * (np_ >> 3) + (n >> 3)) * 128 + (n & 7) * 16 + (k & 7) * 2


def t_addr(np_, c0, r0, lane):
    """fused_mlp_backward_sm90.cu t_addr."""
    j = lane >> 3
    return cm_offset(np_, c0 + (j >> 1) * 8 + (lane & 7), r0 + (j & 1) * 8)


def fragments(m, r0, c0):
    """A warp's A fragments of the 16 x 16 block of m at (r0, c0), as PTX lays them out:
    lane 4 g + t holds in register j the pair (row r0 + g + 8 (j & 1), columns c0 + 8
    (j >> 1) + 2 t, + 1)."""
    return [[(m[r0 + g + 8 * (j & 1)][c0 + 8 * (j >> 1) + 2 * t],
              m[r0 + g + 8 * (j & 1)][c0 + 8 * (j >> 1) + 2 * t + 1]) for j in range(4)]
            for g in range(8) for t in range(4)]


def stmatrix_x4_trans(mem, addr_of_lane, regs):
    """stmatrix.sync.aligned.m8n8.x4.trans: matrix j's row i at the address lane 8 j + i
    gives; transposed, lane (g, t)'s pair of matrix j lands in stored rows 2t and 2t + 1,
    position g."""
    for j in range(4):
        for lane in range(32):
            g, t = divmod(lane, 4)
            for e in range(2):
                mem[addr_of_lane(8 * j + 2 * t + e) + 2 * g] = regs[lane][j][e]


def ldmatrix_x4_trans(mem, addr_of_lane):
    """ldmatrix.sync.aligned.m8n8.x4.trans: lane (g, t) receives stored[2t][g],
    stored[2t + 1][g] of each matrix j."""
    return [[tuple(mem[addr_of_lane(8 * j + 2 * t + e) + 2 * g] for e in range(2))
             for j in range(4)] for g in range(8) for t in range(4)]


def wgmma_k_major(mem, start, lbo, sbo, rows, k=16):
    """A K-major operand of a wgmma (no swizzle) as PTX's canonical layout reads it: element
    (m, kk) at start + (kk / 8) LBO + (m / 8) SBO + (m % 8) 16 + (kk % 8) 2 bytes."""
    return [[mem[start + (kk >> 3) * lbo + (m >> 3) * sbo + (m & 7) * 16 + (kk & 7) * 2]
             for kk in range(k)] for m in range(rows)]


@pytest.mark.parametrize("np_", [16, 32, 64])
def test_transposed_tiles_are_the_sums_operands(np_):
    """A chain's 64 rows x np_ columns (4 warps, 16 rows each) stored by store_t
    (stmatrix .trans at t_addr) are read by the sums' descriptors (start + kb * np_ * 32,
    LBO np_ * 16, SBO 128) as the transposed tile, k-slice by k-slice, and come back by
    ldmatrix .trans as the fragments they were (the chain's act' reads)."""
    m = [[(r, c) for c in range(np_)] for r in range(64)]  # each element names itself
    mem = {}
    for warp in range(4):
        for nb in range(np_ // 16):
            regs = fragments(m, 16 * warp, 16 * nb)
            stmatrix_x4_trans(mem, lambda lane: t_addr(np_, 16 * nb, 16 * warp, lane), regs)
            back = ldmatrix_x4_trans(mem, lambda lane: t_addr(np_, 16 * nb, 16 * warp, lane))
            assert back == regs
    assert len(mem) == 64 * np_  # every element once, none on another
    for kb in range(4):
        a = wgmma_k_major(mem, kb * np_ * 32, np_ * 16, 128, np_)
        assert a == [[m[16 * kb + kk][n] for kk in range(16)] for n in range(np_)]


# The kernel compiled for sm_90a (no GPU): ci/aot_cuda.py compiles every configuration of
# its table (test_cuda_backend.py::test_aot_compiles_every_configuration_without_spills).


# --- the host path, the kernel emulated ---------------------------------------------------
def emulated_launch(recorded):
    """A stand-in for the kernel that honours its contract (tested on the GPU): grad_x, and
    each CTA's partial of the row blocks the kernel gives it (chain c of CTA b takes blocks
    b * chains + c, + grid * chains, ...), summed in float64 and laid out as the summing
    warpgroup's accumulators (cuda_build.BackwardConfig.partial_index)."""
    def launch(kernel, grid, params, device):
        x, gy, gx, partial, ws, bs, spec, cfg = recorded[-1]
        xd = x.double().requires_grad_()
        wd = [w.double().requires_grad_() for w in ws]
        bd = None if bs is None else [b.double().requires_grad_() for b in bs]
        h = xd
        for i, w in enumerate(wd):
            a = spec.output_activation if i == len(wd) - 1 else spec.activation
            h = activations.get(a).fn(F.linear(h, w, None if bd is None else bd[i]))
        if gx is not None:
            (g,) = torch.autograd.grad(h, xd, gy.double(), retain_graph=True)
            gx.copy_(g)
        if partial is None:
            return
        blocks = torch.arange(x.shape[0]) // 64
        cta = (blocks // cfg.chains) % grid
        where = cfg.partial_index()
        for b in range(grid):
            rows = cta == b
            gw = torch.autograd.grad(h, [*wd, *(bd or [])], gy.double() * rows[:, None],
                                     retain_graph=True)
            flat = torch.zeros(cfg.partial_floats(), dtype=torch.float64)
            for l, (wi, bi) in enumerate(where):
                flat[wi] = gw[l].flatten()
                if bi is not None:
                    flat[bi] = gw[len(wd) + l]
            partial[b].copy_(flat)
    return launch


@pytest.fixture
def emulated(monkeypatch):
    recorded = []
    real_pack = cuda_backend.pack_backward_params

    def pack(x, gy, gx, partial, ws, bs):
        recorded.append((x, gy, gx, partial, ws, bs, spec_box[0], cfg_box[0]))
        return real_pack(x, gy, gx, partial, ws, bs)

    spec_box, cfg_box = [None], [None]
    real_config = cb.backward_config

    def config(spec, need_x, need_wb, smem=cb.SM90_SMEM):
        # the host path in fp32 (the emulation computes in float64, rounds once) with the
        # configuration of the same net in fp16
        spec_box[0] = spec
        cfg_box[0] = real_config(dataclasses.replace(spec, dtype=torch.float16), need_x,
                                 need_wb, smem)[0]
        return cfg_box[0], ""

    class Kernel:
        max_ctas = 3  # a few CTAs, each with several row blocks

    monkeypatch.setattr(cuda_backend, "device_info", lambda device: SM90)
    monkeypatch.setattr(cb, "backward_config", config)
    monkeypatch.setattr(cuda_backend, "backward_kernel", lambda device, cfg: Kernel())
    monkeypatch.setattr(cuda_backend, "pack_backward_params", pack)
    monkeypatch.setattr(cuda_backend, "launch", emulated_launch(recorded))
    monkeypatch.setenv(ENV, "1")
    return recorded


@pytest.mark.parametrize("widths, act, out_act, bias", NETS[:4] + NETS[6:])  # 2 and 3 chains
@pytest.mark.parametrize("needs", [(True, True, True), (False, True, False), (True, False, True),
                                   (True, False, False)])
def test_host_path_sums_and_reads_the_partials(emulated, widths, act, out_act, bias, needs):
    needs = (needs[0], needs[1], needs[2] and bias)
    spec = _spec(widths, act, out_act, bias, torch.float32)
    ws, bs = make_params(widths, bias, torch.float32, "cpu")
    x, gy = torch.randn(1000, widths[0]), torch.randn(1000, widths[-1])
    gx, gw, gb = cuda_backend.CudaBackend().backward(gy, x, ws, bs, None, spec, needs)
    cfg, partial = emulated[-1][-1], emulated[-1][3]
    assert (cfg.need_x, cfg.need_wb) == (needs[0], needs[1] or needs[2])
    # 16 row blocks over at most 3 CTAs (Kernel.max_ctas): several blocks each
    assert partial is None or partial.shape == (3, cfg.partial_floats())
    _, rx, rw, rb = reference(x, ws, bs, act, out_act, grad_y=gy)
    if needs[0]:
        assert rel_error(gx, rx) < 1e-5
    else:
        assert gx is None
    assert len(gw) == (len(ws) if needs[1] else 0) and len(gb) == (len(ws) if needs[2] else 0)
    for a, r in zip(gw, rw):
        assert a.dtype == torch.float32 and rel_error(a, r) < 1e-5
    for a, r in zip(gb, rb):
        assert rel_error(a, r) < 1e-5


def test_no_rows_and_no_gradients(emulated):
    be = cuda_backend.CudaBackend()
    ws, _ = make_params(W64, False, torch.float16, "cpu")
    spec = _spec(W64)
    gx, gw, gb = be.backward(torch.empty(0, 64).half(), torch.empty(0, 64).half(), ws, None,
                             None, spec, (True, True, False))
    assert gx.shape == (0, 64) and [w.shape for w in gw] == [w.shape for w in ws]
    assert all(not w.any() for w in gw) and gb == [] and emulated == []
    assert be.backward(torch.randn(4, 64).half(), torch.randn(4, 64).half(), ws, None, None,
                       spec, (False, False, False)) == (None, [], [])


# --- the dispatcher's gate ------------------------------------------------------------------
# the h200 fixture: test_cuda_backend.py's (an H200's properties, the driver stubbed)


def test_held_back_until_racecheck_is_clean(h200, monkeypatch):
    """FUSEDMLP_CUDA_BACKWARD=1 does not train on the kernel while RACECHECK_CLEAN is
    unset: a forced training call is refused, saying why."""
    monkeypatch.setattr(cuda_backend, "RACECHECK_CLEAN", None)
    monkeypatch.setenv(ENV, "1")
    spec = _spec(W64)
    ex = dispatch.explain_choice(h200, spec, "cuda", train=True)
    assert ex.backend is None and "racecheck" in ex.considered[0].reason
    assert dispatch.explain_choice(h200, spec, None, train=True).backend != "cuda"
    assert dispatch.explain_choice(h200, spec, "cuda", train=False).backend == "cuda"


def test_racecheck_clean_names_a_logged_run():
    """RACECHECK_CLEAN, where set, is a run in a committed results table whose racecheck
    summaries all say 0 hazards."""
    run = cuda_backend.RACECHECK_CLEAN
    if run is None:
        pytest.skip("the kernel is held back")
    import glob
    import json

    tables = glob.glob(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), "benchmarks", "results", "*.jsonl"))
    recs = [json.loads(ln) for t in tables for ln in open(t) if f'"{run}"' in ln]
    recs = [r for r in recs if r.get("run") == run]
    assert recs, f"RACECHECK_CLEAN names {run!r}, which no committed table holds"
    text = "\n".join(r.get("text", "") for r in recs)
    summaries = re.findall(r"RACECHECK SUMMARY: (\d+) hazard", text)
    assert summaries and all(n == "0" for n in summaries), summaries


def test_training_only_when_switched_on(h200, monkeypatch):
    spec = _spec(W64)
    monkeypatch.delenv(ENV, raising=False)
    ex = dispatch.explain_choice(h200, spec, "cuda", train=True)
    assert ex.backend is None and "FUSEDMLP_CUDA_BACKWARD=1" in ex.considered[0].reason
    monkeypatch.setenv(ENV, "1")
    ex = dispatch.explain_choice(h200, spec, "cuda", train=True)
    assert ex.backend == "cuda" and "not yet sanitized or timed" in ex.considered[0].reason
    # unforced, its backward is not measured: training takes triton (or the next backend),
    # even where an inference win is on record for the spec
    monkeypatch.setitem(cuda_backend.MEASURED_WINS, cuda_backend.win_key((9, 0), spec), "x")
    assert dispatch.explain_choice(h200, spec, None).backend == "cuda"
    ex = dispatch.explain_choice(h200, spec, None, train=True)
    c = next(c for c in ex.considered if c.name == "cuda")
    assert ex.backend != "cuda" and "trains only when forced" in c.reason
    for other, why in ((_spec((64, 128, 64)), "hidden width 128"),
                       (_spec((64, 64, 64), "gelu"), "activation ids [3]")):
        ex = dispatch.explain_choice(h200, other, "cuda", train=True)
        assert ex.backend is None and why in ex.considered[0].reason
    monkeypatch.setattr(cuda_backend, "device_info", lambda device: ((8, 0), 108, 163 * 1024))
    ok, why = cuda_backend.CudaBackend().train_support(spec, h200)
    assert not ok and "sm_90 (wgmma) only" in why


def test_a_measured_train_win_trains_unforced(h200, monkeypatch):
    """A spec in MEASURED_TRAIN_WINS trains on the cuda backend unforced and without
    FUSEDMLP_CUDA_BACKWARD, and the explanation names the run; other specs do not."""
    spec = _spec(W64)
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setitem(cuda_backend.MEASURED_TRAIN_WINS, cuda_backend.win_key((9, 0), spec),
                        "h200-run-x")
    ex = dispatch.explain_choice(h200, spec, None, train=True)
    c = next(c for c in ex.considered if c.name == "cuda")
    assert ex.backend == "cuda" and "for training (h200-run-x)" in c.reason, str(ex)
    other = _spec(W64, bias=False) if spec.bias else _spec(W64, bias=True)
    ex = dispatch.explain_choice(h200, other, None, train=True)
    assert ex.backend != "cuda"
    ex = dispatch.explain_choice(h200, other, "cuda", train=True)
    assert ex.backend is None and "FUSEDMLP_CUDA_BACKWARD=1" in ex.considered[0].reason


# --- on an sm_90 GPU -------------------------------------------------------------
def _sm90_or_skip(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    ok, why = dispatch.availability("cuda")
    if not ok:
        pytest.skip(why)
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the backward kernel is sm_90 only")
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(dispatch, "_decisions", {})
    return torch.device("cuda")


def kernel_z(x, ws, bs, act, out_act):
    """Each layer's pre-activation as the kernel sees it (fp64 products of the 16-bit
    operands; every hidden output rounded to the dtype), for reference(kinks_at=)."""
    h, zs = x.detach().double().cpu(), []
    for i, w in enumerate(ws):
        z = F.linear(h, w.detach().double().cpu(),
                     None if bs is None else bs[i].detach().double().cpu())
        zs.append(z)
        a = out_act if i == len(ws) - 1 else act
        h = activations.get(a).fn(z).to(x.dtype).double()
    return zs


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("widths, act, out_act, bias", NETS)
@pytest.mark.parametrize("rows", [1, 64, 65, 1037, (1 << 16) + 3])
def test_backward_against_float64(monkeypatch, dtype, widths, act, out_act, bias, rows):
    dev = _sm90_or_skip(monkeypatch)
    ws, bs = make_params(widths, bias, dtype, dev)
    x = torch.randn(rows, widths[0], device=dev).to(dtype)
    gy = torch.randn(rows, widths[-1], device=dev).to(dtype)
    spec = _spec(widths, act, out_act, bias, dtype)
    be = cuda_backend.CudaBackend()
    for needs in ((True, True, bias), (False, True, bias), (True, False, False)):
        gx, gw, gb = be.backward(gy, x, ws, bs, None, spec, needs)
        torch.cuda.synchronize()
        _, rx, rw, rb = reference(x, ws, bs, act, out_act, grad_y=gy,
                                  kinks_at=kernel_z(x, ws, bs, act, out_act))
        tol = TOLERANCE[dtype]
        if needs[0]:
            assert rel_error(gx, rx) < tol, ("grad_x", needs)
        for i, (a, r) in enumerate(zip(gw, rw)):
            assert rel_error(a, r) < tol, (f"grad_w{i}", needs)
        for i, (a, r) in enumerate(zip(gb, rb)):
            assert rel_error(a, r) < tol, (f"grad_b{i}", needs)


@pytest.mark.gpu
def test_module_train_step_forced(monkeypatch):
    """A FusedMLP forced to cuda trains through the op (forward kernel, then the backward
    kernel from autograd): its gradients match the triton backend's, and recompute=False
    says it cannot save."""
    dev = _sm90_or_skip(monkeypatch)
    torch.manual_seed(0)
    m = fm.FusedMLP(32, 16, 64, 3, bias=True, activation="softplus", device=dev,
                    dtype=torch.float16, backend="cuda")
    x = torch.randn(4099, 32, device=dev, dtype=torch.float16)
    assert fm.explain(m, x, train=True).backend == "cuda"
    m(x).float().square().mean().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m.backend = "triton"
    m(x).float().square().mean().backward()
    for a, b in zip(got, (p.grad for p in m.parameters())):
        assert rel_error(a, b.double().cpu()) < TOLERANCE[torch.float16]
    ws, bs = make_params((32, 64, 16), True, torch.float16, dev, requires_grad=True)
    with pytest.raises(NotImplementedError, match="recompute=False is not supported"):
        fm.fused_mlp(x, ws, bs, "relu", backend="cuda", recompute=False)


@pytest.mark.gpu
def test_nonfinite_like_eager(monkeypatch):
    """NaN and Inf in x and grad_y reach the same gradient entries as in eager's float64
    backward (relu's mask h <= 0 passes a NaN h's gradient there too). Whether an entry
    is NaN or Inf may differ (an fp16 product that rounds to 0 against Inf), so the
    pattern of non-finite entries is compared."""
    dev = _sm90_or_skip(monkeypatch)
    ws, bs = make_params(W64, False, torch.float16, dev)
    x = torch.randn(300, 64, device=dev).half()
    gy = torch.randn(300, 64, device=dev).half()
    x[3, 5], x[70, 0], gy[150, 2] = float("nan"), float("inf"), float("nan")
    spec = _spec(W64)
    gx, gw, _ = cuda_backend.CudaBackend().backward(gy, x, ws, None, None, spec,
                                                    (True, True, False))
    xe = x.double().requires_grad_()
    we = [w.double().requires_grad_() for w in ws]
    h = xe
    for i, w in enumerate(we):
        h = F.linear(h, w)
        h = torch.relu(h) if i < len(we) - 1 else h
    ge = torch.autograd.grad(h, [xe, *we], gy.double())
    for a, e in zip([gx, *gw], ge):
        assert torch.equal(torch.isfinite(a).cpu(), torch.isfinite(e).cpu())
        assert not torch.isfinite(e).all()


@pytest.mark.gpu
def test_cuda_graph_capture(monkeypatch):
    dev = _sm90_or_skip(monkeypatch)
    ws, _ = make_params(W64, False, torch.float16, dev)
    x = torch.randn(5000, 64, device=dev).half()
    gy = torch.randn(5000, 64, device=dev).half()
    be, spec = cuda_backend.CudaBackend(), _spec(W64)
    want = be.backward(gy, x, ws, None, None, spec, (True, True, False))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        be.backward(gy, x, ws, None, None, spec, (True, True, False))
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        got = be.backward(gy, x, ws, None, None, spec, (True, True, False))
    x.copy_(torch.randn_like(x))
    g.replay()
    want = be.backward(gy, x, ws, None, None, spec, (True, True, False))
    torch.cuda.synchronize()
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        assert torch.equal(a, b)
