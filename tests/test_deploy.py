"""Deployment against the real runtimes: ONNX (onnxruntime), AOTInductor (its C++ loader,
no Python in the process, and aoti_load_package) and ExecuTorch (its Python runtime).

Every case exports a model holding fused MLPs, runs it in the runtime at batch sizes other
than the traced one (a dynamic batch dimension) and compares with the same model in eager
mode: float32, within 1e-5. CPU only. The runtimes come with the ``deploy`` extra; without
them these tests skip, unless FUSEDMLP_REQUIRE_DEPLOY=1 (CI), where a missing one fails.

AOTInductor compiles for a while (~20 s a package on 2 cores): one package holds every
model (the ``zoo``), run once from C++ and once from Python."""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

import fusedmlp_xpu as fm
from fusedmlp_xpu import activations

REQUIRE = os.environ.get("FUSEDMLP_REQUIRE_DEPLOY") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))
TOL = dict(rtol=1e-5, atol=1e-5)  # float32: the runtimes' kernels sum in other orders
IN = 13
BATCHES = (1, 37)  # the traced batch is 5: both are other sizes


def need(module: str):
    """The runtime's module; a failure in CI (FUSEDMLP_REQUIRE_DEPLOY=1), else a skip."""
    if REQUIRE:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} missing: pip install '.[deploy]'")


def batch_dim(name="batch"):
    return torch.export.Dim(name, min=1, max=4096)


# --- the models --------------------------------------------------------------------------
def _fused_cases():
    """(id, FusedMLP kwargs): every registry activation as the hidden one, the output
    activations that ONNX lacks as an operator of their own (gelu_tanh below opset 20,
    softplus with torch's threshold), bias and none, odd widths, 1-3 hidden layers."""
    outs = ("none", "gelu_tanh", "softplus", "tanh")
    hidden = (33, 17, 64, 5)
    cases = []
    for i, act in enumerate(sorted(activations.ACTIVATIONS)):
        kw = dict(in_features=IN, out_features=7, hidden_features=hidden[i % 4],
                  hidden_layers=1 + i % 3, activation=act, output_activation=outs[i % 4],
                  bias=i % 2 == 0)
        cases.append((f"{act}-{outs[i % 4]}-{'bias' if kw['bias'] else 'nobias'}", kw))
    # softplus as nn.Softplus(beta=100) (NeuS): beta folded into the parameters
    cases.append(("softplus_beta100", dict(in_features=IN, out_features=3, hidden_features=31,
                                           hidden_layers=2, activation="softplus",
                                           output_activation="softplus", bias=True,
                                           softplus_beta=100.0)))
    return cases


FUSED = _fused_cases()
GATED = [("silu-nobias", dict(activation="silu", bias=False)),
         ("gelu_tanh-bias", dict(activation="gelu_tanh", bias=True)),
         ("gelu-bias", dict(activation="gelu", bias=True))]


def fused_mlp(kw) -> nn.Module:
    torch.manual_seed(0)
    return fm.FusedMLP(**kw).eval()


def gated_mlp(kw) -> nn.Module:
    torch.manual_seed(0)
    return fm.GatedMLP(IN, 40, 9, **kw).eval()


class Forecast(nn.Module):
    """A transformers PatchTST forecaster, its feed-forward Sequentials swapped by fuse_mlps
    (built from its config class with random weights: no download). x: [B, 32, 3]."""

    def __init__(self):
        super().__init__()
        transformers = need("transformers")
        cfg = transformers.PatchTSTConfig(
            num_input_channels=3, context_length=32, patch_length=8, patch_stride=8,
            prediction_length=8, d_model=32, num_attention_heads=4, num_hidden_layers=2,
            ffn_dim=48, dropout=0.0, ff_dropout=0.0, attention_dropout=0.0,
            positional_dropout=0.0, path_dropout=0.0, head_dropout=0.0)
        torch.manual_seed(0)
        self.model = transformers.PatchTSTForPrediction(cfg).eval()
        _, report = fm.fuse_mlps(self.model, report=True)
        assert len(report.swapped) == cfg.num_hidden_layers, str(report)
        self.eval()

    def forward(self, x):
        return self.model(past_values=x).prediction_outputs


