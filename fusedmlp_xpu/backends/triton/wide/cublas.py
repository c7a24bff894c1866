"""Where the wide layers take cuBLAS (torch.mm, addmm, cuBLASLt's fused epilogues) instead
of a Triton kernel: the backward GEMMs with nothing to fuse, and forward layers with no z
to store whose epilogue cuBLASLt has, from BLAS_FWD_MIN_ROWS rows (measurements below).
FUSEDMLP_WIDE_BLAS=0 keeps every GEMM on the Triton kernels."""
from __future__ import annotations

import torch

from .... import envvars


#: Rows from which an inference layer whose epilogue cuBLAS(Lt) has runs as that torch op
#: on CUDA (_blas_linear). H200, bf16, wide-gelu's layers, device-bound back-to-back calls
#: (NOTES.md wide history 14 and 16; h200-probe-blas-fwd-20261201.json, -20261201b):
#: the second layer, torch.addmm with its bias, 39.3 / 38.1 / 37.9 / 38.3 us at 16 / 32 /
#: 48 / 64 rows against the Triton kernel's 38.6 / 42.0 / 53.7 / 54.0; the first,
#: cuBLASLt's bias + GELU(tanh), 37.1 / 37.7 / 38.5 / 38.6 against the Triton kernel's
#: (hardware tanh) 39.4 / 39.1 / 42.1 / 41.8. The whole block at 16 rows from Python, where
#: the host sets the pace, went from 0.077 to 0.095-0.124 ms with both layers on cuBLAS(Lt)
#: (eager 0.080-0.086; h200-wide-small-20261201b.json): 16 rows and fewer keep the Triton
#: kernels' lean launches. From 17 rows cuBLAS takes these layers up to the TMA kernels'
#: range, where only the hardware tanh's GELU stays on Triton (BLAS_LT_GELU_MAX_ROWS).
BLAS_FWD_MIN_ROWS = 17


#: Up to these rows cuBLASLt's bias + GELU(tanh) takes the layer even where the Triton
#: kernel has the hardware tanh (faster from 8192 rows: h200-probe-approx-20261201.json;
#: from 65 to 4096 rows not timed, so the kernel keeps them)
BLAS_LT_GELU_MAX_ROWS = 64


#: the activations cuBLASLt's epilogues apply after the bias (torch._addmm_activation)
_BLAS_EPILOGUES = ("gelu_tanh", "relu")


def _blas_linear(x, w, b, act: str):
    """act(x w^T + b) as one torch op: torch.mm, torch.addmm (bias epilogue), or
    torch._addmm_activation (bias + GELU(tanh) or ReLU epilogue, cuBLASLt)."""
    if act == "none":
        return torch.mm(x, w.t()) if b is None else torch.addmm(b, x, w.t())
    return torch._addmm_activation(b, x, w.t(), use_gelu=act == "gelu_tanh")


def _blas_forward_ok(act: str, has_b: bool) -> bool:
    """Whether _blas_linear computes this layer in one op."""
    return act == "none" or (has_b and act in _BLAS_EPILOGUES
                             and hasattr(torch, "_addmm_activation"))


#: FUSEDMLP_WIDE_BLAS=0: the GEMMs with nothing to fuse take the Triton kernels on CUDA too
BLAS_ENV = "FUSEDMLP_WIDE_BLAS"


def _blas(device: torch.device) -> bool:
    """Whether a backward GEMM with nothing to fuse (no prologue: the layer has no output
    activation; no epilogue: a weight gradient, or the input gradient of a layer with no
    input activation, such as the first layer's or the gated dx = dg Wg + du Wu) is
    torch.mm (cuBLAS) on this device rather than a Triton pointer kernel. On CUDA it is.
    cuBLAS ran the wide-swiglu train step's three weight gradients in 4.02 ms of device
    time where the Triton kernel took 4.26-4.39 (H200, M 8192;
    h200-wide-kernels-20261130e.json against -c, -d), and a decode-sized one (K = 16
    rows) in 41 us against 64 (NOTES.md wide history 6). Per GEMM, each pair timed twice
    in turn (h200-probe-blas-20261130.json, M 8192, d 4096, hidden 14336): the gated dx
    2.75-2.77 ms as torch.mm + addmm_ against 2.87 for the dual Triton kernel; a dx with
    no activation 1.37-1.50 against 1.42, a dW 1.38-1.48 against 1.43-1.44 (level).
    Forward layers with no z to store whose epilogue cuBLAS(Lt) has (BLAS_FWD_MIN_ROWS,
    _blas_linear) follow the same switch. Elsewhere (XPU, the interpreter) the Triton
    kernels run."""
    return device.type == "cuda" and envvars.get(BLAS_ENV, "1") != "0"
