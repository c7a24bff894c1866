"""Probe: the backward GEMMs with nothing to fuse, Triton pointer kernels against torch.mm
(cuBLAS), the package's switch (wide.BLAS_ENV) toggled, each pair timed twice in turn.

wide-swiglu's shapes by default (bf16, M 8192, d 4096, hidden 14336): the gated input
gradient dx = dg Wg + du Wu (the dual Triton kernel, or torch.mm then addmm_), one
input gradient with no activation (dx = g W, a first layer's), and one weight gradient
(dW = g^T x). Every result is checked against torch in fp32 before it is timed.

    PYTHONPATH=. python3 benchmarks/probe_blas.py --out probe-blas.json
"""
from __future__ import annotations

import os

import torch

from fusedmlp_xpu.backends.triton import wide
from probe_common import Probe, gemm_args


def main():
    ap = gemm_args()
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    M, D, H = args.m, args.d, args.hidden
    probe = Probe(m=M)
    torch.manual_seed(0)
    dg, du = (torch.randn(M, H, device=dev, dtype=dt) for _ in range(2))
    wg, wu = (torch.randn(H, D, device=dev, dtype=dt) / H ** 0.5 for _ in range(2))
    x = torch.randn(M, D, device=dev, dtype=dt)
    cases = [
        ("gated dx = dg Wg + du Wu", dg.float() @ wg.float() + du.float() @ wu.float(),
         lambda: wide.grad_input(dg, wg, g2=du, w2=wu)[0], 4 * M * H * D),
        ("dx = g W, no activation", dg.float() @ wg.float(),
         lambda: wide.grad_input(dg, wg)[0], 2 * M * H * D),
        ("dW = g^T x", dg.float().t() @ x.float(),
         lambda: wide.grad_weight(dg, x)[0], 2 * M * H * D),
    ]
    for name, ref, call, flop in cases:
        for rep in (1, 2):
            for blas in ("1", "0"):
                os.environ[wide.BLAS_ENV] = blas
                probe.rec(("torch.mm" if blas == "1" else "Triton kernel") + f" #{rep}", call,
                          ref, flop, case=name, width=20)
    os.environ[wide.BLAS_ENV] = "1"
    probe.write(args.out, dev)


if __name__ == "__main__":
    main()
