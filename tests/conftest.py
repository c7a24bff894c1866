"""The shared correctness suite's fixtures: every usable (backend, device), one float64
reference, one tolerance table. A backend joins the suite by registering with the
dispatcher; no test file names a backend except the reference."""
from __future__ import annotations

import functools
import os
import random
import zlib

import torch

# Without a GPU, Triton kernels run in its interpreter on CPU tensors (set before import).
if not torch.cuda.is_available() and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _interpreter_rounds_bf16_like_a_gpu() -> None:
    """Triton's interpreter narrows fp32 to bf16 by truncation (Triton 3.x ``cast_impl``
    passes no rounding mode, and its round-to-nearest branch does not carry into the
    exponent), where a GPU's conversion rounds to nearest even: emulated bf16 kernels
    showed ~4x eager's gradient error and failed the suite by chance. Round as the
    hardware does, so the CPU runs check the kernels' numerics, not the emulator's."""
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_fusedmlp_rtne", False):
        return
    cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            bits = bits.astype(np.uint64)  # room for the carry of the largest finite
            out = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            out[np.isnan(src.data)] = 0x7FC0
            return interpreter.TensorHandle(out.reshape(np.shape(src.data)),
                                            dst_type.scalar)
        return cast(self, src, dst_type)

    builder.cast_impl = cast_impl
    builder._fusedmlp_rtne = True


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_rounds_bf16_like_a_gpu()

# Under pytest-xdist every worker would otherwise start one CPU thread per core for the
# float64 reference: 16 workers x 16 threads made single small tests take minutes.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, (os.cpu_count() or 1)
                              // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
import torch.nn.functional as F

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations, dispatch
from fusedmlp_xpu.spec import MLPSpec

# Relative error ||out - ref|| / ||ref|| allowed, by operand dtype.
TOLERANCE = {
    # fp32 arithmetic with fp32 accumulation lands near 1e-7; depth and sums of ~1000
    # rows in the weight gradients grow it by at most ~100x.
    torch.float32: 1e-5,
    # fp16 rounds every layer's output to 11 bits (eps 4.9e-4): a few layers of that, and
    # gradients that sum 1000+ rounded products, stay below 1e-2 with margin.
    torch.float16: 1e-2,
    # bf16 keeps 8 bits (eps 3.9e-3): one rounding per layer already costs ~2e-3 rms,
    # five layers and a reduction over rows reach ~1e-2; 2e-2 leaves margin, not slack.
    torch.bfloat16: 2e-2,
}
# Gradients through kinked activations (relu, leaky_relu) carry mask flips: where a
# pre-activation lies within rounding of 0 its derivative differs from the float64 one by a
# whole step. The shared suite avoids that lottery by taking the reference's derivatives at
# the backend's own pre-activations (reference(kinks_at=saved_z(...))) and holds gradients
# to the table. The wide and gated tests instead allow a low-precision gradient within
# GRAD_VS_EAGER x the error of eager autograd in the same dtype on the same data (eager
# shows 3-4e-2 in bf16 with relu); a wrong gradient is off by O(1), far outside it.
GRAD_VS_EAGER = 4.0
# A backend that computes fp32 dots on tensor cores (tf32 or tf32x3) is held to the design's
# tf32 bound instead.
TF32_TOLERANCE = 1e-3


def devices() -> list[torch.device]:
    out = [torch.device("cpu")]
    if torch.cuda.is_available():
        out.append(torch.device("cuda"))
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        out.append(torch.device("xpu"))
    return out


def usable(trains: bool = True) -> list[tuple[str, torch.device]]:
    """Every (backend, device) pair that can run here, the reference on every device;
    ``trains=False``: inference-only backends too (those whose train_support refuses a
    probe: the cuda backend, which has no fp32 kernels and whose backward is off unless
    FUSEDMLP_CUDA_BACKWARD=1; the shared suite's run() trains it where it can, and
    tests/test_cuda_backward.py does)."""
    probes = [MLPSpec((16, 16, 16), "relu", "none", True, dt)
              for dt in (torch.float32, torch.float16)]
    pairs = []
    for dev in devices():
        for name, be in dispatch.REGISTRY.items():
            ok, _ = dispatch.availability(name)
            # a training backend trains every probe (the shared training tests take fp32
            # and half nets alike); an inference one runs one of them at least
            if ok and dev.type in be.device_types and (all if trains else any)(
                    be.supports(p, dev)[0] and (not trains or be.train_support(p, dev)[0])
                    for p in probes):
                pairs.append((name, dev))
    return pairs


BACKENDS = usable()
#: BACKENDS and the inference-only ones (the cuda backend on an NVIDIA GPU): for the
#: forward-only cases of the shared suite; ``run()`` skips their training cases
INFERENCE_BACKENDS = usable(trains=False)


