"""Probe: the gated GEMM h = act(x Wg^T) * (x Wu^T) as ONE TMA GEMM over the interleaved
weights, read in place through one pair descriptor (wide._gated_fwd_tma_kernel,
wide.weight_pair) or from an interleaved copy, against the package's current gated kernel (two
accumulators, pointer loads, autotuned) and cuBLAS, for inference and for the training
forward (which also stores g and u).

wide-swiglu's shape by default (bf16, x 8192 x 4096, hidden 14336). Tiles are
(BLOCK_M, BLOCK_N of h, BLOCK_K, warps, stages); the weight tile has 2 BLOCK_N rows.
Every result is checked against torch in fp32 before it is timed; the interleaving copy
(wide.interleave) is timed on its own.

    PYTHONPATH=. python3 benchmarks/probe_gated_tma.py --out probe-gated.json
"""
from __future__ import annotations

import os

import torch

from fusedmlp_xpu.backends.triton import wide
from probe_common import Probe, gemm_args

F = torch.nn.functional
TILES = {False: [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 8, 4),
                 (256, 64, 64, 8, 3)],
         True: [(128, 64, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 8, 2),
                (128, 64, 64, 8, 3)]}


def main():
    ap = gemm_args()
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), getattr(torch, args.dtype)
    M, K, H = args.m, args.d, args.hidden
    torch.manual_seed(0)
    x = torch.randn(M, K, device=dev, dtype=dt)
    wg = torch.randn(H, K, device=dev, dtype=dt) / K ** 0.5
    wu = torch.randn(H, K, device=dev, dtype=dt) / K ** 0.5
    bg, bu = torch.randn(H, device=dev, dtype=dt), torch.randn(H, device=dev, dtype=dt)
    wcat = torch.cat((wg, wu))
    wi = wide.interleave(wg, wu)
    gf, uf = x.float() @ wg.float().t(), x.float() @ wu.float().t()
    ref = F.silu(gf) * uf
    flop = 4 * M * H * K
    probe = Probe(m=M, k=K, hidden=H)

    def rec(name, fn, want=ref):
        probe.rec(name, fn, want, flop)

    rec("cuBLAS x Wg^T (one of the two bare GEMMs)", lambda: x @ wg.t(), gf)
    rec("cuBLAS x [Wg; Wu]^T", lambda: (x @ wcat.t())[:, :H], gf)
    rec("eager silu(x Wg^T) * x Wu^T", lambda: F.silu(x @ wg.t()) * (x @ wu.t()))
    rec("interleave copy (not a GEMM)", lambda: wide.interleave(wg, wu),
        wi.float())
    def pointer(save):
        """gated_hidden with the TMA path switched off: the two-accumulator kernel."""
        def call():
            os.environ[wide.TMA_ENV] = "0"
            try:
                h, gu = wide.gated_hidden(x, wg, wu, "silu", save)
            finally:
                del os.environ[wide.TMA_ENV]
            return (h, *gu) if save else h
        return call

    rec("pointer kernel (autotuned)", pointer(False))
    rec("pointer kernel (autotuned) +g,u", pointer(True), (ref, gf, uf))

    real_pair = wide.weight_pair

    def tma(cfg, save, bias=False, in_place=True):
        """The kernel reading Wg, Wu in place (one pair descriptor), or with in_place
        False from their interleaved copy made in the call (the fallback)."""
        h = torch.empty(M, H, device=dev, dtype=dt)
        g = torch.empty(M, H, device=dev, dtype=dt) if save else None
        u = torch.empty(M, H, device=dev, dtype=dt) if save else None

        def call():
            wide.weight_pair = real_pair if in_place else (lambda a, b: None)
            try:
                if not wide._gated_tma(x, wg, wu, bg if bias else None, bu if bias else None,
                                       "silu", h, g, u, cfg):
                    raise RuntimeError("no stage count fits")
            finally:
                wide.weight_pair = real_pair
            return (h, g, u) if save else h
        return call

    for save in (False, True):
        for cfg in TILES[save]:
            wide._TMA_FIT.clear()
            name = "tma {}x{}x{} w{} st{}".format(*cfg) + (" +g,u" if save else "")
            rec(name, tma(cfg, save), (ref, gf, uf) if save else ref)
            probe.note_fit(name)
    for save in (False, True):
        cfg = TILES[save][1 if save else 0]
        name = "tma {}x{}x{} w{} st{}".format(*cfg) + (" +g,u" if save else "")
        rec(name + ", interleaved copy in the call", tma(cfg, save, in_place=False),
            (ref, gf, uf) if save else ref)
    gb, ub = gf + bg.float(), uf + bu.float()
    rec("tma 128x128x64 w8 st3, biases", tma(TILES[False][0], False, True), F.silu(gb) * ub)
    probe.write(args.out, dev)


if __name__ == "__main__":
    main()