class CausalLM(nn.Module):
    """A transformers Llama, its gate/up/down MLPs swapped by fuse_gated_mlps. ids: [B, 12]."""

    def __init__(self):
        super().__init__()
        transformers = need("transformers")
        cfg = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=128,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        self.model = transformers.LlamaForCausalLM(cfg).eval()
        _, report = fm.fuse_gated_mlps(self.model, report=True)
        assert len(report.swapped) == cfg.num_hidden_layers, str(report)
        self.eval()

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


class Pair(nn.Module):
    """A FusedMLP and a GatedMLP on the same input. x: [B, IN] -> (y_f, y_g)."""

    def __init__(self, fused: nn.Module, gated: nn.Module):
        super().__init__()
        self.f, self.g = fused, gated

    def forward(self, x):
        return self.f(x), self.g(x)


class Zoo(nn.Module):
    """Every FusedMLP and GatedMLP case and the PatchTST forecaster in one module, so one
    AOTInductor compile serves them all. (x [B, IN], series [S, 32, 3]) -> a tuple."""

    def __init__(self):
        super().__init__()
        self.fused = nn.ModuleList(fused_mlp(kw) for _, kw in FUSED)
        self.gated = nn.ModuleList(gated_mlp(kw) for _, kw in GATED)
        self.forecast = Forecast()
        self.eval()

    def forward(self, x, series):
        return (*(m(x) for m in self.fused), *(m(x) for m in self.gated), self.forecast(series))


def inputs(batch: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed + batch)
    return torch.randn(batch, IN, generator=g), torch.randn(batch, 32, 3, generator=g)


def eager(model, *args):
    with torch.no_grad():
        y = model(*args)
    return list(y) if isinstance(y, tuple) else [y]


def fusedmlp_ops(ep) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes
            if n.op == "call_function" and "fusedmlp" in str(n.target)}


# --- torch.export and the decomposition table -------------------------------------------
@pytest.mark.parametrize("kind", ["fused", "gated"])
def test_export_records_the_inference_op_for_an_eval_module(kind):
    """Outside no_grad the export traces in grad mode: an eval module still records the
    inference op; a module in training mode keeps its training op."""
    m = fused_mlp(FUSED[0][1]) if kind == "fused" else gated_mlp(GATED[0][1])
    name = "fusedmlp.mlp" if kind == "fused" else "fusedmlp.gated_mlp"
    x = inputs(5)[0]
    assert fusedmlp_ops(torch.export.export(m, (x,))) == {f"{name}.default"}
    assert fusedmlp_ops(torch.export.export(m.train(), (x,))) == {f"{name}_train.default"}


@pytest.mark.parametrize("case", [FUSED[3], FUSED[-1]], ids=lambda c: c[0])
def test_export_decompositions_leave_standard_ops_only(case):
    model = Pair(fused_mlp(case[1]), gated_mlp(GATED[1][1]))
    ep = torch.export.export(model, (inputs(5)[0],), dynamic_shapes=({0: batch_dim()},))
    assert fusedmlp_ops(ep)
    ep = ep.run_decompositions(fm.export_decompositions())
    targets = {n.target for n in ep.graph.nodes if n.op == "call_function"}
    assert all(isinstance(t, torch._ops.OpOverload) and t.namespace == "aten"
               for t in targets), targets
    for b in BATCHES:
        x = inputs(b)[0]
        for y, ref in zip(ep.module()(x), eager(model, x)):
            torch.testing.assert_close(y, ref, **TOL)


def test_compile_keeps_the_fused_op():
    """The decompositions sit in torch's global table for torch.onnx; torch.compile's
    inductor does not read it: the compiled code still calls the op (its kernels)."""
    from torch._inductor.utils import run_and_get_code

    m = fused_mlp(FUSED[1][1])
    x = inputs(5)[0]
    with torch.no_grad():
        y, codes = run_and_get_code(torch.compile(m), x)
        torch.testing.assert_close(y, m(x), **TOL)
    assert "torch.ops.fusedmlp.mlp.default(" in "".join(codes)