def is_slow(name: str, device: torch.device) -> bool:
    """A kernel emulated on the CPU (Triton's interpreter, SYCL on OpenCL CPU): keep shapes small."""
    return device.type == "cpu" and name != "reference"


@pytest.fixture(params=BACKENDS, ids=[f"{n}-{d.type}" for n, d in BACKENDS])
def backend(request):
    """(name, device) of one usable backend; its dispatcher decisions are fresh."""
    return request.param


@pytest.fixture(params=INFERENCE_BACKENDS, ids=[f"{n}-{d.type}" for n, d in INFERENCE_BACKENDS])
def inference_backend(request):
    """(name, device) of one usable backend, inference-only ones included."""
    return request.param


#: The run's draws: every test's torch seed and every case's generator seed come from this
#: number and the test's id, not from the order or the worker that runs it. Unset, each
#: run draws fresh data (a new number, shown in the header and beside every failure);
#: FUSEDMLP_TEST_SEED=N draws that run's data again.
SEED_ENV = "FUSEDMLP_TEST_SEED"


def pytest_configure(config):
    # set before pytest-xdist starts its workers: they inherit it, so all agree
    text = os.environ.get(SEED_ENV) or str(random.SystemRandom().randrange(2 ** 31))
    try:
        seed = int(text)
    except ValueError:
        raise pytest.UsageError(f"{SEED_ENV}: expected an integer, got {text!r}") from None
    if not 0 <= seed < 2 ** 31:
        raise pytest.UsageError(f"{SEED_ENV}: expected 0 <= seed < 2**31, got {seed}")
    os.environ[SEED_ENV] = str(seed)


def run_seed() -> int:
    return int(os.environ[SEED_ENV])


def case_seed(*parts) -> int:
    """A generator seed for ``parts`` (a test's case) in this run: the same in every
    process for one FUSEDMLP_TEST_SEED (``hash`` of a str changes with the process)."""
    return (run_seed() + zlib.crc32(repr(parts).encode())) % 2 ** 31


def pytest_report_header(config):
    return f"{SEED_ENV}={run_seed()} (set it to draw this run's data again)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    rep = (yield).get_result()
    if rep.failed:
        rep.sections.append(("draw", f"{SEED_ENV}={run_seed()} python -m pytest "
                                     f"'{item.nodeid}' draws this test's data again"))


@pytest.fixture(autouse=True)
def _seeded(request):
    """torch's default generators (CPU and devices) seeded for this test alone."""
    torch.manual_seed(case_seed(request.node.nodeid))


