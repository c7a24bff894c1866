"""Checks of the SYCL kernel sources beyond the shared suite (which runs them through the
op): the XMX variant, never run here, must at least keep passing the SYCL front end."""
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
def test_xmx_source_passes_the_front_end():
    """With FUSEDMLP_SYCL_XMX=1 the runtime compiles fused_mlp_xmx.hpp along with the
    portable source: on opencl:cpu that parses and type-checks it (the CPU gets no XMX
    kernel, so the portable one runs). A fresh process, as the kernel cache is per process."""
    code = (
        "import torch, fusedmlp_xpu as fm\n"
        "w = [torch.randn(16, 16, dtype=torch.float16)]\n"
        "x = torch.randn(5, 16, dtype=torch.float16)\n"
        "y = fm.fused_mlp(x, w, None, 'relu', backend='sycl')\n"
        "r = fm.fused_mlp(x, w, None, 'relu', backend='reference')\n"
        "assert torch.allclose(y.float(), r.float(), atol=1e-2), (y, r)\n"
    )
    # On a CPU with AMX, Intel's OpenCL CPU compiler lowers the joint_matrix code to AMX
    # tiles and dies in instruction selection ("Cannot select: intrinsic
    # llvm.x86.tilezero.internal"): target AVX-512 without AMX, as the check is of the
    # source, not of the CPU's matrix unit.
    env = dict(os.environ, **{sycl.XMX_ENV: "1", "CL_CONFIG_CPU_TARGET_ARCH": "skx"})
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]


@needs_sycl_cpu
def test_forced_sycl_over_width_limit_is_an_error():
    """Past the fused kernel's width limit a forced sycl raises, giving the limit."""
    import fusedmlp_xpu as fm

    w = [torch.randn(sycl.MAX_WIDTH + 1, 8)]
    with pytest.raises(fm.BackendUnavailableError, match="over the fused kernel's limit"):
        fm.fused_mlp(torch.randn(2, 8), w, backend="sycl")