def test_compile_with_ci_set_keeps_the_fused_ops(tmp_path):
    """Where the environment sets CI, inductor refuses an implicit fallback to an op that
    has a decomposition unless the op is on its allow list (op.FUSED_OPS): a fresh
    process (an op lowered once stays lowered) compiles a training step of each module."""
    code = (
        "import torch, fusedmlp_xpu as fm\n"
        "for m in (fm.FusedMLP(8, 4, 16, 2, bias=True), fm.GatedMLP(8, 16, activation='silu')):\n"
        "    x = torch.randn(5, 8, requires_grad=True)\n"
        "    torch.compile(m)(x).sum().backward()\n"
        "    assert x.grad is not None\n")
    env = dict(os.environ, CI="true", TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]


def _op_args(bias: bool, act="gelu_tanh", out_act="softplus"):
    g = torch.Generator().manual_seed(3)
    widths = (IN, 17, 17, 7)
    ws = [torch.randn(b, a, generator=g) * a ** -0.5 for a, b in zip(widths[:-1], widths[1:])]
    bs = [torch.randn(b, generator=g) * 0.1 for b in widths[1:]] if bias else None
    x = torch.randn(2, 3, IN, generator=g)  # leading dims
    return x, ws, bs, act, out_act


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_decompositions_equal_the_ops_training_and_backward_too(bias):
    """Each decomposition, traced into aten ops, computes what its op computes: the
    forward, the training forward (saved pre-activations), the backward; gated too."""
    from torch.fx.experimental.proxy_tensor import make_fx

    table = fm.export_decompositions()
    ops = torch.ops.fusedmlp
    x, ws, bs, act, out_act = _op_args(bias)
    gy = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(4))
    _, saved = ops.mlp_train(x, ws, bs, act, out_act, "reference")
    gw = [torch.randn(40, IN) * 0.2, torch.randn(40, IN) * 0.2, torch.randn(9, 40) * 0.2]
    gb = [torch.randn(40) * 0.1, torch.randn(40) * 0.1, torch.randn(9) * 0.1] if bias else None
    _, g_, u_ = ops.gated_mlp_train(x, *gw, gb, "gelu_tanh", "reference")
    gy9 = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(5))
    calls = [
        (ops.mlp.default, (x, ws, bs, act, out_act, "")),
        (ops.mlp_train.default, (x, ws, bs, act, out_act, "")),
        (ops.mlp_backward.default, (gy, x, ws, bs, saved, act, out_act, "", True, True, True)),
        (ops.mlp_backward.default, (gy, x, ws, bs, None, act, out_act, "", False, True, bias)),
        (ops.gated_mlp.default, (x, *gw, gb, "gelu_tanh", "")),
        (ops.gated_mlp_train.default, (x, *gw, gb, "gelu_tanh", "")),
        (ops.gated_mlp_backward.default, (gy9, x, *gw, gb, [g_, u_], "gelu_tanh", "", True,
                                          True, True)),
    ]
    for op_, args in calls:
        gm = make_fx(lambda *a: op_(*a), decomposition_table=table)(*args)
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert not any("fusedmlp" in t for t in targets), (op_, targets)
        want = torch.utils._pytree.tree_leaves(op_(*args))
        got = torch.utils._pytree.tree_leaves(gm(*args))
        assert len(got) == len(want), op_
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, **TOL, msg=lambda m: f"{op_}: {m}")


# --- ONNX ----------------------------------------------------------------------------------
def onnx_matches(model, args, dims, call_args):
    """torch.onnx.export with no argument beyond the model, its inputs and the dynamic
    batch; every node a standard ONNX one; onnxruntime equals eager on ``call_args``."""
    need("onnxscript")
    ort = need("onnxruntime")
    prog = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=dims, verbose=False)
    proto = prog.model_proto
    domains = {n.domain for n in proto.graph.node}
    assert domains <= {"", "ai.onnx"}, domains  # no custom op, no function of ours
    kinds = {n.op_type for n in proto.graph.node}
    assert kinds & {"Gemm", "MatMul"}, kinds
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for a in call_args:
        ys = sess.run(None, {n: t.numpy() for n, t in zip(names, a)})
        refs = eager(model, *a)
        assert len(ys) == len(refs)
        for y, ref in zip(ys, refs):
            torch.testing.assert_close(torch.from_numpy(y), ref, **TOL)
    return kinds, proto


