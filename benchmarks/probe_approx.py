"""Probe: what the activation's math costs in the wide GEMMs' epilogues, the portable
gelu_tanh (a sigmoid: an exponential and a division) against the hardware tanh
(act.APPROX, PTX tanh.approx.f32), with a bias-only epilogue and cuBLAS(Lt) beside them.

wide-gelu's GEMMs (bf16, M 8192, 4096 -> 16384):
- the first layer's inference forward, y = gelu(x W^T + b): Triton's TMA kernel
  (FUSEDMLP_WIDE_BLAS=0) with no activation, exact and approximate gelu; cuBLAS x @ W^T
  (no epilogue), torch.addmm (bias) and torch._addmm_activation (bias + GELU, cuBLASLt);
- the same storing z (the training forward);
- the input gradient (g2 W2) * gelu'(z1) with h1 = gelu(z1) stored (the dx kernel),
  also at other tiles with two persistent programs per SM.

Every variant is checked against torch in fp32 before it is timed (probe_common), and
each list is timed twice in turn.

    PYTHONPATH=. python3 benchmarks/probe_approx.py --out probe-approx.json
"""
from __future__ import annotations

import os

import torch

from fusedmlp_xpu.backends.triton import wide
from probe_common import Probe, dx_operands, gemm_args

F = torch.nn.functional


def main():
    ap = gemm_args()
    ap.set_defaults(hidden=16384)
    args = ap.parse_args()
    dev, dt = torch.device("cuda", torch.cuda.current_device()), torch.bfloat16
    m, d, hid = args.m, args.d, args.hidden
    probe = Probe(m=m)
    torch.manual_seed(0)
    os.environ[wide.BLAS_ENV] = "0"

    def triton_mode(approx: bool):
        os.environ[wide.APPROX_ENV] = "1" if approx else "0"
        wide._linear_plan.cache_clear()

    x = torch.randn(m, d, device=dev, dtype=dt)
    w = torch.randn(hid, d, device=dev, dtype=dt) / d ** 0.5
    b = torch.randn(hid, device=dev, dtype=dt)
    z = x.float() @ w.float().t() + b.float()
    gz = F.gelu(z, approximate="tanh")
    flop = 2 * m * d * hid
    for save in (False, True):
        case = "fwd gelu(x W^T + b)" + (", z stored" if save else "")
        ref = (gz, z) if save else gz
        bias_ref = (z, z) if save else z
        def lin(act, save=save):
            y, zz = wide.linear(x, w, b, act, save)
            return (y, zz) if save else y
        variants = [("Triton, bias only", False, lambda: lin("none"), bias_ref),
                    ("Triton, gelu exact", False, lambda: lin("gelu_tanh"), ref),
                    ("Triton, gelu approx", True, lambda: lin("gelu_tanh"), ref)]
        if not save:
            variants += [
                ("cuBLAS x @ W^T (no epilogue)", None, lambda: x @ w.t(), z - b.float()),
                ("cuBLAS addmm (bias)", None, lambda: torch.addmm(b, x, w.t()), z),
                ("cuBLASLt bias + gelu", None,
                 lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True), gz),
            ]
        for rep in (1, 2):
            for name, approx, fn, r in variants:
                if approx is not None:
                    triton_mode(approx)
                probe.rec(f"{name} #{rep}", fn, r, flop, case=case, width=32)

    g2, w2, z1, zf, dgelu = dx_operands(m, d, hid, dev, dt)
    gw = g2.float() @ w2.float()
    out, h = torch.empty_like(z1), torch.empty_like(z1)
    cfg = wide._tma_config_nvidia("dx")
    case = "dx (g2 W2) gelu'(z1), h1 stored"

    def dx(act):
        assert wide._dx_tma(g2, w2, z1, out, h, act, cfg)
        return out, h
    variants = [("Triton, no activation", False, lambda: dx("none"), (gw, zf)),
                ("Triton, gelu exact", False, lambda: dx("gelu_tanh"),
                 (gw * dgelu, F.gelu(zf, approximate="tanh"))),
                ("Triton, gelu approx", True, lambda: dx("gelu_tanh"),
                 (gw * dgelu, F.gelu(zf, approximate="tanh"))),
                ("cuBLAS g2 @ W2 (no epilogue)", None, lambda: g2 @ w2, gw)]
    for rep in (1, 2):
        for name, approx, fn, r in variants:
            if approx is not None:
                triton_mode(approx)
            probe.rec(f"{name} #{rep}", fn, r, flop, case=case, width=32)

    # the dx kernel's tiles with two programs per SM: one program's epilogue (z loaded,
    # out and h stored) can then overlap the other's main loop; the subtiled epilogue and
    # fewer stages make two fit in shared memory
    triton_mode(True)
    key = (dev.type, dev.index)
    sms = wide._programs(dev)
    ref = (gw * dgelu, F.gelu(zf, approximate="tanh"))
    # (h200-probe-approx-20261201b.json: two per SM were 12-25% slower than one), and
    # other tiles: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, subtile) (-20261201c: z's
    # tile loaded through pointers before the main loop spilled 2.5 KB and ran 24 ms)
    tiles = [((128, 128, 64, 8, 4, False), 1), ((128, 256, 32, 16, 4, True), 1),
             ((128, 256, 32, 8, 4, True), 1), ((128, 128, 32, 8, 6, True), 1),
             ((128, 128, 64, 8, 4, True), 1), ((128, 128, 64, 8, 2, True), 2)]
    case = "dx tiles, gelu approx, h1 stored"
    for rep in (1, 2):
        for c, per_sm in tiles:
            wide._PROGRAMS[key] = sms * per_sm
            wide._TMA_FIT.clear()
            name = "{}x{}x{} w{} st{}".format(*c) + (" sub" if c[5] else "") + f" {per_sm}/SM"

            def dx_c(c=c):
                assert wide._dx_tma(g2, w2, z1, out, h, "gelu_tanh", c)
                return out, h
            probe.rec(f"{name} #{rep}", dx_c, ref, flop, case=case, width=32)
            probe.note_fit(f"{name} #{rep}")
    # the same for the inference forward (its epilogue: y stored)
    real_cfg = wide._tma_config_nvidia
    case = "fwd tiles, gelu approx"
    for rep in (1, 2):
        for c, per_sm in [((128, 256, 64, 8, 3), 1), ((128, 256, 32, 8, 5), 1),
                          ((128, 256, 64, 16, 3), 1)]:
            wide._PROGRAMS[key] = sms * per_sm
            wide._TMA_FIT.clear()
            wide._tma_config_nvidia = lambda kind, c=c: c
            wide._linear_plan.cache_clear()
            name = "{}x{}x{} w{} st{}".format(*c) + f" {per_sm}/SM"
            probe.rec(f"{name} #{rep}", lambda: wide.linear(x, w, b, "gelu_tanh", False)[0],
                      gz, flop, case=case, width=32)
            probe.note_fit(f"{name} #{rep}")
    wide._tma_config_nvidia = real_cfg
    wide._linear_plan.cache_clear()
    wide._PROGRAMS[key] = sms
    os.environ.pop(wide.APPROX_ENV, None)
    os.environ.pop(wide.BLAS_ENV, None)
    probe.write(args.out, dev)


if __name__ == "__main__":
    main()
