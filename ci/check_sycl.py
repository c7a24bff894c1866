"""The sycl backend's self-check for CI: build the host shim, compile the SYCL kernels and
run forward + backward once per dtype on opencl:cpu against the reference through the op.
Prints the reason and exits 1 when the backend cannot run, so that a missing compiler or
runtime fails CI instead of skipping the SYCL tests.

    python ci/check_sycl.py
"""
from __future__ import annotations

import sys
import time

import torch

import fusedmlp_xpu as fm
from fusedmlp_xpu.backends.sycl import DTYPE_CODES


def check() -> int:
    """0 when the sycl backend runs on opencl:cpu and matches the reference, else 1."""
    ok, why = fm.dispatch.availability("sycl")
    if ok:
        ok, why = fm.dispatch.REGISTRY["sycl"].supports(fm.MLPSpec((16, 16)), torch.device("cpu"))
    print(f"sycl: {'yes' if ok else 'no'}: {why}")
    if not ok:
        return 1
    for dtype in DTYPE_CODES:
        ws = [(torch.rand(32, 16) - 0.5).to(dtype).requires_grad_(),
              (torch.rand(8, 32) - 0.5).to(dtype).requires_grad_()]
        x = torch.randn(100, 16, dtype=dtype)
        t0 = time.perf_counter()
        y = fm.fused_mlp(x, ws, None, "gelu", backend="sycl")
        (g,) = torch.autograd.grad(y.float().sum(), ws[0])
        dt = time.perf_counter() - t0
        y_ref = fm.fused_mlp(x, ws, None, "gelu", backend="reference")
        (g_ref,) = torch.autograd.grad(y_ref.float().sum(), ws[0])
        err = max(((a.float() - b.float()).norm() / b.float().norm()).item()
                  for a, b in ((y, y_ref), (g, g_ref)))
        print(f"  {str(dtype):<15} fwd+bwd {dt * 1e3:8.1f} ms  rel. error vs reference {err:.1e}")
        if not err < 2e-2:
            return 1
    return 0



if __name__ == "__main__":
    sys.exit(check())
