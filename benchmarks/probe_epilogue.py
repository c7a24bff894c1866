"""Probe: the GEMMs with heavy epilogues, one tile config at a time, pointer kernels
against the persistent TMA kernels whose epilogue tiles move through descriptors.

- wide-gelu's hidden-layer input gradient: (g2 W2) * gelu'(z1), h1 = gelu(z1) stored
  (wide.grad_input with store_h; M 8192, 4096 -> 16384);
- wide-swiglu's dh GEMM with the gate epilogue: dg = dh u act'(g), du = dh act(g)
  (the gated_bwd kernel through wide.gated_backward's launch; M 8192, 4096 -> 14336),
  and the TMA kernel also storing h = act(g) u, against torch rebuilding h on its own;
- the training forwards: wide-gelu's first layer storing z (wide.linear, save_z) and
  wide-swiglu's gated GEMM storing g and u (wide.gated_hidden, save).

Each config is forced (the autotuner sees a list of one), checked against torch in fp32,
and timed (triton.testing.do_bench, median). ncu showed the 128x256 / 8-warp pick of the
first spilling registers in its epilogue (h200-ncu-wide-dx-20261130.txt): 16 warps halve
the accumulator per thread; a subtiled epilogue ("sub") takes the tile in two halves.

    PYTHONPATH=. python3 benchmarks/probe_epilogue.py --out probe-epilogue.json
"""
from __future__ import annotations

import argparse

import torch

from fusedmlp_xpu.backends.triton import wide
from probe_common import Probe, dx_operands

F = torch.nn.functional
DX = [(128, 256, 64, 8, 3), (128, 256, 64, 16, 3)]
# TMA kernels with a SUBTILE epilogue: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, subtile)
DX_TMA = [(128, 128, 64, 8, 4, False), (128, 128, 64, 8, 4, True), (128, 128, 64, 16, 4, False),
          (128, 128, 64, 16, 4, True), (128, 256, 64, 16, 3, True)]
GATED = [(128, 128, 64, 8, 4)]
GATED_TMA = [(128, 128, 64, 8, 4, False), (128, 128, 64, 8, 4, True),
             (128, 128, 64, 8, 3, True), (128, 128, 64, 16, 4, False),
             (128, 128, 64, 16, 4, True), (128, 256, 64, 16, 3, True)]