#: the ONNX nodes each activation becomes (softplus keeps torch's threshold: z > 20 -> z)
NODES = {"none": set(), "relu": {"Relu"}, "leaky_relu": {"LeakyRelu"}, "gelu": {"Gelu"},
         "gelu_tanh": {"Gelu"}, "silu": {"Sigmoid", "Mul"}, "sigmoid": {"Sigmoid"},
         "tanh": {"Tanh"}, "softplus": {"Softplus", "Greater", "Where"}}


@pytest.mark.parametrize("case", FUSED, ids=lambda c: c[0])
def test_onnx_fused_mlp(case):
    """Matrix products and the activations' own nodes, nothing else (Div: softplus's beta
    dividing the output)."""
    kw = case[1]
    m = fused_mlp(kw)
    kinds, proto = onnx_matches(m, (inputs(5)[0],), ({0: batch_dim()},),
                                [(inputs(b)[0],) for b in BATCHES])
    acts = NODES[m.activation] | NODES[m.output_activation]
    assert acts <= kinds <= acts | {"Gemm", "MatMul", "Add", "Div"}, kinds
    gelus = [n for n in proto.graph.node if n.op_type == "Gelu"]
    tanh = {a.s.decode() for n in gelus for a in n.attribute if a.name == "approximate"}
    want = {m.activation, m.output_activation} & {"gelu", "gelu_tanh"}
    assert ("tanh" in tanh) == ("gelu_tanh" in want), (want, tanh)


@pytest.mark.parametrize("case", GATED, ids=lambda c: c[0])
def test_onnx_gated_mlp(case):
    onnx_matches(gated_mlp(case[1]), (inputs(5)[0],), ({0: batch_dim()},),
                 [(inputs(b)[0],) for b in BATCHES])


def test_onnx_module_in_training_mode():
    """A module left in training mode records the training ops (mlp_train,
    gated_mlp_train): those decompose too."""
    model = Pair(fused_mlp(FUSED[2][1]), gated_mlp(GATED[0][1])).train()
    assert fusedmlp_ops(torch.export.export(model, (inputs(5)[0],))) == {
        "fusedmlp.mlp_train.default", "fusedmlp.gated_mlp_train.default"}
    onnx_matches(model, (inputs(5)[0],), ({0: batch_dim()},),
                 [(inputs(b)[0],) for b in BATCHES])


def test_onnx_transformers_models():
    """PatchTST with fuse_mlps (its feed-forward Sequentials) and Llama with
    fuse_gated_mlps, dynamic batch."""
    onnx_matches(Forecast(), (inputs(5)[1],), ({0: batch_dim()},),
                 [(inputs(b)[1],) for b in BATCHES])
    ids = [torch.randint(0, 128, (b, 12), generator=torch.Generator().manual_seed(b))
           for b in (2, 1, 3)]
    onnx_matches(CausalLM(), (ids[0],), ({0: torch.export.Dim("batch", min=1, max=64)},),
                 [(i,) for i in ids[1:]])


# --- AOTInductor ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def zoo_package(tmp_path_factory):
    """(the zoo module, its AOTInductor package): exported with a dynamic batch (both
    inputs' first dimensions), decomposed to standard ops, compiled once."""
    zoo = Zoo()
    ep = torch.export.export(zoo, inputs(5),
                             dynamic_shapes=({0: batch_dim("b")}, {0: batch_dim("s")}))
    ep = ep.run_decompositions(fm.export_decompositions())
    assert not fusedmlp_ops(ep)
    path = str(tmp_path_factory.mktemp("aoti") / "zoo.pt2")
    return zoo, torch._inductor.aoti_compile_and_package(ep, package_path=path)


def _check_outputs(zoo, calls, outputs):
    assert len(outputs) == len(calls)
    for args, ys in zip(calls, outputs):
        refs = eager(zoo, *args)
        assert len(ys) == len(refs)
        for i, (y, ref) in enumerate(zip(ys, refs)):
            torch.testing.assert_close(y, ref, **TOL, msg=lambda m: f"output {i}: {m}")


