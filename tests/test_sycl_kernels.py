"""Checks of the SYCL backend beyond the shared suite (which runs its kernels through the
op): the ESIMD path's configuration rules, packing and SPIR-V loading."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch

from conftest import BACKENDS

sycl = importlib.import_module("fusedmlp_xpu.backends.sycl")

needs_sycl_cpu = pytest.mark.skipif(
    ("sycl", torch.device("cpu")) not in BACKENDS,
    reason="the sycl backend cannot run on opencl:cpu here (see `fusedmlp info`)")


@needs_sycl_cpu
def test_forced_sycl_over_width_limit_is_an_error():
    """Past the fused kernel's width limit a forced sycl raises, giving the limit."""
    import fusedmlp_xpu as fm

    w = [torch.randn(sycl.MAX_WIDTH + 1, 8)]
    with pytest.raises(fm.BackendUnavailableError, match="over the fused kernel's limit"):
        fm.fused_mlp(torch.randn(2, 8), w, backend="sycl")
