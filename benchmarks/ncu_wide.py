"""The wide backward GEMMs once each, inside NVTX ranges, for Nsight Compute:
wide-gelu's hidden-layer input gradient with the gelu' epilogue and h stored
(wide.grad_input: on sm_90 the warp-specialized Gluon kernel), the same GEMM without an
epilogue (the pointer kernel and cuBLAS), and wide-swiglu's dh GEMM with its dg, du
epilogue (hopper_gemm.launch_ws) beside cuBLAS at its shape. Every kernel is warmed up
(autotuned) before the ranges.

    ncu --nvtx --nvtx-include "measure/" --section SpeedOfLight ... \\
        python3 benchmarks/ncu_wide.py
"""
import torch

from fusedmlp_xpu.backends.triton import wide
from fusedmlp_xpu.backends.triton.wide import hopper_gemm


def main():
    dev, dt = torch.device("cuda"), torch.bfloat16
    m, d, hid = 8192, 4096, 16384
    torch.manual_seed(0)
    g2 = torch.randn(m, d, device=dev, dtype=dt)
    w2 = torch.randn(d, hid, device=dev, dtype=dt) / hid ** 0.5
    z1 = torch.randn(m, hid, device=dev, dtype=dt)
    hs = 14336
    wd = torch.randn(d, hs, device=dev, dtype=dt) / hs ** 0.5
    gg, uu = (torch.randn(m, hs, device=dev, dtype=dt) for _ in range(2))
    dg, du = torch.empty_like(gg), torch.empty_like(gg)
    silu = wide.configs.act_id("silu", dev, dt)
    cases = {
        "dx_gelu_h": lambda: wide.layers.grad_input(g2, w2, z1, "gelu_tanh", store_h=True),
        "dx_gelu": lambda: wide.layers.grad_input(g2, w2, z1, "gelu_tanh"),
        "dx_plain": lambda: wide.layers.grad_input(g2, w2),
        "cublas": lambda: g2 @ w2,
        "gated_dh": lambda: hopper_gemm.launch_ws(hopper_gemm.GATED, silu, g2, wd, gg, uu, dg,
                                                 du, None),
        "cublas_gated_shape": lambda: torch.mm(g2, wd, out=dg),
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