def build_runner(out_dir) -> str:
    """tests/deploy/aoti_run.cpp built with g++ against the torch wheel's headers and
    libraries (the path a C++ deployment takes: no Python, no build system)."""
    from torch.utils import cpp_extension

    cxx = shutil.which("g++")
    if cxx is None:
        if REQUIRE:
            raise RuntimeError("g++ not found: the AOTInductor C++ test needs it")
        pytest.skip("g++ not found")
    exe = os.path.join(out_dir, "aoti_run")
    libs = cpp_extension.library_paths()
    cmd = [cxx, "-O0", "-std=c++20", "-w",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
           *(f"-I{p}" for p in cpp_extension.include_paths()),
           os.path.join(HERE, "deploy", "aoti_run.cpp"), "-o", exe,
           *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs),
           "-ltorch", "-ltorch_cpu", "-lc10"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr[-4000:]}"
    return exe


def test_aoti_package_runs_from_cpp_without_python(zoo_package, tmp_path):
    import torch.jit._pickle as jit_pickle

    zoo, package = zoo_package
    exe = build_runner(str(tmp_path))
    calls = [inputs(b) for b in BATCHES]
    torch.save([list(c) for c in calls], tmp_path / "in.pt")
    # a bare environment: nothing of this Python (PYTHONPATH, PYTHONHOME) reaches it
    r = subprocess.run([exe, package, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                       capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                       timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    # what torch::pickle_save writes names these two helpers for its typed lists
    with torch.serialization.safe_globals([jit_pickle.restore_type_tag,
                                           jit_pickle.build_tensorlist]):
        outputs = torch.load(tmp_path / "out.pt")
    _check_outputs(zoo, calls, outputs)


_LOAD_AND_RUN = """
import sys, torch
run = torch._inductor.aoti_load_package(sys.argv[1])
calls = torch.load(sys.argv[2])
torch.save([[t for t in run(*c)] for c in calls], sys.argv[3])
"""


def test_aoti_package_runs_from_python(zoo_package, tmp_path):
    """The package loaded and run by torch._inductor.aoti_load_package, in a process of its
    own: a crash in the loader is a failure naming its signal, not a lost test worker
    (torch 2.11's loader died with SIGSEGV on the H200 host; torch 2.13 runs it)."""
    zoo, package = zoo_package
    calls = [inputs(b, seed=7) for b in (3, 64)]
    torch.save([list(c) for c in calls], tmp_path / "in.pt")
    r = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, package, str(tmp_path / "in.pt"),
                        str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (f"aoti_load_package and run: exit {r.returncode} (torch "
                               f"{torch.__version__})\n{r.stderr[-3000:]}")
    _check_outputs(zoo, calls, torch.load(tmp_path / "out.pt"))


# --- ExecuTorch ----------------------------------------------------------------------------
def test_executorch_pte_runs_in_its_runtime(tmp_path):
    """A FusedMLP and a GatedMLP lowered to a .pte (the portable kernels) through the
    decomposition table, run by ExecuTorch's runtime at other batch sizes. Without the
    decomposition, lowering stops: ExecuTorch has no out-variant kernel for fusedmlp::*."""
    need("executorch")
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    model = Pair(fused_mlp(FUSED[4][1]), gated_mlp(GATED[1][1]))
    ep = torch.export.export(model, (inputs(5)[0],), dynamic_shapes=({0: batch_dim()},))
    with pytest.raises(Exception, match="fusedmlp"):
        to_edge_transform_and_lower(ep).to_executorch()
    ep = ep.run_decompositions(fm.export_decompositions())
    pte = tmp_path / "mlp.pte"
    pte.write_bytes(to_edge_transform_and_lower(ep).to_executorch().buffer)
    method = Runtime.get().load_program(str(pte)).load_method("forward")
    for b in BATCHES:
        x = inputs(b)[0]
        ys = method.execute([x])
        refs = eager(model, x)
        assert len(ys) == len(refs)
        for y, ref in zip(ys, refs):
            torch.testing.assert_close(y, ref, **TOL)
