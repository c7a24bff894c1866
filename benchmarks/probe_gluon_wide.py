"""Probe: the warp-specialized Gluon GEMMs of the wide backward (gluon_wide.py) against
wide.py's Triton TMA kernels and the bare GEMM (torch.mm), H200.

- correctness first, at edge shapes (partial tiles in M, N and K, column-chunk views),
  outputs poisoned with NaN, against float64;
- then wide-gelu's hidden-layer input gradient (g W2) * gelu'(z), h = gelu(z) (M 8192,
  4096 -> 16384) and wide-swiglu's dh GEMM with dg, du (and h) (4096 -> 14336, whole and
  as the two column chunks the train step runs), each variant timed in turn for
  ``--passes`` passes (triton.testing.do_bench: warm-up, then the median).

    PYTHONPATH=. python3 benchmarks/probe_gluon_wide.py --out F.json [--variants ...]
"""
from __future__ import annotations

import json

import torch

from fusedmlp_xpu.backends.triton import gluon_wide as gw
from fusedmlp_xpu.backends.triton import wide
from fusedmlp_xpu.bench import environment
from probe_common import gemm_args, time_ms

F = torch.nn.functional


def _ref_dx(g, w, z, act):
    fn = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}[act]
    z64 = z.double().requires_grad_(True)
    h = fn(z64)
    (d,) = torch.autograd.grad(h.sum(), z64)
    return (g.double() @ w.double()) * d, h.detach()