FWD_Z_TMA = [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 2)]
GATED_GU_TMA = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--m", type=int, default=8192)
    args = ap.parse_args()
    # cuda:0, not "cuda": launches read the device index
    dev, dt, m = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16, args.m
    torch.manual_seed(0)
    probe = Probe(m=m)

    def rec(case, name, fn, ref, flop):
        probe.rec(name, fn, ref, flop, case=case, width=34)

    real = wide._configs_nvidia

    def tma(case, cfg, call, ref, flop):
        wide._TMA_FIT.clear()
        name = "TMA {}x{}x{} w{} st{}".format(*cfg) + (" sub" if cfg[5:] == (True,) else "")
        rec(case, name, lambda: call(cfg) or (_ for _ in ()).throw(RuntimeError("no fit")),
            ref, flop)
        probe.note_fit(name)

    def forced(kernel, cfg):
        wide._configs_nvidia = lambda dual: [wide._cfg(*cfg)]
        wide._tuned.pop((kernel, "nvidia"), None)

    d, hid = 4096, 16384
    g2, w2, z1, zf, dgelu = dx_operands(m, d, hid, dev, dt)
    ref = (g2.float() @ w2.float() * dgelu, F.gelu(zf, approximate="tanh"))
    flop = 2 * m * d * hid
    case = "dx (g2 W2) gelu'(z1), h1 stored"
    rec(case, "cuBLAS g2 @ W2 (no epilogue)", lambda: g2 @ w2, g2.float() @ w2.float(), flop)
    for cfg in DX:
        forced("dx", cfg)
        rec(case, "{}x{}x{} w{} st{}".format(*cfg),
            lambda: wide.grad_input(g2, w2, z1, "gelu_tanh", store_h=True), ref, flop)
    out, h = torch.empty_like(z1), torch.empty_like(z1)
    for cfg in DX_TMA:
        tma(case, cfg, lambda c: wide._dx_tma(g2, w2, z1, out, h, "gelu_tanh", c) and (out, h),
            ref, flop)

    d, hid = 4096, 14336
    gy = torch.randn(m, d, device=dev, dtype=dt)
    wd = torch.randn(d, hid, device=dev, dtype=dt) / hid ** 0.5
    g = torch.randn(m, hid, device=dev, dtype=dt)
    u = torch.randn(m, hid, device=dev, dtype=dt)
    dh = gy.float() @ wd.float()
    gf = g.float()
    sg = torch.sigmoid(gf)
    ref = (dh * u.float() * (sg * (1 + gf * (1 - sg))), dh * F.silu(gf))
    flop = 2 * m * d * hid
    case = "gated dh = gy Wd; dg, du epilogue"
    dg, du = torch.empty_like(g), torch.empty_like(u)

    def gated_bwd():
        M, H = g.shape
        wide._kernel("gated_bwd", dev).launch(
            wide._grid(M, H), (gy, wd, g, u, dg, du, M, H, d, wide._bucket(M),
                               gy.stride(0), gy.stride(1), wd.stride(1), wd.stride(0),
                               g.stride(0), g.stride(1), u.stride(0), u.stride(1),
                               dg.stride(0), dg.stride(1), du.stride(0), du.stride(1)),
            dict(ACT=wide._ACT["silu"], **wide._meta(g)), dev)
        return dg, du
    rec(case, "cuBLAS gy @ Wd (no epilogue)", lambda: gy @ wd, dh, flop)
    for cfg in GATED:
        forced("gated_bwd", cfg)
        rec(case, "{}x{}x{} w{} st{}".format(*cfg), gated_bwd, ref, flop)
    for cfg in GATED_TMA[:1]:
        tma(case, cfg, lambda c: wide._gated_bwd_tma(gy, wd, g, u, dg, du, "silu", c)
            and (dg, du), ref, flop)
    case = "gated dh = gy Wd; dg, du epilogue, h = silu(g) u stored"
    h = torch.empty_like(g)
    for cfg in GATED_TMA:
        tma(case, cfg, lambda c: wide._gated_bwd_tma(gy, wd, g, u, dg, du, "silu", c, h)
            and (dg, du, h), (*ref, F.silu(gf) * u.float()), flop)
    rec(case, "torch silu(g) * u alone (not a GEMM)", lambda: F.silu(g) * u,
        F.silu(gf) * u.float(), flop)
    wide._configs_nvidia = real

    # the training forwards (epilogues that store z, or g and u, through descriptors)
    d, hid = 4096, 16384
    x = torch.randn(m, d, device=dev, dtype=dt)
    w = torch.randn(hid, d, device=dev, dtype=dt) / d ** 0.5
    b = torch.randn(hid, device=dev, dtype=dt)
    z = x.float() @ w.float().t() + b.float()
    ref, flop = (F.gelu(z, approximate="tanh"), z), 2 * m * d * hid
    case = "fwd gelu(x W^T + b), z stored"
    rec(case, "cuBLAS x @ W^T (no epilogue)", lambda: x @ w.t(), z - b.float(), flop)
    real_cfg = wide._tma_config_nvidia
    for cfg in FWD_Z_TMA:
        wide._tma_config_nvidia = lambda kind, cfg=cfg: cfg
        wide._linear_plan.cache_clear()
        tma(case, cfg, lambda c: wide.linear(x, w, b, "gelu_tanh", True), ref, flop)
    hid = 14336
    wg = torch.randn(hid, d, device=dev, dtype=dt) / d ** 0.5
    wu = torch.randn(hid, d, device=dev, dtype=dt) / d ** 0.5
    gf, uf = x.float() @ wg.float().t(), x.float() @ wu.float().t()
    ref, flop = (F.silu(gf) * uf, gf, uf), 4 * m * d * hid
    case = "gated fwd, g and u stored (interleave copy included)"
    rec(case, "cuBLAS x @ Wg^T (one of two, no epilogue)", lambda: x @ wg.t(), gf, flop / 2)
    for cfg in GATED_GU_TMA:
        wide._tma_config_nvidia = lambda kind, cfg=cfg: cfg
        wide._gated_plan.cache_clear()
        tma(case, cfg, lambda c: (lambda r: (r[0], *r[1]))(
            wide.gated_hidden(x, wg, wu, "silu", True)), ref, flop)
    wide._tma_config_nvidia = real_cfg
    probe.write(args.out, dev)


if __name__ == "__main__":
    main()
