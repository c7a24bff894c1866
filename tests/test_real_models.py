"""The converters on the real released packages' models (transformers, timm, torchvision),
built from their config classes with random weights: no downloads. Each is compared with
its unfused self: logits and every parameter's gradient, float32 and bfloat16.

What is missing is skipped (pytest.importorskip). timm needs torchvision, whose PyPI wheels
follow the CUDA torch: those tests run where both are installed (the GPU machine)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import fusedmlp_xpu as fm
from conftest import TOLERANCE

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_same(ref: nn.Module, fused: nn.Module, make_input, dtype) -> tuple[float, float]:
    """Forward and backward both; (output rel error, worst gradient rel error)."""
    x = make_input()
    # no-grad first: on a GPU this is the fused forward kernels' path at any row count
    # (training calls of few rows may run as torch ops: Backend.torch_train_rows)
    with torch.no_grad():
        y_ng = fused(x)
    y_ref, y = ref(x), fused(x)
    y_ref = getattr(y_ref, "logits", y_ref)
    y = getattr(y, "logits", y)
    out_err = max(rel(y, y_ref), rel(getattr(y_ng, "logits", y_ng), y_ref))
    # a loss that reaches every output with different weights
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device, y.dtype)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    grad_err = 0.0
    fused_params = dict(fused.named_parameters())
    for name, p in ref.named_parameters():
        q = fused_params[name]
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            grad_err = max(grad_err, rel(q.grad, p.grad))
    tol = TOLERANCE[dtype]
    assert out_err <= tol, f"output rel error {out_err:.2e} > {tol}"
    assert grad_err <= tol, f"gradient rel error {grad_err:.2e} > {tol}"
    return out_err, grad_err


# --- transformers ----------------------------------------------------------------------
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=128,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)

# (config class, model class, extra config, the MLP class expected to fuse, activation)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "silu"),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}, "silu"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, "silu"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}, "silu"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM",
              {"head_dim": 16, "hidden_activation": "gelu_pytorch_tanh"}, "gelu_tanh"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}, "silu"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}, "silu"),
}


def build(name: str, dtype: torch.dtype) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg_cls, model_cls, extra, _ = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(**TINY, **extra)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(cfg).to(DEVICE, dtype).eval()


# on a GPU also with the Triton kernels forced: the automatic choice runs training calls of
# these few rows as torch ops (faster there), which would leave the kernels untested
BACKENDS = [None] + (["triton"] if DEVICE == "cuda" else [])


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b or "auto")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_model_fuses_and_matches(name, dtype, backend):
    ref = build(name, dtype)
    fused = copy.deepcopy(ref)
    keys = list(ref.state_dict())
    out, report = fm.fuse_gated_mlps(fused, backend=backend, report=True)
    assert out is fused
    mlps = [layer.mlp for layer in fused.model.layers]
    assert len(report.swapped) == TINY["num_hidden_layers"], str(report)
    assert all(isinstance(m, (fm.GatedMLP, fm.GatedMLPView)) for m in mlps), str(report)
    assert all(m.activation == MODELS[name][3] for m in mlps)
    assert list(fused.state_dict()) == keys  # loadable both ways
    fused.load_state_dict(ref.state_dict())
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2))
    check_same(ref, fused, lambda: ids.to(DEVICE), dtype)


def test_phi3_packed_gate_up_is_a_view():
    model = build("phi3", torch.float32)
    packed = model.model.layers[0].mlp.gate_up_proj.weight
    fm.fuse_gated_mlps(model)
    mlp = model.model.layers[0].mlp
    assert isinstance(mlp, fm.GatedMLPView)
    wg, wu, _, _ = mlp.gate_up_params()
    h, d = wg.shape
    assert mlp.gate_up_proj.weight is packed
    assert wg.data_ptr() == packed.data_ptr()  # gate first, as Phi-3's chunk(2)
    assert wu.data_ptr() == packed.data_ptr() + h * d * packed.element_size()


def test_parametrized_projections_are_left_and_wrapped_after_fusing_raise():
    """A real Llama whose layer-0 up_proj carries a parametrization (as weight-norm or an
    adapter would) keeps that MLP, with the reason; the other layer fuses. Parametrizing a
    projection of the fused layer afterwards makes its call a TypeError naming it."""
    from torch.nn.utils import parametrize

    class Twice(nn.Module):
        def forward(self, w):
            return 2 * w

    model = build("llama", torch.float32)
    parametrize.register_parametrization(model.model.layers[0].mlp.up_proj, "weight", Twice())
    _, report = fm.fuse_gated_mlps(model, report=True)
    assert len(report.swapped) == 1 and "ParametrizedLinear" in report.left[0].reason
    assert not isinstance(model.model.layers[0].mlp, fm.GatedMLP)
    fused = model.model.layers[1].mlp
    assert isinstance(fused, fm.GatedMLP)
    parametrize.register_parametrization(fused.down_proj, "weight", Twice())
    ids = torch.randint(0, TINY["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(2))
    with pytest.raises(TypeError, match=r"GatedMLP\.down_proj: expected the nn.Linear"):
        model(ids.to(DEVICE))


def test_transformers_activation_classes_fuse():
    """Every ACT2FN entry that computes silu, gelu or gelu_tanh fuses in a gate/up/down MLP,
    whatever its class; the others are left, with the reason."""
    transformers = pytest.importorskip("transformers")
    from transformers.activations import ACT2FN

    class MLP(nn.Module):  # the user's own gate/up/down module
        def __init__(self, act):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(8, 16), nn.Linear(8, 16)
            self.down_proj = nn.Linear(16, 8)
            self.act_fn = act

    expected = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_python": "gelu",
                "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_python_tanh": "gelu_tanh"}
    for key in expected:
        m = fm.fuse_gated_mlps(nn.Sequential(MLP(ACT2FN[key])))
        assert isinstance(m[0], fm.GatedMLP) and m[0].activation == expected[key], key
    for key in ("quick_gelu", "relu", "relu2", "mish"):
        with pytest.warns(UserWarning, match="nothing swapped"):
            m, rep = fm.fuse_gated_mlps(nn.Sequential(MLP(ACT2FN[key])), report=True)
        assert isinstance(m[0], MLP) and rep.left and rep.left[0].reason, key
    assert transformers.__version__


def test_moe_experts_are_reported_and_left():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen2MoeConfig(**TINY, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=32,
                                      shared_expert_intermediate_size=64)
    model = transformers.Qwen2MoeForCausalLM(cfg)
    _, report = fm.fuse_gated_mlps(model, report=True)
    moe = [c for c in report.left if "MoE" in c.reason]
    assert len(moe) == TINY["num_hidden_layers"], str(report)
    # the dense shared expert of each layer is an ordinary gated MLP: swapped
    assert len(report.swapped) == TINY["num_hidden_layers"], str(report)


# --- timm and torchvision (installed where torchvision matches torch: the GPU machine) ----
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b or "auto")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_timm_vit_mlps_fuse(dtype, backend):
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    ref = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                            num_classes=10).to(DEVICE, dtype).eval()
    fused = copy.deepcopy(ref)
    keys = list(ref.state_dict())
    _, report = fm.fuse_mlps(fused, backend=backend, report=True)
    assert len(report.swapped) == len(ref.blocks), str(report)
    assert list(fused.state_dict()) == keys
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    check_same(ref, fused, lambda: x.to(DEVICE, dtype), dtype)


@pytest.mark.parametrize("cls", ["GluMlp", "SwiGLU", "SwiGLUPacked"])
def test_timm_gated_mlps_fuse(cls):
    timm = pytest.importorskip("timm")
    from timm.layers import mlp as timm_mlp

    torch.manual_seed(0)
    make = getattr(timm_mlp, cls)
    kw = {"act_layer": nn.SiLU} if cls == "GluMlp" else {}
    ref = make(32, 64 if cls != "SwiGLU" else 48, **kw).to(DEVICE)
    for p in ref.parameters():  # no structure in the weights for a swapped half to hide in
        nn.init.normal_(p)
    model = nn.Sequential(copy.deepcopy(ref))
    out, report = fm.fuse_mlps(model, report=True)
    assert isinstance(out[0], fm.GatedMLPView), str(report)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    check_same(nn.Sequential(ref), out, lambda: x, torch.float32)
    # GluMlp's default gate is a sigmoid, which the gated op does not run: left, with why
    with pytest.warns(UserWarning):
        _, rep = fm.fuse_mlps(nn.Sequential(timm_mlp.GluMlp(32, 64)), report=True)
    assert "sigmoid" in rep.left[0].reason
    assert timm.__version__


def test_timm_mlp_with_norm_or_dropout_is_left():
    pytest.importorskip("timm")
    from timm.layers import Mlp

    for m, why in ((Mlp(16, 32, norm_layer=nn.LayerNorm), "norm"), (Mlp(16, 32, drop=0.1),
                                                                    "dropout")):
        with pytest.warns(UserWarning):
            out, rep = fm.fuse_mlps(nn.Sequential(m), report=True)
        assert isinstance(out[0], Mlp) and why in rep.left[0].reason


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torchvision_mlp_fuses(dtype):
    ops = pytest.importorskip("torchvision.ops")
    torch.manual_seed(0)
    ref = nn.Sequential(ops.MLP(12, [32, 32, 5], inplace=True)).to(DEVICE, dtype)
    fused = copy.deepcopy(ref)
    keys = list(ref.state_dict())
    _, report = fm.fuse_mlps(fused, report=True)
    assert isinstance(fused[0], fm.FusedMLP), str(report)
    assert list(fused.state_dict()) == keys
    x = torch.randn(7, 12, generator=torch.Generator().manual_seed(5))
    check_same(ref, fused, lambda: x.to(DEVICE, dtype), dtype)
    with pytest.warns(UserWarning):
        _, rep = fm.fuse_mlps(ops.MLP(12, [32, 5], dropout=0.1), report=True)
    assert "dropout" in rep.left[0].reason