def _ref_gated(dy, wd, g, u, act):
    fn = {"gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu}[act]
    g64 = g.double().requires_grad_(True)
    a = fn(g64)
    (d,) = torch.autograd.grad(a.sum(), g64)
    dh = dy.double() @ wd.double()
    a = a.detach()
    return dh * u.double() * d, dh * a, a * u.double()


def _err(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def check(dev, dt, launch=gw.launch_ws, name="gluon") -> list[dict]:
    """``launch`` (launch_ws's contract) against float64 at edge shapes."""
    rows = []
    torch.manual_seed(1)
    # one tile a program or less, then several (both consumers, the ring wrapping; K of
    # one step)
    for M, N, K in [(1000, 1032, 328), (129, 264, 72), (2048, 2056, 200), (4096, 4096, 64),
                    (3000, 1544, 1000)]:
        for act in ("gelu_tanh", "silu"):
            aid = wide.act_id(act, dev, dt)
            g = torch.randn(M, K, device=dev, dtype=dt)
            w = torch.randn(K, N, device=dev, dtype=dt) / K ** 0.5
            z = torch.randn(M, N, device=dev, dtype=dt)
            out = torch.full((M, N), float("nan"), device=dev, dtype=dt)
            h = torch.full((M, N), float("nan"), device=dev, dtype=dt)
            launch(gw.DX, aid, g, w, z, None, out, None, h)
            ro, rh = _ref_dx(g, w, z, act)
            e = max(_err(out, ro), _err(h, rh))
            rows.append(dict(kernel=name, check="dx", M=M, N=N, K=K, act=act, err=e, ok=e < 2e-2))
            u = torch.randn(M, N, device=dev, dtype=dt)
            # column chunk views, as the train step passes them
            c0 = 8 * ((N // 2) // 8)
            dg = torch.full((M, N), float("nan"), device=dev, dtype=dt)
            du, hh = torch.full_like(dg, float("nan")), torch.full_like(dg, float("nan"))
            for a, b in ((0, c0), (c0, N)):
                launch(gw.GATED, aid, g, w[:, a:b], z[:, a:b], u[:, a:b], dg[:, a:b],
                       du[:, a:b], hh[:, a:b])
            r = _ref_gated(g, w, z, u, act)
            e = max(_err(dg, r[0]), _err(du, r[1]), _err(hh, r[2]))
            rows.append(dict(kernel=name, check="gated chunks", M=M, N=N, K=K, act=act, err=e, ok=e < 2e-2))
            dg.fill_(float("nan"))
            du.fill_(float("nan"))
            launch(gw.GATED, aid, g, w, z, u, dg, du, None)
            e = max(_err(dg, r[0]), _err(du, r[1]))
            rows.append(dict(kernel=name, check="gated no h", M=M, N=N, K=K, act=act, err=e, ok=e < 2e-2))
    for r in rows:
        print(f"check {r['kernel']} {r['check']:<13} {r['M']}x{r['N']}x{r['K']} {r['act']:<9} err "
              f"{r['err']:.1e} {'ok' if r['ok'] else 'WRONG'}", flush=True)
    return rows


def main():
    ap = gemm_args(__doc__.split("\n")[0])
    ap.add_argument("--gelu-hidden", type=int, default=16384)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    ap.add_argument("--variants", nargs="+", default=["gluon", "gluon-s4", "triton", "bare"])
    args = ap.parse_args()
    dev, dt = torch.device("cuda"), torch.bfloat16
    checks = [] if args.no_check else check(dev, dt)
    M, d = args.m, args.d
    torch.manual_seed(0)
    # wide-gelu's dx
    H = args.gelu_hidden
    g2 = torch.randn(M, d, device=dev, dtype=dt)
    w2 = torch.randn(d, H, device=dev, dtype=dt) / d ** 0.5
    z1 = torch.randn(M, H, device=dev, dtype=dt)
    out, h1 = torch.empty_like(z1), torch.empty_like(z1)
    gelu = wide.act_id("gelu_tanh", dev, dt)
    # wide-swiglu's dh GEMM
    Hs = args.hidden
    dy = torch.randn(M, d, device=dev, dtype=dt)
    wd = torch.randn(d, Hs, device=dev, dtype=dt) / d ** 0.5
    gg, uu = torch.randn(M, Hs, device=dev, dtype=dt), torch.randn(M, Hs, device=dev, dtype=dt)
    dg, du, hs = torch.empty_like(gg), torch.empty_like(gg), torch.empty_like(gg)
    silu = wide.act_id("silu", dev, dt)
    half = Hs // 2
    dx_cfg, gb_cfg = wide._tma_config(dev, "dx"), wide._tma_config(dev, "gated_bwd")

    def gluon_fns(**kw):
        return {
            "dx": lambda: gw.launch_ws(gw.DX, gelu, g2, w2, z1, None, out, None, h1, **kw),
            "gated": lambda: gw.launch_ws(gw.GATED, silu, dy, wd, gg, uu, dg, du, None, **kw),
            "gated+h chunks": lambda: [gw.launch_ws(
                gw.GATED, silu, dy, wd[:, a:b], gg[:, a:b], uu[:, a:b], dg[:, a:b],
                du[:, a:b], hs[:, a:b], **kw) for a, b in ((0, half), (half, Hs))]}

    fns = {}
    for v in args.variants:
        if v == "gluon":
            fns[v] = gluon_fns()
        elif v.startswith("gluon-s"):
            fns[v] = gluon_fns(n_stages=int(v[7:]))
        elif v.startswith("gluon-r"):
            fns[v] = gluon_fns(regs=int(v[7:]))
        elif v.startswith("gluon-g"):
            fns[v] = gluon_fns(group=int(v[7:]))
        elif v.startswith("gluon-k"):  # gluon-k<BLOCK_K>s<stages>
            bk, st = v[7:].split("s")
            fns[v] = gluon_fns(block_k=int(bk), n_stages=int(st))
        elif v == "triton":
            fns[v] = {
                "dx": lambda: wide._dx_tma(g2, w2, z1, out, h1, "gelu_tanh", dx_cfg),
                "gated": lambda: wide._gated_bwd_tma(dy, wd, gg, uu, dg, du, "silu", gb_cfg),
                "gated+h chunks": lambda: [wide._gated_bwd_tma(
                    dy, wd[:, a:b], gg[:, a:b], uu[:, a:b], dg[:, a:b], du[:, a:b], "silu",
                    gb_cfg, hs[:, a:b]) for a, b in ((0, half), (half, Hs))]}
        elif v == "bare":
            fns[v] = {"dx": lambda: torch.mm(g2, w2, out=out),
                      "gated": lambda: torch.mm(dy, wd, out=dg),
                      "gated+h chunks": lambda: [torch.mm(dy, wd[:, a:b], out=dg[:, a:b])
                                                 for a, b in ((0, half), (half, Hs))]}
    flops = {"dx": 2 * M * d * H, "gated": 2 * M * d * Hs, "gated+h chunks": 2 * M * d * Hs}
    rows = []
    for p in range(args.passes):
        for case in flops:
            for v, fs in fns.items():
                try:
                    ms = time_ms(fs[case])
                except Exception as e:  # noqa: BLE001 -- a config the device refuses
                    print(f"pass {p + 1} {case:<15} {v:<10} {type(e).__name__}: "
                          f"{str(e)[:100]}", flush=True)
                    continue
                print(f"pass {p + 1} {case:<15} {v:<10} {ms:.4f} ms "
                      f"{flops[case] / ms / 1e9:6.0f} TFLOP/s", flush=True)
                rows.append(dict(pass_=p + 1, case=case, variant=v, ms=ms,
                                 tflops=flops[case] / ms / 1e9))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(env=environment(dev), m=M, d=d, gelu_hidden=H, swiglu_hidden=Hs,
                           checks=checks, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
