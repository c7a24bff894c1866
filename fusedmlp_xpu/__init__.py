"""fusedmlp_xpu: one fused multi-layer-perceptron op for PyTorch on cuda, xpu and cpu."""
from __future__ import annotations

import torch

from . import activations, dispatch, tcnn
from .dispatch import BackendUnavailableError, backends
from .convert import FusionReport, fuse_gated_mlps, fuse_mlps
from .export import export_decompositions
from .gated import GatedMLP, GatedMLPView, fused_gated_mlp
from .module import FusedMLP
from .op import fused_mlp
from .spec import MLPSpec
from .warmup import warmup

from ._version import __version__

def _register_optional_backends() -> None:
    """Backends whose dependencies may be missing register even so: their modules import
    only torch at the top, and availability (and why not) is reported by backends() and
    explain(). A module that fails to import is left out rather than breaking import."""
    import importlib

    for module, cls in (("triton", "TritonBackend"), ("sycl", "SyclBackend"),
                        ("cuda", "CudaBackend")):
        try:
            mod = importlib.import_module(f".backends.{module}", __name__)
        except Exception:  # pragma: no cover - belt and braces
            continue
        dispatch.register(getattr(mod, cls)())


_register_optional_backends()
__all__ = ["FusedMLP", "fused_mlp", "fuse_mlps", "GatedMLP", "fused_gated_mlp",
           "fuse_gated_mlps", "GatedMLPView", "FusionReport", "explain", "backends", "MLPSpec",
           "BackendUnavailableError", "activations", "tcnn", "warmup", "export_decompositions",
           "__version__"]


def explain(mlp_or_spec, x: torch.Tensor, backend: str | None = None, *,
            train: bool = False) -> dispatch.Explanation:
    """Which backend would run ``mlp_or_spec`` on input ``x``, and why the others would not.

    mlp_or_spec: a FusedMLP, GatedMLP(View) or an MLPSpec; x: a sample input (its device and
    dtype count). ``train``: the choice for training calls (a forward autograd will
    differentiate, and its backward), which an inference-only backend does not take.
    """
    if not isinstance(train, bool):
        raise TypeError(f"train: expected a bool, got {type(train).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if isinstance(mlp_or_spec, (GatedMLP, GatedMLPView)):
        from . import gated

        if isinstance(mlp_or_spec, GatedMLPView):
            wg, _, bg, _ = mlp_or_spec.gate_up_params()
            d_out = mlp_or_spec._modules[mlp_or_spec._down].weight.shape[0]
        else:
            wg, bg = mlp_or_spec.gate_proj.weight, mlp_or_spec.gate_proj.bias
            d_out = mlp_or_spec.down_proj.weight.shape[0]
        spec = MLPSpec((wg.shape[1], wg.shape[0], d_out), mlp_or_spec.activation, "none",
                       bg is not None, x.dtype)
        return gated.explain_choice(x.device, spec, backend or mlp_or_spec.backend)
    if isinstance(mlp_or_spec, FusedMLP):
        spec = mlp_or_spec.spec(x.dtype)
        backend = backend or mlp_or_spec.backend
    elif isinstance(mlp_or_spec, MLPSpec):
        spec = mlp_or_spec
    else:
        raise TypeError(f"mlp_or_spec: expected FusedMLP, GatedMLP or MLPSpec, "
                        f"got {type(mlp_or_spec).__name__}")
    return dispatch.explain_choice(x.device, spec, dispatch.requested(backend), train)
