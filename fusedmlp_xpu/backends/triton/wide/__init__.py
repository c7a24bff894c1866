"""The wide family: layers of any width (transformer FFNs, gated MLPs) as one GEMM a layer
with the bias, the activation and, for gated MLPs, the gate product fused in the epilogue.

    gemm_kernels.py   the Triton GEMM kernels of linear layers (pointer and TMA, stream-K)
    gated_kernels.py  the Triton kernels of the gated MLP
    hopper_gemm.py    the backward's dx and gated dh GEMMs on sm_90: Gluon, warp-specialized
    configs.py        autotune tile lists per vendor, TMA tiles, activation ids
    tma.py            when and how a GEMM runs through TMA descriptors
    cublas.py         where a GEMM is cuBLAS instead (torch.mm, cuBLASLt epilogues)
    layers.py         fused_mlp's wide forward and backward, layer by layer
    gated.py          the gated MLP's forward and backward

The names below are the family's interface to the backend and the gated module.
"""
from .configs import GATE_ACTIVATIONS, act_id, available, interpreting, supports_device
from .gated import gated_backward, gated_forward, gated_hidden
from .layers import backward, forward, grad_input, grad_weight, linear

__all__ = ["GATE_ACTIVATIONS", "act_id", "available", "interpreting", "supports_device",
           "gated_backward", "gated_forward", "gated_hidden", "backward", "forward",
           "grad_input", "grad_weight", "linear"]
