"""The wide-gelu backward GEMMs once each, inside NVTX ranges, for Nsight Compute:
the hidden layer's input gradient with the gelu' epilogue and h stored (wide.grad_input),
the same GEMM without an epilogue (the pointer kernel and cuBLAS). Every kernel is warmed
up (autotuned) before the ranges.

    ncu --nvtx --nvtx-include "measure/" --section SpeedOfLight ... \\
        python3 benchmarks/ncu_wide.py
"""
import torch

from fusedmlp_xpu.backends.triton import wide


def main():
    dev, dt = torch.device("cuda"), torch.bfloat16
    m, d, hid = 8192, 4096, 16384
    torch.manual_seed(0)
    g2 = torch.randn(m, d, device=dev, dtype=dt)
    w2 = torch.randn(d, hid, device=dev, dtype=dt) / hid ** 0.5
    z1 = torch.randn(m, hid, device=dev, dtype=dt)
    cases = {
        "dx_gelu_h": lambda: wide.grad_input(g2, w2, z1, "gelu_tanh", store_h=True),
        "dx_gelu": lambda: wide.grad_input(g2, w2, z1, "gelu_tanh"),
        "dx_plain": lambda: wide.grad_input(g2, w2),
        "cublas": lambda: g2 @ w2,
    }
    for fn in cases.values():  # autotune, compile
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    for name, fn in cases.items():
        torch.cuda.nvtx.range_push("measure")
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