@pytest.fixture(autouse=True)
def _no_env_backend(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every output a backend allocates through memory.new_empty starts as NaN."""
    import importlib

    b = importlib.import_module("fusedmlp_xpu.backends.memory")
    real = b.new_empty

    def poisoned(*shape, like, dtype=None):
        t = real(*shape, like=like, dtype=dtype)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(b, "new_empty", poisoned)


def on_a_new_thread(monkeypatch, fn, between=None):
    """fn() here, then (after ``between()``, e.g. refilling an output with NaN) again on a
    new thread whose first CUDA work it is (as a backward whose graph starts at the op
    runs on autograd's device thread); that call's result back, or its exception raised
    here. The second call's outputs (memory.new_empty's, in the order the first call
    asked for them) come NaN-filled from this thread: filling them there would be CUDA
    work of that thread."""
    import importlib

    mem = importlib.import_module("fusedmlp_xpu.backends.memory")
    poisoned, asked = mem.new_empty, []

    def recording(*shape, like, dtype=None):
        t = poisoned(*shape, like=like, dtype=dtype)
        asked.append(t)
        return t

    monkeypatch.setattr(mem, "new_empty", recording)
    fn()
    ready = [torch.full_like(t, float("nan")) if t.is_floating_point() else
             torch.empty_like(t) for t in asked]
    del asked[:]
    if between is not None:
        between()

    def handing(*shape, like, dtype=None):
        t = ready.pop(0)
        assert tuple(t.shape) == tuple(shape) and t.dtype == (dtype or like.dtype), \
            "the second call allocated other outputs than the first"
        return t

    monkeypatch.setattr(mem, "new_empty", handing)
    try:
        return on_its_own_thread(fn)
    finally:
        monkeypatch.setattr(mem, "new_empty", poisoned)


def on_its_own_thread(fn):
    """fn() run on a new thread; its result back, or its exception raised here."""
    import threading

    got: dict = {}

    def body():
        try:
            got["result"] = fn()
        except BaseException as e:  # noqa: BLE001  (raised on the test's thread)
            got["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in got:
        raise got["error"]
    return got["result"]


def tolerance(name: str, dtype: torch.dtype) -> float:
    if dtype == torch.float32 and getattr(dispatch.REGISTRY[name], "uses_tf32", False):
        return TF32_TOLERANCE
    return TOLERANCE[dtype]


def rel_error(out: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """||out - ref|| / ||ref||, or over ``floor`` where ||ref|| is smaller (a sum that
    cancelled by chance: its rounding error is that of its terms, not of the result)."""
    out = out.detach().to("cpu", torch.float64)
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    assert not torch.isnan(out).any(), "NaN in output (unwritten or poisoned elements)"
    den = max(ref.norm().item(), floor)
    return (out - ref).norm().item() / (den if den > 0 else 1.0)


def chance_sum_size(terms: torch.Tensor) -> float:
    """The size a sum over rows of random-signed ``terms`` [rows, n] has by chance:
    sqrt(rows) x the mean |term|, per column, as a norm (rel_error's floor for it)."""
    t = terms.detach().to("cpu", torch.float64).abs()
    return (t.mean(0) * t.shape[0] ** 0.5).norm().item()


def gradient_floors(x, weights, biases, activation, output_activation, grad_y) -> list[float]:
    """rel_error's floor per gradient [grad_x, *grad_weights, *grad_biases]: the size the
    sums over rows have by chance (chance_sum_size), from float64 pre-activation gradients
    gz_l and layer inputs h_l. A weight's gradient sums gz_l[r, o] h_l[r, i] over rows r:
    where that cancels (a width-1 layer's 1x1 weight over a few hundred rows) the result is
    far below its terms, and its relative error in half precision says nothing. grad_x sums
    over a layer's outputs, not rows: no floor."""
    act = activations.get(activation).fn
    out_act = activations.get(output_activation).fn
    h = x.detach().to("cpu", torch.float64).reshape(-1, x.shape[-1])
    hs, zs = [], []
    for i, w in enumerate(weights):
        hs.append(h)
        z = F.linear(h, w.detach().to("cpu", torch.float64),
                     None if biases is None else biases[i].detach().to("cpu", torch.float64))
        zs.append(z.requires_grad_())
        h = out_act(z) if i == len(weights) - 1 else act(z)
    if h.numel() == 0:
        return [0.0] * (1 + len(weights) + (0 if biases is None else len(biases)))
    gzs = torch.autograd.grad(h, zs, grad_y.detach().to("cpu", torch.float64).reshape(h.shape))
    rows = h.shape[0]
    fw = [(gz.abs().t() @ hi.abs() / rows ** 0.5).norm().item() for gz, hi in zip(gzs, hs)]
    fb = [] if biases is None else [chance_sum_size(gz) for gz in gzs]
    return [0.0, *fw, *fb]


def term_size(x, weights, biases) -> float:
    """The size of the terms an MLP's output sums, as a norm: |x| through |W_l| and |b_l|
    layer by layer, no activation (every registered activation has |act(z)| <= |z| + 1
    and a slope below 1.2). The forward's rounding error scales with it, not with the
    output: an output that cancels to near zero (one row through width-1 layers) has a
    relative error of its own that says nothing (rel_error's floor for the output)."""
    a = x.detach().to("cpu", torch.float64).abs().reshape(-1, x.shape[-1])
    for i, w in enumerate(weights):
        a = a @ w.detach().to("cpu", torch.float64).abs().t()
        if biases is not None:
            a = a + biases[i].detach().to("cpu", torch.float64).abs()
    return a.norm().item()


def assert_close(out, ref, tol, what="output", floor: float = 0.0):
    err = rel_error(out, ref, floor)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"


def eager_errors(x, weights, biases, activation, output_activation, grad_y, ref):
    """Relative errors of eager torch autograd in the operands' dtype (on the CPU), per
    gradient: [grad_x, *grad_weights, *grad_biases], measured against ``ref``."""
    def leaf(t):
        return t.detach().cpu().requires_grad_()

    x_, w_ = leaf(x), [leaf(w) for w in weights]
    b_ = None if biases is None else [leaf(b) for b in biases]
    act = activations.get(activation).fn
    out_act = activations.get(output_activation).fn
    h = x_
    for i, w in enumerate(w_):
        h = F.linear(h, w, None if b_ is None else b_[i])
        h = out_act(h) if i == len(w_) - 1 else act(h)
    grads = torch.autograd.grad(h, [x_, *w_, *(b_ or [])], grad_y.detach().cpu())
    _, rgx, rgw, rgb = ref
    return [rel_error(g, r) for g, r in zip(grads, [rgx, *rgw, *rgb])]


def make_params(widths, bias, dtype, device, requires_grad=False, gen=None):
    """Weights like nn.Linear's init (U(+-1/sqrt(in))), biases likewise; fresh each call."""
    ws, bs = [], []
    for a, b in zip(widths[:-1], widths[1:]):
        bound = a ** -0.5
        w = (torch.rand(b, a, generator=gen, dtype=torch.float64) * 2 - 1) * bound
        ws.append(w.to(device, dtype).requires_grad_(requires_grad))
        if bias:
            v = (torch.rand(b, generator=gen, dtype=torch.float64) * 2 - 1) * bound
            bs.append(v.to(device, dtype).requires_grad_(requires_grad))
    return ws, (bs if bias else None)


def reference(x, weights, biases, activation, output_activation, grad_y=None, kinks_at=None):
    """The float64 CPU ground truth, with gradients by torch autograd (not our formulas).

    Returns y, or (y, grad_x, grad_weights, grad_biases) when grad_y is given.
    kinks_at: per layer, the pre-activations the tested code computed (e.g. ``saved_z``); the
    activations' derivatives are then taken there instead of at the float64 values. Where a
    pre-activation lies within rounding of a kink (relu, leaky_relu) its derivative jumps,
    and which side a kernel lands on is rounding, not correctness: without this, such flips
    make half-precision (and, rarely, fp32) gradient checks a lottery.
    """
    def up(t):
        return t.detach().to("cpu", torch.float64).requires_grad_(grad_y is not None)

    x64 = up(x)
    w64 = [up(w) for w in weights]
    b64 = None if biases is None else [up(b) for b in biases]
    act = activations.get(activation)
    out_act = activations.get(output_activation)
    h = x64
    for i, w in enumerate(w64):
        z = F.linear(h, w, None if b64 is None else b64[i])
        a = out_act if i == len(w64) - 1 else act
        if kinks_at is not None and a.name != "none":
            zk = kinks_at[i].detach().to("cpu", torch.float64)
            # value act(z), derivative act'(zk)
            h = a.fn(z).detach() + (z - z.detach()) * a.grad(zk)
        else:
            h = a.fn(z)
    if grad_y is None:
        return h.detach()
    grads = torch.autograd.grad(h, [x64, *w64, *(b64 or [])], up(grad_y).detach())
    n = len(w64)
    return h.detach(), grads[0], list(grads[1 : 1 + n]), list(grads[1 + n :])


def saved_z(x, weights, biases, activation, output_activation, backend):
    """Each layer's pre-activation as ``backend`` computes it (from fusedmlp::mlp_train's saved
    tensor; the output layer's from y where it has no activation), for reference(kinks_at=)."""
    act, out_act = activations.get(activation).name, activations.get(output_activation).name
    with torch.no_grad():
        y, saved = torch.ops.fusedmlp.mlp_train(x.detach(), [w.detach() for w in weights],
                                                None if biases is None else
                                                [b.detach() for b in biases], act, out_act,
                                                backend)
    widths = [w.shape[0] for w in weights]
    zs = list(saved.split(widths[:-1] + ([widths[-1]] if out_act != "none" else []), dim=-1))
    if out_act == "none":
        zs.append(y)
    return zs


#: in a line of ci/aot_*.py where ptxas serialized the kernel's wgmma instructions (each
#: waited for before the next: right results, a fraction of the speed; aot_wide.SERIALIZED)
SERIALIZED = "WGMMA SERIALIZED"


@functools.lru_cache(maxsize=None)
def run_aot_compile(script: str) -> str:
    """Run ci/<script> --quick (ahead-of-time compile of Triton kernels for sm_90, no GPU) in
    a process without TRITON_INTERPRET; skip where this Triton has no NVIDIA backend.
    Returns its stdout; fails the test if it failed. Once a script per session (two test
    files read the narrow one's lines)."""
    import subprocess
    import sys

    triton = pytest.importorskip("triton")
    if not os.path.isdir(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                      "bin")):
        pytest.skip("this Triton has no NVIDIA backend/ptxas")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, os.path.join(root, "ci", script), "--quick"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


#: the Triton second-order tunings besides the default (narrow/second_order.py): the one
#: kernel at its tuning, with its merged weight-gradient pass, and the GEMM form
SECOND_ORDER_VARIANTS = ["", "kernel", "merge_dw", "split", "fused"]


def use_second_order_variant(monkeypatch, name: str, variant: str) -> None:
    """Make the Triton backend's second-order path take ``variant`` (skip for other
    backends); '' leaves the default."""
    if not variant:
        return
    if name != "triton":
        pytest.skip("a Triton second-order tuning")
    if variant == "kernel" and not torch.cuda.is_available():
        pytest.skip("the default without a GPU")
    from dataclasses import replace

    from fusedmlp_xpu.backends.triton.narrow import second_order as kernel

    pick = {"kernel": lambda device, P, rows=None: kernel.kernel_tuning(device, P),
            "merge_dw": lambda device, P, rows=None: replace(kernel.kernel_tuning(device, P),
                                                             merge_dw=True),
            "split": lambda device, P, rows=None: kernel.SPLIT,
            "fused": lambda device, P, rows=None: kernel.FUSED}[variant]
    monkeypatch.setattr(kernel, "tuning", pick)
